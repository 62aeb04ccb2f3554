"""torch.export capture: an ``nn.Module`` on ``meta`` becomes an aten graph, then IR.

``torch.export.export`` (non-strict, training IR) records aten ops with shapes in
``node.meta["val"]`` and the calling module in ``nn_module_stack``, so scopes read
``model.layers.0.self_attn.q_proj`` and the tensor-parallel plan patterns match
them as they match the zoo. No weight is allocated: modules and inputs live on
``meta``.

Conversion is a table of rules keyed by aten op (``_RULES``), as in ``fx.py``.
Around the table:

* values nothing reads are dropped (HF's unused mask arithmetic, shape checks);
* in-place writes (``copy_`` into slices of a fresh buffer, ``index_put_``) become
  SSA values, so readers depend on the writes;
* a module that is one kernel in a training stack (an RMSNorm written as
  pow/mean/rsqrt/mul, a GELU written with tanh) becomes one IR node (``_FUSED``);
* a 2-D weight feeding a matmul is held as (out, in) whatever its layout, so the
  TP plan splits the right axis of GPT-2's Conv1D (in, out) weights too;
* an op with no rule is costed as a memory-bound elementwise op and reported.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import operator
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from echosim.frontend.fx import CaptureError
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

aten = torch.ops.aten


@dataclass
class ExportCapture:
    graph: Graph
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# ---- the converter --------------------------------------------------------------------


@dataclass
class _Multi:
    """A tuple-valued op: ``getitem`` picks a view of ``source`` (split) or of the op's node."""

    source: int | None
    views_only: bool


@dataclass
class _Fused:
    """Nodes of one call of a module that runs as a single kernel."""

    rule: Callable[[_Aten, fx.Node, list[int]], None]
    members: list[fx.Node]
    output: fx.Node | None = None
    inputs: list[fx.Node] = field(default_factory=list)


