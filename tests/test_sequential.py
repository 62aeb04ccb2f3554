"""One layout timed block by block (sequential) equals the level composer (numpy) to the last bit.

A compile times its schedule with :mod:`echosim.timeline.sequential`, a layout search with
:mod:`echosim.timeline.composer`; a search's figures must be compile's. Hypothesis draws
schedules, shapes, durations and shuffled (odd or impossible) orders: every block's start and
end, every rank's end, the in-flight counts, the peak of held activations and each refusal
must be the same.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echosim.timeline.composer import ScheduleError, plan_for, schedule_plan, time_schedule
from echosim.timeline.costed import _order_arrays, _peak_held
from echosim.timeline.schedule import Block, gpipe, interleaved, one_f_one_b, zero_bubble_h1
from echosim.timeline.sequential import order_plan, plan_orders, time_orders

SCHEDULES = {"1f1b": one_f_one_b, "gpipe": gpipe, "interleaved": interleaved, "zb-h1": zero_bubble_h1}
seconds = st.floats(0.0, 10.0) | st.sampled_from([0.0, 0.1, 0.2, 0.3, 1e-9, 1e9])


def _same(orders_of, pp: int, m: int, vpp: int, split: bool, d: list[float], held: list[int]) -> None:  # type: ignore[no-untyped-def]
    v = pp * vpp
    f, b, pf, pb, w = (d[k * v : (k + 1) * v] for k in range(5))
    wgrad = w if split else None
    plan = schedule_plan(orders_of, pp, m, vpp, split)
    one = order_plan(orders_of, pp, m, vpp, split)
    batch = time_schedule(plan, f, b, pf, pb, wgrad, keep_blocks=True).layout(0)
    alone = time_orders(one, f, b, pf, pb, wgrad)
    assert alone.blocks == batch.blocks  # same blocks, same order, same floats
    assert alone.rank_ends == batch.rank_ends
    assert one.in_flight == plan.in_flight and one.rank_vstage == plan.rank_vstage
    per_microbatch = dict(enumerate(held[:v]))
    for r in range(pp):
        assert one.peak_held(r, per_microbatch) == _peak_held(_order_arrays(plan, r), per_microbatch)


@settings(max_examples=120, deadline=None)
@given(
    kind=st.sampled_from(["1f1b", "gpipe", "zb-h1"]),
    pp=st.integers(1, 8),
    m=st.integers(1, 24),
    d=st.lists(seconds, min_size=40, max_size=40),
    held=st.lists(st.integers(0, 2**40), min_size=8, max_size=8),
)
def test_fixed_and_zero_bubble_schedules_time_the_same(kind: str, pp: int, m: int, d: list[float],
                                                       held: list[int]) -> None:  # fmt: skip
    _same(SCHEDULES[kind], pp, m, 1, kind == "zb-h1", d, held)


@settings(max_examples=50, deadline=None)
@given(
    pp=st.integers(2, 6),
    vpp=st.integers(2, 4),
    groups=st.integers(1, 4),
    d=st.lists(seconds, min_size=120, max_size=120),
    held=st.lists(st.integers(0, 2**40), min_size=24, max_size=24),
)
def test_interleaved_schedules_time_the_same(pp: int, vpp: int, groups: int, d: list[float], held: list[int]) -> None:
    _same(SCHEDULES["interleaved"], pp, pp * groups, vpp, False, d, held)


def test_plans_are_kept_per_shape() -> None:
    assert order_plan(one_f_one_b, 4, 8, 1, False) is order_plan(one_f_one_b, 4, 8, 1, False)
    assert order_plan(one_f_one_b, 4, 8, 1, False).in_flight == schedule_plan(one_f_one_b, 4, 8, 1, False).in_flight


def _outcome(plan_of, orders: list[list[Block]], split: bool, d: list[float]):  # type: ignore[no-untyped-def]
    """What a composer makes of explicit orders: the refusal (type and message) or the timed blocks."""
    v = max((b[1] for seq in orders for b in seq), default=0) + 1
    v = max(v, len(orders))
    f, b, pf, pb, w = ((d * (5 * v))[k * v : (k + 1) * v] for k in range(5))
    try:
        plan = plan_of(orders, split, v)
    except ScheduleError as exc:
        return ("refused", str(exc))
    if plan_of is plan_for:
        timed = time_schedule(plan, f, b, pf, pb, w if split else None, keep_blocks=True).layout(0)
    else:
        timed = time_orders(plan, f, b, pf, pb, w if split else None)
    return (timed.blocks, timed.rank_ends, plan.in_flight, plan.rank_vstage)


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(["1f1b", "gpipe", "interleaved"]),
    pp=st.integers(1, 4),
    m=st.integers(1, 6),
    split=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    swaps=st.integers(0, 4),
    d=st.lists(st.floats(0.0, 5.0), min_size=1, max_size=16),
)
def test_odd_and_impossible_orders_are_treated_the_same(kind: str, pp: int, m: int, split: bool, seed: int,
                                                        swaps: int, d: list[float]) -> None:  # fmt: skip
    """Shuffled orders (blocks swapped, dropped, duplicated, moved to another rank): either both
    refuse them with the same message or both time them the same."""
    rng = random.Random(seed)
    orders = [list(seq) for seq in SCHEDULES[kind](pp, m, 2 if kind == "interleaved" else 1)]
    for _ in range(swaps):
        seq = orders[rng.randrange(pp)]
        if not seq:
            continue
        i, j = rng.randrange(len(seq)), rng.randrange(len(seq))
        what = rng.choice(["swap", "drop", "twice", "move"])
        if what == "swap":
            seq[i], seq[j] = seq[j], seq[i]
        elif what == "drop":
            seq.pop(i)
        elif what == "twice":
            seq.insert(j, seq[i])
        else:
            orders[rng.randrange(pp)].append(seq.pop(i))
    assert _outcome(plan_orders, orders, split, d) == _outcome(plan_for, orders, split, d)


@pytest.mark.parametrize(
    "orders",
    [
        [[("B", 0, 0), ("F", 0, 0)]],
        [[("F", 0, 0), ("B", 0, 0)], [("F", 1, 0)]],
        [[("F", 0, 0), ("B", 0, 1)]],
        [[("F", 0, 0), ("F", 0, 0)]],
        [[("F", 0, -1), ("B", 0, -1)]],
        [[("F", 0, 1), ("B", 0, 0), ("F", 0, 0), ("B", 0, 1)], [("F", 1, 0), ("B", 1, 0), ("F", 1, 1), ("B", 1, 1)]],
        [[("F", 0, 0), ("B", 0, 0), ("F", 0, 1), ("B", 0, 1)], [("F", 1, 1), ("F", 1, 0), ("B", 1, 0), ("B", 1, 1)]],
        [[("F", 0, 1), ("F", 0, 0), ("B", 0, 1), ("B", 0, 0)], [("F", 1, 1), ("F", 1, 0), ("B", 1, 1), ("B", 1, 0)]],
        [[("F", 0, 0), ("F", 1, 0), ("B", 1, 0), ("B", 0, 0)]],
        [[], [("F", 0, 0), ("B", 0, 0)]],
    ],
)  # fmt: skip
@pytest.mark.parametrize("split", [False, True])
def test_named_orders_are_refused_or_timed_the_same(orders: list[list[Block]], split: bool) -> None:
    assert _outcome(plan_orders, orders, split, [1.0, 2.0, 0.1]) == _outcome(plan_for, orders, split, [1.0, 2.0, 0.1])


def test_a_nan_duration_spreads_as_in_numpy() -> None:
    nan = float("nan")
    plan = schedule_plan(one_f_one_b, 2, 3, 1, False)
    one = order_plan(one_f_one_b, 2, 3, 1, False)
    args = ([1.0, nan], [2.0, 2.0], [0.1, 0.1], [0.1, 0.1])
    want = time_schedule(plan, *args, keep_blocks=True).layout(0)
    got = time_orders(one, *args)
    assert np.array_equal(np.array(got.rank_ends), np.array(want.rank_ends), equal_nan=True)
    assert np.array_equal(np.array([b[4:] for b in got.blocks]), np.array([b[4:] for b in want.blocks]), equal_nan=True)
