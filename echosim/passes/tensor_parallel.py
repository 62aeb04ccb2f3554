"""Megatron tensor parallelism driven by a module-path plan.

A plan maps ``fnmatch`` patterns on module scopes to a style, in the manner of
PyTorch's ``parallelize_module``: ``colwise`` (split the output features),
``rowwise`` (split the input features; an all_reduce follows), ``vocab`` (a
vocabulary-parallel embedding, output layer or loss). Sharding then propagates
through the ops between a column- and a row-parallel layer (attention heads,
activations, views), dividing exactly one axis of every tensor it reaches.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, replace
from typing import ClassVar

from echosim.ir.graph import Graph, Node
from echosim.ir.ops import (
    AttentionAttrs,
    CollectiveAttrs,
    CrossEntropyAttrs,
    EmbeddingAttrs,
    MatmulAttrs,
    OpKind,
    ParamAttrs,
)
from echosim.ir.types import DType, TensorSpec
from echosim.passes.base import LayoutError

# The plan for the zoo's module names and the HF / Megatron conventions.
DEFAULT_TP_PLAN: tuple[tuple[str, str], ...] = (
    ("*.qkv", "colwise"),
    ("*.q_proj", "colwise"),
    ("*.k_proj", "colwise"),
    ("*.v_proj", "colwise"),
    ("*.q_b_proj", "colwise"),  # DeepSeek MLA: the per-head up-projections split by heads
    ("*.kv_b_proj", "colwise"),
    ("*.query_key_value", "colwise"),
    ("*.c_attn", "colwise"),
    ("*.fc1", "colwise"),
    ("*.c_fc", "colwise"),
    ("*.gate_proj", "colwise"),
    ("*.up_proj", "colwise"),
    ("*.attn.proj", "rowwise"),
    ("*.o_proj", "rowwise"),
    ("*.dense", "rowwise"),
    ("*.c_proj", "rowwise"),
    ("*.fc2", "rowwise"),
    ("*.down_proj", "rowwise"),
    ("embed", "vocab"),
    ("*embed_tokens", "vocab"),
    ("*.wte", "vocab"),
    ("lm_head", "vocab"),
)


def style_for(scope: str, plan: tuple[tuple[str, str], ...]) -> str:
    for pattern, style in plan:
        if fnmatch.fnmatchcase(scope, pattern):
            return style
    return ""


def _split_axis_after_view(src: tuple[int, ...], axis: int, dst: tuple[int, ...]) -> int:
    """Which axis of ``dst`` carries the split axis of ``src`` after a view or permute."""
    if sorted(src) == sorted(dst) and src != dst:  # a permutation: follow the size
        candidates = [i for i, d in enumerate(dst) if d == src[axis]]
        return min(candidates, key=lambda i: abs(i - axis))
    prefix = math.prod(src[:axis])
    acc = 1
    for i, d in enumerate(dst):
        if acc == prefix and d != 1 and (d % src[axis] == 0 or src[axis] % d == 0):
            return i
        acc *= d
    return len(dst) - 1


@dataclass(frozen=True)
class TensorParallel:
    """Shard the forward graph ``tp`` ways and insert Megatron's all_reduces."""

    tp: int
    plan: tuple[tuple[str, str], ...] = DEFAULT_TP_PLAN
    name: ClassVar[str] = "tensor-parallel"

    def run(self, graph: Graph) -> Graph:
        if self.tp == 1:
            return graph
        return _Sharder(graph, self.tp, self.plan).run()


