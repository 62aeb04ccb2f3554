"""The ONNX -> IR op table (see ``onnx.py``): one rule per op type.

A rule reads an ONNX node (its inputs by name, shapes from inference) and adds IR
nodes through :class:`~echosim.frontend.onnx_values.OnnxValues`; the converter costs
ops with no rule as memory-bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from echosim.errors import EchosimError
from echosim.frontend.conv import conv_matmul
from echosim.frontend.onnx_values import OnnxValues, attr, scope_of
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
from echosim.ir.types import TensorSpec

# ---- rules ----------------------------------------------------------------------------------------

Rule = Callable[[OnnxValues, Any], None]


def _view(c: OnnxValues, node: Any) -> None:
    if node.input[0] in c.params:  # a transposed weight: materialised only if something other than a matmul reads it
        c.lazy[node.output[0]] = node
        return
    nid = c.emit(node, OpKind.VIEW, c.data(node, (0,)))
    view = c.graph[nid]
    if node.op_type == "Transpose" and view.inputs:  # its perm: default, the axes reversed (ONNX operator docs)
        before = c.graph[view.inputs[0]].out.shape
        perm = tuple(int(d) % max(1, len(before)) for d in attr(node, "perm", range(len(before) - 1, -1, -1)))
        if attrs := ViewAttrs.permuting(perm, before, view.out.shape):
            c.graph.replace(nid, attrs=attrs)


def _views(c: OnnxValues, node: Any) -> None:
    """Split: every output a view of the input."""
    src = c.value(node.input[0])
    for i, out in enumerate(node.output):
        if out:
            c.emit(node, OpKind.VIEW, [src], out=i)


def _sequence(c: OnnxValues, node: Any) -> None:
    c.env[node.output[0]] = c.value(node.input[0])  # SplitToSequence: SequenceAt picks views


def _sequence_at(c: OnnxValues, node: Any) -> None:
    c.emit(node, OpKind.VIEW, [c.env.get(node.input[0])])


def _cast(c: OnnxValues, node: Any) -> None:
    src = node.input[0]
    before = c.dt(c.types.get(src, (0, None))[0])
    after = c.dt(int(attr(node, "to", 1)))
    if before == after:
        _view(c, node)
    else:
        c.emit(node, OpKind.ELEMENTWISE, c.data(node, (0,)), ElementwiseAttrs("cast", 0))


def _dropout(c: OnnxValues, node: Any) -> None:
    """A Dropout with a ratio above zero runs in the training step echosim simulates.

    Exporters write models in inference mode (``training_mode`` false or absent), so the
    ratio, not the mode, says whether the model trains with dropout.
    """
    ratio = c.const(node.input[1]) if len(node.input) > 1 and node.input[1] else None
    mode = c.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    dynamic_mode = len(node.input) > 2 and node.input[2] and node.input[2] not in c.static
    training = dynamic_mode or (mode is not None and bool(mode)) or (ratio is not None and float(ratio) > 0)
    if training:
        c.emit(node, OpKind.ELEMENTWISE, c.data(node, (0,)), ElementwiseAttrs("dropout", 2))
    else:
        _view(c, node)


def _elementwise(fn: str, flops: int = 1) -> Rule:
    def rule(c: OnnxValues, node: Any) -> None:
        c.emit(node, OpKind.ELEMENTWISE, c.data(node), ElementwiseAttrs(fn, flops))

    return rule


def _reduction(fn: str) -> Rule:
    def rule(c: OnnxValues, node: Any) -> None:
        c.emit(node, OpKind.REDUCTION, c.data(node, (0,)), ElementwiseAttrs(fn))

    return rule


def _bias_after(c: OnnxValues, node: Any, n: int) -> list[int | None]:
    """PyTorch's linear is one GEMM with its bias; an exported MatMul + Add(bias) is folded back."""
    users = c.consumers.get(node.output[0], [])
    if len(users) != 1 or users[0].op_type != "Add" or node.output[0] in {o.name for o in c.proto.graph.output}:
        return []
    add = users[0]
    other = [i for i in add.input if i != node.output[0]]
    if len(other) != 1 or other[0] not in c.params or c.shape(other[0]) != (n,):
        return []
    c.aliases[add.output[0]] = node.output[0]
    return [c.value(other[0])]


