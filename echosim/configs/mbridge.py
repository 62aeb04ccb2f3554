"""A Megatron-Bridge run's configuration (``ConfigContainer`` as YAML: ``run_config.yaml`` beside a checkpoint,
the file ``logger.save_config_filepath`` writes, or an override file in its shape).

Its sections are Megatron-Bridge's dataclasses (``src/megatron/bridge/training/config.py``, commit 067f987):
``model`` holds Megatron-Core's ``TransformerConfig`` fields under their own names (``num_layers``,
``tensor_model_parallel_size``, ``multi_latent_attention``, ``recompute_modules``, ...), ``train`` the batch sizes,
``ddp`` / ``optimizer`` the optimizer sharding, ``comm_overlap`` the overlaps, ``mixed_precision`` a recipe name
(``bf16_with_mxfp8_mixed``) or its fields. Each setting is translated into the Megatron-LM argument it stands for
(:data:`TO_MEGATRON`, :data:`SWITCHES`) and read by the Megatron reader, so both apply the same rules; notes and
unknown keys are reported under the YAML's names. The device count is the launcher's: give ``--devices``.
"""

from __future__ import annotations

import re
from typing import Any

from echosim.configs.base import ConfigError, FromConfig, dtype_name, in_yaml_names, read_model_yaml
from echosim.configs.megatron import from_arguments
from echosim.frameworks import get_framework, loss_framework, weights_16bit_dtype
from echosim.passes.memory import OPTIMIZER_DTYPES

