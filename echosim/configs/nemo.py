"""A NeMo training YAML (NeMo-Framework-Launcher ``conf/training/*``, NeMo 1.x ``megatron_gpt_config``).

Its ``model:`` section holds Megatron-Core's settings under NeMo's names
(``tensor_model_parallel_size``, ``encoder_seq_length``, ``activations_checkpoint_granularity``,
...) and ``trainer:`` the device count (``num_nodes x devices``) and precision. Each name is
translated into the Megatron-LM argument it sets (:data:`TO_MEGATRON`) and read by the
Megatron reader, so both apply the same defaults; notes and unknown keys are reported under
the YAML's names. OmegaConf interpolations that size the model (``${multiply:4, ${.hidden_size}}``)
are resolved; the framework is ``nemo`` (its defaults: :mod:`echosim.frameworks`).
"""

from __future__ import annotations

import re
from typing import Any

from echosim.configs.base import ConfigError, FromConfig, as_int, dtype_name, in_yaml_names, read_model_yaml
from echosim.configs.megatron import from_arguments
from echosim.frameworks import get_framework, loss_framework

#: ``model.*`` keys whose value is one Megatron-LM argument of the same meaning.
TO_MEGATRON = {
    "micro_batch_size": "--micro-batch-size",
    "global_batch_size": "--global-batch-size",
    "tensor_model_parallel_size": "--tensor-model-parallel-size",
    "pipeline_model_parallel_size": "--pipeline-model-parallel-size",
    "virtual_pipeline_model_parallel_size": "--virtual-pipeline-model-parallel-size",
    "context_parallel_size": "--context-parallel-size",
    "expert_model_parallel_size": "--expert-model-parallel-size",
    "encoder_seq_length": "--seq-length",
    "max_position_embeddings": "--max-position-embeddings",
    "num_layers": "--num-layers",
    "hidden_size": "--hidden-size",
    "ffn_hidden_size": "--ffn-hidden-size",
    "num_attention_heads": "--num-attention-heads",
    "kv_channels": "--kv-channels",
    "hidden_dropout": "--hidden-dropout",
    "attention_dropout": "--attention-dropout",
    "make_vocab_size_divisible_by": "--make-vocab-size-divisible-by",
    "num_moe_experts": "--num-experts",
    "moe_router_topk": "--moe-router-topk",
    "activations_checkpoint_granularity": "--recompute-granularity",
    "activations_checkpoint_method": "--recompute-method",
    "activations_checkpoint_num_layers": "--recompute-num-layers",
    "padded_vocab_size": "--vocab-size",
    "tokenizer.type": "--tokenizer-type",
}
#: ``model.*`` booleans that are one Megatron-LM switch when true.
SWITCHES = {
    "sequence_parallel": "--sequence-parallel",
    "ub_tp_comm_overlap": "--tp-comm-overlap",
    "use_flash_attention": "--use-flash-attn",
    "fp8": "--fp8-format",
    "optim.overlap_grad_sync": "--overlap-grad-reduce",
}
IGNORED_SECTIONS = ("run", "exp_manager", "hydra", "defaults", "model.data", "model.optim.sched", "model.nsys_profile")
IGNORED = {
    "trainer.logger", "trainer.enable_checkpointing", "trainer.use_distributed_sampler", "trainer.max_epochs",
    "trainer.max_steps", "trainer.max_time", "trainer.log_every_n_steps", "trainer.val_check_interval",
    "trainer.limit_val_batches", "trainer.limit_test_batches", "trainer.gradient_clip_val", "trainer.accelerator",
    "trainer.accumulate_grad_batches", "model.seed", "model.init_method_std", "model.use_scaled_init_method",
    "model.layernorm_epsilon", "model.pre_process", "model.post_process", "model.resume_from_checkpoint",
    "model.use_cpu_initialization", "model.onnx_safe", "model.apex_transformer_log_level",
    "model.native_amp_init_scale", "model.native_amp_growth_interval", "model.hysteresis", "model.rampup_batch_size",
    "model.mcore_gpt", "model.deterministic_mode", "model.do_layer_norm_weight_decay",
    "model.apply_query_key_layer_scaling", "model.normalize_attention_scores", "model.headscale",
    "model.transformer_block_type", "model.openai_gelu", "model.rotary_percentage", "model.attention_type",
    "model.fp8_e4m3", "model.fp8_hybrid", "model.fp8_margin", "model.fp8_interval", "model.fp8_amax_history_len",
    "model.fp8_amax_compute_algo", "model.fp8_wgrad", "model.sync_batch_comm", "model.fsdp_sharded_checkpoint",
    "model.tokenizer.library", "model.tokenizer.model", "model.tokenizer.vocab_file", "model.tokenizer.merge_file",
    "model.tokenizer.delimiter", "model.tokenizer.sentencepiece_legacy", "model.optim.lr",
    "model.optim.weight_decay", "model.optim.betas", "model.optim.eps",
}  # fmt: skip
NOT_MODELLED = {
    "model.grad_div_ar_fusion", "model.gradient_accumulation_fusion", "model.bias_activation_fusion",
    "model.bias_dropout_add_fusion", "model.masked_softmax_fusion", "model.persist_layer_norm",
    "model.gradient_as_bucket_view", "model.megatron_amp_O2", "model.grad_allreduce_chunk_size_mb",
    "model.fp32_residual_connection", "model.fp16_lm_cross_entropy", "model.transformer_engine", "model.use_emha",
    "model.overlap_p2p_comm", "model.batch_p2p_comm", "model.sharp", "model.optim.bucket_cap_mb",
    "model.optim.contiguous_grad_buffer", "model.optim.contiguous_param_buffer", "model.optim.overlap_param_sync",
    "model.num_micro_batches_with_partial_activation_checkpoints", "model.activations_checkpoint_layers_per_pipeline",
    "model.bias", "model.ffn_dropout", "model.tp_comm_atomic_ag", "model.tp_comm_atomic_rs", "model.apply_rope_fusion",
    "model.fsdp_grad_reduce_dtype", "model.fsdp_sharding_strategy",
}  # fmt: skip
CONSUMED = (
    {f"model.{k}" for k in TO_MEGATRON if "." not in k}
    | {"model.tokenizer.type"}
    | {f"model.{k}" for k in SWITCHES}
    | {"model.num_query_groups", "model.activation", "model.normalization", "model.position_embedding_type",
       "model.share_embeddings_and_output_weights", "model.optim.name", "model.fsdp", "trainer.num_nodes",
       "trainer.devices", "trainer.precision", "model.cross_entropy_loss_fusion", "model.cross_entropy_fusion_impl",
       "model.optim.grad_sync_dtype"}
)  # fmt: skip
#: NeMo 1's two distributed optimizers: Apex's DistributedFusedAdam, which NeMo 1 builds with ``dtype=torch.float32``
#: and which keeps and reduce-scatters gradients in ``grad_sync_dtype`` (``dtype`` when not given: "if
#: grad_sync_dtype is None: grad_sync_dtype = dtype", apex/contrib/optimizers/distributed_fused_adam.py), and
#: Megatron-Core's distributed optimizer, whose DDP NeMo 1 builds with ``grad_reduce_in_fp32=(self.cfg.optim.get(
#: 'grad_sync_dtype', 'fp32') == 'fp32')`` (MegatronBaseModel.setup_optimization and
#: setup_mcore_distributed_parallel, nemo/collections/nlp/models/language_modeling/megatron_base_model.py). Both
#: shard the optimizer state (ZeRO-1 and more); without ``grad_sync_dtype`` a 16-bit run's gradients are fp32.
DISTRIBUTED_OPTIMIZERS = ("distributed_fused_adam", "mcore_distributed_optim")
#: ``model.optim.grad_sync_dtype`` (the gradient buffer and reduce-scatter dtype of DISTRIBUTED_OPTIMIZERS) as
#: ``--grad-dtype``: a dtype's name, or a precision's bits
PRECISION_BITS = {"32": "fp32", "16": "fp16"}

