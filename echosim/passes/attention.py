"""Choose the attention kernel: fused flash attention or materialised scores."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from echosim.ir.graph import Graph
from echosim.ir.ops import AttentionAttrs


@dataclass(frozen=True)
class AttentionKernel:
    flash: bool = True
    name: ClassVar[str] = "attention-kernel"

    def run(self, graph: Graph) -> Graph:
        g = graph.copy()
        for n in list(g):
            if isinstance(n.attrs, AttentionAttrs) and n.attrs.flash != self.flash:
                g.replace(n.id, attrs=replace(n.attrs, flash=self.flash))
        return g
