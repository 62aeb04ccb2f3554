"""Goodput: the share of a cluster's time that trains, once failures, checkpoints and restarts count.

A synchronous job stops whenever any device fails, so the job's mean time between failures is
the per-device MTBF over the device count. Between failures the job writes a checkpoint every
``interval`` seconds of training; a failure loses the work since the last *persisted*
checkpoint and costs a restart. The first-order model of Young (1974) and Daly (2006), per unit
of useful work:

    wall = ideal * (1 + block / interval) / (1 - (restart + lost) / mtbf_job)
    lost = (interval + block) / 2 + lag

``block`` is the time a checkpoint stops training: the whole write for a synchronous
checkpoint; for an asynchronous one only the copy of each device's shard to host memory, after
which the write to storage (``lag`` seconds) runs beside training. Minimising ``wall`` over the
interval gives :func:`optimal_interval_s`; for ``block``, ``restart`` and ``lag`` small against
the MTBF it is Young's ``sqrt(2 * block * mtbf_job)``.

Checkpoint bytes are the model's weights and optimizer state as the memory model counts them
(:class:`~echosim.passes.memory.StatePolicy`, unsharded: one copy of each), without gradients.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from echosim.errors import EchosimError
from echosim.frameworks import get_framework
from echosim.passes.memory import StatePolicy

HOUR_S = 3600.0
DAY_S = 86400.0

_LLAMA3 = "Dubey et al. 2024, The Llama 3 Herd of Models, arXiv:2407.21783, sec. 3.3.1"
_A100_SHEET = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
_H100_PAGE = "https://www.nvidia.com/en-us/data-center/h100/"


@dataclass(frozen=True)
class StorageSpec:
    """Where checkpoints are written and how fast.

    ``scope``: ``aggregate`` is one bandwidth the whole job shares (a distributed file system);
    ``per_device`` is a bandwidth each device has to itself (its own PCIe link to host memory).
    """

    name: str
    write_GBps: float
    scope: str
    source: str

    def write_s(self, checkpoint_bytes: float, devices: int) -> float:
        """Seconds to write one checkpoint spread evenly over ``devices`` writers."""
        share = checkpoint_bytes / devices if self.scope == "per_device" else checkpoint_bytes
        return share / (self.write_GBps * 1e9)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "write_GBps": self.write_GBps, "scope": self.scope, "source": self.source}


STORAGE: dict[str, StorageSpec] = {
    s.name: s
    for s in (
        # Meta's Tectonic: 240 PB on 7,500 SSD servers, 2 TB/s sustained and 7 TB/s peak.
        StorageSpec("tectonic", 2000.0, "aggregate", f"{_LLAMA3} (Tectonic, 2 TB/s sustained)"),
        StorageSpec("tectonic-peak", 7000.0, "aggregate", f"{_LLAMA3} (Tectonic, 7 TB/s peak)"),
        # In-memory checkpoints (each device's shard in its host's DRAM): one PCIe direction per device.
        StorageSpec("host-pcie4", 32.0, "per_device", f"{_A100_SHEET} (PCIe Gen4 x16: 64 GB/s both directions)"),
        StorageSpec("host-pcie5", 64.0, "per_device", f"{_H100_PAGE} (PCIe Gen5 x16: 128 GB/s both directions)"),
    )
}

#: The host link of each device family, for the blocking copy of an asynchronous checkpoint.
HOST_LINK = {"ampere": STORAGE["host-pcie4"], "hopper": STORAGE["host-pcie5"], "blackwell": STORAGE["host-pcie5"]}

_CUSTOM = re.compile(r"^(\d+(?:\.\d+)?)GBps$")


def parse_storage(text: str) -> StorageSpec:
    """A named storage (:data:`STORAGE`) or an aggregate bandwidth written ``<number>GBps``."""
    if text in STORAGE:
        return STORAGE[text]
    match = _CUSTOM.match(text.strip())
    if match and float(match.group(1)) > 0:
        return StorageSpec(text, float(match.group(1)), "aggregate", "given on the command line")
    raise EchosimError(f"--storage {text!r}: unknown storage (known: {', '.join(STORAGE)}, or e.g. 500GBps)")


def checkpoint_bytes(
    params: int, dtype: str, framework: str, pp: int = 1, tables: Mapping[str, int] | None = None
) -> int:
    """Weights and optimizer state of every parameter, once: what a full checkpoint holds.

    ``tables`` (a report's ``embedding_tables``): sharded embedding tables keep their rows in their own dtype and
    row-wise Adagrad state, not the dense parameters' master copy and Adam moments, so they count as they are held.
    """
    state = StatePolicy.for_training(dtype, 0, 1, **get_framework(framework).state(pp))
    sparse = tables or {}
    dense = params - sparse.get("params", 0)
    held = sparse.get("weight_bytes", 0) + sparse.get("optimizer_bytes", 0)
    return int(dense * (state.weight_bytes + state.optimizer_bytes)) + held


def job_mtbf_s(mtbf_device_hours: float, devices: int) -> float:
    """Mean time between failures of a job that stops when any of ``devices`` fails (independent, exponential)."""
    return mtbf_device_hours * HOUR_S / devices


def young_interval_s(block_s: float, mtbf_s: float) -> float:
    """Young's (1974) first-order optimum: ``sqrt(2 * block * mtbf)``."""
    return math.sqrt(2.0 * block_s * mtbf_s)


def daly_interval_s(block_s: float, mtbf_s: float) -> float:
    """Daly's (2006, FGCS 22:303) higher-order optimum; ``mtbf`` itself when ``block >= 2 mtbf``."""
    if block_s >= 2.0 * mtbf_s:
        return mtbf_s
    r = block_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * block_s * mtbf_s) * (1.0 + math.sqrt(r) / 3.0 + r / 9.0) - block_s


