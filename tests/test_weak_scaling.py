"""benchmarks/weak_scaling.py: series group the rows that differ only in dp; growth, doublings and the straggler cv."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from script_loader import load_script

from echosim.dynamics.stragglers import expected_max_factor
from echosim.validation.cases import read_cases

CASES = Path(__file__).resolve().parents[2] / "shared" / "validation" / "cases.csv"


def _module():
    return load_script("benchmarks/weak_scaling.py")


def test_growth_and_its_rate_per_doubling() -> None:
    m = _module()
    pts = [m.Point("a-128", 128, 10.0, 9.0), m.Point("a-256", 256, 10.5, 9.0), m.Point("a-512", 512, 11.025, 9.09)]
    meas, pred = m.growth(pts)
    assert math.isclose(meas, 0.1025) and math.isclose(pred, 0.01)
    assert math.isclose(m.per_doubling(meas, 128, 512), 0.05)  # 5 % twice
    assert math.isclose(pts[0].error, -0.1)


def test_straggler_cv_reproduces_the_growth_it_was_solved_for() -> None:
    m = _module()
    cv = m.straggler_cv(128, 512, 0.03)
    assert cv is not None and 0 < cv < 2
    grown = expected_max_factor(512, cv) / expected_max_factor(128, cv) - 1
    assert math.isclose(grown, 0.03, rel_tol=1e-6)
    assert m.straggler_cv(128, 512, -0.01) is None and m.straggler_cv(128, 512, 0.0) is None
    assert math.isinf(m.straggler_cv(128, 256, 0.5))  # no cv up to 2 grows a step by half from 128 to 256


def test_label_drops_the_device_count_and_slices() -> None:
    m = _module()
    assert m.label("maxtext-v5e-16b-bf16-4096-x16") == "maxtext-v5e-16b-bf16"
    assert m.label("dgxc2504-gpt-3-175b-fp8-h100-sxm-128") == "dgxc2504-gpt-3-175b-fp8-h100-sxm"


@pytest.mark.skipif(not CASES.exists(), reason="needs ../shared/validation/cases.csv")
def test_series_hold_the_layout_and_the_batch_per_replica() -> None:
    m = _module()
    cases = read_cases(CASES)
    rows = [(c, m.Point(c.case_id, c.int("devices") or 0, 1.0, 1.0)) for c in cases]
    found = m.group_series(rows)
    by_id = {c.case_id: c for c in cases}
    gpt3 = next(pts for pts in found.values() if pts[0].case_id == "dgxc2504-gpt-3-175b-fp8-h100-sxm-128")
    assert [p.devices for p in gpt3] == [128, 256, 512, 1024, 2048]
    for pts in found.values():
        assert len({p.devices for p in pts}) == len(pts) >= 2
        keys = {m.series_key(by_id[p.case_id]) for p in pts}
        assert len(keys) == 1  # one layout, one batch per replica
        dp = [by_id[p.case_id].int("dp") for p in pts]
        assert dp == sorted(dp) and len(set(dp)) == len(dp)