def _matmul(c: OnnxValues, node: Any) -> None:
    a, b = node.input[:2]
    sa, sb = c.shape(a), c.shape(b)
    if len(sb) == 2:
        attrs = MatmulAttrs(m=math.prod(sa[:-1]) if len(sa) > 1 else 1, n=sb[1], k=sb[0])
        w = c.weight(b, natural_is_nk=False)
    else:
        out = c.shape(node.output[0])
        attrs = MatmulAttrs(m=sa[-2] if len(sa) >= 2 else 1, n=sb[-1], k=sb[-2], batch=math.prod(out[:-2]))
        w = c.weight(b, natural_is_nk=False) if b in c.params else c.value(b)
    bias = _bias_after(c, node, attrs.n) if len(sb) == 2 else []
    c.emit(node, OpKind.MATMUL, [c.value(a), w, *bias], attrs)


def _gemm(c: OnnxValues, node: Any) -> None:
    a, b = node.input[:2]
    sa, sb = c.shape(a), c.shape(b)
    m, k = (sa[1], sa[0]) if attr(node, "transA", 0) else sa
    trans_b = bool(attr(node, "transB", 0))
    n = sb[0] if trans_b else sb[1]
    bias = [c.value(node.input[2])] if len(node.input) > 2 else []
    c.emit(node, OpKind.MATMUL, [c.value(a), c.weight(b, natural_is_nk=trans_b), *bias], MatmulAttrs(m=m, n=n, k=k))


def _conv(c: OnnxValues, node: Any) -> None:
    """Conv and ConvTranspose (:func:`~echosim.frontend.conv.conv_matmul`; ONNX holds the weight as PyTorch does)."""
    x, w = node.input[:2]
    groups = int(attr(node, "group", 1))
    transposed = node.op_type == "ConvTranspose"
    attrs = conv_matmul(c.shape(x), c.shape(w), c.shape(node.output[0]), groups, transposed)
    c.emit(node, OpKind.MATMUL, c.data(node, (0, 1, 2)), attrs)


def _einsum(c: OnnxValues, node: Any) -> None:
    equation = str(
        attr(node, "equation", b"")
        if not isinstance(attr(node, "equation"), bytes)
        else attr(node, "equation").decode()
    )
    if len(node.input) != 2 or "..." in equation or "->" not in equation:
        c.unknown_op(node)
        return
    lhs, out = equation.replace(" ", "").split("->")
    a, b = lhs.split(",")
    sizes: dict[str, int] = {}
    for letters, name in ((a, node.input[0]), (b, node.input[1])):
        sizes.update(zip(letters, c.shape(name), strict=False))
    batch = math.prod(sizes[ch] for ch in out if ch in a and ch in b)
    m = math.prod(sizes[ch] for ch in out if ch in a and ch not in b)
    n = math.prod(sizes[ch] for ch in out if ch in b and ch not in a)
    k = math.prod(sizes[ch] for ch in sizes if ch in a and ch in b and ch not in out)
    c.emit(node, OpKind.MATMUL, c.data(node), MatmulAttrs(m=m, n=n, k=k, batch=batch))


def _attention(c: OnnxValues, node: Any) -> None:
    """ONNX Attention (opset 23) and onnxruntime's MultiHeadAttention / GroupQueryAttention."""
    q, k, v = node.input[:3]
    qs, ks, vs = c.shape(q), c.shape(k), c.shape(v)
    if len(qs) == 4:
        batch, heads, q_len, dq = qs
        kv_heads, kv_len, dv = ks[1], ks[2], vs[3]
    else:  # (batch, seq, heads * dim)
        heads = int(attr(node, "q_num_heads", 0) or attr(node, "num_heads", 1))
        kv_heads = int(attr(node, "kv_num_heads", 0) or heads)
        batch, q_len, kv_len = qs[0], qs[1], ks[1]
        dq, dv = qs[2] // heads, vs[2] // kv_heads
    causal = (
        bool(attr(node, "is_causal", 0))
        or bool(attr(node, "unidirectional", 0))
        or node.op_type == "GroupQueryAttention"
    )
    attrs = AttentionAttrs(
        batch, heads, kv_heads, q_len, kv_len, (dq + dv) // 2, causal, head_dim_v=dv if dv != dq else 0
    )
    ins = c.data(node, (0, 1, 2, 3))
    c.emit(node, OpKind.ATTENTION, ins, attrs)


