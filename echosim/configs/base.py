"""What every reader returns (:class:`FromConfig`), the model a config describes, and how readers fail.

A reader turns one framework's file into ``compile`` options (the names of
:mod:`echosim.commands.options`, e.g. ``tp``, ``global_batch``, ``devices``), a model (a
zoo or ``hf:`` name, or an :class:`~echosim.frontend.zoo.ArchConfig` built from the file's
own sizes) and three lists the command prints: approximations and settings echosim does not
model (``notes``), keys it does not understand (``unknown``) and keys that change neither
step time nor memory (``ignored``, shown with ``--verbose``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from echosim.errors import EchosimError
from echosim.frontend.zoo import ZOO, ArchConfig


class ConfigError(EchosimError):
    """A framework config echosim cannot read; the message names the file and the key."""


@dataclass
class FromConfig:
    """One framework config, read: the options and model it states, and what was not used."""

    source: str  # as given: ``megatron:train.sh``
    framework: str
    options: dict[str, Any] = field(default_factory=dict)  # compile option -> value
    model: str | ArchConfig | None = None
    notes: list[str] = field(default_factory=list)  # understood, but approximated or not modelled
    unknown: list[str] = field(default_factory=list)  # keys not understood (always printed)
    ignored: list[str] = field(default_factory=list)  # no effect on step time or memory (--verbose)
    local_batch: int = 0  # sequences per data-parallel replica per step (global = local x dp) unless stated
    per_device_batch: float = 0.0  # MaxText: sequences per device per micro-step (global = this x devices)
    accumulation: int = 1  # MaxText / DeepSpeed gradient accumulation steps
    needs_devices: str = ""  # why the file cannot give the device count (then --devices is required)
    needs_backend: str = ""  # why the file cannot name the hardware (then --backend is required)
    pipeline_microbatches: int = 0  # MaxText: micro-batches per pipeline step
    needs_batch: str = ""  # why the file gives no batch size (then --micro-batch or --global-batch is required)
    model_error: str = ""  # why the file's sizes make no model (an error only when no MODEL is named)

    def __post_init__(self) -> None:
        self.options.setdefault("framework", self.framework)


@dataclass(frozen=True)
class ConfigModel:
    """A model built from a config's own sizes; captured like a zoo entry, named after the config."""

    config: ArchConfig
    name: str

    @property
    def arch(self) -> str:
        return self.name

    def capture(self, spec: Any) -> tuple[Any, list[str], int]:
        from echosim.frontend.capture import capture_object

        return capture_object(self.config, spec, self.name)


def normalised(cfg: ArchConfig) -> ArchConfig:
    """``cfg`` with sizes that equal their defaults written as the default (0), description dropped.

    Two configs describing the same network compare equal after this, whichever of the
    defaulted fields each spelled out.
    """
    head_dim = 0 if cfg.head_dim == cfg.hidden // max(cfg.heads, 1) else cfg.head_dim
    kv_heads = 0 if cfg.kv_heads == cfg.heads else cfg.kv_heads
    ffn = 0 if cfg.ffn == 4 * cfg.hidden else cfg.ffn
    moe_ffn = 0 if cfg.moe_ffn == (ffn or 4 * cfg.hidden) else cfg.moe_ffn
    if cfg.arch == "moe":  # every layer is a mixture of experts: the dense width is only the experts' default
        ffn, moe_ffn = 0, cfg.expert_ffn
    return replace(cfg, head_dim=head_dim, kv_heads=kv_heads, ffn=ffn, moe_ffn=moe_ffn, description="")


def zoo_name(cfg: ArchConfig) -> str | None:
    """The zoo entry ``cfg`` is, size for size (the sequence aside: the plan carries it); else ``None``."""
    mine = replace(normalised(cfg), seq_len=0)
    for name, entry in ZOO.items():
        if replace(normalised(entry), seq_len=0) == mine:
            return name
    return None


def model_or_zoo(cfg: ArchConfig, source: str) -> str | ConfigModel:
    """The zoo name for a config that is a zoo model, else the config itself, named after ``source``."""
    return zoo_name(cfg) or ConfigModel(cfg, source)


def describe_model(model: Any) -> str:
    """One line naming a model read from a config: a zoo name, or its sizes."""
    if isinstance(model, ConfigModel):
        cfg = model.config
        parts = [f"{cfg.arch}", f"{cfg.layers} layers", f"hidden {cfg.hidden}", f"{cfg.heads} heads"]
        if cfg.n_kv_heads != cfg.heads:
            parts.append(f"{cfg.n_kv_heads} kv heads")
        if cfg.head_dim:
            parts.append(f"head dim {cfg.head_dim}")
        parts += [f"ffn {cfg.ffn_hidden}", f"vocab {cfg.vocab}", f"seq {cfg.seq_len}"]
        if cfg.experts:
            parts.append(f"{cfg.experts} experts top-{cfg.top_k} ffn {cfg.expert_ffn}")
        if cfg.shared_experts:
            parts.append(f"{cfg.shared_experts} shared")
        if cfg.arch == "gpt" and not cfg.tied_embeddings:
            parts.append("untied output layer")
        return f"the model it describes ({', '.join(parts)})"
    return str(model)


def read_text(path: str, source: str) -> str:
    try:
        return Path(path).expanduser().read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read {path} ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{source}: {path} is not a text file") from None


def read_model_yaml(path: str, source: str, what: str) -> dict[str, Any]:
    """A YAML file whose ``model:`` section the NeMo and Megatron-Bridge readers translate; ``what`` names the
    kind of file in the one-line error when it has none."""
    import yaml

    try:
        data = yaml.safe_load(read_text(path, source))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML ({' '.join(str(exc).split())[:200]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise ConfigError(f"{source}: no model: section (not {what})")
    return data


def in_yaml_names(text: str, keys: dict[str, str]) -> str:
    """A Megatron reader's message with each Megatron-LM flag of ``keys`` replaced by the YAML key it came from
    (longest flag first, so ``--fp8-format`` is not read as ``--fp8``)."""
    import re

    for flag, key in sorted(keys.items(), key=lambda kv: -len(kv[0])):
        text = re.sub(rf"{re.escape(flag)}(?![\w-])", key, text)
    return text


def as_int(value: Any, key: str, where: str) -> int:
    """An integer setting; a float with no fraction is accepted (YAML ``12.0``), anything else is one line."""
    if isinstance(value, bool):
        raise ConfigError(f"{where}: {key} = {value!r} is not an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.replace("_", ""))
        except ValueError:
            pass
    raise ConfigError(f"{where}: {key} = {value!r} is not an integer")


#: A floating-point dtype as configs spell it (torch's and jnp's names, echosim's own), by echosim's name
DTYPE_NAMES = {**dict.fromkeys(("fp32", "float32", "float"), "fp32"), **dict.fromkeys(("bf16", "bfloat16"), "bf16"),
               **dict.fromkeys(("fp16", "float16", "half"), "fp16")}  # fmt: skip


def dtype_name(value: Any) -> str | None:
    """echosim's name of a dtype written as a config writes it (``torch.bfloat16``, ``float``, ``bf16``), else None."""
    return DTYPE_NAMES.get(value.removeprefix("torch.")) if isinstance(value, str) else None


def as_float(value: Any, key: str, where: str) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"{where}: {key} = {value!r} is not a number")
    try:
        return float(str(value).replace("_", "")) if isinstance(value, str) else float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {key} = {value!r} is not a number") from None


ARCH_FIELDS = {f.name for f in fields(ArchConfig)}
