"""MaxText YAML configs (a base config, a model config, ``key=value`` overrides) as a plan and a model.

MaxText reads ``base.yml``, then the model config (``model_name``'s, or one given), then the
command line's ``key=value`` pairs, each overriding the one before; a key that is not in
``base.yml`` is an error (``pyconfig``). echosim does the same. Defaults for what no file
sets are ``src/maxtext/configs/base.yml`` at commit e591f30 (:data:`DEFAULTS`).

The mesh: each ``ici_*``/``dcn_*`` degree multiplies in; ``-1`` takes the devices the
others leave (``ici_fsdp_parallelism: -1`` by default). Batch: ``per_device_batch_size``
sequences per device per micro-step, ``global batch = per_device x devices x
gradient_accumulation_steps``; a data-parallel replica of ``tp x cp`` devices runs
``per_device x tp x cp`` sequences at once (as :func:`echosim.validation.rows.replica_micro_batch`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from echosim.configs.base import ConfigError, FromConfig, as_float, as_int, model_or_zoo, read_text
from echosim.frameworks import maxtext_framework
from echosim.frontend.zoo import ArchConfig
from echosim.passes.recompute import POLICIES

BASE = "MaxText src/maxtext/configs/base.yml, commit e591f30"

#: MaxText's splash-attention block keys, in :attr:`echosim.plan.Plan.splash_blocks`'s order.
SPLASH_BLOCK_KEYS = (
    "sa_block_q", "sa_block_kv", "sa_block_q_dkv", "sa_block_kv_dkv", "sa_block_q_dq", "sa_block_kv_dq",
)  # fmt: skip

#: The base.yml values of the keys echosim reads (commit e591f30).
DEFAULTS: dict[str, Any] = {
    "model_name": "default",
    "decoder_block": "llama2",
    "base_emb_dim": 2048,
    "base_num_query_heads": 16,
    "base_num_kv_heads": 16,
    "base_mlp_dim": 7168,
    "base_num_decoder_layers": 16,
    "head_dim": 128,
    "mlp_activations": ["silu", "linear"],
    "dropout_rate": 0.0,
    "enable_dropout": True,
    "logits_via_embedding": False,
    "num_experts": 1,
    "num_experts_per_tok": 1,
    "base_moe_mlp_dim": -1,
    "capacity_factor": -1.0,
    "vocab_size": 32000,
    # DeepSeek's decoder block: dense first layers, shared experts, MLA, group-limited routing (base.yml lines
    # 289-298 and 448-452)
    "first_num_dense_layers": 0,
    "shared_experts": 0,
    "attention_type": "global",
    "q_lora_rank": 0,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_routing_groups": -1,
    "topk_routing_group": -1,
    "max_target_length": 2048,
    "per_device_batch_size": 12.0,
    "gradient_accumulation_steps": 1,
    "dtype": "bfloat16",
    "quantization": "",
    "remat_policy": "full",
    "attention": "autoselected",
    "num_slices": -1,
    "num_pipeline_microbatches": -1,
    "hardware": "tpu",
    "shard_mode": "auto",
    "context_parallel_load_balance": True,
    "context_parallel_strategy": "all_gather",  # base.yml line 1201, commit e591f30
    "weight_dtype": "float32",
    "sa_use_fused_bwd_kernel": False,  # splash attention's backward as two kernels (dkv, dq): base.yml line 1167
    **dict.fromkeys(SPLASH_BLOCK_KEYS, 512),  # splash attention's blocks: base.yml lines 1159-1166, commit e591f30
    **{f"ici_{axis}_parallelism": 1 for axis in ("data", "fsdp_transpose", "sequence", "context", "context_usp_ulysses",
                                                 "tensor", "tensor_sequence", "pipeline", "expert", "autoregressive")},
    "ici_fsdp_parallelism": -1,
    **{f"dcn_{axis}_parallelism": 1 for axis in ("fsdp", "fsdp_transpose", "sequence", "context", "context_usp_ulysses",
                                                 "tensor", "tensor_sequence", "pipeline", "expert", "autoregressive")},
    "dcn_data_parallelism": -1,
}  # fmt: skip

#: MaxText's context_parallel_strategy as echosim's --cp-comm: K/V all-gathered (the default), ring attention
#: (Tokamax's on TPU, Transformer Engine's on GPU), Ulysses' head exchange (src/maxtext/layers/attention_op.py,
#: commit e591f30) and "usp", Ulysses' exchange over the context_usp_ulysses mesh axis inside the ring over the
#: context axis (base.yml: "Ulysses (head-exchange) dimension of the context parallelism"; the mesh lists
#: context_usp_ulysses after context, so its groups are the nearer chips): echosim's hierarchical a2a+p2p.
CP_STRATEGIES = {"all_gather": "all_gather", "ring": "p2p", "ulysses": "a2a", "usp": "a2a+p2p"}

#: Keys that change neither step time nor memory: paths, data, logging, checkpoints, optimizer hyper-parameters.
IGNORED = {
    "run_name", "base_output_directory", "dataset_path", "dataset_name", "eval_dataset_name", "dataset_type",
    "tokenizer_path", "steps", "log_period", "checkpoint_period", "enable_checkpointing", "async_checkpointing",
    "learning_rate", "learning_rate_schedule_steps", "warmup_steps_fraction", "cosine_learning_rate_final_fraction",
    "adam_b1", "adam_b2", "adam_eps", "adam_eps_root", "adam_weight_decay", "gradient_clipping_threshold",
    "target_eval_loss", "eval_per_device_batch_size", "eval_interval", "eval_steps", "init_weights_seed",
    "data_shuffle_seed", "normalization_layer_epsilon", "rope_max_timescale", "rope_min_timescale",
    "enable_profiler", "profiler", "profiler_steps", "skip_first_n_steps_for_profiler", "metrics_file",
    "gcs_metrics", "save_config_to_gcs", "load_parameters_path", "load_full_state_path", "tokenizer_type",
    "logical_axis_rules", "normalize_embedding_logits", "logits_dot_in_fp32", "trainable_position_size",
    "use_iota_embed", "opt_type", "enable_goodput_recording", "monitor_goodput", "reuse_example_batch",
    "dataset_name_eval", "hf_path", "hf_data_dir", "hf_train_files", "train_split", "grain_train_files",
    # DeepSeek's routing scale and bias, and its YaRN RoPE settings: the same work
    "routed_scaling_factor", "routed_bias", "mscale", "rope_factor", "beta_fast", "rope_interleave", "rope_truncate",
    "rope_attention_scaling", "original_max_position_embeddings", "max_position_embeddings", "routed_score_func",
}  # fmt: skip
NOT_MODELLED = {
    "fused_qkv": "a fused QKV projection",
    "fused_mlp": "a fused MLP",
    "scan_layers": "",
    "megablox": "",
    "sparse_matmul": "",
    "optimizer_memory_host_offload": "optimizer state offloaded to the host (costed on the device)",
    "param_scan_axis": "",
    "rope_type": "",
}

#: Keys every base.yml sets: a first file holding them is a whole base config (its keys are MaxText's).
BASE_MARKERS = {"ici_fsdp_parallelism", "per_device_batch_size"}

_MESH_AXES = ("data", "fsdp", "fsdp_transpose", "sequence", "context", "context_usp_ulysses", "tensor",
              "tensor_sequence", "pipeline", "expert", "autoregressive")  # fmt: skip


def _load_yaml(path: str, source: str) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(read_text(path, source))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: {path} is not valid YAML ({' '.join(str(exc).split())[:200]})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: {path} is not a mapping of keys to values")
    return data


def _override(item: str, source: str) -> tuple[str, Any]:
    import yaml

    key, _, text = item.partition("=")
    try:
        value = yaml.safe_load(text) if text else ""
    except yaml.YAMLError:
        value = text
    return key.strip(), value


def read_maxtext(spec: str, source: str) -> FromConfig:
    """``maxtext:base.yml,model.yml key=value ...`` (files and overrides split by commas or spaces)."""
    items = [x for part in spec.replace(",", " ").split() for x in [part] if x]
    files = [x for x in items if "=" not in x]
    overrides = [_override(x, source) for x in items if "=" in x]
    if not files and not overrides:
        raise ConfigError(f"{source}: no MaxText config file given")
    config: dict[str, Any] = dict(DEFAULTS)
    known = set(DEFAULTS) | IGNORED | set(NOT_MODELLED)
    stated: dict[str, str] = {}  # key -> where it was set
    from_base: set[str] = set()  # set by a whole base.yml: MaxText's defaults, not the run's choices
    first = True
    for path in files:
        data = _load_yaml(path, source)
        base_like = first and "base_config" not in data and set(data) >= BASE_MARKERS
        if not base_like and "base_config" in data:
            data = dict(data)
            data.pop("base_config")
        for key, value in data.items():
            if not base_like and key not in known:
                raise ConfigError(f"{source}: {path}: unknown MaxText key {key!r} (not in base.yml)")
            config[key] = value
            stated[key] = path
            if not base_like:
                from_base.discard(key)
        if base_like:
            known |= set(data)
            from_base |= set(data)
        first = False
    named = dict(overrides).get("model_name")
    model_file = _model_file({**config, **({"model_name": named} if named else {})}, files, source)
    if model_file:
        for key, value in _load_yaml(model_file, source).items():
            if key not in known:
                raise ConfigError(f"{source}: {model_file}: unknown MaxText key {key!r} (not in base.yml)")
            config[key] = value
            stated[key] = model_file
            from_base.discard(key)
    for key, value in overrides:
        if key not in known:
            raise ConfigError(f"{source}: unknown MaxText key {key!r} in {key}={value} (not in base.yml)")
        config[key] = value
        stated[key] = "the command line"
        from_base.discard(key)
    # weight_dtype: bfloat16 keeps weights, gradients and Adam's moments in bf16 (frameworks.py)
    bf16_weights = str(config.get("weight_dtype", DEFAULTS["weight_dtype"])) in ("bfloat16", "bf16")
    # attention=cudnn_flash_te on GPU: Transformer Engine's cuDNN fused attention (frameworks.py, maxtext-te)
    te_attention = str(config.get("attention")) == "cudnn_flash_te" and str(config.get("hardware")) == "gpu"
    # sa_use_fused_bwd_kernel: True runs splash attention's backward as one kernel (frameworks.py); TPU only
    fused_bwd = str(config.get("sa_use_fused_bwd_kernel", DEFAULTS["sa_use_fused_bwd_kernel"])).lower() == "true"
    out = FromConfig(source, maxtext_framework(bf16_weights, te_attention, fused_bwd))
    if bf16_weights and te_attention:  # no entry has both: the weights' memory rule wins
        out.notes.append("attention=cudnn_flash_te with weight_dtype bfloat16: attention costed as MaxText's flash")
    # sa_block_*: the splash kernels' (q, kv) blocks, which fix the causal mask's granularity (Plan.splash_blocks)
    blocks = tuple(as_int(config.get(k, DEFAULTS[k]), k, source) for k in SPLASH_BLOCK_KEYS)
    if any(b != DEFAULTS[k] for b, k in zip(blocks, SPLASH_BLOCK_KEYS, strict=True)):
        out.options["splash_blocks"] = blocks
    used = _plan(config, out) | {"weight_dtype", "sa_use_fused_bwd_kernel", *SPLASH_BLOCK_KEYS}
    used |= _model(config, out)
    for key in stated:
        if key in used or key in from_base:  # a whole base.yml's settings are MaxText's defaults
            continue
        if key in IGNORED:
            out.ignored.append(key)
        elif key in NOT_MODELLED:
            if NOT_MODELLED[key] and config[key]:
                out.notes.append(f"{key}: not modelled ({NOT_MODELLED[key]})")
        else:
            out.unknown.append(key)
    return out


def _model_file(config: dict[str, Any], files: list[str], source: str) -> str | None:
    """``model_name: llama2-7b`` loads ``models/llama2-7b.yml`` beside the base config, as MaxText does."""
    name = str(config.get("model_name", "default"))
    if name == "default" or not files or len(files) > 1:
        return None
    candidate = Path(files[0]).expanduser().parent / "models" / f"{name}.yml"
    return str(candidate) if candidate.is_file() else None


def _degree(config: dict[str, Any], key: str, source: str) -> int:
    return as_int(config.get(key, DEFAULTS.get(key, 1)), key, source)


_JNP_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def _plan(config: dict[str, Any], out: FromConfig) -> set[str]:
    src, opts = out.source, out.options
    used = {f"{level}_{axis}_parallelism" for level in ("ici", "dcn") for axis in _MESH_AXES}
    used |= {"num_slices", "per_device_batch_size", "gradient_accumulation_steps", "max_target_length", "dtype",
             "quantization", "remat_policy", "attention", "hardware", "num_pipeline_microbatches", "capacity_factor",
             "shard_mode", "context_parallel_load_balance", "context_parallel_strategy"}  # fmt: skip
    for level in ("ici", "dcn"):
        for axis in ("fsdp_transpose", "tensor_sequence", "autoregressive"):
            if _degree(config, f"{level}_{axis}_parallelism", src) not in (1, -1):
                raise ConfigError(f"{src}: {level}_{axis}_parallelism is not modelled (only 1 is)")
    ici = {axis: _degree(config, f"ici_{axis}_parallelism", src) for axis in _MESH_AXES}
    dcn = {axis: _degree(config, f"dcn_{axis}_parallelism", src) for axis in _MESH_AXES}
    slices = as_int(config.get("num_slices", -1), "num_slices", src)
    slices = 1 if slices == -1 else slices
    tp = ici["tensor"] * dcn["tensor"]
    pp = ici["pipeline"] * dcn["pipeline"]
    ulysses = ici["context_usp_ulysses"] * dcn["context_usp_ulysses"]
    cp = ici["context"] * dcn["context"] * ici["sequence"] * dcn["sequence"] * ulysses
    ep = ici["expert"] * dcn["expert"]
    for name, value in (("tensor", tp), ("pipeline", pp), ("context", cp), ("expert", ep)):
        if value < 1:
            raise ConfigError(f"{src}: ici/dcn_{name}_parallelism = -1 is not modelled (only the data axes fill in)")
    opts.update({"tp": tp, "pp": pp, "cp": cp})
    if ep > 1:
        opts["ep"] = ep
    auto = [f"{level}_{axis}_parallelism" for level, d in (("ici", ici), ("dcn", dcn)) for axis in ("data", "fsdp")
            if d[axis] == -1]  # fmt: skip
    fsdp = ici["fsdp"] * dcn["fsdp"]
    data = ici["data"] * dcn["data"]
    if dcn["data"] == -1 and dcn["fsdp"] != -1:
        data = ici["data"] * slices  # dcn_data: -1 takes the slices
        auto.remove("dcn_data_parallelism")
    if not auto:
        opts["dp"] = fsdp * data
        opts["devices"] = fsdp * data * tp * pp * cp
    else:
        out.needs_devices = f"{auto[0]} = -1 takes the devices of the slice: give --devices"
    opts["zero"] = 3 if (fsdp != 1) else 0
    pdbs = as_float(config.get("per_device_batch_size"), "per_device_batch_size", src)
    out.per_device_batch = pdbs
    out.accumulation = as_int(config.get("gradient_accumulation_steps"), "gradient_accumulation_steps", src)
    opts["seq_len"] = as_int(config.get("max_target_length"), "max_target_length", src)
    quant = str(config.get("quantization") or "")
    dtype = str(config.get("dtype"))
    if quant in ("fp8", "nanoo_fp8", "fp8_full", "fp8_gpu"):
        opts["dtype"] = "fp8"
    elif quant == "int8":
        opts["dtype"] = "int8"
    elif quant:
        raise ConfigError(f"{src}: quantization {quant!r} is not modelled (fp8 and int8 are)")
    elif dtype in _JNP_DTYPES:
        opts["dtype"] = _JNP_DTYPES[dtype]
    else:
        raise ConfigError(f"{src}: dtype {dtype!r} (bfloat16, float16, float32)")
    # mu_dtype: the dtype optax's adamw keeps Adam's first moment in ("" inherits weight_dtype: configs/base.yml and
    # types.py, optimizers/optimizers.py, commit e591f30)
    mu, weights = str(config.get("mu_dtype") or ""), str(config.get("weight_dtype", DEFAULTS["weight_dtype"]))
    if mu and mu != weights:
        if mu not in _JNP_DTYPES:
            raise ConfigError(f"{src}: mu_dtype {mu!r} ({', '.join(_JNP_DTYPES)})")
        opts["optimizer_dtypes"] = f"exp_avg={_JNP_DTYPES[mu]}"
    used.add("mu_dtype")
    remat = str(config.get("remat_policy"))
    if remat == "full":
        opts["recompute"] = "full"
    elif remat in POLICIES:  # a MaxText policy echosim names: the tensors it saves (echosim.passes.recompute)
        opts["recompute"] = remat
    elif remat == "minimal" or remat.startswith("save_") or remat == "minimal_with_context":
        opts["recompute"] = "selective"
        out.notes.append(f"remat_policy {remat!r}: costed as selective (the attention core recomputed)")
    elif remat == "none" or remat == "":
        opts["recompute"] = "none"
    else:
        raise ConfigError(f"{src}: remat_policy {remat!r} is not modelled (full, minimal, save_*, none are)")
    attention = str(config.get("attention"))
    if attention == "dot_product":
        opts["attention"] = "math"
    elif attention in ("autoselected", "flash", "cudnn_flash_te", "cudnn_flash_jax"):
        opts["attention"] = "flash"
    else:
        raise ConfigError(f"{src}: attention {attention!r} is not modelled (autoselected, dot_product, flash are)")
    # capacity_factor only reaches dense_matmul: the sparse (megablox) path, base.yml's default, is dropless
    # (src/maxtext/layers/moe.py, commit e591f30)
    capacity = as_float(config.get("capacity_factor"), "capacity_factor", src)
    if capacity > 0 and str(config.get("sparse_matmul", True)).lower() == "false":
        opts["moe_capacity_factor"] = capacity
    if not config.get("context_parallel_load_balance", True) and cp > 1:
        opts["cp_balance"] = False
    strategy = str(config.get("context_parallel_strategy", DEFAULTS["context_parallel_strategy"])).lower()
    if cp > 1:
        if strategy not in CP_STRATEGIES:
            raise ConfigError(
                f"{src}: context_parallel_strategy {strategy!r} is not modelled ({', '.join(CP_STRATEGIES)} are)"
            )
        opts["cp_comm"] = CP_STRATEGIES[strategy]
    if (strategy == "usp") != (ulysses > 1) or (strategy == "usp" and cp == ulysses):
        # MaxText's own checks (configs/types.py, _validate_usp_context_parallelism): the Ulysses axis only under
        # usp, and usp with both a ring and a Ulysses dimension
        raise ConfigError(
            f"{src}: context_parallel_strategy {strategy!r} with ici/dcn_context_usp_ulysses_parallelism {ulysses}: "
            "MaxText runs 'usp' with a Ulysses axis above 1 and a ring (ici_context_parallelism) above 1, and "
            "the Ulysses axis under 'usp' only"
        )
    if strategy == "usp" and str(config.get("hardware", "tpu")) != "tpu":
        raise ConfigError(f"{src}: context_parallel_strategy 'usp' runs on TPUs only (MaxText refuses it elsewhere)")
    if ulysses > 1:
        opts["cp_a2a"] = ulysses
    hardware = str(config.get("hardware"))
    if hardware == "tpu":
        out.notes.append("hardware 'tpu': the TPU generation is the command line's (--backend tpu-v5p, ...)")
        out.needs_backend = "hardware: 'tpu' names no TPU generation: give --backend (tpu-v4, tpu-v5p, ...)"
    if pp > 1:
        micro = as_int(config.get("num_pipeline_microbatches"), "num_pipeline_microbatches", src)
        out.pipeline_microbatches = pp if micro == -1 else micro
    return used


def _model(config: dict[str, Any], out: FromConfig) -> set[str]:
    src = out.source
    used = {"model_name", "decoder_block", "base_emb_dim", "base_num_query_heads", "base_num_kv_heads",
            "base_mlp_dim", "base_num_decoder_layers", "head_dim", "mlp_activations", "dropout_rate",
            "enable_dropout", "logits_via_embedding", "num_experts", "num_experts_per_tok", "base_moe_mlp_dim",
            "vocab_size"}  # fmt: skip
    block = str(config.get("decoder_block"))
    arches = {"gpt3": "gpt", "llama2": "llama", "mistral": "llama", "mixtral": "moe", "deepseek": "moe"}
    if block not in arches:
        raise ConfigError(f"{src}: decoder_block {block!r} is not modelled ({', '.join(arches)} are)")
    experts = as_int(config.get("num_experts"), "num_experts", src)
    arch = arches[block] if experts <= 1 else "moe"

    def num(key: str) -> int:
        return as_int(config.get(key), key, src)

    hidden, heads = num("base_emb_dim"), num("base_num_query_heads")
    mlp = num("base_mlp_dim")
    listed = config.get("mlp_activations") or []
    if not isinstance(listed, list):
        raise ConfigError(f"{src}: mlp_activations {listed!r} is not a list of activation names")
    activations = [str(a) for a in listed]
    if arch == "gpt" and activations not in (["gelu"], ["relu"]):
        raise ConfigError(f"{src}: mlp_activations {activations} with decoder_block gpt3 is not modelled")
    if arch != "gpt" and activations != ["silu", "linear"]:
        out.notes.append(f"mlp_activations {activations}: costed as SwiGLU")
    dropout = as_float(config.get("dropout_rate"), "dropout_rate", src) if config.get("enable_dropout") else 0.0
    moe: dict[str, int] = {}
    if arch == "moe":
        moe_ffn = num("base_moe_mlp_dim")
        moe = {"experts": experts, "top_k": num("num_experts_per_tok"), "moe_ffn": mlp if moe_ffn < 1 else moe_ffn}
    attention: dict[str, int] = {"kv_heads": num("base_num_kv_heads"), "head_dim": num("head_dim")}
    if block == "deepseek":
        used |= _deepseek(config, out, moe, attention)
    cfg = ArchConfig(
        arch,
        num("base_num_decoder_layers"),
        hidden,
        heads,
        num("vocab_size"),
        ffn=mlp,
        seq_len=as_int(config.get("max_target_length"), "max_target_length", src),
        dropout=dropout if arch == "gpt" else 0.0,
        tied_embeddings=bool(config.get("logits_via_embedding")),
        **attention,
        **moe,
    )
    out.model = model_or_zoo(cfg, src)
    return used


def _deepseek(config: dict[str, Any], out: FromConfig, moe: dict[str, int], attention: dict[str, int]) -> set[str]:
    """MaxText's ``deepseek`` decoder block (src/maxtext/models/deepseek.py, commit e591f30): ``first_num_dense_layers``
    dense layers of width ``base_mlp_dim``, then MoE layers with ``shared_experts`` always-on experts of width
    ``base_moe_mlp_dim``; ``attention_type: mla`` is multi-head latent attention (``q_lora_rank`` 0: a plain query
    projection; heads of ``qk_nope_head_dim + qk_rope_head_dim``, values of ``v_head_dim``; no key/value heads of
    its own, as the zoo writes MLA); ``n_routing_groups`` / ``topk_routing_group`` limit each token's experts to its
    best groups. Fields go into ``moe`` and ``attention``."""
    src = out.source

    def num(key: str) -> int:
        return as_int(config.get(key), key, src)

    moe["shared_experts"] = num("shared_experts")
    moe["dense_layers"] = num("first_num_dense_layers")
    kind = str(config.get("attention_type"))
    if kind == "mla":
        moe |= {"kv_lora_rank": num("kv_lora_rank"), "q_lora_rank": num("q_lora_rank"),
                "rope_head_dim": num("qk_rope_head_dim"), "v_head_dim": num("v_head_dim")}  # fmt: skip
        attention |= {"kv_heads": 0, "head_dim": num("qk_nope_head_dim") + num("qk_rope_head_dim")}
    elif kind not in ("global", "full"):
        raise ConfigError(f"{src}: attention_type {kind!r} with decoder_block deepseek is not modelled")
    if str(config.get("routed_score_func") or "softmax") != "softmax":  # DeepSeek-V3's sigmoid gate
        out.notes.append(f"routed_score_func {config.get('routed_score_func')}: the router costed as a softmax")
    groups, top = num("n_routing_groups"), num("topk_routing_group")
    if groups > 0 and top > 0:
        out.options["moe_router_groups"], out.options["moe_router_group_topk"] = groups, top
    return {"shared_experts", "first_num_dense_layers", "attention_type", "q_lora_rank", "kv_lora_rank",
            "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routing_groups", "topk_routing_group",
            "routed_score_func"}  # fmt: skip
