"""The critical path of a step, attributed to ops, module scopes and collectives.

The step's critical path is the longest path through the costed graph's task level (schedule
blocks, cross-stage transfers, step tails); its length is the step time. Each block on it is
attributed to the ops that decide its length: within a unit, the chain of ops whose tight
dependencies end last; a repeated layer's steady-state period is its critical chain, or the
communication stream when that is the longer. Every second of the step lands on exactly one
op, transfer or tail task, so the shares add up to the step time.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from echosim.timeline.costed import CostedGraph, unit_dependencies
from echosim.timeline.streams import COMM, UnitTiming, carried_window

if TYPE_CHECKING:
    from echosim.ir.graph import Graph

_WORDS = {"compute.matmul": "matmuls", "compute.attention": "attention", "compute.memory_bound": "memory-bound ops",
          "optimizer": "optimizer step", "comm.pp": "pipeline send/recv"}  # fmt: skip


@dataclass(frozen=True)
class Share:
    """Seconds of the critical path spent on one kind of work of one module group on one pipeline stage."""

    stage: int
    scope: str  # module group with layer indices folded ("layers.*.mlp"), or the tail task's name
    category: str  # the breakdown key: compute.matmul, comm.tp, optimizer, ...
    op: str  # the IR op for collectives ("all_reduce"), else ""
    recompute: bool
    seconds: float
    kind: str = "op"  # "op" (inside a schedule block), "transfer" (between stages) or "tail" (after the last block)

    @property
    def label(self) -> str:
        if self.kind == "tail":
            return f"{self.scope} on stage {self.stage}"
        words = _WORDS.get(self.category) or f"{self.category.removeprefix('comm.')} {self.op}".strip()
        if self.recompute:
            words += " (recompute)"
        where = f"{self.scope} " if self.scope else ""
        return f"{where}{words} on stage {self.stage}"

    def as_dict(self, step: float) -> dict[str, Any]:
        return {"stage": self.stage, "scope": self.scope, "category": self.category, "op": self.op,
                "recompute": self.recompute, "kind": self.kind, "seconds": self.seconds, "share": self.seconds / step,
                "label": self.label}  # fmt: skip


@dataclass(frozen=True)
class CriticalPath:
    step_time_s: float
    shares: tuple[Share, ...]  # largest first
    tasks: tuple[str, ...]  # the costed graph's task ids along the path, start to end
    seconds_by_stage: dict[int, float]

    @property
    def total_s(self) -> float:
        return sum(s.seconds for s in self.shares)

    def by_category(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in self.shares:
            out[s.category] = out.get(s.category, 0.0) + s.seconds
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))

    def as_dict(self, top: int = 20) -> dict[str, Any]:
        step = self.step_time_s
        return {
            "step_time_s": step,
            "top": [s.as_dict(step) for s in self.shares[:top]],
            "by_category": self.by_category(),
            "by_stage": {str(k): v for k, v in sorted(self.seconds_by_stage.items())},
            "tasks": len(self.tasks),
        }


def scope_group(scope: str) -> str:
    """A module path with its layer index folded: ``layers.3.mlp.fc1`` -> ``layers.*.mlp``."""
    parts = scope.split(".") if scope else []
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join([*parts[:i], "*", *parts[i + 1 : i + 2]])
    return ".".join(parts[:2])


def unit_chain(graph: Graph, unit: UnitTiming, until_side: bool = False) -> list[tuple[int, float]]:
    """(IR node, seconds) along the ops that decide when the unit ends (or, ``until_side``, its last waited-on op).

    Walking back from the op that ends last, each op's tight predecessor (the dependency whose
    weighted edge reaches it exactly at its start) is followed to the unit's start; the seconds
    add up to that op's end.
    """
    if not unit.events:
        return []
    events = {e.node: e for e in unit.events}
    read = {i for e in unit.events for i in graph[e.node].inputs}
    candidates = [e for e in unit.events if not (until_side and e.stream == COMM and e.node not in read)]
    if not candidates:
        return []
    last = max(candidates, key=lambda e: (e.start + e.duration, -e.node))
    incoming: dict[int, list[tuple[int, float]]] = {}
    for src, dst, _kind, weight in unit_dependencies(graph, unit):
        incoming.setdefault(dst, []).append((src, weight))
    chain = [(last.node, last.duration)]
    node = last.node
    while incoming.get(node):
        start = events[node].start
        src, weight = min(incoming[node], key=lambda sw: (abs(events[sw[0]].start + sw[1] - start), sw[0]))
        if events[src].start + weight < start - 1e-12 * max(1.0, start):
            break  # nothing reaches it exactly: it waited on the unit's start
        chain.append((src, weight))
        node = src
    return chain[::-1]


def _ops_of(graph: Graph, unit: UnitTiming, runs: int) -> dict[int, float]:
    """Seconds per IR node over ``runs`` back-to-back runs of a unit: ``(runs - 1)`` periods, then one whole run."""
    out: dict[int, float] = {}
    if runs <= 0:
        return out

    def add(items: Iterable[tuple[int, float]], times: float) -> None:
        for node, sec in items:
            out[node] = out.get(node, 0.0) + sec * times

    if runs > 1:
        comm = [(e.node, e.duration) for e in unit.events if e.stream == COMM]
        if sum(d for _, d in comm) > unit.critical_end + unit.carry:
            add(comm, runs - 1)  # the communication stream sets the steady-state period
        else:
            add(unit_chain(graph, unit, until_side=True), runs - 1)
            if unit.carry > 0.0:  # the previous run's spilled collectives slow these ops (by their seconds)
                window = carried_window(unit)
                beside = sum(s for _, s in window)
                add(((node, unit.carry * s / beside) for node, s in window), runs - 1)
    add(unit_chain(graph, unit), 1)
    return out


def critical_path(costed: CostedGraph) -> CriticalPath:
    """The longest path through the costed graph, every second of it attributed."""
    import networkx as nx

    g = costed.dag()
    path = nx.dag_longest_path(g, weight="weight")
    pp = costed.pp
    seconds: dict[tuple[int, str, str, str, bool, str], float] = {}
    by_stage: dict[int, float] = {}

    @cache
    def block_ops(vstage: int, kind: str) -> tuple[tuple[tuple[str, str, str, bool], float], ...]:
        stage = costed.stages[vstage]
        graph = stage.graph
        out: dict[tuple[str, str, str, bool], float] = {}
        for unit, runs in stage.units(kind):
            events = {e.node: e for e in unit.events}
            for node, sec in _ops_of(graph, unit, runs).items():
                n = graph[node]
                op = n.op.value if n.op.is_collective else ""
                key = (scope_group(n.scope), events[node].category, op, n.phase.value == "recompute")
                out[key] = out.get(key, 0.0) + sec
        return tuple(sorted(out.items()))

    def add(stage: int, key: tuple[str, str, str, bool], sec: float, kind: str = "op") -> None:
        full = (stage, *key, kind)
        seconds[full] = seconds.get(full, 0.0) + sec
        by_stage[stage] = by_stage.get(stage, 0.0) + sec

    for src, dst in itertools.pairwise(path):
        data, edge = g.nodes[src], g.edges[src, dst]
        if data["kind"] == "block":
            for key, sec in block_ops(data["vstage"], data["block"]):
                add(data["rank"], key, sec)
        elif data["kind"] == "tail" and data["duration_s"] > 0:
            add(data["rank"], (data["name"], data["category"], "", False), data["duration_s"], "tail")
        if edge["lag_s"] > 0:
            add(data.get("rank", 0) % pp, ("", "comm.pp", "send", False), edge["lag_s"], "transfer")
    shares = [Share(*k[:5], v, k[5]) for k, v in seconds.items() if v > 0]
    shares.sort(key=lambda s: (-s.seconds, s.stage, s.scope, s.category, s.op, s.recompute))
    return CriticalPath(costed.step_time_s, tuple(shares), tuple(path), by_stage)
