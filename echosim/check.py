"""Pre-commit budgets: fail when a model's simulated step time or memory exceeds a budget.

Budgets live in ``pyproject.toml``::

    [tool.echosim]
    backend = "h100-sxm"

    [[tool.echosim.check]]
    model = "llama3-8b"              # or any model spec echosim compiles
    devices = 8
    tp = 2
    global_batch = 64
    max_step_time_s = 6.0
    max_memory_gib = 70
    min_mfu = 0.35

Every field but the budgets is a ``compile`` option. ``echosim check`` exits non-zero and
names each budget a model breaks.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from echosim.errors import EchosimError
from echosim.plan import Cluster, Plan, plan_with_defaults

BUDGETS = ("max_step_time_s", "max_memory_gib", "min_mfu")


@dataclass(frozen=True)
class Outcome:
    model: str
    step_time_s: float
    memory_gib: float
    mfu: float
    failures: tuple[str, ...]


def load_config(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise EchosimError(f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise EchosimError(f"{path}: not valid TOML: {exc}") from None
    tool = data.get("tool", {})
    section = tool.get("echosim", {}) if isinstance(tool, dict) else {}
    if not isinstance(section, dict):
        raise EchosimError(f"{path}: [tool.echosim] must be a table, got {type(section).__name__}")
    checks = section.get("check", [])
    if not isinstance(checks, list) or not all(isinstance(c, dict) for c in checks):
        raise EchosimError(f"{path}: 'check' must be an array of tables ([[tool.echosim.check]])")
    if not checks:
        raise EchosimError(f"{path}: no [[tool.echosim.check]] entries")
    defaults = {k: v for k, v in section.items() if k != "check"}
    return defaults, checks


def run_check(entry: dict[str, Any], defaults: dict[str, Any], index: int) -> Outcome:
    from echosim.compiler import compile as compile_model

    merged = {**defaults, **entry}
    model = merged.pop("model", None)
    if model is not None and not isinstance(model, str):
        raise EchosimError(f"check #{index + 1}: 'model' must be a string, got {type(model).__name__}")
    if not model:
        raise EchosimError(f"check #{index + 1}: 'model' is required")
    budgets = {k: merged.pop(k) for k in BUDGETS if k in merged}
    plan_keys = {f.name for f in fields(Plan)}
    cluster_keys = {"backend", "devices", "devices_per_node"}
    unknown = sorted(set(merged) - plan_keys - cluster_keys)
    if unknown:
        raise EchosimError(f"check #{index + 1} ({model}): unknown key(s) {', '.join(unknown)}")
    for key, value in [*merged.items(), *budgets.items()]:
        _check_type(key, value, f"check #{index + 1} ({model})")
    plan = plan_with_defaults(Plan(), {k: v for k, v in merged.items() if k in plan_keys})
    cluster = Cluster(**{k: v for k, v in merged.items() if k in cluster_keys})
    if "devices" not in merged:
        cluster = Cluster(cluster.backend, plan.tp * plan.pp * plan.dp * plan.cp, cluster.devices_per_node)
    report = compile_model(model, plan, cluster)
    memory = max(int(m["peak"]) for m in report.memory) / 2**30
    failures = []
    if "max_step_time_s" in budgets and report.step_time_s > budgets["max_step_time_s"]:
        failures.append(f"step time {report.step_time_s:.3f} s > {budgets['max_step_time_s']} s")
    if "max_memory_gib" in budgets and memory > budgets["max_memory_gib"]:
        failures.append(f"memory {memory:.1f} GiB > {budgets['max_memory_gib']} GiB")
    if "min_mfu" in budgets and report.mfu < budgets["min_mfu"]:
        failures.append(f"MFU {report.mfu:.3f} < {budgets['min_mfu']}")
    if not report.fits:
        failures.append("does not fit in device memory")
    return Outcome(str(model), report.step_time_s, memory, report.mfu, tuple(failures))


def _expected_type(key: str) -> tuple[type, ...]:
    """The TOML types a key takes: a budget is a number, the rest as the :class:`Plan` or :class:`Cluster` field."""
    if key in BUDGETS:
        return (int, float)
    default = {f.name: f.default for f in (*fields(Plan), *fields(Cluster))}[key]
    if isinstance(default, bool):
        return (bool,)
    if isinstance(default, float):
        return (int, float)
    if isinstance(default, tuple):
        return (list,)
    return (type(default),)


def _check_type(key: str, value: Any, where: str) -> None:
    """A value of the wrong type is one line naming the key (``tp = "two"``), not a TypeError later."""
    expected = _expected_type(key)
    ok = isinstance(value, expected) and (bool in expected or not isinstance(value, bool))
    if ok and isinstance(value, list):
        ok = all(isinstance(v, str) for v in value)
    if ok and isinstance(value, float):
        ok = math.isfinite(value)
    if not ok:
        want = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list of names"}
        raise EchosimError(f"{where}: {key} must be {want[expected[-1]]}, got {value!r}")
