"""Lowering: pipeline stages + a backend -> the :class:`~echosim.timeline.costed.CostedGraph` of one step.

Symmetry first: every TP/DP peer of a pipeline stage runs the same program, so one
representative rank per stage is lowered. A stage's micro-batch forward and backward are
simulated op by op on a compute and a communication stream (a repeated layer once, then
scaled by its count); stages with the same shape share one lowering; the pipeline schedule
composes their blocks across ranks and micro-batches; the gradient reduction of the last
micro-batch overlaps its backward, and the step-end collectives and the optimizer close the
step. :func:`lower_step` is the only place that composes time: the report, the trace, the
memory timeline and the graph export all read its result. Cost does not depend on the
number of devices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, NamedTuple

from echosim.backends.base import Backend, Placement, for_program, unwrapped
from echosim.backends.deepep import deepep_time_s
from echosim.ir.graph import SAME_NODES, Graph, Node, twin_of
from echosim.ir.names import cost_traits
from echosim.ir.ops import Axis, CollectiveAttrs, ElementwiseAttrs, OpKind, Phase, Role
from echosim.ir.types import DType, TensorSpec
from echosim.memo import HashedKey, Memo
from echosim.passes.data_parallel import DDP_COPY_BYTES_PER_BYTE
from echosim.passes.flops import io_bytes
from echosim.passes.memory import added_nodes
from echosim.passes.pipeline import Stage
from echosim.timeline.costed import CostedGraph, StageCost, TailTask, chunks_by_rank, rank_tail
from echosim.timeline.schedule import Schedule
from echosim.timeline.sequential import SequentialTiming, order_plan, time_orders
from echosim.timeline.streams import (
    FirstPass,
    OpEvent,
    UnitArrays,
    UnitTiming,
    compiled_unit,
    pipelined_edges,
    simulate_compiled,
    simulate_unit,
)
from echosim.timeline.streams import category as op_category

if TYPE_CHECKING:
    from echosim.timeline.composer import SchedulePlan, ScheduleTiming


@dataclass(frozen=True)
class StepOptions:
    """What lowering needs to know of the layout; the compiler fills it from the plan."""

    schedule: Schedule
    pp: int = 1
    vpp: int = 1
    microbatches: int = 1
    tp: int = 1
    sp: bool = False  # with sequence parallelism a stage boundary already carries 1/tp of the activation
    tp_overlap: bool = False  # chunked GEMMs overlap their TP collectives
    overlap_dp: bool = True  # the gradient reduction overlaps the last backward
    ep_overlap: bool = False  # Megatron's combined 1F1B: EP all-to-alls beside the adjacent micro-batch


# Seconds of an op by what its cost depends on (the backend object, the op, its attributes,
# output, phase and bytes moved; a collective's kind, bytes and placement), never by layout:
# the layouts of a search price each distinct GEMM, kernel and collective once.
_COSTS: Memo[float] = Memo("op costs", maxsize=1 << 17)
_UNITS: Memo[UnitTiming] = Memo("unit timings", maxsize=1 << 14)
# The timed schedule by its plan and every stage's block times: layouts whose stages time the same
# (ZeRO 0/1/2, tp-overlap without TP traffic in the units) compose their pipeline once.
_TIMED: Memo[Any] = Memo("timed schedules", maxsize=4096)


#: :func:`where_key`'s keys, by the identities of the placement objects (each entry holds them, so no other object
#: takes their ids while it is kept).
_WHERE: Memo[tuple[tuple[Any, ...], HashedKey]] = Memo("placement keys", maxsize=1 << 12)


def where_key(where: dict[Axis, Placement]) -> HashedKey:
    """``tuple(where.items())`` hashed once, one key object for the same placement objects: a search's caches of a
    stage key by the placements on every lowering and stage lookup, and a :class:`Placement` hashes field by field
    (2.2M hashes in GPT-3 175B's full space). The layouts of one set of degrees share their placement objects
    (timeline.placement keeps them per degrees), so a key is found by their ids and checked equal on a hit."""
    items = tuple(where.items())
    ids = tuple(map(id, where.values()))
    hit = _WHERE.lookup(ids)
    if hit is not None and hit[0] == items:
        return hit[1]
    key = HashedKey(items)
    _WHERE.put(ids, (items, key))
    return key


def host_copy_s(backend: Backend, nbytes: int) -> float:
    """Seconds to copy ``nbytes`` from host memory to the device: the ``host_copy_time_s`` of the backend under
    its wrappers (a calibration, a plugin's guard); the plan's checks refused the offload on a backend without
    one (:func:`echosim.layout.check_offload`)."""
    return float(unwrapped(backend).host_copy_time_s(nbytes))


class Coster:
    """Seconds of one IR node on the backend; collectives are priced on their axis's placement."""

    def __init__(self, graph: Graph, backend: Backend, where: dict[Axis, Placement]) -> None:
        self.graph, self.backend, self.where = graph, backend, where
        # a scope's gradient buckets read the same gradients: their copies priced once per (inputs, dtype)
        self._copies: dict[tuple[tuple[int, ...], DType], tuple[float, float, int]] = {}

    def __call__(self, node: Node) -> float:
        if node.op in (OpKind.VIEW, OpKind.INPUT, OpKind.PARAMETER):
            return 0.0
        backend = self.backend
        if node.op.is_collective:
            assert isinstance(node.attrs, CollectiveAttrs)
            a = node.attrs
            host = host_copy_s(backend, a.host_bytes) if a.host_bytes else 0.0  # a shard fetched from host memory
            if a.size <= 1:
                return host
            kind, nbytes, where = node.op, a.bytes, self.where[a.axis]
            if kind is OpKind.ALL_TO_ALL and a.top_k:  # DeepEP's dispatcher: network once per node, then NVLink
                return _COSTS.get(
                    (backend, kind, nbytes, where, a.experts, a.top_k, a.groups, a.group_topk),
                    lambda: deepep_time_s(
                        backend.collective_time_s, nbytes, where, a.experts, a.top_k, a.groups, a.group_topk
                    ),
                )
            if a.pieces:  # one collective per tensor (CollectiveAttrs.pieces)
                return host + sum(self._collective(kind, b, where) + self._rank_copies(a, b, node) for b in a.pieces)
            return host + self._collective(kind, nbytes, where) + self._rank_copies(a, nbytes, node)
        if isinstance(node.attrs, ElementwiseAttrs) and node.attrs.epilogue:  # runs in a GEMM's epilogue
            return 0.0
        io = io_bytes(self.graph, node)
        key = (backend, node.op, node.attrs, node.out, node.phase, io, cost_traits(node.name))
        return _COSTS.get(key, lambda: backend.op_time_s(node, io))

    def bucket_copies(self, node: Node) -> tuple[float, float]:
        """Seconds of PyTorch DDP's copies of one gradient bucket on the compute stream: into the bucket
        as its gradients become ready, and back into them after its all-reduce (``bucket_copy``; else 0, 0).

        The reducer copies gradient by gradient, so each gradient is one memory-bound kernel moving
        :data:`~echosim.passes.data_parallel.DDP_COPY_BYTES_PER_BYTE` times its bytes in the bucket's
        dtype; a scope whose gradients fill several buckets gives each bucket its share.
        """
        a = node.attrs
        if not isinstance(a, CollectiveAttrs) or not a.bucket_copy:
            return 0.0, 0.0
        key = (node.inputs, node.out.dtype)
        known = self._copies.get(key)
        if known is None:
            sizes = [self.graph[i].out.numel for i in node.inputs]
            total = sum(sizes) * node.out.dtype.itemsize
            into = sum(self._copy_s("mul", numel, node.out.dtype) for numel in sizes)  # mul_out(view, grad, 1/world)
            back = sum(self._copy_s("copy", numel, node.out.dtype) for numel in sizes)  # grad.copy_(view)
            known = self._copies[key] = (into, back, total)
        into, back, total = known
        if total <= 0:
            return 0.0, 0.0
        share = a.bytes / total
        return into * share, back * share

    def _collective(self, kind: OpKind, nbytes: int, where: Placement) -> float:
        backend = self.backend
        return _COSTS.get((backend, kind, nbytes, where), lambda: backend.collective_time_s(kind, nbytes, where))

    def _rank_copies(self, a: CollectiveAttrs, nbytes: int, node: Node) -> float:
        """Seconds of the per-rank copies around a list-form collective of ``nbytes`` (``rank_copies``).

        PyTorch's ProcessGroupNCCL ``allgather`` / ``reduce_scatter`` over a list of tensors (before
        ``_all_gather_base``) runs NCCL on one flat buffer and copies each rank's slice between it and the
        caller's list, ``outputTensors[i][j].copy_(outputFlattened[i][j])`` after an all_gather and
        ``inputFlattened[i][j].copy_(inputTensors[i][j])`` before a reduce_scatter, on NCCL's stream: one
        memory-bound kernel per rank, each paying the device's kernel overhead.
        """
        if not a.rank_copies or a.size <= 1:
            return 0.0
        numel = max(1, nbytes // a.size // node.out.dtype.itemsize)
        return a.size * self._copy_s("copy", numel, node.out.dtype)  # each copy reads and writes its slice

    def _copy_s(self, fn: str, numel: int, dtype: DType) -> float:
        spec = TensorSpec((max(1, numel),), dtype)
        attrs = ElementwiseAttrs(fn)
        io = DDP_COPY_BYTES_PER_BYTE * spec.nbytes
        node = Node(-1, OpKind.ELEMENTWISE, (), spec, attrs, Phase.BACKWARD, name=f"ddp.bucket_{fn}")
        key = (self.backend, OpKind.ELEMENTWISE, attrs, spec, Phase.BACKWARD, io, cost_traits(node.name))
        return _COSTS.get(key, lambda: self.backend.op_time_s(node, io))


#: Bytes a rank must receive at least, as a share of a collective's nccl-tests buffer over ``n`` ranks,
#: whatever the algorithm (in-switch reduction included): all_reduce and all_gather need everyone
#: else's part of the result, reduce_scatter its reduced shard, all_to_all the others' chunks.
_RECEIVED: dict[OpKind, Any] = {
    OpKind.ALL_REDUCE: lambda n: (n - 1) / n,
    OpKind.ALL_GATHER: lambda n: (n - 1) / n,
    OpKind.REDUCE_SCATTER: lambda n: 1 / n,
    OpKind.ALL_TO_ALL: lambda n: (n - 1) / n,
    OpKind.SEND: lambda n: 1.0,
    OpKind.RECV: lambda n: 1.0,
    OpKind.BROADCAST: lambda n: 1.0,
}
_BANDWIDTHS: Memo[tuple[str, ...]] = Memo("bandwidth checks", maxsize=4096)


def bandwidth_violations(stages: Sequence[Stage], backend: Any, where: dict[Axis, Placement]) -> list[str]:
    """Ops whose cost moves bytes faster than the device can: a memory-bound kernel's bytes over the
    backend's ``peak_bandwidth_Bps("memory")``, a collective's least received bytes over ``("links")``.

    Each op is priced as lowering priced it (the same cache); a backend without
    ``peak_bandwidth_Bps`` (optional for plugins) is not checked. One description per op, in graph order.
    """
    method = getattr(backend, "peak_bandwidth_Bps", None)
    if not callable(method):
        return []
    memory, links = method("memory"), method("links")
    if not memory or not links:
        return []
    out: list[str] = []
    for stage in stages:
        graph = stage.graph
        used = tuple(sorted((a.value, p) for a, p in where.items()))
        key = (backend, used, graph)
        out += _BANDWIDTHS.get(
            key, lambda g=graph: _graph_bandwidth(g, Coster(g, for_program(backend, g), where), memory, links)
        )
    return list(dict.fromkeys(out))


def _graph_bandwidth(graph: Graph, cost: Coster, memory: float, links: float) -> tuple[str, ...]:
    out = []
    for node in graph:
        if node.op in (OpKind.VIEW, OpKind.INPUT, OpKind.PARAMETER, OpKind.MATMUL, OpKind.ATTENTION):
            continue
        if isinstance(node.attrs, CollectiveAttrs):
            n = node.attrs.size
            if n <= 1 or node.op not in _RECEIVED:
                continue
            nbytes, limit, what = node.attrs.bytes * _RECEIVED[node.op](n), links, "link"
        else:
            nbytes, limit, what = io_bytes(graph, node), memory, "memory"
        if nbytes <= 0:
            continue
        seconds = cost(node)
        if seconds * limit < nbytes * (1 - 1e-9):
            rate = nbytes / seconds / 1e9 if seconds > 0 else float("inf")
            out.append(
                f"{node.op.value} {node.name!r} moves {nbytes:.4g} bytes in {seconds:.4g} s ({rate:.4g} GB/s), "
                f"over the device's {what} bandwidth of {limit / 1e9:.4g} GB/s"
            )
    return tuple(out)


def weight_grad_nodes(graph: Graph) -> set[int]:
    """Backward nodes that only feed weight gradients (zero-bubble schedules defer them)."""
    grads = set(graph.grads.values())
    users: dict[int, list[int]] = {}
    for n in graph:
        for i in n.inputs:
            users.setdefault(i, []).append(n.id)
    w: set[int] = set()
    for n in reversed(list(graph)):
        if n.phase is not Phase.BACKWARD:
            continue
        readers = [graph[u] for u in users.get(n.id, [])]
        grad_only = all(u.id in w or (u.op.is_collective and u.op is not OpKind.SEND) for u in readers)
        if n.id in grads or (readers and grad_only):
            w.add(n.id)
    return w


def _in_units(n: Node) -> bool:
    """Ops simulated inside a micro-batch's forward/backward; other collectives are timed apart."""
    if n.phase is Phase.OPTIMIZER:
        return False
    return not isinstance(n.attrs, CollectiveAttrs) or n.attrs.role is Role.LAYER


def _units(graph: Graph, split_w: bool = False) -> tuple[list[tuple[list[Node], int]], ...]:
    """Split a stage into (nodes, repeat) units for forward, backward and weight-gradient work."""
    return _split_units(graph, split_w)[0]


def _split_units(
    graph: Graph, split_w: bool
) -> tuple[tuple[list[tuple[list[Node], int]], ...], tuple[set[int], ...], set[int]]:
    """:func:`_units`, with what placing appended nodes in them reads (:func:`_extended_parts`): the ids that
    descend from each kind's block and the weight-gradient nodes."""
    mult = next(iter(graph.repeats.values()), 1)
    replayed = graph.replayed(next(iter(graph.repeats))) if graph.partial_replay() else mult
    wset = weight_grad_nodes(graph) if split_w else set()
    fwd = [n for n in graph if n.phase is Phase.FORWARD and _in_units(n)]
    bwd = [n for n in graph if n.phase in (Phase.BACKWARD, Phase.RECOMPUTE) and _in_units(n) and n.id not in wset]
    wgt = [n for n in graph if n.id in wset and _in_units(n)]

    laters: list[set[int]] = []

    def split(nodes: list[Node]) -> list[tuple[list[Node], int]]:
        """(before the block, the block, after the block): 'after' descends from the block."""
        blocked = [graph.block_of(n) is not None for n in nodes]
        inside = [n for n, b in zip(nodes, blocked, strict=True) if b]
        later = {n.id for n in inside}
        for n in graph:  # graph order is topological: one sweep finds every descendant
            if n.id not in later and not later.isdisjoint(n.inputs):
                later.add(n.id)
        laters.append(later)
        outside = [n for n, b in zip(nodes, blocked, strict=True) if not b]
        return [
            ([n for n in outside if n.id not in later], 1),
            *_block_units(inside, mult, replayed),
            ([n for n in outside if n.id in later], 1),
        ]

    return (split(fwd), split(bwd), split(wgt)), tuple(laters), wset


def _block_units(inside: list[Node], mult: int, replayed: int) -> list[tuple[list[Node], int]]:
    """The repeated block's unit, or under ``full:N`` (``replayed`` of ``mult`` repetitions replay) two: backward
    runs the last layers first, so the ``mult - replayed`` that keep their activations come first, without the
    replayed forward, then the ``replayed`` first layers of the stage with it (``full:every-N`` replays the same
    count, spread: the sums are the same). Forward has no replayed nodes; none replayed: the one plain unit."""
    if replayed >= mult or not any(n.phase is Phase.RECOMPUTE for n in inside):
        return [(inside, mult)]
    plain = [n for n in inside if n.phase is not Phase.RECOMPUTE]
    return [(plain, mult - replayed), (inside, replayed)] if replayed else [(plain, mult)]


def block_units(units: Sequence[tuple[UnitTiming, int]]) -> Sequence[tuple[UnitTiming, int]]:
    """The repeated block's units of a before / block / after list: one, or two under partial recompute."""
    return units[1:-1]


def repeated(unit: UnitTiming, times: int) -> float:
    """``times`` back-to-back runs of a unit: steady-state periods, then the last one's tail."""
    if times <= 0:
        return 0.0
    return (times - 1) * unit.period + unit.duration


def repeated_total(units: Sequence[tuple[UnitTiming, int]]) -> float:
    """``sum(repeated(u, k) for u, k in units)``, each term computed as :func:`repeated` does and summed by the same
    ``sum``, without a call per unit (a search sums the units of every stage it lowers or derives)."""
    return sum((k - 1) * u.period + u.duration if k > 0 else 0.0 for u, k in units)


def lower_stage(
    stage: Stage, backend: Backend, where: dict[Axis, Placement], options: StepOptions, vstages: tuple[int, ...]
) -> StageCost:
    """Lower one (virtual) pipeline stage for one micro-batch; ``vstages`` are the stages it stands for.

    The micro-batch's units are timed on the stage graph before the stage-level passes when those
    added nothing to them (:func:`_unit_graph`): ZeRO 0, 1 and 2 differ only in the gradient
    reduction and the step tail, so the units are timed once for the three.
    """
    graph = stage.graph
    backend = for_program(backend, graph)  # a CPU rank's heap: what its whole program frees (the DP buckets too)
    overlap = backend.overlap()
    units_of = _unit_graph(stage)
    fwd_units, bwd_units, w_units = timed_units(units_of, backend, where, options)
    fwd = repeated_total(fwd_units)
    bwd = repeated_total(bwd_units)
    wgrad = repeated_total(w_units)
    b_units = len(bwd_units)
    if w_units[1][0].nodes:  # the weight-gradient units belong to the backward for breakdown and trace
        bwd_units = bwd_units + w_units

    buckets, step_end, opt, p2p_fwd, p2p_bwd = _stage_tail(stage, backend, where, options)
    dp_exposed, dp_busy, dp_copies = (
        dp_tail_times(buckets, bwd_units, options.overlap_dp, overlap.compute_slowdown, b_units)
        if buckets is not None
        else (0.0, 0.0, 0.0)
    )
    return StageCost(
        stage.index, stage.layers, fwd, bwd, wgrad, fwd_units, bwd_units, p2p_fwd, p2p_bwd,
        dp_exposed, dp_busy, dict(step_end), opt, graph, vstages, stage.base, dp_copies, b_units=b_units,
    )  # fmt: skip


def _stage_tail(
    stage: Stage, backend: Backend, where: dict[Axis, Placement], options: StepOptions
) -> tuple[BucketSeconds | None, dict[str, float], float, float, float]:
    """What :func:`lower_stage` reads of a stage besides its units: the gradient buckets' seconds (None without a
    gradient reduction), the step-end collectives' seconds by axis, the optimizer's, the pipeline sends' (forward,
    backward). A function of the stage graph, the backend, the placements and tp / sp (the sends' split), kept on
    the graph as one value: a search lowers each stage graph again for every schedule split and TP overlap, which
    change only its units."""
    graph = stage.graph
    key = ("stage-tail", stage.base, backend, where_key(where), options.tp, options.sp)

    def compute() -> tuple[BucketSeconds | None, dict[str, float], float, float, float]:
        cost = Coster(graph, backend, where)
        tail = _tail_of(stage)
        buckets = stage_bucket_seconds(stage, backend, where) if tail.grad_sync else None
        used = tuple((a, p) for a, p in where.items() if a in tail.step_end_axes)
        step_end = graph.derived(("step-end-s", backend, used), lambda: _step_end_seconds(tail.step_end, cost))
        opt = graph.derived(("optimizer-s", backend), lambda: sum(cost(n) for n in tail.optimizer))
        sends = (
            p2p_seconds(tail.sends_fwd, backend, where, options),
            p2p_seconds(tail.sends_bwd, backend, where, options),
        )
        return buckets, step_end, opt, *sends

    return graph.derived(key, compute)


def p2p_seconds(sends: tuple[int, ...], backend: Backend, where: dict[Axis, Placement], options: StepOptions) -> float:
    """Seconds of a stage's pipeline sends of these byte counts, in order (each transfer priced once)."""
    total = 0.0
    for nbytes in sends:
        # Megatron's scatter/gather: 1/tp over the network, all_gather in the node; with
        # sequence parallelism the activation is already split 1/tp.
        if options.tp > 1 and not options.sp:
            total += _collective_s(backend, OpKind.SEND, nbytes // options.tp, where[Axis.PP])
            total += _collective_s(backend, OpKind.ALL_GATHER, nbytes, where[Axis.TP])
        else:
            total += _collective_s(backend, OpKind.SEND, nbytes, where[Axis.PP])
    return total


def _collective_s(backend: Backend, kind: OpKind, nbytes: int, where: Placement) -> float:
    return _COSTS.get((backend, kind, nbytes, where), lambda: backend.collective_time_s(kind, nbytes, where))


def _step_end_seconds(nodes: list[Node], cost: Coster) -> dict[str, float]:
    """Seconds of the step-end collectives by axis, all exposed. Known gap: Megatron-Core's distributed optimizer
    with ``overlap_param_gather`` (NeMo 2.0's recipes) runs its parameter all-gather under the next step's forward;
    hiding it here was measured and not selected (benchmarks/nemo_docs_other_rows.md)."""
    step_end: dict[str, float] = {}
    for n in nodes:
        axis = _axis(n).value  # type: ignore[union-attr]
        step_end[axis] = step_end.get(axis, 0.0) + cost(n)
    return step_end


class TailOf(NamedTuple):
    """What lowering reads of a stage's pipeline sends and step tail (kept on the stage graph)."""

    sends_fwd: tuple[int, ...]  # bytes of each forward pipeline send, in graph order
    sends_bwd: tuple[int, ...]  # ... backward and recompute
    grad_sync: list[Node]
    step_end: list[Node]
    optimizer: list[Node]
    grad_axes: frozenset[Axis]
    step_end_axes: frozenset[Axis]


def _tail_of(stage: Stage) -> TailOf:
    return stage.graph.derived(("tail-of", stage.base), lambda: _make_tail_of(stage))


def _make_tail_of(stage: Stage) -> TailOf:
    tail = _tail_nodes(stage)

    def sends(phases: tuple[Phase, ...]) -> tuple[int, ...]:
        return tuple(
            n.out.nbytes for n in tail if n.op is OpKind.SEND and n.phase in phases and _role(n) is Role.PIPELINE
        )

    grad_sync, step_end, optimizer = _split_tail(tail)
    return TailOf(
        sends((Phase.FORWARD,)), sends((Phase.BACKWARD, Phase.RECOMPUTE)), grad_sync, step_end, optimizer,
        frozenset(a for n in grad_sync if (a := _axis(n)) is not None),
        frozenset(a for n in step_end if (a := _axis(n)) is not None),
    )  # fmt: skip


def stage_bucket_seconds(stage: Stage, backend: Backend, where: dict[Axis, Placement]) -> BucketSeconds:
    """:func:`dp_bucket_seconds` of a stage's gradient reductions, kept on its graph by the placements of the
    axes they run on (the only ones they read)."""
    tail, graph = _tail_of(stage), stage.graph
    used = tuple((a, p) for a, p in where.items() if a in tail.grad_axes)
    return graph.derived(
        ("bucket-s", backend, used), lambda: dp_bucket_seconds(graph, tail.grad_sync, Coster(graph, backend, where))
    )


def timed_units(
    graph: Graph, backend: Backend, where: dict[Axis, Placement], options: StepOptions
) -> tuple[list[tuple[UnitTiming, int]], list[tuple[UnitTiming, int]], list[tuple[UnitTiming, int]]]:
    """:func:`time_units`, kept on ``graph`` by the placements of the axes its units' collectives run on (the
    only ones it reads): layouts that place other axes differently (pp, dp) share it."""
    split_w = options.schedule.split_backward
    parts = unit_parts(graph, split_w)
    axes = graph.derived(("unit-axes", split_w), lambda: frozenset(a for kind in parts for p in kind for a in p.axes))
    used = tuple((a, p) for a, p in where.items() if a in axes)
    key = ("timed-units", backend, used, options.tp_overlap, split_w)

    def compute() -> tuple[list[tuple[UnitTiming, int]], ...]:
        ref = _units_of(graph)
        if ref is graph:
            return time_units(graph, backend, where, options)
        # a graph holding another's nodes under other repeat counts (:func:`share_nodes`, a search's stage depths):
        # its units are that one's with the block's repeat changed (:func:`unit_parts`), and a unit's timing is read
        # from its ops alone (time_units' cache), told in the same node ids: that one's timings with this graph's
        # repeats, timed once for every depth that shares the nodes
        shared = timed_units(ref, backend, where, options)
        return tuple([(u, p.repeat) for (u, _), p in zip(kind, own, strict=True)]
                     for kind, own in zip(shared, parts, strict=True))  # fmt: skip

    return graph.derived(key, compute)  # type: ignore[return-value]


def time_units(
    graph: Graph, backend: Backend, where: dict[Axis, Placement], options: StepOptions
) -> tuple[list[tuple[UnitTiming, int]], list[tuple[UnitTiming, int]], list[tuple[UnitTiming, int]]]:
    """The timed (unit, repeat) lists of one micro-batch's forward, backward and deferred weight gradients."""
    cost = Coster(graph, backend, where)
    overlap = backend.overlap()
    split_w = options.schedule.split_backward
    parts = unit_parts(graph, split_w)

    heads: dict[tuple[frozenset[Axis], bool], HashedKey] = {}

    def head(part: _UnitPart, chunks: bool) -> HashedKey:
        # (the backend, the placements its collectives are priced on, overlap, chunking) hashed once per such set
        known = heads.get((part.axes, chunks))
        if known is None:
            used = tuple((a, p) for a, p in where.items() if a in part.axes)
            known = heads[part.axes, chunks] = HashedKey((backend, used, overlap, chunks))
        return known

    def simulate(part: _UnitPart, chunks: bool) -> UnitTiming:
        nodes = part.nodes
        chunked = _pipelined(part) if chunks else set()
        if chunks and not chunked:  # no matmul next to a TP collective: it times as without TP overlap (and is kept so)
            return _UNITS.get((head(part, False), part.key), lambda: simulate(part, False))
        base = _part_costs(part, cost, where)
        kernel = compiled_unit()
        arrays = _unit_arrays(part) if kernel is not None else None
        if kernel is not None and arrays is not None:  # the same timing, compiled (streams.simulate_compiled)
            return simulate_compiled(kernel, arrays, nodes, base, overlap, chunked)
        if part.prefix is not None:  # ZeRO-3's gathers after a layer's ops: resume the layer's first pass
            done = _first_pass(part.prefix, cost, where, chunks).extended(
                nodes[len(part.prefix.nodes) :], cost, chunked, base
            )
        else:
            done = FirstPass.of(nodes, cost, chunked, base)
        return simulate_unit(graph, nodes, cost, overlap, chunked, done, _categories(part))

    def sim(part: _UnitPart) -> UnitTiming:
        # A unit's timing is a function of its ops (kind, attributes, shapes, phase and which of them
        # read which: not their ids or names), the shapes they read from outside it (kernel bytes),
        # the backend, placements, overlap and TP overlap: stage graphs of layouts that differ elsewhere (dp,
        # schedule, another pipeline split, another stage of the same pipeline) share it, and a unit TP overlap
        # chunks nothing in shares the timing without TP overlap.
        tp_overlap = options.tp_overlap
        h = head(part, tp_overlap)
        # the timing told in this part's nodes, kept on the part by the head (what it reads besides the part's ops:
        # a part is timed again for every other schedule split or TP overlap of its stage graph, and for every stage
        # graph that shares its units), so a repeat skips the lookup and the renaming
        timed = part.passes.get(("timed", h))
        if timed is None:
            timed = _rebind(_UNITS.get((h, part.key), lambda: simulate(part, tp_overlap)), part.nodes, part.ids)
            part.passes["timed", h] = timed
        return timed

    return tuple([(sim(part), part.repeat) for part in kind] for kind in parts)  # type: ignore[return-value]


class _UnitKey(HashedKey):
    """A unit's nodes and the shapes it reads from outside, hashed once (a search looks a unit up many times)."""

    __slots__ = ()

    def flat(self) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """(ops, shapes read from outside) of the whole unit, for a key built by :func:`_extended_parts` too."""
        if len(self.value) == 3:
            base, ops, outside = self.value
            head, read = base.flat()
            return head + ops, read + outside
        return self.value  # type: ignore[return-value]


@dataclass(frozen=True)
class _UnitPart:
    nodes: list[Node]
    repeat: int
    key: _UnitKey
    axes: frozenset[Axis]
    # each node id -> its position in ``nodes`` (the last, where an id repeats), made with the key: the units that
    # extend this one (:func:`_extended_parts`) and its arrays (:func:`_unit_arrays`) read it, never change it
    positions: dict[int, int] = field(compare=False, repr=False)
    # a unit that appends ops to another's (:func:`_extended_parts`): that unit, whose nodes begin this one's
    prefix: _UnitPart | None = None
    # this unit's first scheduling passes (:func:`_first_pass`), for the units that extend it, and its op costs
    # (:func:`_part_costs`), by what they read
    passes: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    @cached_property
    def ids(self) -> tuple[int, ...]:
        """Its nodes' ids, in order (what a cached timing is told in, :func:`_rebind`)."""
        return tuple(n.id for n in self.nodes)


def _first_pass(part: _UnitPart, cost: Coster, where: dict[Axis, Placement], tp_overlap: bool) -> FirstPass:
    """``part``'s first pass (:class:`~echosim.timeline.streams.FirstPass`), kept on it by what it reads: the
    backend and the placements of its collectives' axes (its op costs) and whether TP overlap chunks its
    GEMMs (its pipelined edges); the node objects are ``part``'s own, so their ids are the extending unit's."""
    used = tuple((a, p) for a, p in where.items() if a in part.axes)
    key = (cost.backend, used, tp_overlap)
    done = part.passes.get(key)
    if done is None:
        chunked = _pipelined(part) if tp_overlap else set()
        done = part.passes[key] = FirstPass.of(part.nodes, cost, chunked, _part_costs(part, cost, where))
    return done


def _pipelined(part: _UnitPart) -> set[tuple[int, int]]:
    """:func:`~echosim.timeline.streams.pipelined_edges` of ``part``'s nodes, kept on it: a function of its nodes
    alone, asked again for each placement of its collectives' axes a search times it on with TP overlap. Read,
    never changed (list scheduling and :class:`~echosim.timeline.streams.UnitTiming` only test membership)."""
    known = part.passes.get("pipelined")
    if known is None:
        known = part.passes["pipelined"] = pipelined_edges(part.nodes)
    return known  # type: ignore[no-any-return]


def _categories(part: _UnitPart) -> list[str]:
    """Each node's :func:`~echosim.timeline.streams.category`, kept on the part: a function of its nodes alone,
    asked again for each placement of its collectives' axes and TP overlap a search times it on (GPT-3's full
    space: 13,462 unit simulations of 9,933 parts); a unit that extends another's takes that one's and those of
    its appended nodes. Read, never changed."""
    known = part.passes.get("categories")
    if known is None:
        head = _categories(part.prefix) if part.prefix is not None else []
        known = part.passes["categories"] = head + [op_category(n) for n in part.nodes[len(head) :]]
    return known  # type: ignore[no-any-return]


def _unit_arrays(part: _UnitPart) -> UnitArrays | None:
    """``part``'s :class:`~echosim.timeline.streams.UnitArrays`, kept on it: a function of its nodes alone, read by
    every placement of its collectives' axes and TP-overlap setting a search simulates it on (None: it repeats a
    node id, and is simulated by the Python path)."""
    if "arrays" not in part.passes:
        part.passes["arrays"] = UnitArrays.of(part.nodes, _categories(part), part.positions)
    return part.passes["arrays"]  # type: ignore[no-any-return]


def _part_costs(part: _UnitPart, cost: Coster, where: dict[Axis, Placement]) -> dict[int, float]:
    """Each op's undilated seconds in ``part`` (node id -> ``cost(node)``), kept on it by what they read: the backend
    and the placements of its collectives' axes. A unit is timed with and without TP overlap (two heads of
    :data:`_UNITS`, two first passes of a prefix) on the same op costs; a ZeRO-3 unit's are its prefix's and the
    appended ops'. Read, never changed (:meth:`~echosim.timeline.streams.FirstPass.extended`)."""
    used = tuple((a, p) for a, p in where.items() if a in part.axes)
    key = ("costs", cost.backend, used)
    known = part.passes.get(key)
    if known is None:
        if part.prefix is not None:
            known = dict(_part_costs(part.prefix, cost, where))
            known.update({n.id: cost(n) for n in part.nodes[len(part.prefix.nodes) :]})
        else:
            known = {n.id: cost(n) for n in part.nodes}
        part.passes[key] = known
    return known


def share_nodes(graph: Graph, ref: Graph) -> None:
    """Tell ``graph`` that it holds ``ref``'s nodes (the same objects, in order) with only its repeat counts
    changed: its units are then ``ref``'s with the repeated block's count changed (:func:`unit_parts`)."""
    same = graph.nodes.keys() == ref.nodes.keys() and all(a is b for a, b in zip(graph, ref, strict=True))
    if not same or graph.repeats.keys() != ref.repeats.keys() or (
        graph.inputs, graph.outputs, graph.grads, graph.block_layers
    ) != (ref.inputs, ref.outputs, ref.grads, ref.block_layers):  # fmt: skip
        raise ValueError("share_nodes: the graphs differ in more than their repeat counts")
    graph.derived(SAME_NODES, lambda: ref)


#: :meth:`Graph.derived` key of a graph whose units are another's under other repeat counts, though it holds
#: copies of some of that one's nodes, not the same objects (:func:`share_units`): its units are read from that one.
SAME_UNITS = "same-units-as"


def share_units(stage: Stage, ref: Stage) -> bool:
    """Tell ``stage``'s graph that its units are ``ref``'s with the repeated block's count changed, when they are
    and both run units on their own graphs (nodes appended in the units, :func:`_unit_graph`); say whether.

    A search's ZeRO-3 / FSDP stage graphs at depths 2 and 3 (the same stage-level passes on bases that hold
    depth 1's nodes, :func:`share_nodes`) append equal per-layer gathers and reduce-scatters, but as new node
    objects, and an optimizer step sized by the depth. :func:`_extended_parts` splits both alike: the base nodes
    are the same objects; each appended node has the same id, op, inputs, phase and scope (what placing it
    reads); each that runs in a unit is equal field by field, and so are the nodes it reads (its unit key and the
    shapes it reads from outside, :func:`_unit_parts`). A unit's timing is a function of those
    (:func:`time_units`), told in the same ids and names, so ``ref``'s timings are ``stage``'s."""
    graph, other = stage.graph, ref.graph
    if stage.base is None or ref.base is None or other.derived(SAME_UNITS, lambda: other) is not other:
        return False
    if _unit_graph(stage) is not graph or _unit_graph(ref) is not other:
        return False
    if stage.base.derived(SAME_NODES, lambda: stage.base) is not ref.base.derived(SAME_NODES, lambda: ref.base):
        return False
    if graph.repeats.keys() != other.repeats.keys():
        return False
    if (graph.inputs, graph.outputs, graph.grads, graph.block_layers) != (
        other.inputs, other.outputs, other.grads, other.block_layers
    ):  # fmt: skip
        return False
    ours, theirs = added_nodes(graph, stage.base), added_nodes(other, ref.base)
    if ours is None or theirs is None or len(ours) != len(theirs):
        return False
    for n, m in zip(ours, theirs, strict=True):
        placed = (n.id, n.op, n.inputs, n.phase, n.scope, _in_units(n))
        if placed != (m.id, m.op, m.inputs, m.phase, m.scope, _in_units(m)):
            return False
        if _in_units(n) and (n != m or any(graph[i] != other[i] for i in n.inputs)):
            return False
    return graph.derived(SAME_UNITS, lambda: other) is other


def _units_of(graph: Graph) -> Graph:
    """The graph whose units ``graph``'s are (:func:`share_nodes`, :func:`share_units`), or ``graph`` itself."""
    ref = graph.derived(SAME_NODES, lambda: graph)
    return ref if ref is not graph else graph.derived(SAME_UNITS, lambda: graph)


def unit_parts(graph: Graph, split_w: bool) -> tuple[list[_UnitPart], ...]:
    """:func:`_units` with each unit's cache key and the axes its collectives run on, kept on ``graph``; a
    graph that shares another's nodes (:func:`share_nodes`) takes that one's with its own repeat count."""

    def compute() -> tuple[list[_UnitPart], ...]:
        ref = _units_of(graph)
        if ref is graph:
            base = graph.derived(_EXTENDS, lambda: None)
            parts = _extended_parts(graph, base, split_w) if base is not None else None
            return parts if parts is not None else _unit_parts(graph, split_w)
        mult = next(iter(graph.repeats.values()), 1)  # as _units reads it: the block unit's repeat
        return tuple([replace(p, repeat=mult) if k == 1 else p for k, p in enumerate(kind)]
                     for kind in unit_parts(ref, split_w))  # fmt: skip

    return graph.derived(("unit-parts", split_w), compute)


def _unit_parts(graph: Graph, split_w: bool) -> tuple[list[_UnitPart], ...]:
    """:func:`_units` with each unit's cache key and the axes its collectives run on (once per graph)."""

    def part(nodes: list[Node], repeat: int) -> _UnitPart:
        at = {n.id: k for k, n in enumerate(nodes)}
        outside = tuple(graph[i].out for n in nodes for i in n.inputs if i not in at)
        axes = frozenset(n.attrs.axis for n in nodes if isinstance(n.attrs, CollectiveAttrs))
        # Each op by what simulating it reads: an input inside the unit by its position, one outside as -1
        # (its shape is in ``outside``); ids, names and scopes differ between stage graphs of one layer.
        ops = tuple((n.op, n.attrs, n.out, n.phase, tuple(at.get(i, -1) for i in n.inputs)) for n in nodes)
        return _UnitPart(nodes, repeat, _UnitKey((ops, outside)), axes, at)

    # the split kept on the graph: :func:`_extended_parts` reads it again for the graphs that extend this one
    split = graph.derived(("unit-split", split_w), lambda: _split_units(graph, split_w))[0]
    return tuple([part(nodes, k) for nodes, k in kind] for kind in split)


#: :meth:`Graph.derived` key of a graph that holds another's nodes and appends some of its own that run in the
#: units (ZeRO-3 / FSDP's per-layer weight gathers and gradient reduce-scatters, :func:`_unit_graph`).
_EXTENDS = "extends-units-of"


def _extended_parts(graph: Graph, base: Graph, split_w: bool) -> tuple[list[_UnitPart], ...] | None:
    """:func:`_unit_parts` of a graph that appends nodes to ``base``'s, from ``base``'s units: each unit is
    ``base``'s with the appended nodes that fall in it after its own (graph order), keyed by ``base``'s key and
    the appended ops (the same information as :func:`_unit_parts`'s key, hashed over the appended ops only).

    Appended nodes read no node after them and no node reads them, so ``base``'s nodes split as before and
    each appended one falls where :func:`_units` puts it (by phase, block and descent from the block). With
    the backward split (``split_w``) an appended reader could make a node a weight-gradient one: there only
    nodes that read gradients alone (weight-gradient nodes already) and are no gradient are placed here;
    None (a split of the whole graph) otherwise."""
    added = added_nodes(graph, base)
    if added is None or graph.repeats != base.repeats or graph.grads != base.grads or base.partial_replay():
        return None  # (full:N's two block units: the whole graph is split)
    new = {n.id for n in added}
    grads = set(graph.grads.values())
    if split_w and any(n.id in grads or any(i in new or i not in grads for i in n.inputs) for n in added):
        return None
    parts = unit_parts(base, split_w)
    # which ids descend from each kind's block reads no repeat count: a base holding another's nodes under other
    # repeat counts (:func:`share_nodes`, whose units are that one's) takes that one's split
    ref = base.derived(SAME_NODES, lambda: base)
    _, laters, _ = ref.derived(("unit-split", split_w), lambda: _split_units(ref, split_w))
    more: list[set[int]] = [set(), set(), set()]  # appended ids that descend from each kind's block
    placed: list[list[list[Node]]] = [[[], [], []] for _ in range(3)]
    for n in added:
        kind = None
        if _in_units(n):
            if n.phase is Phase.FORWARD:
                kind = 0
            elif n.phase in (Phase.BACKWARD, Phase.RECOMPUTE):
                kind = 1  # no appended node is a weight-gradient one (checked above where it matters)
        inside = graph.block_of(n) is not None
        for k in range(3):
            if (kind == k and inside) or not (laters[k].isdisjoint(n.inputs) and more[k].isdisjoint(n.inputs)):
                more[k].add(n.id)
        if kind is not None:
            placed[kind][1 if inside else 2 if n.id in more[kind] else 0].append(n)
    out: list[list[_UnitPart]] = []
    for k, kind_parts in enumerate(parts):
        row = []
        for j, p in enumerate(kind_parts):
            extra = placed[k][j]
            if not extra:
                row.append(p)
                continue
            at = dict(p.positions)  # the base unit's positions, copied in C, and the appended nodes'
            at.update({n.id: len(p.nodes) + q for q, n in enumerate(extra)})
            ops = tuple((n.op, n.attrs, n.out, n.phase, tuple(at.get(i, -1) for i in n.inputs)) for n in extra)
            outside = tuple(graph[i].out for n in extra for i in n.inputs if i not in at)
            axes = p.axes | frozenset(n.attrs.axis for n in extra if isinstance(n.attrs, CollectiveAttrs))
            row.append(_UnitPart(p.nodes + extra, p.repeat, _UnitKey((p.key, ops, outside)), axes, at, p))
        out.append(row)
    return tuple(out)


def _rebind(timing: UnitTiming, nodes: list[Node], ids: tuple[int, ...] | None = None) -> UnitTiming:
    """``timing`` of a unit simulated on other nodes of the same ops, told in ``nodes``' ids and names
    (the trace, the critical path and the costed graph read a unit's events by node id); ``ids``: theirs."""
    ids = tuple(n.id for n in nodes) if ids is None else ids
    if timing.nodes == ids:
        return timing
    return _Rebound(timing, nodes, ids)


class _Rebound(UnitTiming):
    """:func:`_rebind`'s timing: its events and chunked edges are renamed when first read (a search's ranking
    reads only the durations and busy times of most of the units it times)."""

    def __init__(self, timing: UnitTiming, nodes: list[Node], ids: tuple[int, ...]) -> None:
        self.duration, self.busy, self.critical_end, self.nodes, self.carry = (
            timing.duration,
            dict(timing.busy),
            timing.critical_end,
            ids,
            timing.carry,
        )
        self._source = (timing, nodes)

    def __getattr__(self, name: str) -> Any:
        source = self.__dict__.get("_source")
        if name not in ("events", "chunked") or source is None:
            raise AttributeError(name)
        timing, nodes = source
        new = dict(zip(timing.nodes, nodes, strict=True))
        events = []
        for e in timing.events:
            n = new[e.node]
            events.append(OpEvent(n.id, n.name or n.op.value, e.stream, e.start, e.duration, e.category, e.base))
        self.events = events
        self.chunked = frozenset((new[a].id, new[b].id) for a, b in timing.chunked)
        del self._source
        return getattr(self, name)

    def __eq__(self, other: object) -> bool:
        """As :class:`UnitTiming`'s: field by field (a rebound timing equals a plain one of the same fields)."""
        if not isinstance(other, UnitTiming):
            return NotImplemented
        return _fields(self) == _fields(other)

    __hash__ = None  # type: ignore[assignment]


def _fields(t: UnitTiming) -> tuple[Any, ...]:
    return (t.duration, t.busy, t.events, t.critical_end, t.nodes, t.chunked, t.carry)


def _unit_graph(stage: Stage) -> Graph:
    """The graph whose units ``stage`` runs: its graph before the stage-level passes when those only
    appended nodes outside the units (their collectives and optimizer step are timed apart), else its own.
    Kept on the stage graph (a search lowers each stage graph for every schedule and TP overlap)."""
    base = stage.base
    return stage.graph.derived(("unit-graph", base), lambda: _find_unit_graph(stage))


def _find_unit_graph(stage: Stage) -> Graph:
    added = added_nodes(stage.graph, stage.base)
    if added is None:
        return stage.graph
    if any(_in_units(n) for n in added):
        base = stage.base
        stage.graph.derived(_EXTENDS, lambda: base)  # its units are the base's and the appended nodes
        return stage.graph
    return stage.base  # type: ignore[return-value]


def _tail_nodes(stage: Stage) -> list[Node]:
    """The nodes the step tail and the pipeline transfers read, in graph order: the base graph's (kept on
    it) then those the stage-level passes appended, when they only appended."""
    added = added_nodes(stage.graph, stage.base)
    if added is None or stage.base is None:
        return [n for n in stage.graph if _in_tail(n)]
    base = stage.base
    return base.derived("tail-nodes", lambda: [n for n in base if _in_tail(n)]) + [n for n in added if _in_tail(n)]


def _in_tail(n: Node) -> bool:
    """A pipeline send, a gradient reduction, a step-end collective or the optimizer step."""
    return n.op is OpKind.SEND or n.op is OpKind.OPTIMIZER_UPDATE or _role(n) in (Role.GRAD_SYNC, Role.STEP_END)


def _role(node: Node) -> Role | None:
    return node.attrs.role if isinstance(node.attrs, CollectiveAttrs) else None


def _axis(node: Node) -> Axis | None:
    return node.attrs.axis if isinstance(node.attrs, CollectiveAttrs) else None


def tail_parts(stage: Stage) -> tuple[list[Node], list[Node], list[Node]]:
    """What :func:`lower_stage` reads of a stage's step tail, in its order: the gradient reductions (dense
    buckets, then the experts'), the step-end collectives, the optimizer steps."""
    t = _tail_of(stage)
    return t.grad_sync, t.step_end, t.optimizer


def _split_tail(tail: list[Node]) -> tuple[list[Node], list[Node], list[Node]]:
    grad_sync = [n for n in tail if _role(n) is Role.GRAD_SYNC and n.phase is Phase.BACKWARD]
    grad_sync.sort(key=lambda n: _axis(n) is Axis.EDP)  # dense buckets, then the experts' share
    step_end = [n for n in tail if n.phase is Phase.OPTIMIZER and _role(n) is Role.STEP_END]
    return grad_sync, step_end, [n for n in tail if n.op is OpKind.OPTIMIZER_UPDATE]


class BucketSeconds(NamedTuple):
    """Seconds of a stage's gradient reductions and of PyTorch DDP's copies around them
    (:meth:`Coster.bucket_copies`: into the buckets, back after): one layer's, inside the
    repeated block, and the rest's."""

    per_layer: float
    rest: float
    into_layer: float = 0.0
    into_rest: float = 0.0
    back_layer: float = 0.0
    back_rest: float = 0.0
    # PyTorch DDP's buckets (CollectiveAttrs.ready), in the order they are reduced: (ready, its last gradient's
    # node, seconds) each; and the copies into the buckets of the gradients ready before the block (into_rest
    # holds them and the end's)
    ddp: tuple[tuple[int, int, float], ...] = ()
    into_head: float = 0.0


def dp_bucket_seconds(graph: Graph, nodes: list[Node], cost: Coster) -> BucketSeconds:
    """Seconds of the gradient reductions (and DDP's copies) inside the repeated block (one layer's) and of the rest."""
    if any(_ddp_bucket(n) for n in nodes):
        return _ddp_bucket_seconds(graph, nodes, cost)
    sums = {True: [0.0, 0.0, 0.0], False: [0.0, 0.0, 0.0]}  # in the block or not: reduction, into, back
    # the buckets of one scope are equal but for their names (one output and one attributes object for all,
    # passes.data_parallel), and a collective's seconds and copies read its kind, attributes, output and inputs
    # alone: a bucket like the one before it reuses its terms, added one by one in order as before (the same floats)
    prev: Node | None = None
    terms: tuple[float, float, float, list[float]] = (0.0, 0.0, 0.0, sums[False])
    for n in nodes:
        if not (twin_of(prev, n) and n.scope == prev.scope and n.op.is_collective):  # type: ignore[union-attr]
            into, back = cost.bucket_copies(n)
            terms = (cost(n), into, back, sums[graph.block_of(n) is not None])
        prev = n
        seconds, into, back, part = terms
        part[0] += seconds
        part[1] += into
        part[2] += back
    (per_layer, into_layer, back_layer), (rest, into_rest, back_rest) = sums[True], sums[False]
    return BucketSeconds(per_layer, rest, into_layer, into_rest, back_layer, back_rest)


def _ddp_bucket(n: Node) -> bool:
    return isinstance(n.attrs, CollectiveAttrs) and n.attrs.ready >= 0


def _ddp_bucket_seconds(graph: Graph, nodes: list[Node], cost: Coster) -> BucketSeconds:
    """:func:`dp_bucket_seconds` of PyTorch DDP's buckets (``CollectiveAttrs.ready``): each bucket's reduction
    with when it is ready, and the copies into the buckets split by where in the backward their gradients
    become ready (before the block, one repetition of it, after it: passes.data_parallel.ddp_ready_order), as
    they stretch the backward there. Every reduction is outside the block (``per_layer`` 0). The buckets
    span layers, so they change with the depth: a layout search's stages derived from depths 2 and 3
    (fast_eval) see different buckets there and take the full path."""
    from echosim.passes.data_parallel import ddp_ready_order

    ddp = [n for n in nodes if _ddp_bucket(n)]
    buckets = tuple((n.attrs.ready, n.inputs[-1], cost(n)) for n in ddp)  # type: ignore[union-attr]
    copies = [n for n in ddp if n.attrs.bucket_copy]  # type: ignore[union-attr]
    if not copies:
        return BucketSeconds(0.0, sum(s for _, _, s in buckets), ddp=buckets)
    before, block, after = graph.derived("ddp-ready-order", lambda: ddp_ready_order(graph))
    dtype = copies[0].out.dtype
    reduced = {i for n in copies for i in n.inputs}

    def into(params: list[int], fn: str = "mul") -> float:  # mul_out(view, grad, 1/world), or grad.copy_(view)
        return sum(cost._copy_s(fn, graph[p].out.numel, dtype) for p in params if graph.grads[p] in reduced)

    into_head, into_layer, into_end = into(before), into(block), into(after)
    back_layer, back_rest = into(block, "copy"), into(before, "copy") + into(after, "copy")
    return BucketSeconds(0.0, sum(s for _, _, s in buckets), into_layer, into_head + into_end, back_layer, back_rest,
                         buckets, into_head)  # fmt: skip


def dp_tail_times(
    b: BucketSeconds, bwd_units: list[tuple[UnitTiming, int]], overlap_dp: bool, slowdown: float, b_units: int = 3
) -> tuple[float, float, float]:
    """The gradient reduction's exposed seconds after the last backward, its busy time and the seconds of
    DDP's bucket copies (:meth:`Coster.bucket_copies`), given the seconds of one layer's buckets and of
    the rest (the layer count is the block units' repeats): a layout search derives a stage of any depth
    from these. ``b_units``: the backward units before the weight-gradient ones (:attr:`StageCost.b_units`).

    Buckets of the repeated block become ready one layer at a time during the last
    micro-batch's backward; the rest are ready when it ends. Compute that runs
    beside a bucket is slowed by ``slowdown``; that extra time counts as exposed.
    DDP's copies into the buckets run on the compute stream as each layer's gradients
    become ready (they stretch the last backward and delay the reductions); its copies
    back run after the reductions. Both count whole, apart from the exposed reduction.
    """
    units = bwd_units[:b_units]
    (first, _), blocks, (last, _) = units[0], block_units(units), units[-1]
    layers = sum(k for _, k in blocks)
    copies = (b.into_layer + b.back_layer) * layers + b.into_rest + b.back_rest
    if b.ddp:
        return _ddp_tail_times(b, first, blocks, last, overlap_dp, slowdown)
    run = sum(repeated(u, k) for u, k in blocks)
    total_bwd = first.duration + run + last.duration
    busy = b.per_layer * layers + b.rest
    if not overlap_dp:
        return busy, busy, copies
    total_bwd += b.into_layer * layers + b.into_rest  # the last backward with its copies into the buckets
    comm_end = 0.0
    overlapped = 0.0
    # the loop's invariants read once (the same operands: the same sums); a search runs this for every stage depth
    at, per_layer = first.duration, b.per_layer
    for block, count in blocks:
        step = block.period + b.into_layer
        for j in range(1, count + 1):
            start = max(at + j * step, comm_end)
            comm_end = start + per_layer
            overlapped += max(0.0, min(comm_end, total_bwd) - start)
        at += count * step
    comm_end = max(comm_end, total_bwd) + b.rest
    exposed = max(0.0, comm_end - total_bwd) + overlapped * (slowdown - 1.0)
    return exposed, busy, copies


def _ddp_tail_times(
    b: BucketSeconds,
    first: UnitTiming,
    blocks: Sequence[tuple[UnitTiming, int]],
    last: UnitTiming,
    overlap_dp: bool,
    slowdown: float,
) -> tuple[float, float, float]:
    """:func:`dp_tail_times` of PyTorch DDP's buckets. A bucket is ready when its last gradient is: the end of
    the op that writes it in the unit (and repetition of the block, ``CollectiveAttrs.ready``) that runs it
    (the unit's end where that op is not one of its events); its all_reduce starts then or when the bucket
    before it ends, whichever is later: the reducer launches buckets in their order (reducer.cpp
    ``mark_bucket_ready``: "Buckets are reduced in sequence"). The copies into the buckets stretch the
    backward where their gradients become ready (before the block, in each repetition, after it); a bucket
    launches after the copies of the unit its last gradient is in."""
    layers = sum(k for _, k in blocks)
    copies = (b.into_layer + b.back_layer) * layers + b.into_rest + b.back_rest
    busy = sum(s for _, _, s in b.ddp)
    if not overlap_dp:
        return busy, busy, copies
    run = sum(repeated(u, k) for u, k in blocks)
    start_block = first.duration + b.into_head
    start_last = start_block + run + b.into_layer * layers
    total_bwd = first.duration + run + last.duration + b.into_layer * layers + b.into_rest
    comm_end = overlapped = 0.0
    for ready, grad, sec in b.ddp:
        # its gradients' copies into it (mark_variable_ready) come before its launch: a unit's, where it ends
        if ready == 0:
            at = _event_end(first, grad) + b.into_head
        elif ready > layers:
            at = start_last + _event_end(last, grad) + b.into_rest - b.into_head
        else:
            at = _ready_in_blocks(blocks, ready, grad, start_block, b.into_layer)
        start = max(min(at, total_bwd), comm_end)
        comm_end = start + sec
        overlapped += max(0.0, min(comm_end, total_bwd) - start)
    exposed = max(0.0, comm_end - total_bwd) + overlapped * (slowdown - 1.0)
    return exposed, busy, copies


def _ready_in_blocks(
    blocks: Sequence[tuple[UnitTiming, int]], ready: int, grad: int, start: float, into_layer: float
) -> float:
    """When repetition ``ready`` (from 1, in backward order) of the block writes gradient ``grad``, its copies in."""
    before = 0
    for i, (block, count) in enumerate(blocks):
        step = block.period + into_layer
        if ready <= before + count or i == len(blocks) - 1:
            return start + (ready - before - 1) * step + _event_end(block, grad) + into_layer
        start += count * step
        before += count
    raise ValueError("a stage's backward without a block unit")


def _event_end(unit: UnitTiming, node: int) -> float:
    """When the op of ``node`` ends in one run of ``unit`` (its duration where the node is not one of its ops);
    the unit's ends by node kept on it."""
    ends = unit.__dict__.get("_ends")
    if ends is None:
        ends = unit.__dict__["_ends"] = {e.node: e.start + e.duration for e in unit.events}
    return ends.get(node, unit.duration)


def _shape_key(stage: Stage, last: int) -> tuple[bool, bool, int]:
    """Virtual stages with the same key lower identically: all the middle ones share one lowering."""
    return (stage.index == 0, stage.index == last, stage.layers)


def lower_stages(
    stages: Sequence[Stage], backend: Backend, where: dict[Axis, Placement], options: StepOptions
) -> list[StageCost]:
    """Every virtual stage lowered for one micro-batch, each distinct shape once."""
    last = len(stages) - 1
    shared: dict[tuple[bool, bool, int], tuple[int, ...]] = {}
    for s in stages:
        key = _shape_key(s, last)
        shared[key] = (*shared.get(key, ()), s.index)
    lowered: dict[tuple[bool, bool, int], StageCost] = {}
    costs = []
    for s in stages:
        key = _shape_key(s, last)
        if key not in lowered:
            lowered[key] = _lowered(s, backend, where, options, shared[key])
        costs.append(replace(lowered[key], index=s.index, layers=s.layers))
    if options.ep_overlap and not options.schedule.split_backward:
        costs = [_with_ep_overlap(c, backend, options) for c in costs]
    return costs


def _with_ep_overlap(cost: StageCost, backend: Backend, options: StepOptions) -> StageCost:
    """A chunk's backward less the EP all-to-all its steady-state pairs hide (:mod:`~echosim.timeline.ep_overlap`)."""
    from echosim.timeline.ep_overlap import stage_hidden

    rank = cost.index % options.pp  # DualPipe's two copies of a stage sit as far from their ends: one share
    overlap = backend.overlap()
    hidden = stage_hidden(cost.fwd_units, cost.units("B"), overlap, rank, options.pp, options.vpp, options.microbatches,
                          getattr(options.schedule, "paired", None))  # fmt: skip
    if hidden <= 0:
        return cost
    return replace(cost, bwd=cost.bwd - hidden, ep_hidden=hidden)


def _lowered(
    stage: Stage, backend: Backend, where: dict[Axis, Placement], options: StepOptions, vstages: tuple[int, ...]
) -> StageCost:
    """:func:`lower_stage`, kept on the stage graph by what lowering reads: layouts that share a stage
    graph, placements and these options (a search's schedules, a repeat compile) lower it once."""
    key = ("lowered", backend, tuple(where.items()), options.schedule.split_backward, options.tp, options.sp,
           options.tp_overlap, options.overlap_dp, stage.layers, vstages)  # fmt: skip
    return stage.graph.derived(key, lambda: lower_stage(stage, backend, where, options, vstages))


def step_plan(options: StepOptions) -> SchedulePlan:
    """The structure of the step's schedule for the batched composer (kept per schedule, pp, micro-batches and vpp)."""
    from echosim.timeline.composer import schedule_plan  # numpy: only a batch of layouts needs it

    s = options.schedule
    return schedule_plan(
        s.orders,
        options.pp,
        options.microbatches,
        options.vpp,
        s.split_backward,
        getattr(s, "fused_pairs", False),
        getattr(s, "columns", None),  # a plugin's schedule object may predate the field
    )


def schedule_inputs(costs: Sequence[StageCost], options: StepOptions) -> tuple[list[float], ...]:
    """What the schedule composer needs of each virtual stage: fwd, bwd, p2p out, and the deferred W."""
    wgrad = [s.wgrad for s in costs] if options.schedule.split_backward else []
    return ([s.fwd for s in costs], [s.bwd for s in costs], [s.p2p_fwd for s in costs],
            [s.p2p_bwd for s in costs], wgrad)  # fmt: skip


def assemble(costs: list[StageCost], schedule: ScheduleTiming | SequentialTiming, options: StepOptions) -> CostedGraph:
    """The costed graph of a step whose stages are lowered and whose schedule is timed."""
    return CostedGraph(costs, schedule, _tails(costs, schedule, options.pp), options.pp, options.microbatches)


def lower_step(
    stages: Sequence[Stage], backend: Backend, where: dict[Axis, Placement], options: StepOptions
) -> CostedGraph:
    """The one function that composes time: stages lowered (once per shape), scheduled, then the step tail.

    A layout search runs the same three steps, timing the schedules of many layouts in one batch with
    :mod:`~echosim.timeline.composer`; one layout is timed block by block (:mod:`~echosim.timeline.sequential`,
    the same numbers to the last bit, without importing numpy).
    """
    costs = lower_stages(stages, backend, where, options)
    fwd, bwd, p2p_fwd, p2p_bwd, wgrad = schedule_inputs(costs, options)
    s = options.schedule
    plan = order_plan(
        s.orders, options.pp, options.microbatches, options.vpp, s.split_backward, getattr(s, "fused_pairs", False)
    )
    key = (plan, tuple(fwd), tuple(bwd), tuple(p2p_fwd), tuple(p2p_bwd), tuple(wgrad))
    timed = _TIMED.get(key, lambda: time_orders(plan, fwd, bwd, p2p_fwd, p2p_bwd, wgrad or None))
    return assemble(costs, timed, options)


def _tails(costs: list[StageCost], schedule: ScheduleTiming | SequentialTiming, pp: int) -> list[TailTask]:
    """Per pipeline rank, after its last block: the exposed gradient reduction, step-end collectives, optimizer.

    The reduction that is exposed is the one of the chunk whose backward the rank runs last.
    """
    tails = []
    placed = chunks_by_rank(costs, schedule.plan.in_flight, pp)
    for r in range(pp):
        mine = placed[r]
        busy = sum(c.dp_busy for c in mine)
        t = schedule.rank_ends[r]
        for task, name, stream, category, sec in rank_tail(mine, costs[schedule.plan.rank_vstage[r]]):
            tails.append(TailTask(r, task, name, stream, category, t, sec, busy if task == "dp" else 0.0))
            t += sec
    return tails
