"""benchmarks/cpu_ddp_lockstep.py: a DDP row's lockstep factor from its one-process twin's measured steps."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
from script_loader import load_script

ROOT = Path(__file__).resolve().parents[1]


def _script() -> ModuleType:
    return load_script("benchmarks/cpu_ddp_lockstep.py")


def _row(model: str, layout: str, predicted: float, measured: float, steps: list[float] | None = None) -> dict:
    return {"model": model, "layout": layout, "predicted_step_s": predicted, "measured_step_s": measured,
            "error": predicted / measured - 1, "steps_s": steps}  # fmt: skip


def test_two_ranks_wait_for_the_slower_of_two_draws_of_the_twins_steps() -> None:
    # steps 0.9 and 1.1 (mean 1.0): the larger of two draws is 1.1 unless both are 0.9 (1 in 4): E = 1.05
    run = {"rows": [_row("m", "1 process", 1.0, 1.0, [0.9, 1.1]), _row("m", "DDP x2 (gloo)", 1.0, 1.1)]}
    (r,) = _script().lockstep_rows(run)
    assert r["factor"] == pytest.approx(1.05)
    assert r["error"] == pytest.approx(1.0 / 1.1 - 1)
    assert r["with_lockstep"] == pytest.approx(1.05 / 1.1 - 1)


def test_rows_without_a_measured_twin_or_error_are_left_out() -> None:
    run = {"rows": [_row("m", "DDP x2 (gloo)", 1.0, 1.1), _row("n", "1 process", 1.0, 1.0, None)]}
    assert _script().lockstep_rows(run) == []


def test_the_stored_runs_move_toward_their_measurements() -> None:
    module = _script()
    for name in module.RUNS:
        rows = module.lockstep_rows(json.loads((module.DATA / name).read_text()))
        assert rows and all(r["factor"] >= 1.0 for r in rows)
        assert all(r["with_lockstep"] >= r["error"] for r in rows)