class _Sharder:
    def __init__(self, graph: Graph, tp: int, plan: tuple[tuple[str, str], ...]) -> None:
        self.src = graph
        self.tp = tp
        self.plan = plan
        self.out = Graph(graph.name, graph.repeats)
        self.map: dict[int, int] = {}
        self.split: dict[int, int] = {}  # new value id -> split axis

    def div(self, spec: TensorSpec, axis: int, what: str) -> TensorSpec:
        shape = list(spec.shape)
        if shape[axis] % self.tp:
            raise LayoutError(f"tp={self.tp} does not divide {what} (size {shape[axis]})")
        shape[axis] //= self.tp
        return spec.with_shape(tuple(shape))

    def add(self, node: Node, inputs: list[int], out: TensorSpec, attrs: object) -> int:
        return self.out.add(
            node.op,
            inputs,
            out,
            attrs,
            phase=node.phase,
            scope=node.scope,
            name=node.name,  # type: ignore[arg-type]
        )

    def all_reduce(self, value: int, node: Node, name: str) -> int:
        spec = self.out[value].out
        attrs = CollectiveAttrs("tp", self.tp, spec.nbytes)
        return self.out.add(OpKind.ALL_REDUCE, [value], spec, attrs, scope=node.scope, name=name)

    def run(self) -> Graph:
        params_style = self._param_styles()
        for node in self.src:
            ins = [self.map[i] for i in node.inputs]
            self.map[node.id] = self._node(node, ins, params_style)
        self.out.outputs = [self.map[o] for o in self.src.outputs]
        self.out.inputs = [self.map[i] for i in self.src.inputs]
        return self.out

    def _param_styles(self) -> dict[int, tuple[str, int]]:
        """Decide for each parameter how it is split: (style, axis)."""
        styles: dict[int, tuple[str, int]] = {}
        for node in self.src:
            style = style_for(node.scope, self.plan)
            if node.op is OpKind.MATMUL and style and len(node.inputs) >= 2:
                w = self.src[node.inputs[1]]
                if w.op is OpKind.PARAMETER:
                    axis = 0 if style in ("colwise", "vocab") else 1
                    styles[w.id] = (style, axis)
                    if len(node.inputs) > 2 and style != "rowwise":
                        styles[node.inputs[2]] = (style, 0)
            elif node.op is OpKind.EMBEDDING and style == "vocab":
                styles[node.inputs[1]] = ("vocab", 0)
        return styles

    def _node(self, node: Node, ins: list[int], params: dict[int, tuple[str, int]]) -> int:
        split_ins = [i for i in ins if i in self.split]
        if node.op is OpKind.PARAMETER:
            if node.id in params:
                _style, axis = params[node.id]
                out = self.div(node.out, axis, f"{node.name} dim {axis}")
                return self.out.add(node.op, [], out, ParamAttrs(shard=self.tp), scope=node.scope, name=node.name)
            return self.add(node, ins, node.out, node.attrs)
        if node.op is OpKind.MATMUL and isinstance(node.attrs, MatmulAttrs):
            return self._matmul(node, ins)
        if node.op is OpKind.EMBEDDING and isinstance(node.attrs, EmbeddingAttrs):
            if self.out[ins[1]].out.shape[0] != node.attrs.vocab:  # weight was split
                attrs = replace(node.attrs, vocab=node.attrs.vocab // self.tp, tp="vocab")
                v = self.add(node, ins, node.out, attrs)
                return self.all_reduce(v, node, f"{node.name}.tp_all_reduce")
            return self.add(node, ins, node.out, node.attrs)
        if not split_ins:
            return self.add(node, ins, node.out, node.attrs)
        src_axis = self.split[split_ins[0]]
        src_shape = self.out[split_ins[0]].out.shape
        if node.op is OpKind.CROSS_ENTROPY and isinstance(node.attrs, CrossEntropyAttrs):
            attrs = replace(node.attrs, vocab=node.attrs.vocab // self.tp, tp="vocab")
            v = self.add(node, ins, node.out, attrs)
            rows = self.out[ins[0]].out.numel // self.out[ins[0]].out.shape[-1]
            for what in ("max", "target", "sum_exp"):  # Megatron's vocab-parallel loss
                stat = TensorSpec((rows,), DType.FP32)
                self.out.add(
                    OpKind.ALL_REDUCE,
                    [v],
                    stat,
                    CollectiveAttrs("tp", self.tp, stat.nbytes),
                    scope=node.scope,
                    name=f"{node.name}.{what}_all_reduce",
                )
            return v
        if node.op is OpKind.ATTENTION and isinstance(node.attrs, AttentionAttrs):
            a = node.attrs
            if a.heads % self.tp or a.kv_heads % self.tp:
                raise LayoutError(
                    f"tp={self.tp} does not divide attention heads {a.heads} / kv_heads {a.kv_heads} at {node.scope}"
                )
            attrs = replace(a, heads=a.heads // self.tp, kv_heads=a.kv_heads // self.tp)
            axis = len(node.out.shape) - 3
            v = self.add(node, ins, self.div(node.out, axis, f"heads at {node.scope}"), attrs)
            self.split[v] = axis
            return v
        if node.op is OpKind.VIEW:
            axis = _split_axis_after_view(self.src[node.inputs[0]].out.shape, src_axis, node.out.shape)
        else:
            axis = src_axis + len(node.out.shape) - len(src_shape)
            axis = min(max(axis, 0), len(node.out.shape) - 1)
        v = self.add(node, ins, self.div(node.out, axis, f"axis {axis} of {node.name} at {node.scope}"), node.attrs)
        self.split[v] = axis
        return v

    def _matmul(self, node: Node, ins: list[int]) -> int:
        attrs = node.attrs
        assert isinstance(attrs, MatmulAttrs)
        style = style_for(node.scope, self.plan)
        weight_split = (
            len(ins) > 1 and self.out[ins[1]].op is OpKind.PARAMETER and self.out[ins[1]].attrs != ParamAttrs()
        )
        if style in ("colwise", "vocab") and weight_split:
            new = replace(attrs, n=attrs.n // self.tp, tp=style)
            v = self.add(node, ins, self.div(node.out, len(node.out.shape) - 1, f"{node.scope} output"), new)
            self.split[v] = len(node.out.shape) - 1
            return v
        if style == "rowwise" and weight_split:
            if ins[0] not in self.split:
                raise LayoutError(f"row-parallel {node.scope} reads an unsplit input: check the TP plan")
            new = replace(attrs, k=attrs.k // self.tp, tp="rowwise")
            v = self.add(node, ins, node.out, new)
            return self.all_reduce(v, node, f"{node.name}.tp_all_reduce")
        if any(i in self.split for i in ins):  # batched matmul inside a split region (heads)
            a = ins[0] if ins[0] in self.split else ins[1]
            axis = self.split[a]
            shape = self.out[a].out.shape
            if axis < len(shape) - 2:
                new = replace(attrs, batch=attrs.batch // self.tp)
                v = self.add(node, ins, self.div(node.out, axis, f"{node.scope} batch"), new)
                self.split[v] = axis
                return v
            raise LayoutError(f"matmul at {node.scope} contracts a tensor-parallel split axis without a plan entry")
        return self.add(node, ins, node.out, attrs)
