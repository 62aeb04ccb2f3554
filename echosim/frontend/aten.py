"""torch.export capture: an ``nn.Module`` on ``meta`` becomes an aten graph, then IR.

``torch.export.export`` (non-strict, training IR) records aten ops with shapes in
``node.meta["val"]`` and the calling module in ``nn_module_stack``, so scopes read
``model.layers.0.self_attn.q_proj`` and the tensor-parallel plan patterns match
them as they match the zoo. No weight is allocated: modules and inputs live on
``meta``.

Conversion is a table of rules keyed by aten op (``aten_rules.RULES``), as in ``fx.py``.
Around the table:

* values nothing reads are dropped (HF's unused mask arithmetic, shape checks);
* in-place writes (``copy_`` into slices of a fresh buffer, ``index_put_``) become
  SSA values, so readers depend on the writes;
* a module that is one kernel in a training stack (an RMSNorm written as
  pow/mean/rsqrt/mul, a GELU written with tanh) becomes one IR node (``FUSED``);
* a 2-D weight feeding a matmul is held as (out, in) whatever its layout, so the
  TP plan splits the right axis of GPT-2's Conv1D (in, out) weights too;
* an op with no rule is costed as a memory-bound elementwise op and reported.
"""

from __future__ import annotations

import contextlib
import io
import logging
import operator
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from echosim.frontend.aten_rules import (
    NAMED,
    RULES,
    SKIP,
    SPLITS,
    VIEWS,
    Multi,
    fusable,
    inplace,
    is_inplace,
    op_name,
    packet,
    swaps_last_two,
)
from echosim.frontend.fused import FusedKind
from echosim.frontend.fx import CaptureError
from echosim.ir.graph import Graph
from echosim.ir.ops import (
    ElementwiseAttrs,
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
class _Fused:
    """Nodes of one call of a module that runs as a single kernel."""

    kind: FusedKind
    members: list[fx.Node]
    output: fx.Node | None = None
    inputs: list[fx.Node] = field(default_factory=list)


class _Aten:
    def __init__(self, ep: Any, dtype: DType, name: str, strip: str, rename: Callable[[str], str]) -> None:
        from torch.export.graph_signature import InputKind

        self.gm: fx.GraphModule = ep.graph_module
        self.dtype = dtype
        self.graph = Graph(name)
        self.strip = strip
        self.rename = rename
        self.warnings: list[str] = []
        self._unknown: dict[str, int] = {}
        self.env: dict[fx.Node, int | Multi | None] = {}
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
        while isinstance(node, fx.Node) and node.op == "call_function" and swaps_last_two(node):
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
            self.env[node] = Multi(None, False) if isinstance(node.meta.get("val"), (list, tuple)) else None

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
                    self._emit_fused(node, group)
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
            target = packet(node)
            if target in VIEWS and node.args and isinstance(node.args[0], fx.Node):
                self.base[node] = self.base.get(node.args[0], node.args[0])
            elif target is operator.getitem and isinstance(node.args[0], fx.Node):
                src = node.args[0]
                if packet(src) in SPLITS and isinstance(src.args[0], fx.Node):
                    self.base[node] = self.base.get(src.args[0], src.args[0])
        return self.base

    def _convert(self, node: fx.Node) -> None:
        target = packet(node)
        if target in SKIP:
            return
        rule = RULES.get(target) if target is not None else None
        if rule is None and isinstance(node.target, torch._ops.OpOverload) and is_inplace(node.target):
            rule = inplace
        if rule is None:
            rule = NAMED.get(op_name(node))
        if rule is None:
            self.unknown(node, op_name(node))
            return
        rule(self, node)

    # -- fusion ---------------------------------------------------------------------------
    def _emit_fused(self, node: fx.Node, group: _Fused) -> None:
        """One node for a whole module call, named after the module (``input_layernorm``)."""
        data = [a for a in group.inputs if a.name not in self.params][: group.kind.data_inputs]
        params = [a for a in group.inputs if a.name in self.params] if group.kind.op is OpKind.NORM else []
        name = self.scope(node).rsplit(".", 1)[-1] or str(group.kind.attrs)
        self.emit(node, group.kind.op, self.tensors([*data, *params]), group.kind.attrs, name=name)

    def _plan_fusion(self, nodes: list[fx.Node], live: set[fx.Node]) -> None:
        """Group each call of a single-kernel module (``FUSED``) and find its one output."""
        groups: list[_Fused] = []
        current: tuple[str, _Fused] | None = None
        for node in nodes:
            hit = fusable(node)
            if hit is None:
                current = None
                continue
            key, kind = hit
            if current is None or current[0] != key:
                current = (key, _Fused(kind, []))
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
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and is_inplace(node.target):
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
) -> ExportCapture:
    """Turn an ``ExportedProgram`` into IR (no loss is added here)."""
    from echosim.frontend.attention_fuse import fuse_attention

    cap = _Aten(ep, dtype, name, strip, rename).run()
    cap.graph = fuse_attention(cap.graph, cap.notes)
    return cap
