"""The level composer equals an event-by-event simulation of the same schedule, to the last bit.

``reference_compose`` is the composer echosim shipped before the level composer: a sweep over
the ranks for fixed orders and a global event loop for zero-bubble schedules. Hypothesis
draws schedules, shapes and durations; every block must start and end at the same instant.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echosim.timeline.composer import ScheduleError, compose, plan_for, schedule_plan, time_schedule
from echosim.timeline.schedule import Block, BlockTime, gpipe, interleaved, one_f_one_b


def reference_compose(
    orders: Sequence[Sequence[Block]],
    fwd: Sequence[float],
    bwd: Sequence[float],
    p2p_fwd: Sequence[float],
    p2p_bwd: Sequence[float],
    wgrad: Sequence[float] | None = None,
) -> list[BlockTime]:
    """The event-by-event composer echosim used before levels (kept here as the oracle)."""
    pp = len(orders)
    vstages = len(fwd)
    done: dict[tuple[str, int, int], float] = {}
    pos = [0] * pp
    free = [0.0] * pp
    pending: list[list[int]] = [[] for _ in range(pp)]  # deferred W: (vstage, mb) flattened
    cap = [pp - 1] * pp  # deferred W per rank; pp - 1 reproduces ZB-H1's closed form
    out: list[BlockTime] = []

    def ready(block: Block) -> float | None:
        kind, v, j = block
        if kind == "F":
            if v == 0:
                return 0.0
            t = done.get(("F", v - 1, j))
            return None if t is None else t + p2p_fwd[v - 1]
        own = done.get(("F", v, j))
        if own is None:
            return None
        if v == vstages - 1:
            return own
        t = done.get(("B", v + 1, j))
        return None if t is None else max(own, t + p2p_bwd[v + 1])

    durations = {"F": fwd, "B": bwd, "W": wgrad or bwd}

    def run(r: int, kind: str, v: int, j: int, start: float) -> None:
        end = start + durations[kind][v]
        done[(kind, v, j)] = free[r] = end
        out.append(BlockTime(r, v, kind, j, start, end))

    remaining = sum(len(o) for o in orders)
    if wgrad is None:  # fixed orders: sweep the ranks, each runs until it must wait
        while remaining:
            progressed = False
            for r in range(pp):
                while pos[r] < len(orders[r]):
                    t = ready(orders[r][pos[r]])
                    if t is None:
                        break
                    run(r, *orders[r][pos[r]], max(t, free[r]))
                    pos[r] += 1
                    remaining -= 1
                    progressed = True
            if not progressed:
                raise RuntimeError("pipeline schedule deadlocked: a block waits on one that never runs")
        return out
    while remaining or any(pending):  # zero-bubble: event order, deferred W fill the gaps
        best: tuple[float, int, str] | None = None
        for r in range(pp):
            if pos[r] < len(orders[r]):
                t = ready(orders[r][pos[r]])
                if t is not None and (best is None or max(t, free[r]) < best[0]):
                    best = (max(t, free[r]), r, "next")
                must_wait = t is None or t > free[r]
                if pending[r] and must_wait and (best is None or free[r] < best[0]):
                    best = (free[r], r, "w")
            elif pending[r] and (best is None or free[r] < best[0]):
                best = (free[r], r, "w")
        if best is None:
            raise RuntimeError("pipeline schedule deadlocked: a block waits on one that never runs")
        start, r, what = best
        if what == "w":
            v, j = pending[r].pop(0), pending[r].pop(0)
            run(r, "W", v, j, start)
            continue
        kind, v, j = orders[r][pos[r]]
        run(r, kind, v, j, start)
        pos[r] += 1
        remaining -= 1
        if kind == "B" and wgrad is not None:
            pending[r] += [v, j]
            if len(pending[r]) > 2 * cap[r]:  # over the memory cap: do the oldest W now
                v0, j0 = pending[r].pop(0), pending[r].pop(0)
                run(r, "W", v0, j0, free[r])
    return out


def _key(blocks: list[BlockTime]) -> list[tuple[int, int, str, int, float, float]]:
    return sorted((b.stage, b.vstage, b.kind, b.microbatch, b.start, b.end) for b in blocks)


durations = st.lists(st.floats(0.01, 10.0), min_size=64, max_size=64)
lags = st.lists(st.sampled_from([0.0, 0.001, 0.05, 0.3, 1.0]), min_size=64, max_size=64)


@settings(max_examples=150, deadline=None)
@given(pp=st.integers(1, 8), m=st.integers(1, 24), kind=st.sampled_from(["1f1b", "gpipe", "zb"]), d=durations, p=lags)
def test_fixed_and_zero_bubble_orders_match_the_event_simulation(pp: int, m: int, kind: str, d: list[float],
                                                                 p: list[float]) -> None:  # fmt: skip
    orders = gpipe(pp, m) if kind == "gpipe" else one_f_one_b(pp, m)
    f, b, w = d[:pp], d[pp : 2 * pp], d[2 * pp : 3 * pp]
    pf, pb = p[:pp], p[pp : 2 * pp]
    wgrad = w if kind == "zb" else None
    assert _key(compose(orders, f, b, pf, pb, wgrad)) == _key(reference_compose(orders, f, b, pf, pb, wgrad))


@settings(max_examples=60, deadline=None)
@given(pp=st.integers(2, 6), vpp=st.integers(2, 4), groups=st.integers(1, 4), d=durations, p=lags)
def test_interleaved_orders_match_the_event_simulation(pp: int, vpp: int, groups: int, d: list[float],
                                                       p: list[float]) -> None:  # fmt: skip
    v = pp * vpp
    orders = interleaved(pp, pp * groups, vpp)
    f, b = (d * 2)[:v], (d * 2)[v : 2 * v]
    pf, pb = (p * 2)[:v], (p * 2)[v : 2 * v]
    assert _key(compose(orders, f, b, pf, pb)) == _key(reference_compose(orders, f, b, pf, pb))


def test_a_batch_times_each_layout_as_if_alone() -> None:
    rng = np.random.default_rng(0)
    pp, m = 4, 12
    plan = schedule_plan(one_f_one_b, pp, m, 1, False)
    f, b, pf, pb = (rng.uniform(0.1, 2.0, (pp, 5)) for _ in range(4))
    batch = time_schedule(plan, f, b, pf, pb)
    for col in range(5):
        alone = time_schedule(plan, f[:, col], b[:, col], pf[:, col], pb[:, col])
        assert np.array_equal(alone.rank_ends[:, 0], batch.rank_ends[:, col])
        ref = reference_compose(one_f_one_b(pp, m), f[:, col], b[:, col], pf[:, col], pb[:, col])
        assert tuple(max(x.end for x in ref if x.stage == r) for r in range(pp)) == batch.layout(col).rank_ends


def test_plans_are_kept_per_shape_and_list_in_flight_counts() -> None:
    plan = schedule_plan(one_f_one_b, 4, 8, 1, False)
    assert schedule_plan(one_f_one_b, 4, 8, 1, False) is plan
    assert [d[r] for r, d in enumerate(plan.in_flight)] == [4, 3, 2, 1]
    assert len(plan.levels) == 2 * (8 + 4 - 1)  # 1F1B: each level holds at most one block per rank


@pytest.mark.parametrize(
    ("orders", "why"),
    [
        ([[("B", 0, 0), ("F", 0, 0)]], "deadlocked"),
        ([[("F", 0, 0), ("B", 0, 0)], [("F", 1, 0)]], "never runs"),
        ([[("F", 0, 0), ("B", 0, 1)]], "never runs"),
        ([[("F", 0, 0), ("F", 0, 0)]], "twice"),
        ([[("F", 0, 1), ("B", 0, 0), ("F", 0, 0), ("B", 0, 1)], [("F", 1, 0), ("B", 1, 0), ("F", 1, 1), ("B", 1, 1)]],
         "before its own forward"),
        ([[("F", 0, 1), ("F", 0, 0), ("B", 0, 0), ("B", 0, 1)], [("F", 1, 0), ("B", 1, 0), ("F", 1, 1), ("B", 1, 1)],
          [("F", 2, 1), ("B", 2, 1), ("F", 2, 0), ("B", 2, 0)]], "deadlocked"),
        ([[("F", 0, 1), ("F", 0, 0), ("B", 0, 1), ("B", 0, 0)], [("F", 1, 1), ("F", 1, 0), ("B", 1, 1), ("B", 1, 0)]],
         ""),
    ],
)  # fmt: skip
def test_impossible_orders_are_refused_and_odd_ones_timed(orders: list[list[Block]], why: str) -> None:
    if not why:  # a valid, if odd, order: timed like the reference
        v = len(orders)
        assert _key(compose(orders, [1.0] * v, [2.0] * v, [0.1] * v, [0.1] * v)) == _key(
            reference_compose(orders, [1.0] * v, [2.0] * v, [0.1] * v, [0.1] * v)
        )
        return
    with pytest.raises(ScheduleError, match=why):
        plan_for(orders, vstages=len(orders))


def test_a_deadlocked_order_is_named() -> None:
    # rank 1 runs micro-batch 1 first; its input comes after rank 0's backward of micro-batch 0,
    # which waits on rank 1's backward of micro-batch 0, which rank 1 runs later
    rank0 = [("F", 0, 0), ("B", 0, 0), ("F", 0, 1), ("B", 0, 1)]
    rank1 = [("F", 1, 1), ("F", 1, 0), ("B", 1, 0), ("B", 1, 1)]
    with pytest.raises(ScheduleError, match="deadlocked"):
        plan_for([rank0, rank1], vstages=2)
    with pytest.raises(RuntimeError, match="deadlocked"):
        reference_compose([rank0, rank1], [1.0] * 2, [1.0] * 2, [0.0] * 2, [0.0] * 2)


@pytest.mark.parametrize("gathered", [1, 7, 1 << 20])
def test_levels_read_both_inputs_in_one_gather_and_their_seconds_in_chunks(
    monkeypatch: pytest.MonkeyPatch, gathered: int
) -> None:
    """``plan.reads`` holds each level's ``cross`` then ``chain`` rows (one gather a level), and the transfer and
    duration seconds gathered for many levels at once (however few rows a chunk holds) give every block the
    recurrence's end, ``max(ends[cross] + lags[lag], ends[chain]) + durations[duration]``, to the last bit."""
    import echosim.timeline.composer as composer

    monkeypatch.setattr(composer, "_GATHERED", gathered)
    rng = np.random.default_rng(3)
    for orders_of, pp, m, vpp in ((one_f_one_b, 4, 9, 1), (interleaved, 4, 8, 2), (gpipe, 3, 5, 1)):
        plan = schedule_plan(orders_of, pp, m, vpp, False)
        for lo, hi in plan.levels:
            assert plan.reads[2 * lo : lo + hi].tolist() == plan.cross[lo:hi].tolist()
            assert plan.reads[lo + hi : 2 * hi].tolist() == plan.chain[lo:hi].tolist()
        f, b, pf, pb = (rng.uniform(0.1, 2.0, (pp * vpp, 6)) for _ in range(4))
        got = time_schedule(plan, f, b, pf, pb)
        durations, lags = np.concatenate([f, b]), np.concatenate([pf, pb, np.zeros((1, 6))])
        ends = np.zeros((plan.blocks + 1, 6))
        for lo, hi in plan.levels:  # the recurrence, written out
            ready = np.maximum(ends[plan.cross[lo:hi]] + lags[plan.lag[lo:hi]], ends[plan.chain[lo:hi]])
            ends[lo:hi] = ready + durations[plan.duration[lo:hi]]
        assert got.ends.tobytes() == ends.tobytes()


