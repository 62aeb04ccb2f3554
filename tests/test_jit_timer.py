"""The compiled schedule timer (``echosim[fast]``, :mod:`echosim.timeline._jit`) equals the numpy one to the bit.

The numpy level loops are the oracle (``ECHOSIM_JIT=0``): for every built-in schedule, several shapes, one
layout and many, with and without ``keep_blocks``, every ``ends``, ``starts``, rank-end and W-run array of the
compiled path must have the same dtype, shape and bytes.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import numpy as np
import pytest

from echosim.timeline import composer
from echosim.timeline.composer import BatchTiming, compose, plan_for, schedule_plan, time_schedule
from echosim.timeline.schedule import BUILTIN_SCHEDULES, Schedule

pytest.importorskip("numba")

SCHEDULES = {s.name: s for s in BUILTIN_SCHEDULES}
# (schedule, pp, micro-batches, vpp): every built-in, warm-up longer and shorter than the micro-batches
CASES = [
    ("1f1b", 1, 3, 1),
    ("1f1b", 4, 8, 1),
    ("1f1b", 8, 5, 1),
    ("1f1b", 4, 8, 2),
    ("gpipe", 4, 6, 1),
    ("gpipe", 3, 1, 1),
    ("interleaved", 4, 8, 2),
    ("interleaved", 2, 6, 3),
    ("zb-h1", 1, 4, 1),
    ("zb-h1", 2, 2, 1),
    ("zb-h1", 4, 8, 1),
    ("zb-h1", 8, 12, 1),
    ("zb-h1", 6, 3, 1),
    ("dualpipe", 4, 8, 1),
    ("dualpipe", 6, 14, 1),
]


def _plan(name: str, pp: int, m: int, vpp: int) -> composer.SchedulePlan:
    s: Schedule = SCHEDULES[name]
    return schedule_plan(s.orders, pp, m, vpp, s.split_backward, s.fused_pairs, s.columns)


def _inputs(plan: composer.SchedulePlan, layouts: int, seed: int) -> list[np.ndarray]:
    """fwd, bwd, p2p out (both ways) and W: seconds of a few magnitudes, some exactly equal and some zero, so the
    maxima meet ties and both orders of their operands."""
    rng = np.random.default_rng(seed)
    shape = (plan.vstages, layouts) if layouts > 1 else (plan.vstages,)
    out = []
    for scale in (1.0, 2.0, 1e-3, 1e-3, 0.7):
        x = rng.choice([0.0, 0.1, 0.3, 1 / 3], size=shape) if seed % 2 else rng.uniform(0, scale, shape)
        out.append(x)
    return out


def _same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _assert_identical(got: BatchTiming, want: BatchTiming) -> None:
    assert _same(got.ends, want.ends)
    assert _same(got.starts, want.starts)
    assert _same(got.rank_ends, want.rank_ends)
    assert len(got.weights) == len(want.weights)
    for run, ref in zip(got.weights, want.weights, strict=True):
        assert all(_same(x, y) for x, y in zip(run, ref, strict=True))


def _both(monkeypatch: pytest.MonkeyPatch, plan: composer.SchedulePlan, args: list[np.ndarray], keep: bool):
    wgrad = args[4] if plan.split_backward else None
    monkeypatch.setenv("ECHOSIM_JIT", "0")
    want = time_schedule(plan, *args[:4], wgrad, keep_blocks=keep)
    monkeypatch.delenv("ECHOSIM_JIT")
    assert composer._compiled() is not None
    got = time_schedule(plan, *args[:4], wgrad, keep_blocks=keep)
    return got, want


@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("layouts", [1, 9])
@pytest.mark.parametrize(("name", "pp", "m", "vpp"), CASES)
def test_compiled_timer_is_byte_identical_to_numpy(
    monkeypatch: pytest.MonkeyPatch, name: str, pp: int, m: int, vpp: int, layouts: int, keep: bool
) -> None:
    plan = _plan(name, pp, m, vpp)
    for seed in range(3):
        got, want = _both(monkeypatch, plan, _inputs(plan, layouts, seed), keep)
        _assert_identical(got, want)
        if keep and plan.split_backward:  # the W runs are there, and the listed blocks agree
            assert got.weights
            for col in range(layouts):
                assert got.layout(col).blocks == want.layout(col).blocks


def test_compiled_timer_propagates_nan_as_numpy_maximum(monkeypatch: pytest.MonkeyPatch) -> None:
    """numpy's maximum keeps a NaN of either operand: a NaN duration poisons what follows the same way."""
    for name in ("1f1b", "zb-h1", "dualpipe"):
        plan = _plan(name, 4, 8, 1)
        args = _inputs(plan, 3, 0)
        args[0][1, 1] = np.nan
        args[3][2, 2] = np.nan
        got, want = _both(monkeypatch, plan, args, True)
        _assert_identical(got, want)
        assert np.isnan(got.ends).any()


