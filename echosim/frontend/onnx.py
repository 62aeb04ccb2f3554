"""``.onnx`` sources: loaded with ``onnx``, shapes from ``onnx.shape_inference``, weights never read.

Weights may be absent: initializers whose external data file is missing, or
weights declared only by their shape, are read for their shapes alone. Symbolic
input dimensions are bound from ``--micro-batch`` (a dimension named like a
batch, or the first axis) and ``--seq-len`` (a dimension named like a sequence,
or the second axis of integer token ids); any other symbolic dimension is an
error that names it.

Ops map to IR through ``_RULES`` (MatMul, Gemm, Conv, Attention, the
normalisations, Softmax, Gelu, Einsum, LSTM, Gather as embedding, the
elementwise ops, Reshape/Transpose/Slice/... as views). An op with no rule is
costed as a memory-bound elementwise op and listed in the warnings. Scopes come
from the torch exporter's ``pkg.torch.onnx.name_scopes`` metadata, else from
``/model/layers.0/attn/MatMul``-style node names, so TP plan patterns apply.
Layers stored N times in the file are folded back to one by :mod:`irfold`.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from echosim.errors import EchosimError
from echosim.ir.graph import Graph
from echosim.ir.ops import (
    AttentionAttrs,
    CrossEntropyAttrs,
    ElementwiseAttrs,
    EmbeddingAttrs,
    MatmulAttrs,
    NormAttrs,
    OpKind,
    ParamAttrs,
)
from echosim.ir.types import DType, TensorSpec

if TYPE_CHECKING:
    from echosim.plan import Plan

_BATCH_NAME = re.compile(r"batch|^(b|n|bs|bsz)$|^(b|n|bs|bsz)[_\d]", re.IGNORECASE)
_SEQ_NAME = re.compile(r"seq|sequence|len|token|time|step|^(s|t|l)$|position", re.IGNORECASE)

# TensorProto element types
_FLOAT_TYPES = {1, 10, 11, 16, 17, 18, 19, 20, 21, 23}  # float, fp16, double, bf16, fp8 variants, fp4
_INT64, _INT32, _BOOL = 7, 6, 9


@dataclass
class OnnxModel:
    """An ONNX file, checked at load, captured once the plan binds its symbolic dimensions."""

    source: str
    path: Path
    proto: Any

    def capture(self, plan: Plan) -> tuple[Graph, list[str], int]:
        from echosim.frontend import Note
        from echosim.frontend.irfold import fold_layers
        from echosim.frontend.loss import ensure_loss
        from echosim.passes.flops import param_count

        inferred, notes = bind_and_infer(self.proto, self.path, plan)
        conv = _Onnx(inferred, DType.parse(plan.dtype), self.path.name, self.path)
        graph = fold_layers(conv.run(), notes)
        messages = list(conv.warnings)
        try:
            ensure_loss(graph, notes)
        except ValueError as exc:
            raise EchosimError(f"{self.path}: {exc}") from None
        return graph, [*messages, *(Note(n) for n in notes)], param_count(graph)


def load(source: str) -> OnnxModel:
    """The ``.onnx`` frontend loader: parse the file (no external data) and check it is a model."""
    import onnx
    from google.protobuf.message import DecodeError

    path = Path(source).expanduser()
    if not path.is_file():
        raise EchosimError(f"{source}: no such file")
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError) as exc:
        raise EchosimError(f"{path} is not a valid ONNX model (truncated or another format?): {exc}") from None
    if not proto.HasField("graph") or not proto.graph.node:
        raise EchosimError(f"{path} is not an ONNX model with a graph (empty or another format?)")
    return OnnxModel(source, path, proto)


# ---- binding symbolic dimensions ------------------------------------------------------------


def _dims(value_info: Any) -> list[Any]:
    t = value_info.type.tensor_type
    return list(t.shape.dim) if t.HasField("shape") else []


def bind_and_infer(proto: Any, path: Path, plan: Plan) -> tuple[Any, list[str]]:
    """A copy of ``proto`` with symbolic input dims set from the plan, and every shape inferred."""
    from echosim.frontend.onnx_shapes import infer_concrete

    model = type(proto)()
    model.CopyFrom(proto)
    init_names = {t.name for t in model.graph.initializer}
    notes: list[str] = []
    fixed_batch: int | None = None
    fixed_seq: int | None = None
    for value in model.graph.input:
        if value.name in init_names:
            continue
        elem = value.type.tensor_type.elem_type
        for axis, dim in enumerate(_dims(value)):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                if axis == 0:
                    fixed_batch = dim.dim_value
                elif axis == 1 and elem in (_INT64, _INT32):
                    fixed_seq = dim.dim_value
                continue
            name = dim.dim_param if dim.HasField("dim_param") else ""
            role = _role(name, axis, elem)
            if role is None:
                raise EchosimError(
                    f"{path}: input {value.name!r} has symbolic dimension {name or '?'!r} (axis {axis}) "
                    "that --micro-batch and --seq-len do not bind"
                )
            if role == "seq" and not plan.seq_len:
                raise EchosimError(
                    f"{path}: input {value.name!r} has a symbolic sequence dimension {name or '?'!r}: "
                    "bind it with --seq-len"
                )
            dim.Clear()
            dim.dim_value = plan.micro_batch if role == "batch" else plan.seq_len
    if plan.seq_len and fixed_seq not in (None, plan.seq_len):
        notes.append(f"--seq-len {plan.seq_len} does not apply: {path.name} fixes the sequence at {fixed_seq}")
    if plan.micro_batch != 1 and fixed_batch not in (None, plan.micro_batch):
        notes.append(f"--micro-batch {plan.micro_batch} does not apply: {path.name} fixes the batch at {fixed_batch}")
    try:
        inferred = infer_concrete(model)
    except Exception as exc:
        raise EchosimError(f"{path}: ONNX shape inference failed: {' '.join(str(exc).split())[:300]}") from None
    return inferred, notes


def _role(name: str, axis: int, elem: int) -> str | None:
    if name and _BATCH_NAME.search(name):
        return "batch"
    if name and _SEQ_NAME.search(name):
        return "seq"
    if axis == 0:
        return "batch"
    if axis == 1 and elem in (_INT64, _INT32):
        return "seq"
    return None


# ---- conversion ---------------------------------------------------------------------------------


def _attr(node: Any, name: str, default: Any = None) -> Any:
    import onnx

    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


@dataclass
class _Onnx:
    proto: Any
    dtype: DType
    name: str
    path: Path
    graph: Graph = field(init=False)
    warnings: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        g = self.proto.graph
        self.graph = Graph(self.name)
        self.types: dict[str, tuple[int, tuple[int, ...] | None]] = {}
        for vi in [*g.input, *g.value_info, *g.output]:
            t = vi.type.tensor_type
            shape = None
            if t.HasField("shape"):
                dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
                shape = tuple(dims) if all(d > 0 for d in dims) else (None if any(d < 0 for d in dims) else tuple(dims))
            self.types[vi.name] = (t.elem_type, shape)
        self.inits = {t.name: t for t in g.initializer}
        for t in g.initializer:
            self.types[t.name] = (t.data_type, tuple(int(d) for d in t.dims))
        self.env: dict[str, int | None] = {}
        self.lazy: dict[str, Any] = {}
        self.static: set[str] = set()
        self.producer: dict[str, Any] = {}
        self.consumers: dict[str, list[Any]] = {}
        for node in g.node:
            for o in node.output:
                self.producer[o] = node
            for i in node.input:
                self.consumers.setdefault(i, []).append(node)
        self.aliases: dict[str, str] = {}  # an Add folded into the matmul before it
        self._param_ir: dict[tuple[str, bool], int] = {}
        self._param_swapped: dict[str, bool] = {}
        self._unknown: dict[str, int] = {}
        self._params = self._find_params()

    # -- what is a weight ------------------------------------------------------------------
    def _find_params(self) -> set[str]:
        """Float initializers (and shape-only weights) that computation reads; never BN running stats."""
        g = self.proto.graph
        produced = set(self.producer)
        inputs = {v.name for v in g.input}
        stats = {n.input[i] for n in g.node if n.op_type == "BatchNormalization" for i in (3, 4) if i < len(n.input)}
        used = {i for n in g.node for i in n.input if i}
        params = set()
        for name in used - produced - stats:
            elem, shape = self.types.get(name, (0, None))
            if elem not in _FLOAT_TYPES or shape is None or math.prod(shape) <= 1:
                continue
            if name in self.inits or name not in inputs:
                params.add(name)
        weight_slots = {"MatMul": (1,), "Gemm": (1, 2), "Conv": (1, 2), "ConvTranspose": (1, 2), "Gather": (0,),
                        "LayerNormalization": (1, 2), "RMSNormalization": (1,)}  # fmt: skip
        for n in g.node:  # float graph inputs with static shapes used only as weights
            for i in weight_slots.get(n.op_type, ()):
                if i < len(n.input) and n.input[i] in inputs and n.input[i] not in self.inits:
                    elem, shape = self.types.get(n.input[i], (0, None))
                    if elem in _FLOAT_TYPES and shape is not None:
                        params.add(n.input[i])
        return params

    # -- values ------------------------------------------------------------------------------
    def dt(self, elem: int) -> DType:
        if elem in _FLOAT_TYPES:
            return self.dtype
        if elem == _BOOL:
            return DType.BOOL
        return DType.INT64 if elem == _INT64 else DType.INT32

    def spec(self, name: str, node: Any = None, like: int | None = None) -> TensorSpec:
        elem, shape = self.types.get(name, (0, None))
        if shape is None and like is not None:  # same shape as its first operand (elementwise ops)
            return TensorSpec(self.graph[like].out.shape, self.dt(elem) if elem else self.graph[like].out.dtype)
        if shape is None:
            where = f" (output of {node.op_type} {node.name!r})" if node is not None else ""
            raise EchosimError(f"{self.path}: shape of {name!r}{where} is unknown after shape inference")
        return TensorSpec(shape or (1,), self.dt(elem))

    def shape(self, name: str) -> tuple[int, ...]:
        shape = self.types.get(name, (0, None))[1]
        if shape is None:
            raise EchosimError(f"{self.path}: shape of {name!r} is unknown after shape inference")
        return shape

    def value(self, name: str) -> int | None:
        if not name or name in self.static:
            return None
        if name in self._params:
            return self.param(name)
        if name in self.lazy:
            node = self.lazy.pop(name)
            self.emit(node, OpKind.VIEW, [self.param(node.input[0])])
        return self.env.get(name)

    def param(self, name: str, swapped: bool = False) -> int:
        key = (name, swapped)
        if key in self._param_ir:
            return self._param_ir[key]
        spec = self.spec(name)
        if swapped:
            spec = spec.with_shape((*spec.shape[:-2], spec.shape[-1], spec.shape[-2]))
        if name not in self._param_swapped:
            self._param_swapped[name] = swapped
            scope = _param_scope(name)
            nid = self.graph.add(OpKind.PARAMETER, (), spec, ParamAttrs(), scope=scope, name=name)
        else:
            base = self.param(name, self._param_swapped[name])
            nid = self.graph.add(OpKind.VIEW, (base,), spec, scope=self.graph[base].scope, name=f"{name}.t")
        self._param_ir[key] = nid
        return nid

    def weight(self, name: str, natural_is_nk: bool) -> int | None:
        """A matmul's B operand; a weight behind Transpose nodes is held as (..., n, k)."""
        swaps, cur = 0, name
        while (
            cur in self.producer
            and self.producer[cur].op_type == "Transpose"
            and _swaps_last_two(self.producer[cur], self.shape(cur))
        ):
            cur, swaps = self.producer[cur].input[0], swaps + 1
        if cur in self._params:
            return self.param(cur, swapped=natural_is_nk != (swaps % 2 == 0))
        return self.value(name)

    def emit(self, node: Any, op: OpKind, inputs: list[int | None], attrs: Any = None, out: int = 0) -> int:
        ins = [i for i in inputs if i is not None]
        name = node.output[out]
        spec = self.spec(name, node, like=ins[0] if ins and op in (OpKind.ELEMENTWISE, OpKind.VIEW) else None)
        nid = self.graph.add(op, ins, spec, attrs, scope=_scope(node), name=name)
        self.env[name] = nid
        return nid

    def data(self, node: Any, idx: tuple[int, ...] | None = None) -> list[int | None]:
        names = node.input if idx is None else [node.input[i] for i in idx if i < len(node.input)]
        return [self.value(n) for n in names]

    # -- main loop ---------------------------------------------------------------------------
    def run(self) -> Graph:
        g = self.proto.graph
        for t in g.initializer:
            if t.name not in self._params:
                self.static.add(t.name)
        for v in g.input:
            if v.name in self.inits or v.name in self._params:
                continue
            self.env[v.name] = self.graph.add(OpKind.INPUT, (), self.spec(v.name), name=v.name)
            self.graph.inputs.append(self.env[v.name])
        live = self._live()
        for node in g.node:
            if not any(o in live for o in node.output):
                continue
            if (
                node.op_type == "Constant"
                or node.op_type in _SHAPE_OPS
                or (node.input and all((not i) or i in self.static for i in node.input))
            ):
                self.static.update(node.output)
                continue
            if node.output and node.output[0] in self.aliases:
                self.env[node.output[0]] = self.env[self.aliases[node.output[0]]]
                continue
            rule = _RULES.get(node.op_type)
            if rule is None:
                self._unknown_op(node)
            else:
                rule(self, node)
            first = self.env.get(node.output[0]) if node.output else None
            for extra in node.output[1:]:  # further outputs (TopK indices, LSTM states): views of the first
                if extra and extra not in self.env and first is not None:
                    self.env[extra] = self.graph.add(OpKind.VIEW, [first], self.spec(extra, node, like=first),
                                                     scope=_scope(node), name=extra)  # fmt: skip
        self.graph.outputs = [v for v in (self.value(o.name) for o in g.output) if v is not None]
        for op, count in self._unknown.items():
            if count > 1:
                self.warnings.append(f"({op} occurs {count} times)")
        return self.graph

    def _live(self) -> set[str]:
        live = {o.name for o in self.proto.graph.output}
        for node in reversed(list(self.proto.graph.node)):
            if any(o in live for o in node.output):
                live.update(i for i in node.input if i)
        return live

    def _unknown_op(self, node: Any) -> None:
        op = f"{node.domain + '.' if node.domain else ''}{node.op_type}"
        if op not in self._unknown:
            self.warnings.append(
                f"no rule for ONNX op {op} at {_scope(node) or node.name or '<root>'}: costed as memory-bound"
            )
        self._unknown[op] = self._unknown.get(op, 0) + 1
        for i, out in enumerate(node.output):
            if out:
                self.emit(node, OpKind.ELEMENTWISE, self.data(node), ElementwiseAttrs(node.op_type.lower()), out=i)