def wall_factor(interval_s: float, block_s: float, lag_s: float, restart_s: float, mtbf_s: float) -> float:
    """Wall-clock seconds per second of useful training; ``inf`` when failures outpace progress."""
    lost = (interval_s + block_s) / 2.0 + lag_s
    left = 1.0 - (restart_s + lost) / mtbf_s
    return (1.0 + block_s / interval_s) / left if left > 0 else math.inf


def optimal_interval_s(block_s: float, lag_s: float, restart_s: float, mtbf_s: float) -> float:
    """The interval that minimises :func:`wall_factor`, in closed form.

    Setting its derivative to zero gives ``t**2 + 2 b t - 2 b (M - a) = 0`` with
    ``a = restart + block / 2 + lag``; the positive root. ``nan`` when ``a >= M``.
    """
    a = restart_s + block_s / 2.0 + lag_s
    if a >= mtbf_s:
        return math.nan
    return -block_s + math.sqrt(block_s * block_s + 2.0 * block_s * (mtbf_s - a))


@dataclass(frozen=True)
class GoodputInput:
    """The failure and checkpoint settings of one run (``compile --mtbf-hours ...``)."""

    mtbf_device_hours: float
    restart_minutes: float = 0.0
    interval_minutes: float | None = None  # None: the optimum
    storage: StorageSpec = STORAGE["tectonic"]
    mode: str = "sync"  # or "async"
    tokens: float | None = None

    def check(self) -> None:
        if not (self.mtbf_device_hours > 0 and math.isfinite(self.mtbf_device_hours)):
            raise EchosimError(f"--mtbf-hours must be a positive number of hours, got {self.mtbf_device_hours:g}")
        if not (self.restart_minutes >= 0 and math.isfinite(self.restart_minutes)):
            raise EchosimError(f"--restart-minutes must be 0 or more, got {self.restart_minutes:g}")
        interval = self.interval_minutes
        if interval is not None and not (interval > 0 and math.isfinite(interval)):
            raise EchosimError(f"--checkpoint-interval must be 'auto' or minutes > 0, got {interval:g}")
        if self.tokens is not None and not (self.tokens > 0 and math.isfinite(self.tokens)):
            raise EchosimError(f"--tokens must be a positive number, got {self.tokens:g}")
        if self.mode not in ("sync", "async"):
            raise EchosimError(f"--checkpoint-mode must be sync or async, got {self.mode!r}")


