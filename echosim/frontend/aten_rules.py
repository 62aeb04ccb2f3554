"""The aten -> IR rule table of the export frontend (see ``aten.py``): one rule per aten op.

A rule reads an fx node of the exported graph (its args, and the shapes in
``node.meta["val"]``) and adds IR nodes through :class:`~echosim.frontend.aten_values.AtenValues`;
ops with no rule are costed as memory-bound by the converter.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from echosim.frontend.aten_values import AtenValues, Multi, op_name, permutation
from echosim.frontend.conv import conv_matmul
from echosim.frontend.fused import FusedKind, fused_kind
from echosim.ir.ops import (
    AttentionAttrs,
    CrossEntropyAttrs,
    ElementwiseAttrs,
    EmbeddingAttrs,
    MatmulAttrs,
    NormAttrs,
    OpKind,
    ViewAttrs,
)
from echosim.ir.types import DType, TensorSpec

aten = torch.ops.aten


def _numel_before_last(shape: Sequence[int]) -> int:
    return math.prod(shape[:-1]) if len(shape) > 1 else 1


# ---- rules ------------------------------------------------------------------------------

Rule = Callable[[AtenValues, fx.Node], None]


def _arg(node: fx.Node, i: int, key: str, default: Any = None) -> Any:
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(key, default)


def _view(c: AtenValues, node: fx.Node) -> None:
    src = c.value(node.args[0]) if node.args else None
    spec = c.spec_of(node.meta.get("val"))
    if src is None or spec is None:
        c.env[node] = None
        return
    attrs = ViewAttrs.permuting(permutation(node), c.graph[src].out.shape, spec.shape)
    c.emit(node, OpKind.VIEW, [src], attrs, spec=spec)


def _cast(c: AtenValues, node: fx.Node) -> None:
    """Float-to-float casts are free (every float is costed in the capture's dtype), as in fx.py."""
    src = node.args[0]
    before = src.meta.get("val") if isinstance(src, fx.Node) else None
    after = node.meta.get("val")
    if isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor):
        same = c.ir_dtype(before.dtype) == c.ir_dtype(after.dtype)
        if same:
            _view(c, node)
            return
    ins = c.tensors(node.args[:1])
    spec = c.spec_of(after)
    if spec is None or not ins:
        c.env[node] = None
        return
    c.emit(node, OpKind.ELEMENTWISE, ins, ElementwiseAttrs("cast", 0), spec)


def _split(c: AtenValues, node: fx.Node) -> None:
    c.env[node] = Multi(c.value(node.args[0]), views_only=True)


def _getitem(c: AtenValues, node: fx.Node) -> None:
    src = node.args[0]
    got = c.env.get(src) if isinstance(src, fx.Node) else None
    spec = c.spec_of(node.meta.get("val"))
    if not isinstance(got, Multi) or spec is None:
        c.env[node] = None
        return
    if got.each:
        src = got.each[node.args[1]] if isinstance(node.args[1], int) and node.args[1] < len(got.each) else None
        if src is None or c.graph[src].out == spec:
            c.env[node] = src
        else:
            c.emit(node, OpKind.VIEW, [src], spec=spec)
        return
    if got.source is None:
        c.env[node] = None
        return
    if not got.views_only and node.args[1] == 0 and c.graph[got.source].out == spec:
        c.env[node] = got.source
        return
    c.emit(node, OpKind.VIEW, [got.source], spec=spec)


def _views_each(c: AtenValues, node: fx.Node) -> None:
    """``broadcast_tensors`` / ``meshgrid``: output ``i`` is input ``i`` expanded, no kernel."""
    items = node.args[0] if node.args and isinstance(node.args[0], (list, tuple)) else ()
    c.env[node] = Multi(None, True, tuple(c.value(a) for a in items))


def _multi(op: OpKind, attrs: Callable[[AtenValues, fx.Node], Any] | None = None, data: int = 1) -> Rule:
    """A tuple-valued op costed as one kernel whose size is its first output."""

    def rule(c: AtenValues, node: fx.Node) -> None:
        val = node.meta.get("val")
        first = val[0] if isinstance(val, (list, tuple)) and val else None
        spec = c.spec_of(first)
        ins = c.tensors(node.args[:data])
        if spec is None or not ins:
            c.env[node] = Multi(None, False)
            return
        nid = c.graph.add(
            op, ins, spec, attrs(c, node) if attrs else ElementwiseAttrs(op_name(node).rsplit(".", 1)[-1]),
            scope=c.scope(node), name=node.name,
        )  # fmt: skip
        c.env[node] = Multi(nid, views_only=False)

    return rule


def _elementwise(fn: str, flops: int = 1) -> Rule:
    def rule(c: AtenValues, node: fx.Node) -> None:
        ins = c.tensors(node.args)
        spec = c.spec_of(node.meta.get("val"))
        if spec is None:
            c.env[node] = None
            return
        c.emit(node, OpKind.ELEMENTWISE, ins, ElementwiseAttrs(fn, flops), spec)

    return rule


def _reduction(fn: str) -> Rule:
    """A reduction (sum, mean, pooling, ...); one with (values, indices) outputs as well."""

    def rule(c: AtenValues, node: fx.Node) -> None:
        ins = c.tensors(node.args[:1])
        val = node.meta.get("val")
        many = isinstance(val, (list, tuple))
        spec = c.spec_of(val[0] if many and val else val)
        if spec is None or not ins:
            c.env[node] = Multi(None, False) if many else None
            return
        op = OpKind.REDUCTION if spec.numel < c.graph[ins[0]].out.numel else OpKind.ELEMENTWISE
        nid = c.graph.add(op, ins, spec, ElementwiseAttrs(fn), scope=c.scope(node), name=node.name)
        c.env[node] = Multi(nid, False) if many else nid

    return rule


def _fresh(c: AtenValues, node: fx.Node) -> None:
    """Allocation without a kernel (``empty``): free until something is written into it."""
    spec = c.spec_of(node.meta.get("val"))
    c.env[node] = None if spec is None else c.graph.add(OpKind.INPUT, (), spec, scope=c.scope(node), name=node.name)
    c.fresh.add(node)


def inplace(c: AtenValues, node: fx.Node) -> None:
    """``x.op_(...)``: a new SSA value that replaces ``x`` (or a slice of its storage)."""
    dest = node.args[0]
    name = op_name(node).rsplit(".", 1)[-1].rstrip("_")
    spec = c.spec_of(node.meta.get("val"))
    if name == "copy" and len(node.args) > 1:
        written = c.value(node.args[1])
        c.env[node] = written
    else:
        reads_dest = name not in ("fill", "zero", "index_put", "scatter", "masked_fill")
        ins = c.tensors(node.args if reads_dest else node.args[1:])
        if name in ("index_put", "scatter", "masked_fill"):
            ins = c.tensors(node.args)  # the untouched rows flow through
        written = None if spec is None else c.emit(node, OpKind.ELEMENTWISE, ins, ElementwiseAttrs(name), spec)
    if isinstance(dest, fx.Node):
        c.mutate(node, dest, written)


