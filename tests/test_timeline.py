"""Schedules and the composer: closed forms and invariants."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echosim.backends.base import OverlapModel
from echosim.ir import DType, Graph, OpKind, TensorSpec
from echosim.ir.ops import Axis, CollectiveAttrs, ElementwiseAttrs
from echosim.timeline.composer import compose
from echosim.timeline.schedule import gpipe, in_flight, interleaved, one_f_one_b
from echosim.timeline.streams import OpEvent, simulate_unit


def makespan(orders, f: float, b: float, pp: int, p2p: float = 0.0) -> float:  # type: ignore[no-untyped-def]
    blocks = compose(orders, [f] * pp, [b] * pp, [p2p] * pp, [p2p] * pp)
    return max(x.end for x in blocks)


@pytest.mark.parametrize(("pp", "m"), [(1, 4), (4, 8), (8, 8), (16, 192)])
def test_one_f_one_b_closed_form(pp: int, m: int) -> None:
    """Equal stages, free transfers: (m + pp - 1) * (F + B) (Narayanan et al. 2021)."""
    assert makespan(one_f_one_b(pp, m), 1.0, 2.0, pp) == pytest.approx((m + pp - 1) * 3.0)


def test_gpipe_has_the_same_bubble_but_holds_every_microbatch() -> None:
    assert makespan(gpipe(4, 8), 1.0, 2.0, 4) == pytest.approx(makespan(one_f_one_b(4, 8), 1.0, 2.0, 4))
    assert in_flight(gpipe(4, 8), 0) == {0: 8}
    assert in_flight(one_f_one_b(4, 8), 0) == {0: 4} and in_flight(one_f_one_b(4, 8), 3) == {3: 1}


def test_every_block_runs_once() -> None:
    orders = one_f_one_b(4, 6)
    blocks = compose(orders, [1, 2, 1, 3], [2, 4, 2, 6], [0.1] * 4, [0.1] * 4)
    assert sorted((b.stage, b.kind, b.microbatch) for b in blocks) == sorted(
        (s, k, j) for s in range(4) for k in "FB" for j in range(6)
    )


@pytest.mark.parametrize(("pp", "vpp", "m"), [(2, 2, 4), (4, 2, 8), (4, 3, 12), (8, 4, 16)])
def test_interleaving_divides_the_bubble_by_vpp(pp: int, vpp: int, m: int) -> None:
    """Narayanan et al. 2021, sec. 2.2.2: the bubble shrinks to (pp - 1) / (vpp * m) of the work."""
    f, b = 1.0 / vpp, 2.0 / vpp  # each chunk does 1/vpp of a stage's layers
    blocks = compose(interleaved(pp, m, vpp), [f] * pp * vpp, [b] * pp * vpp, [0.0] * pp * vpp, [0.0] * pp * vpp)
    span = max(x.end for x in blocks)
    ideal = m * 3.0
    assert span == pytest.approx(ideal + (pp - 1) * 3.0 / vpp)
    assert sorted((x.vstage, x.kind, x.microbatch) for x in blocks) == sorted(
        (v, k, j) for v in range(pp * vpp) for k in "FB" for j in range(m)
    )


@settings(max_examples=40, deadline=None)
@given(pp=st.integers(2, 8), vpp=st.integers(2, 4), groups=st.integers(1, 6))
def test_interleaving_never_raises_the_bubble(pp: int, vpp: int, groups: int) -> None:
    m = pp * groups
    plain = makespan(one_f_one_b(pp, m), 1.0, 2.0, pp)
    v = pp * vpp
    blocks = compose(interleaved(pp, m, vpp), [1.0 / vpp] * v, [2.0 / vpp] * v, [0.0] * v, [0.0] * v)
    assert max(x.end for x in blocks) <= plain + 1e-9


@pytest.mark.parametrize(("pp", "m"), [(4, 8), (4, 16), (8, 32)])
def test_zero_bubble_h1_closed_form(pp: int, m: int) -> None:
    """Qi et al. 2024, ZB-H1: m (F + B + W) + (pp - 1)(F + B - W), below 1F1B's bubble."""
    f, b, w = 1.0, 1.0, 1.0
    blocks = compose(one_f_one_b(pp, m), [f] * pp, [b] * pp, [0.0] * pp, [0.0] * pp, wgrad=[w] * pp)
    assert sum(1 for x in blocks if x.kind == "W") == pp * m
    assert max(x.end for x in blocks) == pytest.approx(m * (f + b + w) + (pp - 1) * (f + b - w))
    assert max(x.end for x in blocks) < makespan(one_f_one_b(pp, m), f, b + w, pp)


