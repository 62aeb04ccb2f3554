"""The costed execution graph of one training step: every task with a stream, a start and a duration.

Two levels, both folded so that size does not grow with layers or devices:

* **ops**: for each distinct pipeline-stage shape, one micro-batch's forward and backward as
  *units* (before the repeated block, the block once with its repeat count, after it), each
  op with its stream, start within its unit, duration, undilated duration and slowdown;
  stages of the same shape share one lowering (all the middle stages of a pipeline);
* **tasks**: the schedule's blocks (``F``/``B``/``W`` of every micro-batch on every rank)
  and each rank's step tail (exposed gradient reduction, step-end collectives, optimizer).

:func:`~echosim.timeline.lower.lower_step` builds it; the report, the breakdown, the trace
and the memory timeline read it. :meth:`CostedGraph.dag` gives the same content as a
networkx ``DiGraph`` (data and stream-order edges weighted by the time they impose), whose
longest path is the step time; :func:`write_graph` writes it as GraphML or node-link JSON.
The attributes are documented in docs/costed-graph.md.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from echosim.errors import EchosimError
from echosim.ir.graph import Graph
from echosim.ir.ops import CollectiveAttrs, OpKind
from echosim.memo import Memo
from echosim.passes.flops import io_bytes, node_flops
from echosim.timeline.schedule import BlockTime
from echosim.timeline.sequential import OrderPlan, SequentialTiming
from echosim.timeline.streams import COMM, COMPUTE, OpEvent, UnitTiming

if TYPE_CHECKING:
    import networkx as nx
    import numpy as np

    from echosim.timeline.composer import ScheduleTiming

GRAPH_FORMATS = (".graphml", ".json")
#: A rank's peak of held activations by its schedule's orders and each chunk's bytes: layouts that share a
#: schedule shape and stage graphs (a search's ZeRO stages and placements) walk the orders once.
_PEAKS: Memo[int] = Memo("peak held activations", maxsize=1 << 14)
_PARTS = ("pre", "block", "post")


@dataclass
class StageCost:
    """One virtual pipeline stage (a model chunk) lowered for one micro-batch."""

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
    graph: Graph = field(repr=False)
    vstages: tuple[int, ...] = ()  # the virtual stages that share this lowering (same shape)
    base: Graph | None = field(default=None, repr=False)  # the stage graph before the stage-level passes
    dp_copies: float = 0.0  # PyTorch DDP's copies of the gradients into their buckets and back (compute stream)
    ep_hidden: float = 0.0  # EP all-to-all per micro-batch hidden under the adjacent micro-batch (taken off bwd)
    # backward units before the weight-gradient ones: before / block / after, with a second block unit under
    # full:N (the layers that keep their activations, then those that replay: timeline.lower._block_units)
    b_units: int = 3

    @property
    def model_layers(self) -> int:
        """The model's layers this stage runs: its repetitions of the block times the layers each holds, and
        the layers outside the block it holds (DeepSeek-V3's dense first layers on the first stage)."""
        per_block = max((self.graph.layers_per_block(p) for p in self.graph.repeats), default=1)
        return self.layers * per_block + self.graph.unfolded_layers()

    @property
    def step_end(self) -> float:
        return sum(self.step_end_comm.values())

    def units(self, block: str) -> list[tuple[UnitTiming, int]]:
        """The units a schedule block of this stage runs: ``F`` forward, ``B`` backward (or its input half), ``W``."""
        if block == "F":
            return self.fwd_units
        return self.bwd_units[: self.b_units] if block == "B" else self.bwd_units[self.b_units :]


class TailTask(NamedTuple):
    """A task of a rank's step tail, after its last block."""

    rank: int
    task: str  # "dp_copies", "dp", "step_end" or "optimizer"
    name: str
    stream: str
    category: str
    start: float
    duration: float
    busy: float = 0.0  # for "dp": seconds the reduction runs, most of them hidden under the backward

    @property
    def end(self) -> float:
        return self.start + self.duration


def chunks_by_rank(
    stages: Sequence[StageCost], in_flight: Sequence[dict[int, int]], pp: int
) -> dict[int, list[StageCost]]:
    """The virtual stages each rank runs, as its schedule's orders place them (DualPipe runs a stage on two
    ranks); rank ``v % pp`` for a rank whose orders run no forward."""
    out: dict[int, list[StageCost]] = {r: [] for r in range(pp)}
    for s in stages:
        ranks = [r for r in range(pp) if s.index in in_flight[r]] if len(in_flight) == pp else []
        for r in ranks or [s.index % pp]:
            out[r].append(s)
    return out


def rank_tail(mine: list[StageCost], last: StageCost) -> list[tuple[str, str, str, str, float]]:
    """What a pipeline rank runs after its last block, in order, as (task, name, stream, category, seconds).

    ``mine`` are the rank's chunks, ``last`` the chunk whose backward it runs last (its reduction is the
    exposed one). The costed graph's tail tasks and a search's brief figures both read this one list.
    """
    steps = []
    copies = sum(c.dp_copies for c in mine)
    if copies > 0:  # PyTorch DDP: into the buckets during the last backward, back after the reductions
        name = "DDP bucket copies (gradients into buckets / world, buckets back)"
        steps.append(("dp_copies", name, "compute", "compute.memory_bound", copies))
    steps.append(("dp", "dp grad reduction (exposed)", "comm", "comm.dp", last.dp_exposed))
    for c in mine:
        for axis, sec in sorted(c.step_end_comm.items()):
            steps.append(("step_end", f"{axis} step-end collectives", "comm", f"comm.{axis}", sec))
    steps.append(("optimizer", "optimizer step", "compute", "optimizer", sum(c.optimizer for c in mine)))
    return steps


@dataclass
class CostedGraph:
    """The lowered step; see the module docstring. ``stages`` are indexed by virtual stage.

    ``schedule`` holds the timed blocks; :attr:`blocks` lists them (built on first use: the
    report needs only each rank's end and in-flight count, which the schedule knows).
    """

    stages: list[StageCost]
    schedule: ScheduleTiming | SequentialTiming  # a batch's column (composer) or one layout's (sequential)
    tails: list[TailTask]
    pp: int
    microbatches: int

    @cached_property
    def blocks(self) -> list[BlockTime]:
        """Every block of the schedule with its start and end, rank by rank in run order."""
        return self.schedule.blocks

    @cached_property
    def _by_rank(self) -> dict[int, list[BlockTime]]:
        by_rank: dict[int, list[BlockTime]] = {r: [] for r in range(self.pp)}
        for b in self.blocks:
            by_rank[b.stage].append(b)
        return by_rank

    def rank_blocks(self, rank: int) -> list[BlockTime]:
        """A rank's blocks in the order it runs them."""
        return self._by_rank[rank]

    @cached_property
    def block_ends(self) -> dict[int, float]:
        """When each rank's last block ends (before its step tail)."""
        return dict(enumerate(self.schedule.rank_ends))

    @cached_property
    def rank_ends(self) -> list[float]:
        """When each rank finishes the step (its tail included)."""
        ends = list(self.block_ends.values())
        for t in self.tails:
            ends[t.rank] = max(ends[t.rank], t.end)
        return ends

    @property
    def step_time_s(self) -> float:
        return max(self.rank_ends)

    @property
    def critical_rank(self) -> int:
        """The rank that finishes last (the first of them on a tie)."""
        return self.rank_ends.index(self.step_time_s)

    def chunks(self, rank: int) -> list[StageCost]:
        """The virtual stages (model chunks) a pipeline rank runs."""
        return self._chunks[rank]

    @cached_property
    def _chunks(self) -> dict[int, list[StageCost]]:
        return chunks_by_rank(self.stages, self.schedule.plan.in_flight, self.pp)

    def runs(self, rank: int, index: int) -> int:
        """Micro-batches of virtual stage ``index`` that ``rank`` runs: all of them, except where a stage has
        copies on two ranks (DualPipe: each runs the half that enters from its end)."""
        return self._runs.get((rank, index), self.microbatches)

    @cached_property
    def _runs(self) -> dict[tuple[int, int], int]:
        out: dict[tuple[int, int], int] = {}
        plan = self.schedule.plan
        if sum(len(held) for held in plan.in_flight) <= plan.vstages:  # no stage on two ranks: each runs all
            return out
        for r, seq in enumerate(plan.orders):
            for kind, v, _ in seq:
                if kind == "F":
                    out[(r, v)] = out.get((r, v), 0) + 1
        return out

    def rank_tail(self, rank: int) -> list[TailTask]:
        return self._tails_by_rank.get(rank, [])

    @cached_property
    def _tails_by_rank(self) -> dict[int, list[TailTask]]:
        out: dict[int, list[TailTask]] = {}
        for t in self.tails:
            out.setdefault(t.rank, []).append(t)
        return out

    def in_flight(self, rank: int) -> dict[int, int]:
        """Peak micro-batches per virtual stage whose activations the rank holds (the memory timeline's peak)."""
        return dict(self.schedule.plan.in_flight[rank])

    def peak_held(self, rank: int, per_microbatch: dict[int, int]) -> int:
        """Peak bytes of activations the rank holds at once, given each virtual stage's bytes per micro-batch.

        The schedule's running sum, not the sum of each chunk's own peak: interleaved 1F1B never
        holds every chunk's peak together (Megatron's warm-up is ``(pp - rank - 1) * 2 + (vpp - 1) * pp``
        forwards, megatron/core/pipeline_parallel/schedules.py).
        """
        return peak_held(self.schedule.plan, rank, per_microbatch)

    def memory_timeline(self, rank: int) -> list[tuple[float, dict[int, int]]]:
        """(time, live micro-batches per virtual stage) after each forward or backward block of ``rank``."""
        live: dict[int, int] = {}
        out = []
        for b in self.rank_blocks(rank):
            if b.kind == "F":
                live[b.vstage] = live.get(b.vstage, 0) + 1
                out.append((b.start, dict(live)))
            elif b.kind == "B":
                live[b.vstage] -= 1
                out.append((b.end, dict(live)))
        return out

    def busy(self, rank: int) -> dict[str, float]:
        """Seconds each kind of work keeps its stream busy on ``rank`` over the step, hidden or not.

        Unit ops count once per run (layers x micro-batches); the gradient reduction and the
        step-end collectives count whole, although most of the reduction runs under the backward.
        """
        out: dict[str, float] = {}
        for stage in self.chunks(rank):
            for unit, count in stage.fwd_units + stage.bwd_units:
                for category, sec in unit.busy.items():
                    out[category] = out.get(category, 0.0) + sec * count * self.runs(rank, stage.index)
            out["comm.dp"] = out.get("comm.dp", 0.0) + stage.dp_busy
            if stage.dp_copies:
                out["compute.memory_bound"] = out.get("compute.memory_bound", 0.0) + stage.dp_copies
            for axis, sec in stage.step_end_comm.items():
                out[f"comm.{axis}"] = out.get(f"comm.{axis}", 0.0) + sec
        optimizer = sum(t.duration for t in self.rank_tail(rank) if t.task == "optimizer")
        out["optimizer"] = out.get("optimizer", 0.0) + optimizer
        return {k: v for k, v in sorted(out.items()) if v > 0}

    def slowdown_s(self, rank: int) -> dict[str, float]:
        """Seconds the overlap slowdown adds to each stream's ops on ``rank`` over the step."""
        out = {COMPUTE: 0.0, COMM: 0.0}
        for stage in self.chunks(rank):
            for unit, count in stage.fwd_units + stage.bwd_units:
                for e in unit.events:
                    out[e.stream] += max(0.0, e.duration - e.base) * count * self.runs(rank, stage.index)
        return out

    def dag(self) -> nx.DiGraph:
        """The costed graph as a networkx DiGraph (built on first use; see docs/costed-graph.md)."""
        return to_networkx(self)

    def longest_path_s(self) -> float:
        """Length of the longest path through :meth:`dag` (edge ``weight``: seconds one task imposes on the next)."""
        import networkx as nx

        return float(nx.dag_longest_path_length(self.dag(), weight="weight"))


def peak_held(plan: Any, rank: int, per_microbatch: dict[int, int]) -> int:
    """:meth:`CostedGraph.peak_held` of a schedule's plan (an :class:`OrderPlan` or a batch's plan), kept."""
    key = (plan, rank, tuple(sorted(per_microbatch.items())))
    if isinstance(plan, OrderPlan):  # one layout's plan: plain Python (numpy stays unimported)
        return _PEAKS.get(key, lambda: plan.peak_held(rank, per_microbatch))
    return _PEAKS.get(key, lambda: _peak_held(_order_arrays(plan, rank), per_microbatch))


def _peak_held(arrays: tuple[np.ndarray, np.ndarray], per_microbatch: dict[int, int]) -> int:
    """The running sum of held activations along one rank's orders, at its highest (0 before any block).

    A forward adds its chunk's bytes, a backward frees them; the highest running sum is reached
    after some forward, so it is the largest prefix sum (integers: exact).
    """
    import numpy as np

    signs, chunks = arrays
    if not len(signs):
        return 0
    if max(per_microbatch.values(), default=0) * len(signs) >= 2**62:  # past int64: Python's integers
        held = peak = 0
        for sign, v in zip(signs.tolist(), chunks.tolist(), strict=True):
            held += sign * per_microbatch.get(v, 0)
            peak = max(peak, held)
        return peak
    sizes = np.zeros(int(max(chunks.max(), max(per_microbatch, default=0))) + 1, np.int64)
    for v, nbytes in per_microbatch.items():
        sizes[v] = nbytes
    return max(0, int(np.cumsum(signs * sizes[chunks]).max()))


_ORDERS: Memo[tuple[np.ndarray, np.ndarray]] = Memo("order arrays", maxsize=1 << 14)


def _order_arrays(plan: Any, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Along a rank's orders: +1 for a forward, -1 for a backward, 0 otherwise (W), and each block's chunk."""

    def build() -> tuple[np.ndarray, np.ndarray]:
        import numpy as np

        orders = plan.orders[rank]
        signs = np.fromiter((1 if k == "F" else -1 if k == "B" else 0 for k, _, _ in orders), np.int64, len(orders))
        chunks = np.fromiter((v for _, v, _ in orders), np.int64, len(orders))
        return signs, chunks

    return _ORDERS.get((plan, rank), build)


def _unit_names(stage: StageCost) -> list[tuple[str, UnitTiming, int]]:
    names = []
    work = [("forward", stage.fwd_units), ("backward", stage.units("B"))]
    if len(stage.bwd_units) > stage.b_units:
        work.append(("wgrad", stage.units("W")))
    for label, units in work:
        parts = _PARTS if len(units) == len(_PARTS) else ("pre", "block", "block_replayed", "post")
        for part, (unit, count) in zip(parts, units, strict=False):
            names.append((f"{label}.{part}", unit, count))
    return names


def to_networkx(costed: CostedGraph) -> nx.DiGraph:
    """Ops (per distinct stage shape and unit) and tasks (blocks and tails) with their dependencies."""
    import networkx as nx

    g = nx.DiGraph(step_time_s=costed.step_time_s, pp=costed.pp, microbatches=costed.microbatches)
    seen: set[int] = set()
    for stage in costed.stages:
        if id(stage.fwd_units) in seen:  # a stage of a shape already added: its ops stand for it too
            continue
        seen.add(id(stage.fwd_units))
        for unit_name, unit, count in _unit_names(stage):
            _add_unit(g, stage, unit_name, unit, count, costed.microbatches)
    _add_tasks(g, costed)
    return g


def op_attributes(graph: Graph, e: OpEvent) -> dict[str, Any]:
    """What the costed graph says of one op as lowered: the IR op, its timing, FLOPs and bytes."""
    n = graph[e.node]
    attrs: dict[str, Any] = {
        "kind": "collective" if n.op.is_collective else "op",
        "op": n.op.value,
        "name": e.name,
        "scope": n.scope,
        "phase": n.phase.value,
        "stream": e.stream,
        "category": e.category,
        "start_s": e.start,
        "duration_s": e.duration,
        "base_s": e.base,
        "slowdown": e.duration / e.base if e.base > 0 else 1.0,
        "flops": node_flops(n),
    }
    if isinstance(n.attrs, CollectiveAttrs):
        attrs.update(bytes=n.attrs.bytes, axis=n.attrs.axis.value, group=n.attrs.size, role=n.attrs.role.value)
    else:
        attrs["bytes"] = io_bytes(graph, n)
    return attrs


def _add_unit(g: nx.DiGraph, stage: StageCost, unit_name: str, unit: UnitTiming, count: int, m: int) -> None:
    graph = stage.graph
    vstages = stage.vstages or (stage.index,)
    prefix = f"op:v{vstages[0]}:{unit_name}:"
    for e in unit.events:
        attrs = {**op_attributes(graph, e), "unit": unit_name, "vstages": ",".join(map(str, vstages)),
                 "count": count, "runs": count * m * len(vstages)}  # fmt: skip
        g.add_node(prefix + str(e.node), **attrs)
    for src, dst, kind, weight in unit_dependencies(graph, unit):
        g.add_edge(prefix + str(src), prefix + str(dst), kind=kind, lag_s=0.0, weight=weight)


def unit_dependencies(graph: Graph, unit: UnitTiming) -> list[tuple[int, int, str, float]]:
    """The edges between a unit's ops: ``(producer, consumer, kind, weight)`` by IR node id.

    ``data``: the consumer reads the producer (looking through free views in between);
    ``order``: the previous op on the same stream; ``chunked``: a TP-overlap consumer that may
    start with its producer. ``weight`` is the seconds the source imposes (0 when chunked), so
    every op starts at the longest weighted path to it from the unit's start.
    """
    events = {e.node: e for e in unit.events}
    members = set(unit.nodes)

    def producers(nid: int) -> set[int]:
        """Ops of this unit that ``nid`` waits on, looking through free nodes (views) in between."""
        out: set[int] = set()
        stack = list(graph[nid].inputs)
        while stack:
            i = stack.pop()
            if i not in members:
                continue
            if i in events:
                out.add(i)
            elif graph[i].op is not OpKind.PARAMETER:
                stack.extend(graph[i].inputs)
        return out

    edges: list[tuple[int, int, str, float]] = []
    seen: set[tuple[int, int]] = set()
    last: dict[str, int] = {}
    position = {nid: i for i, nid in enumerate(unit.nodes)}
    for e in sorted(unit.events, key=lambda x: (x.start, position[x.node])):
        for src in sorted(producers(e.node)):
            chunked = (src, e.node) in unit.chunked
            edges.append((src, e.node, "chunked" if chunked else "data", 0.0 if chunked else events[src].duration))
            seen.add((src, e.node))
        before = last.get(e.stream)
        if before is not None and (before, e.node) not in seen:
            edges.append((before, e.node, "order", events[before].duration))
            seen.add((before, e.node))
        last[e.stream] = e.node
    return edges


def _add_pair_inputs(g: nx.DiGraph, costed: CostedGraph, dur: dict[str, float]) -> None:
    """A fused pair's forward (a forward run with the next backward, of another stage, as one unit) also waits
    on that backward's inputs (:attr:`~echosim.timeline.schedule.Schedule.fused_pairs`)."""
    for r in range(costed.pp):
        for a, b in itertools.pairwise(costed.rank_blocks(r)):
            if a.kind != "F" or b.kind != "B" or a.vstage == b.vstage:
                continue
            fid, bid = _block_id("F", a.vstage, a.microbatch), _block_id("B", b.vstage, b.microbatch)
            for src, _, d in list(g.in_edges(bid, data=True)):
                if d["kind"] == "data" and src != fid and not g.has_edge(src, fid):
                    g.add_edge(src, fid, kind="data", lag_s=d["lag_s"], weight=dur[src] + d["lag_s"])


def _block_id(kind: str, vstage: int, microbatch: int) -> str:
    return f"{kind}{microbatch}@v{vstage}"


def _add_tasks(g: nx.DiGraph, costed: CostedGraph) -> None:
    pp, vstages = costed.pp, len(costed.stages)
    dur: dict[str, float] = {}
    g.add_node("start", kind="start", start_s=0.0, duration_s=0.0)
    for b in costed.blocks:
        bid = _block_id(b.kind, b.vstage, b.microbatch)
        dur[bid] = b.end - b.start
        g.add_node(bid, kind="block", block=b.kind, rank=b.stage, vstage=b.vstage, chunk=b.vstage // pp,
                   microbatch=b.microbatch, start_s=b.start, duration_s=b.end - b.start)  # fmt: skip
    stages = costed.stages
    for b in costed.blocks:
        bid = _block_id(b.kind, b.vstage, b.microbatch)
        deps: list[tuple[str, float]] = []
        if b.kind == "F" and b.vstage > 0:
            deps.append((_block_id("F", b.vstage - 1, b.microbatch), stages[b.vstage - 1].p2p_fwd))
        elif b.kind == "B":
            deps.append((_block_id("F", b.vstage, b.microbatch), 0.0))
            if b.vstage < vstages - 1:
                deps.append((_block_id("B", b.vstage + 1, b.microbatch), stages[b.vstage + 1].p2p_bwd))
        elif b.kind == "W":
            deps.append((_block_id("B", b.vstage, b.microbatch), 0.0))
        if not deps:
            g.add_edge("start", bid, kind="order", lag_s=0.0, weight=0.0)
        for src, lag in deps:
            g.add_edge(src, bid, kind="data", lag_s=lag, weight=dur[src] + lag)
    pair = getattr(costed.schedule.plan, "pair_cross", None)
    if pair is not None and len(pair):  # fused pairs (DualPipe)
        _add_pair_inputs(g, costed, dur)
    g.add_node("end", kind="end", start_s=costed.step_time_s, duration_s=0.0)
    for r in range(pp):
        previous = None
        for b in costed.rank_blocks(r):
            bid = _block_id(b.kind, b.vstage, b.microbatch)
            if previous is not None and not g.has_edge(previous, bid):
                g.add_edge(previous, bid, kind="order", lag_s=0.0, weight=dur[previous])
            previous = bid
        for i, t in enumerate(costed.rank_tail(r)):
            tid = f"tail:r{r}:{i}:{t.task}"
            g.add_node(tid, kind="tail", task=t.task, name=t.name, rank=r, stream=t.stream, category=t.category,
                       start_s=t.start, duration_s=t.duration)  # fmt: skip
            if previous is None:
                g.add_edge("start", tid, kind="order", lag_s=0.0, weight=0.0)
            else:
                g.add_edge(previous, tid, kind="order", lag_s=0.0, weight=dur[previous])
            dur[tid] = t.duration
            previous = tid
        if previous is not None:
            g.add_edge(previous, "end", kind="order", lag_s=0.0, weight=dur[previous])


def check_graph_path(path: str | Path) -> None:
    """Refuse an unknown format before the compile runs, so the mistake costs nothing."""
    suffix = Path(path).suffix.lower()
    if suffix not in GRAPH_FORMATS:
        raise EchosimError(f"--graph {path}: unknown format {suffix or '(no suffix)'!r} (known: .graphml, .json)")


def write_graph(costed: CostedGraph, path: str | Path) -> None:
    """Write the costed graph as GraphML (``.graphml``) or node-link JSON (``.json``), by the file's suffix."""
    import networkx as nx

    check_graph_path(path)
    path = Path(path)
    g = costed.dag()
    try:
        if path.suffix.lower() == ".graphml":
            nx.write_graphml(g, path)
        else:
            data = nx.node_link_data(g, edges="edges")
            path.write_text(json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n", encoding="utf-8")
    except OSError as exc:
        raise EchosimError(f"--graph {path}: cannot write ({exc.strerror or exc})") from None
