"""torch.fx capture: an ``nn.Module`` on the ``meta`` device becomes an IR graph.

The module is traced with ``torch.fx.symbolic_trace`` (module paths are kept in
``nn_module_stack``) and shapes come from running the trace on meta tensors, so no
weight is ever allocated. Repeated layers are folded as for every frontend
(:mod:`echosim.frontend.fold`): two copies are traced, shown to be a chain, and
one is kept with a repeat count, so depth does not multiply the cost of capture
or compile.

Per-target conversion lives in the ``_FUNCTIONS`` / ``_METHODS`` / ``_MODULES``
tables; a target with no rule is costed as a memory-bound elementwise op and
reported in ``Capture.warnings``, never a crash.
"""

from __future__ import annotations

import contextlib
import io
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from echosim.frontend import attention_ops, moe_ops
from echosim.frontend.conv import conv_matmul
from echosim.frontend.fold import capture_folded
from echosim.frontend.spec import Capture, CaptureError
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
    ViewAttrs,
)
from echosim.ir.types import DType, TensorSpec

# ---- the converter -----------------------------------------------------------------


class _Converter:
    def __init__(
        self, root: nn.Module, gm: fx.GraphModule, dtype: DType, name: str, rename: Callable[[str], str]
    ) -> None:
        self.root = root
        self.gm = gm
        self.dtype = dtype
        self.rename = rename  # module paths of a shortened ModuleList -> the layer indices they stand for
        self.graph = Graph(name)
        self.env: dict[fx.Node, int] = {}
        self.param_ids: dict[int, int] = {}  # id(torch param) -> IR node
        self.param_names: dict[int, str] = {}
        for pname, p in root.named_parameters(remove_duplicate=False):
            self.param_names.setdefault(id(p), pname)  # tied weights keep their first name
        self.warnings: list[str] = []

    # helpers
    def spec(self, node: fx.Node) -> TensorSpec:
        meta = node.meta.get("tensor_meta")
        if meta is None or not hasattr(meta, "shape"):
            raise CaptureError(f"no shape for fx node {node.name} ({node.target})")
        return TensorSpec(tuple(int(d) for d in meta.shape) or (1,), self._dtype(meta.dtype))

    def _dtype(self, dt: torch.dtype) -> DType:
        if dt.is_floating_point:
            return self.dtype
        if dt == torch.bool:
            return DType.BOOL
        return DType.INT64 if dt == torch.int64 else DType.INT32

    def scope(self, node: fx.Node) -> str:
        stack = node.meta.get("nn_module_stack")
        if stack and node.op != "call_module":
            return self.rename(str(list(stack.keys())[-1]))
        return self.rename(str(node.target)) if node.op == "call_module" else ""

    def param(self, p: torch.Tensor, owner: str) -> int:
        key = id(p)
        if key not in self.param_ids:
            name = self.rename(self.param_names.get(key, owner))
            spec = TensorSpec(tuple(p.shape) or (1,), self._dtype(p.dtype))
            scope = name.rsplit(".", 1)[0] if "." in name else ""
            self.param_ids[key] = self.graph.add(OpKind.PARAMETER, (), spec, ParamAttrs(), scope=scope, name=name)
        return self.param_ids[key]

    def tensors(self, args: Sequence[Any]) -> list[int]:
        out = []
        for a in args:
            if isinstance(a, fx.Node) and a in self.env:
                out.append(self.env[a])
            elif isinstance(a, (list, tuple)):
                out.extend(self.tensors(a))
        return out

    def emit(self, node: fx.Node, op: OpKind, inputs: Sequence[int], attrs: Any = None, name: str = "") -> None:
        self.env[node] = self.graph.add(
            op, inputs, self.spec(node), attrs, scope=self.scope(node), name=name or node.name
        )

    # main loop
    def run(self) -> Capture:
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self.env[node] = self.graph.add(OpKind.INPUT, (), self.spec(node), name=node.name)
                self.graph.inputs.append(self.env[node])
            elif node.op == "get_attr":
                self._get_attr(node)
            elif node.op == "call_module":
                self._call_module(node)
            elif node.op in ("call_function", "call_method"):
                self._call(node)
            elif node.op == "output":
                self.graph.outputs = self.tensors(node.args)
        return Capture(self.graph, self.warnings)

    def _get_attr(self, node: fx.Node) -> None:
        obj = self.gm.get_submodule("") if not node.target else _resolve(self.root, str(node.target))
        if isinstance(obj, nn.Parameter):
            self.env[node] = self.param(obj, str(node.target))
        elif isinstance(obj, torch.Tensor):
            self.env[node] = self.graph.add(
                OpKind.INPUT, (), self.spec(node), scope=self.scope(node), name=self.rename(str(node.target))
            )

    def _call_module(self, node: fx.Node) -> None:
        mod = self.gm.get_submodule(str(node.target))
        rule = _MODULES.get(type(mod))
        if rule is None:
            rule = _unknown_module
        rule(self, node, mod)

    def _call(self, node: fx.Node) -> None:
        if "tensor_meta" not in node.meta and not _returns_tensors(node):
            return  # shape arithmetic (getattr(x, "shape"), x.size(1), ...)
        table = _FUNCTIONS if node.op == "call_function" else _METHODS
        rule = table.get(node.target)  # type: ignore[arg-type]
        if rule is None:
            rule = _unknown_function
        rule(self, node)


