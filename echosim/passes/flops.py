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

from collections.abc import Iterable
from dataclasses import dataclass

from echosim.ir.graph import Graph, Node
from echosim.ir.ops import (
    LOSS_KERNEL_BYTES,
    REFERENCE_RMSNORM,
    AttentionAttrs,
    CrossEntropyAttrs,
    ElementwiseAttrs,
    EmbeddingAttrs,
    MatmulAttrs,
    NormAttrs,
    OpKind,
    OptimizerAttrs,
    Phase,
)
from echosim.passes.memory import added_nodes


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
    if isinstance(node.attrs, ElementwiseAttrs) and node.attrs.epilogue:  # inside a GEMM's epilogue
        return 0
    if isinstance(node.attrs, OptimizerAttrs):
        return node.attrs.params * node.attrs.bytes_per_param
    if node.op is OpKind.EMBEDDING and isinstance(node.attrs, EmbeddingAttrs):
        return embedding_bytes(graph, node, node.attrs)
    if isinstance(node.attrs, ElementwiseAttrs) and node.attrs.fn == "moe_dispatch" and node.phase is Phase.FORWARD:
        # The permute reads every (token, choice) row from its token: each token k times, not once
        # (an index_select of T*k rows; TE's fused moe_permute likewise, one source row per
        # destination row). Measured on H200 (benchmarks/moe_kernels_h200.md): 79 us for the
        # qwen3-30b permute, where 2 x T*k rows at STREAM bandwidth take 69 us.
        ids = sum(graph[i].out.nbytes for i in node.inputs[1:])
        return ids + 2 * node.out.nbytes
    if isinstance(node.attrs, ElementwiseAttrs) and node.attrs.fn == "attn_merge_fp32":
        # PyTorch's ring merges each step's output into an fp32 accumulator (_SDPAMerger, convert_to_f32):
        # the first upcast (a + 4), each later step reads the accumulator and its output and writes the
        # accumulator (4 + a + 4), the result downcast (4 + a); Inductor fuses each step's ops into one pass
        a = node.out.dtype.itemsize
        return node.out.numel * ((len(node.inputs) - 1) * (8 + a) + 2 * (a + 4))
    if isinstance(node.attrs, NormAttrs) and node.attrs.reference:
        return reference_rmsnorm_bytes(node)
    if isinstance(node.attrs, CrossEntropyAttrs) and node.attrs.kernel:
        return loss_kernel_bytes(graph, node, node.attrs.kernel)
    return node.out.nbytes + sum(graph[i].out.nbytes for i in node.inputs)


def reference_rmsnorm_bytes(node: Node) -> int:
    """Bytes the reference RMSNorm's eager kernels move for ``node`` (:data:`echosim.ir.ops.REFERENCE_RMSNORM`)."""
    per_a, fp32, _ = REFERENCE_RMSNORM[node.phase is Phase.BACKWARD]
    return node.out.numel * (per_a * node.out.dtype.itemsize + fp32)


def loss_kernel_bytes(graph: Graph, node: Node, kernel: str) -> int:
    """Bytes the framework's cross-entropy kernels move for ``node`` (:data:`echosim.ir.ops.LOSS_KERNEL_BYTES`):
    per logit of this rank's vocabulary slice, plus the per-token labels, loss and incoming gradient."""
    backward = node.phase is Phase.BACKWARD
    logits = graph[node.inputs[1] if backward else node.inputs[0]].out
    if kernel == "eager" and isinstance(node.attrs, CrossEntropyAttrs) and node.attrs.tp:
        kernel = "eager-loss-parallel"  # a vocabulary-parallel slice: loss_parallel()'s DTensor handlers
    per_a, fixed = LOSS_KERNEL_BYTES[kernel][backward]
    tokens = sum(graph[i].out.nbytes for i in node.inputs if graph[i].out.numel < logits.numel)
    small = node.out.nbytes if node.out.numel < logits.numel else 0
    return logits.numel * (per_a * logits.dtype.itemsize + fixed) + tokens + small


