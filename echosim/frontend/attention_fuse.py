"""Recognise attention written out as matmul -> softmax -> matmul, and make it one attention op.

ONNX files below opset 23 (and modules that write attention by hand, nanoGPT
style) spell attention as ``scores = q @ k^T``, a scale, a mask, ``softmax``,
maybe dropout, then ``scores @ v``. Costed op by op that is the materialised
kernel sequence; the IR's attention op lets the plan choose (``--attention
flash`` or ``math``) as it does for every other frontend. FLOPs do not change:
the two batched matmuls are exactly the attention op's ``4 b h s s_kv d``.

The pattern, read from the second matmul back:

* ``M2 = matmul(P, V)``; ``P`` is the softmax, possibly through dropout, casts
  and views, each read only by the next;
* the softmax reads ``M1 = matmul(Q, K^T)`` through scale, mask and cast ops
  whose other operands are constants (they depend on no model input);
* ``Q`` and ``K^T`` may each carry a constant scale, which is absorbed; both are matrices (additive
  attention, ``v . tanh(W_q q + W_k k)``, ends its scores with a product by a vector and stays op by op).

A constant operand shaped like the score matrix is a mask: the attention is taken
to be causal (a fixed mask in a language model is the causal one).
"""

from __future__ import annotations

import math

from echosim.frontend.messages import Note
from echosim.ir.graph import Graph, Node, elementwise_fn
from echosim.ir.ops import AttentionAttrs, OpKind

_SCORE_FNS = {"add", "sub", "mul", "div", "where", "masked_fill", "cast", "neg"}
_PROB_FNS = {"dropout", "cast"}


def _dynamic(graph: Graph) -> set[int]:
    """Values that depend on a per-sample input or a parameter (everything else is a constant)."""
    dyn: set[int] = set(graph.inputs)
    for n in graph:
        if n.op is OpKind.PARAMETER or any(i in dyn for i in n.inputs):
            dyn.add(n.id)
    return dyn


def _nan_guard(graph: Graph, node: Node) -> Node | None:
    """The ``isnan`` of ``where(isnan(P), 0, P)`` on a softmax ``P``: torch's ONNX exporter writes scaled-dot-product
    attention below opset 23 so, zeroing the rows a mask leaves empty (the kernel's own guard, no extra pass)."""
    if elementwise_fn(node) != "where":
        return None
    nans = [graph[i] for i in node.inputs if elementwise_fn(graph[i]) == "isnan"]
    softs = [graph[i] for i in node.inputs if graph[i].op is OpKind.SOFTMAX]  # the 0 is a scalar, not a value
    if len(nans) != 1 or len(softs) != 1 or tuple(nans[0].inputs) != (softs[0].id,):
        return None
    nan = nans[0]
    return nan if len(graph.users(nan.id)) == 1 else None


def _stored_mask(node: Node, scores: Node) -> bool:
    """A mask the exporter folded into an initializer (a parameter to echosim): one score matrix, broadcast."""
    shape = node.out.shape
    return (
        node.op is OpKind.PARAMETER
        and len(shape) >= 2
        and shape[-2:] == scores.out.shape[-2:]
        and math.prod(shape[:-2]) == 1
    )