def _resolve(root: nn.Module, target: str) -> Any:
    obj: Any = root
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _returns_tensors(node: fx.Node) -> bool:
    return any(isinstance(u, fx.Node) and "tensor_meta" in u.meta for u in node.users)


def _numel_before_last(shape: Sequence[int]) -> int:
    return math.prod(shape[:-1]) if len(shape) > 1 else 1


# ---- rules ---------------------------------------------------------------------------

Rule = Callable[[_Converter, fx.Node], None]


def _linear(c: _Converter, node: fx.Node, x: int, w: int, b: int | None) -> None:
    xs = c.graph[x].out.shape
    ws = c.graph[w].out.shape  # (out, in)
    attrs = MatmulAttrs(m=_numel_before_last(xs), n=ws[0], k=ws[1])
    c.emit(node, OpKind.MATMUL, [x, w] + ([b] if b is not None else []), attrs)


def _module_linear(c: _Converter, node: fx.Node, mod: nn.Linear) -> None:
    (x,) = c.tensors(node.args[:1])
    scope = str(node.target)
    b = c.param(mod.bias, scope + ".bias") if mod.bias is not None else None
    _linear(c, node, x, c.param(mod.weight, scope + ".weight"), b)


def _module_embedding(c: _Converter, node: fx.Node, mod: nn.Embedding) -> None:
    (ids,) = c.tensors(node.args[:1])
    w = c.param(mod.weight, f"{node.target}.weight")
    c.emit(node, OpKind.EMBEDDING, [ids, w], EmbeddingAttrs(mod.num_embeddings, mod.embedding_dim))


def _module_norm(kind: str) -> Callable[[_Converter, fx.Node, nn.Module], None]:
    def rule(c: _Converter, node: fx.Node, mod: nn.Module) -> None:
        (x,) = c.tensors(node.args[:1])
        params = [c.param(p, f"{node.target}.{n}") for n, p in mod.named_parameters(recurse=False)]
        c.emit(node, OpKind.NORM, [x, *params], NormAttrs(kind))

    return rule


def _module_dropout(c: _Converter, node: fx.Node, mod: nn.Dropout) -> None:
    (x,) = c.tensors(node.args[:1])
    if mod.p == 0.0:
        c.emit(node, OpKind.VIEW, [x])
    else:
        c.emit(node, OpKind.ELEMENTWISE, [x], ElementwiseAttrs("dropout", 2))


def _module_activation(fn: str) -> Callable[[_Converter, fx.Node, nn.Module], None]:
    def rule(c: _Converter, node: fx.Node, mod: nn.Module) -> None:
        c.emit(node, OpKind.ELEMENTWISE, c.tensors(node.args[:1]), ElementwiseAttrs(fn, _ACT_FLOPS.get(fn, 1)))

    return rule


def _module_conv(transposed: bool) -> Callable[[_Converter, fx.Node, Any], None]:
    def rule(c: _Converter, node: fx.Node, mod: Any) -> None:
        (x,) = c.tensors(node.args[:1])
        params = [c.param(p, f"{node.target}.{n}") for n, p in mod.named_parameters(recurse=False)]
        shape = c.graph[x].out.shape
        attrs = conv_matmul(shape, tuple(mod.weight.shape), c.spec(node).shape, mod.groups, transposed)
        c.emit(node, OpKind.MATMUL, [x, *params], attrs)

    return rule