def _norm(kind: str, idx: tuple[int, ...]) -> Rule:
    def rule(c: OnnxValues, node: Any) -> None:
        c.emit(node, OpKind.NORM, c.data(node, idx), NormAttrs(kind))

    return rule


def _sole_user(c: OnnxValues, name: str, op_type: str) -> Any:
    """The one node that reads ``name``, if it is an ``op_type`` and ``name`` is not a graph output; else None."""
    users = c.consumers.get(name, [])
    if len(users) != 1 or users[0].op_type != op_type or name in {o.name for o in c.proto.graph.output}:
        return None
    return users[0]


def _sigmoid(c: OnnxValues, node: Any) -> None:
    """``x * sigmoid(x)``, as torch.onnx writes SiLU, is one SiLU kernel, as PyTorch runs ``F.silu``: the same
    cost as a torch capture of the same model; so is ``F.glu`` (Split, then the first half times the sigmoid of
    the second). A sigmoid that gates anything else is a sigmoid. (A model that wrote
    ``x * torch.sigmoid(x)`` itself, two kernels in eager PyTorch, reads the same in ONNX and is costed as one.)"""
    x, s = node.input[0], node.output[0]
    mul = _sole_user(c, s, "Mul")
    split = c.producer.get(x)
    halves = list(split.output) if split is not None and split.op_type == "Split" else []
    if mul is not None and sorted(mul.input) == sorted([x, s]):
        nid = c.emit(node, OpKind.ELEMENTWISE, c.data(node), ElementwiseAttrs("silu", 4))
    elif mul is not None and len(halves) == 2 and x == halves[1] and sorted(mul.input) == sorted([halves[0], s]):
        # F.glu: the input split in two halves, the first times the sigmoid of the second (one kernel in PyTorch)
        whole = split.input[0]
        nid = c.graph.add(OpKind.ELEMENTWISE, [c.value(whole)], c.spec(mul.output[0], mul), ElementwiseAttrs("glu"),
                          scope=scope_of(node), name=mul.output[0])  # fmt: skip
        c.env[s] = nid
    else:
        c.emit(node, OpKind.ELEMENTWISE, c.data(node), ElementwiseAttrs("sigmoid", 4))
        return
    c.env[mul.output[0]] = nid
    c.aliases[mul.output[0]] = mul.output[0]


def _affine(c: OnnxValues, name: str, op_type: str, channels: int) -> Any:
    """The ``Mul`` by a per-channel weight or ``Add`` of a per-channel bias (``[C, 1, ...]``) that reads ``name``."""
    node = _sole_user(c, name, op_type)
    if node is None:
        return None
    other = [i for i in node.input if i != name]
    ok = len(other) == 1 and other[0] in c.params and math.prod(c.shape(other[0])) == channels
    return node if ok else None


def _instance_norm(c: OnnxValues, node: Any) -> None:
    """InstanceNormalization; or, where a Reshape to ``[N, G, -1]`` feeds it and a Reshape back, a per-channel
    Mul and Add follow, GroupNorm, as torch.onnx writes ``nn.GroupNorm``: one kernel with its weight and bias,
    as PyTorch runs it (``native_group_norm``) and a torch capture costs it, not a norm and two more passes."""
    before = c.producer.get(node.input[0])
    back = _sole_user(c, node.output[0], "Reshape")
    grouped = before is not None and before.op_type == "Reshape" and back is not None
    x, out = (before.input[0], back.output[0]) if grouped else ("", "")
    if not grouped or c.shape(x) != c.shape(out) or len(c.shape(x)) < 2:
        c.emit(node, OpKind.NORM, c.data(node, (0, 1, 2)), NormAttrs("instancenorm"))
        return
    channels = c.shape(x)[1]
    scale = _affine(c, out, "Mul", channels)
    shift = _affine(c, scale.output[0], "Add", channels) if scale is not None else None
    last = shift or back
    params = [i for n in (scale, shift) if n is not None for i in n.input if i in c.params]
    spec = c.spec(out, back)
    nid = c.graph.add(OpKind.NORM, [c.value(x), *(c.value(p) for p in params)], spec, NormAttrs("groupnorm"),
                      scope=scope_of(node), name=last.output[0])  # fmt: skip
    for n in (node, back, scale, shift):  # each is read as the one kernel's output, none costed again
        if n is not None:
            c.env[n.output[0]] = nid
            c.aliases[n.output[0]] = n.output[0]


