"""The IR values of an ONNX graph's tensors: what a rule of ``onnx_rules`` reads and adds to.

:class:`OnnxValues` holds the state of one conversion (tensor name -> IR value, the
shapes after inference, which initializers are weights) and the helpers every rule
uses: ``value``/``data`` to read operands, ``emit`` to add a node, ``param``/``weight``
for weights, ``unknown_op`` for an op with no rule. Reading a node's attributes and
its module path (``attr``, ``scope_of``, ``fused_module``) is here too. The main loop
that walks the graph and dispatches to the rules is in ``onnx.py``.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from echosim.errors import EchosimError
from echosim.frontend.fused import FusedKind, fused_kind
from echosim.ir.graph import Graph
from echosim.ir.ops import ElementwiseAttrs, OpKind, ParamAttrs
from echosim.ir.types import DType, TensorSpec

# TensorProto element types
FLOAT_TYPES = {1, 10, 11, 16, 17, 18, 19, 20, 21, 23}  # float, fp16, double, bf16, fp8 variants, fp4
INT64, INT32, BOOL = 7, 6, 9


def attr(node: Any, name: str, default: Any = None) -> Any:
    import onnx

    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def swaps_last_two(node: Any, out_shape: tuple[int, ...]) -> bool:
    rank = len(out_shape)
    perm = attr(node, "perm")
    if perm is None:
        return rank == 2
    return list(perm) == [*range(rank - 2), rank - 1, rank - 2]


def param_scope(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name and "::" not in name else ""


def _metadata_list(node: Any, key: str) -> list[str]:
    for prop in node.metadata_props:
        if prop.key == key:
            try:
                return [str(x) for x in ast.literal_eval(prop.value)]
            except (ValueError, SyntaxError):
                return []
    return []


def fused_module(node: Any) -> tuple[str, FusedKind] | None:
    """The outermost single-kernel module (``fused.py``) a torch-exported node belongs to: (path, kind)."""
    classes = _metadata_list(node, "pkg.torch.onnx.class_hierarchy")
    scopes = _metadata_list(node, "pkg.torch.onnx.name_scopes")
    for cls, path in zip(classes, scopes, strict=False):
        kind = fused_kind(cls)
        if kind is not None:
            return path, kind
    return None


def scope_of(node: Any) -> str:
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


# ---- the values of one conversion ---------------------------------------------------------------


@dataclass
class OnnxValues:
    """One conversion's state and the helpers a rule adds IR nodes with."""

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
        self.params = self._find_params()

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
            if elem not in FLOAT_TYPES or shape is None or math.prod(shape) <= 1:
                continue
            if name in self.inits or name not in inputs:
                params.add(name)
        weight_slots = {"MatMul": (1,), "Gemm": (1, 2), "Conv": (1, 2), "ConvTranspose": (1, 2), "Gather": (0,),
                        "LayerNormalization": (1, 2), "RMSNormalization": (1,)}  # fmt: skip
        for n in g.node:  # float graph inputs with static shapes used only as weights
            for i in weight_slots.get(n.op_type, ()):
                if i < len(n.input) and n.input[i] in inputs and n.input[i] not in self.inits:
                    elem, shape = self.types.get(n.input[i], (0, None))
                    if elem in FLOAT_TYPES and shape is not None:
                        params.add(n.input[i])
        return params

    # -- values ------------------------------------------------------------------------------
    def dt(self, elem: int) -> DType:
        if elem in FLOAT_TYPES:
            return self.dtype
        if elem == BOOL:
            return DType.BOOL
        return DType.INT64 if elem == INT64 else DType.INT32

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
        if name in self.params:
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
        if elem not in FLOAT_TYPES or shape is None or math.prod(shape) <= 1:
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
        if cur in self.params:
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

    def unknown_op(self, node: Any) -> None:
        op = f"{node.domain + '.' if node.domain else ''}{node.op_type}"
        if op not in self._unknown:
            self.warnings.append(
                f"no rule for ONNX op {op} at {scope_of(node) or node.name or '<root>'}: costed as memory-bound"
            )
        self._unknown[op] = self._unknown.get(op, 0) + 1
        for i, out in enumerate(node.output):
            if out:
                self.emit(node, OpKind.ELEMENTWISE, self.data(node), ElementwiseAttrs(node.op_type.lower()), out=i)