def _swaps_last_two(node: Any, out_shape: tuple[int, ...]) -> bool:
    rank = len(out_shape)
    perm = _attr(node, "perm")
    if perm is None:
        return rank == 2
    return list(perm) == [*range(rank - 2), rank - 1, rank - 2]


def _param_scope(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name and "::" not in name else ""


def _scope(node: Any) -> str:
    """Module path of a node: torch exporter metadata, else a ``/a/b/Op`` node name."""
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            try:
                scopes = ast.literal_eval(prop.value)
            except (ValueError, SyntaxError):
                break
            return str(scopes[-2]) if len(scopes) >= 2 else ""
    if node.name.startswith("/"):
        parts = [p for p in node.name.strip("/").split("/") if p]
        return ".".join(parts[:-1])
    return ""


# ---- rules ----------------------------------------------------------------------------------------

Rule = Callable[[_Onnx, Any], None]


def _view(c: _Onnx, node: Any) -> None:
    if node.input[0] in c._params:  # a transposed weight: materialised only if something other than a matmul reads it
        c.lazy[node.output[0]] = node
        return
    c.emit(node, OpKind.VIEW, c.data(node, (0,)))


def _views(c: _Onnx, node: Any) -> None:
    """Split: every output a view of the input."""
    src = c.value(node.input[0])
    for i, out in enumerate(node.output):
        if out:
            c.emit(node, OpKind.VIEW, [src], out=i)


def _sequence(c: _Onnx, node: Any) -> None:
    c.env[node.output[0]] = c.value(node.input[0])  # SplitToSequence: SequenceAt picks views


def _sequence_at(c: _Onnx, node: Any) -> None:
    c.emit(node, OpKind.VIEW, [c.env.get(node.input[0])])


def _cast(c: _Onnx, node: Any) -> None:
    src = node.input[0]
    before = c.dt(c.types.get(src, (0, None))[0])
    after = c.dt(int(_attr(node, "to", 1)))
    if before == after:
        _view(c, node)
    else:
        c.emit(node, OpKind.ELEMENTWISE, c.data(node, (0,)), ElementwiseAttrs("cast", 0))


def _dropout(c: _Onnx, node: Any) -> None:
    training = len(node.input) > 2 and node.input[2] and node.input[2] not in c.static
    if training:
        c.emit(node, OpKind.ELEMENTWISE, c.data(node, (0,)), ElementwiseAttrs("dropout", 2))
    else:
        _view(c, node)


def _elementwise(fn: str, flops: int = 1) -> Rule:
    def rule(c: _Onnx, node: Any) -> None:
        c.emit(node, OpKind.ELEMENTWISE, c.data(node), ElementwiseAttrs(fn, flops))

    return rule


def _reduction(fn: str) -> Rule:
    def rule(c: _Onnx, node: Any) -> None:
        c.emit(node, OpKind.REDUCTION, c.data(node, (0,)), ElementwiseAttrs(fn))

    return rule


def _bias_after(c: _Onnx, node: Any, n: int) -> list[int | None]:
    """PyTorch's linear is one GEMM with its bias; an exported MatMul + Add(bias) is folded back."""
    users = c.consumers.get(node.output[0], [])
    if len(users) != 1 or users[0].op_type != "Add" or node.output[0] in {o.name for o in c.proto.graph.output}:
        return []
    add = users[0]
    other = [i for i in add.input if i != node.output[0]]
    if len(other) != 1 or other[0] not in c._params or c.shape(other[0]) != (n,):
        return []
    c.aliases[add.output[0]] = node.output[0]
    return [c.value(other[0])]


def _matmul(c: _Onnx, node: Any) -> None:
    a, b = node.input[:2]
    sa, sb = c.shape(a), c.shape(b)
    if len(sb) == 2:
        attrs = MatmulAttrs(m=math.prod(sa[:-1]) if len(sa) > 1 else 1, n=sb[1], k=sb[0])
        w = c.weight(b, natural_is_nk=False)
    else:
        out = c.shape(node.output[0])
        attrs = MatmulAttrs(m=sa[-2] if len(sa) >= 2 else 1, n=sb[-1], k=sb[-2], batch=math.prod(out[:-2]))
        w = c.weight(b, natural_is_nk=False) if b in c._params else c.value(b)
    bias = _bias_after(c, node, attrs.n) if len(sb) == 2 else []
    c.emit(node, OpKind.MATMUL, [c.value(a), w, *bias], attrs)


def _gemm(c: _Onnx, node: Any) -> None:
    a, b = node.input[:2]
    sa, sb = c.shape(a), c.shape(b)
    m, k = (sa[1], sa[0]) if _attr(node, "transA", 0) else sa
    trans_b = bool(_attr(node, "transB", 0))
    n = sb[0] if trans_b else sb[1]
    bias = [c.value(node.input[2])] if len(node.input) > 2 else []
    c.emit(node, OpKind.MATMUL, [c.value(a), c.weight(b, natural_is_nk=trans_b), *bias], MatmulAttrs(m=m, n=n, k=k))


def _conv(c: _Onnx, node: Any) -> None:
    x, w = node.input[:2]
    xs, ws, out = c.shape(x), c.shape(w), c.shape(node.output[0])
    groups = int(_attr(node, "group", 1))
    kernel = math.prod(ws[2:])
    if node.op_type == "ConvTranspose":  # W: (C_in, C_out/g, k...)
        attrs = MatmulAttrs(m=xs[0] * math.prod(xs[2:]), n=ws[1], k=ws[0] // groups * kernel, batch=groups)
    else:  # W: (C_out, C_in/g, k...)
        attrs = MatmulAttrs(m=out[0] * math.prod(out[2:]), n=ws[0] // groups, k=ws[1] * kernel, batch=groups)
    c.emit(node, OpKind.MATMUL, c.data(node, (0, 1, 2)), attrs)


def _einsum(c: _Onnx, node: Any) -> None:
    equation = str(
        _attr(node, "equation", b"")
        if not isinstance(_attr(node, "equation"), bytes)
        else _attr(node, "equation").decode()
    )
    if len(node.input) != 2 or "..." in equation or "->" not in equation:
        c._unknown_op(node)
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


def _attention(c: _Onnx, node: Any) -> None:
    """ONNX Attention (opset 23) and onnxruntime's MultiHeadAttention / GroupQueryAttention."""
    q, k, v = node.input[:3]
    qs, ks, vs = c.shape(q), c.shape(k), c.shape(v)
    if len(qs) == 4:
        batch, heads, q_len, dq = qs
        kv_heads, kv_len, dv = ks[1], ks[2], vs[3]
    else:  # (batch, seq, heads * dim)
        heads = int(_attr(node, "q_num_heads", 0) or _attr(node, "num_heads", 1))
        kv_heads = int(_attr(node, "kv_num_heads", 0) or heads)
        batch, q_len, kv_len = qs[0], qs[1], ks[1]
        dq, dv = qs[2] // heads, vs[2] // kv_heads
    causal = (
        bool(_attr(node, "is_causal", 0))
        or bool(_attr(node, "unidirectional", 0))
        or node.op_type == "GroupQueryAttention"
    )
    attrs = AttentionAttrs(batch, heads, kv_heads, q_len, kv_len, (dq + dv) // 2, causal)
    ins = c.data(node, (0, 1, 2, 3))
    c.emit(node, OpKind.ATTENTION, ins, attrs)


def _norm(kind: str, idx: tuple[int, ...]) -> Rule:
    def rule(c: _Onnx, node: Any) -> None:
        c.emit(node, OpKind.NORM, c.data(node, idx), NormAttrs(kind))

    return rule


def _softmax(c: _Onnx, node: Any) -> None:
    c.emit(node, OpKind.SOFTMAX, c.data(node, (0,)))


def _gather(c: _Onnx, node: Any) -> None:
    data, idx = node.input[:2]
    if data in c._params and len(c.shape(data)) == 2 and int(_attr(node, "axis", 0)) == 0:
        vocab, dim = c.shape(data)
        c.emit(node, OpKind.EMBEDDING, [c.value(idx), c.value(data)], EmbeddingAttrs(vocab, dim))
    elif idx in c.static:
        _view(c, node)  # picking fixed rows: a view
    else:
        c.emit(node, OpKind.ELEMENTWISE, c.data(node), ElementwiseAttrs("gather"))


def _cross_entropy(c: _Onnx, node: Any) -> None:
    scores = node.input[0]
    vocab = c.shape(scores)[1]
    c.emit(node, OpKind.CROSS_ENTROPY, c.data(node, (0, 1)), CrossEntropyAttrs(vocab))


def _lstm(c: _Onnx, node: Any) -> None:
    from echosim.frontend.recurrent import lstm_layer

    x, w, r = node.input[:3]
    if _attr(node, "direction", b"forward") not in (b"forward", "forward"):
        c._unknown_op(node)
        return
    layout = int(_attr(node, "layout", 0))
    xs = c.shape(x)
    steps, batch = (xs[1], xs[0]) if layout else (xs[0], xs[1])
    hidden = int(_attr(node, "hidden_size", c.shape(r)[-1]))
    bias = [v for v in c.data(node, (3,)) if v is not None]
    y = node.output[0] if node.output else ""
    dt = c.spec(y, node).dtype if y else c.dtype
    xv, wv, rv = c.value(x), c.value(w), c.value(r)
    assert xv is not None and wv is not None and rv is not None
    h0 = c.value(node.input[5]) if len(node.input) > 5 else None
    if h0 is not None:
        h0 = c.graph.add(OpKind.VIEW, [h0], TensorSpec((batch, hidden), dt), scope=_scope(node), name=f"{y}.h0")
    out = lstm_layer(
        c.graph, xv, wv, rv, bias, batch=batch, steps=steps, in_dim=xs[-1], hidden=hidden, dtype=dt,
        batch_first=bool(layout), scope=_scope(node), name=y or node.name, h0=h0,
    )  # fmt: skip
    if y:  # Y is (seq, num_directions=1, batch, hidden): a view of the layer output
        c.env[y] = c.graph.add(OpKind.VIEW, [out], c.spec(y, node), scope=_scope(node), name=y)


_SHAPE_OPS = {"Shape", "Size"}
_VIEW_OPS = ("Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Expand", "Identity",
             "DepthToSpace", "SpaceToDepth")  # fmt: skip
_ACT = {"Gelu": 8, "FastGelu": 8, "BiasGelu": 8, "QuickGelu": 8, "Relu": 1, "Sigmoid": 4, "Tanh": 4, "Erf": 4,
        "Exp": 4, "Log": 4, "Softplus": 4, "Mish": 6, "HardSwish": 2, "HardSigmoid": 2, "LeakyRelu": 1, "Elu": 4,
        "Selu": 4, "Sin": 4, "Cos": 4, "Sqrt": 2, "Reciprocal": 1, "Pow": 2}  # fmt: skip
_ELEMENTWISE = ("Add", "Sub", "Mul", "Div", "Neg", "Abs", "Where", "Max", "Min", "Equal", "Less", "Greater",
                "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Xor", "Clip", "Mod", "Floor", "Ceil", "Round",
                "Sign", "CumSum", "Trilu", "Range", "ConstantOfShape", "Tile", "Pad", "ScatterND", "ScatterElements",
                "GatherElements", "GatherND", "OneHot", "IsNaN", "IsInf", "Resize", "Upsample", "TopK")  # fmt: skip
_REDUCTIONS = ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceL1",
               "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin", "GlobalAveragePool", "GlobalMaxPool",
               "MaxPool", "AveragePool", "LpPool")  # fmt: skip

_RULES: dict[str, Rule] = {op: _view for op in _VIEW_OPS}
_RULES.update({op: _elementwise(op.lower(), flops) for op, flops in _ACT.items()})
_RULES.update({op: _elementwise(op.lower()) for op in _ELEMENTWISE})
_RULES.update({op: _reduction(op.lower()) for op in _REDUCTIONS})
_RULES.update(
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
        "InstanceNormalization": _norm("instancenorm", (0, 1, 2)),
        "GroupNormalization": _norm("groupnorm", (0, 1, 2)),
        "Softmax": _softmax,
        "LogSoftmax": _softmax,
        "Gather": _gather,
        "SoftmaxCrossEntropyLoss": _cross_entropy,
        "NegativeLogLikelihoodLoss": _cross_entropy,
        "LSTM": _lstm,
    }
)