def _unit() -> Graph:
    g = Graph("u")
    x = g.add(OpKind.INPUT, (), TensorSpec((1024,), DType.FP16))
    a = g.add(OpKind.ELEMENTWISE, (x,), TensorSpec((1024,), DType.FP16), ElementwiseAttrs("gelu"))
    g.add(OpKind.ALL_REDUCE, (a,), TensorSpec((1024,), DType.FP16), CollectiveAttrs(Axis.DP, 8, 2048))
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


def test_a_spilled_collective_slows_the_next_repetitions_compute() -> None:
    """FSDP's prefetch / reduce-scatter issued after a layer's compute runs beside the next layer's: the
    steady-state period pays the overlap model's slowdown on the compute it overlaps (1.5 s at 1.2x: +0.3 s)."""
    g = Graph("layer")
    x = g.add(OpKind.INPUT, (), TensorSpec((1024,), DType.BF16))
    k1 = g.add(OpKind.ELEMENTWISE, (x,), TensorSpec((1024,), DType.BF16), ElementwiseAttrs("gelu"))
    k2 = g.add(OpKind.ELEMENTWISE, (k1,), TensorSpec((1024,), DType.BF16), ElementwiseAttrs("gelu"))
    g.add(OpKind.ALL_GATHER, (k2,), TensorSpec((1024,), DType.BF16), CollectiveAttrs(Axis.DP, 8, 2048))
    cost = {k1: 1.0, k2: 1.0, k2 + 1: 1.5}

    def c(n):  # type: ignore[no-untyped-def]
        return cost.get(n.id, 0.0)

    free = simulate_unit(g, list(g), c, OverlapModel())
    assert (free.critical_end, free.duration, free.carry, free.period) == pytest.approx((2.0, 3.5, 0.0, 2.0))
    slowed = simulate_unit(g, list(g), c, OverlapModel(compute_slowdown=1.2))
    assert slowed.duration == pytest.approx(3.5)  # nothing overlaps inside one repetition
    assert slowed.carry == pytest.approx(1.5 * 0.2)
    assert slowed.period == pytest.approx(2.0 + 0.3)
    cost[k2 + 1] = 3.0  # communication-bound: the collective sets the period
    assert simulate_unit(g, list(g), c, OverlapModel(compute_slowdown=1.2)).period == pytest.approx(3.0)


def test_tp_comm_overlap_hides_the_collective_under_its_gemm() -> None:
    from echosim.ir.ops import MatmulAttrs
    from echosim.timeline.streams import pipelined_edges

    g = Graph("tp")
    x = g.add(OpKind.INPUT, (), TensorSpec((64, 64), DType.BF16))
    mm = g.add(OpKind.MATMUL, (x,), TensorSpec((64, 64), DType.BF16), MatmulAttrs(64, 64, 64))
    ar = g.add(OpKind.ALL_REDUCE, (mm,), TensorSpec((64, 64), DType.BF16), CollectiveAttrs(Axis.TP, 8, 8192))
    g.add(OpKind.ELEMENTWISE, (ar,), TensorSpec((64, 64), DType.BF16), ElementwiseAttrs("add"))
    cost = {mm: 1.0, ar: 0.5, ar + 1: 0.1}

    def c(n):  # type: ignore[no-untyped-def]
        return cost.get(n.id, 0.0)

    nodes = list(g)
    assert simulate_unit(g, nodes, c, OverlapModel()).duration == pytest.approx(1.6)
    edges = pipelined_edges(nodes)
    assert edges == {(mm, ar)}
    assert simulate_unit(g, nodes, c, OverlapModel(), edges).duration == pytest.approx(1.1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.floats(0.0, 2.0), st.lists(st.integers(0, 40), max_size=3)),
                min_size=1, max_size=25), st.data())  # fmt: skip
