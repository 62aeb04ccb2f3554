"""The IR graph: SSA nodes in a networkx DAG, with repeated layers held once.

A node produces exactly one tensor. ``Graph.repeats`` maps a scope prefix (for
example ``layers.0``) to how many identical copies of that block the model has;
nodes under the prefix stand for all of them. Analyses multiply by
:meth:`Graph.multiplicity`, so compile time does not grow with depth.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace

import networkx as nx

from echosim.ir.ops import Attrs, NoAttrs, OpKind, Phase
from echosim.ir.types import TensorSpec


@dataclass(frozen=True, slots=True)
class Node:
    id: int
    op: OpKind
    inputs: tuple[int, ...]
    out: TensorSpec
    attrs: Attrs = field(default_factory=NoAttrs)
    phase: Phase = Phase.FORWARD
    scope: str = ""
    name: str = ""
    origin: int | None = None  # the forward node a backward/recompute node derives from


class Graph:
    """A DAG of :class:`Node`; insertion order is a valid topological order."""

    def __init__(self, name: str, repeats: dict[str, int] | None = None) -> None:
        self.name = name
        self.nodes: dict[int, Node] = {}
        self.dag: nx.DiGraph = nx.DiGraph()
        self.repeats: dict[str, int] = dict(repeats or {})
        self.inputs: list[int] = []  # per-sample inputs (token ids, labels); buffers are not here
        self.outputs: list[int] = []
        self.grads: dict[int, int] = {}  # parameter node -> its gradient value (after autodiff)
        self._next = 0

    # -- building ---------------------------------------------------------------
    def add(
        self,
        op: OpKind,
        inputs: Iterable[int],
        out: TensorSpec,
        attrs: Attrs | None = None,
        *,
        phase: Phase = Phase.FORWARD,
        scope: str = "",
        name: str = "",
        origin: int | None = None,
    ) -> int:
        nid = self._next
        self._next += 1
        ins = tuple(inputs)
        node = Node(nid, op, ins, out, attrs if attrs is not None else NoAttrs(), phase, scope, name, origin)
        self.nodes[nid] = node
        self.dag.add_node(nid)
        for i in ins:
            self.dag.add_edge(i, nid)
        return nid

    def replace(self, nid: int, **changes: object) -> None:
        """Swap a node for a modified copy (shapes or attrs); edges change only via inputs."""
        old = self.nodes[nid]
        new = replace(old, **changes)  # type: ignore[arg-type]
        if new.inputs != old.inputs:
            for i in old.inputs:
                self.dag.remove_edge(i, nid)
            for i in new.inputs:
                self.dag.add_edge(i, nid)
        self.nodes[nid] = new

    def copy(self, name: str | None = None) -> Graph:
        g = Graph(name or self.name, self.repeats)
        g.nodes = dict(self.nodes)
        g.dag = self.dag.copy()
        g.inputs = list(self.inputs)
        g.outputs = list(self.outputs)
        g.grads = dict(self.grads)
        g._next = self._next
        return g

    # -- reading ----------------------------------------------------------------
    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes.values())

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, nid: int) -> Node:
        return self.nodes[nid]

    def users(self, nid: int) -> list[int]:
        return sorted(self.dag.successors(nid))

    def block_of(self, node: Node) -> str | None:
        """The repeated-block prefix a node belongs to, if any."""
        for prefix in self.repeats:
            if node.scope == prefix or node.scope.startswith(prefix + "."):
                return prefix
        return None

    def multiplicity(self, node: Node) -> int:
        prefix = self.block_of(node)
        return self.repeats[prefix] if prefix is not None else 1

    def by_phase(self, phase: Phase) -> list[Node]:
        return [n for n in self.nodes.values() if n.phase is phase]

    def params(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.op is OpKind.PARAMETER]

    def param_count(self) -> int:
        """Parameter elements this graph holds, repeats included (after sharding: this rank's shards only).

        A property of the graph, not an analysis pass: frontends report it for what they capture.
        """
        return sum(n.out.numel * self.multiplicity(n) for n in self.params())
