"""Choose the attention kernel: fused flash attention or materialised scores, and which flash kernel.

``generation`` names the flash kernel a framework calls where it is not the device's best:
``"fa2"`` for FlashAttention-2 (PyTorch's SDPA flash backend, the flash-attn 2 package), whose
sm80 kernels run on Hopper and Blackwell too (:mod:`echosim.frameworks`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from echosim.ir.graph import Graph
from echosim.ir.ops import AttentionAttrs


@dataclass(frozen=True)
class AttentionKernel:
    flash: bool = True
    generation: str = ""
    name: ClassVar[str] = "attention-kernel"

    def run(self, graph: Graph) -> Graph:
        g = graph.copy()
        kernel = self.generation if self.flash else ""
        for n in list(g):
            if isinstance(n.attrs, AttentionAttrs) and (n.attrs.flash, n.attrs.kernel) != (self.flash, kernel):
                g.replace(n.id, attrs=replace(n.attrs, flash=self.flash, kernel=kernel))
        return g
