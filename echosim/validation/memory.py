"""Predicted peak memory per device against published *measured* peaks (``echosim validate --memory``).

The file has the columns of ``cases.csv`` (model, device, layout, framework; read by the same
code, so blank cells take the same framework defaults) plus ``measured_gib``, the published
per-device peak in GiB, and ``measured_kind``: ``reserved`` (the caching allocator's peak, what
torchtitan logs) or ``allocated`` (live tensors). echosim's peak is the largest pipeline rank's
(sources report the maximum over GPUs). It includes the caching allocator's rounding of each
saved tensor (``fragmentation``), which ``torch.cuda.max_memory_allocated`` does not count: an
``allocated`` figure is compared with the peak less that rounding, a ``reserved`` one with that
times the measured ratio of reserved to allocated peaks
(:data:`echosim.passes.memory.RESERVED_OVER_ALLOCATED`), the cache the allocator keeps when it has room.
"""

from __future__ import annotations

import csv
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from echosim.errors import EchosimError
from echosim.passes.memory import RESERVED_OVER_ALLOCATED
from echosim.validation.cases import Case, known_device_names, read_cases
from echosim.validation.rows import row_model, row_plan, unsupported

#: The issue's targets: mean absolute error of the peak within 10 %, every row within 20 %.
MEMORY_MAPE = 0.10
MEMORY_ROW = 0.20
KINDS = ("reserved", "allocated")
GiB = 2**30


class MemoryCasesError(EchosimError):
    """A memory file that cannot be read as written; the message names line, case and column."""


@dataclass
class MemoryRow:
    case_id: str
    source_id: str
    measured_gib: float
    kind: str
    predicted_gib: float | None = None
    parts_gib: dict[str, float] = field(default_factory=dict)  # the peak rank's breakdown
    skipped: str = ""

    @property
    def error(self) -> float | None:
        """Signed relative error: positive when echosim predicts more memory than was measured."""
        return None if self.predicted_gib is None else self.predicted_gib / self.measured_gib - 1.0

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "case_id": self.case_id,
            "source_id": self.source_id,
            "measured_gib": self.measured_gib,
            "measured_kind": self.kind,
        }
        if self.skipped:
            d["skipped"] = self.skipped
        else:
            d.update(predicted_gib=self.predicted_gib, error=self.error, parts_gib=self.parts_gib)
        return d


def _measured(c: Case, path: str | Path) -> tuple[float, str]:
    text, kind = c["measured_gib"], c["measured_kind"] or "reserved"
    try:
        value = float(text)
    except ValueError:
        raise MemoryCasesError(f"{path}: {c.where}: column 'measured_gib' is not a number: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise MemoryCasesError(f"{path}: {c.where}: column 'measured_gib' must be positive, got {text!r}")
    if kind not in KINDS:
        raise MemoryCasesError(f"{path}: {c.where}: column 'measured_kind' is {kind!r}; known: {', '.join(KINDS)}")
    return value, kind


def validate_memory(path: str | Path, registry: Any = None) -> dict[str, Any]:
    """Compile every row of a memory file and compare its peak memory with the measured one."""
    from echosim.compiler import compile as compile_model
    from echosim.plan import PlanError

    if registry is None:
        from echosim.plugins import get_registry

        registry = get_registry()
    with open(path, newline="", encoding="utf-8") as f:
        header = next(csv.reader(f), [])
    if "measured_gib" not in header:
        raise MemoryCasesError(f"{path}: line 1 (header): missing column 'measured_gib'")
    rows: list[MemoryRow] = []
    for c in read_cases(path, known_device_names(registry)):
        measured, kind = _measured(c, path)
        r = MemoryRow(c.case_id, c["source_id"], measured, kind)
        rows.append(r)
        r.skipped = unsupported(c, registry)
        if r.skipped:
            continue
        plan, cluster = row_plan(c)
        try:
            report = compile_model(row_model(c), plan, cluster)
        except (PlanError, EchosimError) as exc:
            r.skipped = f"does not compile: {exc}"
            continue
        peak = max(report.memory, key=lambda m: m["peak"])
        allocated = float(peak["peak"] - peak["fragmentation"])
        r.predicted_gib = (allocated if kind == "allocated" else allocated * RESERVED_OVER_ALLOCATED) / GiB
        r.parts_gib = {k: float(v) / GiB for k, v in peak.items() if k not in ("stage", "layers", "fits", "capacity")}
    errors = [abs(r.error) for r in rows if r.error is not None]
    return {
        "rows": [r.as_dict() for r in rows],
        "compared": len(errors),
        "skipped": len(rows) - len(errors),
        "mape": statistics.mean(errors) if errors else None,
        "max": max(errors) if errors else None,
        "within_row_target": sum(1 for e in errors if e <= MEMORY_ROW),
        "targets": {"mape": MEMORY_MAPE, "row": MEMORY_ROW},
    }


def print_memory(result: dict[str, Any]) -> None:
    """The rows and the summary of ``validate --memory``."""
    import click
    from rich.console import Console
    from rich.table import Table

    table = Table("case", "kind", "measured GiB", "predicted GiB", "error", "skipped", title="peak memory per device")
    for r in result["rows"]:
        err = r.get("error")
        table.add_row(
            r["case_id"],
            r["measured_kind"],
            f"{r['measured_gib']:.1f}",
            "" if r.get("predicted_gib") is None else f"{r['predicted_gib']:.1f}",
            "" if err is None else f"{err:+.1%}",
            r.get("skipped", ""),
        )
    Console().print(table)
    if result["mape"] is None:
        click.echo("no row compared")
        return
    met = result["mape"] <= MEMORY_MAPE and result["within_row_target"] == result["compared"]
    click.echo(
        f"memory: {result['compared']} rows compared, {result['skipped']} skipped; MAPE {result['mape']:.1%} "
        f"(target {MEMORY_MAPE:.0%}), max {result['max']:.1%}, {result['within_row_target']}/{result['compared']} "
        f"within {MEMORY_ROW:.0%}: {'met' if met else 'NOT met'}"
    )
