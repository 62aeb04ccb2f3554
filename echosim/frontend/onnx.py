"""``.onnx`` sources: loaded with ``onnx``, shapes from ``onnx.shape_inference``, weights never read.

Weights may be absent: initializers whose external data file is missing, or
weights declared only by their shape, are read for their shapes alone. Symbolic
input dimensions are bound from ``--micro-batch`` (a dimension named like a
batch, or the first axis) and ``--seq-len`` (a dimension named like a sequence,
or the second axis of integer token ids); any other symbolic dimension is an
error that names it.

Ops map to IR through ``RULES`` (MatMul, Gemm, Conv, Attention, the
normalisations, Softmax, Gelu, Einsum, LSTM, Gather as embedding, the
elementwise ops, Reshape/Transpose/Slice/... as views). An op with no rule is
costed as a memory-bound elementwise op and listed in the warnings. Scopes come
from the torch exporter's ``pkg.torch.onnx.name_scopes`` metadata, else from
``/model/layers.0/attn/MatMul``-style node names, so TP plan patterns apply.
Layers stored N times in the file are folded back to one by :mod:`irfold`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from echosim.errors import EchosimError
from echosim.frontend.fused import FusedKind
from echosim.frontend.onnx_rules import RULES, SHAPE_OPS, fused_module, param_scope, scope_of, swaps_last_two
from echosim.ir.graph import Graph
from echosim.ir.ops import (
    ElementwiseAttrs,
    OpKind,
    ParamAttrs,
)
from echosim.ir.types import DType, TensorSpec

if TYPE_CHECKING:
    from echosim.frontend.spec import CaptureSpec

_BATCH_NAME = re.compile(r"batch|^(b|n|bs|bsz)$|^(b|n|bs|bsz)[_\d]", re.IGNORECASE)
_SEQ_NAME = re.compile(r"seq|sequence|len|token|time|step|^(s|t|l)$|position", re.IGNORECASE)

# TensorProto element types
_FLOAT_TYPES = {1, 10, 11, 16, 17, 18, 19, 20, 21, 23}  # float, fp16, double, bf16, fp8 variants, fp4
_INT64, _INT32, _BOOL = 7, 6, 9


@dataclass
class OnnxModel:
    """An ONNX file, checked at load, captured once the spec binds its symbolic dimensions."""

    source: str
    path: Path
    proto: Any

    def capture(self, spec: CaptureSpec) -> tuple[Graph, list[str], int]:
        from echosim.frontend.attention_fuse import fuse_attention
        from echosim.frontend.irfold import fold_layers
        from echosim.frontend.loss import ensure_loss
        from echosim.frontend.messages import Note

        inferred, notes = bind_and_infer(self.proto, self.path, spec)
        conv = _Onnx(inferred, DType.parse(spec.dtype), self.path.name, self.path)
        graph = fold_layers(fuse_attention(conv.run(), notes), notes)
        messages = list(conv.warnings)
        try:
            ensure_loss(graph, notes)
        except ValueError as exc:
            raise EchosimError(f"{self.path}: {exc}") from None
        return graph, [*messages, *(Note(n) for n in notes)], graph.param_count()


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


def bind_and_infer(proto: Any, path: Path, spec: CaptureSpec) -> tuple[Any, list[str]]:
    """A copy of ``proto`` with symbolic input dims set from the spec, and every shape inferred."""
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
            if role == "seq" and not spec.seq_len:
                raise EchosimError(
                    f"{path}: input {value.name!r} has a symbolic sequence dimension {name or '?'!r}: "
                    "bind it with --seq-len"
                )
            dim.Clear()
            dim.dim_value = spec.micro_batch if role == "batch" else spec.seq_len
    if spec.seq_len and fixed_seq not in (None, spec.seq_len):
        notes.append(f"--seq-len {spec.seq_len} does not apply: {path.name} fixes the sequence at {fixed_seq}")
    if spec.micro_batch != 1 and fixed_batch not in (None, spec.micro_batch):
        notes.append(f"--micro-batch {spec.micro_batch} does not apply: {path.name} fixes the batch at {fixed_batch}")
    try:
        inferred = infer_concrete(model)
    except Exception as exc:
        raise EchosimError(f"{path}: ONNX shape inference failed: {' '.join(str(exc).split())[:300]}") from None
    return inferred, notes


def _strip_wrapper(graph: Graph) -> Graph:
    """Drop a wrapper module's name (``m.`` in ``m.model.layers.0``) when every scope starts with it."""
    scopes = {n.scope for n in graph if n.scope}
    heads = {s.split(".", 1)[0] for s in scopes}
    if len(heads) != 1 or not scopes:
        return graph
    (head,) = heads
    rests = [s[len(head) + 1 :] for s in scopes if s != head]
    if not rests or any(r[:1].isdigit() for r in rests):
        return graph
    for n in list(graph):
        if n.scope:
            scope = "" if n.scope == head else n.scope[len(head) + 1 :]
            name = n.name[len(head) + 1 :] if n.op is OpKind.PARAMETER and n.name.startswith(head + ".") else n.name
            graph.replace(n.id, scope=scope, name=name)
    return graph


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
        if not name:
            return None
        if name in self.static:
            return self._constant_tensor(name)
        if name in self._params:
            return self.param(name)
        if name in self.lazy:
            node = self.lazy.pop(name)
            self.emit(node, OpKind.VIEW, [self.param(node.input[0])])
        return self.env.get(name)

    def const(self, name: str) -> Any:
        """The value of a small constant (a Constant node or an initializer with data), else ``None``."""
        import onnx.numpy_helper as nh

        from echosim.frontend.onnx_shapes import constant_value

        if name in self.inits:
            t = self.inits[name]
            return None if t.data_location == 1 or not (t.raw_data or t.float_data or t.int64_data) else nh.to_array(t)
        node = self.producer.get(name)
        return constant_value(node) if node is not None and node.op_type == "Constant" else None

    def _constant_tensor(self, name: str) -> int | None:
        """A float constant that computation reads (a baked-in weight or mask) is a buffer: free to load."""
        if name in self.env:
            return self.env[name]
        elem, shape = self.types.get(name, (0, None))
        if elem not in _FLOAT_TYPES or shape is None or math.prod(shape) <= 1:
            return None
        self.env[name] = self.graph.add(OpKind.INPUT, (), self.spec(name), scope=param_scope(name), name=name)
        return self.env[name]

    def param(self, name: str, swapped: bool = False) -> int:
        key = (name, swapped)
        if key in self._param_ir:
            return self._param_ir[key]
        spec = self.spec(name)
        if swapped:
            spec = spec.with_shape((*spec.shape[:-2], spec.shape[-1], spec.shape[-2]))
        if name not in self._param_swapped:
            self._param_swapped[name] = swapped
            scope = param_scope(name)
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
            and swaps_last_two(self.producer[cur], self.shape(cur))
        ):
            cur, swaps = self.producer[cur].input[0], swaps + 1
        if cur in self._params:
            return self.param(cur, swapped=natural_is_nk != (swaps % 2 == 0))
        return self.value(name)

    def emit(self, node: Any, op: OpKind, inputs: list[int | None], attrs: Any = None, out: int = 0) -> int:
        ins = [i for i in inputs if i is not None]
        name = node.output[out]
        spec = self.spec(name, node, like=ins[0] if ins and op in (OpKind.ELEMENTWISE, OpKind.VIEW) else None)
        nid = self.graph.add(op, ins, spec, attrs, scope=scope_of(node), name=name)
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
        compute = []
        for node in g.node:  # shape arithmetic and constants are static: never costed
            if not any(o in live for o in node.output):
                continue
            if (
                node.op_type == "Constant"
                or node.op_type in SHAPE_OPS
                or (node.input and all((not i) or i in self.static for i in node.input))
            ):
                self.static.update(node.output)
            else:
                compute.append(node)
        fused = self._plan_fusion(compute, live)
        for node in compute:
            if node.output and node.output[0] in self.aliases:
                self.env[node.output[0]] = self.env[self.aliases[node.output[0]]]
                continue
            if id(node) in fused:
                self._emit_fused(node, fused[id(node)])
                continue
            rule = RULES.get(node.op_type)
            if rule is None:
                self._unknown_op(node)
            else:
                rule(self, node)
            first = self.env.get(node.output[0]) if node.output else None
            for extra in node.output[1:]:  # further outputs (TopK indices, LSTM states): views of the first
                if extra and extra not in self.env and first is not None:
                    self.env[extra] = self.graph.add(OpKind.VIEW, [first], self.spec(extra, node, like=first),
                                                     scope=scope_of(node), name=extra)  # fmt: skip
        self.graph.outputs = [v for v in (self.value(o.name) for o in g.output) if v is not None]
        for op, count in self._unknown.items():
            if count > 1:
                self.warnings.append(f"({op} occurs {count} times)")
        return _strip_wrapper(self.graph)

    # -- modules that run as one kernel (see fused.py) -------------------------------------------
    def _plan_fusion(self, compute: list[Any], live: set[str]) -> dict[int, tuple[str, FusedKind, list[str], str]]:
        """Each call of a single-kernel module: member node -> (module path, kind, inputs, output)."""
        groups: list[tuple[str, FusedKind, list[Any]]] = []
        for node in compute:
            hit = fused_module(node)
            if hit is None:
                continue
            if groups and groups[-1][0] == hit[0] and groups[-1][2][-1] is compute[compute.index(node) - 1]:
                groups[-1][2].append(node)
            else:
                groups.append((hit[0], hit[1], [node]))
        graph_outputs = {o.name for o in self.proto.graph.output}
        plan: dict[int, tuple[str, FusedKind, list[str], str]] = {}
        for path, kind, members in groups:
            made = {o for m in members for o in m.output}
            outs = [
                o for o in made if o in graph_outputs or any(
                    id(u) not in {id(m) for m in members} and any(o2 in live for o2 in u.output)
                    for u in self.consumers.get(o, [])
                )
            ]  # fmt: skip
            ins = [i for m in members for i in m.input if i and i not in made and i not in self.static]
            ins = list(dict.fromkeys(ins))
            if len(outs) != 1 or not [i for i in ins if i not in self._params]:
                continue
            for m in members:
                plan[id(m)] = (path, kind, ins, outs[0])
        return plan

    def _emit_fused(self, node: Any, fused: tuple[str, FusedKind, list[str], str]) -> None:
        path, kind, ins, out = fused
        if out not in node.output:
            return
        data = [i for i in ins if i not in self._params][: kind.data_inputs]
        params = [i for i in ins if i in self._params] if kind.op is OpKind.NORM else []
        values = [v for v in (self.value(i) for i in [*data, *params]) if v is not None]
        name = path.rsplit(".", 1)[-1] or out
        self.env[out] = self.graph.add(kind.op, values, self.spec(out, node), kind.attrs, scope=path, name=name)

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
                f"no rule for ONNX op {op} at {scope_of(node) or node.name or '<root>'}: costed as memory-bound"
            )
        self._unknown[op] = self._unknown.get(op, 0) + 1
        for i, out in enumerate(node.output):
            if out:
                self.emit(node, OpKind.ELEMENTWISE, self.data(node), ElementwiseAttrs(node.op_type.lower()), out=i)
