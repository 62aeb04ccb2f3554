"""Schedules and the composer: closed forms and invariants."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echosim.backends.base import OverlapModel
from echosim.ir import DType, Graph, OpKind, TensorSpec
from echosim.ir.ops import CollectiveAttrs, ElementwiseAttrs
from echosim.timeline.schedule import compose, gpipe, in_flight, one_f_one_b
from echosim.timeline.streams import simulate_unit


def makespan(orders, f: float, b: float, pp: int, p2p: float = 0.0) -> float:  # type: ignore[no-untyped-def]
    blocks = compose(orders, [f] * pp, [b] * pp, [p2p] * pp, [p2p] * pp)
    return max(x.end for x in blocks)


@pytest.mark.parametrize(("pp", "m"), [(1, 4), (4, 8), (8, 8), (16, 192)])
def test_one_f_one_b_closed_form(pp: int, m: int) -> None:
    """Equal stages, free transfers: (m + pp - 1) * (F + B) (Narayanan et al. 2021)."""
    assert makespan(one_f_one_b(pp, m), 1.0, 2.0, pp) == pytest.approx((m + pp - 1) * 3.0)


def test_gpipe_has_the_same_bubble_but_holds_every_microbatch() -> None:
    assert makespan(gpipe(4, 8), 1.0, 2.0, 4) == pytest.approx(makespan(one_f_one_b(4, 8), 1.0, 2.0, 4))
    assert in_flight("gpipe", 4, 8, 0) == 8 and in_flight("1f1b", 4, 8, 0) == 4 and in_flight("1f1b", 4, 8, 3) == 1


def test_every_block_runs_once() -> None:
    orders = one_f_one_b(4, 6)
    blocks = compose(orders, [1, 2, 1, 3], [2, 4, 2, 6], [0.1] * 4, [0.1] * 4)
    assert sorted((b.stage, b.kind, b.microbatch) for b in blocks) == sorted(
        (s, k, j) for s in range(4) for k in "FB" for j in range(6)
    )


@settings(max_examples=60, deadline=None)
@given(pp=st.integers(1, 12), m=st.integers(1, 40), f=st.floats(0.1, 5.0), ratio=st.floats(1.0, 3.0))
def test_more_microbatches_never_raise_the_bubble_fraction(pp: int, m: int, f: float, ratio: float) -> None:
    def bubble(mb: int) -> float:
        span = makespan(one_f_one_b(pp, mb), f, f * ratio, pp)
        return 1 - mb * f * (1 + ratio) / span

    assert bubble(m + 1) <= bubble(m) + 1e-9


def test_transfer_latency_stalls_the_steady_state() -> None:
    """With one warm-up micro-batch, stage 0 waits on a round trip for its backwards.

    Each pair of micro-batches costs 2(F+B) + 2*p2p: the bubble fraction with slow
    transfers does not vanish as m grows, which is why the monotonicity property above
    is stated for free transfers.
    """
    pp, f, b, p2p = 2, 1.0, 1.0, 0.5
    spans = [makespan(one_f_one_b(pp, m), f, b, pp, p2p) for m in range(4, 12)]
    for m in range(len(spans) - 2):
        assert spans[m + 2] - spans[m] == pytest.approx(2 * (f + b) + 2 * p2p)


def _unit() -> Graph:
    g = Graph("u")
    x = g.add(OpKind.INPUT, (), TensorSpec((1024,), DType.FP16))
    a = g.add(OpKind.ELEMENTWISE, (x,), TensorSpec((1024,), DType.FP16), ElementwiseAttrs("gelu"))
    g.add(OpKind.ALL_REDUCE, (a,), TensorSpec((1024,), DType.FP16), CollectiveAttrs("dp", 8, 2048))
    g.add(OpKind.ELEMENTWISE, (x,), TensorSpec((1024,), DType.FP16), ElementwiseAttrs("gelu"))
    return g


def test_streams_overlap_and_slow_each_other() -> None:
    g = _unit()
    cost = {1: 1.0, 2: 1.0, 3: 1.0}

    def c(n):  # type: ignore[no-untyped-def]
        return cost.get(n.id, 0.0)

    free = simulate_unit(g, list(g), c, OverlapModel())
    assert free.duration == pytest.approx(2.0)  # the all_reduce runs beside the second kernel
    slowed = simulate_unit(g, list(g), c, OverlapModel(compute_slowdown=1.2, comm_slowdown=1.1))
    assert slowed.duration == pytest.approx(2.2)
    assert slowed.busy["comm.dp"] == pytest.approx(1.1)