def test_list_scheduling_short_path_equals_the_general_step(spec: list, data: st.DataObject) -> None:
    """:func:`_advance`'s short path (no pipelined input edge) gives to the bit what the general per-node step
    gives (begin, end, stream state and each op's (start, seconds)), with and without pipelined edges."""
    from echosim.ir.ops import MatmulAttrs
    from echosim.timeline.streams import COMM, COMPUTE, _advance, _advance_chunked, _timing

    g = Graph("random")
    x = g.add(OpKind.INPUT, (), TensorSpec((64,), DType.BF16))
    ids, dur = [x], {x: 0.0}
    for kind, seconds, reads in spec:
        ins = tuple(ids[r % len(ids)] for r in reads)
        out = TensorSpec((64,), DType.BF16)
        if kind == 0:
            nid = g.add(OpKind.MATMUL, ins, out, MatmulAttrs(8, 8, 8))
        elif kind in (1, 2):  # a collective on the comm stream, or a blocking one on the compute stream
            nid = g.add(OpKind.ALL_REDUCE, ins, out, CollectiveAttrs(Axis.TP, 8, 128, blocking=kind == 2))
        else:
            nid = g.add(OpKind.ELEMENTWISE, ins, out, ElementwiseAttrs("add"))
        ids.append(nid)
        dur[nid] = seconds if seconds > 0.3 else 0.0  # some free ops (views, placeholders)
    nodes = list(g)
    edges = [(i, n.id) for n in nodes for i in n.inputs]
    pipelined = set(data.draw(st.lists(st.sampled_from(edges), max_size=4))) if edges else set()
    for chunked in (set(), pipelined):
        fast: tuple[dict, dict, dict, list] = ({}, {}, {COMPUTE: 0.0, COMM: 0.0}, [])
        _advance(nodes, dur, chunked, *fast)
        slow: tuple[dict, dict, dict, list] = ({}, {}, {COMPUTE: 0.0, COMM: 0.0}, [])
        for n in nodes:
            _advance_chunked(n, dur, chunked, *slow)
        assert fast == slow
    # the events built without the dataclass's __init__ (inside _timing's loop) are equal to those built with it
    t = _timing(nodes, fast[3], dur, set())
    assert all(e == OpEvent(*(getattr(e, f) for f in OpEvent.__dataclass_fields__)) for e in t.events)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.lists(st.integers(0, 40), max_size=3)), min_size=1, max_size=25))
def test_pipelined_edges_are_the_matmul_collective_pairs_in_input_order(spec: list) -> None:
    """:func:`pipelined_edges` (only matmuls and ``axis`` collectives looked at) gives the edges, in the same
    insertion order, of the pairwise rule: every producer -> consumer edge in the unit with a matmul at one end and
    an ``axis`` collective at the other (a DP collective, an elementwise op or a producer outside it: none)."""
    from echosim.ir.ops import MatmulAttrs
    from echosim.timeline.streams import pipelined_edges

    g = Graph("random")
    outside = g.add(OpKind.MATMUL, (), TensorSpec((64,), DType.BF16), MatmulAttrs(8, 8, 8))  # not in the unit
    ids = [outside]
    for kind, reads in spec:
        ins = tuple(ids[r % len(ids)] for r in reads)
        out = TensorSpec((64,), DType.BF16)
        attrs = (MatmulAttrs(8, 8, 8), CollectiveAttrs(Axis.TP, 8, 128), CollectiveAttrs(Axis.DP, 8, 128),
                 ElementwiseAttrs("add"), MatmulAttrs(4, 4, 4))[kind]  # fmt: skip
        op = OpKind.MATMUL if isinstance(attrs, MatmulAttrs) else OpKind.ELEMENTWISE if kind == 3 else OpKind.ALL_REDUCE
        ids.append(g.add(op, ins, out, attrs))
    nodes = list(g)[1:]
    unit = {n.id: n for n in nodes}
    pairwise = [
        (i, n.id)
        for n in nodes
        for i in n.inputs
        if i in unit
        and any(isinstance(x.attrs, MatmulAttrs) for x in (unit[i], n))
        and any(isinstance(x.attrs, CollectiveAttrs) and x.attrs.axis is Axis.TP for x in (unit[i], n))
    ]
    before: set[tuple[int, int]] = set()
    for e in pairwise:  # the set as the pairwise walk built it, edge by edge
        before.add(e)
    edges = pipelined_edges(nodes)
    assert edges == before
    assert list(edges) == list(before)  # built in the same order: the same set, iterated alike
    assert not pipelined_edges(nodes, Axis.EP)