#: ``section.field`` -> the Megatron-LM argument that sets the same value.
TO_MEGATRON = {
    **{f"model.{k}": f"--{k.replace('_', '-')}" for k in (
        "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "kv_channels", "seq_length",
        "max_position_embeddings", "make_vocab_size_divisible_by", "vocab_size", "hidden_dropout",
        "attention_dropout", "tensor_model_parallel_size", "pipeline_model_parallel_size",
        "virtual_pipeline_model_parallel_size", "context_parallel_size", "expert_model_parallel_size",
        "expert_tensor_parallel_size", "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
        "moe_layer_freq", "moe_token_dispatcher_type", "moe_flex_dispatcher_backend", "moe_router_num_groups",
        "moe_router_group_topk", "moe_expert_capacity_factor", "q_lora_rank", "kv_lora_rank", "qk_head_dim",
        "qk_pos_emb_head_dim", "v_head_dim", "mtp_num_layers", "recompute_granularity", "recompute_method",
        "recompute_num_layers", "recompute_modules", "pipeline_model_parallel_layout", "cross_entropy_fusion_impl",
        "normalization", "position_embedding_type", "fp8_recipe", "cp_comm_type",
        "hierarchical_context_parallel_sizes")},
    "model.num_moe_experts": "--num-experts",
    "model.num_layers_in_first_pipeline_stage": "--decoder-first-pipeline-num-layers",
    "model.num_layers_in_last_pipeline_stage": "--decoder-last-pipeline-num-layers",
    "model.fp8": "--fp8-format",
    "dataset.seq_length": "--seq-length",
    "tokenizer.vocab_size": "--vocab-size",
    "train.global_batch_size": "--global-batch-size",
    "train.micro_batch_size": "--micro-batch-size",
    "ddp.data_parallel_sharding_strategy": "--data-parallel-sharding-strategy",
    "ddp.megatron_fsdp_grad_comm_dtype": "--megatron-fsdp-grad-comm-dtype",
    "ddp.megatron_fsdp_main_grads_dtype": "--megatron-fsdp-main-grads-dtype",
    "mixed_precision.fp8": "--fp8-format",
    "mixed_precision.fp8_recipe": "--fp8-recipe",
    **{f"optimizer.{k}_dtype": f"--{k.replace('_', '-')}-dtype" for k in OPTIMIZER_DTYPES},
}  # fmt: skip
#: ``section.field`` booleans that are one Megatron-LM switch when true.
SWITCHES = {
    "model.sequence_parallel": "--sequence-parallel",
    "model.multi_latent_attention": "--multi-latent-attention",
    "model.qk_layernorm": "--qk-layernorm",
    "model.moe_pad_expert_input_to_capacity": "--moe-pad-expert-input-to-capacity",
    "model.cross_entropy_loss_fusion": "--cross-entropy-loss-fusion",
    "model.moe_grouped_gemm": "--moe-grouped-gemm",
    "model.account_for_embedding_in_pipeline_split": "--account-for-embedding-in-pipeline-split",
    "model.account_for_loss_in_pipeline_split": "--account-for-loss-in-pipeline-split",
    "model.gated_linear_unit": "--swiglu",
    "model.bf16": "--bf16",
    "model.fp16": "--fp16",
    "mixed_precision.bf16": "--bf16",
    "mixed_precision.fp16": "--fp16",
    "ddp.use_distributed_optimizer": "--use-distributed-optimizer",
    "optimizer.use_precision_aware_optimizer": "--use-precision-aware-optimizer",
    "optimizer.use_distributed_optimizer": "--use-distributed-optimizer",
    "ddp.use_megatron_fsdp": "--use-megatron-fsdp",
    "ddp.overlap_grad_reduce": "--overlap-grad-reduce",
    "comm_overlap.tp_comm_overlap": "--tp-comm-overlap",
    "comm_overlap.overlap_moe_expert_parallel_comm": "--overlap-moe-expert-parallel-comm",
}
#: ``section.field`` booleans whose *false* value is a Megatron-LM switch.
INVERSE_SWITCHES = {
    "model.share_embeddings_and_output_weights": "--untie-embeddings-and-output-weights",
    "model.add_bias_linear": "--disable-bias-linear",
}
#: Mixed-precision recipe names (``mixed_precision.py``'s registered factories) -> the Megatron-LM arguments they
#: amount to; ``nvfp4`` runs NVFP4 GEMMs, which Megatron-LM sets with ``--fp4-format``.
PRECISION_RECIPES = {
    "bf16_mixed": ["--bf16"],
    "fp16_mixed": ["--fp16"],
    "bf16_with_fp8_delayed_scaling_mixed": ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "delayed"],
    "bf16_with_fp8_current_scaling_mixed": ["--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "tensorwise"],
    "bf16_with_fp8_subchannel_scaling_mixed": ["--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "blockwise"],
    "bf16_with_mxfp8_mixed": ["--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"],
    "bf16_with_nvfp4_mixed": ["--bf16"],
}
#: Sections whose keys other than those read above (:data:`TO_MEGATRON`, :data:`SWITCHES`) have no effect on step
#: time or memory: listed as ignored, never as not understood.
IGNORED_SECTIONS = ("logger", "checkpoint", "scheduler", "rng", "profiling", "rerun_state_machine", "ft",
                    "straggler", "nvrx_straggler", "dist", "env_vars", "inprocess_restart", "tensor_inspect",
                    "peft", "validation", "dataset", "tokenizer", "train", "optimizer", "ddp", "comm_overlap",
                    "mixed_precision")  # fmt: skip
_IGNORED_MODEL = re.compile(
    r"^model\.(init_method|output_layer_init|.*_epsilon$|rotary_|seq_len_interpolation|.*dtype$|"
    r"moe_router_(pre_softmax|topk_scaling_factor|score_function|enable_expert_bias|bias_update_rate|"
    r"load_balancing_type|dtype|force_load_balancing)|moe_aux_loss|moe_z_loss|mtp_loss|mscale|"
    r"calculate_per_token_loss|perform_initialization|use_cpu_initialization|_|.*_fusion$|persist_layer_norm|"
    r"attention_softmax_in_fp32|activation_func|apply_query_key_layer_scaling|cuda_graph|use_te_rng_tracker|"
    r"deallocate_pipeline_outputs|barrier_with_L1_time|timers|finalize_model_grads_func|grad_scale_func|"
    r"no_sync_func|param_sync_func|generation_config|hf_model_id|num_microbatches_with_partial_activation)"
)


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key.startswith("_"):  # ``_target_`` and the like: the dataclass a section was built from
            continue
        name = f"{prefix}{key}"
        if isinstance(value, dict) and not prefix:
            out.update(_flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


#: ``torch.dtype`` values of the optimizer's state dtypes, as the YAML holds them (``str(torch.bfloat16)``, or
#: Megatron's representer ``{_target_: torch.bfloat16, _call_: false}``: megatron/training/config/yaml_utils.py;
#: Megatron-Bridge also reads ``bf16`` and ``bfloat16``: activation_map.py DTYPE_MAP), by Megatron's name: the
#: floating-point ones are :func:`~echosim.configs.base.dtype_name`'s, and fp8 is stored as torch.uint8
#: (arguments.py's dtype_map)
_FP8_WORDS = {"uint8": "fp8", "float8_e4m3fn": "fp8"}


def _dtype_word(value: Any) -> str:
    """A torch dtype as the YAML holds it, by Megatron's name (anything else as written, for its check to name)."""
    if isinstance(value, dict) and isinstance(value.get("_target_"), str):
        value = value["_target_"]
    text = str(value)
    return dtype_name(text) or _FP8_WORDS.get(text.removeprefix("torch."), text)


def _value_words(value: Any) -> list[str]:
    """A YAML value as the words of a Megatron argument: a list is one word each, ``moe_layer_freq``'s pattern is
    kept whole (``[0, 0, 1]``)."""
    if isinstance(value, list) and value and all(isinstance(v, bool) or v in (0, 1) for v in value):
        return ["[" + ",".join(str(int(v)) for v in value) + "]"]
    if isinstance(value, list):
        return [str(v) for v in value]
    return [str(value)]


def read_mbridge(spec: str, source: str) -> FromConfig:
    data = read_model_yaml(spec, source, "a Megatron-Bridge ConfigContainer")
    flat = _flatten(data)
    args: list[str] = []
    names: dict[str, str] = {}  # Megatron flag -> the YAML key it came from
    precision = data.get("mixed_precision")
    if precision is not None and not isinstance(precision, str | dict):
        raise ConfigError(f"{source}: mixed_precision {precision!r}: a recipe name or its fields")
    recipe = precision.replace("-", "_") if isinstance(precision, str) else None
    if recipe is not None:
        if recipe not in PRECISION_RECIPES:
            raise ConfigError(
                f"{source}: mixed_precision {precision!r} is not a recipe echosim knows "
                f"({', '.join(PRECISION_RECIPES)})"
            )
        args += PRECISION_RECIPES[recipe]
    for key, flag in TO_MEGATRON.items():
        value = flat.get(key)
        if value is None or value == [] or flag in names:  # model.* wins over the section it was copied from
            continue
        args += [flag, *([_dtype_word(value)] if key.endswith("_dtype") else _value_words(value))]
        names[flag] = key
    for key, flag in SWITCHES.items():
        if flat.get(key) is True and flag not in names:
            args.append(flag)
            names[flag] = key
    for key, flag in INVERSE_SWITCHES.items():
        if flat.get(key) is False:
            args.append(flag)
            names[flag] = key
    groups, heads = flat.get("model.num_query_groups"), flat.get("model.num_attention_heads")
    if groups is not None and groups != heads:
        args += ["--group-query-attention", "--num-query-groups", str(groups)]
    try:
        out = from_arguments(args, source, [])
    except ConfigError as exc:
        raise ConfigError(_renamed(str(exc), names)) from None
    out.framework = out.options["framework"] = loss_framework("nemo", get_framework(out.framework).loss_kernel)
    if recipe == "bf16_with_nvfp4_mixed" or flat.get("mixed_precision.fp4") or flat.get("model.fp4"):
        out.options["dtype"] = "nvfp4"
    _grad_dtype(flat, precision, out)
    out.needs_devices = "a ConfigContainer holds no device count (the launcher's): give --devices"
    out.notes = [_renamed(n, names) for n in out.notes]
    if out.model_error:
        out.model_error = _renamed(out.model_error, names)
    out.unknown, out.ignored = [], []
    consumed = {*TO_MEGATRON, *SWITCHES, *INVERSE_SWITCHES, "model.num_query_groups", "mixed_precision"}
    for key, value in flat.items():
        if key in consumed:
            continue
        if key.split(".", 1)[0] in IGNORED_SECTIONS or _IGNORED_MODEL.match(key) or value in (None, False, [], ""):
            out.ignored.append(key)  # a feature left off, or a setting that costs nothing
        else:
            out.unknown.append(key)
    return out


def _grad_dtype(flat: dict[str, Any], precision: str | dict[str, Any] | None, out: FromConfig) -> None:
    """``grad_reduce_in_fp32`` as ``grad_dtype`` where the file settles it. ``finalize`` resolves a recipe name
    and copies the mixed-precision config's fields over the DDP config's (``MixedPrecisionConfig.setup``,
    ``update_config_with_precision_overrides``; config.py and mixed_precision.py, commit 067f987), so
    ``mixed_precision.grad_reduce_in_fp32`` wins over ``ddp.grad_reduce_in_fp32``; a recipe name takes its
    factory's (True from ``bf16_mixed``, False from ``fp16_mixed``, which the other recipes start from). Without a
    mixed-precision config the DDP config's own holds. Megatron-FSDP keeps its own main-gradient dtype (the
    Megatron reader's). Otherwise, or where a mixed-precision section leaves the key out (an override file's
    recipe may set it), the framework's."""
    opts = out.options
    if opts.get("dtype", "fp32") == "fp32" or "grad_dtype" in opts:
        return
    if isinstance(precision, str):
        stated: Any = not precision.replace("-", "_").startswith("fp16")
    elif isinstance(precision, dict):
        stated = precision.get("grad_reduce_in_fp32")
    else:
        stated = flat.get("ddp.grad_reduce_in_fp32")
    if isinstance(stated, bool):
        opts["grad_dtype"] = "fp32" if stated else weights_16bit_dtype(opts["dtype"])


def _renamed(text: str, names: dict[str, str]) -> str:
    """A Megatron reader's message in the YAML's names."""
    return in_yaml_names(text, {flag: key for key, flag in (TO_MEGATRON | SWITCHES | INVERSE_SWITCHES).items()} | names)