class _Aten:
    def __init__(
        self, ep: Any, dtype: DType, name: str, strip: str, rename: Callable[[str], str], causal_masks: bool
    ) -> None:
        from torch.export.graph_signature import InputKind

        self.gm: fx.GraphModule = ep.graph_module
        self.dtype = dtype
        self.graph = Graph(name)
        self.strip = strip
        self.rename = rename
        self.causal_masks = causal_masks
        self.warnings: list[str] = []
        self._unknown: dict[str, int] = {}
        self.env: dict[fx.Node, int | _Multi | None] = {}
        self.params: dict[str, str] = {}  # placeholder name -> parameter FQN
        self.buffers: dict[str, str] = {}
        self.user_inputs: list[str] = []
        for spec in ep.graph_signature.input_specs:
            arg = spec.arg.name
            if spec.kind is InputKind.PARAMETER:
                self.params[arg] = self._fqn(str(spec.target))
            elif spec.kind in (InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                self.buffers[arg] = self._fqn(str(spec.target))
            elif spec.kind is InputKind.USER_INPUT:
                self.user_inputs.append(arg)
        self._param_ir: dict[tuple[str, bool], int] = {}
        self._param_swapped: dict[str, bool] = {}
        self.base: dict[fx.Node, fx.Node] = {}  # view -> the node owning the storage
        self.writes: dict[fx.Node, list[int]] = {}  # storage -> values written into slices of it
        self.fresh: set[fx.Node] = set()  # storages allocated without data (empty, new_empty)
        self.fused: dict[fx.Node, _Fused] = {}

    def _fqn(self, target: str) -> str:
        """A path without the wrapper module's prefix (``m.model.layers.0`` -> ``model.layers.0``)."""
        if not self.strip:
            return target
        if target == self.strip.rstrip("."):
            return ""
        return target[len(self.strip) :] if target.startswith(self.strip) else target

    # -- shapes and scopes ------------------------------------------------------------
    def _dtype(self, dt: torch.dtype) -> DType:
        if dt.is_floating_point or dt.is_complex:
            return self.dtype
        if dt == torch.bool:
            return DType.BOOL
        return DType.INT64 if dt == torch.int64 else DType.INT32

    def spec_of(self, val: Any) -> TensorSpec | None:
        if not isinstance(val, torch.Tensor):
            return None
        shape = tuple(int(d) for d in val.shape)
        if any(d == 0 for d in shape):
            return None
        return TensorSpec(shape or (1,), self._dtype(val.dtype))

    def spec(self, node: fx.Node) -> TensorSpec:
        spec = self.spec_of(node.meta.get("val"))
        if spec is None:
            raise CaptureError(f"no tensor shape for {node.name} ({node.target})")
        return spec

    def shape(self, arg: Any) -> tuple[int, ...]:
        val = arg.meta.get("val") if isinstance(arg, fx.Node) else None
        return tuple(int(d) for d in val.shape) if isinstance(val, torch.Tensor) else ()

    def scope(self, node: fx.Node) -> str:
        stack = node.meta.get("nn_module_stack")
        if not stack:
            return ""
        return self.rename(self._fqn(str(list(stack.values())[-1][0])))

    # -- values ---------------------------------------------------------------------------
    def value(self, arg: Any) -> int | None:
        """The IR value of an fx argument (parameters and pending writes are materialised here)."""
        if not isinstance(arg, fx.Node):
            return None
        base = self.base.get(arg, arg)
        if self.writes.get(base):
            self._merge_writes(base)
        if arg.op == "placeholder" and arg not in self.env:
            self._placeholder(arg)
        got = self.env.get(arg)
        return got if isinstance(got, int) else None

    def tensors(self, args: Sequence[Any]) -> list[int]:
        out: list[int] = []
        for a in args:
            if isinstance(a, (list, tuple)):
                out.extend(self.tensors(a))
            else:
                v = self.value(a)
                if v is not None:
                    out.append(v)
        return out

    def param(self, name: str, swapped: bool = False) -> int:
        """A parameter's IR node; ``swapped`` asks for its last two axes exchanged."""
        key = (name, swapped)
        if key in self._param_ir:
            return self._param_ir[key]
        ph = next(n for n in self.gm.graph.nodes if n.op == "placeholder" and n.name == name)
        spec = self.spec(ph)
        fqn = self.params[name]
        if name not in self._param_swapped:
            self._param_swapped[name] = swapped
            if swapped:
                spec = spec.with_shape((*spec.shape[:-2], spec.shape[-1], spec.shape[-2]))
            scope = self.rename(fqn.rsplit(".", 1)[0]) if "." in fqn else ""
            nid = self.graph.add(OpKind.PARAMETER, (), spec, ParamAttrs(), scope=scope, name=self.rename(fqn))
        else:  # already held the other way round: a transposed view of it
            base = self.param(name, self._param_swapped[name])
            nid = self.graph.add(
                OpKind.VIEW,
                (base,),
                spec if not swapped else spec.with_shape((*spec.shape[:-2], spec.shape[-1], spec.shape[-2])),
                scope=self.graph[base].scope,
                name=f"{name}.t",
            )
        self._param_ir[key] = nid
        return nid

    def _placeholder(self, node: fx.Node) -> None:
        if node.name in self.params:
            self.env[node] = self.param(node.name)
        elif node.name in self.buffers:
            spec = self.spec_of(node.meta.get("val"))
            fqn = self.buffers[node.name]
            self.env[node] = (
                None
                if spec is None
                else self.graph.add(
                    OpKind.INPUT, (), spec, scope=self.rename(fqn.rsplit(".", 1)[0]), name=self.rename(fqn)
                )
            )
        else:
            self.env[node] = None

    def weight(self, arg: Any, natural_is_nk: bool) -> int | None:
        """A matmul's B operand; a parameter behind transposes is held as (..., n, k)."""
        node, swaps = arg, 0
        while isinstance(node, fx.Node) and node.op == "call_function" and _swaps_last_two(node):
            node, swaps = node.args[0], swaps + 1
        if isinstance(node, fx.Node) and node.op == "placeholder" and node.name in self.params:
            as_nk = natural_is_nk == (swaps % 2 == 0)
            return self.param(node.name, swapped=not as_nk)
        return self.value(arg)

    def emit(
        self,
        node: fx.Node,
        op: OpKind,
        inputs: Sequence[int],
        attrs: Any = None,
        spec: TensorSpec | None = None,
        name: str = "",
    ) -> int:
        nid = self.graph.add(op, inputs, spec or self.spec(node), attrs, scope=self.scope(node), name=name or node.name)
        self.env[node] = nid
        return nid

    def unknown(self, node: fx.Node, what: str) -> None:
        if what not in self._unknown:
            self.warnings.append(f"no rule for {what} at {self.scope(node) or '<root>'}: costed as memory-bound")
        self._unknown[what] = self._unknown.get(what, 0) + 1
        spec = self.spec_of(node.meta.get("val"))
        if spec is not None:
            self.emit(
                node, OpKind.ELEMENTWISE, self.tensors(node.args), ElementwiseAttrs(what.rsplit(".", 1)[-1]), spec
            )
        else:
            self.env[node] = _Multi(None, False) if isinstance(node.meta.get("val"), (list, tuple)) else None

    # -- in-place writes -----------------------------------------------------------------
    def _merge_writes(self, base: fx.Node) -> None:
        """Readers of a buffer that was written slice by slice read one value made of the slices."""
        pieces = self.writes.pop(base)
        old = [] if base in self.fresh else [v for v in [self.env.get(base)] if isinstance(v, int)]
        spec = self.spec(base)
        nid = self.graph.add(
            OpKind.ELEMENTWISE, [*old, *pieces], spec, ElementwiseAttrs("cat", 0), scope=self.scope(base),
            name=f"{base.name}.written",
        )  # fmt: skip
        self.env[base] = nid
        self.fresh.discard(base)

    def mutate(self, node: fx.Node, dest: fx.Node, written: int | None) -> None:
        """``node`` wrote ``written`` into ``dest`` (the whole storage, or a view of it)."""
        base = self.base.get(dest, dest)
        if written is None:
            return
        if base is dest:
            self.env[base] = written
            self.fresh.discard(base)
        else:
            self.writes.setdefault(base, []).append(written)

    # -- main loop ----------------------------------------------------------------------
    def run(self) -> ExportCapture:
        nodes = list(self.gm.graph.nodes)
        live = _live(nodes, self._views_of())
        for node in nodes:
            if node.op == "placeholder" and node.name in self.user_inputs:
                spec = self.spec_of(node.meta.get("val"))
                if spec is not None:
                    self.env[node] = self.graph.add(OpKind.INPUT, (), spec, name=node.name)
                    self.graph.inputs.append(self.env[node])
        self._plan_fusion([n for n in nodes if n in live and n.op == "call_function"], live)
        out_node = None
        for node in nodes:
            if node.op == "output":
                out_node = node
                continue
            if node.op != "call_function" or node not in live:
                continue
            group = self.fused.get(node)
            if group is not None:
                if node is group.output:
                    group.rule(self, node, self.tensors(group.inputs))
                continue
            self._convert(node)
        outs = self.tensors(out_node.args if out_node is not None else [])
        self.graph.outputs = list(dict.fromkeys(outs))
        for what, count in self._unknown.items():
            if count > 1:
                self.warnings.append(f"({what} occurs {count} times)")
        return ExportCapture(self.graph, self.warnings)

    def _views_of(self) -> dict[fx.Node, fx.Node]:
        """Record which node owns the storage of each view, for in-place writes."""
        for node in self.gm.graph.nodes:
            if node.op != "call_function":
                continue
            packet = _packet(node)
            if packet in _VIEWS and node.args and isinstance(node.args[0], fx.Node):
                self.base[node] = self.base.get(node.args[0], node.args[0])
            elif packet is operator.getitem and isinstance(node.args[0], fx.Node):
                src = node.args[0]
                if _packet(src) in _SPLITS and isinstance(src.args[0], fx.Node):
                    self.base[node] = self.base.get(src.args[0], src.args[0])
        return self.base

    def _convert(self, node: fx.Node) -> None:
        packet = _packet(node)
        if packet in _SKIP:
            return
        rule = _RULES.get(packet) if packet is not None else None
        if rule is None and isinstance(node.target, torch._ops.OpOverload) and _is_inplace(node.target):
            rule = _inplace
        if rule is None:
            rule = _NAMED.get(_name(node))
        if rule is None:
            self.unknown(node, _name(node))
            return
        rule(self, node)

    # -- fusion ---------------------------------------------------------------------------
    def _plan_fusion(self, nodes: list[fx.Node], live: set[fx.Node]) -> None:
        """Group each call of a single-kernel module (``_FUSED``) and find its one output."""
        groups: list[_Fused] = []
        current: tuple[str, _Fused] | None = None
        for node in nodes:
            hit = _fusable(node)
            if hit is None:
                current = None
                continue
            key, rule = hit
            if current is None or current[0] != key:
                current = (key, _Fused(rule, []))
                groups.append(current[1])
            current[1].members.append(node)
        for group in groups:
            members = set(group.members)
            outputs = [m for m in group.members if any(u not in members and u in live for u in m.users)]
            tensor_outs = [m for m in outputs if isinstance(m.meta.get("val"), torch.Tensor)]
            if len(tensor_outs) != 1 or len(outputs) != 1:
                continue
            ins: list[fx.Node] = []
            for m in group.members:
                for a in _flat_nodes(m.args):
                    if a not in members and a not in ins and isinstance(a.meta.get("val"), torch.Tensor):
                        ins.append(a)
            params = [a for a in ins if a.op == "placeholder" and a.name in self.params]
            group.inputs = [a for a in ins if a not in params] + params
            if not group.inputs or len(group.inputs) == len(params):
                continue
            group.output = tensor_outs[0]
            for m in group.members:
                self.fused[m] = group


def _flat_nodes(args: Any) -> list[fx.Node]:
    out: list[fx.Node] = []
    for a in args if isinstance(args, (list, tuple)) else [args]:
        if isinstance(a, fx.Node):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(_flat_nodes(a))
    return out


def _live(nodes: list[fx.Node], base: dict[fx.Node, fx.Node]) -> set[fx.Node]:
    """Nodes whose values reach the output; a write into a storage lives if the storage does."""
    writers: dict[fx.Node, list[fx.Node]] = {}
    for node in nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and _is_inplace(node.target):
            dests = [a for a in node.args[:1] if isinstance(a, fx.Node)]
            for d in dests:
                writers.setdefault(base.get(d, d), []).append(node)
    live: set[fx.Node] = set()
    work = [n for n in nodes if n.op == "output"]
    while work:
        node = work.pop()
        if node in live:
            continue
        live.add(node)
        work.extend(_flat_nodes(node.args))
        work.extend(_flat_nodes(list(node.kwargs.values())))
        work.extend(writers.get(base.get(node, node), []))
    return live


def _packet(node: fx.Node) -> Any:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target.overloadpacket
    return target


def _name(node: fx.Node) -> str:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return str(target.overloadpacket)  # "aten.linear", "transformers.grouped_mm_fallback"
    return getattr(target, "__name__", str(target))


def _is_inplace(op: torch._ops.OpOverload) -> bool:
    schema = op._schema
    return (
        bool(schema.arguments)
        and schema.arguments[0].alias_info is not None
        and schema.arguments[0].alias_info.is_write
    )


def _swaps_last_two(node: fx.Node) -> bool:
    """``t``, ``transpose(-2, -1)`` or a permute that only exchanges the last two axes."""
    packet = _packet(node)
    rank = len(node.meta["val"].shape) if isinstance(node.meta.get("val"), torch.Tensor) else 0
    if packet is aten.t:
        return True
    if packet is aten.transpose and rank >= 2:
        dims = sorted(d % rank for d in node.args[1:3])
        return dims == [rank - 2, rank - 1]
    if packet is aten.permute and rank >= 2:
        perm = [d % rank for d in node.args[1]]
        return perm == [*range(rank - 2), rank - 1, rank - 2]
    return False


def _numel_before_last(shape: Sequence[int]) -> int:
    return math.prod(shape[:-1]) if len(shape) > 1 else 1


# ---- rules ------------------------------------------------------------------------------

Rule = Callable[[_Aten, fx.Node], None]


def _arg(node: fx.Node, i: int, key: str, default: Any = None) -> Any:
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(key, default)


def _view(c: _Aten, node: fx.Node) -> None:
    src = c.value(node.args[0]) if node.args else None
    spec = c.spec_of(node.meta.get("val"))
    if src is None or spec is None:
        c.env[node] = None
        return
    c.emit(node, OpKind.VIEW, [src], spec=spec)


def _cast(c: _Aten, node: fx.Node) -> None:
    """Float-to-float casts are free (every float is costed in the plan's dtype), as in fx.py."""
    src = node.args[0]
    before = src.meta.get("val") if isinstance(src, fx.Node) else None
    after = node.meta.get("val")
    if isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor):
        same = c._dtype(before.dtype) == c._dtype(after.dtype)
        if same:
            _view(c, node)
            return
    ins = c.tensors(node.args[:1])
    spec = c.spec_of(after)
    if spec is None or not ins:
        c.env[node] = None
        return
    c.emit(node, OpKind.ELEMENTWISE, ins, ElementwiseAttrs("cast", 0), spec)


