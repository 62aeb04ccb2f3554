"""Reverse-mode differentiation of the IR by per-op rules.

One rule per :class:`OpKind` turns a forward node and the gradient of its output
into gradient contributions for its inputs. Contributions to a value used more
than once are summed with an elementwise add, as autograd does. Megatron's
conjugate collectives follow from the rules: the gradient of a column-parallel
input is partial across the TP group, so an all_reduce follows its dgrad; the
all_reduce after a row-parallel layer is the identity in backward. With sequence
parallelism the all_gather before a column-parallel layer turns into a
reduce_scatter in backward, and the layer's weight gradient reads the input
gathered again (Megatron keeps only the 1/tp shard for backward). An all_to_all
is its own conjugate; a ring exchange of K/V sends the gradient the other way.
A recurrent layer's weight gradient is one GEMM over all its time steps, as the fused
kernels compute it (oneDNN's RNN backward and cuDNN's ``cudnnRNNBackwardWeights`` multiply the
saved states of every step by their gate gradients at once, after the recurrence): the time
steps run one after another only through their data gradients.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import ClassVar

from echosim.ir import strides as layouts
from echosim.ir.graph import Graph, Node
from echosim.ir.names import GRAD_ACCUMULATE, RECURRENT_CELLS, all_steps_name, cell_kernel, cell_of, step_of
from echosim.ir.ops import (
    Axis,
    CollectiveAttrs,
    ElementwiseAttrs,
    EmbeddingAttrs,
    MatmulAttrs,
    NoAttrs,
    OpKind,
    Phase,
)
from echosim.ir.types import DType, TensorSpec

Contrib = list[tuple[int, int]]  # (forward input id, gradient value id)
_NO_GRAD = frozenset({DType.INT64, DType.INT32, DType.BOOL})  # indices and masks carry no gradient


class _Ctx:
    def __init__(self, graph: Graph, cast_grads: bool = False, layout_copies: bool = False) -> None:
        self.g = graph
        self.cast_grads = cast_grads  # views keep the gradient's dtype; a cast follows where it differs
        self.layout_copies = layout_copies  # eager autograd: a gradient reshaped across its strides is copied
        # a value -> its strides as eager PyTorch holds it (None: not known, so no copy is inferred from it)
        self.strides: dict[int, tuple[int, ...] | None] = {}
        self.regathered: dict[int, int] = {}  # forward SP all_gather -> its backward re-gather
        # a recurrent weight -> (time step's GEMM, its input, its output's gradient), latest step first
        self.step_wgrads: dict[int, list[tuple[Node, int, int]]] = {}
        # a forward op whose backward kernel sums its output's gradients itself -> the ones after the first
        self.fused_dys: dict[int, list[int]] = {}

    def emit(
        self,
        fwd: Node,
        op: OpKind,
        inputs: list[int],
        out: TensorSpec,
        attrs: object = None,
        suffix: str = "grad",
        scope: str | None = None,
    ) -> int:
        return self.g.add(
            op,
            inputs,
            out,
            attrs if attrs is not None else NoAttrs(),  # type: ignore[arg-type]
            phase=Phase.BACKWARD,
            scope=fwd.scope if scope is None else scope,
            name=f"{fwd.name}.{suffix}",
            origin=fwd.id,
        )

    def spec(self, nid: int) -> TensorSpec:
        return self.g[nid].out

    def view_of(self, src: int, dy: int) -> TensorSpec:
        """The spec of a view of gradient ``dy`` shaped as ``src``: a view keeps ``dy``'s dtype (mixed graphs)."""
        out = self.spec(src)
        return TensorSpec(out.shape, self.spec(dy).dtype) if self.cast_grads else out

    def like(self, fwd: Node, src: int, dy: int, fn: str, extra: list[int]) -> int:
        """Gradient for input ``src`` of an elementwise op; a reduction if it was broadcast."""
        out = self.spec(src)
        if out.numel < fwd.out.numel:
            return self.emit(fwd, OpKind.REDUCTION, [dy, *extra], out, ElementwiseAttrs(f"{fn}_grad"))
        if fn in ("add", "sub") and not extra:
            return dy if out.numel == self.spec(dy).numel else self.emit(fwd, OpKind.VIEW, [dy], self.view_of(src, dy))
        return self.emit(fwd, OpKind.ELEMENTWISE, [dy, *extra], out, ElementwiseAttrs(f"{fn}_grad"))