def _linear(c: AtenValues, node: fx.Node) -> None:
    x = c.value(node.args[0])
    w = c.weight(node.args[1], natural_is_nk=True)
    b = c.value(_arg(node, 2, "bias"))
    xs, ws = c.shape(node.args[0]), c.shape(node.args[1])
    attrs = MatmulAttrs(m=_numel_before_last(xs), n=ws[0], k=ws[-1])
    c.emit(node, OpKind.MATMUL, [v for v in (x, w, b) if v is not None], attrs)


def _mm(c: AtenValues, node: fx.Node) -> None:
    a, b = node.args[0], node.args[1]
    sa, sb = c.shape(a), c.shape(b)
    attrs = MatmulAttrs(m=sa[0], n=sb[1], k=sa[1])
    c.emit(node, OpKind.MATMUL, [v for v in (c.value(a), c.weight(b, natural_is_nk=False)) if v is not None], attrs)


def _addmm(c: AtenValues, node: fx.Node) -> None:
    bias, a, b = node.args[:3]
    sa, sb = c.shape(a), c.shape(b)
    attrs = MatmulAttrs(m=sa[0], n=sb[1], k=sa[1])
    ins = [c.value(a), c.weight(b, natural_is_nk=False), c.value(bias)]
    c.emit(node, OpKind.MATMUL, [v for v in ins if v is not None], attrs)


def _matmul(c: AtenValues, node: fx.Node) -> None:
    """``bmm``, ``matmul`` and ``@``: broadcast batch dims, (m x k) @ (k x n) per batch."""
    a, b = node.args[0], node.args[1]
    sa, sb = c.shape(a), c.shape(b)
    if len(sb) == 1:
        attrs = MatmulAttrs(m=_numel_before_last(sa), n=1, k=sb[0])
    elif len(sb) == 2:
        attrs = MatmulAttrs(m=_numel_before_last(sa), n=sb[1], k=sb[0])
    else:
        out = c.shape(node)
        sa2 = sa if len(sa) >= 2 else (1, *sa)
        attrs = MatmulAttrs(m=sa2[-2], n=sb[-1], k=sb[-2], batch=math.prod(out[:-2]) if len(out) > 2 else 1)
    w = c.weight(b, natural_is_nk=False) if len(sb) == 2 else c.value(b)
    c.emit(node, OpKind.MATMUL, [v for v in (c.value(a), w) if v is not None], attrs)


def _baddbmm(c: AtenValues, node: fx.Node) -> None:
    bias, a, b = node.args[:3]
    sa, sb = c.shape(a), c.shape(b)
    attrs = MatmulAttrs(m=sa[-2], n=sb[-1], k=sa[-1], batch=sa[0])
    c.emit(node, OpKind.MATMUL, c.tensors([a, b, bias]), attrs)


def _grouped_mm(c: AtenValues, node: fx.Node) -> None:
    """MoE experts: tokens sorted by expert times a stack of E weights.

    Held as ``batch=E`` products of (rows/E x k) @ (k x n): balanced routing, the
    expert count in ``batch`` and the weight as (E, n, k), so FLOPs are
    2 * rows * k * n and the backward rules of batched matmuls apply unchanged.
    """
    x, w = node.args[0], node.args[1]
    sx, sw = c.shape(x), c.shape(w)
    if len(sw) != 3 or len(sx) != 2:
        c.unknown(node, f"{op_name(node)} with shapes {sx} x {sw}")
        return
    experts, k, n = sw
    rows = sx[0]
    attrs = MatmulAttrs(m=math.ceil(rows / experts), n=n, k=k, batch=experts, grouped=True)
    wv = c.weight(w, natural_is_nk=False)
    c.emit(node, OpKind.MATMUL, [v for v in (c.value(x), wv) if v is not None], attrs)


def _einsum(c: AtenValues, node: fx.Node) -> None:
    equation, operands = node.args[0], node.args[1]
    if len(operands) != 2 or "..." in equation:
        c.unknown(node, f"aten.einsum '{equation}'")
        return
    lhs, out = equation.replace(" ", "").split("->")
    a, b = lhs.split(",")
    sizes: dict[str, int] = {}
    for letters, arg in ((a, operands[0]), (b, operands[1])):
        sizes.update(zip(letters, c.shape(arg), strict=False))
    batch = math.prod(sizes[ch] for ch in out if ch in a and ch in b)
    m = math.prod(sizes[ch] for ch in out if ch in a and ch not in b)
    n = math.prod(sizes[ch] for ch in out if ch in b and ch not in a)
    k = math.prod(sizes[ch] for ch in sizes if ch in a and ch in b and ch not in out)
    c.emit(node, OpKind.MATMUL, c.tensors(operands), MatmulAttrs(m=m, n=n, k=k, batch=batch))


def _roll(c: AtenValues, node: fx.Node) -> None:
    """``torch.roll`` over k dimensions is k copies: ATen rolls the first dimension, then rolls the result over
    the rest (``roll_common``, aten/src/ATen/native/TensorTransformations.cpp); over none, one copy of the
    flattened tensor. Swin's shifted windows roll two."""
    spec = c.spec_of(node.meta.get("val"))
    ins = c.tensors(node.args[:1])
    if spec is None or not ins:
        c.env[node] = None
        return
    dims = _arg(node, 2, "dims", ()) or ()
    passes = len(dims) if isinstance(dims, (list, tuple)) and dims else 1
    prev = ins[0]
    for i in range(passes - 1):
        prev = c.graph.add(OpKind.ELEMENTWISE, [prev], spec, ElementwiseAttrs("roll", 0), scope=c.scope(node),
                           name=f"{node.name}.dim{i}")  # fmt: skip
    c.emit(node, OpKind.ELEMENTWISE, [prev], ElementwiseAttrs("roll", 0), spec)


def _vector_product(c: AtenValues, node: fx.Node) -> None:
    """``mv``, ``dot`` / ``vdot`` and ``outer`` / ``ger`` as the GEMMs they are (one side of length 1),
    which the backends price as memory-bound by their bytes."""
    a, b = node.args[0], node.args[1]
    sa, sb = c.shape(a), c.shape(b)
    fn = op_name(node).rsplit(".", 1)[-1]
    if fn in ("outer", "ger"):
        attrs = MatmulAttrs(m=math.prod(sa), n=math.prod(sb), k=1)
    elif fn == "mv":
        attrs = MatmulAttrs(m=sa[0], n=1, k=sa[-1])
    else:
        attrs = MatmulAttrs(m=1, n=1, k=math.prod(sa))
    c.emit(node, OpKind.MATMUL, c.tensors([a, b]), attrs)