def _softmax(c: OnnxValues, node: Any) -> None:
    c.emit(node, OpKind.SOFTMAX, c.data(node, (0,)))


def _gather(c: OnnxValues, node: Any) -> None:
    data, idx = node.input[:2]
    ids = c.value(idx) if data in c.params else None  # None: ids no node defines (a malformed graph)
    if ids is not None and len(c.shape(data)) == 2 and int(attr(node, "axis", 0)) == 0:
        vocab, dim = c.shape(data)
        c.emit(node, OpKind.EMBEDDING, [ids, c.value(data)], EmbeddingAttrs(vocab, dim))
    elif idx in c.static:
        _view(c, node)  # picking fixed rows: a view
    else:
        c.emit(node, OpKind.ELEMENTWISE, c.data(node), ElementwiseAttrs("gather"))


def _cross_entropy(c: OnnxValues, node: Any) -> None:
    scores = node.input[0]
    vocab = c.shape(scores)[1]
    c.emit(node, OpKind.CROSS_ENTROPY, c.data(node, (0, 1)), CrossEntropyAttrs(vocab))


def _rnn(cell: str) -> Rule:
    """ONNX LSTM, GRU and RNN, one forward direction, as :func:`recurrent.rnn_layer` costs them. A GRU must
    apply its reset gate after the recurrent GEMM (``linear_before_reset`` = 1, what PyTorch exports), and an
    RNN must use Tanh or Relu; other forms (and a reverse or bidirectional layer) run a step otherwise and
    stay unruled (costed as memory-bound, with a warning)."""

    def rule(c: OnnxValues, node: Any) -> None:
        from echosim.frontend.recurrent import CELLS, rnn_layer

        x, w, r = node.input[:3]
        y = node.output[0] if node.output else ""
        kind = cell
        if cell == "rnn_tanh":  # activations: default Tanh (ONNX operator docs)
            acts = [a.decode() if isinstance(a, bytes) else str(a) for a in attr(node, "activations", [b"Tanh"])]
            kind = {"Tanh": "rnn_tanh", "Relu": "rnn_relu"}.get(acts[0], "") if len(acts) == 1 else ""
        if cell == "gru" and not int(attr(node, "linear_before_reset", 0)):
            kind = ""
        if not kind or attr(node, "direction", b"forward") not in (b"forward", "forward"):
            c.unknown_op(node)
            return
        layout = int(attr(node, "layout", 0))
        xs = c.shape(x)
        steps, batch = (xs[1], xs[0]) if layout else (xs[0], xs[1])
        hidden = int(attr(node, "hidden_size", c.shape(r)[-1]))
        gates = CELLS[kind].gates
        want = {w: (1, gates * hidden, xs[-1]), r: (1, gates * hidden, hidden)}
        for name, shape in want.items():
            if tuple(c.shape(name)) != shape:
                raise EchosimError(
                    f"{c.path}: {node.op_type} {node.name or y!r} with hidden_size {hidden} needs {name!r} of shape "
                    f"{list(shape)} (one direction, {gates} gate blocks), not {list(c.shape(name))}"
                )
        bias = [v for v in c.data(node, (3,)) if v is not None]
        dt = c.spec(y, node).dtype if y else c.dtype
        xv, wv, rv = c.value(x), c.value(w), c.value(r)
        assert xv is not None and wv is not None and rv is not None
        h0 = c.value(node.input[5]) if len(node.input) > 5 else None
        if h0 is not None:
            state = TensorSpec((batch, hidden), dt)
            h0 = c.graph.add(OpKind.VIEW, [h0], state, scope=scope_of(node), name=f"{y}.h0")
        out = rnn_layer(
            c.graph, kind, xv, wv, rv, bias, batch=batch, steps=steps, in_dim=xs[-1], hidden=hidden, dtype=dt,
            batch_first=bool(layout), scope=scope_of(node), name=y or node.name, h0=h0,
        )  # fmt: skip
        if y:  # Y is (seq, num_directions=1, batch, hidden): a view of the layer output
            c.env[y] = c.graph.add(OpKind.VIEW, [out], c.spec(y, node), scope=scope_of(node), name=y)

    return rule


