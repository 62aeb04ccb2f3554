"""torch.export capture: an ``nn.Module`` on ``meta`` becomes an aten graph, then IR.

``torch.export.export`` (non-strict, training IR) records aten ops with shapes in
``node.meta["val"]`` and the calling module in ``nn_module_stack``, so scopes read
``model.layers.0.self_attn.q_proj`` and the tensor-parallel plan patterns match
them as they match the zoo. No weight is allocated: modules and inputs live on
``meta``.

Conversion is a table of rules keyed by aten op (``aten_rules.RULES``), as in ``fx.py``;
the rules read and add IR values through :class:`~echosim.frontend.aten_values.AtenValues`,
and the loop here walks the program. Around the table:

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
import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from echosim.frontend.aten_rules import NAMED, RULES, SKIP, SPLITS, VIEWS, fusable, inplace
from echosim.frontend.aten_values import AtenValues, is_inplace, op_name, packet
from echosim.frontend.fold import capture_folded
from echosim.frontend.fused import FusedKind
from echosim.frontend.spec import Capture, CaptureError
from echosim.ir.ops import OpKind
from echosim.ir.types import DType

# ---- the converter --------------------------------------------------------------------


@dataclass
class _Fused:
    """Nodes of one call of a module that runs as a single kernel."""

    kind: FusedKind
    members: list[fx.Node]
    output: fx.Node | None = None
    inputs: list[fx.Node] = field(default_factory=list)


class _Aten(AtenValues):
    """The main loop: walk the exported program, fuse single-kernel modules, dispatch each op to its rule."""

    def __init__(self, ep: Any, dtype: DType, name: str, strip: str, rename: Callable[[str], str]) -> None:
        super().__init__(ep, dtype, name, strip, rename)
        self.fused: dict[fx.Node, _Fused] = {}

    # -- main loop ----------------------------------------------------------------------
    def run(self) -> Capture:
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
        return Capture(self.graph, self.warnings)

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


def inline_grad_regions(gm: fx.GraphModule) -> int:
    """Put the body of each ``torch.no_grad()`` / ``enable_grad()`` region back in line; returns how many.

    torch.export wraps such a region in the higher-order op ``wrap_with_set_grad_enabled`` around a submodule
    (Phi-3.5-MoE's router, CPM-Ant's position bias): converted as one op, its work was a single memory-bound
    node and a "no rule" warning. Its ops are the region's ops; what they need no gradient for, autodiff
    leaves out as it does for any value no parameter reaches."""
    hop = getattr(torch.ops.higher_order, "wrap_with_set_grad_enabled", None)
    done = 0
    for node in list(gm.graph.nodes):
        if hop is None or node.op != "call_function" or node.target is not hop:
            continue
        _enabled, sub, *operands = node.args
        body = getattr(gm, sub.target, None) if isinstance(sub, fx.Node) and sub.op == "get_attr" else None
        if not isinstance(body, fx.GraphModule) or any(n.op == "get_attr" for n in body.graph.nodes):
            continue  # a region holding another region or a constant: left as one op
        outputs = _copy_body(gm, node, body, operands)
        for user in list(node.users):
            if user.op == "call_function" and user.target is operator.getitem:
                user.replace_all_uses_with(outputs[user.args[1]])
                gm.graph.erase_node(user)
        if node.users:  # the region's result used whole
            node.replace_all_uses_with(outputs)
        gm.graph.erase_node(node)
        done += 1
    return done


def _copy_body(gm: fx.GraphModule, at: fx.Node, body: fx.GraphModule, operands: list[Any]) -> Any:
    """Copy ``body``'s ops into ``gm`` before ``at``, its placeholders bound to ``operands``; its outputs."""
    placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
    env: dict[fx.Node, Any] = dict(zip(placeholders, operands, strict=True))
    outputs: Any = ()
    with gm.graph.inserting_before(at):
        for n in body.graph.nodes:
            if n.op == "output":
                outputs = fx.node.map_arg(n.args[0], env.__getitem__)
            elif n.op != "placeholder":
                env[n] = gm.graph.node_copy(n, env.__getitem__)
    return outputs


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
    """``torch.export.export`` with a one-line error naming the construct that stopped it. Tensors the model makes
    without naming a device (``torch.zeros(batch, hidden)`` for an initial state) are made on ``meta`` with the rest,
    as they would be made on the one device the model trains on, not on the CPU beside meta inputs."""
    try:
        with quiet(), torch.device("meta"):
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