def _match(graph: Graph, m2: Node, dyn: set[int]) -> tuple[list[int], list[int], bool] | None:
    """(Q, K^T, V) and the nodes the pattern replaces, if ``m2`` ends an attention."""
    if len(m2.inputs) != 2 or len(m2.out.shape) < 3:
        return None
    if any(graph[i].op is OpKind.PARAMETER for i in m2.inputs):
        return None
    covered = [m2.id]
    p = graph[m2.inputs[0]]
    guard = 0  # the users of the softmax a NaN guard adds
    while p.op is not OpKind.SOFTMAX:  # dropout, casts, views after the softmax
        if len(graph.users(p.id)) != 1 or not p.inputs:
            return None
        if nan := _nan_guard(graph, p):
            covered += [p.id, nan.id]
            p, guard = graph[nan.inputs[0]], 1
            continue
        if not (p.op is OpKind.VIEW or elementwise_fn(p) in _PROB_FNS):
            return None
        covered.append(p.id)
        p = graph[p.inputs[0]]
    if len(graph.users(p.id)) != 1 + guard:
        return None
    covered.append(p.id)
    s = graph[p.inputs[0]]
    causal = False
    while s.op is not OpKind.MATMUL:  # scale, mask, casts before the softmax
        if len(graph.users(s.id)) != 1 or not (s.op is OpKind.VIEW or elementwise_fn(s) in _SCORE_FNS):
            return None
        scores = [i for i in s.inputs if i in dyn and not _stored_mask(graph[i], s)]
        if len(scores) != 1:
            return None
        consts = [graph[i] for i in s.inputs if i not in scores]
        causal = causal or any(c.out.shape[-2:] == s.out.shape[-2:] for c in consts)
        covered.append(s.id)
        s = graph[scores[0]]
    m1 = s
    if len(graph.users(m1.id)) != 1 or len(m1.inputs) != 2 or not all(i in dyn for i in m1.inputs):
        return None
    if any(graph[i].op is OpKind.PARAMETER for i in m1.inputs):
        return None
    if any(len(graph[i].out.shape) < 2 for i in m1.inputs):  # a product with a vector: additive (Bahdanau)
        return None  # attention's v . tanh(W_q q + W_k k), whose scores are no Q K^T
    covered.append(m1.id)
    operands = []
    for i in m1.inputs:  # a constant scale on Q or K^T (scaled before the product) is absorbed
        n = graph[i]
        if elementwise_fn(n) in ("mul", "div") and len(graph.users(n.id)) == 1 and sum(j in dyn for j in n.inputs) == 1:
            covered.append(n.id)
            i = next(j for j in n.inputs if j in dyn)
        operands.append(i)
    return [operands[0], operands[1], m2.inputs[1]], covered, causal


def fuse_attention(graph: Graph, notes: list[str]) -> Graph:
    """A copy of ``graph`` with each materialised attention pattern as one attention op."""
    dyn = _dynamic(graph)
    found: dict[int, tuple[list[int], bool]] = {}
    drop: set[int] = set()
    for n in graph:
        if n.op is OpKind.MATMUL and n.id not in drop:
            hit = _match(graph, n, dyn)
            if hit is not None:
                qkv, covered, causal = hit
                found[n.id] = (qkv, causal)
                drop.update(c for c in covered if c != n.id)
    if not found:
        return graph
    for n in graph:  # a stored mask no kept op reads any more is no parameter of the model
        if n.op is OpKind.PARAMETER and graph.users(n.id) and all(u in drop for u in graph.users(n.id)):
            drop.add(n.id)
    out = Graph(graph.name, graph.repeats, graph.block_layers)
    new: dict[int, int] = {}
    for n in graph:
        if n.id in drop:
            continue
        if n.id in found:
            (q, kt, v), causal = found[n.id]
            qs, ks, vs = graph[q].out.shape, graph[kt].out.shape, graph[v].out.shape
            heads = qs[-3] if len(qs) >= 3 else 1
            kv_heads = vs[-3] if len(vs) >= 3 else 1
            batch = math.prod(qs[:-3]) if len(qs) > 3 else 1
            # one head_dim in the IR: the mean of the QK and PV sizes keeps FLOPs exact
            v_dim = vs[-1] if vs[-1] != qs[-1] else 0
            attrs = AttentionAttrs(
                batch, heads, kv_heads, qs[-2], ks[-1], (qs[-1] + vs[-1]) // 2, causal, head_dim_v=v_dim
            )
            new[n.id] = out.add(OpKind.ATTENTION, [new[q], new[kt], new[v]], n.out, attrs, scope=n.scope, name=n.name)
            continue
        new[n.id] = out.add(
            n.op, [new[i] for i in n.inputs], n.out, n.attrs, phase=n.phase, scope=n.scope, name=n.name, origin=n.origin
        )
    out.inputs = [new[i] for i in graph.inputs]
    out.outputs = [new[o] for o in graph.outputs]
    notes.append(Note(f"{len(found)} attention pattern(s) written as matmul, softmax, matmul are costed as attention"))
    return out
