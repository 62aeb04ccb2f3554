"""Read the configs teams already have: Megatron-LM arguments, NeMo YAML, Megatron-Bridge ConfigContainer YAML,
torchtitan TOML, MaxText YAML, DeepSpeed JSON.

``read_source("megatron:train.sh")`` returns a :class:`FromConfig`: the ``compile`` options
and the model the file states, what it leaves to the framework's defaults (applied by the
plan, :mod:`echosim.frameworks`) and what was not used. :func:`resolve` merges it with the
flags given beside it (those win) and fills what needs the device count (the global batch of
torchtitan and MaxText, the data-parallel size of a DeepSpeed config).

Above the frontend (a config may build its model from its own sizes) and the plan; below the
commands and ``check``, which take ``--from`` / ``from =``.
"""

from __future__ import annotations

from typing import Any

from echosim.configs.base import ConfigError, ConfigModel, FromConfig, describe_model
from echosim.configs.deepspeed import read_deepspeed
from echosim.configs.maxtext import read_maxtext
from echosim.configs.mbridge import read_mbridge
from echosim.configs.megatron import read_megatron, read_megatron_args
from echosim.configs.nemo import read_nemo
from echosim.configs.torchtitan import read_torchtitan

READERS = {
    "megatron": read_megatron,
    "torchtitan": read_torchtitan,
    "maxtext": read_maxtext,
    "deepspeed": read_deepspeed,
    "nemo": read_nemo,
    "mbridge": read_mbridge,
}

__all__ = ["READERS", "ConfigError", "ConfigModel", "FromConfig", "describe_model", "read_source", "resolve"]


def read_source(source: str) -> FromConfig:
    """``FRAMEWORK:FILE`` -> what the file says; an unknown framework or a bad file is one line."""
    framework, sep, spec = source.partition(":")
    if not sep or framework not in READERS:
        raise ConfigError(f"--from {source!r}: expected FRAMEWORK:FILE with FRAMEWORK one of {', '.join(READERS)}")
    if not spec.strip():
        raise ConfigError(f"--from {source!r}: no file given")
    return READERS[framework](spec.strip(), source)


def read_args(text: str) -> FromConfig:
    """``--from-args "--tensor-model-parallel-size 8 ..."``: Megatron arguments in one string."""
    return read_megatron_args(text)


def _integer(value: float, what: str, source: str) -> int:
    if value != int(value) or value < 1:
        raise ConfigError(f"{source}: {what} = {value:g} is not a whole number of sequences")
    return int(value)


def resolve(cfg: FromConfig, flags: dict[str, Any], model: str | None) -> tuple[Any, dict[str, Any]]:
    """The model and the ``compile`` options of ``cfg`` with ``flags`` (given beside it) overriding.

    ``flags`` holds the command's layout options; ``None`` (or an empty tuple) means not given.
    """
    typed = {k: v for k, v in flags.items() if v is not None and v != ()}
    opts = dict(cfg.options)
    if typed.keys() & {"devices", "tp", "pp", "cp"} and "dp" not in typed:
        opts.pop("dp", None)  # a layout changed beside the file: data parallelism takes the rest again
    opts.update(typed)
    if "devices" in typed:
        cfg.notes = [n for n in cfg.notes if not n.startswith("devices from the launcher")]
    chosen = model or cfg.model
    if chosen is None and cfg.model_error:
        raise ConfigError(cfg.model_error)
    if chosen is None:
        raise ConfigError(f"{cfg.source}: names no model it trains: give MODEL (a zoo name or hf:config.json)")
    if cfg.needs_batch and not typed.keys() & {"micro_batch", "global_batch"}:
        raise ConfigError(f"{cfg.source}: {cfg.needs_batch}")
    if "devices" not in opts and cfg.needs_devices:
        raise ConfigError(f"{cfg.source}: {cfg.needs_devices}")
    if "backend" not in opts and cfg.needs_backend:
        raise ConfigError(f"{cfg.source}: {cfg.needs_backend}")
    tp, pp, cp = (int(opts.get(k, 1)) for k in ("tp", "pp", "cp"))
    for key, value in (("tp", tp), ("pp", pp), ("cp", cp)):
        if value < 1:
            raise ConfigError(f"{cfg.source}: {key}={value}: a parallel degree is at least 1")
    devices = opts.get("devices")
    if devices and "devices" not in typed and "dp" not in opts and devices % (tp * pp * cp):
        raise ConfigError(
            f"{cfg.source}: the launcher starts {devices} devices, not a multiple of tensor x pipeline x context "
            f"parallel = {tp * pp * cp}: give --devices"
        )
    dp = opts.get("dp") or (devices // (tp * pp * cp) if devices else 1)
    if cfg.local_batch and "global_batch" not in opts:
        opts["global_batch"] = cfg.local_batch * dp
    if cfg.per_device_batch:
        total = devices or dp * tp * pp * cp
        if "global_batch" not in typed:
            opts["global_batch"] = _integer(cfg.per_device_batch * total * cfg.accumulation, "global batch", cfg.source)
        if "micro_batch" not in typed:
            if pp == 1:
                per_replica = cfg.per_device_batch * tp * cp
                opts["micro_batch"] = _integer(per_replica, "per_device_batch_size x tp x cp", cfg.source)
            else:
                steps = dp * (cfg.pipeline_microbatches or pp) * cfg.accumulation
                opts["micro_batch"] = _integer(opts["global_batch"] / steps, "micro-batch", cfg.source)
    if cfg.framework == "deepspeed":
        accumulation = cfg.accumulation or 1
        if "global_batch" not in opts and "micro_batch" in opts:
            opts["global_batch"] = opts["micro_batch"] * accumulation * dp
        elif "micro_batch" not in opts and "global_batch" in opts:
            opts["micro_batch"] = _integer(opts["global_batch"] / (accumulation * dp), "micro-batch", cfg.source)
    return chosen, opts