def test_in_flight_counts_of_every_rank_at_once_equal_each_ranks_own() -> None:
    """A plan's in-flight counts are read for all ranks from its columns (``_in_flight_all``): equal, item order
    included, to :func:`_in_flight` of each rank's orders, on every registered schedule (DualPipe's ranks run two
    stages, interleaved ones several)."""
    import itertools

    from echosim import plugins
    from echosim.timeline.composer import _in_flight

    checked = 0
    for name, entry in plugins.get_registry().schedules.items():
        s = entry.value
        for pp, m, vpp in itertools.product((1, 2, 3, 4, 8), (1, 2, 4, 8, 12, 32), (1, 2, 4)):
            unfit = getattr(s, "unfit", None)
            if (vpp > 1 and not getattr(s, "interleaved", False)) or (unfit is not None and unfit(pp, m, vpp)):
                continue
            try:  # as a step builds it (a shape the schedule refuses is skipped)
                split, fused = getattr(s, "split_backward", False), getattr(s, "fused_pairs", False)
                plan = schedule_plan(s.orders, pp, m, vpp, split, fused)
            except ScheduleError:
                continue
            want = [list(_in_flight(seq).items()) for seq in plan.orders]
            assert [list(d.items()) for d in plan.in_flight] == want, (name, pp, m, vpp)
            checked += 1
    assert checked > 200