def test_one_wgrad_column_serves_a_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``(vstages,)`` wgrad with a batch of layouts broadcasts, as the numpy loop's arithmetic does."""
    plan = _plan("zb-h1", 4, 8, 1)
    args = _inputs(plan, 5, 2)
    args[4] = args[4][:, 0]
    got, want = _both(monkeypatch, plan, args, True)
    _assert_identical(got, want)


def test_explicit_orders_and_compose_use_the_compiled_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """:func:`compose` (one layout, blocks listed) gives the same blocks either way; the compiled loop ran."""
    orders = SCHEDULES["zb-h1"].orders(4, 6, 1)
    f, b, pf, pb, w = ([0.5, 0.7, 0.2, 0.9], [1.0, 1.1, 0.4, 1.5], [0.01] * 4, [0.02] * 4, [0.3, 0.2, 0.6, 0.1])
    calls: list[str] = []
    jit = composer._load_compiled()
    real = jit.time_deferred

    def counted(*a: object) -> int:
        calls.append("jit")
        return real(*a)

    monkeypatch.setattr(jit, "time_deferred", counted)
    got = compose(orders, f, b, pf, pb, w)
    assert calls == ["jit"]
    monkeypatch.setenv("ECHOSIM_JIT", "0")
    assert compose(orders, f, b, pf, pb, w) == got
    assert calls == ["jit"]


def test_a_plan_shorter_than_its_inputs_takes_the_numpy_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled loops read without bounds checks, so inputs that do not match the plan are left to numpy."""
    plan = plan_for(SCHEDULES["gpipe"].orders(2, 2, 1), vstages=2)
    monkeypatch.setattr(composer, "_load_compiled", lambda: pytest.fail("compiled loop used"))
    with pytest.raises(ValueError):
        time_schedule(plan, np.ones((2, 3)), np.ones((2, 2)), np.ones((2, 3)), np.ones((2, 3)))


PLAN_FIELDS = ("rank", "kind", "vstage", "microbatch", "chain", "cross", "lag", "duration", "pair_cross", "pair_lag")


@pytest.mark.parametrize(("name", "pp", "m", "vpp"), CASES)
def test_compiled_levels_build_byte_identical_plans(
    monkeypatch: pytest.MonkeyPatch, name: str, pp: int, m: int, vpp: int
) -> None:
    """Plans from columns and from explicit orders: the compiled level sweeps give every array and tuple."""
    s = SCHEDULES[name]

    def built() -> list[composer.SchedulePlan]:
        orders = s.orders(pp, m, vpp)
        out = [plan_for(orders, s.split_backward, pp * vpp, s.fused_pairs)]
        if s.columns is not None:
            out.append(composer._from_columns(s.columns(pp, m, vpp), (), s.split_backward, pp * vpp, s.fused_pairs))
        return out

    monkeypatch.setenv("ECHOSIM_JIT", "0")
    want = built()
    monkeypatch.delenv("ECHOSIM_JIT")
    calls: list[int] = []
    jit = composer._load_compiled()
    real = jit.levels
    monkeypatch.setattr(jit, "levels", lambda *a: calls.append(1) or real(*a))
    got = built()
    assert len(calls) == len(got)
    for g, w in zip(got, want, strict=True):
        assert all(_same(getattr(g, f), getattr(w, f)) for f in PLAN_FIELDS)
        assert (g.levels, g.last, g.rank_vstage, g.in_flight) == (w.levels, w.last, w.rank_vstage, w.in_flight)


def test_compiled_levels_find_the_same_deadlock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A last stage's backward run before its own forward on its rank waits on itself: no level, either way."""
    orders = [[("F", 0, 0), ("B", 0, 0)], [("B", 1, 0), ("F", 1, 0)]]
    for jit in ("0", "1"):
        monkeypatch.setenv("ECHOSIM_JIT", jit)
        with pytest.raises(composer.ScheduleError, match="deadlocked"):
            plan_for(orders, vstages=2)


@pytest.mark.parametrize("error", [ImportError, RuntimeError])
def test_numba_that_cannot_load_leaves_the_numpy_loops(monkeypatch: pytest.MonkeyPatch, error: type) -> None:
    """No numba (ImportError), or numba with no writable cache directory (RuntimeError at decoration)."""

    def fail(name: str) -> None:
        raise error(name)

    monkeypatch.setattr(importlib, "import_module", fail)
    assert composer._load_compiled.__wrapped__() is None


def test_import_echosim_does_not_import_numba() -> None:
    code = "import sys, echosim, echosim.timeline.composer; assert 'numba' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