def _split(c: _Aten, node: fx.Node) -> None:
    c.env[node] = _Multi(c.value(node.args[0]), views_only=True)


def _getitem(c: _Aten, node: fx.Node) -> None:
    src = node.args[0]
    got = c.env.get(src) if isinstance(src, fx.Node) else None
    spec = c.spec_of(node.meta.get("val"))
    if not isinstance(got, _Multi) or spec is None:
        c.env[node] = None
        return
    if got.source is None:
        c.env[node] = None
        return
    if not got.views_only and node.args[1] == 0 and c.graph[got.source].out == spec:
        c.env[node] = got.source
        return
    c.emit(node, OpKind.VIEW, [got.source], spec=spec)


def _multi(op: OpKind, attrs: Callable[[_Aten, fx.Node], Any] | None = None, data: int = 1) -> Rule:
    """A tuple-valued op costed as one kernel whose size is its first output."""

    def rule(c: _Aten, node: fx.Node) -> None:
        val = node.meta.get("val")
        first = val[0] if isinstance(val, (list, tuple)) and val else None
        spec = c.spec_of(first)
        ins = c.tensors(node.args[:data])
        if spec is None or not ins:
            c.env[node] = _Multi(None, False)
            return
        nid = c.graph.add(
            op, ins, spec, attrs(c, node) if attrs else ElementwiseAttrs(_name(node).rsplit(".", 1)[-1]),
            scope=c.scope(node), name=node.name,
        )  # fmt: skip
        c.env[node] = _Multi(nid, views_only=False)

    return rule


