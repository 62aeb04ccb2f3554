"""The timeline composer: stage graphs + a backend -> a :class:`Report`.

Symmetry first: every TP/DP peer of a pipeline stage runs the same program, so one
representative rank per stage is simulated. A stage's micro-batch forward and
backward are simulated op by op (a repeated layer once, then scaled by its count);
the pipeline schedule composes those blocks across stages and micro-batches; the
data-parallel gradient all_reduce overlaps the last micro-batch's backward; the
optimizer step closes the step. Cost does not depend on the number of devices.
"""

from __future__ import annotations

from dataclasses import dataclass

from echosim.backends.base import Backend, Placement
from echosim.ir.graph import Graph, Node
from echosim.ir.ops import CollectiveAttrs, OpKind, Phase
from echosim.passes.flops import io_bytes
from echosim.plan import Cluster, Plan
from echosim.timeline.schedule import SPLIT_BACKWARD, BlockTime, compose, orders_for
from echosim.timeline.streams import UnitTiming, pipelined_edges, simulate_unit

# gradient reductions of the last micro-batch and step-end syncs are timed apart (DP tail)
_SKIP_IN_UNITS = {"dp", "embed"}


@dataclass
class StageTiming:
    """One virtual pipeline stage (a model chunk), timed for one micro-batch."""

    index: int
    layers: int
    fwd: float
    bwd: float  # the whole backward, or its input-gradient half when wgrad > 0
    wgrad: float
    fwd_units: list[tuple[UnitTiming, int]]  # (unit, times it runs per micro-batch)
    bwd_units: list[tuple[UnitTiming, int]]
    p2p_fwd: float
    p2p_bwd: float
    dp_exposed: float
    dp_busy: float
    step_end_comm: dict[str, float]  # axis -> seconds of collectives after the last backward
    optimizer: float

    @property
    def step_end(self) -> float:
        return sum(self.step_end_comm.values())


def placements(plan: Plan, cluster: Cluster) -> dict[str, Placement]:
    from echosim.backends.topology import megatron_placement

    sizes = {"tp": plan.tp, "dp": plan.dp, "pp": plan.pp}
    out = {axis: megatron_placement(axis, sizes, cluster.devices_per_node) for axis in sizes}
    out["fsdp"] = out["dp"]  # ZeRO-3 / FSDP shards over the data-parallel group
    pp = out["pp"]
    out["embed"] = Placement(2, min(2, pp.nodes), 1 if pp.nodes > 1 else 2, pp.concurrent_per_node)
    out.update(context_expert_placements(plan, cluster))
    return out