def _sp_gathered(c: _Ctx, x: int) -> bool:
    """Is ``x`` the SP all_gather of a column-parallel input (perhaps re-sorted into expert order)?"""
    src = c.g[x]
    while isinstance(src.attrs, ElementwiseAttrs) and src.attrs.fn in ("moe_sort_chunks", "moe_quant_pad"):
        src = c.g[src.inputs[0]]
    return src.op is OpKind.ALL_GATHER and isinstance(src.attrs, CollectiveAttrs) and src.attrs.axis is Axis.TP


def _regather(c: _Ctx, x: int) -> int:
    """The SP input of a column-parallel layer, all-gathered again for its weight gradient."""
    if x not in c.regathered:
        ag = c.g[x]
        c.regathered[x] = c.emit(ag, OpKind.ALL_GATHER, [ag.inputs[0]], ag.out, ag.attrs, "regather")
    return c.regathered[x]


#: Integer and boolean tensors (expert indices, masks) carry no gradient.
_NO_GRAD = frozenset({DType.INT64, DType.INT32, DType.BOOL})


def _matmul(c: _Ctx, n: Node, dy: int, needs: set[int]) -> Contrib:
    a = n.attrs
    assert isinstance(a, MatmulAttrs)
    x, w = n.inputs[0], n.inputs[1]
    out: Contrib = []
    linear = len(c.spec(w).shape) == 2
    sp = _sp_gathered(c, x)
    if x in needs:
        # the forward product's roles kept; precision is set later, per gradient, by the precision pass
        attrs = replace(a, n=a.k, k=a.n, grad_of="dgrad", precision="")
        dx = c.emit(n, OpKind.MATMUL, [dy, w], c.spec(x), attrs, "dgrad")
        if a.tp in ("colwise", "vocab") and not sp:  # with SP the all_gather's conjugate reduces
            reduce = CollectiveAttrs(Axis.TP, 0, c.spec(x).nbytes)
            dx = c.emit(n, OpKind.ALL_REDUCE, [dx], c.spec(x), reduce, "dgrad.tp_all_reduce")
        out.append((x, dx))
    wants_w = w in needs and c.spec(w).dtype not in _NO_GRAD  # no gradient flows into indices or masks
    if wants_w and step_of(n.name) is not None:  # a time step: summed with the others in one GEMM
        c.step_wgrads.setdefault(w, []).append((n, x, dy))
    elif wants_w:
        if linear:
            attrs = MatmulAttrs(
                m=a.n, n=a.k, k=a.m * a.batch, tp=a.tp, grad_of="wgrad", conv_io=a.conv_io, useful=a.useful
            )
        else:
            attrs = replace(a, m=a.k, k=a.m, grad_of="wgrad", precision="")
        # Megatron's column-parallel linear keeps only its 1/tp input shard and gathers it
        # again; grouped expert GEMMs keep the rows the dispatcher gathered for them
        xin = _regather(c, x) if sp and linear else x
        out.append((w, c.emit(n, OpKind.MATMUL, [xin, dy], c.spec(w), attrs, "wgrad")))
    for b in n.inputs[2:]:
        if b in needs:
            out.append((b, c.emit(n, OpKind.REDUCTION, [dy], c.spec(b), ElementwiseAttrs("bias_grad"), "bgrad")))
    return out


