"""Transformer Engine's fused grouped expert MLP: the GLU and its quantisation inside the grouped GEMMs.

With ``NVTE_CUTEDSL_FUSED_GROUPED_MLP=1`` and Megatron-Core's ``use_transformer_engine_op_fuser``, the experts'
two grouped GEMMs run as cuDNN's CuTe DSL block-scaled kernels "Grouped Gemm + GLU" forward and "Grouped Gemm +
dGLU" backward (NVIDIA/cudnn-frontend ``python/cudnn/README.md``, ``grouped_gemm/grouped_gemm_swiglu``,
``grouped_gemm_dswiglu``; enabled by Megatron-Bridge's performance presets of NeMo 26.06 on,
``cutedsl_fused_grouped_mlp=True``, scripts/performance/perf_plugins.py v0.5.0). The activation (SwiGLU, or
gpt-oss's clamped one), its product and the block-scaled cast of the second GEMM's input run in the first
GEMM's epilogue; backward, the activation's gradient and the casts of the first GEMM's output gradients run in
the second GEMM's input-gradient epilogue. Those elementwise kernels, and their round trips through HBM, go.

The pass marks them (:attr:`echosim.ir.ops.ElementwiseAttrs.epilogue`): every elementwise node whose inputs
come from grouped (expert) GEMMs, parameters or other such nodes, and whose every consumer is a grouped GEMM
or another such node, views seen through. The expert permutes around the GEMMs, the bias and the combine are
fed by, or feed, the exchange, so they stay. Not priced: what the epilogue adds to the GEMM itself (its output
written once in the narrow format instead of twice in 16 bits), nor a change to the activation memory kept.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from echosim.ir.graph import Graph
from echosim.ir.ops import ElementwiseAttrs, MatmulAttrs, OpKind


def epilogue_nodes(graph: Graph) -> set[int]:
    """The elementwise nodes between grouped GEMMs (module doc)."""
    grouped = {n.id for n in graph if isinstance(n.attrs, MatmulAttrs) and n.attrs.grouped}
    if not grouped:
        return set()
    users: dict[int, list[int]] = {}
    for n in graph:
        for i in n.inputs:
            users.setdefault(i, []).append(n.id)

    def source(i: int) -> int:
        while graph[i].op is OpKind.VIEW and graph[i].inputs:
            i = graph[i].inputs[0]
        return i

    def consumers(i: int) -> list[int]:
        out = []
        for u in users.get(i, []):
            out.extend(consumers(u) if graph[u].op is OpKind.VIEW else [u])
        return out

    cand = {n.id for n in graph if n.op is OpKind.ELEMENTWISE and isinstance(n.attrs, ElementwiseAttrs)}
    # each candidate's producers (parameters aside) and consumers, views seen through, found once
    fed = {nid: [i for i in map(source, graph[nid].inputs) if graph[i].op is not OpKind.PARAMETER] for nid in cand}
    outs = {nid: consumers(nid) for nid in cand}
    changed = True
    while changed:  # drop a candidate with a producer or consumer outside the grouped GEMMs and the candidates
        changed = False
        for nid in sorted(cand):
            if not fed[nid] or not outs[nid] or not all(i in grouped or i in cand for i in (*fed[nid], *outs[nid])):
                cand.discard(nid)
                changed = True
    return cand


@dataclass(frozen=True)
class FusedExpertMlp:
    name: ClassVar[str] = "fused-expert-mlp"

    def run(self, graph: Graph) -> Graph:
        fused = epilogue_nodes(graph)
        if not fused:
            return graph
        g = graph.copy()
        for nid in sorted(fused):
            attrs = g[nid].attrs
            assert isinstance(attrs, ElementwiseAttrs)
            g.replace(nid, attrs=replace(attrs, epilogue=True))
        return g
