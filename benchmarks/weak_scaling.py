"""Weak scaling: does echosim's step grow with the data-parallel degree as the published steps do? An analysis.

Issue 16. Many sources publish one layout at several data-parallel degrees with the same work per replica (the
global batch grows with ``dp``): NeMo / DGX Cloud Benchmarking from 128 to 2,048 GPUs, llm-foundry from 128 to 512,
MaxText from 2 to 32 TPU slices. Such a series isolates what scale alone adds to a step. This script groups the rows
of ``cases.csv`` into those series, and for each prints the published step's growth from the smallest to the largest
``dp`` beside echosim's, and the same per doubling of the device count.

One candidate cause is tested against each series: stragglers. A synchronous step ends when its slowest device does,
so if each device's step time varies independently with coefficient of variation ``cv``, a step on N devices lasts
``E[max of N]`` (``echosim.dynamics.stragglers.expected_max_factor``) times the mean. The ``cv`` that makes that
factor grow as the series grows is solved for, and with it the factor already present at the series' smallest device
count. echosim prices the mean device (its rates come from single-GPU microbenchmarks), so that factor would show in
the smallest row's error: a ``cv`` that explains the growth but implies a slowdown the smallest row does not show is
not the cause.

Nothing here changes a prediction.

    PYTHONPATH=. python benchmarks/weak_scaling.py [--cases ../shared/validation/cases.csv]
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from echosim.dynamics.stragglers import expected_max_factor
from echosim.validation.cases import Case, read_cases
from echosim.validation.run import validate_cases

DEFAULT_CASES = Path(__file__).resolve().parents[2] / "shared" / "validation" / "cases.csv"

#: Columns a series holds fixed: the source, the model, the part, the precision and the layout of one replica.
FIXED = (
    "source_id", "framework", "arch", "layers", "hidden", "heads", "kv_heads", "head_dim", "ffn_hidden", "vocab",
    "seq_len", "experts", "top_k", "moe_ffn_hidden", "device", "devices_per_node", "dtype", "tp", "pp", "cp", "ep",
    "vpp", "sp", "zero", "recompute", "micro_batch",
)  # fmt: skip


@dataclass(frozen=True)
class Point:
    """One row of a series: its case, device count, published and predicted step."""

    case_id: str
    devices: int
    measured_s: float
    predicted_s: float

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1.0


def series_key(c: Case) -> tuple[str, ...] | None:
    """The fixed columns and the batch per replica; None where ``dp`` or the global batch is not given."""
    dp, batch = c.int("dp"), c.int("global_batch")
    if not dp or not batch or batch % dp:
        return None
    return (*(str(c[col] or "") for col in FIXED), str(batch // dp))


def group_series(rows: Iterable[tuple[Case, Point]]) -> dict[tuple[str, ...], list[Point]]:
    """Series of at least two distinct device counts, each sorted by device count (one row per count: the first)."""
    by_key: dict[tuple[str, ...], dict[int, Point]] = defaultdict(dict)
    for c, p in rows:
        key = series_key(c)
        if key is not None:
            by_key[key].setdefault(p.devices, p)
    return {k: [v[n] for n in sorted(v)] for k, v in by_key.items() if len(v) >= 2}


def growth(points: list[Point]) -> tuple[float, float]:
    """(published, predicted) step growth from the smallest to the largest device count."""
    a, b = points[0], points[-1]
    return b.measured_s / a.measured_s - 1.0, b.predicted_s / a.predicted_s - 1.0


def per_doubling(total: float, n1: int, n2: int) -> float:
    """The growth per doubling of the device count that compounds to ``total`` from ``n1`` to ``n2``."""
    return (1.0 + total) ** (1.0 / math.log2(n2 / n1)) - 1.0


def gap_per_doubling(points: list[Point]) -> tuple[float, float]:
    """(published, predicted) growth per doubling of the device count over a series."""
    n1, n2 = points[0].devices, points[-1].devices
    meas, pred = growth(points)
    return per_doubling(meas, n1, n2), per_doubling(pred, n1, n2)


def straggler_cv(n1: int, n2: int, target: float, hi: float = 2.0) -> float | None:
    """The ``cv`` at which ``E[max of n2] / E[max of n1]`` grows by ``target`` (None: no growth to explain; inf: no
    ``cv`` up to ``hi`` does). For a normal step time ``E[max of n] = 1 + cv z_n``, so the ratio
    ``(1 + cv z2) / (1 + cv z1) = 1 + target`` solves to ``cv = target / (z2 - (1 + target) z1)``."""
    if target <= 0 or n2 <= n1:
        return None
    z1, z2 = expected_max_factor(n1, 1.0) - 1.0, expected_max_factor(n2, 1.0) - 1.0
    denominator = z2 - (1.0 + target) * z1
    cv = target / denominator if denominator > 0 else math.inf
    return cv if cv <= hi else math.inf


def label(first: str) -> str:
    """A short name: the first case id without its device count."""
    parts = first.split("-")
    while parts and (parts[-1].isdigit() or (parts[-1].startswith("x") and parts[-1][1:].isdigit())):
        parts.pop()
    return "-".join(parts)


def paired(rows: Iterable[Any], path: Path) -> list[tuple[Case, Point]]:
    """The predicted rows of a ``validate --cases`` run over ``path``, each with its case and its published and
    predicted step."""
    known = {c.case_id: c for c in read_cases(path)}
    out = []
    for r in rows:
        c = known.get(r.case_id)
        if c is None or r.error is None or not r.measured_step_time_s or not r.predicted_step_time_s:
            continue
        out.append((c, Point(c.case_id, c.int("devices") or 0, r.measured_step_time_s, r.predicted_step_time_s)))
    return out


def measure(path: Path) -> list[tuple[Case, Point]]:
    """Every row of ``path`` that echosim predicts (one ``validate --cases`` run, as the accuracy page makes it)."""
    return paired(validate_cases(path).rows, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=Path, default=DEFAULT_CASES)
    args = ap.parse_args(argv)
    found = group_series(measure(args.cases))
    print(
        "| series | source | devices | published growth | echosim growth | per doubling: published / echosim "
        "| error at the smallest | straggler cv for the growth | its slowdown at the smallest |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    gaps, under = [], 0
    for key, pts in sorted(found.items(), key=lambda kv: (kv[0][0], kv[1][0].case_id)):
        n1, n2 = pts[0].devices, pts[-1].devices
        meas, pred = growth(pts)
        pm, pp = gap_per_doubling(pts)
        gaps.append(pm - pp)
        under += meas > pred
        cv = straggler_cv(n1, n2, meas)
        if cv is None:
            cv_text, slow_text = "(none)", ""
        elif math.isinf(cv):
            cv_text, slow_text = "> 2", ""
        else:
            cv_text, slow_text = f"{cv:.3f}", f"+{100 * (expected_max_factor(n1, cv) - 1):.1f} %"
        print(
            f"| {label(pts[0].case_id)} | {key[0]} | {n1:,} -> {n2:,} ({len(pts)} rows) | {100 * meas:+.1f} % "
            f"| {100 * pred:+.1f} % | {100 * pm:+.2f} / {100 * pp:+.2f} % | {100 * pts[0].error:+.1f} % "
            f"| {cv_text} | {slow_text} |"
        )
    print("\nGrowth at every device count (published / echosim, over the smallest), series of four rows or more:\n")
    for _key, pts in sorted(found.items(), key=lambda kv: (kv[0][0], kv[1][0].case_id)):
        if len(pts) >= 4:
            steps = ", ".join(
                f"{p.devices:,}: {100 * (p.measured_s / pts[0].measured_s - 1):+.1f} / "
                f"{100 * (p.predicted_s / pts[0].predicted_s - 1):+.1f}"
                for p in pts[1:]
            )
            print(f"- {label(pts[0].case_id)}: {steps}")
    if gaps:
        print(
            f"\n{len(found)} series; the published step grows faster than echosim's in {under}; per doubling of "
            f"the device count the published growth exceeds echosim's by {100 * statistics.median(gaps):+.2f} "
            f"points (median; range {100 * min(gaps):+.2f} to {100 * max(gaps):+.2f})."
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
