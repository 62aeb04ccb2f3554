"""The IR values of an exported program's fx nodes: what a rule of ``aten_rules`` reads and adds to.

:class:`AtenValues` holds the state of one conversion (fx node -> IR value, the
parameters, the storages written in place) and the helpers every rule uses:
``value``/``tensors`` to read operands, ``emit`` to add a node, ``param``/``weight``
for parameters, ``mutate`` for in-place writes, ``unknown`` for an op with no rule.
The main loop that walks the program and dispatches to the rules is in ``aten.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from echosim.frontend.spec import CaptureError
from echosim.ir.graph import Graph
from echosim.ir.ops import ElementwiseAttrs, OpKind, ParamAttrs
from echosim.ir.types import DType, TensorSpec

aten = torch.ops.aten


@dataclass
class Multi:
    """A tuple-valued op: ``getitem`` picks a view of ``source`` (split) or of the op's node.

    ``each`` holds one source per output where output ``i`` is a view of input ``i`` alone
    (``broadcast_tensors``, ``meshgrid``): each output then reads only its own input.
    """

    source: int | None
    views_only: bool
    each: tuple[int | None, ...] = ()


def packet(node: fx.Node) -> Any:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target.overloadpacket
    return target


def op_name(node: fx.Node) -> str:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return str(target.overloadpacket)  # "aten.linear", "transformers.grouped_mm_fallback"
    return getattr(target, "__name__", str(target))


def is_inplace(op: torch._ops.OpOverload) -> bool:
    schema = op._schema
    return (
        bool(schema.arguments)
        and schema.arguments[0].alias_info is not None
        and schema.arguments[0].alias_info.is_write
    )


def swaps_last_two(node: fx.Node) -> bool:
    """``t``, ``.T`` of a matrix, ``.mT`` (``.mH`` and ``adjoint`` of real tensors), ``transpose(-2, -1)`` (or
    ``swapaxes``) or a permute that only exchanges the last two axes."""
    target = packet(node)
    rank = len(node.meta["val"].shape) if isinstance(node.meta.get("val"), torch.Tensor) else 0
    if target in (aten.t, aten.mT, aten.mH, aten.adjoint) or (target is aten.numpy_T and rank == 2):
        return True
    if target in (aten.transpose, aten.swapaxes, aten.swapdims) and rank >= 2:
        dims = sorted(d % rank for d in node.args[1:3])
        return dims == [rank - 2, rank - 1]
    if target is aten.permute and rank >= 2:
        perm = [d % rank for d in node.args[1]]
        return perm == [*range(rank - 2), rank - 1, rank - 2]
    return False


def permutation(node: fx.Node) -> tuple[int, ...]:
    """The axes a permuting view (``permute``, ``transpose`` and its aliases, ``t``, ``.T``, ``.mT``, ``movedim``)
    takes its output's axes from, in order; ``()`` for any other view or the identity."""
    target = packet(node)
    val = node.meta.get("val")
    rank = len(val.shape) if isinstance(val, torch.Tensor) else 0
    perm = list(range(rank))
    if target in (aten.permute, aten.permute_copy) and rank:
        perm = [d % rank for d in node.args[1]]
    elif target in (aten.transpose, aten.transpose_copy, aten.swapaxes, aten.swapdims) and rank >= 2:
        a, b = (d % rank for d in node.args[1:3])
        perm[a], perm[b] = perm[b], perm[a]
    elif (target in (aten.t, aten.t_copy, aten.numpy_T) and rank == 2) or (
        target in (aten.mT, aten.mH, aten.adjoint) and rank >= 2
    ):
        perm[-2], perm[-1] = perm[-1], perm[-2]
    elif target is aten.numpy_T:
        perm.reverse()
    elif target in (aten.movedim, aten.moveaxis) and rank:
        sources, targets = node.args[1], node.args[2]
        sources, targets = ([sources], [targets]) if isinstance(sources, int) else (sources, targets)
        moved = dict(zip((t % rank for t in targets), (s % rank for s in sources), strict=True))
        rest = iter(a for a in range(rank) if a not in moved.values())
        perm = [moved[i] if i in moved else next(rest) for i in range(rank)]
    return tuple(perm) if perm != list(range(rank)) else ()


class AtenValues:
    """One conversion's state and the helpers a rule adds IR nodes with."""

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

    def _fqn(self, target: str) -> str:
        """A path without the wrapper module's prefix (``m.model.layers.0`` -> ``model.layers.0``)."""
        if not self.strip:
            return target
        if target == self.strip.rstrip("."):
            return ""
        return target[len(self.strip) :] if target.startswith(self.strip) else target

    # -- shapes and scopes ------------------------------------------------------------
    def ir_dtype(self, dt: torch.dtype) -> DType:
        """The IR dtype of a torch dtype: every float is costed in the capture's dtype."""
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
        return TensorSpec(shape or (1,), self.ir_dtype(val.dtype))

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
        if (stack := self._expert_stack(node)) is not None:
            as_nk = natural_is_nk == (swaps % 2 == 0)
            return self._stacked_param(*stack, swapped=not as_nk)
        return self.value(arg)

    def _expert_stack(self, node: Any) -> tuple[str, tuple[int, ...]] | None:
        """A 2-D parameter viewed as a stack of expert matrices ``[experts, a, b]`` (DBRX stores its experts as
        ``[experts * ffn, hidden]``): the parameter's name and the stack's shape."""
        if not (isinstance(node, fx.Node) and packet(node) in (aten.view, aten._unsafe_view, aten.reshape)):
            return None
        src = node.args[0]
        if not (isinstance(src, fx.Node) and src.op == "placeholder" and src.name in self.params):
            return None
        shape, whole = self.shape(node), self.shape(src)
        if len(shape) != 3 or len(whole) != 2 or shape[1:] != (whole[0] // shape[0], whole[1]):
            return None
        return src.name, shape

    def _stacked_param(self, name: str, shape: tuple[int, ...], swapped: bool) -> int:
        """The parameter ``name`` held as the expert stack ``shape`` (last two axes exchanged if ``swapped``):
        the expert-parallel pass splits a stack's first axis, as it does transformers' ``[experts, in, out]``."""
        nid = self.param(name)
        spec = self.graph[nid].out.with_shape((shape[0], shape[2], shape[1]) if swapped else shape)
        self.graph.replace(nid, out=spec)
        return nid

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
        val = node.meta.get("val")
        many = isinstance(val, (list, tuple))
        # A tuple-valued op is one kernel the size of its first output, its items views of it: the data keeps
        # flowing to the ops that read them (and to the loss) instead of stopping at the unknown op.
        spec = self.spec_of(val[0] if many and val else val)
        ins = self.tensors(node.args)
        if spec is not None and (ins or not many):
            nid = self.emit(node, OpKind.ELEMENTWISE, ins, ElementwiseAttrs(what.rsplit(".", 1)[-1]), spec)
            if many:
                self.env[node] = Multi(nid, False)
        else:
            self.env[node] = Multi(None, False) if many else None

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