def _steps_wgrad(c: _Ctx, w: int, steps: list[tuple[Node, int, int]]) -> int:
    """One weight gradient for every time step that multiplied ``w``: (out x in) = sum over steps of
    dy_t^T x_t, a GEMM whose k is the rows of all steps (the states and gate gradients the fused
    kernel keeps side by side in its workspace, so nothing is concatenated)."""
    first = steps[-1][0]  # the earliest step (backward meets the latest first)
    a = first.attrs
    assert isinstance(a, MatmulAttrs)
    found = step_of(first.name)
    assert found is not None
    rows = sum(n.attrs.m * n.attrs.batch for n, _, _ in steps if isinstance(n.attrs, MatmulAttrs))
    attrs = MatmulAttrs(m=a.n, n=a.k, k=rows, tp=a.tp, grad_of="wgrad", useful=a.useful)
    xs = [x for _, x, _ in reversed(steps)]
    dys = [dy for _, _, dy in reversed(steps)]
    name = f"{all_steps_name(*found)}.wgrad"
    return c.g.add(
        OpKind.MATMUL,
        [*xs, *dys],
        c.spec(w),
        attrs,
        phase=Phase.BACKWARD,
        scope=first.scope,
        name=name,
        origin=first.id,
    )


def _attention(c: _Ctx, n: Node, dy: int, needs: set[int]) -> Contrib:
    q, k, v = n.inputs[:3]
    packed = TensorSpec((c.spec(q).numel + c.spec(k).numel + c.spec(v).numel,), n.out.dtype)
    grad = c.emit(n, OpKind.ATTENTION, [dy, q, k, v, n.id], packed, n.attrs)
    out = [
        (i, c.emit(n, OpKind.VIEW, [grad], c.spec(i), suffix=f"d{tag}"))
        for i, tag in zip((q, k, v), "qkv", strict=False)
        if i in needs
    ]
    if c.layout_copies and getattr(n.attrs, "flash", False):
        # a fused kernel's gradients are allocated in the dimension order its inputs are held in: PyTorch's
        # cuDNN and flash backward allocate dq = at::empty_like(query) (aten/src/ATen/native/transformers/cuda/
        # attention_backward.cu), and empty_like keeps a strided input's dimension order even where the input
        # is not dense (infer_dense_strides in empty_like, aten/src/ATen/native/TensorFactories.cpp: q sliced
        # out of a fused qkv projection gets a dense (batch, seq, heads, head_dim) gradient)
        for i, d in out:
            held = _held(c, i)
            c.strides[d] = None if held is None else layouts.permuted_strides(c.spec(d).shape, _order(held))
    elif c.layout_copies:  # the math path's gradients come out of its batched GEMMs, row-major
        for _, d in out:
            c.strides[d] = layouts.contiguous_strides(c.spec(d).shape)
    return out


#: Elementwise kernels whose output is laid out row-major whatever their inputs' layout: ``torch.cat`` / ``stack``
#: (a permuted layout is not a memory format it keeps) and the copy ``reshape`` makes.
_ROW_MAJOR_OUTPUT = frozenset({"cat", "copy"})


def _held(c: _Ctx, nid: int) -> tuple[int, ...] | None:
    """Strides of value ``nid`` as eager PyTorch holds it (memoised in ``c.strides``).

    A kernel's output is row-major, except that an elementwise op (TensorIterator) lays its output out in the
    dimension order of its first input of the same shape ("the output will have the same memory layout as the
    inputs", aten/src/ATen/TensorIterator.cpp ``compute_strides`` / ``reorder_dimensions``; ``.to(dtype)``
    preserves it too), and a view holds its base's elements: a permute permutes the strides, a reshape keeps
    them where it can (:func:`echosim.ir.strides.view_strides`), a select or a split of one dimension keeps the
    others'. Where a chain is unclear (a view of a packed buffer, a permute of repeated sizes) the layout is not
    known (None), and nothing downstream of it is copied."""
    chain: list[int] = []
    x = nid
    while x not in c.strides:
        src = _layout_source(c, c.g[x])
        if src is None:
            c.strides[x] = layouts.contiguous_strides(c.spec(x).shape)
            break
        chain.append(x)
        x = src
    for y in reversed(chain):
        n = c.g[y]
        source = c.strides[_layout_source(c, n)]  # type: ignore[index]
        c.strides[y] = None if source is None else _derived(c, n, source)
    return c.strides[nid]


