"""A DeepSpeed JSON config as a plan; the model it trains is named beside it (``MODEL``).

Keys and defaults are DeepSpeed's configuration reference
(https://www.deepspeed.ai/docs/config-json/, DeepSpeed 0.x): ``train_batch_size =
train_micro_batch_size_per_gpu x gradient_accumulation_steps x data-parallel size``, two of
the three suffice; ``zero_optimization.stage`` 0 unless given; fp16 and bf16 off unless
``enabled`` (fp32 training). A DeepSpeed config holds no device count (the launcher's) and
no model (the training script's).
"""

from __future__ import annotations

import json
from typing import Any

from echosim.configs.base import ConfigError, FromConfig, as_int, dtype_name, read_text

DOCS = "DeepSpeed configuration JSON reference (https://www.deepspeed.ai/docs/config-json/)"

IGNORED = {
    "steps_per_print", "wall_clock_breakdown", "gradient_clipping", "optimizer", "scheduler", "tensorboard",
    "wandb", "csv_monitor", "comms_logger", "flops_profiler", "prescale_gradients", "zero_allow_untested_optimizer",
    "dump_state", "memory_breakdown", "checkpoint", "seed", "data_efficiency", "curriculum_learning",
}  # fmt: skip
#: The offload keys: the optimizer's, read as ``offload_optimizer`` (``cpu_offload: true`` is the older spelling),
#: and ZeRO-3's parameters', read as ``offload_params`` (``cpu_offload_params``).
OFFLOAD = {"offload_optimizer": "offload_optimizer", "cpu_offload": "offload_optimizer",
           "offload_param": "offload_params", "cpu_offload_params": "offload_params"}  # fmt: skip
ZERO_TUNING = {
    "overlap_comm", "contiguous_gradients", "reduce_bucket_size", "allgather_bucket_size", "reduce_scatter",
    "allgather_partitions", "stage3_max_live_parameters", "stage3_max_reuse_distance", "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold", "stage3_param_persitence_threshold",
    "stage3_gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save", "sub_group_size", "round_robin_gradients", "elastic_checkpoint",
    "load_from_fp32_weights", "ignore_unused_parameters", "legacy_stage1",
}  # fmt: skip
PRECISION_KEYS = {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "min_loss_scale",
                  "consecutive_hysteresis", "auto_cast", "immediate_grad_update"}  # fmt: skip


def read_deepspeed(spec: str, source: str) -> FromConfig:
    try:
        data = json.loads(read_text(spec, source))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: not a JSON object")
    out = FromConfig(source, "deepspeed")
    for key, value in data.items():
        if key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
            continue
        if key == "zero_optimization":
            _zero(value, out)
        elif key in ("fp16", "bf16", "bfloat16"):
            _precision(key, value, out)
        elif key == "data_types":
            _data_types(value, out)
        elif key == "activation_checkpointing":
            out.notes.append(
                "activation_checkpointing: applies only where the training script calls deepspeed.checkpointing; "
                "give --recompute full if it does"
            )
        elif key in IGNORED:
            out.ignored.append(key)
        else:
            out.unknown.append(key)
    enabled = {k: _enabled(data.get(k), k, source) for k in ("fp16", "bf16", "bfloat16")}
    if enabled["fp16"] and (enabled["bf16"] or enabled["bfloat16"]):
        raise ConfigError(f"{source}: fp16.enabled and bf16.enabled are both true")
    out.options["dtype"] = "fp16" if enabled["fp16"] else ("bf16" if enabled["bf16"] or enabled["bfloat16"] else "fp32")
    if out.options["dtype"] == "fp32":
        out.notes.append(f"neither fp16 nor bf16 enabled: fp32 training ({DOCS})")
    _batch(data, out)
    return out


def _enabled(section: Any, key: str, source: str) -> bool:
    if section is None:
        return False
    if not isinstance(section, dict):
        raise ConfigError(f"{source}: {key} is not an object")
    value = section.get("enabled", False)
    if value == "auto":
        raise ConfigError(f"{source}: {key}.enabled = 'auto' (the HF Trainer fills it): give --dtype")
    return bool(value)


def _precision(key: str, value: Any, out: FromConfig) -> None:
    if isinstance(value, dict):
        for sub in value:
            if sub not in PRECISION_KEYS:
                out.unknown.append(f"{key}.{sub}")