def context_expert_placements(plan: Plan, cluster: Cluster) -> dict[str, Placement]:
    """Axes that context and expert parallelism add, in Megatron-Core's rank order.

    Dense layers order ranks tp, cp, dp, pp, and reduce gradients over the dp x cp ranks
    of a stage. Expert layers order them tp, ep, edp, pp (cp folds into ep x edp): an EP
    group is ``ep`` ranks ``tp`` apart, its experts' data-parallel peers ``tp * ep`` apart.
    """
    from echosim.backends.topology import megatron_placement

    if plan.cp == 1 and plan.ep == 1:
        return {}
    dpn = cluster.devices_per_node
    dense = {"tp": plan.tp, "cp": plan.cp, "dp": plan.dp, "pp": plan.pp}
    out = {axis: megatron_placement(axis, dense, dpn) for axis in dense}
    out["dp"] = megatron_placement("dp", {"tp": plan.tp, "dp": plan.dp * plan.cp, "pp": plan.pp}, dpn)
    out["fsdp"] = out["dp"]
    expert = {"tp": plan.tp, "ep": plan.ep, "edp": max(1, plan.dp * plan.cp // plan.ep), "pp": plan.pp}
    out["ep"] = megatron_placement("ep", expert, dpn)
    out["edp"] = out["efsdp"] = megatron_placement("edp", expert, dpn)
    return out


class _Coster:
    def __init__(self, graph: Graph, backend: Backend, where: dict[str, Placement]) -> None:
        self.graph, self.backend, self.where = graph, backend, where

    def __call__(self, node: Node) -> float:
        if node.op in (OpKind.VIEW, OpKind.INPUT, OpKind.PARAMETER):
            return 0.0
        if node.op.is_collective:
            assert isinstance(node.attrs, CollectiveAttrs)
            if node.attrs.size <= 1:
                return 0.0
            return self.backend.collective_time_s(node.op, node.attrs.bytes, self.where[node.attrs.axis])
        return self.backend.op_time_s(node, io_bytes(self.graph, node))


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


def _units(graph: Graph, split_w: bool = False) -> tuple[list[tuple[list[Node], int]], ...]:
    """Split a stage into (nodes, repeat) units for forward, backward and weight-gradient work."""

    def runs(n: Node) -> bool:
        if n.phase is Phase.OPTIMIZER:
            return False
        if not isinstance(n.attrs, CollectiveAttrs):
            return True
        if n.op in (OpKind.SEND, OpKind.RECV) and n.attrs.axis == "pp":
            return False  # pipeline transfers are composed by the schedule
        # the experts' share of the gradient reduction runs in the DP tail too
        return n.attrs.axis not in _SKIP_IN_UNITS and n.attrs.axis != "edp"

    mult = next(iter(graph.repeats.values()), 1)
    wset = weight_grad_nodes(graph) if split_w else set()
    fwd = [n for n in graph if n.phase is Phase.FORWARD and runs(n)]
    bwd = [n for n in graph if n.phase in (Phase.BACKWARD, Phase.RECOMPUTE) and runs(n) and n.id not in wset]
    wgt = [n for n in graph if n.id in wset and runs(n)]

    def split(nodes: list[Node]) -> list[tuple[list[Node], int]]:
        """(before the block, the block, after the block): 'after' descends from the block."""
        inside = [n for n in nodes if graph.block_of(n) is not None]
        later = {n.id for n in inside}
        for n in graph:  # graph order is topological: one sweep finds every descendant
            if n.id not in later and any(i in later for i in n.inputs):
                later.add(n.id)
        outside = [n for n in nodes if graph.block_of(n) is None]
        return [
            ([n for n in outside if n.id not in later], 1),
            (inside, mult),
            ([n for n in outside if n.id in later], 1),
        ]

    return split(fwd), split(bwd), split(wgt)


def time_stage(
    index: int, layers: int, graph: Graph, backend: Backend, where: dict[str, Placement], plan: Plan
) -> StageTiming:
    cost = _Coster(graph, backend, where)
    overlap = backend.overlap()
    fwd_parts, bwd_parts, w_parts = _units(graph, split_w=plan.schedule in SPLIT_BACKWARD)

    def sim(nodes: list[Node]) -> UnitTiming:
        chunked = pipelined_edges(nodes) if plan.tp_overlap else None
        return simulate_unit(graph, nodes, cost, overlap, chunked)

    fwd_units = [(sim(nodes), k) for nodes, k in fwd_parts]
    bwd_units = [(sim(nodes), k) for nodes, k in bwd_parts]
    w_units = [(sim(nodes), k) for nodes, k in w_parts]
    fwd = sum(repeated(u, k) for u, k in fwd_units)
    bwd = sum(repeated(u, k) for u, k in bwd_units)
    wgrad = sum(repeated(u, k) for u, k in w_units)
    if w_parts[1][0]:  # the weight-gradient units belong to the backward for breakdown and trace
        bwd_units = bwd_units + w_units

    def p2p(phase: Phase) -> float:
        sends = [n for n in graph if n.op is OpKind.SEND and n.phase in _phases(phase) and _on(n, "pp")]
        total = 0.0
        for n in sends:
            nbytes = n.out.nbytes
            # Megatron's scatter/gather: 1/tp over the network, all_gather in the node; with
            # sequence parallelism the activation is already split 1/tp.
            if plan.tp > 1 and not plan.sp:
                total += backend.collective_time_s(OpKind.SEND, nbytes // plan.tp, where["pp"])
                total += backend.collective_time_s(OpKind.ALL_GATHER, nbytes, where["tp"])
            else:
                total += backend.collective_time_s(OpKind.SEND, nbytes, where["pp"])
        return total

    dp_nodes = [
        n for n in graph if isinstance(n.attrs, CollectiveAttrs) and n.attrs.axis == "dp" and n.phase is Phase.BACKWARD
    ]
    dp_exposed, dp_busy = _dp_tail(graph, dp_nodes, cost, bwd_units, plan.overlap_dp, overlap.compute_slowdown)
    step_end: dict[str, float] = {}
    for n in graph:
        if n.phase is Phase.OPTIMIZER and isinstance(n.attrs, CollectiveAttrs):
            step_end[n.attrs.axis] = step_end.get(n.attrs.axis, 0.0) + cost(n)
    opt = sum(cost(n) for n in graph if n.op is OpKind.OPTIMIZER_UPDATE)
    return StageTiming(
        index, layers, fwd, bwd, wgrad, fwd_units, bwd_units, p2p(Phase.FORWARD), p2p(Phase.BACKWARD),
        dp_exposed, dp_busy, step_end, opt,
    )  # fmt: skip


def repeated(unit: UnitTiming, times: int) -> float:
    """``times`` back-to-back runs of a unit: steady-state periods, then the last one's tail."""
    if times <= 0:
        return 0.0
    return (times - 1) * unit.period + unit.duration


def _on(node: Node, axis: str) -> bool:
    return isinstance(node.attrs, CollectiveAttrs) and node.attrs.axis == axis


def _phases(phase: Phase) -> tuple[Phase, ...]:
    return (phase,) if phase is Phase.FORWARD else (Phase.BACKWARD, Phase.RECOMPUTE)


def _dp_tail(
    graph: Graph,
    nodes: list[Node],
    cost: _Coster,
    bwd_units: list[tuple[UnitTiming, int]],
    overlap_dp: bool,
    slowdown: float,
) -> tuple[float, float]:
    """Exposed seconds of the gradient all_reduce after the last backward, and its busy time.

    Buckets of the repeated block become ready one layer at a time during the last
    micro-batch's backward; the rest are ready when it ends. Compute that runs
    beside a bucket is slowed by ``slowdown``; that extra time counts as exposed.
    """
    nodes = nodes + [n for n in graph if _on(n, "edp") and n.phase is Phase.BACKWARD]  # experts' share
    if not nodes:
        return 0.0, 0.0
    (first, _), (block, layers), _last = bwd_units[:3]
    per_layer = sum(cost(n) for n in nodes if graph.block_of(n) is not None)
    rest = sum(cost(n) for n in nodes if graph.block_of(n) is None)
    total_bwd = first.duration + repeated(block, layers) + _last[0].duration
    busy = per_layer * layers + rest
    if not overlap_dp:
        return busy, busy
    comm_end = 0.0
    overlapped = 0.0
    for j in range(1, layers + 1):
        ready = first.duration + j * block.period
        start = max(ready, comm_end)
        comm_end = start + per_layer
        overlapped += max(0.0, min(comm_end, total_bwd) - start)
    comm_end = max(comm_end, total_bwd) + rest
    exposed = max(0.0, comm_end - total_bwd) + overlapped * (slowdown - 1.0)
    return exposed, busy


def run_schedule(plan: Plan, stages: list[StageTiming]) -> list[BlockTime]:
    orders = orders_for(plan.schedule, plan.pp, plan.microbatches, plan.vpp)
    split = plan.schedule in SPLIT_BACKWARD
    return compose(
        orders,
        [s.fwd for s in stages],
        [s.bwd for s in stages],
        [s.p2p_fwd for s in stages],
        [s.p2p_bwd for s in stages],
        [s.wgrad for s in stages] if split else None,
    )