def _elementwise(fn: str, flops: int = 1) -> Rule:
    def rule(c: _Aten, node: fx.Node) -> None:
        ins = c.tensors(node.args)
        spec = c.spec_of(node.meta.get("val"))
        if spec is None:
            c.env[node] = None
            return
        c.emit(node, OpKind.ELEMENTWISE, ins, ElementwiseAttrs(fn, flops), spec)

    return rule


def _reduction(fn: str) -> Rule:
    """A reduction (sum, mean, pooling, ...); one with (values, indices) outputs as well."""

    def rule(c: _Aten, node: fx.Node) -> None:
        ins = c.tensors(node.args[:1])
        val = node.meta.get("val")
        many = isinstance(val, (list, tuple))
        spec = c.spec_of(val[0] if many and val else val)
        if spec is None or not ins:
            c.env[node] = _Multi(None, False) if many else None
            return
        op = OpKind.REDUCTION if spec.numel < c.graph[ins[0]].out.numel else OpKind.ELEMENTWISE
        nid = c.graph.add(op, ins, spec, ElementwiseAttrs(fn), scope=c.scope(node), name=node.name)
        c.env[node] = _Multi(nid, False) if many else nid

    return rule


def _fresh(c: _Aten, node: fx.Node) -> None:
    """Allocation without a kernel (``empty``): free until something is written into it."""
    spec = c.spec_of(node.meta.get("val"))
    c.env[node] = None if spec is None else c.graph.add(OpKind.INPUT, (), spec, scope=c.scope(node), name=node.name)
    c.fresh.add(node)


