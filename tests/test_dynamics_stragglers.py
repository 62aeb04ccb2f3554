"""Stragglers: the expected slowest of N per-device step times against Monte-Carlo and exact cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echosim.dynamics.stragglers import (
    GROWTH_DEVICES,
    StragglerInput,
    expected_max_empirical,
    expected_max_factor,
    read_samples,
    stragglers,
)
from echosim.errors import EchosimError


def _monte_carlo(n: int, cv: float, distribution: str, seed: int) -> tuple[float, float]:
    """Mean of the max of n draws of X (mean 1, this cv) and its standard error."""
    rng = np.random.default_rng(seed)
    reps = max(400, 400_000 // n)
    if distribution == "normal":
        x = 1.0 + cv * rng.standard_normal((reps, n))
    else:
        sigma = math.sqrt(math.log1p(cv * cv))
        x = np.exp(sigma * rng.standard_normal((reps, n)) - sigma * sigma / 2)
    top = x.max(axis=1)
    return float(top.mean()), float(top.std(ddof=1) / math.sqrt(reps))


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(2, 4096),
    cv=st.floats(0.005, 0.3),
    distribution=st.sampled_from(["normal", "lognormal"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_expected_max_matches_monte_carlo(n: int, cv: float, distribution: str, seed: int) -> None:
    mean, se = _monte_carlo(n, cv, distribution, seed)
    assert expected_max_factor(n, cv, distribution) == pytest.approx(mean, abs=5 * se + 1e-9)


def test_exact_small_cases() -> None:
    # E[max of two standard normals] = 1 / sqrt(pi)
    assert expected_max_factor(2, 0.1) == pytest.approx(1 + 0.1 / math.sqrt(math.pi), rel=1e-9)
    # three: 3 / (2 sqrt(pi))
    assert expected_max_factor(3, 0.1) == pytest.approx(1 + 0.1 * 1.5 / math.sqrt(math.pi), rel=1e-9)
    assert expected_max_factor(1, 0.3) == 1.0 and expected_max_factor(16384, 0.0) == 1.0


def test_growth_from_8_to_16k_devices() -> None:
    growth = [expected_max_factor(n, 0.05) for n in GROWTH_DEVICES]
    assert growth == sorted(growth)  # the slowest of more devices is slower
    assert growth[0] == pytest.approx(1 + 0.05 * 1.4236, rel=1e-4)  # E[max of 8 N(0,1)] = 1.4236
    # the order statistic grows like sqrt(2 ln N): 16,384 devices wait ~20% longer at cv 5%
    assert 1.19 < growth[-1] < 1.21
    assert expected_max_factor(16384, 0.05, "lognormal") > growth[-1]  # a heavier right tail


@settings(max_examples=20, deadline=None)
@given(
    samples=st.lists(st.floats(0.5, 2.0), min_size=2, max_size=40),
    n=st.integers(1, 256),
    seed=st.integers(0, 2**32 - 1),
)
def test_empirical_distribution_matches_monte_carlo(samples: list[float], n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    arr = np.array(samples)
    reps = 4000
    top = rng.choice(arr, size=(reps, n), replace=True).max(axis=1) / arr.mean()
    # a sample whose max is always the same has no spread: allow one draw's worth of the range
    se = max(top.std(ddof=1), (arr.max() - arr.min()) / arr.mean()) / math.sqrt(reps)
    assert expected_max_empirical(samples, n) == pytest.approx(top.mean(), abs=5 * se + 1e-9)


def test_empirical_exact() -> None:
    # two equally likely times 1 and 2, slowest of two: 1/4 * 1 + 3/4 * 2 = 1.75, over the mean 1.5
    assert expected_max_empirical([1.0, 2.0], 2) == pytest.approx(1.75 / 1.5)


def test_section_and_file(tmp_path) -> None:
    s = stragglers(StragglerInput(cv=0.05), 1024, 2.0)
    assert s["expected_step_s"] == pytest.approx(2.0 * expected_max_factor(1024, 0.05))
    assert s["ideal_step_s"] == 2.0 and set(s["growth"]) == {str(n) for n in GROWTH_DEVICES}
    f = tmp_path / "times.txt"
    f.write_text("# measured\n1.0\n1.1\n\n0.9  # a fast one\n")
    assert read_samples(str(f)) == [1.0, 1.1, 0.9]
    f.write_text("1.0\nfast\n")
    with pytest.raises(EchosimError, match="line 2"):
        read_samples(str(f))
    f.write_text("1.0\n")
    with pytest.raises(EchosimError, match="at least 2"):
        read_samples(str(f))


def test_negative_cv_is_refused() -> None:
    with pytest.raises(EchosimError, match="--straggler-cv must be 0 or more"):
        expected_max_factor(8, -0.1)