def _cdist(c: AtenValues, node: fx.Node) -> None:
    """Pairwise distances: torch computes the Euclidean ones as ``-2 x1 @ x2^T`` plus the squared norms (the
    GEMM path ``_euclidean_dist`` takes for large inputs), here that batched GEMM and no separate kernel."""
    a, b = node.args[0], node.args[1]
    sa, sb = c.shape(a), c.shape(b)
    if len(sa) < 2 or len(sb) < 2:
        c.unknown(node, op_name(node))
        return
    attrs = MatmulAttrs(m=sa[-2], n=sb[-2], k=sa[-1], batch=math.prod(sa[:-2]) if len(sa) > 2 else 1)
    c.emit(node, OpKind.MATMUL, c.tensors([a, b]), attrs)


def _fft(c: AtenValues, node: fx.Node) -> None:
    """FFTs (``torch.fft.*``): one memory-bound kernel of 5 N log2 N FLOPs per complex transform of N points
    (the Cooley-Tukey count FFTW's benchmarks use), half that where one side is real (``rfft``, ``irfft``):
    5 log2 N per complex output element and 2.5 log2 N per real one."""
    val = node.meta.get("val")
    spec = c.spec_of(val)
    ins = c.tensors(node.args[:1])
    if spec is None or not ins:
        c.env[node] = None
        return
    fn = op_name(node).rsplit(".", 1)[-1]
    rank = len(spec.shape)
    dims = _arg(node, 2, "dim")
    if dims is None:
        dims = [-2, -1] if fn.endswith("2") else list(range(rank)) if fn.endswith("n") else [-1]
    dims = [dims] if isinstance(dims, int) else list(dims)
    # N is the transform's length: the longer of input and output along each axis (r2c halves one of them)
    points = math.prod(max(c.shape(node.args[0])[d], spec.shape[d]) for d in dims)
    per_output = (5.0 if val.is_complex() else 2.5) * math.log2(max(points, 2))
    c.emit(node, OpKind.ELEMENTWISE, ins, ElementwiseAttrs(fn, max(1, round(per_output))), spec)


def _sdpa(c: AtenValues, node: fx.Node) -> None:
    q, k, v = node.args[:3]
    qs, ks, vs = c.shape(q), c.shape(k), c.shape(v)
    mask = _arg(node, 3, "attn_mask")
    causal = bool(_arg(node, 5, "is_causal", False))
    batch = math.prod(qs[:-3]) if len(qs) > 3 else 1
    heads = qs[-3] if len(qs) >= 3 else 1
    kv_heads = ks[-3] if len(ks) >= 3 else 1
    # QK^T contracts the query/key head size, PV produces the value head size (they differ
    # in DeepSeek's MLA); AttentionAttrs holds one head_dim, so hold their mean: FLOPs stay exact.
    head_dim = (qs[-1] + vs[-1]) // 2
    dropout = float(_arg(node, 4, "dropout_p", 0.0) or 0.0) > 0
    v_dim = vs[-1] if vs[-1] != qs[-1] else 0
    attrs = AttentionAttrs(batch, heads, kv_heads, qs[-2], ks[-2], head_dim, causal, dropout=dropout, head_dim_v=v_dim)
    val = node.meta.get("val")
    spec = c.spec_of(val[0] if isinstance(val, (list, tuple)) else val)
    nid = c.graph.add(
        OpKind.ATTENTION, c.tensors([q, k, v, mask]), spec or c.spec(node), attrs, scope=c.scope(node), name=node.name
    )
    c.env[node] = Multi(nid, False) if isinstance(val, (list, tuple)) else nid


def _selective_scan(c: AtenValues, node: fx.Node) -> None:
    """Mamba's fused selective scan (:mod:`echosim.frontend.ssm_ops`): one memory-bound kernel; its FLOPs per
    output element are 9 per state dimension, one more for the ``D`` skip and one for the ``z`` gate."""
    args = [_arg(node, i, key) for i, key in enumerate(("u", "delta", "A", "B", "C", "D", "z", "delta_bias"))]
    spec = c.spec_of(node.meta.get("val"))
    if spec is None:
        c.env[node] = None
        return
    from echosim.frontend.ssm_ops import SCAN_FLOPS_PER_STATE

    flops = SCAN_FLOPS_PER_STATE * c.shape(args[2])[-1] + (args[5] is not None) + (args[6] is not None)
    attrs = ElementwiseAttrs("selective_scan", flops)
    c.emit(node, OpKind.ELEMENTWISE, c.tensors([a for a in args if a is not None]), attrs, spec)


def _wkv(c: AtenValues, node: fx.Node) -> None:
    """RWKV-4's WKV kernel (:mod:`echosim.frontend.ssm_ops`): one memory-bound scan over its four inputs."""
    from echosim.frontend.ssm_ops import WKV_FLOPS

    c.emit(node, OpKind.ELEMENTWISE, c.tensors(node.args[:4]), ElementwiseAttrs("wkv", WKV_FLOPS))


def _args(node: fx.Node, *keys: str) -> list[Any]:
    """A custom op's leading arguments, positional or by keyword."""
    return [_arg(node, i, key) for i, key in enumerate(keys)]


def _output(c: AtenValues, node: fx.Node) -> TensorSpec | None:
    """The op's output, or ``None`` (the node then has no IR value) where export recorded none."""
    out = c.spec_of(node.meta.get("val"))
    if out is None:
        c.env[node] = None
    return out