def _module_pool(fn: str) -> Callable[[_Converter, fx.Node, nn.Module], None]:
    def rule(c: _Converter, node: fx.Node, mod: nn.Module) -> None:
        (x,) = c.tensors(node.args[:1])
        smaller = c.spec(node).numel < c.graph[x].out.numel
        c.emit(node, OpKind.REDUCTION if smaller else OpKind.ELEMENTWISE, [x], ElementwiseAttrs(fn))

    return rule


def _unknown_module(c: _Converter, node: fx.Node, mod: nn.Module) -> None:
    name = type(mod).__name__
    c.warnings.append(f"no rule for module {name} at {c.scope(node)}: costed as memory-bound")
    inputs = c.tensors(node.args) + [c.param(p, f"{node.target}.{n}") for n, p in mod.named_parameters()]
    c.emit(node, OpKind.ELEMENTWISE, inputs, ElementwiseAttrs(name.lower()))


_ACT_FLOPS = {"gelu": 8, "silu": 4, "relu": 1, "tanh": 4, "sigmoid": 4, "elu": 4, "softplus": 4, "mish": 6}

_POOLS = (
    nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
    nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
    nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d,
)  # fmt: skip

_MODULES: dict[type, Callable[[_Converter, fx.Node, Any], None]] = {
    nn.Linear: _module_linear,
    nn.Embedding: _module_embedding,
    nn.LayerNorm: _module_norm("layernorm"),
    nn.RMSNorm: _module_norm("rmsnorm"),
    nn.Dropout: _module_dropout,
    nn.GELU: _module_activation("gelu"),
    nn.SiLU: _module_activation("silu"),
    nn.ReLU: _module_activation("relu"),
    nn.Tanh: _module_activation("tanh"),
    nn.Sigmoid: _module_activation("sigmoid"),
    nn.Identity: lambda c, node, mod: c.emit(node, OpKind.VIEW, c.tensors(node.args[:1])),
    nn.Flatten: lambda c, node, mod: c.emit(node, OpKind.VIEW, c.tensors(node.args[:1])),
    nn.ReLU6: _module_activation("relu6"),
    nn.LeakyReLU: _module_activation("leaky_relu"),
    nn.Hardswish: _module_activation("hardswish"),
    nn.Hardsigmoid: _module_activation("hardsigmoid"),
    nn.ELU: _module_activation("elu"),
    nn.Softplus: _module_activation("softplus"),
    nn.Mish: _module_activation("mish"),
    nn.GroupNorm: _module_norm("groupnorm"),
    **{cls: _module_norm("batchnorm") for cls in (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)},
    **{cls: _module_norm("instancenorm") for cls in (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)},
    **{cls: _module_conv(False) for cls in (nn.Conv1d, nn.Conv2d, nn.Conv3d)},
    **{cls: _module_conv(True) for cls in (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)},
    **{cls: _module_pool(cls.__name__.lower()) for cls in _POOLS},
}


def _permutation(node: fx.Node, rank: int) -> tuple[int, ...]:
    """The axes ``transpose`` or ``permute`` (method or function) takes its output's axes from; ``()`` otherwise."""
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    dims = [d for d in node.args[1:] if isinstance(d, int)] or [
        d for a in node.args[1:2] if isinstance(a, (list, tuple)) for d in a
    ]
    if not rank or len(node.args) < 2 or not all(isinstance(d, int) for d in dims):
        return ()
    perm = list(range(rank))
    if name == "transpose" and len(dims) == 2:
        a, b = (d % rank for d in dims)
        perm[a], perm[b] = perm[b], perm[a]
    elif name == "permute" and len(dims) == rank:
        perm = [d % rank for d in dims]
    return tuple(perm) if perm != list(range(rank)) else ()


def _view(c: _Converter, node: fx.Node) -> None:
    ins = c.tensors(node.args[:1])
    if "tensor_meta" in node.meta and hasattr(node.meta["tensor_meta"], "shape"):
        after = tuple(node.meta["tensor_meta"].shape)
        perm = _permutation(node, len(after)) if ins else ()
        c.emit(node, OpKind.VIEW, ins, ViewAttrs.permuting(perm, c.graph[ins[0]].out.shape, after) if perm else None)
    else:  # tuple results (split/chunk): alias the input; getitem picks the shape
        c.env[node] = ins[0]


