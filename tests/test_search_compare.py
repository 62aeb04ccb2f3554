"""benchmarks/search_compare.py: two search outputs give the same results (order, fit flags, counts) to a tolerance."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from script_loader import load_script

ROOT = Path(__file__).resolve().parents[1]


def _module() -> Any:
    return load_script("benchmarks/search_compare.py")


def _row(tp: int, step: float, fits: bool = True) -> dict[str, Any]:
    return {"tp": tp, "pp": 2, "zero": 1, "fits": fits, "reason": "", "simulated": True, "step_time_s": step,
            "mfu": 0.5, "peak_bytes": 10**9}  # fmt: skip


def _output() -> dict[str, Any]:
    rows = [_row(8, 1.0), _row(4, 2.0), _row(2, 3.0, fits=False)]
    return {"model": "m", "backend": "b", "devices": 8, "objective": "step-time", "interrupted": False,
            "count": 3, "candidates": 3, "counts": {"simulated": 3, "fit": 2}, "space": {"tp": [2, 4, 8]},
            "layouts": rows, "best": rows[:2]}  # fmt: skip


def test_identical_outputs_are_the_same() -> None:
    assert _module().compare(_output(), _output(), 0.0) == []


def test_a_figure_within_the_tolerance_passes_and_beyond_it_fails() -> None:
    compare = _module().compare
    after = _output()
    after["layouts"][1]["step_time_s"] = 2.0 * (1 + 5e-10)
    assert compare(_output(), after, 1e-9) == []
    assert compare(_output(), after, 1e-10)  # 5e-10 relative is over 1e-10
    after["layouts"][1]["step_time_s"] = 2.0 * (1 + 2e-9)
    assert compare(_output(), after, 1e-9)


def test_another_order_fit_flag_count_or_integer_figure_fails_whatever_the_tolerance() -> None:
    compare = _module().compare
    swapped = _output()
    swapped["layouts"][0], swapped["layouts"][1] = swapped["layouts"][1], swapped["layouts"][0]
    assert compare(_output(), swapped, 1.0)
    unfit = _output()
    unfit["layouts"][0]["fits"] = False
    assert compare(_output(), unfit, 1.0)
    counted = copy.deepcopy(_output())
    counted["counts"]["fit"] = 1
    assert compare(_output(), counted, 1.0)
    peak = _output()
    peak["layouts"][2]["peak_bytes"] += 1  # bytes are integers: compared exactly
    assert compare(_output(), peak, 1.0)
