"""A torchtitan TOML job config as a plan and a model.

Sections and defaults are torchtitan's ``torchtitan/config/job_config.py`` (commit 038d5fd,
the last layout of the TOML configs): ``training.local_batch_size = 8`` (``batch_size``
before it), ``global_batch_size = -1`` (local batch x data-parallel degree, no
accumulation), ``seq_len = 2048``, ``mixed_precision_param = "bfloat16"``,
``data_parallel_shard_degree = -1`` (FSDP over the devices the other degrees leave),
``activation_checkpoint.mode = "selective"``, ``pipeline_parallel_microbatch_size = 1``.
The device count is the launcher's (``torchrun --nproc_per_node``), not the file's: with a
shard degree of -1 it must be given with ``--devices``.
"""

from __future__ import annotations

import sys
from typing import Any

from echosim.configs.base import ConfigError, FromConfig, as_int, read_text

JOB_CONFIG = "torchtitan torchtitan/config/job_config.py, commit 038d5fd"

#: torchtitan ``model.name`` / ``model.flavor`` -> the zoo entry with the same sizes
#: (torchtitan/models/llama3/__init__.py: llama3_configs 8B, 70B, 405B).
FLAVORS = {("llama3", "8B"): "llama3-8b", ("llama3", "70B"): "llama3-70b", ("llama3", "405B"): "llama3-405b"}

#: Sections whose keys change neither step time nor memory.
IGNORED_SECTIONS = ("job", "profiling", "metrics", "optimizer", "lr_scheduler", "checkpoint", "validation", "comm",
                    "fault_tolerance", "memory_estimation", "experimental")  # fmt: skip
IGNORED_KEYS = {
    "model.tokenizer_path",
    "model.hf_assets_path",
    "training.max_norm",
    "training.steps",
    "training.dataset",
    "training.dataset_path",
    "training.seed",
    "training.deterministic",
    "training.warmup_steps",
    "float8.filter_fqns",
    "float8.precompute_float8_dynamic_scale_for_fsdp",
    "float8.enable_fsdp_float8_all_gather",
    "parallelism.fsdp_reshard_after_forward",
    "compile.components",
}
NOT_MODELLED = {
    "training.compile": "torch.compile's fusions",
    "compile.enable": "torch.compile's fusions",
    "parallelism.pipeline_parallel_schedule_csv": "a pipeline schedule from a CSV file",
    "activation_checkpoint.selective_ac_option": "",
}