SHAPE_OPS = {"Shape", "Size"}
_VIEW_OPS = ("Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Expand", "Identity",
             "DepthToSpace", "SpaceToDepth")  # fmt: skip
# GridSample: bilinear, 4 taps of a multiply and an add each
_ACT = {"Gelu": 8, "FastGelu": 8, "BiasGelu": 8, "QuickGelu": 8, "Relu": 1, "Sigmoid": 4, "Tanh": 4, "Erf": 4,
        "Exp": 4, "Log": 4, "Softplus": 4, "Mish": 6, "HardSwish": 2, "HardSigmoid": 2, "LeakyRelu": 1, "Elu": 4,
        "Selu": 4, "Sin": 4, "Cos": 4, "Sqrt": 2, "Reciprocal": 1, "Pow": 2, "PRelu": 1, "Celu": 4, "Shrink": 1,
        "ThresholdedRelu": 1, "Softsign": 2, "Tan": 4, "Atan": 4, "Asin": 4, "Acos": 4, "Sinh": 4, "Cosh": 4,
        "Asinh": 4, "Acosh": 4, "Atanh": 4, "LpNormalization": 3, "MeanVarianceNormalization": 4,
        "GridSample": 8}  # fmt: skip
_ELEMENTWISE = ("Add", "Sub", "Mul", "Div", "Neg", "Abs", "Where", "Max", "Min", "Equal", "Less", "Greater",
                "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Xor", "Clip", "Mod", "Floor", "Ceil", "Round",
                "Sign", "CumSum", "Trilu", "Range", "ConstantOfShape", "Tile", "Pad", "ScatterND", "ScatterElements",
                "GatherElements", "GatherND", "OneHot", "IsNaN", "IsInf", "Resize", "Upsample", "TopK",
                "Hardmax")  # fmt: skip
_REDUCTIONS = ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceL1",
               "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin", "GlobalAveragePool", "GlobalMaxPool",
               "MaxPool", "AveragePool", "LpPool")  # fmt: skip

RULES: dict[str, Rule] = {op: _view for op in _VIEW_OPS}
RULES.update({op: _elementwise(op.lower(), flops) for op, flops in _ACT.items()})
RULES.update({op: _elementwise(op.lower()) for op in _ELEMENTWISE})
RULES.update({op: _reduction(op.lower()) for op in _REDUCTIONS})
RULES.update(
    {
        "Split": _views,
        "SplitToSequence": _sequence,
        "SequenceAt": _sequence_at,
        "Cast": _cast,
        "CastLike": _cast,
        "Dropout": _dropout,
        "Concat": _elementwise("cat", 0),
        "MatMul": _matmul,
        "Gemm": _gemm,
        "Conv": _conv,
        "ConvTranspose": _conv,
        "Einsum": _einsum,
        "Attention": _attention,
        "MultiHeadAttention": _attention,
        "GroupQueryAttention": _attention,
        "LayerNormalization": _norm("layernorm", (0, 1, 2)),
        "SkipLayerNormalization": _norm("layernorm", (0, 1, 2, 3)),
        "RMSNormalization": _norm("rmsnorm", (0, 1)),
        "SimplifiedLayerNormalization": _norm("rmsnorm", (0, 1)),
        "SkipSimplifiedLayerNormalization": _norm("rmsnorm", (0, 1, 2)),
        "BatchNormalization": _norm("batchnorm", (0, 1, 2)),
        "InstanceNormalization": _instance_norm,
        "Sigmoid": _sigmoid,
        "GroupNormalization": _norm("groupnorm", (0, 1, 2)),
        "Softmax": _softmax,
        "LogSoftmax": _softmax,
        "Gather": _gather,
        "SoftmaxCrossEntropyLoss": _cross_entropy,
        "NegativeLogLikelihoodLoss": _cross_entropy,
        "LSTM": _rnn("lstm"),
        "GRU": _rnn("gru"),
        "RNN": _rnn("rnn_tanh"),
    }
)