class _Chunks:
    """The per-chunk layout of the chunked scans' GEMMs: a ``[batch, T, heads, d]`` input is padded to whole
    chunks, transposed to ``[batch, heads, T, d]`` and viewed as ``[batch, heads * chunks, chunk, d]``, so every
    product is batched over (batch, head, chunk) with the heads leading, where tensor parallelism splits them
    (the kernels index heads in their launch grid the same way)."""

    def __init__(self, c: AtenValues, node: fx.Node, steps: int, chunk: int, dtype: DType) -> None:
        self.c, self.node, self.steps, self.chunk, self.dtype = c, node, steps, chunk, dtype
        self.chunks = -(-steps // chunk)
        self.scope = c.scope(node)

    def add(self, op: OpKind, ins: list[int], shape: tuple[int, ...], attrs: Any, name: str) -> int:
        spec = TensorSpec(shape, self.dtype)
        return self.c.graph.add(op, ins, spec, attrs, scope=self.scope, name=f"{self.node.name}.{name}")

    def split(self, nid: int, name: str) -> int:
        """``[batch, T, heads(, d)]`` as ``[batch, heads * chunks, chunk(, d)]``."""
        shape = self.c.graph[nid].out.shape
        batch, heads, rest = shape[0], shape[2], tuple(shape[3:])
        padded = self.chunks * self.chunk
        if padded != self.steps:  # the last chunk padded to a whole one
            nid = self.add(
                OpKind.ELEMENTWISE, [nid], (batch, padded, heads, *rest), ElementwiseAttrs("pad", 0), f"{name}_pad"
            )
        swap = ViewAttrs((0, 2, 1, *range(3, 3 + len(rest))))
        nid = self.add(OpKind.VIEW, [nid], (batch, heads, padded, *rest), swap, f"{name}_heads")
        return self.add(OpKind.VIEW, [nid], (batch, heads * self.chunks, self.chunk, *rest), None, f"{name}_chunks")

    def join(self, nid: int, heads: int) -> int:
        """The inverse of :meth:`split`: ``[batch, heads * chunks, chunk, d]`` as ``[batch, padded T, heads, d]``."""
        batch, _, _, d = self.c.graph[nid].out.shape
        padded = self.chunks * self.chunk
        nid = self.add(OpKind.VIEW, [nid], (batch, heads, padded, d), None, "o_heads")
        return self.add(OpKind.VIEW, [nid], (batch, padded, heads, d), ViewAttrs((0, 2, 1, 3)), "o_padded")


def _gated_delta_rule(c: AtenValues, node: fx.Node) -> None:
    """The gated delta rule (:mod:`echosim.frontend.ssm_ops`) as flash-linear-attention's chunked kernels run it
    (``chunk_gated_delta_rule_fwd``; Yang et al. 2024, arXiv:2412.06464, sec. 3.3, and arXiv:2406.06484 for the
    WY form): per chunk of ``C`` tokens and value head, ``K K^T`` with the decays and ``beta`` applied and its unit
    lower-triangular system inverted (``ut``), ``W = ut K`` and ``U = ut V``, the chunk's state ``K^T U`` and the
    correction ``W S``, then the output ``(Q K^T masked) V_new + Q S``: GEMMs batched over every (batch, head,
    chunk), so FLOPs are the kernel's (full ``C x C`` blocks, as its tensor-core tiles compute them). The chunks'
    states chain one after another inside one kernel; that pass is counted by its GEMM FLOPs."""
    q, k, v, g, beta = _args(node, "q", "k", "v", "g", "beta")
    chunk = int(_arg(node, 5, "chunk_size", 64))
    l2 = bool(_arg(node, 6, "qk_l2norm", False))
    if (out := _output(c, node)) is None:
        return
    batch, steps, kv_heads, dk = c.shape(k)
    heads, dv = c.shape(v)[2:]
    at = _Chunks(c, node, steps, chunk, out.dtype)
    n = batch * heads * at.chunks
    per = (batch, heads * at.chunks)

    def prepared(x: Any, dim: int, name: str, qk: bool) -> int:
        nid = c.value(x)
        assert nid is not None
        shape = (batch, steps, heads, dim)
        if qk and kv_heads != heads:  # each key head serves heads / kv_heads value heads
            nid = at.add(OpKind.ELEMENTWISE, [nid], shape, ElementwiseAttrs("repeat", 0), f"{name}_rep")
        if qk and l2:
            nid = at.add(OpKind.ELEMENTWISE, [nid], shape, ElementwiseAttrs("l2norm", 4), f"{name}_l2")
        return at.split(nid, name)

    add = at.add
    qc, kc, vc = prepared(q, dk, "q", True), prepared(k, dk, "k", True), prepared(v, dv, "v", False)
    gates = c.tensors([g, beta])
    kt = add(OpKind.VIEW, [kc], (*per, dk, chunk), None, "k_chunks_t")
    kkt = add(OpKind.MATMUL, [kc, kt], (*per, chunk, chunk), MatmulAttrs(chunk, chunk, dk, n), "kkt")
    # decays and beta applied, the unit lower-triangular system inverted (C^3 / 3 multiply-adds per chunk)
    solve = ElementwiseAttrs("delta_rule_ut", max(1, chunk // 3))
    ut = add(OpKind.ELEMENTWISE, [kkt, *gates], (*per, chunk, chunk), solve, "ut")
    w = add(OpKind.MATMUL, [ut, kc], (*per, chunk, dk), MatmulAttrs(chunk, dk, chunk, n), "w")
    u = add(OpKind.MATMUL, [ut, vc], (*per, chunk, dv), MatmulAttrs(chunk, dv, chunk, n), "u")
    state = add(OpKind.MATMUL, [kt, u], (*per, dk, dv), MatmulAttrs(dk, dv, chunk, n), "state")
    ws = add(OpKind.MATMUL, [w, state], (*per, chunk, dv), MatmulAttrs(chunk, dv, dk, n), "ws")
    v_new = add(OpKind.ELEMENTWISE, [u, ws], (*per, chunk, dv), ElementwiseAttrs("sub"), "v_new")
    qk = add(OpKind.MATMUL, [qc, kt], (*per, chunk, chunk), MatmulAttrs(chunk, chunk, dk, n), "qk")
    attn = add(OpKind.ELEMENTWISE, [qk, gates[0]], (*per, chunk, chunk), ElementwiseAttrs("decay_mask", 2), "attn")
    intra = add(OpKind.MATMUL, [attn, v_new], (*per, chunk, dv), MatmulAttrs(chunk, dv, chunk, n), "o_intra")
    inter = add(OpKind.MATMUL, [qc, state], (*per, chunk, dv), MatmulAttrs(chunk, dv, dk, n), "o_inter")
    o = add(OpKind.ELEMENTWISE, [intra, inter], (*per, chunk, dv), ElementwiseAttrs("add"), "o")
    c.emit(node, OpKind.VIEW, [at.join(o, heads)], None, out)


#: FLOPs per element of the SSD scan's elementwise steps: ``dt`` with its bias, softplus, clamp, times ``A`` and
#: the chunk's cumulative sum (6); the chunk-to-chunk state pass, a decay and an add (2); the output's
#: ``Y_diag + exp(cumsum) Y_off + D x`` (4).
SSD_DT_FLOPS, SSD_PASS_FLOPS, SSD_OUT_FLOPS = 6, 2, 4


def _ssd_scan(c: AtenValues, node: fx.Node) -> None:
    """Mamba-2's scan (:mod:`echosim.frontend.ssm_ops`) as mamba-ssm's chunked kernels run it
    (``_mamba_chunk_scan_combined_fwd``: ``_chunk_cumsum_fwd``, ``_bmm_chunk_fwd``, ``_chunk_state_fwd``,
    ``_state_passing_fwd``, ``_chunk_scan_fwd``; Dao and Gu 2024, arXiv:2405.21060, sec. 6): per chunk of ``L``
    tokens, ``C B^T`` per group of heads; per head the diagonal block's output ``(C B^T * decay) (dt x)``, the
    chunk's state ``B^T (decay dt x)``, the states passed chunk to chunk, and the off-diagonal output ``C S``.
    The decays and ``dt`` are applied inside the GEMMs' kernels, as there (a third operand here, so their
    gradient flows); ``C B^T`` is read by each head of its group, not repeated."""
    x, dt, a, b, cm, d, bias = _args(node, "x", "dt", "A", "B", "C", "D", "dt_bias")
    chunk = int(_arg(node, 7, "chunk_size", 256))
    if (out := _output(c, node)) is None:
        return
    batch, steps, heads, p = c.shape(x)
    groups, n = c.shape(b)[2:]
    at = _Chunks(c, node, steps, chunk, out.dtype)
    per, per_group = (batch, heads * at.chunks), (batch, groups * at.chunks)
    hb, gb = batch * heads * at.chunks, batch * groups * at.chunks
    add = at.add
    steps_dt = add(
        OpKind.ELEMENTWISE,
        c.tensors([dt, bias, a]),
        (batch, steps, heads),
        ElementwiseAttrs("ssd_dt", SSD_DT_FLOPS),
        "dt",
    )
    dtc = add(OpKind.VIEW, [at.split(steps_dt, "dt")], (*per, chunk), None, "dt_rows")
    xc = at.split(c.value(x), "x")  # type: ignore[arg-type]
    bc, cc = at.split(c.value(b), "B"), at.split(c.value(cm), "C")  # type: ignore[arg-type]
    bt = add(OpKind.VIEW, [bc], (*per_group, n, chunk), None, "B_t")
    cb = add(OpKind.MATMUL, [cc, bt], (*per_group, chunk, chunk), MatmulAttrs(chunk, chunk, n, gb), "cb")
    diag = add(OpKind.MATMUL, [cb, xc, dtc], (*per, chunk, p), MatmulAttrs(chunk, p, chunk, hb), "y_diag")
    state = add(OpKind.MATMUL, [bt, xc, dtc], (*per, n, p), MatmulAttrs(n, p, chunk, hb), "states")
    passed = add(
        OpKind.ELEMENTWISE,
        [state, dtc],
        (*per, n, p),
        ElementwiseAttrs("ssd_state_pass", SSD_PASS_FLOPS),
        "states_passed",
    )
    off = add(OpKind.MATMUL, [cc, passed, dtc], (*per, chunk, p), MatmulAttrs(chunk, p, n, hb), "y_off")
    skip = c.tensors([d])
    y = add(
        OpKind.ELEMENTWISE, [diag, off, xc, *skip], (*per, chunk, p), ElementwiseAttrs("ssd_out", SSD_OUT_FLOPS), "y"
    )
    c.emit(node, OpKind.VIEW, [at.join(y, heads)], None, out)


def _embedding(c: AtenValues, node: fx.Node) -> None:
    """A lookup reads its ids and its table. Ids computed from constants only (CPM-Ant's segment ids, a ``cat`` of
    fixed values) have no IR value: they are held as a fresh buffer, so the lookup and its gradient still read ids."""
    w, ids = node.args[0], node.args[1]
    ws = c.shape(w)
    index = c.value(ids)
    if index is None and (spec := c.spec_of(ids.meta.get("val"))) is not None:
        index = c.graph.add(OpKind.INPUT, (), spec, scope=c.scope(node), name=f"{node.name}.ids")
    ins = [index, c.value(w)]
    c.emit(node, OpKind.EMBEDDING, [i for i in ins if i is not None], EmbeddingAttrs(ws[0], ws[1]))


def _embedding_bag(c: AtenValues, node: fx.Node) -> None:
    w, ids = node.args[0], node.args[1]
    ws = c.shape(w)
    val = node.meta["val"]
    lookups = math.prod(c.shape(ids))  # every index gathers one row; the bag pools them
    nid = c.graph.add(
        OpKind.EMBEDDING, c.tensors([ids, w]), c.spec_of(val[0]) or c.spec(node),
        EmbeddingAttrs(ws[0], ws[1], lookups=lookups),
        scope=c.scope(node), name=node.name,
    )  # fmt: skip
    c.env[node] = Multi(nid, False)


def _norm(kind: str, data: Sequence[int]) -> Rule:
    def rule(c: AtenValues, node: fx.Node) -> None:
        ins = c.tensors([node.args[i] for i in data if i < len(node.args)])
        val = node.meta.get("val")
        spec = c.spec_of(val[0] if isinstance(val, (list, tuple)) else val)
        nid = c.graph.add(OpKind.NORM, ins, spec or c.spec(node), NormAttrs(kind), scope=c.scope(node), name=node.name)
        c.env[node] = Multi(nid, False) if isinstance(val, (list, tuple)) else nid

    return rule


def _softmax(c: AtenValues, node: fx.Node) -> None:
    c.emit(node, OpKind.SOFTMAX, c.tensors(node.args[:1]))


def _cross_entropy(c: AtenValues, node: fx.Node) -> None:
    logits, labels = node.args[:2]
    vocab = c.shape(logits)[1] if len(c.shape(logits)) > 1 else c.shape(logits)[-1]
    c.emit(node, OpKind.CROSS_ENTROPY, c.tensors([logits, labels]), CrossEntropyAttrs(vocab))


def _dropout(c: AtenValues, node: fx.Node) -> None:
    p = float(_arg(node, 1, "p", 0.5))
    train = bool(_arg(node, 2, "train", True))
    if p == 0.0 or not train:
        _view(c, node)
        return
    val = node.meta.get("val")
    spec = c.spec_of(val[0] if isinstance(val, (list, tuple)) else val)
    nid = c.graph.add(
        OpKind.ELEMENTWISE, c.tensors(node.args[:1]), spec or c.spec(node), ElementwiseAttrs("dropout", 2),
        scope=c.scope(node), name=node.name,
    )  # fmt: skip
    c.env[node] = Multi(nid, False) if isinstance(val, (list, tuple)) else nid


def _conv(transposed_arg: int | None, groups_arg: int, transposed_op: bool = False) -> Rule:
    """A convolution (:func:`~echosim.frontend.conv.conv_matmul`); transposed if ``transposed_op`` or the flag at
    ``transposed_arg`` says so."""

    def rule(c: AtenValues, node: fx.Node) -> None:
        x, w = node.args[0], node.args[1]
        bias = _arg(node, 2, "bias")
        transposed = transposed_op or (
            transposed_arg is not None and bool(_arg(node, transposed_arg, "transposed", False))
        )
        groups = int(_arg(node, groups_arg, "groups", 1))
        attrs = conv_matmul(c.shape(x), c.shape(w), c.shape(node), groups, transposed)
        c.emit(node, OpKind.MATMUL, c.tensors([x, w, bias]), attrs)

    return rule


def _rnn(cell: str) -> Rule:
    """``aten.lstm``, ``aten.gru``, ``aten.rnn_tanh`` and ``aten.rnn_relu``, layer by layer as
    :func:`recurrent.rnn_layer` costs them. A bidirectional layer is two independent recurrences over the same
    input, the reverse one reading it from the end (cuDNN's ``CUDNN_BIDIRECTIONAL``: per layer the forward then
    the reverse direction's weights, ``w_ih, w_hh, b_ih, b_hh`` each; the outputs concatenated on the feature
    axis). The LSTM's initial state is a list (h0, c0), the others' one tensor."""

    def rule(c: AtenValues, node: fx.Node) -> None:
        from echosim.frontend.recurrent import rnn_layer

        x, hx, weights, has_bias, layers, _p, _train, bidirectional, batch_first = node.args[:9]
        xs = c.shape(x)
        batch, steps = (xs[0], xs[1]) if batch_first else (xs[1], xs[0])
        per_dir = 4 if has_bias else 2
        dirs = 2 if bidirectional else 1
        out_spec = c.spec_of(node.meta["val"][0])
        layer_in = c.value(x)
        if out_spec is None or layer_in is None:
            c.env[node] = Multi(None, False)
            return
        hidden = out_spec.shape[-1] // dirs
        h0_all = c.value(hx[0] if isinstance(hx, (list, tuple)) else hx) if hx else None
        for layer in range(int(layers)):
            outs = []
            for d in range(dirs):
                first = (layer * dirs + d) * per_dir
                group = weights[first : first + per_dir]
                w_ih, w_hh, *biases = (c.value(w) for w in group)
                assert w_ih is not None and w_hh is not None
                name = f"{node.name}.l{layer}" + (".rev" if d else "")
                h0 = None
                if h0_all is not None:  # this layer's (and direction's) slice of the (layers * dirs, batch, h) state
                    state = TensorSpec((batch, hidden), out_spec.dtype)
                    h0 = c.graph.add(OpKind.VIEW, [h0_all], state, scope=c.scope(node), name=f"{name}.h0")
                out = rnn_layer(
                    c.graph, cell, layer_in, w_ih, w_hh, [b for b in biases if b is not None],
                    batch=batch, steps=steps, in_dim=c.shape(group[0])[1], hidden=hidden,
                    dtype=out_spec.dtype, batch_first=bool(batch_first), scope=c.scope(node), name=name, h0=h0,
                )  # fmt: skip
                outs.append(out)
            if dirs == 1:
                layer_in = outs[0]
                continue
            shape = (batch, steps, dirs * hidden) if batch_first else (steps, batch, dirs * hidden)
            layer_in = c.graph.add(
                OpKind.ELEMENTWISE, outs, TensorSpec(shape, out_spec.dtype), ElementwiseAttrs("cat", 0),
                scope=c.scope(node), name=f"{node.name}.l{layer}.out",
            )  # fmt: skip
        c.env[node] = Multi(layer_in, False)

    return rule


def _rnn_cell(cell: str) -> Rule:
    """``aten.gru_cell``, ``aten.lstm_cell``, ``aten.rnn_tanh_cell`` and ``aten.rnn_relu_cell``: one time step that
    the model's own loop calls (``nn.GRUCell``, ``nn.LSTMCell``, ``nn.RNNCell``). Its two projections are GEMMs of
    their own, the input's and the state's, each with its own weight gradient (no cuDNN layer call sums them over
    the steps); the gates are one kernel each way, as PyTorch's fused CUDA cells run them (``_thnn_fused_gru_cell``,
    ``_thnn_fused_lstm_cell``). The gate kernel is named as a cell call (:func:`~echosim.ir.names.cell_call_name`),
    so that a CPU backend prices it as the native cell's aten calls (echosim.backends.cpu.NATIVE_CELL_CALLS). The
    LSTM's (h, c) output is one value."""

    def rule(c: AtenValues, node: fx.Node) -> None:
        from echosim.frontend.recurrent import CELLS
        from echosim.ir.names import cell_call_name, cell_kernel

        x, hx, w_ih, w_hh = node.args[:4]
        biases = [b for b in node.args[4:6] if isinstance(b, fx.Node)]
        state = hx[0] if isinstance(hx, (list, tuple)) else hx
        val = node.meta.get("val")
        spec = c.spec_of(val[0] if isinstance(val, (list, tuple)) else val)
        xin, h = c.value(x), c.value(state)
        if spec is None or xin is None or h is None:
            c.env[node] = Multi(None, False) if isinstance(val, (list, tuple)) else None
            return
        batch, hidden = spec.shape[0], spec.shape[-1]
        width = CELLS[cell].gates * hidden
        gates = TensorSpec((batch, width), spec.dtype)
        bias_ids = [c.value(b) for b in biases]
        projections = []
        for part, value, weight, bias in (("x", xin, w_ih, bias_ids[:1]), ("h", h, w_hh, bias_ids[1:])):
            inputs = [value, c.value(weight), *[b for b in bias if b is not None]]
            attrs = MatmulAttrs(m=batch, n=width, k=c.shape(weight)[1])
            proj = c.graph.add(
                OpKind.MATMUL, inputs, gates, attrs, scope=c.scope(node), name=f"{node.name}.{part}_proj"
            )
            projections.append(proj)
        name = cell_call_name(node.name, cell)
        out = c.graph.add(
            OpKind.ELEMENTWISE, projections, spec, ElementwiseAttrs(cell_kernel(cell), CELLS[cell].flops),
            scope=c.scope(node), name=name,
        )  # fmt: skip
        c.env[node] = Multi(out, False) if isinstance(val, (list, tuple)) else out

    return rule


def fusable(node: fx.Node) -> tuple[str, FusedKind] | None:
    """The outermost module of ``node`` that runs as one kernel (see ``fused.py``), keyed by its call."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    for key, (_path, cls) in stack.items():
        kind = fused_kind(cls if isinstance(cls, str) else getattr(cls, "__qualname__", str(cls)))
        if kind is not None:
            return str(key), kind
    return None


_ACT_FLOPS = {"gelu": 8, "silu": 4, "relu": 1, "tanh": 4, "sigmoid": 4, "exp": 4, "log": 4, "erf": 4, "expm1": 4,
              "log1p": 4, "exp2": 4, "log2": 4, "log_sigmoid": 8, "selu": 4, "celu": 4, "logit": 4, "tan": 4,
              "atan": 4, "atan2": 4, "sinh": 4, "cosh": 4, "asin": 4, "acos": 4, "erfinv": 4, "logcumsumexp": 8,
              "lgamma": 8, "digamma": 8, "sinc": 4}  # fmt: skip
#: Resampling: each output element a weighted sum of its 2^d nearest inputs (4 x 4 for bicubic), a multiply and
#: an add each; nearest copies one.
_UPSAMPLE_FLOPS = {"nearest1d": 0, "nearest2d": 0, "nearest3d": 0, "linear1d": 4, "bilinear2d": 8,
                   "trilinear3d": 16, "bicubic2d": 32}  # fmt: skip

VIEWS = {
    aten.view, aten.reshape, aten._unsafe_view, aten.transpose, aten.permute, aten.t, aten.expand,
    aten.expand_as, aten.unsqueeze, aten.squeeze, aten.flatten, aten.unflatten, aten.slice, aten.select,
    aten.narrow, aten.alias, aten.as_strided, aten.contiguous, aten.clone, aten.detach, aten.view_as,
    aten.movedim, aten.diagonal, aten.lift_fresh_copy, aten.view_as_real, aten.view_as_complex,
    aten.real, aten.imag, aten.unfold, aten.squeeze_copy, aten.unsqueeze_copy, aten.t_copy,
    aten.permute_copy, aten.expand_copy, aten.view_copy, aten.transpose_copy, aten.slice_copy,
    aten.numpy_T, aten.mT, aten.mH, aten.adjoint, aten.swapaxes, aten.swapdims, aten.moveaxis, aten.reshape_as,
    aten.broadcast_to, aten.atleast_1d, aten.atleast_2d, aten.atleast_3d,
}  # fmt: skip
SPLITS = {aten.split, aten.split_with_sizes, aten.chunk, aten.unbind, aten.tensor_split}
CASTS = {aten.to, aten._to_copy, aten.type_as}
SKIP = {aten._assert_tensor_metadata, aten._assert_scalar, aten.sym_size, aten.sym_constrain_range_for_size}
FRESH = {aten.empty, aten.empty_like, aten.new_empty, aten.empty_strided, aten.new_empty_strided}

RULES: dict[Any, Rule] = {op: _view for op in VIEWS}
RULES.update({op: _split for op in SPLITS})
RULES.update({op: _cast for op in CASTS})
RULES.update({op: _fresh for op in FRESH})
RULES.update(
    {
        operator.getitem: _getitem,
        aten.linear: _linear,
        aten.mm: _mm,
        aten.addmm: _addmm,
        aten.bmm: _matmul,
        aten.matmul: _matmul,
        aten.baddbmm: _baddbmm,
        aten._grouped_mm: _grouped_mm,
        aten.einsum: _einsum,
        aten.scaled_dot_product_attention: _sdpa,
        aten._scaled_dot_product_flash_attention: _sdpa,
        aten._scaled_dot_product_efficient_attention: _sdpa,
        aten._scaled_dot_product_flash_attention_for_cpu: _sdpa,
        aten.embedding: _embedding,
        aten.embedding_bag: _embedding_bag,
        aten._embedding_bag: _embedding_bag,
        aten.layer_norm: _norm("layernorm", (0, 2, 3)),
        aten.native_layer_norm: _norm("layernorm", (0, 2, 3)),
        aten.rms_norm: _norm("rmsnorm", (0, 2)),
        aten.group_norm: _norm("groupnorm", (0, 2, 3)),
        aten.instance_norm: _norm("instancenorm", (0, 1, 2)),
        aten.batch_norm: _norm("batchnorm", (0, 1, 2)),
        aten._native_batch_norm_legit: _norm("batchnorm", (0, 1, 2)),
        aten._native_batch_norm_legit_functional: _norm("batchnorm", (0, 1, 2)),
        aten._batch_norm_with_update: _norm("batchnorm", (0, 1, 2)),
        aten.softmax: _softmax,
        aten._softmax: _softmax,
        aten._safe_softmax: _softmax,
        aten.log_softmax: _softmax,
        aten._log_softmax: _softmax,
        aten.cross_entropy_loss: _cross_entropy,
        aten.nll_loss: _cross_entropy,
        aten.nll_loss_nd: _cross_entropy,
        aten.nll_loss_forward: _cross_entropy,
        aten.binary_cross_entropy_with_logits: _reduction("bce_loss"),
        aten.binary_cross_entropy: _reduction("bce_loss"),
        aten.mse_loss: _reduction("mse_loss"),
        aten.l1_loss: _reduction("l1_loss"),
        aten.smooth_l1_loss: _reduction("smooth_l1_loss"),
        aten.huber_loss: _reduction("huber_loss"),
        aten.dropout: _dropout,
        aten.native_dropout: _dropout,
        aten.conv1d: _conv(None, 6),
        aten.conv2d: _conv(None, 6),
        aten.conv3d: _conv(None, 6),
        aten.conv_transpose1d: _conv(None, 6, transposed_op=True),
        aten.conv_transpose2d: _conv(None, 6, transposed_op=True),
        aten.conv_transpose3d: _conv(None, 6, transposed_op=True),
        aten.convolution: _conv(6, 8),
        aten._convolution: _conv(6, 8),
        aten.lstm: _rnn("lstm"),
        aten.gru: _rnn("gru"),
        aten.rnn_tanh: _rnn("rnn_tanh"),
        aten.rnn_relu: _rnn("rnn_relu"),
        aten.gru_cell: _rnn_cell("gru"),
        aten.lstm_cell: _rnn_cell("lstm"),
        aten.rnn_tanh_cell: _rnn_cell("rnn_tanh"),
        aten.rnn_relu_cell: _rnn_cell("rnn_relu"),
        aten.topk: _multi(OpKind.ELEMENTWISE),
        aten.sort: _multi(OpKind.ELEMENTWISE),
        aten.max: _reduction("max"),
        aten.min: _reduction("min"),
        aten.sum: _reduction("sum"),
        aten.mean: _reduction("mean"),
        aten.amax: _reduction("amax"),
        aten.amin: _reduction("amin"),
        aten.logsumexp: _reduction("logsumexp"),
        aten.argmax: _reduction("argmax"),
        aten.norm: _reduction("norm"),
        aten.linalg_vector_norm: _reduction("norm"),
        aten.var: _reduction("var"),
        aten.max_pool2d: _reduction("max_pool2d"),
        aten.max_pool1d: _reduction("max_pool1d"),
        aten.avg_pool2d: _reduction("avg_pool2d"),
        aten.adaptive_avg_pool2d: _reduction("adaptive_avg_pool2d"),
        aten.adaptive_avg_pool1d: _reduction("adaptive_avg_pool1d"),
        aten.max_pool2d_with_indices: _reduction("max_pool2d"),
        aten.max_pool1d_with_indices: _reduction("max_pool1d"),
        aten.max_pool3d: _reduction("max_pool3d"),
        aten.max_pool3d_with_indices: _reduction("max_pool3d"),
        aten.avg_pool1d: _reduction("avg_pool1d"),
        aten.avg_pool3d: _reduction("avg_pool3d"),
        aten.adaptive_avg_pool3d: _reduction("adaptive_avg_pool3d"),
        aten.adaptive_max_pool1d: _reduction("adaptive_max_pool1d"),
        aten.adaptive_max_pool2d: _reduction("adaptive_max_pool2d"),
        aten.adaptive_max_pool3d: _reduction("adaptive_max_pool3d"),
        aten.cosine_similarity: _reduction("cosine_similarity"),
        aten.cat: _elementwise("cat", 0),
        aten.concat: _elementwise("cat", 0),
        aten.concatenate: _elementwise("cat", 0),
        aten.stack: _elementwise("cat", 0),
        aten.repeat: _elementwise("repeat", 0),
        aten.repeat_interleave: _elementwise("repeat", 0),
        aten.tile: _elementwise("repeat", 0),
        aten.roll: _roll,
        aten.broadcast_tensors: _views_each,
        aten.meshgrid: _views_each,
        aten.mv: _vector_product,
        aten.dot: _vector_product,
        aten.vdot: _vector_product,
        aten.outer: _vector_product,
        aten.ger: _vector_product,
        aten.cdist: _cdist,
        aten.argsort: _elementwise("sort"),
        aten.grid_sampler: _elementwise("grid_sampler", 8),  # bilinear: 4 taps, a multiply and an add each
        aten.grid_sampler_2d: _elementwise("grid_sampler", 8),
        aten.grid_sampler_3d: _elementwise("grid_sampler", 16),
        aten.msort: _elementwise("sort"),
    }
)
for _fn in ("hstack", "vstack", "dstack", "column_stack", "row_stack"):
    if (_packet_op := getattr(aten, _fn, None)) is not None:
        RULES[_packet_op] = _elementwise("cat", 0)
for _fn in ("std", "prod", "var_mean", "std_mean", "trace", "aminmax", "argmin", "nansum", "count_nonzero",
            "cummax", "cummin", "median", "nanmedian", "mode", "kthvalue", "kl_div", "margin_ranking_loss",
            "cosine_embedding_loss", "triplet_margin_loss", "poisson_nll_loss", "hinge_embedding_loss",
            "soft_margin_loss", "multilabel_margin_loss", "multi_margin_loss", "multilabel_soft_margin_loss",
            "gaussian_nll_loss", "bincount"):  # fmt: skip
    if (_packet_op := getattr(aten, _fn, None)) is not None:  # composite losses decompose before export
        RULES[_packet_op] = _reduction(_fn)
for _fn in ("fft_fft", "fft_ifft", "fft_rfft", "fft_irfft", "fft_hfft", "fft_ihfft", "fft_fft2", "fft_ifft2",
            "fft_rfft2", "fft_irfft2", "fft_fftn", "fft_ifftn", "fft_rfftn", "fft_irfftn"):  # fmt: skip
    if (_packet_op := getattr(aten, _fn, None)) is not None:
        RULES[_packet_op] = _fft
for _fn in ("add", "sub", "mul", "div", "neg", "pow", "rsqrt", "sqrt", "reciprocal", "abs", "clamp", "clamp_min",
            "clamp_max", "where", "masked_fill", "maximum", "minimum", "floor_divide", "remainder", "eq", "ne", "lt",
            "gt", "le", "ge", "logical_and", "logical_or", "logical_not", "bitwise_and", "bitwise_or", "bitwise_not",
            "__and__", "__or__", "square", "sin", "cos", "tril", "triu", "cumsum", "histc", "one_hot", "gather",
            "scatter", "scatter_add", "index_add", "index", "index_select", "index_put", "hardtanh", "leaky_relu",
            "rsub", "arange", "zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "new_zeros",
            "new_ones", "new_full", "scalar_tensor", "fill", "softplus", "mish", "hardswish", "hardsigmoid", "elu",
            "glu", "sign", "round", "floor", "ceil", "diff", "any", "all", "flip", "pad", "relu6", "prelu",
            "threshold", "hardshrink", "softshrink", "pixel_shuffle", "pixel_unshuffle", "channel_shuffle",
            "constant_pad_nd", "polar", "complex", "rand_like", "randn_like", "rand", "randn", "addcmul", "addcdiv",
            "lerp", "nan_to_num", "cumprod", "bucketize", "searchsorted", "diag_embed", "diag", "scatter_reduce",
            "index_reduce", "index_fill", "index_copy", "masked_scatter", "im2col", "col2im", "kron", "clip", "fmod",
            "trunc", "frac", "xlogy", "hypot", "copysign", "logaddexp", "isnan", "isinf", "isfinite"):  # fmt: skip
    _packet_op = getattr(aten, _fn, None)
    if _packet_op is not None and _packet_op not in RULES:
        RULES[_packet_op] = _elementwise(_fn, _ACT_FLOPS.get(_fn, 1))
for _fn in _ACT_FLOPS:  # xIELU (Apertus) is written with expm1
    if (_packet_op := getattr(aten, _fn, None)) is not None:
        RULES[_packet_op] = _elementwise(_fn, _ACT_FLOPS[_fn])
for _mode, _flops in _UPSAMPLE_FLOPS.items():
    _exact = _mode.replace("nearest", "nearest_exact")
    for _name in (f"upsample_{_mode}", f"_upsample_{_mode}_aa", f"_upsample_{_exact}"):
        if (_op := getattr(aten, _name, None)) is not None:
            RULES[_op] = _elementwise(f"upsample_{_mode}", _flops)

# Custom ops found by name (their namespaces exist only once their library is imported).
NAMED: dict[str, Rule] = {
    "transformers.grouped_mm_fallback": _grouped_mm,
    "echosim.selective_scan": _selective_scan,
    "echosim.gated_delta_rule": _gated_delta_rule,
    "echosim.ssd_scan": _ssd_scan,
    "echosim.wkv": _wkv,
}