def _inplace(c: _Aten, node: fx.Node) -> None:
    """``x.op_(...)``: a new SSA value that replaces ``x`` (or a slice of its storage)."""
    dest = node.args[0]
    name = _name(node).rsplit(".", 1)[-1].rstrip("_")
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


def _linear(c: _Aten, node: fx.Node) -> None:
    x = c.value(node.args[0])
    w = c.weight(node.args[1], natural_is_nk=True)
    b = c.value(_arg(node, 2, "bias"))
    xs, ws = c.shape(node.args[0]), c.shape(node.args[1])
    attrs = MatmulAttrs(m=_numel_before_last(xs), n=ws[0], k=ws[-1])
    c.emit(node, OpKind.MATMUL, [v for v in (x, w, b) if v is not None], attrs)


def _mm(c: _Aten, node: fx.Node) -> None:
    a, b = node.args[0], node.args[1]
    sa, sb = c.shape(a), c.shape(b)
    attrs = MatmulAttrs(m=sa[0], n=sb[1], k=sa[1])
    c.emit(node, OpKind.MATMUL, [v for v in (c.value(a), c.weight(b, natural_is_nk=False)) if v is not None], attrs)


def _addmm(c: _Aten, node: fx.Node) -> None:
    bias, a, b = node.args[:3]
    sa, sb = c.shape(a), c.shape(b)
    attrs = MatmulAttrs(m=sa[0], n=sb[1], k=sa[1])
    ins = [c.value(a), c.weight(b, natural_is_nk=False), c.value(bias)]
    c.emit(node, OpKind.MATMUL, [v for v in ins if v is not None], attrs)


def _matmul(c: _Aten, node: fx.Node) -> None:
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


def _baddbmm(c: _Aten, node: fx.Node) -> None:
    bias, a, b = node.args[:3]
    sa, sb = c.shape(a), c.shape(b)
    attrs = MatmulAttrs(m=sa[-2], n=sb[-1], k=sa[-1], batch=sa[0])
    c.emit(node, OpKind.MATMUL, c.tensors([a, b, bias]), attrs)


def _grouped_mm(c: _Aten, node: fx.Node) -> None:
    """MoE experts: tokens sorted by expert times a stack of E weights.

    Held as ``batch=E`` products of (rows/E x k) @ (k x n): balanced routing, the
    expert count in ``batch`` and the weight as (E, n, k), so FLOPs are
    2 * rows * k * n and the backward rules of batched matmuls apply unchanged.
    """
    x, w = node.args[0], node.args[1]
    sx, sw = c.shape(x), c.shape(w)
    if len(sw) != 3 or len(sx) != 2:
        c.unknown(node, f"{_name(node)} with shapes {sx} x {sw}")
        return
    experts, k, n = sw
    rows = sx[0]
    attrs = MatmulAttrs(m=math.ceil(rows / experts), n=n, k=k, batch=experts)
    wv = c.weight(w, natural_is_nk=False)
    c.emit(node, OpKind.MATMUL, [v for v in (c.value(x), wv) if v is not None], attrs)


def _einsum(c: _Aten, node: fx.Node) -> None:
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


def _sdpa(c: _Aten, node: fx.Node) -> None:
    q, k, v = node.args[:3]
    qs, ks, vs = c.shape(q), c.shape(k), c.shape(v)
    mask = _arg(node, 3, "attn_mask")
    causal = bool(_arg(node, 5, "is_causal", False)) or (mask is not None and c.causal_masks)
    batch = math.prod(qs[:-3]) if len(qs) > 3 else 1
    heads = qs[-3] if len(qs) >= 3 else 1
    kv_heads = ks[-3] if len(ks) >= 3 else 1
    # QK^T contracts the query/key head size, PV produces the value head size (they differ
    # in DeepSeek's MLA); AttentionAttrs holds one head_dim, so hold their mean: FLOPs stay exact.
    head_dim = (qs[-1] + vs[-1]) // 2
    attrs = AttentionAttrs(batch, heads, kv_heads, qs[-2], ks[-2], head_dim, causal)
    val = node.meta.get("val")
    spec = c.spec_of(val[0] if isinstance(val, (list, tuple)) else val)
    nid = c.graph.add(
        OpKind.ATTENTION, c.tensors([q, k, v, mask]), spec or c.spec(node), attrs, scope=c.scope(node), name=node.name
    )
    c.env[node] = _Multi(nid, False) if isinstance(val, (list, tuple)) else nid


