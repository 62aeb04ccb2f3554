"""FLOP and byte analysis: per-op formulas, multiplied by repeat counts.

*Model FLOPs*: matmuls (2mnk) and attention (QK^T and PV) in forward and backward,
with attention backward counted as twice its forward. Causal attention counts only
the scores its mask keeps (about half, :attr:`AttentionAttrs.model_flops`), as
Megatron-LM's ``num_floating_point_operations`` and MaxText's TFLOP count do: the
kernels skip the masked blocks, and counting them let MFU pass 100% at long
sequence. Recomputed forward work is reported apart, so MFU and HFU can both be
derived.
"""

from __future__ import annotations

from dataclasses import dataclass

from echosim.ir.graph import Graph, Node
from echosim.ir.ops import AttentionAttrs, MatmulAttrs, OpKind, OptimizerAttrs, Phase


def node_flops(node: Node) -> int:
    """Tensor-core FLOPs of one execution of ``node`` (0 for memory-bound ops)."""
    if isinstance(node.attrs, MatmulAttrs):
        return node.attrs.flops
    if isinstance(node.attrs, AttentionAttrs):
        return node.attrs.model_flops * (2 if node.phase is Phase.BACKWARD else 1)
    return 0


def io_bytes(graph: Graph, node: Node) -> int:
    """Bytes a kernel for ``node`` reads and writes (operands plus result)."""
    if node.op in (OpKind.VIEW, OpKind.INPUT, OpKind.PARAMETER) or node.op.is_collective:
        return 0
    if isinstance(node.attrs, OptimizerAttrs):
        return node.attrs.params * node.attrs.bytes_per_param
    if node.op is OpKind.EMBEDDING and node.phase is not Phase.BACKWARD:
        ids = graph[node.inputs[0]].out.nbytes
        return ids + 2 * node.out.nbytes  # gathers only the rows it needs
    return node.out.nbytes + sum(graph[i].out.nbytes for i in node.inputs)


@dataclass(frozen=True)
class FlopCount:
    forward: int
    backward: int
    recompute: int

    @property
    def model(self) -> int:
        return self.forward + self.backward

    @property
    def hardware(self) -> int:
        return self.forward + self.backward + self.recompute


def graph_flops(graph: Graph) -> FlopCount:
    """Tensor-core FLOPs of one pass over ``graph`` (one micro-batch on one rank)."""
    totals = {Phase.FORWARD: 0, Phase.BACKWARD: 0, Phase.RECOMPUTE: 0, Phase.OPTIMIZER: 0}
    for node in graph:
        f = node_flops(node)
        if f:
            totals[node.phase] += f * graph.multiplicity(node)
    return FlopCount(totals[Phase.FORWARD], totals[Phase.BACKWARD], totals[Phase.RECOMPUTE])