def _load(path: str, source: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        return tomllib.loads(read_text(path, source))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML ({exc})") from None


def read_torchtitan(spec: str, source: str) -> FromConfig:
    data = _load(spec, source)
    flat: dict[str, Any] = {}
    for section, table in data.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: top-level key {section!r} is not a [section]")
        for key, value in table.items():
            flat[f"{section}.{key}"] = value
    out = FromConfig(source, "torchtitan")
    consumed = _plan(flat, out)
    consumed |= _model(flat, out)
    for key, value in flat.items():
        if key in consumed:
            continue
        if key.split(".")[0] in IGNORED_SECTIONS or key in IGNORED_KEYS:
            out.ignored.append(key)
        elif key in NOT_MODELLED:
            if NOT_MODELLED[key] and value:
                out.notes.append(f"{key} = {value!r}: not modelled ({NOT_MODELLED[key]})")
        else:
            out.unknown.append(key)
    return out


def _get(flat: dict[str, Any], key: str, default: Any) -> Any:
    return flat.get(key, default)


def _plan(flat: dict[str, Any], out: FromConfig) -> set[str]:
    src, opts = out.source, out.options
    used = {
        "training.local_batch_size", "training.batch_size", "training.global_batch_size", "training.seq_len",
        "training.mixed_precision_param", "parallelism.data_parallel_replicate_degree",
        "parallelism.data_parallel_shard_degree", "parallelism.tensor_parallel_degree",
        "parallelism.pipeline_parallel_degree", "parallelism.context_parallel_degree",
        "parallelism.expert_parallel_degree", "parallelism.pipeline_parallel_microbatch_size",
        "parallelism.pipeline_parallel_schedule", "parallelism.enable_async_tensor_parallel",
        "parallelism.disable_loss_parallel", "activation_checkpoint.mode", "model.converters",
        "parallelism.context_parallel_rotate_method", "float8.recipe_name", "training.mixed_precision_reduce",
        "training.enable_cpu_offload",
    }  # fmt: skip
    # FSDP's reduce dtype: torchtitan takes only "float32" (``mixed_precision_reduce: Literal["float32"]``,
    # torchtitan/config/configs.py, commit b5bcd76), the torchtitan framework's fp32 reduce-scatter
    reduce = str(_get(flat, "training.mixed_precision_reduce", "float32"))
    if reduce != "float32":
        raise ConfigError(f"{src}: training.mixed_precision_reduce {reduce!r} (torchtitan takes only float32)")

    def num(key: str, default: int) -> int:
        return as_int(_get(flat, key, default), key, src)

    local = num("training.local_batch_size", num("training.batch_size", 8))
    tp, pp, cp = (
        num("parallelism.tensor_parallel_degree", 1),
        num("parallelism.pipeline_parallel_degree", 1),
        num("parallelism.context_parallel_degree", 1),
    )
    replicate, shard = (
        num("parallelism.data_parallel_replicate_degree", 1),
        num("parallelism.data_parallel_shard_degree", -1),
    )
    ep = num("parallelism.expert_parallel_degree", 1)
    opts.update({"tp": tp, "pp": pp, "cp": cp, "seq_len": num("training.seq_len", 2048)})
    if ep > 1:
        opts["ep"] = ep
    if shard == -1:
        out.needs_devices = (
            "parallelism.data_parallel_shard_degree = -1 takes the devices torchrun starts: give --devices"
        )
    else:
        opts["dp"] = replicate * shard
        opts["devices"] = replicate * shard * tp * pp * cp
    opts["zero"] = 3 if shard != 1 else 0
    if _get(flat, "training.enable_cpu_offload", False):
        # FSDP2's CPUOffloadPolicy (torchtitan/distributed/fsdp.py, commit b5bcd76): weight shards, gradients and
        # optimizer state on the host, the step on its CPU; applied with FSDP only (fsdp_enabled: dp_shard or cp > 1)
        if opts["zero"] == 3:
            opts["offload_params"] = opts["offload_optimizer"] = True
        else:
            out.notes.append("training.enable_cpu_offload: applies with FSDP only (data_parallel_shard_degree 1 "
                             "here): ignored")  # fmt: skip
    if shard != 1 and replicate > 1:
        out.notes.append(f"HSDP: {replicate} replicas x FSDP shards, costed as FSDP over all data-parallel ranks")
    microbatch = num("parallelism.pipeline_parallel_microbatch_size", 1) if pp > 1 else local
    if local % microbatch:
        raise ConfigError(
            f"{src}: training.local_batch_size {local} is not a multiple of "
            f"parallelism.pipeline_parallel_microbatch_size {microbatch}"
        )
    opts["micro_batch"] = microbatch
    global_batch = num("training.global_batch_size", -1)
    out.local_batch = local  # the global batch is local x dp (dp known once the devices are)
    if global_batch > 0:
        opts["global_batch"] = global_batch
    if pp > 1:
        schedule = str(_get(flat, "parallelism.pipeline_parallel_schedule", "1F1B"))
        known = {"1F1B": "1f1b", "GPipe": "gpipe", "Interleaved1F1B": "interleaved", "ZBVZeroBubble": "zb-h1"}
        if schedule not in known:
            raise ConfigError(f"{src}: parallelism.pipeline_parallel_schedule {schedule!r} is not modelled "
                              f"({', '.join(known)} are)")  # fmt: skip
        opts["schedule"] = known[schedule]
        if known[schedule] == "interleaved":
            opts["vpp"] = 2
            out.notes.append("Interleaved1F1B: two stages per rank (torchtitan's default for looped schedules)")
    if _get(flat, "parallelism.enable_async_tensor_parallel", False):
        opts["tp_overlap"] = True
    if tp > 1:
        opts["sp"] = True  # torchtitan's tensor parallelism shards norms and dropout over the sequence
    converters = _get(flat, "model.converters", [])
    converters = [converters] if isinstance(converters, str) else list(converters)
    precision = str(_get(flat, "training.mixed_precision_param", "bfloat16"))
    if precision not in ("bfloat16", "float32"):
        raise ConfigError(f"{src}: training.mixed_precision_param {precision!r} (bfloat16 or float32)")
    opts["dtype"] = "fp8" if "float8" in converters else ("bf16" if precision == "bfloat16" else "fp32")
    recipe = _get(flat, "float8.recipe_name", None)
    if "float8" in converters and recipe not in (None, "tensorwise"):
        out.notes.append(f"float8.recipe_name = {recipe!r}: priced as tensorwise scaling; torchtitan's rowwise runs "
                         "were 30-38% slower than that (benchmarks/torchtitan_newer_runs.py)")  # fmt: skip
    mode = str(_get(flat, "activation_checkpoint.mode", "selective"))
    if mode not in ("none", "selective", "full"):
        raise ConfigError(f"{src}: activation_checkpoint.mode {mode!r} (none, selective, full)")
    opts["recompute"] = mode
    if mode == "selective":
        option = str(_get(flat, "activation_checkpoint.selective_ac_option", "2"))
        # "op" stays "selective": the torchtitan framework's per-op policy (frameworks.py: selective "op")
        if option.isdigit():
            # layer-wise selective AC: a layer is checkpointed when a count of the layers wrapped so far is a
            # multiple of N (every layer for 0 or 1): echosim's full:every-N (passes/recompute.py)
            every = int(option)
            opts["recompute"] = f"full:every-{every}" if every > 1 else "full"
        elif option != "op":
            raise ConfigError(
                f"{src}: activation_checkpoint.selective_ac_option {option!r} ('op' or a whole number of layers)"
            )
    return used


def _model(flat: dict[str, Any], out: FromConfig) -> set[str]:
    name = str(_get(flat, "model.name", "llama3"))
    flavor = str(_get(flat, "model.flavor", "debugmodel"))
    out.model = FLAVORS.get((name, flavor))
    if out.model is None:
        out.notes.append(f"model.name {name!r} flavor {flavor!r} is not one echosim knows: give MODEL")
    return {"model.name", "model.flavor"}