def _data_types(section: Any, out: FromConfig) -> None:
    """``data_types.grad_accum_dtype``: the dtype gradients accumulate in (``--grad-dtype``); unset, DeepSpeed
    takes the model's, or fp32 for bf16 without ZeRO (the framework's rule)."""
    if not isinstance(section, dict):
        raise ConfigError(f"{out.source}: data_types is not an object")
    for key, value in section.items():
        if key != "grad_accum_dtype":
            out.unknown.append(f"data_types.{key}")
        elif value is not None:  # DeepSpeed's DtypeEnum spellings (deepspeed/runtime/config.py, commit 38327e0)
            if (name := dtype_name(value)) is None:
                raise ConfigError(f"{out.source}: data_types.grad_accum_dtype {value!r} (DeepSpeed knows fp32, fp16, "
                                  "bf16)")  # fmt: skip
            out.options["grad_dtype"] = name


def _zero(section: Any, out: FromConfig) -> None:
    if not isinstance(section, dict):
        raise ConfigError(f"{out.source}: zero_optimization is not an object")
    stage = section.get("stage", 0)
    out.options["zero"] = as_int(stage, "zero_optimization.stage", out.source)
    if not 0 <= out.options["zero"] <= 3:
        raise ConfigError(f"{out.source}: zero_optimization.stage {stage} (0 to 3)")
    for key, value in section.items():
        if key == "stage":
            continue
        if key in OFFLOAD:
            _offload(key, value, out)
        elif key in ZERO_TUNING:
            out.ignored.append(f"zero_optimization.{key}")
        else:
            out.unknown.append(f"zero_optimization.{key}")


def _offload(key: str, value: Any, out: FromConfig) -> None:
    """``offload_optimizer: {"device": "cpu"}`` (or ``cpu_offload: true``) as ``offload_optimizer``, and
    ``offload_param`` (or ``cpu_offload_params``) as ``offload_params``. DeepSpeed offloads the optimizer only under
    ZeRO (stage 1 to 3) and the parameters only under stage 3; NVMe (ZeRO-Infinity) is not modelled."""
    option, what = OFFLOAD[key], "optimizer" if OFFLOAD[key] == "offload_optimizer" else "parameters"
    device = value.get("device", "none") if isinstance(value, dict) else ("cpu" if value is True else "none")
    if device in ("none", None):
        return
    if device != "cpu":
        out.notes.append(f"zero_optimization.{key} ({device}): not modelled (only the CPU offload is; the {what} "
                         "costed on the device)")  # fmt: skip
        return
    stage = out.options.get("zero", 0)
    if stage == 0 or (option == "offload_params" and stage != 3):
        needs = "ZeRO (stage 1 to 3)" if option == "offload_optimizer" else "ZeRO stage 3"
        out.notes.append(f"zero_optimization.{key} (cpu): DeepSpeed offloads the {what} only under {needs} (stage "
                         f"{stage} here): ignored")  # fmt: skip
        return
    out.options[option] = True
    if isinstance(value, dict) and value.get("ratio", 1) != 1:
        out.notes.append(f"zero_optimization.{key}.ratio {value['ratio']}: a partial offload is not modelled (the "
                         f"whole {what} costed on the host)")  # fmt: skip


def _batch(data: dict[str, Any], out: FromConfig) -> None:
    src = out.source
    given = {}
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        if key in data:
            if data[key] == "auto":
                out.needs_batch = out.needs_batch or f"{key} = 'auto' (the HF Trainer fills it): give --micro-batch"
                continue
            given[key] = as_int(data[key], key, src)
    if "train_batch_size" not in given and "train_micro_batch_size_per_gpu" not in given:
        out.needs_batch = out.needs_batch or (
            "no batch size: neither train_batch_size nor train_micro_batch_size_per_gpu is given "
            "(or give --micro-batch)"
        )
    if "train_micro_batch_size_per_gpu" in given:
        out.options["micro_batch"] = given["train_micro_batch_size_per_gpu"]
    if "train_batch_size" in given:
        out.options["global_batch"] = given["train_batch_size"]
    out.accumulation = given.get("gradient_accumulation_steps", 0)
    if "train_batch_size" in given and "train_micro_batch_size_per_gpu" in given and out.accumulation:
        per_step = given["train_micro_batch_size_per_gpu"] * out.accumulation
        if given["train_batch_size"] % per_step:
            raise ConfigError(
                f"{src}: train_batch_size {given['train_batch_size']} is not a multiple of "
                f"train_micro_batch_size_per_gpu x gradient_accumulation_steps = {per_step}"
            )
        out.options["dp"] = given["train_batch_size"] // per_step
        out.options["devices"] = out.options["dp"]
    elif "devices" not in out.options:
        out.needs_devices = "a DeepSpeed config holds no device count (the launcher's): give --devices"