def _getitem(c: _Converter, node: fx.Node) -> None:
    src = node.args[0]
    if isinstance(src, fx.Node) and src in c.env and "tensor_meta" in node.meta:
        c.emit(node, OpKind.VIEW, [c.env[src]])


def _elementwise(fn: str, flops: int = 1) -> Rule:
    def rule(c: _Converter, node: fx.Node) -> None:
        c.emit(node, OpKind.ELEMENTWISE, c.tensors(node.args), ElementwiseAttrs(fn, flops))

    return rule


def _sdpa(c: _Converter, node: fx.Node) -> None:
    q, k, v = c.tensors(node.args[:3])
    qs, ks, vs = c.graph[q].out.shape, c.graph[k].out.shape, c.graph[v].out.shape
    causal = bool(node.kwargs.get("is_causal", node.args[5] if len(node.args) > 5 else False))
    batch = math.prod(qs[:-3]) if len(qs) > 3 else 1
    # QK^T contracts the query/key head, PV makes the value head (MLA: 192 and 128): their mean keeps FLOPs exact
    dropout_p = node.kwargs.get("dropout_p", node.args[4] if len(node.args) > 4 else 0.0)
    dropout = float(dropout_p or 0.0) > 0  # F.dropout's rule: the probabilities are dropped in training
    v_dim = vs[-1] if vs[-1] != qs[-1] else 0
    attrs = AttentionAttrs(
        batch, qs[-3], ks[-3], qs[-2], ks[-2], (qs[-1] + vs[-1]) // 2, causal, dropout=dropout, head_dim_v=v_dim
    )
    mask = c.tensors([node.kwargs.get("attn_mask")]) if node.kwargs.get("attn_mask") is not None else []
    c.emit(node, OpKind.ATTENTION, [q, k, v, *mask], attrs)


def _local_sdpa(c: _Converter, node: fx.Node) -> None:
    """:func:`attention_ops.local_attention`: causal attention within a sliding window of keys."""
    q, k, v = c.tensors(node.args[:3])
    qs, ks, vs = c.graph[q].out.shape, c.graph[k].out.shape, c.graph[v].out.shape
    window = int(node.kwargs.get("window", node.args[3] if len(node.args) > 3 else 0))
    batch = math.prod(qs[:-3]) if len(qs) > 3 else 1
    v_dim = vs[-1] if vs[-1] != qs[-1] else 0
    attrs = AttentionAttrs(
        batch, qs[-3], ks[-3], qs[-2], ks[-2], (qs[-1] + vs[-1]) // 2, True, window=window, head_dim_v=v_dim
    )
    c.emit(node, OpKind.ATTENTION, [q, k, v], attrs)


def _fn_linear(c: _Converter, node: fx.Node) -> None:
    ins = c.tensors(node.args)
    _linear(c, node, ins[0], ins[1], ins[2] if len(ins) > 2 else None)


def _matmul(c: _Converter, node: fx.Node) -> None:
    a, b = c.tensors(node.args[:2])
    sa, sb = c.graph[a].out.shape, c.graph[b].out.shape
    if len(sb) == 2:
        c.emit(node, OpKind.MATMUL, [a, b], MatmulAttrs(m=_numel_before_last(sa), n=sb[1], k=sb[0]))
    else:
        batch = math.prod(sa[:-2])
        c.emit(node, OpKind.MATMUL, [a, b], MatmulAttrs(m=sa[-2], n=sb[-1], k=sa[-1], batch=batch))


def _norm(kind: str) -> Rule:
    def rule(c: _Converter, node: fx.Node) -> None:
        c.emit(node, OpKind.NORM, c.tensors(node.args) + c.tensors(list(node.kwargs.values())), NormAttrs(kind))

    return rule


def _softmax(c: _Converter, node: fx.Node) -> None:
    c.emit(node, OpKind.SOFTMAX, c.tensors(node.args[:1]))