def _plan_fields(plan: object) -> dict[str, object]:
    import dataclasses

    fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan) if f.name != "orders_source"}
    return {**fields, "orders": plan.orders, "reads": plan.reads}


def test_built_in_schedules_columns_give_the_plan_their_orders_give() -> None:
    """A built-in schedule's ``columns`` (its orders generated as arrays, so a search's plans skip a Python tuple
    per block) give the plan its tuple orders give: every array equal element by element with the same dtype,
    every tuple and dict equal (item order included), or the same refusal; on every registered schedule that
    has columns and a grid of pp, vpp and micro-batch counts (with ones that do not divide by pp)."""
    import itertools

    from echosim import plugins
    from echosim.timeline.composer import _build

    checked = set()
    for name, entry in plugins.get_registry().schedules.items():
        s = entry.value
        columns = getattr(s, "columns", None)
        if columns is None:
            continue
        split, fused = getattr(s, "split_backward", False), getattr(s, "fused_pairs", False)
        for pp, m, vpp in itertools.product((1, 2, 3, 4, 8), (0, 1, 2, 3, 4, 6, 8, 12, 17, 32), (1, 2, 3, 4)):
            kinds, vs, js, _ = columns(pp, m, vpp)
            assert (kinds.dtype, vs.dtype, js.dtype) == (np.int64,) * 3, name
            try:
                want = _build(s.orders(pp, m, vpp), split, pp * vpp, fused)
            except ScheduleError as e:
                with pytest.raises(ScheduleError, match=str(e)):
                    schedule_plan(lambda p, j, v, s=s: s.orders(p, j, v), pp, m, vpp, split, fused, columns)
                continue
            got = schedule_plan(lambda p, j, v, s=s: s.orders(p, j, v), pp, m, vpp, split, fused, columns)
            for field, value in _plan_fields(want).items():
                other = _plan_fields(got)[field]
                if isinstance(value, np.ndarray):
                    assert other.dtype == value.dtype and np.array_equal(other, value), (name, pp, m, vpp, field)
                else:
                    assert other == value, (name, pp, m, vpp, field)
                    if field == "in_flight":
                        assert [list(d.items()) for d in other] == [list(d.items()) for d in value]
            checked.add(name)
    assert checked >= {"1f1b", "gpipe", "interleaved", "zb-h1"}


def test_a_plan_from_columns_builds_its_tuple_orders_only_when_read() -> None:
    """With ``columns`` the plan does not call the schedule's tuple orders (the search never reads them for most
    plans); reading :attr:`SchedulePlan.orders` builds them once."""
    from echosim.timeline.schedule import one_f_one_b_columns

    calls = []

    def orders_of(pp: int, m: int, vpp: int = 1) -> list[list[Block]]:
        calls.append((pp, m, vpp))
        return one_f_one_b(pp, m, vpp)

    plan = schedule_plan(orders_of, 4, 8, 1, False, False, one_f_one_b_columns)
    assert calls == []
    assert plan.orders == tuple(tuple(seq) for seq in one_f_one_b(4, 8))
    assert plan.orders is plan.orders and calls == [(4, 8, 1)]