def _layout_source(c: _Ctx, n: Node) -> int | None:
    """The input whose layout ``n``'s output follows (None: ``n`` writes a row-major output)."""
    if n.op is OpKind.VIEW and len(n.inputs) == 1:
        return n.inputs[0]
    if n.op is OpKind.ELEMENTWISE and isinstance(n.attrs, ElementwiseAttrs) and n.attrs.fn not in _ROW_MAJOR_OUTPUT:
        return next((i for i in n.inputs if c.spec(i).shape == n.out.shape), None)
    return None


def _derived(c: _Ctx, n: Node, held: tuple[int, ...]) -> tuple[int, ...] | None:
    """Strides of ``n``'s output from those of its layout source (:func:`_layout_source`)."""
    shape, base = n.out.shape, c.spec(n.inputs[0]).shape if n.op is OpKind.VIEW else n.out.shape
    if n.op is not OpKind.VIEW:  # a new tensor, dense, in its input's dimension order
        return layouts.permuted_strides(shape, _order(held))
    if math.prod(base) == math.prod(shape):
        if (perm := layouts.permutation(base, shape)) is not None:
            return tuple(held[p] for p in perm)
        if len(base) == len(shape) and sorted(base) == sorted(shape):  # a permute of repeated sizes: not known
            return None
        return layouts.view_strides(base, held, shape) or layouts.contiguous_strides(shape)
    if len(base) == len(shape) + 1 and base[1:] == shape:  # one of an unbind's outputs
        return held[1:]
    if len(base) == len(shape) and sum(a != b for a, b in zip(base, shape, strict=True)) == 1:  # a split
        return held
    return None


def _order(strides: tuple[int, ...]) -> tuple[int, ...]:
    """Dimensions from the outermost in memory to the innermost."""
    return tuple(sorted(range(len(strides)), key=lambda d: -strides[d]))


_PASS_THROUGH = {"add", "sub"}
_NEEDS_OTHER = {"mul", "div"}


def _moe_dispatch(c: _Ctx, n: Node, dy: int, needs: set[int]) -> Contrib:
    """Un-permute the gradient rows and sum each token's top-k copies."""
    tokens = n.inputs[0]
    if tokens not in needs:
        return []
    return [(tokens, c.emit(n, OpKind.REDUCTION, [dy], c.spec(tokens), ElementwiseAttrs("moe_dispatch_grad")))]


def _moe_combine(c: _Ctx, n: Node, dy: int, needs: set[int]) -> Contrib:
    """Rows get the token gradient scaled by their router weight; weights get dot(dy, row)."""
    rows, _ids, weights = n.inputs[:3]
    out: Contrib = []
    if rows in needs:
        grad = c.emit(n, OpKind.ELEMENTWISE, [dy, weights], c.spec(rows), ElementwiseAttrs("moe_combine_grad"))
        out.append((rows, grad))
    if weights in needs:
        grad = c.emit(n, OpKind.REDUCTION, [dy, rows], c.spec(weights), ElementwiseAttrs("router_weight_grad"), "wgrad")
        out.append((weights, grad))
    return out


def _attn_merge(c: _Ctx, n: Node, dy: int, needs: set[int]) -> Contrib:
    """Ring-attention partial outputs: each gradient is dy rescaled by the merged softmax statistics."""
    return [
        (i, c.emit(n, OpKind.ELEMENTWISE, [dy, n.id], c.spec(i), ElementwiseAttrs("attn_merge_grad"), f"grad{j}"))
        for j, i in enumerate(n.inputs)
        if i in needs
    ]


def _permutation(c: _Ctx, n: Node, dy: int, needs: set[int]) -> Contrib:
    """A row permutation: its gradient is the inverse permutation of dy (nothing saved)."""
    x = n.inputs[0]
    if x not in needs:
        return []
    assert isinstance(n.attrs, ElementwiseAttrs)
    return [(x, c.emit(n, OpKind.ELEMENTWISE, [dy], c.spec(x), ElementwiseAttrs(f"{n.attrs.fn}_grad")))]