def _cross_entropy(c: _Converter, node: fx.Node) -> None:
    logits, labels = c.tensors(node.args[:2])
    vocab = c.graph[logits].out.shape[-1]
    c.emit(node, OpKind.CROSS_ENTROPY, [logits, labels], CrossEntropyAttrs(vocab))


def _embedding_fn(c: _Converter, node: fx.Node) -> None:
    ids, w = c.tensors(node.args[:2])
    vocab, dim = c.graph[w].out.shape
    c.emit(node, OpKind.EMBEDDING, [ids, w], EmbeddingAttrs(vocab, dim))


def _topk(c: _Converter, node: fx.Node) -> None:
    """``(values, indices)``: one selection kernel; getitem picks each result's shape."""
    meta = node.meta["tensor_meta"][0]
    spec = TensorSpec(tuple(int(d) for d in meta.shape), c._dtype(meta.dtype))
    ins = c.tensors(node.args[:1])
    c.env[node] = c.graph.add(
        OpKind.ELEMENTWISE, ins, spec, ElementwiseAttrs("topk"), scope=c.scope(node), name=node.name
    )


def _moe_permute(fn: str) -> Rule:
    """Dispatch / combine: a memory-bound gather of rows (expert ids and router weights ride along)."""

    def rule(c: _Converter, node: fx.Node) -> None:
        c.emit(node, OpKind.ELEMENTWISE, c.tensors(node.args), ElementwiseAttrs(fn))

    return rule