_REF = re.compile(r"\$\{\.(\w+)\}")
_MULTIPLY = re.compile(r"^\$\{multiply:\s*([^,]+?)\s*,\s*([^}]+?)\s*\}$")


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def _resolve(value: Any, section: dict[str, Any], key: str, source: str) -> Any:
    """``${.hidden_size}`` and ``${multiply:a, b}`` within one section; other interpolations are refused."""
    if not isinstance(value, str) or "${" not in value:
        return value
    text = _REF.sub(lambda m: str(_resolve(section.get(m.group(1)), section, m.group(1), source)), value)
    product = _MULTIPLY.match(text)
    if product:
        return as_int(product.group(1), key, source) * as_int(product.group(2), key, source)
    if "${" in text:
        raise ConfigError(f"{source}: {key} = {value!r}: an interpolation echosim cannot resolve")
    return text


def read_nemo(spec: str, source: str) -> FromConfig:
    data = read_model_yaml(spec, source, "a NeMo training config")
    model = data["model"]
    flat = _flatten(data)
    args: list[str] = []
    names: dict[str, str] = {}  # Megatron flag -> the YAML key it came from
    for key, flag in TO_MEGATRON.items():
        value = flat.get(f"model.{key}")
        if value is None:
            continue
        value = _resolve(value, model, f"model.{key}", source)
        args += [flag, str(value)]
        names[flag] = f"model.{key}"
    for key, flag in SWITCHES.items():
        if flat.get(f"model.{key}") is True:
            args += [flag, "hybrid"] if flag == "--fp8-format" else [flag]
            names[flag] = f"model.{key}"
    groups, heads = flat.get("model.num_query_groups"), flat.get("model.num_attention_heads")
    if groups is not None and groups != heads:
        args += ["--group-query-attention", "--num-query-groups", str(groups)]
    activation = str(flat.get("model.activation", "gelu"))
    if activation in ("swiglu", "fast-swiglu"):
        args.append("--swiglu")
    elif activation not in ("gelu", "fast-gelu"):
        raise ConfigError(f"{source}: model.activation {activation!r} is not modelled (gelu, swiglu are)")
    norm = str(flat.get("model.normalization", "layernorm"))
    args += ["--normalization", "RMSNorm" if norm == "rmsnorm" else "LayerNorm"]
    args += ["--position-embedding-type", str(flat.get("model.position_embedding_type", "learned_absolute"))]
    if flat.get("model.share_embeddings_and_output_weights", True) is False:
        args.append("--untie-embeddings-and-output-weights")
    optim = flat.get("model.optim.name")
    if optim in DISTRIBUTED_OPTIMIZERS:
        args.append("--use-distributed-optimizer")
    precision = str(flat.get("trainer.precision", "32"))
    if precision in ("bf16", "bf16-mixed"):
        args.append("--bf16")
    elif precision in ("16", "16-mixed", "fp16"):
        args.append("--fp16")
    elif precision not in ("32", "32-true"):
        raise ConfigError(f"{source}: trainer.precision {precision!r} (bf16, 16 or 32)")
    # NeMo 1 copies every model.* key that names a TransformerConfig field into it (megatron_base_model.py
    # build_transformer_config, NeMo tag v2.1.0): the loss fusion and its implementation among them
    if flat.get("model.cross_entropy_loss_fusion") is True:
        args.append("--cross-entropy-loss-fusion")
        if "model.cross_entropy_fusion_impl" in flat:
            args += ["--cross-entropy-fusion-impl", str(flat["model.cross_entropy_fusion_impl"])]
    try:
        out = from_arguments(args, source, [])
    except ConfigError as exc:  # in the YAML's names
        raise ConfigError(_renamed(str(exc), names)) from None
    out.framework = out.options["framework"] = loss_framework("nemo", get_framework(out.framework).loss_kernel)
    if "model.optim.name" in flat and optim not in DISTRIBUTED_OPTIMIZERS:
        out.options["zero"] = 0  # a plain (fused) Adam: the optimizer state is replicated
    if flat.get("model.fsdp") is True:
        out.options["zero"] = 3
    sync = flat.get("model.optim.grad_sync_dtype")
    if sync is not None:
        name = dtype_name(str(sync)) or PRECISION_BITS.get(str(sync))
        if name is None:
            raise ConfigError(f"{source}: model.optim.grad_sync_dtype {sync!r} (fp32, bf16 or fp16)")
        out.options["grad_dtype"] = name
    elif optim in DISTRIBUTED_OPTIMIZERS and precision not in ("32", "32-true"):
        out.options["grad_dtype"] = "fp32"  # both keep and reduce fp32 gradients unless told (DISTRIBUTED_OPTIMIZERS)
    nodes, per_node = flat.get("trainer.num_nodes"), flat.get("trainer.devices")
    if nodes is not None and per_node is not None:
        out.options["devices"] = as_int(nodes, "trainer.num_nodes", source) * as_int(
            per_node, "trainer.devices", source
        )
    else:
        out.needs_devices = "trainer.num_nodes / trainer.devices not given: give --devices"
    out.notes = [_renamed(n, names) for n in out.notes]
    if out.model_error:
        out.model_error = _renamed(out.model_error, names)
    out.unknown, out.ignored = [], []
    skipped = []
    for key, value in flat.items():
        if key in CONSUMED:
            continue
        if key.startswith(IGNORED_SECTIONS) or key in IGNORED:
            out.ignored.append(key)
        elif key in NOT_MODELLED:
            if value not in (None, False, 0, "none"):
                skipped.append(key.removeprefix("model."))
        elif key.startswith(("model.", "trainer.")):
            out.unknown.append(key)
        else:
            out.ignored.append(key)
    if skipped:
        out.notes.append(f"not modelled: {', '.join(skipped)}")
    return out


def _renamed(text: str, names: dict[str, str]) -> str:
    """A Megatron reader's message in the YAML's names."""
    every = {flag: f"model.{key}" for key, flag in (TO_MEGATRON | SWITCHES).items()} | names
    return in_yaml_names(text, every).replace("neither --fp16 nor --bf16", "trainer.precision 32")
