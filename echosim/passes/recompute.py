"""Activation recomputation: forward work replayed in backward to save memory.

``full`` (Megatron's full recompute) checkpoints each repeated layer's input and
replays the whole layer, its tensor-parallel all_reduces included, before the
layer's backward. ``selective`` (Korthikanti et al. 2022) replays only the
attention core; with a fused (flash) kernel that replay already lives inside the
attention backward, so only materialised attention gains recompute nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from echosim.ir.graph import Graph, Node
from echosim.ir.ops import AttentionAttrs, OpKind, Phase

MODES = ("none", "selective", "full")


@dataclass(frozen=True)
class Recompute:
    mode: str = "none"
    name: ClassVar[str] = "recompute"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown recompute mode {self.mode!r} (known: {', '.join(MODES)})")

    def run(self, graph: Graph) -> Graph:
        if self.mode == "none":
            return graph
        g = graph.copy()
        chosen = [n for n in graph if n.phase is Phase.FORWARD and self._replays(g, n)]
        copies: dict[int, int] = {}
        for n in chosen:
            ins = [copies.get(i, i) for i in n.inputs]
            copies[n.id] = g.add(
                n.op, ins, n.out, n.attrs, phase=Phase.RECOMPUTE, scope=n.scope, name=f"{n.name}.recompute", origin=n.id
            )
        first_bwd = None
        for n in list(g):
            if n.phase is Phase.BACKWARD and g.block_of(n) is not None:
                first_bwd = n.id if first_bwd is None else first_bwd
                if any(i in copies for i in n.inputs):
                    g.replace(n.id, inputs=tuple(copies.get(i, i) for i in n.inputs))
        # replay just before the layer's backward: move the copies there in graph order
        replay = set(copies.values())
        order = [nid for nid in g.nodes if nid not in replay]
        at = order.index(first_bwd) if first_bwd is not None else len(order)
        order[at:at] = [copies[n.id] for n in chosen]
        g.nodes = {nid: g.nodes[nid] for nid in order}
        return g

    def _replays(self, g: Graph, n: Node) -> bool:
        if n.op.is_placeholder or g.block_of(n) is None:
            return False
        if self.mode == "full":
            return True
        return (isinstance(n.attrs, AttentionAttrs) and not n.attrs.flash) or n.op is OpKind.SOFTMAX