#: Bytes of row-wise Adagrad state per table row: one fp32 accumulator (FBGEMM's
#: ``EmbOptimType.EXACT_ROWWISE_ADAGRAD``, the optimizer TorchRec's DLRM examples fuse into backward).
ROWWISE_ADAGRAD_BYTES_PER_ROW = 4


def embedding_bytes(graph: Graph, node: Node, attrs: EmbeddingAttrs) -> int:
    """A gather of rows: the kernel moves the rows it looks up, never the whole table.

    Forward reads the indices and ``lookups`` rows of ``dim`` elements and writes its output
    (one row per index, or one pooled row per bag). Backward of a dense table writes the whole
    table's gradient (PyTorch's ``embedding_dense_backward``). Backward of a ``sparse`` table is
    FBGEMM's fused backward-and-optimizer kernel: it reads the output gradient and, per looked-up
    row, reads and writes the row and its row-wise Adagrad accumulator.
    """
    ids = graph[node.inputs[1] if node.phase is Phase.BACKWARD else node.inputs[0]].out.nbytes
    if node.phase is not Phase.BACKWARD:
        row = attrs.dim * node.out.dtype.itemsize
        rows = attrs.lookups or node.out.numel // max(1, attrs.dim)
        return ids + rows * row + node.out.nbytes
    if not attrs.sparse:
        return node.out.nbytes + sum(graph[i].out.nbytes for i in node.inputs)
    dy = graph[node.inputs[0]].out.nbytes
    row = attrs.dim * node.out.dtype.itemsize
    return ids + dy + attrs.lookups * 2 * (row + ROWWISE_ADAGRAD_BYTES_PER_ROW)


@dataclass(frozen=True)
class FlopCount:
    forward: int
    backward: int
    recompute: int
    overhead: int = 0  # forward and backward products that are not the model's work (MatmulAttrs.useful)

    @property
    def model(self) -> int:
        return self.forward + self.backward

    @property
    def hardware(self) -> int:
        return self.forward + self.backward + self.recompute + self.overhead


def graph_flops(graph: Graph, base: Graph | None = None) -> FlopCount:
    """Tensor-core FLOPs of one pass over ``graph`` (one micro-batch on one rank).

    ``base``: a graph ``graph`` extends (:func:`~echosim.passes.memory.added_nodes`) under the same repeat
    counts: ``base``'s count (kept on it) plus the appended nodes', the same integers as a walk of ``graph``
    (the stage-level passes append gradient reductions, ZeRO gathers and the optimizer step to each of the
    stage graphs a search meets per data-parallel degree and ZeRO stage)."""
    added = added_nodes(graph, base) if base is not None and base.repeats == graph.repeats else None
    if base is not None and added is not None:
        known = base.derived("flops", lambda: graph_flops(base))
        extra = _tally(graph, added)
        return FlopCount(known.forward + extra.forward, known.backward + extra.backward,
                         known.recompute + extra.recompute, known.overhead + extra.overhead)  # fmt: skip
    return _tally(graph, graph)


def _tally(graph: Graph, nodes: Iterable[Node]) -> FlopCount:
    """FLOPs of ``nodes`` (of ``graph``, for their repeat counts), the products' non-model share apart."""
    totals = {Phase.FORWARD: 0, Phase.BACKWARD: 0, Phase.RECOMPUTE: 0, Phase.OPTIMIZER: 0}
    overhead = 0
    for node in nodes:
        f = node_flops(node)
        if not f:  # most nodes (views, collectives, the DP pass's buckets): no repeat count to look up
            continue
        f *= graph.multiplicity(node)
        if not f:
            continue
        useful = node.attrs.useful if isinstance(node.attrs, MatmulAttrs) else 1.0
        if useful < 1.0 and node.phase in (Phase.FORWARD, Phase.BACKWARD):
            overhead += f - round(f * useful)
            f = round(f * useful)
        totals[node.phase] += f
    return FlopCount(totals[Phase.FORWARD], totals[Phase.BACKWARD], totals[Phase.RECOMPUTE], overhead)