def _embedding(c: _Aten, node: fx.Node) -> None:
    w, ids = node.args[0], node.args[1]
    ws = c.shape(w)
    ins = [c.value(ids), c.value(w)]
    c.emit(node, OpKind.EMBEDDING, [i for i in ins if i is not None], EmbeddingAttrs(ws[0], ws[1]))


def _embedding_bag(c: _Aten, node: fx.Node) -> None:
    w, ids = node.args[0], node.args[1]
    ws = c.shape(w)
    val = node.meta["val"]
    nid = c.graph.add(
        OpKind.EMBEDDING, c.tensors([ids, w]), c.spec_of(val[0]) or c.spec(node), EmbeddingAttrs(ws[0], ws[1]),
        scope=c.scope(node), name=node.name,
    )  # fmt: skip
    c.env[node] = _Multi(nid, False)


def _norm(kind: str, data: Sequence[int]) -> Rule:
    def rule(c: _Aten, node: fx.Node) -> None:
        ins = c.tensors([node.args[i] for i in data if i < len(node.args)])
        val = node.meta.get("val")
        spec = c.spec_of(val[0] if isinstance(val, (list, tuple)) else val)
        nid = c.graph.add(OpKind.NORM, ins, spec or c.spec(node), NormAttrs(kind), scope=c.scope(node), name=node.name)
        c.env[node] = _Multi(nid, False) if isinstance(val, (list, tuple)) else nid

    return rule


def _softmax(c: _Aten, node: fx.Node) -> None:
    c.emit(node, OpKind.SOFTMAX, c.tensors(node.args[:1]))


def _cross_entropy(c: _Aten, node: fx.Node) -> None:
    logits, labels = node.args[:2]
    vocab = c.shape(logits)[1] if len(c.shape(logits)) > 1 else c.shape(logits)[-1]
    c.emit(node, OpKind.CROSS_ENTROPY, c.tensors([logits, labels]), CrossEntropyAttrs(vocab))


def _dropout(c: _Aten, node: fx.Node) -> None:
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
    c.env[node] = _Multi(nid, False) if isinstance(val, (list, tuple)) else nid


