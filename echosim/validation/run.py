"""Compile the selected rows of a cases file and compare each with its published step time.

Each row's model is rebuilt from its architecture fields and compiled with the row's
device, layout, batch and precision. Rows that need something echosim does not model yet
are skipped with the reason and counted, never silently dropped. A calibration is applied
only to the rows on the backends it was made for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from echosim.errors import EchosimError
from echosim.validation.cases import REQUIRED, Case, backend_for, known_device_names, read_cases
from echosim.validation.filters import matches, parse_filters
from echosim.validation.published import published_step_time
from echosim.validation.rows import row_model, row_plan, unsupported
from echosim.validation.stats import RowResult, Validation


def validate_cases(
    path: str | Path,
    filters: dict[str, str] | Iterable[str] | None = None,
    progress: Callable[[], None] | None = None,
    calibration: str = "",
    registry: Any = None,
) -> Validation:
    """Compile every selected row and compare; ``filters`` as ``{column: value}`` or ``["col=value", ...]``."""
    if registry is None:
        from echosim.plugins import get_registry

        registry = get_registry()
    cases = read_cases(path, known_device_names(registry))
    specs = [f"{k}={v}" for k, v in filters.items()] if isinstance(filters, dict) else list(filters or [])
    columns = cases[0].cells.keys() if cases else REQUIRED
    chosen = parse_filters(specs, columns)
    result = Validation(selected_of=len(cases))
    covered: set[str] = set()
    if calibration:  # applied to the rows on the backends it was made for; the others run uncalibrated
        from echosim.calibrate import covered_backends

        covered = covered_backends(calibration)
    for c in cases:
        if not matches(c, chosen):
            continue
        backend = backend_for(c["device"])
        result.rows.append(validate_row(c, calibration if backend in covered else "", registry))
        if progress is not None:
            progress()
    return result


def selected_count(path: str | Path, filters: Iterable[str] = ()) -> int:
    """How many rows a filter selects (for a progress bar's total)."""
    cases = read_cases(path)
    chosen = parse_filters(filters, cases[0].cells.keys() if cases else REQUIRED)
    return sum(1 for c in cases if matches(c, chosen))


def validate_row(c: Case, calibration: str = "", registry: Any = None) -> RowResult:
    from echosim.compiler import compile as compile_model
    from echosim.plan import PlanError

    measured, basis = published_step_time(c)
    r = RowResult(c.case_id, c.group(), c.features(), measured, basis if measured is not None else "")
    r.skipped = unsupported(c, registry) or ("" if measured is not None else basis)
    if r.skipped:
        return r
    plan, cluster = row_plan(c, calibration)
    try:
        report = compile_model(row_model(c), plan, cluster)
    except PlanError as exc:
        text = str(exc)
        r.skipped = f"needs {text.removesuffix(' is not modelled yet')}" if "not modelled" in text else text
        return r
    except EchosimError as exc:
        r.skipped = f"does not compile: {exc}"
        return r
    r.predicted_step_time_s = float(report.step_time_s)
    r.warnings = [w for w in report.warnings if "does not fit" in w]
    r.fits = report.fits
    r.peak_gib = max(float(m["peak"]) for m in report.memory) / 2**30
    r.capacity_gib = float(report.memory[0]["capacity"]) / 2**30
    return r
