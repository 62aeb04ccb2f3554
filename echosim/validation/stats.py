"""Predicted vs published, row by row and per group.

Errors are grouped by device, architecture, source and feature (the row's layout such as
``tp+pp+dp`` and each of its parallelism/precision features: ``sp``, ``cp``, ``ep``,
``vpp``, ``zero1``-``zero3``, ``fp8``, ...), plus the target group of the issue: dense
A100/H100 rows of confidence A. Only numbers live here, so that the summary a table
prints and the one a JSON report holds are the same.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

#: Grouping keys, in the order they are printed.
GROUP_KEYS = ("device", "arch", "source_id", "feature", "confidence")


@dataclass
class RowResult:
    case_id: str
    group: dict[str, str]
    features: list[str]
    measured_step_time_s: float | None
    basis: str = ""
    predicted_step_time_s: float | None = None
    skipped: str = ""
    warnings: list[str] = field(default_factory=list)
    fits: bool | None = None  # every pipeline stage fits the device (None: not compiled)
    peak_gib: float | None = None  # the largest stage's peak memory
    capacity_gib: float | None = None

    @property
    def error(self) -> float | None:
        """Signed relative error: positive when echosim is slower than the published run."""
        if self.predicted_step_time_s is None or not self.measured_step_time_s:
            return None
        return self.predicted_step_time_s / self.measured_step_time_s - 1.0

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "case_id": self.case_id,
            **self.group,
            "feature": self.features,
            "measured_step_time_s": self.measured_step_time_s,
        }
        if self.basis:
            d["measured_basis"] = self.basis
        if self.skipped:
            d["skipped"] = self.skipped
        else:
            d["predicted_step_time_s"] = self.predicted_step_time_s
            d["error"] = self.error
            d["fits"] = self.fits
            d["peak_gib"] = self.peak_gib
            d["capacity_gib"] = self.capacity_gib
            if self.warnings:
                d["warnings"] = self.warnings
        return d


def _summary(errors: list[float]) -> dict[str, Any]:
    absolute = [abs(e) for e in errors]
    return {
        "rows": len(errors),
        "mape": statistics.mean(absolute),
        "mean_error": statistics.mean(errors),
        "max": max(absolute),
        "within_15pct": sum(1 for e in absolute if e <= 0.15),
    }


#: The fidelity targets (issue 16): dense (not MoE) A100/H100 rows of confidence A within 6 % on average,
#: every row within 15 %.
TARGET_GROUP = "target: dense a100/h100, confidence A"
TARGET_MAPE = 0.06
TARGET_ROW = 0.15


def in_target_group(r: RowResult) -> bool:
    """Dense means no routed experts: MoE rows on the same parts have their own target."""
    return (
        r.group["device"] in ("a100-40gb", "a100-80gb", "h100-sxm")
        and r.group["confidence"] == "A"
        and r.group["arch"] != "moe"
    )


@dataclass
class Validation:
    rows: list[RowResult] = field(default_factory=list)
    selected_of: int = 0  # rows in the file before --filter

    def groups(self, keys: Iterable[str] = GROUP_KEYS) -> dict[str, dict[str, Any]]:
        """Error summary per ``key=value`` group, the target group and ``overall``."""
        errs: dict[str, list[float]] = {}
        for r in self.rows:
            if r.error is None:
                continue
            for key in keys:
                values = r.features if key == "feature" else [r.group[key]]
                for value in values:
                    errs.setdefault(f"{key}={value}", []).append(r.error)
            if in_target_group(r):
                errs.setdefault(TARGET_GROUP, []).append(r.error)
            errs.setdefault("overall", []).append(r.error)
        return {k: _summary(v) for k, v in sorted(errs.items())}

    def skip_reasons(self) -> dict[str, int]:
        reasons: dict[str, int] = {}
        for r in self.rows:
            if r.skipped:
                reasons[r.skipped] = reasons.get(r.skipped, 0) + 1
        return dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))

    def not_fitting(self) -> dict[str, int]:
        """Rows that compiled (every one of them really ran) but are predicted not to fit, per source."""
        out: dict[str, int] = {}
        for r in self.rows:
            if not r.skipped and r.fits is False:
                out[r.group["source_id"]] = out.get(r.group["source_id"], 0) + 1
        return dict(sorted(out.items()))

    def as_dict(self) -> dict[str, Any]:
        compiled = sum(1 for r in self.rows if not r.skipped)
        not_fitting = self.not_fitting()
        groups = self.groups()
        target = groups.get(TARGET_GROUP)
        return {
            "rows": [r.as_dict() for r in self.rows],
            "groups": groups,
            "compiled": compiled,
            "skipped": len(self.rows) - compiled,
            "skip_reasons": self.skip_reasons(),
            "not_fitting": sum(not_fitting.values()),
            "not_fitting_by_source": not_fitting,
            "selected": len(self.rows),
            "in_file": self.selected_of,
            "targets": {
                "group": TARGET_GROUP,
                "mape_target": TARGET_MAPE,
                "row_target": TARGET_ROW,
                "target_group_mape": target["mape"] if target else None,
                "rows_over_row_target": [r.case_id for r in self.rows if r.error is not None and abs(r.error) > 0.15],
            },
        }
