"""Recognise a captured mixture-of-experts layer's routing, so that expert parallelism can split it.

The zoo's MoE layers are built from echosim's own ops (``moe_dispatch``, grouped GEMMs,
``moe_combine``). A transformers MoE (Mixtral, Qwen3-MoE, DeepSeek-V3, ... under
transformers 5's grouped-GEMM experts) reaches the IR as plain ops instead: the
(token, choice) rows are gathered in expert order by an ``index`` op, run through
grouped GEMMs whose weight is a stack of expert matrices ``[experts, in, out]``, and put
back in token order by another ``index`` op before the weighted sum. Those two gathers
are exactly a dispatch and an unpermute; naming them so (``moe_dispatch``,
``moe_unpermute``) lets the expert-parallel pass place its all_to_alls around them and
the layout check count the experts, with the same costs as before.

The pattern, per grouped GEMM that reads expert weights:

* its rows come (through views) from a gather of a token matrix ``[tokens, hidden]``
  into ``[tokens * k, hidden]`` rows: the dispatch;
* downstream of it, the first gather whose rows descend from a grouped GEMM and has as
  many rows as the dispatch is the unpermute.

A layer where either is missing is left as it is (expert parallelism then refuses it).
"""

from __future__ import annotations

from dataclasses import replace

from echosim.ir.graph import Graph, Node, elementwise_fn
from echosim.ir.ops import ElementwiseAttrs, MatmulAttrs, OpKind

#: Ops that move whole rows by an index: how frontends spell a permutation of rows.
ROW_GATHERS = ("index", "index_select", "gather")
ROW_MOVES = (*ROW_GATHERS, "index_put", "index_copy", "index_add", "scatter", "scatter_add")


def _grouped(graph: Graph, node: Node) -> bool:
    """A grouped GEMM: a batched matmul whose weight is a stack of expert matrices."""
    if node.op is not OpKind.MATMUL or not isinstance(node.attrs, MatmulAttrs) or len(node.inputs) < 2:
        return False
    w = graph[node.inputs[1]]
    return w.op is OpKind.PARAMETER and len(w.out.shape) == 3 and node.attrs.batch > 1


def _through_views(graph: Graph, nid: int) -> Node:
    node = graph[nid]
    while node.op is OpKind.VIEW and node.inputs:
        node = graph[node.inputs[0]]
    return node


def _scaled_rows(graph: Graph, node: Node) -> Node:
    """The gathered rows under a per-row scale (Llama 4 multiplies each expert's input by its router score), or
    ``node`` itself."""
    if elementwise_fn(node) != "mul" or len(node.inputs) != 2:
        return node
    rows = [_through_views(graph, i) for i in node.inputs]
    for gathered, scale in ((rows[0], graph[node.inputs[1]]), (rows[1], graph[node.inputs[0]])):
        same = elementwise_fn(gathered) in ROW_GATHERS and gathered.out.shape == node.out.shape
        if same and scale.out.numel == node.out.shape[0]:
            return gathered
    return node


def _unpermute(graph: Graph, dispatch: Node) -> Node | None:
    rows = dispatch.out.shape[0]
    below = {dispatch.id}
    after_gemm: set[int] = set()
    for n in graph:  # topological order
        if n.id <= dispatch.id or not any(i in below for i in n.inputs):
            continue
        below.add(n.id)
        if _grouped(graph, n) or any(i in after_gemm for i in n.inputs):
            after_gemm.add(n.id)
        first = n.inputs[0] if n.inputs else -1
        if elementwise_fn(n) in ROW_MOVES and first in after_gemm and n.out.shape and n.out.shape[0] == rows:
            return n
    return None


def mark_routing(graph: Graph) -> int:
    """Name the dispatch and unpermute of every recognised expert layer; returns how many layers."""
    marked = 0
    for n in list(graph):
        if not _grouped(graph, n):
            continue
        src = _scaled_rows(graph, _through_views(graph, n.inputs[0]))
        if elementwise_fn(src) not in ROW_GATHERS or len(src.out.shape) != 2 or not src.inputs:
            continue
        tokens = graph[src.inputs[0]].out.shape
        if len(tokens) != 2 or src.out.shape[0] % tokens[0] or src.out.shape[1] != tokens[1]:
            continue
        end = _unpermute(graph, src)
        if end is None:
            continue
        for node, fn in ((src, "moe_dispatch"), (end, "moe_unpermute")):
            assert isinstance(node.attrs, ElementwiseAttrs)
            graph.replace(node.id, attrs=replace(node.attrs, fn=fn))
        marked += 1
    return marked