def _conv(transposed_arg: int | None, groups_arg: int) -> Rule:
    """Convolution as the implicit GEMM cuDNN runs: (N*out_pixels x Cin*kernel/g) @ (.. x Cout/g), g groups."""

    def rule(c: _Aten, node: fx.Node) -> None:
        x, w = node.args[0], node.args[1]
        bias = _arg(node, 2, "bias")
        xs, ws, out = c.shape(x), c.shape(w), c.shape(node)
        transposed = transposed_arg is not None and bool(_arg(node, transposed_arg, "transposed", False))
        groups = int(_arg(node, groups_arg, "groups", 1))
        kernel = math.prod(ws[2:])
        if transposed:  # weight (Cin, Cout/g, k...)
            attrs = MatmulAttrs(m=xs[0] * math.prod(xs[2:]), n=ws[1], k=ws[0] // groups * kernel, batch=groups)
        else:  # weight (Cout, Cin/g, k...)
            attrs = MatmulAttrs(m=out[0] * math.prod(out[2:]), n=ws[0] // groups, k=ws[1] * kernel, batch=groups)
        c.emit(node, OpKind.MATMUL, c.tensors([x, w, bias]), attrs)

    return rule


def _lstm(c: _Aten, node: fx.Node) -> None:
    """``aten.lstm`` (unidirectional), layer by layer as :func:`recurrent.lstm_layer` costs it."""
    from echosim.frontend.recurrent import lstm_layer

    x, hx, weights, has_bias, layers, _p, _train, bidirectional, batch_first = node.args[:9]
    if bidirectional:
        c.unknown(node, "aten.lstm (bidirectional)")
        return
    xs = c.shape(x)
    batch, steps = (xs[0], xs[1]) if batch_first else (xs[1], xs[0])
    per_layer = 4 if has_bias else 2
    out_spec = c.spec_of(node.meta["val"][0])
    layer_in = c.value(x)
    if out_spec is None or layer_in is None:
        c.env[node] = _Multi(None, False)
        return
    for layer in range(int(layers)):
        group = weights[layer * per_layer : (layer + 1) * per_layer]
        w_ih, w_hh, *biases = (c.value(w) for w in group)
        assert w_ih is not None and w_hh is not None
        h0 = c.value(hx[0]) if hx else None
        if h0 is not None:  # this layer's slice of the (layers, batch, hidden) initial state
            state = TensorSpec((batch, out_spec.shape[-1]), out_spec.dtype)
            h0 = c.graph.add(OpKind.VIEW, [h0], state, scope=c.scope(node), name=f"{node.name}.l{layer}.h0")
        layer_in = lstm_layer(
            c.graph, layer_in, w_ih, w_hh, [b for b in biases if b is not None],
            batch=batch, steps=steps, in_dim=c.shape(group[0])[1], hidden=out_spec.shape[-1],
            dtype=out_spec.dtype, batch_first=bool(batch_first), scope=c.scope(node), name=f"{node.name}.l{layer}",
            h0=h0,
        )  # fmt: skip
    c.env[node] = _Multi(layer_in, False)


def _dense_rule(c: _Aten, node: fx.Node, ins: list[int], op: OpKind, attrs: Any) -> None:
    """One node for a whole module call, named after the module (``input_layernorm``)."""
    c.emit(node, op, ins, attrs, name=c.scope(node).rsplit(".", 1)[-1] or str(attrs))


def _fused_norm(kind: str) -> Callable[[_Aten, fx.Node, list[int]], None]:
    return lambda c, node, ins: _dense_rule(c, node, ins, OpKind.NORM, NormAttrs(kind))


def _fused_act(fn: str, flops: int) -> Callable[[_Aten, fx.Node, list[int]], None]:
    return lambda c, node, ins: _dense_rule(c, node, ins[:1], OpKind.ELEMENTWISE, ElementwiseAttrs(fn, flops))


# Modules that training stacks run as one kernel, by class-name suffix; written out in
# several aten ops by HF (LlamaRMSNorm: pow, mean, add, rsqrt, mul, mul; NewGELUActivation: tanh form).
_FUSED: tuple[tuple[str, Callable[[_Aten, fx.Node, list[int]], None]], ...] = (
    ("RMSNorm", _fused_norm("rmsnorm")),
    ("LayerNorm", _fused_norm("layernorm")),
    ("GELUActivation", _fused_act("gelu", 8)),
    ("GELUTanh", _fused_act("gelu", 8)),
    ("PytorchGELUTanh", _fused_act("gelu", 8)),
    ("SiLUActivation", _fused_act("silu", 4)),
)


def _fusable(node: fx.Node) -> tuple[str, Callable[[_Aten, fx.Node, list[int]], None]] | None:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    for key, (_path, cls) in stack.items():
        cls_name = (cls if isinstance(cls, str) else getattr(cls, "__qualname__", str(cls))).rsplit(".", 1)[-1]
        for suffix, rule in _FUSED:
            if cls_name.endswith(suffix):
                return str(key), rule
    return None


_ACT_FLOPS = {"gelu": 8, "silu": 4, "relu": 1, "tanh": 4, "sigmoid": 4, "exp": 4, "log": 4, "erf": 4}

_VIEWS = {
    aten.view, aten.reshape, aten._unsafe_view, aten.transpose, aten.permute, aten.t, aten.expand,
    aten.expand_as, aten.unsqueeze, aten.squeeze, aten.flatten, aten.unflatten, aten.slice, aten.select,
    aten.narrow, aten.alias, aten.as_strided, aten.contiguous, aten.clone, aten.detach, aten.view_as,
    aten.movedim, aten.diagonal, aten.lift_fresh_copy, aten.view_as_real, aten.view_as_complex,
    aten.real, aten.imag, aten.unfold, aten.squeeze_copy, aten.unsqueeze_copy, aten.t_copy,
    aten.permute_copy, aten.expand_copy, aten.view_copy, aten.transpose_copy, aten.slice_copy,
}  # fmt: skip
_SPLITS = {aten.split, aten.split_with_sizes, aten.chunk, aten.unbind, aten.tensor_split}
_CASTS = {aten.to, aten._to_copy, aten.type_as}
_SKIP = {aten._assert_tensor_metadata, aten._assert_scalar, aten.sym_size, aten.sym_constrain_range_for_size}
_FRESH = {aten.empty, aten.empty_like, aten.new_empty, aten.empty_strided, aten.new_empty_strided}

_RULES: dict[Any, Rule] = {op: _view for op in _VIEWS}
_RULES.update({op: _split for op in _SPLITS})
_RULES.update({op: _cast for op in _CASTS})
_RULES.update({op: _fresh for op in _FRESH})
_RULES.update(
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
        aten.convolution: _conv(6, 8),
        aten._convolution: _conv(6, 8),
        aten.lstm: _lstm,
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
        aten.var: _reduction("var"),
        aten.max_pool2d: _reduction("max_pool2d"),
        aten.max_pool1d: _reduction("max_pool1d"),
        aten.avg_pool2d: _reduction("avg_pool2d"),
        aten.adaptive_avg_pool2d: _reduction("adaptive_avg_pool2d"),
        aten.adaptive_avg_pool1d: _reduction("adaptive_avg_pool1d"),
        aten.max_pool2d_with_indices: _reduction("max_pool2d"),
        aten.cat: _elementwise("cat", 0),
        aten.stack: _elementwise("cat", 0),
        aten.repeat: _elementwise("repeat", 0),
        aten.repeat_interleave: _elementwise("repeat", 0),
    }
)
for _fn in ("add", "sub", "mul", "div", "neg", "pow", "rsqrt", "sqrt", "reciprocal", "abs", "clamp", "clamp_min",
            "clamp_max", "where", "masked_fill", "maximum", "minimum", "floor_divide", "remainder", "eq", "ne", "lt",
            "gt", "le", "ge", "logical_and", "logical_or", "logical_not", "bitwise_and", "bitwise_or", "bitwise_not",
            "__and__", "__or__", "square", "sin", "cos", "tril", "triu", "cumsum", "histc", "one_hot", "gather",
            "scatter", "scatter_add", "index_add", "index", "index_select", "index_put", "hardtanh", "leaky_relu",
            "rsub", "arange", "zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "new_zeros",
            "new_ones", "new_full", "scalar_tensor", "fill", "softplus", "mish", "hardswish", "hardsigmoid", "elu",
            "glu", "sign", "round", "floor", "ceil", "diff", "any", "all", "flip", "roll", "pad",
            "constant_pad_nd"):  # fmt: skip
    _packet_op = getattr(aten, _fn, None)
    if _packet_op is not None and _packet_op not in _RULES:
        _RULES[_packet_op] = _elementwise(_fn, _ACT_FLOPS.get(_fn, 1))
for _fn in ("gelu", "silu", "relu", "tanh", "sigmoid", "exp", "log", "erf"):
    _RULES[getattr(aten, _fn)] = _elementwise(_fn, _ACT_FLOPS[_fn])

# Custom ops found by name (their namespaces exist only once their library is imported).
_NAMED: dict[str, Rule] = {"transformers.grouped_mm_fallback": _grouped_mm}


# ---- entry points -------------------------------------------------------------------------


@contextmanager
def quiet() -> Iterator[None]:
    """Silence torch's own logging and tracebacks while capturing; failures are reported in one line."""
    loggers = [logging.getLogger(name) for name in ("torch", "torch._dynamo", "torch.export", "torch.fx")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def export(module: torch.nn.Module, example_inputs: tuple[Any, ...], where: str = "") -> Any:
    """``torch.export.export`` with a one-line error naming the construct that stopped it."""
    try:
        with quiet():
            return torch.export.export(module, example_inputs, strict=False)
    except Exception as exc:
        raise CaptureError(
            f"torch.export could not capture {type(module).__name__}: {describe_failure(exc, where)}"
        ) from None


# What torch's capture errors mean, in the words of the construct that causes them.
_CONSTRUCTS = {
    "GuardOnDataDependentSymNode": "control flow or a shape that depends on tensor values",
    "DataDependentOutputException": "a result read back from a tensor's values",
    "Unsupported": "a Python construct torch.export does not trace",
}


def describe_failure(exc: BaseException, where: str = "") -> str:
    """What stopped capture (in words, when torch's error type says), its first line, and the user's line."""
    import traceback

    text = str(exc).strip().splitlines()
    head = next((line.strip() for line in text if line.strip()), type(exc).__name__)
    construct = _CONSTRUCTS.get(type(exc).__name__)
    if construct:
        head = f"{construct} ({head})"
    frames = traceback.extract_tb(exc.__traceback__)
    user = [f for f in frames if where and f.filename.endswith(where)] or [
        f
        for f in frames
        if "site-packages" not in f.filename and "/torch/" not in f.filename and "echosim" not in f.filename
    ]
    if user:
        f = user[-1]
        return (
            f"{type(exc).__name__}: {head} (at {f.filename.rsplit('/', 1)[-1]}:{f.lineno} `{(f.line or '').strip()}`)"
        )
    for line in text:  # torch quotes the user frame inside its message
        if line.strip().startswith("File ") and ", line " in line:
            return f"{type(exc).__name__}: {head} ({line.strip()})"
    return f"{type(exc).__name__}: {head}"


def capture_folded(
    root: torch.nn.Module,
    call: torch.nn.Module,
    args: tuple[Any, ...],
    *,
    dtype: DType,
    name: str,
    strip: str = "",
    where: str = "",
    fold: bool = True,
) -> ExportCapture:
    """Export ``call`` (which runs ``root``) with its longest run of identical layers folded.

    Two copies of the run are captured and :func:`irfold.fold_run` folds the second
    away once it has checked the copies form a chain; if they do not (identical
    modules used side by side), the whole depth is captured instead.
    """
    from echosim.frontend.fold import folded
    from echosim.frontend.irfold import fold_run

    with folded(root, enabled=fold) as info:
        cap = convert(export(call, args, where), dtype=dtype, name=name, strip=strip, rename=info.real_scope)
    if info.run is None:
        return cap
    graph = fold_run(cap.graph, info.run.prefix, info.run.count)
    if graph is None:
        return convert(export(call, args, where), dtype=dtype, name=name, strip=strip)
    cap.graph = graph
    return cap


def convert(
    ep: Any,
    *,
    dtype: DType,
    name: str,
    strip: str = "",
    rename: Callable[[str], str] = lambda s: s,
    causal_masks: bool = False,
) -> ExportCapture:
    """Turn an ``ExportedProgram`` into IR (no loss is added here)."""
    return _Aten(ep, dtype, name, strip, rename, causal_masks).run()