def parse_interval(text: str) -> float | None:
    """``auto`` (the Young/Daly optimum) or minutes."""
    if text.strip().lower() == "auto":
        return None
    try:
        value = float(text)
    except ValueError:
        raise EchosimError(f"--checkpoint-interval must be 'auto' or minutes, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise EchosimError(f"--checkpoint-interval must be 'auto' or minutes > 0, got {text!r}")
    return value


def host_link(backend: str) -> StorageSpec:
    """The per-device host link an asynchronous checkpoint copies over; one line for a backend without one."""
    from echosim.backends.devices import DEVICES

    spec = DEVICES.get(backend)
    if spec is None or spec.arch not in HOST_LINK:
        known = ", ".join(sorted(DEVICES))
        raise EchosimError(
            f"--checkpoint-mode async: no host-link bandwidth known for backend {backend!r} (known: {known})"
        )
    return HOST_LINK[spec.arch]


def goodput(
    given: GoodputInput,
    *,
    params: int,
    dtype: str,
    framework: str,
    pp: int,
    devices: int,
    backend: str,
    step_time_s: float,
    tokens_per_s: float | None,
    tables: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The goodput section of a report: checkpoint size and times, the interval, failures, time to train."""
    given.check()
    ckpt = checkpoint_bytes(params, dtype, framework, pp, tables)
    write_s = given.storage.write_s(ckpt, devices)
    if given.mode == "async":
        block_s, lag_s = host_link(backend).write_s(ckpt, devices), write_s
    else:
        block_s, lag_s = write_s, 0.0
    restart_s = given.restart_minutes * 60.0
    mtbf_s = job_mtbf_s(given.mtbf_device_hours, devices)
    if given.interval_minutes is None:
        best = optimal_interval_s(block_s, lag_s, restart_s, mtbf_s)
        # at least one step, and (async) no new checkpoint before the last one is written
        floor = max(step_time_s, lag_s - block_s)
        interval_s = max(best, floor) if math.isfinite(best) else floor
        source = "young-daly"
    else:
        interval_s = given.interval_minutes * 60.0
        source = "given"
    steps = max(1, round(interval_s / step_time_s))
    interval_s = steps * step_time_s  # checkpoints fall on step boundaries
    factor = wall_factor(interval_s, block_s, lag_s, restart_s, mtbf_s)
    out: dict[str, Any] = {
        "mtbf_device_hours": given.mtbf_device_hours,
        "mtbf_job_hours": mtbf_s / HOUR_S,
        "interruptions_per_day": DAY_S / mtbf_s,
        "checkpoint_bytes": ckpt,
        "checkpoint_mode": given.mode,
        "storage": given.storage.as_dict(),
        "checkpoint_write_s": write_s,
        "checkpoint_blocking_s": block_s,
        "restart_s": restart_s,
        "interval_s": interval_s,
        "interval_steps": steps,
        "interval_source": source,
        "young_interval_s": young_interval_s(block_s, mtbf_s),
        "daly_interval_s": daly_interval_s(block_s, mtbf_s),
        "goodput": 1.0 / factor if math.isfinite(factor) else 0.0,
    }
    if given.tokens is not None:
        if not tokens_per_s:
            raise EchosimError("--tokens: this model reads no token ids; time to train needs tokens per second")
        ideal = given.tokens / tokens_per_s
        out.update(time_to_train(ideal, interval_s, block_s, lag_s, restart_s, mtbf_s))
        out["tokens"] = given.tokens
    return out


def time_to_train(
    ideal_s: float, interval_s: float, block_s: float, lag_s: float, restart_s: float, mtbf_s: float
) -> dict[str, Any]:
    """Wall time for ``ideal_s`` of training and where it goes; the parts add up to the wall time."""
    factor = wall_factor(interval_s, block_s, lag_s, restart_s, mtbf_s)
    if not math.isfinite(factor):
        return {"ideal_days": ideal_s / DAY_S, "time_to_train_days": None, "expected_interruptions": None}
    wall = ideal_s * factor
    failures = wall / mtbf_s
    lost = (interval_s + block_s) / 2.0 + lag_s
    return {
        "ideal_days": ideal_s / DAY_S,
        "time_to_train_days": wall / DAY_S,
        "expected_interruptions": failures,
        "checkpoints": ideal_s / interval_s,
        "checkpoint_overhead_days": ideal_s / interval_s * block_s / DAY_S,
        "restart_days": failures * restart_s / DAY_S,
        "lost_work_days": failures * lost / DAY_S,
    }


def render(section: dict[str, Any]) -> list[str]:
    """Text lines of the goodput section for the terminal summary."""
    g = section
    lines = [
        f"goodput {g['goodput'] * 100:.1f}% of ideal (MTBF {g['mtbf_device_hours']:,.0f} h per device, "
        f"{g['mtbf_job_hours']:.2f} h for the job: {g['interruptions_per_day']:.1f} interruptions/day)",
        f"  checkpoint {g['checkpoint_bytes'] / 1e12:.3g} TB to {g['storage']['name']} "
        f"({g['storage']['write_GBps']:g} GB/s {g['storage']['scope'].replace('_', ' ')}): write "
        f"{g['checkpoint_write_s']:.4g} s, blocks training {g['checkpoint_blocking_s']:.4g} s ({g['checkpoint_mode']})",
        f"  interval {g['interval_s'] / 60:.4g} min = {g['interval_steps']} steps ({g['interval_source']}; Young "
        f"{g['young_interval_s'] / 60:.4g} min), restart {g['restart_s'] / 60:.4g} min",
    ]
    if g.get("time_to_train_days") is not None:
        lines.append(
            f"  time to train {g['tokens']:.4g} tokens: {g['time_to_train_days']:.2f} days (ideal "
            f"{g['ideal_days']:.2f}; checkpoints {g['checkpoint_overhead_days']:.2f}, restarts "
            f"{g['restart_days']:.2f}, lost work {g['lost_work_days']:.2f}; "
            f"{g['expected_interruptions']:.0f} interruptions expected)"
        )
    elif "time_to_train_days" in g:
        lines.append("  time to train: never (failures come faster than checkpoints can save the work)")
    return lines