def capture_export(
    root: torch.nn.Module,
    call: torch.nn.Module,
    args: tuple[Any, ...],
    *,
    dtype: DType,
    name: str,
    strip: str = "",
    where: str = "",
    fold: bool = True,
) -> Capture:
    """Export ``call`` (which runs ``root``) into IR, repeated layers folded (:func:`fold.capture_folded`).

    transformers' Mamba layers scan as their training kernel does, not token by token
    (:func:`echosim.frontend.ssm_ops.fused_scan`), and Llama 4's experts route their tokens, not every token
    through every expert (:func:`echosim.frontend.moe_patches.routed_experts`), whether an ``hf:`` config or a
    ``.py`` file built them; ``nn.Transformer``'s masks are not read (:func:`mask_values_unread`)."""
    from echosim.frontend.moe_patches import routed_experts
    from echosim.frontend.ssm_ops import fused_scan

    def capture(rename: Callable[[str], str]) -> Capture:
        with fused_scan(), routed_experts(), mask_values_unread():
            return convert(export(call, args, where), dtype=dtype, name=name, strip=strip, rename=rename)

    return capture_folded(root, capture, enabled=fold)


@contextmanager
def mask_values_unread() -> Iterator[None]:
    """``nn.Transformer``, ``nn.TransformerEncoder`` and ``nn.TransformerDecoder`` compare an explicit attention
    mask with a causal one to learn whether it is causal (``torch.nn.modules.transformer._detect_is_causal_mask``):
    a read of its values, which a tensor on ``meta`` does not have, so torch.export refused any model that passes
    one and the torch.fx fallback then costed the whole ``nn.Transformer`` as one memory-bound op. While capturing,
    a mask is causal only where the caller says so (``is_causal`` / ``tgt_is_causal``); otherwise its attention is
    costed over every key, as PyTorch runs an attention with an explicit mask it has not found causal."""
    from torch.nn.modules import transformer

    original = transformer._detect_is_causal_mask
    transformer._detect_is_causal_mask = lambda mask, is_causal=None, size=None: bool(is_causal)
    try:
        yield
    finally:
        transformer._detect_is_causal_mask = original


def _refuse_value_dependent_shapes(gm: torch.fx.GraphModule) -> None:
    """A size only the data decides (``torch.where(mask)``, ``nonzero``, boolean indexing) exports as an unbacked
    symbol: no rule can cost it. Name the op that made it and the model's line, not the first place it is read.
    A mixture of experts written as a loop over experts (``torch.where(expert_ids == i)``) is the common case."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    for node in gm.graph.nodes:
        val = node.meta.get("val")
        tensors = val if isinstance(val, (list, tuple)) else [val]
        shapes = [t.shape for t in tensors if isinstance(t, torch.Tensor)]
        if node.op != "call_function" or not any(free_unbacked_symbols(shape) for shape in shapes):
            continue
        frames = re.findall(r'File "([^"]+)", line (\d+), in \w+\n\s*(.*)', node.meta.get("stack_trace") or "")
        user = [f for f in frames if "/torch/" not in f[0] and "site-packages" not in f[0]]
        at = f" at {user[-1][0].rsplit('/', 1)[-1]}:{user[-1][1]} `{user[-1][2].strip()}`" if user else ""
        raise CaptureError(
            f"{op_name(node)}{at} makes a tensor whose size depends on tensor values, which echosim cannot cost; "
            "give it a size the shapes decide (a mixture of experts: sort the rows by expert and run "
            "torch._grouped_mm over them, instead of selecting each expert's rows)"
        )


def convert(
    ep: Any,
    *,
    dtype: DType,
    name: str,
    strip: str = "",
    rename: Callable[[str], str] = lambda s: s,
) -> Capture:
    """Turn an ``ExportedProgram`` into IR (no loss is added here)."""
    from echosim.frontend.attention_fuse import fuse_attention
    from echosim.frontend.moe_routing import mark_routing

    inline_grad_regions(ep.graph_module)
    _refuse_value_dependent_shapes(ep.graph_module)
    cap = _Aten(ep, dtype, name, strip, rename).run()
    cap.graph = fuse_attention(cap.graph, cap.notes)
    mark_routing(cap.graph)
    return cap