def _tail_loop_as_written_before(first: float, period: float, into: float, per_layer: float, layers: int,
                                 total_bwd: float) -> tuple[float, float]:  # fmt: skip
    comm_end = overlapped = 0.0
    for j in range(1, layers + 1):
        ready = first + j * (period + into)
        start = max(ready, comm_end)
        comm_end = start + per_layer
        overlapped += max(0.0, min(comm_end, total_bwd) - start)
    return comm_end, overlapped


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(1e-6, 10.0), min_size=6, max_size=6), st.integers(1, 40), st.booleans(), st.floats(1.0, 2.0))
def test_dp_tail_times_equals_the_loop_it_hoists_to_the_bit(
    x: list[float], layers: int, copies: bool, slow: float
) -> None:
    """dp_tail_times reads the loop's invariants once: the same operands, so the same floats as the loop over
    ``block.period + into_layer`` recomputed per layer."""
    from echosim.timeline.lower import BucketSeconds, dp_tail_times, repeated
    from echosim.timeline.streams import UnitTiming

    first, block, last = (UnitTiming(duration=x[k], critical_end=x[k] * 0.75) for k in range(3))
    b = BucketSeconds(x[3], x[4], x[5] if copies else 0.0, 0.0, 0.0, 0.0)
    total_bwd = first.duration + repeated(block, layers) + last.duration
    total_bwd += b.into_layer * layers + b.into_rest
    comm_end, overlapped = _tail_loop_as_written_before(first.duration, block.period, b.into_layer, b.per_layer,
                                                        layers, total_bwd)  # fmt: skip
    comm_end = max(comm_end, total_bwd) + b.rest
    want = max(0.0, comm_end - total_bwd) + overlapped * (slow - 1.0)
    assert dp_tail_times(b, [(first, 1), (block, layers), (last, 1)], True, slow)[0] == want


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("FBW"), st.integers(0, 3), st.integers(0, 5)), max_size=40))
def test_in_flight_reads_the_blocks_as_the_generator_it_replaces(seq: list[tuple[str, int, int]]) -> None:
    """The composer reads a rank's blocks by C-level maps: the same columns as the generator over them."""
    import numpy as np

    from echosim.timeline.composer import _in_flight

    if not seq:
        assert _in_flight(seq) == {}
        return
    sign = np.array([1 if b[0] == "F" else -1 if b[0] == "B" else 0 for b in seq], np.int64)
    chunk = np.array([b[1] for b in seq], np.int64)
    forwards = chunk[sign == 1]
    first = np.unique(forwards, return_index=True)[1]
    want = {v: int(np.cumsum(sign[chunk == v]).max()) for v in forwards[np.sort(first)].tolist()}
    assert _in_flight(seq) == want


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 10), st.floats(0, 3)), min_size=0, max_size=8),
    st.floats(0, 12),
    st.floats(0, 4),
)
def test_span_overlap_fast_paths_equal_the_plain_sum(
    raw: list[tuple[float, float]], start: float, length: float
) -> None:
    """The seconds of a stream's spans inside a window, read with bisection and the one-span shortcut, are the
    plain sum over every span to the bit, whether the spans are one stream's (sorted, disjoint) or not."""
    from echosim.timeline.streams import _Spans

    t, ordered = 0.0, []
    for gap, d in raw:  # one stream's ops: sorted and disjoint
        ordered.append((t + gap, t + gap + d))
        t += gap + d
    unordered = [(b, b + d) for b, d in raw]
    end = start + length
    for spans in (ordered, unordered):
        plain = sum(max(0.0, min(end, e) - max(start, b)) for b, e in spans)
        got = _Spans(spans).overlap(start, end)
        assert got == plain and repr(float(got)) == repr(float(plain))