def _rnn_cell(c: _Ctx, n: Node, dy: int, needs: set[int]) -> Contrib:
    """A recurrent step's gate kernel (echosim.frontend.recurrent): one backward kernel turns the state's gradient
    into the gate gradient (batch x gates*h), summing the gradient from the layer above and the recurrent one in the
    kernel (cuDNN's backward pointwise kernel reads both dy and dhy: ``cudnnRNNBackwardData``; Appleyard et al.
    2016, arXiv:1604.01946, sec. 3.1 optimization 3), and reading the gates saved forward. Both of the gate
    kernel's inputs, the input projection's slice and the recurrent GEMM, receive that one gradient."""
    assert isinstance(n.attrs, ElementwiseAttrs)
    gates = n.inputs[0]
    grad = c.emit(
        n,
        OpKind.ELEMENTWISE,
        [dy, *c.fused_dys.pop(n.id, []), gates],
        c.spec(gates),
        ElementwiseAttrs(f"{n.attrs.fn}_grad"),
    )
    return [(i, grad) for i in n.inputs if i in needs]


def _fused_scan(c: _Ctx, n: Node, dy: int, needs: set[int]) -> Contrib:
    """A fused scan (echosim.frontend.ssm_ops: Mamba's selective scan, RWKV's WKV): one backward kernel reads dy
    and the forward's inputs, recomputes the states in SRAM rather than reading them back (Gu and Dao 2023,
    arXiv:2312.00752, sec. 3.3.2; the WKV backward kernel likewise) and writes every input's gradient; like
    attention's, they come out of one packed buffer. Recomputing the forward scan and running the reverse one
    make its FLOPs twice the forward's."""
    assert isinstance(n.attrs, ElementwiseAttrs)
    wanted = [i for i in dict.fromkeys(n.inputs) if i in needs]
    if not wanted:
        return []
    packed = TensorSpec((sum(c.spec(i).numel for i in wanted),), n.out.dtype)
    flops = -(-2 * n.attrs.flops_per_element * n.out.numel // packed.numel)
    attrs = ElementwiseAttrs(f"{n.attrs.fn}_grad", flops)
    grad = c.emit(n, OpKind.ELEMENTWISE, [dy, *dict.fromkeys(n.inputs)], packed, attrs)
    return [(i, c.emit(n, OpKind.VIEW, [grad], c.spec(i), suffix=f"d{j}")) for j, i in enumerate(wanted)]


_ELEMENTWISE_RULES = {
    "selective_scan": _fused_scan,
    "wkv": _fused_scan,
    **{cell_kernel(cell): _rnn_cell for cell in RECURRENT_CELLS},
    "moe_dispatch": _moe_dispatch,
    "moe_combine": _moe_combine,
    "attn_merge": _attn_merge,
    "attn_merge_fp32": _attn_merge,
    "moe_sort_chunks": _permutation,
    "moe_unsort_chunks": _permutation,
    # TE's Fp8Padding / Fp8Unpadding: backward unpads / pads the gradient, one copy each, nothing saved
    "moe_quant_pad": _permutation,
    "moe_quant_unpad": _permutation,
    "moe_unpermute": _permutation,
    # autocast's cast (aten _to_copy): its gradient is dy cast back to the input's dtype, nothing saved
    "autocast_cast": _permutation,
}


def _elementwise(c: _Ctx, n: Node, dy: int, needs: set[int]) -> Contrib:
    assert isinstance(n.attrs, ElementwiseAttrs)
    fn = n.attrs.fn
    if fn in _ELEMENTWISE_RULES:
        return _ELEMENTWISE_RULES[fn](c, n, dy, needs)
    out: Contrib = []
    for i in n.inputs:
        if i not in needs:
            continue
        if fn in _PASS_THROUGH:
            out.append((i, c.like(n, i, dy, fn, [])))
        elif fn in _NEEDS_OTHER:
            others = [j for j in n.inputs if j != i][:1]
            out.append((i, c.like(n, i, dy, fn, others)))
        elif fn == "cat":
            out.append((i, c.emit(n, OpKind.VIEW, [dy], c.view_of(i, dy))))
        elif fn == "dropout":
            out.append((i, c.like(n, i, dy, fn, [n.id])))  # reads the saved mask
        elif fn == "neg":
            out.append((i, c.like(n, i, dy, fn, [])))
        else:
            out.append((i, c.like(n, i, dy, fn, [i])))
    return out


def _norm(c: _Ctx, n: Node, dy: int, needs: set[int]) -> Contrib:
    x, *params = n.inputs
    out: Contrib = []
    if x in needs:
        out.append((x, c.emit(n, OpKind.NORM, [dy, x, *params], c.spec(x), n.attrs)))
    for p in params:
        if p in needs:
            out.append(
                (p, c.emit(n, OpKind.REDUCTION, [dy, x], c.spec(p), ElementwiseAttrs("norm_param_grad"), "pgrad"))
            )
    return out


def _softmax(c: _Ctx, n: Node, dy: int, needs: set[int]) -> Contrib:
    (x,) = n.inputs[:1]
    return [(x, c.emit(n, OpKind.SOFTMAX, [dy, n.id], c.spec(x)))] if x in needs else []


def _embedding(c: _Ctx, n: Node, dy: int, needs: set[int]) -> Contrib:
    ids, w = n.inputs
    spec = c.spec(w)
    if isinstance(n.attrs, EmbeddingAttrs) and n.attrs.sparse:  # fused sparse update: only the rows looked up
        spec = spec.with_shape((max(1, n.attrs.lookups), n.attrs.dim))
    return [(w, c.emit(n, OpKind.EMBEDDING, [dy, ids], spec, n.attrs))] if w in needs else []


def _cross_entropy(c: _Ctx, n: Node, dy: int, needs: set[int]) -> Contrib:
    logits, labels = n.inputs[:2]
    if logits not in needs:
        return []
    return [(logits, c.emit(n, OpKind.CROSS_ENTROPY, [dy, logits, labels], c.spec(logits), n.attrs))]


def _view(c: _Ctx, n: Node, dy: int, needs: set[int]) -> Contrib:
    (x,) = n.inputs[:1]
    if x not in needs:
        return []
    if c.spec(x).numel > n.out.numel:  # a slice (split, narrow): its gradient is a slice too
        return [(x, dy)]
    if not c.layout_copies:
        return [(x, c.emit(n, OpKind.VIEW, [dy], c.view_of(x, dy)))]
    return [(x, _strided_view(c, n, x, dy))]


def _strided_view(c: _Ctx, n: Node, x: int, dy: int) -> int:
    """The gradient of view ``n`` of ``x`` under eager autograd, with the layout it is held in.

    A permute's backward is the inverse permute (PermuteBackward0: a view, no kernel); a view's or reshape's is
    ``grad.reshape(self.sizes())`` (tools/autograd/derivatives.yaml, ``view`` and ``_reshape_alias``), and
    ``reshape`` returns a view only where the strides allow one, otherwise a contiguous copy ("When possible,
    the returned tensor will be a view of input. Otherwise, it will be a copy", torch.reshape docs,
    https://pytorch.org/docs/stable/generated/torch.reshape.html; the test is ``computeStride`` in
    aten/src/ATen/TensorUtils.cpp). That copy is one read and one write of the gradient."""
    have, want = c.spec(dy).shape, c.spec(x).shape
    if c.spec(dy).numel != c.spec(x).numel:  # an expand's gradient (its sum is not a kernel here): no layout
        return c.emit(n, OpKind.VIEW, [dy], c.view_of(x, dy))
    permute = len(have) == len(want) and sorted(have) == sorted(want)  # a permute's gradient: never a copy
    held = _held(c, dy)
    if not permute and held is not None and layouts.view_strides(have, held, want) is None:
        # not expressible as a view: reshape copies the gradient into row-major order first
        dy = c.emit(n, OpKind.ELEMENTWISE, [dy], c.spec(dy), ElementwiseAttrs("copy", 0), "grad_copy")
    return c.emit(n, OpKind.VIEW, [dy], c.view_of(x, dy))


def _reduction(c: _Ctx, n: Node, dy: int, needs: set[int]) -> Contrib:
    return [
        (i, c.emit(n, OpKind.ELEMENTWISE, [dy], c.spec(i), ElementwiseAttrs("broadcast")))
        for i in n.inputs
        if i in needs
    ]


def _identity(c: _Ctx, n: Node, dy: int, needs: set[int]) -> Contrib:
    return [(n.inputs[0], dy)] if n.inputs and n.inputs[0] in needs else []


def _conjugate(kind: OpKind) -> Rule:
    """The collective that carries gradients back: all_gather <-> reduce_scatter, all_to_all and
    ring exchanges are their own. Several inputs travel packed; each gets a view of the result."""

    def rule(c: _Ctx, n: Node, dy: int, needs: set[int]) -> Contrib:
        assert isinstance(n.attrs, CollectiveAttrs)
        ins = [i for i in n.inputs if i in needs]
        if not ins:
            return []
        if len(n.inputs) == 1:
            spec = c.spec(n.inputs[0])
        else:
            spec = TensorSpec((sum(c.spec(i).numel for i in n.inputs),), n.out.dtype)
        grad = c.emit(n, kind, [dy], spec, n.attrs, f"grad.{kind.value}")
        if len(n.inputs) == 1:
            return [(n.inputs[0], grad)]
        return [
            (i, c.emit(n, OpKind.VIEW, [grad], c.spec(i), suffix=f"grad{j}"))
            for j, i in enumerate(n.inputs)
            if i in needs
        ]

    return rule


Rule = Callable[[_Ctx, Node, int, set[int]], Contrib]

RULES: dict[OpKind, Rule] = {
    OpKind.MATMUL: _matmul,
    OpKind.ATTENTION: _attention,
    OpKind.ELEMENTWISE: _elementwise,
    OpKind.NORM: _norm,
    OpKind.SOFTMAX: _softmax,
    OpKind.EMBEDDING: _embedding,
    OpKind.CROSS_ENTROPY: _cross_entropy,
    OpKind.VIEW: _view,
    OpKind.REDUCTION: _reduction,
    OpKind.ALL_REDUCE: _identity,  # Megatron's g: all_reduce forward, identity backward
    OpKind.ALL_GATHER: _conjugate(OpKind.REDUCE_SCATTER),
    OpKind.REDUCE_SCATTER: _conjugate(OpKind.ALL_GATHER),
    OpKind.ALL_TO_ALL: _conjugate(OpKind.ALL_TO_ALL),
    OpKind.RECV: _conjugate(OpKind.RECV),  # a ring exchange (send to the next, receive from the previous)
}


@dataclass(frozen=True)
class Autodiff:
    """Append the backward graph of the (single) loss output."""

    # cast a gradient to its input's dtype where they differ, as the autograd engine does (validate_outputs,
    # torch/csrc/autograd/engine.cpp: ``grad = grad.to(metadata.dtype)``): graphs of mixed dtypes (autocast)
    cast_grads: bool = False
    # price the copies eager autograd makes where a gradient reshapes across its strides (Framework.layout_copies)
    layout_copies: bool = False
    name: ClassVar[str] = "autodiff"

    def run(self, graph: Graph) -> Graph:
        g = graph.copy()
        if len(g.outputs) != 1:
            raise ValueError(f"autodiff needs one loss output, graph {g.name!r} has {len(g.outputs)}")
        forward = [n for n in g if n.phase is Phase.FORWARD]
        needs: set[int] = set()
        for n in forward:
            if n.out.dtype in _NO_GRAD:  # indices and masks (MoE routing, argsort) carry no gradient
                continue
            if n.op is OpKind.PARAMETER or (n.op is not OpKind.INPUT and any(i in needs for i in n.inputs)):
                needs.add(n.id)
        ctx = _Ctx(g, self.cast_grads, self.layout_copies)
        loss = g.outputs[0]
        seed = g.add(OpKind.INPUT, (), TensorSpec((1,), DType.FP32), phase=Phase.BACKWARD, name="loss.grad")
        contribs: dict[int, list[int]] = {loss: [seed]}
        for n in reversed(forward):
            parts = contribs.pop(n.id, None)
            if n.id in ctx.step_wgrads:  # every use of a recurrent weight lies after it: all steps are in
                parts = [*(parts or []), _steps_wgrad(ctx, n.id, ctx.step_wgrads.pop(n.id))]
            if not parts:
                continue
            if _sums_in_kernel(n, parts, ctx):
                dy, ctx.fused_dys[n.id] = parts[0], parts[1:]
            else:
                dy = _accumulate(ctx, n, parts)
            if n.op is OpKind.PARAMETER:
                g.grads[n.id] = dy
                continue
            rule = RULES.get(n.op)
            if rule is None:
                raise ValueError(f"no backward rule for {n.op.value} ({n.name} at {n.scope})")
            for src, grad in rule(ctx, n, dy, needs):
                if self.cast_grads and g[grad].out.dtype != g[src].out.dtype:
                    spec = TensorSpec(g[grad].out.shape, g[src].out.dtype)
                    grad = ctx.emit(n, OpKind.ELEMENTWISE, [grad], spec, ElementwiseAttrs("grad_cast", 0), "grad_cast")
                contribs.setdefault(src, []).append(grad)
        _fill_collective_sizes(g)
        return g


def _sums_in_kernel(n: Node, parts: list[int], c: _Ctx) -> bool:
    """Does ``n``'s backward kernel read all its output's whole gradients and sum them itself (a recurrent step's
    state: the gradient from the layer above and the next step's recurrent one, see :func:`_rnn_cell`)?"""
    return (
        len(parts) > 1
        and isinstance(n.attrs, ElementwiseAttrs)
        and bool(cell_of(n.attrs.fn))
        and all(c.spec(p).numel == n.out.numel for p in parts)
    )


def _accumulate(c: _Ctx, n: Node, parts: list[int]) -> int:
    """Sum whole-tensor contributions; gather slice contributions (split outputs) with one cat."""
    if len(parts) == 1:
        return parts[0]
    # Where every consumer sits in one repeated layer, the sum happens inside that layer
    # (once per repetition): in the unfolded model each layer sums its own input's grads.
    blocks = {c.g.block_of(c.g[p]) for p in parts}
    layers = {c.g.layer_of(c.g[p]) for p in parts}
    scope = blocks.pop() if len(blocks) == 1 and None not in blocks else n.scope
    scope = layers.pop() if len(layers) == 1 and None not in layers else scope
    whole = [p for p in parts if c.spec(p).numel >= n.out.numel]
    slices = [p for p in parts if c.spec(p).numel < n.out.numel]
    if slices:
        whole.append(c.emit(n, OpKind.ELEMENTWISE, slices, n.out, ElementwiseAttrs("cat", 0), "grad_cat", scope))
    dy = whole[0]
    for extra in whole[1:]:  # several consumers: sum their gradients
        dy = c.emit(n, OpKind.ELEMENTWISE, [dy, extra], n.out, ElementwiseAttrs("add"), GRAD_ACCUMULATE, scope)
    return dy


def _fill_collective_sizes(g: Graph) -> None:
    """Backward all_reduces copy the group size of the forward collectives on the same axis."""
    sizes = {n.attrs.axis: n.attrs.size for n in g if isinstance(n.attrs, CollectiveAttrs) and n.attrs.size}
    for n in list(g):
        if isinstance(n.attrs, CollectiveAttrs) and n.attrs.size == 0:
            size = sizes.get(n.attrs.axis)
            if size is None:
                raise ValueError(f"collective {n.name} on axis {n.attrs.axis.value!r} has no group size")
            g.replace(n.id, attrs=replace(n.attrs, size=size))