def _grouped_mm(c: _Converter, node: fx.Node) -> None:
    """``rows [M, in]`` grouped by expert times ``weight [E, in, out]``: E products of ~M/E rows."""
    rows, w = c.tensors(node.args[:2])
    m = c.graph[rows].out.shape[0]
    experts, k, n = c.graph[w].out.shape
    c.emit(node, OpKind.MATMUL, [rows, w], MatmulAttrs(m=-(-m // experts), n=n, k=k, batch=experts, grouped=True))


def _unknown_function(c: _Converter, node: fx.Node) -> None:
    name = getattr(node.target, "__name__", str(node.target))
    if "tensor_meta" not in node.meta or not hasattr(node.meta["tensor_meta"], "shape"):
        ins = c.tensors(node.args)
        if ins:
            c.env[node] = ins[0]
        return
    c.warnings.append(f"no rule for {name} at {c.scope(node) or '<root>'}: costed as memory-bound")
    c.emit(node, OpKind.ELEMENTWISE, c.tensors(node.args), ElementwiseAttrs(str(name)))


_VIEW_METHODS = (
    "view",
    "reshape",
    "transpose",
    "permute",
    "flatten",
    "split",
    "chunk",
    "narrow",
    "contiguous",
    "expand",
    "unsqueeze",
    "squeeze",
    "t",
    "unflatten",
    "view_as",
    "type_as",
    "to",
    "float",
    "half",
    "bfloat16",
    "detach",
)

_METHODS: dict[str, Rule] = {name: _view for name in _VIEW_METHODS}
_METHODS.update(
    {
        "add": _elementwise("add"),
        "mul": _elementwise("mul"),
        "softmax": _softmax,
        "pow": _elementwise("pow"),
        "mean": _elementwise("mean"),
        "sum": _elementwise("sum"),
        "clamp": _elementwise("clamp"),
    }
)

_FUNCTIONS: dict[Any, Rule] = {
    operator.getitem: _getitem,
    operator.add: _elementwise("add"),
    operator.sub: _elementwise("sub"),
    operator.mul: _elementwise("mul"),
    operator.truediv: _elementwise("div"),
    operator.neg: _elementwise("neg"),
    operator.matmul: _matmul,
    torch.add: _elementwise("add"),
    torch.mul: _elementwise("mul"),
    torch.cat: _elementwise("cat", 0),
    torch.clamp: _elementwise("clamp"),
    torch.tanh: _elementwise("tanh", 4),
    torch.rsqrt: _elementwise("rsqrt", 2),
    torch.matmul: _matmul,
    torch.bmm: _matmul,
    torch.flatten: _view,
    torch.reshape: _view,
    torch.transpose: _view,
    torch.permute: _view,
    torch.narrow: _view,
    torch.chunk: _view,
    torch.split: _view,
    torch.softmax: _softmax,
    F.softmax: _softmax,
    F.gelu: _elementwise("gelu", 8),
    F.silu: _elementwise("silu", 4),
    F.relu: _elementwise("relu", 1),
    F.dropout: _elementwise("dropout", 2),
    F.linear: _fn_linear,
    F.layer_norm: _norm("layernorm"),
    F.rms_norm: _norm("rmsnorm"),
    F.scaled_dot_product_attention: _sdpa,
    F.cross_entropy: _cross_entropy,
    F.embedding: _embedding_fn,
    torch.topk: _topk,
    moe_ops.moe_dispatch: _moe_permute("moe_dispatch"),
    moe_ops.moe_combine: _moe_permute("moe_combine"),
    moe_ops.grouped_mm: _grouped_mm,
    moe_ops.expert_bias_rows: _moe_permute("moe_expert_bias"),
    attention_ops.local_attention: _local_sdpa,
}


# ---- entry point ---------------------------------------------------------------------


_DYNAMO_SKIPPED = False


def skip_dynamo_import() -> None:
    """Spare a cold capture the import of ``torch._dynamo`` (about 40% of a cold compile's CPU time).

    Meta tensors run many ops (``add``, ``mul``, ...) through ``torch._refs``, whose type-promotion
    wrapper is decorated with ``torch._disable_dynamo``: its first call imports all of
    ``torch._dynamo`` to build a dynamo-disabled twin of the function, which it then caches on the
    function as ``__dynamo_disable``. echosim never runs dynamo (no ``torch.compile``; ``torch.export``
    of hf: models imports it itself), so each wrapped function is given itself as that twin up front.
    Found by walking the closures of ``torch._refs``; what is not found falls back to torch's own path.
    """
    global _DYNAMO_SKIPPED
    if _DYNAMO_SKIPPED:
        return
    _DYNAMO_SKIPPED = True
    try:
        import torch._compile
        import torch._refs
        import torch._refs.nn.functional
        import torch._refs.special
    except ImportError:
        return
    marker = getattr(torch._compile._disable_dynamo(lambda: None), "__code__", None)
    seen: set[int] = set()

    def visit(fn: Any, depth: int) -> None:
        if depth > 6 or id(fn) in seen or not hasattr(fn, "__code__"):
            return
        seen.add(id(fn))
        cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=False))
        if fn.__code__ is marker and "fn" in cells:
            inner = cells["fn"].cell_contents
            if getattr(inner, "__dynamo_disable", None) is None:
                inner.__dynamo_disable = inner
        for cell in cells.values():
            try:
                visit(cell.cell_contents, depth + 1)
            except ValueError:  # an empty cell
                continue
        visit(getattr(fn, "__wrapped__", None), depth + 1)

    for module in (torch._refs, torch._refs.nn.functional, torch._refs.special):
        for value in list(vars(module).values()):
            visit(value, 0)


def capture_module(
    module: nn.Module,
    example_inputs: Sequence[torch.Tensor],
    *,
    dtype: DType = DType.BF16,
    name: str = "model",
    fold: bool = True,
    depth: int = 0,
) -> Capture:
    """Trace ``module`` (built on meta) with ``example_inputs`` (meta tensors) into IR.

    Repeated layers are folded (``fold``) by :func:`fold.capture_folded`; ``depth`` is
    the number of layers its run stands for when ``module`` was built shorter (the zoo).
    """

    def trace(rename: Callable[[str], str]) -> Capture:
        from torch.fx.passes.shape_prop import ShapeProp

        skip_dynamo_import()

        try:
            gm = fx.symbolic_trace(module)
        except Exception as exc:  # torch raises many types; name the construct
            text = " ".join(str(exc).split())
            raise CaptureError(f"torch.fx could not trace {type(module).__name__}: {text}") from None
        try:  # ShapeProp prints the traceback of a failing node itself: kept off the user's stderr
            with contextlib.redirect_stderr(io.StringIO()):
                ShapeProp(gm).propagate(*example_inputs)
        except Exception as exc:  # torch's message spans lines (node, traceback): its cause, on one line
            cause = exc.__cause__ or exc
            text = " ".join(str(cause).split())
            raise CaptureError(f"shape propagation failed for {type(module).__name__}: {text}") from None
        return _Converter(module, gm, dtype, name, rename).run()

    return capture_folded(module, trace, enabled=fold, depth=depth)
