"""Megatron tensor (and sequence) parallelism driven by a module-path plan.

A plan maps ``fnmatch`` patterns on module scopes to a style, in the manner of
PyTorch's ``parallelize_module``: ``colwise`` (split the output features),
``rowwise`` (split the input features; an all_reduce follows), ``vocab`` (a
vocabulary-parallel embedding, output layer or loss). Sharding then propagates
through the ops between a column- and a row-parallel layer (attention heads,
activations, views), dividing exactly one axis of every tensor it reaches.

With ``sequence_parallel`` (Korthikanti et al. 2022, arXiv:2205.05198) the ops
outside the tensor-parallel regions (norms, dropout, residual adds, the router of
an MoE layer) also run on ``1/tp`` of the tokens: every all_reduce after a
row-parallel layer or the vocabulary-parallel embedding becomes a reduce_scatter
along the sequence, and the input of a column-parallel layer is all-gathered first.
Grouped expert weights ``[experts, in, out]`` follow the same column/row styles, unless the
experts have their own tensor-parallel degree ``expert_tp`` of 1 (Megatron's
``--expert-tensor-parallel-size 1``, the "MoE Parallel Folding" of megatron/core/transformer/moe/
README.md, Megatron-LM commit 022bcb5): then every rank holds its experts whole and runs them on
its own sequence-parallel share of the tokens, with no all_gather before the experts and no
reduce_scatter after them; expert parallelism then spans the tensor-parallel ranks too.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import ClassVar

from echosim.ir.graph import Graph, Node
from echosim.ir.ops import (
    AttentionAttrs,
    Axis,
    CollectiveAttrs,
    CrossEntropyAttrs,
    EmbeddingAttrs,
    MatmulAttrs,
    OpKind,
    ParamAttrs,
    ViewAttrs,
)
from echosim.ir.types import DType, TensorSpec
from echosim.passes.base import LayoutError

# The plan for the zoo's module names and the HF / Megatron conventions: first match wins, so a specific
# pattern goes before a general one (BERT's ``intermediate.dense`` is its MLP's up-projection, every other
# ``*.dense`` an output projection). The module names, by library: HF Llama / Mistral / Qwen / OPT / BART
# (``q_proj`` ... ``out_proj``, ``fc1``, ``fc2``), GPT-2 (``c_attn``, ``c_fc``, ``c_proj``), GPT-NeoX, Falcon
# and BLOOM (``query_key_value``, ``dense``, ``dense_h_to_4h``, ``dense_4h_to_h``), GPT-J (``fc_in``,
# ``fc_out``), BERT (``query``, ``key``, ``value``, ``intermediate.dense``, ``output.dense``), Megatron-Core
# (``linear_qkv``, ``linear_proj``, ``linear_fc1``, ``linear_fc2``), Meta's Llama reference and torchtitan
# (``wq``, ``wk``, ``wv``, ``wo``, ``w1``, ``w3``, ``w2``: torchtitan's own TP plan splits them the same way).
DEFAULT_TP_PLAN: tuple[tuple[str, str], ...] = (
    ("*.qkv", "colwise"),
    ("*.linear_qkv", "colwise"),
    ("*.wq", "colwise"),
    ("*.wk", "colwise"),
    ("*.wv", "colwise"),
    ("*.query", "colwise"),
    ("*.key", "colwise"),
    ("*.value", "colwise"),
    ("*.q_proj", "colwise"),
    ("*.k_proj", "colwise"),
    ("*.v_proj", "colwise"),
    ("*.q_b_proj", "colwise"),  # DeepSeek MLA: the per-head up-projections split by heads
    ("*.kv_b_proj", "colwise"),
    ("*.query_key_value", "colwise"),
    # Fused projections (Phi-3's qkv_proj and gate_up_proj): split as Megatron lays them out, per
    # head group ([q heads, k, v] of each group together) and per gate/up half, so every rank holds
    # heads/tp queries with their kv_heads/tp keys and values, and ffn/tp of both halves; the
    # slices and chunks after them then take 1/tp of each part.
    ("*.qkv_proj", "colwise"),
    ("*.Wqkv", "colwise"),  # MPT
    ("*.gate_up_proj", "colwise"),
    # Mamba-2's mixer (Megatron-Core's MambaMixer: in_proj column-parallel, out_proj row-parallel, so each rank
    # holds heads/tp heads and groups/tp groups of B and C) and the gated-delta-rule layers (Megatron-Core's
    # GatedDeltaNet: the same, by key head): the fused input projections split per part, as the fused QKV does;
    # Mamba-1's dt_proj widens the time step back to the split channels
    ("*.mixer.in_proj", "colwise"),
    ("*.mamba.in_proj", "colwise"),
    ("*.mixer.dt_proj", "colwise"),
    ("*.mamba.dt_proj", "colwise"),
    ("*.linear_attn.in_proj_*", "colwise"),
    ("*.self_attn.output_gate", "colwise"),  # MiniMax's lightning attention: a sigmoid gate on each head's output
    ("*.c_attn", "colwise"),
    ("*.fc1", "colwise"),
    ("*.c_fc", "colwise"),
    ("*.gate_proj", "colwise"),
    ("*.up_proj", "colwise"),
    ("*.dense_h_to_4h", "colwise"),
    ("*.fc_in", "colwise"),
    ("*.linear_fc1", "colwise"),
    ("*.w1", "colwise"),
    ("*.w3", "colwise"),
    ("*.experts.mlp.v1", "colwise"),  # DBRX's experts: w1 (gate) and v1 (up), then w2 (down)
    ("*.intermediate.dense", "colwise"),
    ("*.attn.proj", "rowwise"),
    ("layers.*.proj", "rowwise"),  # the zoo's encoder layers (BERT, ViT): their attention's output
    ("*.o_proj", "rowwise"),
    ("*attn.out_proj", "rowwise"),
    ("*.mixer.out_proj", "rowwise"),
    ("*.mamba.out_proj", "rowwise"),
    ("*attention.out_proj", "rowwise"),
    ("*.linear_proj", "rowwise"),
    ("*.wo", "rowwise"),
    ("*.dense", "rowwise"),
    ("*.c_proj", "rowwise"),
    ("*.fc2", "rowwise"),
    ("*.down_proj", "rowwise"),
    ("*.dense_4h_to_h", "rowwise"),
    ("*.fc_out", "rowwise"),
    ("*.linear_fc2", "rowwise"),
    ("*.w2", "rowwise"),
    ("embed", "vocab"),
    ("*embed_tokens", "vocab"),
    ("*.wte", "vocab"),
    ("lm_head", "vocab"),
    ("*.word_embeddings", "vocab"),  # BERT, RoBERTa and their kin: the embedding, and the MLM head's decoder
    ("*lm_head.decoder", "vocab"),
    ("*.predictions.decoder", "vocab"),
)


def style_for(scope: str, plan: tuple[tuple[str, str], ...]) -> str:
    for pattern, style in plan:
        if fnmatch.fnmatchcase(scope, pattern):
            return style
    return ""


def linear_styles(graph: Graph, plan: tuple[tuple[str, str], ...]) -> dict[int, str]:
    """The style of each matmul and embedding of ``graph`` that ``plan`` matches, by node id.

    Megatron's layers alternate: a column-parallel linear splits its output features, and the linear that reads
    them (through attention, activations, views: the values between are split) is row-parallel. So a row-parallel
    rule holds only for a linear a column-parallel one feeds: BERT's LM-head transform and pooler are ``*.dense``
    layers, as its output projections are, but they read the whole hidden state, and Megatron keeps them whole.
    And a linear that reads split features is row-parallel whatever its name: RWKV's ``feed_forward.value`` (4h
    to h) matches BERT's column-parallel ``*.value``, and its ``attention.output`` matches no rule.
    """
    styles: dict[int, str] = {}
    split: set[int] = set()  # values a column-parallel linear's output reaches without crossing another linear
    for n in graph:
        if n.op is OpKind.EMBEDDING:
            if style := style_for(n.scope, plan):
                styles[n.id] = style
            continue
        linear = (
            n.op is OpKind.MATMUL
            and len(n.inputs) > 1
            and graph[n.inputs[1]].op is OpKind.PARAMETER
            and not (isinstance(n.attrs, MatmulAttrs) and n.attrs.conv_io)  # a convolution passes the split on
        )
        if not linear:
            if n.op is OpKind.MATMUL and (style := style_for(n.scope, plan)):
                styles[n.id] = style
            if any(i in split for i in n.inputs):
                split.add(n.id)
            continue
        weight = graph[n.inputs[1]]
        style = style_for(n.scope, plan)
        if not style and len(weight.out.shape) == 3:
            # transformers' fused experts: one module holds both grouped weights, so the weight's name says which
            # (``experts.gate_up_proj`` column-, ``experts.down_proj`` row-parallel, as the dense MLP's)
            style = style_for(weight.name, plan)
        if n.inputs[0] in split and len(weight.out.shape) == 2:
            style = "rowwise"
        elif style == "rowwise" and n.inputs[0] not in split:
            continue
        if style:
            styles[n.id] = style
        if style == "colwise":
            split.add(n.id)
    for nid in vocabulary_layers(graph):
        styles.setdefault(nid, "vocab")
    return styles


def vocabulary_layers(graph: Graph) -> set[int]:
    """The token embedding and output layer of a language model whatever their names (``tok_embeddings`` and
    ``output`` in Meta's Llama and torchtitan, GPT-NeoX's ``embed_in`` / ``embed_out``, a hand-written ``head``):
    the linear whose logits the cross-entropy reads (through views and elementwise ops: a cast, Gemma's soft cap)
    with the loss's vocabulary as its output features, and the embeddings with as many rows; neither where no
    embedding has that many rows (a classifier's head). Megatron splits both over the tensor-parallel ranks (a
    vocabulary-parallel embedding, output layer and loss)."""
    found: set[int] = set()
    vocabs: set[int] = set()
    for loss in graph:
        if loss.op is not OpKind.CROSS_ENTROPY or not isinstance(loss.attrs, CrossEntropyAttrs) or not loss.inputs:
            continue
        node = graph[loss.inputs[0]]
        while node.op in (OpKind.VIEW, OpKind.ELEMENTWISE) and node.inputs:
            node = graph[node.inputs[0]]
        weight = graph[node.inputs[1]] if node.op is OpKind.MATMUL and len(node.inputs) > 1 else None
        linear = weight is not None and weight.op is OpKind.PARAMETER and len(weight.out.shape) == 2
        attrs = node.attrs
        if linear and isinstance(attrs, MatmulAttrs) and attrs.n == loss.attrs.vocab and not attrs.conv_io:
            found.add(node.id)
            vocabs.add(loss.attrs.vocab)
    tables = {n.id for n in graph if isinstance(n.attrs, EmbeddingAttrs) and n.attrs.vocab in vocabs}
    if not tables:  # an image classifier's head (no token embedding of its classes): no vocabulary to split
        return set()
    return found | tables


#: The name of the all_gather that brings a module run whole under SP its tokens (scoped to that module).
WHOLE_GATHER = "sp_whole_gather"


def whole_layers_warning(graph: Graph, tp: int) -> list[str]:
    """What the report says of the layers sequence parallelism ran whole (found only while the pass splits the
    graph: a product in them sums over the tokens), linears the plan splits included."""
    layers = sorted({n.scope for n in graph if n.op is OpKind.ALL_GATHER and n.name.endswith(f".{WHOLE_GATHER}")})
    if not layers:
        return []
    which = f"{', '.join(layers[:2])}{', ...' if len(layers) > 2 else ''}"
    return [
        f"--sp: {which} {'runs' if len(layers) == 1 else 'run'} whole on all {tp} tensor-parallel ranks on the "
        "gathered sequence, linears the plan splits included: a product in it sums over the tokens (a linear over "
        "the sequence axis), which a rank's share of them cannot compute"
    ]


def sequence_length(graph: Graph) -> int:
    """Tokens per sequence of a model fed token ids ``[batch, tokens]``; 0 for other inputs (images, features)."""
    for nid in graph.inputs:
        spec = graph[nid].out
        if spec.dtype in (DType.INT64, DType.INT32) and len(spec.shape) == 2:
            return spec.shape[-1]
    return 0


def _split_axis_after_view(
    src: tuple[int, ...],
    axis: int,
    dst: tuple[int, ...],
    inner: bool = False,
    degree: int = 1,
    attrs: object = None,
    tokens: int = 0,
) -> int:
    """Which axis of ``dst`` carries the split axis of ``src`` after a view or permute.

    ``attrs``: the view's; a permutation its :class:`ViewAttrs` records is followed exactly. ``tokens``: the
    sequence length, for ``inner``: of the axes covering the split one, the innermost that holds whole sequences
    (a multiple of it) is the token axis, so rows ``[tokens * top_k]`` of a MoE layer unflattened to ``[tokens,
    top_k]`` keep the split on the tokens, not on the expert choices.

    A split feature axis (heads x head_dim) is split on its outer part; a split token
    axis that a view unflattens again (``[b*s, h] -> [b, s, h]``) on its inner part,
    the sequence, so ``inner`` picks the innermost ``dst`` axis covering the split one.
    An outer part the split's ``degree`` does not divide passes the split on to the next
    part: a fused projection viewed as ``[3, heads, head_dim]`` (q, k and v, as BERT and
    ViT lay them out) splits its heads, which is how Megatron keeps them, per head.
    """
    if isinstance(attrs, ViewAttrs) and attrs.perm:
        return attrs.perm.index(axis)
    if sorted(src) == sorted(dst) and src != dst:  # a permutation no frontend recorded: follow the sizes
        return _permuted(src, dst)[axis]
    prefix = math.prod(src[:axis])
    if inner:
        end = prefix * src[axis]
        acc, found, whole = 1, -1, -1
        for i, d in enumerate(dst):
            if d != 1 and acc < end and acc * d > prefix:
                found = i
                whole = i if tokens and d % tokens == 0 else whole
            acc *= d
        if whole >= 0 or found >= 0:
            return whole if whole >= 0 else found
    acc = 1
    for i, d in enumerate(dst):
        if acc == prefix and d != 1 and (d % src[axis] == 0 or src[axis] % d == 0):
            if d % degree and d < src[axis] and i + 1 < len(dst):  # an outer factor the degree cannot split
                prefix, acc = prefix * d, acc * d
                src = (*src[:axis], src[axis] // d, *src[axis + 1 :])
                continue
            return i
        if d != 1 and acc < prefix < acc * d:  # the split axis was merged into this one
            return i
        acc *= d
    return len(dst) - 1


def _permuted(src: tuple[int, ...], dst: tuple[int, ...]) -> list[int]:
    """Where each axis of ``src`` goes in its permutation ``dst``, told apart by size: an axis whose size is the
    same in both places stays, the others take the free places of their size in order. A transpose of two axes
    is so found even where a third axis has one of their sizes (``[b, T, h, d] -> [b, h, T, d]`` with ``d == h``:
    sizes alone would not say which of ``h`` and ``d`` moved)."""
    where = [i if s == d else -1 for i, (s, d) in enumerate(zip(src, dst, strict=True))]
    free = [i for i, w in enumerate(where) if w < 0]
    for i in free:
        where[i] = next(j for j in free if dst[j] == src[i] and j not in where)
    return where


def _slices_axis(src: tuple[int, ...], axis: int, dst: tuple[int, ...]) -> bool:
    """Whether a view of ``src`` as ``dst`` keeps only part of ``src``'s ``axis`` (a slice or a select along it; a
    slice of another axis, as MLA's split of its down-projection into latent and rope parts, keeps it whole)."""
    if math.prod(src) == math.prod(dst):
        return False
    if len(src) == len(dst):
        return src[axis] != dst[axis]
    return src[axis] not in dst


def _reduction_keeps(src: tuple[int, ...], axis: int, dst: tuple[int, ...]) -> int | None:
    """Where a reduction of ``src`` to ``dst`` keeps ``src``'s ``axis``; None where it reduces it away; -1 where the
    shapes cannot tell (equal sizes: the IR keeps no reduced dims).

    With the rank kept (keepdim), a reduced axis has size 1. Otherwise ``dst`` is ``src`` with the reduced axes
    dropped: matched from the left and from the right, the two embeddings must agree on ``axis``."""
    if len(dst) == len(src):
        return axis if dst[axis] == src[axis] or src[axis] == 1 else None

    def embed(order: range) -> tuple[bool, int | None]:
        """Match ``dst``'s axes to ``src``'s in ``order``: whether all matched, and where ``axis`` went."""
        targets = range(len(dst)) if order.step > 0 else range(len(dst) - 1, -1, -1)
        j, found = 0, None
        for i in order:
            if j < len(targets) and dst[targets[j]] == src[i]:
                found = targets[j] if i == axis else found
                j += 1
        return j == len(dst), found

    left, right = embed(range(len(src))), embed(range(len(src) - 1, -1, -1))
    return left[1] if left[0] and right[0] and left[1] == right[1] else -1


@dataclass(frozen=True)
class TensorParallel:
    """Shard the forward graph ``tp`` ways and insert Megatron's collectives."""

    tp: int
    plan: tuple[tuple[str, str], ...] = DEFAULT_TP_PLAN
    sequence_parallel: bool = False
    expert_tp: int = 0  # tensor-parallel degree of grouped expert weights: tp (0) or 1 (experts whole)
    name: ClassVar[str] = "tensor-parallel"

    def __post_init__(self) -> None:
        if self.expert_tp not in (0, 1, self.tp):
            raise LayoutError(f"expert tensor parallelism {self.expert_tp}: 1 or tp={self.tp} (0: tp)")

    def run(self, graph: Graph) -> Graph:
        if self.tp == 1:
            return graph
        experts_whole = self.expert_tp == 1
        styles = linear_styles(graph, self.plan)
        # under SP, a layer whose products sum over the tokens can still run whole on the gathered sequence
        return split_retrying(
            lambda whole: _Sharder(graph, self.tp, styles, self.sequence_parallel, experts_whole, whole).run(),
            retry=self.sequence_parallel,
        )


class Unsplittable(LayoutError):
    """A product (or kernel) a split cannot pass through, in module ``scope``: the module can be split another
    way (run whole under SP, head-parallel under CP)."""

    def __init__(self, message: str, scope: str) -> None:
        super().__init__(message)
        self.scope = scope


def split_retrying(split: Callable[[set[str]], Graph], retry: bool = True) -> Graph:
    """``split(modules)`` with the modules split the other way, added one by one as :class:`Unsplittable` names
    them; one named twice (or none, or ``retry`` off) is the layout's error."""
    modules: set[str] = set()
    while True:
        try:
            return split(modules)
        except Unsplittable as exc:
            if not retry or not exc.scope or exc.scope in modules:
                raise LayoutError(str(exc)) from None
            modules.add(exc.scope)


def module_of(graph: Graph, node: Node) -> str:
    """The module a product belongs to for such a split: its scope, or for a linear or convolution module's
    product (its weight in the same scope) the layer that module is in."""
    weight = graph[node.inputs[1]] if len(node.inputs) > 1 else None
    if weight is not None and weight.op is OpKind.PARAMETER and weight.scope == node.scope:
        return node.scope.rpartition(".")[0]
    return node.scope


def under(scope: str, modules: tuple[str, ...]) -> str:
    """The module of ``modules`` that ``scope`` lies in; ``""`` for none."""
    return next((m for m in modules if scope == m or scope.startswith(m + ".")), "")


def _token_axis(spec: TensorSpec) -> int:
    """The token (sequence) axis of an activation ``[..., tokens, features]``."""
    return max(0, len(spec.shape) - 2)


class _Sharder:
    def __init__(
        self,
        graph: Graph,
        tp: int,
        styles: dict[int, str],
        sp: bool,
        experts_whole: bool = False,
        whole: set[str] | None = None,
    ) -> None:
        self.src = graph
        self.tp = tp
        self.sp = sp
        self.experts_whole = experts_whole  # grouped expert weights stay whole (expert tensor parallelism 1)
        self.whole_experts: set[int] = set()  # source ids of those weights
        self.out = Graph(graph.name, graph.repeats, graph.block_layers)
        self.map: dict[int, int] = {}
        self.split: dict[int, int] = {}  # new value id -> split axis
        self.seq: set[int] = set()  # values split along tokens (sequence parallelism), a subset of split
        self.split_params: set[int] = set()
        self.gathered: dict[int, int] = {}  # sequence-split value -> its all_gather
        self.uneven: set[int] = set()  # values split along a vocabulary tp may not divide (GPT-2's 50,257)
        # values whose split a view passed to an inner factor of the axis, as tp did not divide the outer one: what
        # that was, for the error where a product then sums over the split (Mamba-2's groups of B and C)
        self.inner: dict[int, str] = {}
        self.whole = tuple(sorted(whole or ()))  # modules run whole on gathered tokens (SP), their inputs gathered
        self.tokens = sequence_length(graph)
        self.styles = {i: s for i, s in styles.items() if not under(graph[i].scope, self.whole)}  # node id -> style

    def div(self, spec: TensorSpec, axis: int, what: str, uneven: bool = False) -> TensorSpec:
        """``spec`` with ``axis`` split ``tp`` ways; ``uneven``: a vocabulary, which the busiest rank holds
        ``ceil(size / tp)`` rows of (torch.chunk's split; Megatron pads it to a multiple of 128 x tp)."""
        shape = list(spec.shape)
        if shape[axis] % self.tp and not uneven:
            raise LayoutError(f"tp={self.tp} does not divide {what} (size {shape[axis]})")
        shape[axis] = -(-shape[axis] // self.tp)
        return spec.with_shape(tuple(shape))

    def add(self, node: Node, inputs: list[int], out: TensorSpec, attrs: object) -> int:
        if isinstance(attrs, CollectiveAttrs) and attrs.axis is not Axis.TP:  # another axis' collective: local bytes
            attrs = replace(attrs, bytes=out.nbytes * attrs.bytes // max(1, node.out.nbytes))
        return self.out.add(
            node.op,
            inputs,
            out,
            attrs,  # type: ignore[arg-type]
            phase=node.phase,
            scope=node.scope,
            name=node.name,
        )

    def all_reduce(self, value: int, node: Node, name: str) -> int:
        """Megatron's g after a row-parallel layer; a reduce_scatter over tokens with SP."""
        spec = self.out[value].out
        if self.sp:
            axis = _token_axis(spec)
            out = self.div(spec, axis, f"the sequence ({spec.shape[axis]} tokens) at {node.scope}")
            attrs = CollectiveAttrs(Axis.TP, self.tp, spec.nbytes)
            v = self.out.add(
                OpKind.REDUCE_SCATTER, [value], out, attrs, scope=node.scope, name=name.replace("all_reduce", "rs")
            )
            self.split[v] = axis
            self.seq.add(v)
            return v
        attrs = CollectiveAttrs(Axis.TP, self.tp, spec.nbytes)
        return self.out.add(OpKind.ALL_REDUCE, [value], spec, attrs, scope=node.scope, name=name)

    def gather(self, value: int, node: Node, whole: str = "") -> int:
        """Megatron's g-bar with SP: all_gather the token-split input of a column-parallel layer (``whole``: of
        that module, run whole; the gather is then named for it, and the report names the module)."""
        if value not in self.gathered:
            src = self.out[value]
            axis = self.split[value]
            full = list(src.out.shape)
            full[axis] *= self.tp
            spec = src.out.with_shape(tuple(full))
            self.gathered[value] = self.out.add(
                OpKind.ALL_GATHER,
                [value],
                spec,
                CollectiveAttrs(Axis.TP, self.tp, spec.nbytes),
                scope=whole or node.scope,
                name=f"{node.name}.{WHOLE_GATHER if whole else 'sp_all_gather'}",
            )
        return self.gathered[value]

    def run(self) -> Graph:
        params_style = self._param_styles()
        for node in self.src:
            ins = [self.map[i] for i in node.inputs]
            self.map[node.id] = self._node(node, ins, params_style)
        self.out.outputs = [self.map[o] for o in self.src.outputs]
        self.out.inputs = [self.map[i] for i in self.src.inputs]
        return self.out

    def _whole(self, node: Node, ins: list[int], module: str) -> int:
        """A node of a module run whole: sequence-split inputs are gathered, and every rank computes it."""
        ins = [self.gather(i, node, module) if i in self.seq else i for i in ins]
        if any(i in self.split for i in ins):
            raise LayoutError(f"{node.name} at {node.scope} reads split features in a layer no rule splits")
        attrs = node.attrs
        if isinstance(attrs, MatmulAttrs):
            attrs = replace(attrs, useful=attrs.useful / self.tp)
        return self.add(node, ins, node.out, attrs)

    def _param_styles(self) -> dict[int, tuple[str, int]]:
        """Decide for each parameter how it is split: (style, axis)."""
        styles: dict[int, tuple[str, int]] = {}
        for node in self.src:
            style = self.styles.get(node.id, "")
            if (
                self.sp
                and not style
                and isinstance(node.attrs, MatmulAttrs)
                and node.attrs.grouped
                and self.src[node.inputs[1]].op is OpKind.PARAMETER
            ):
                # experts no rule splits (transformers' fused experts): with SP each rank runs its own tokens
                # through them whole, as Megatron's expert tensor parallelism 1 does
                self.whole_experts.add(node.inputs[1])
            if node.op is OpKind.MATMUL and style and len(node.inputs) >= 2:
                w = self.src[node.inputs[1]]
                if w.op is OpKind.PARAMETER:
                    if len(w.out.shape) == 3 and self.experts_whole:
                        self.whole_experts.add(w.id)
                        continue
                    if len(w.out.shape) == 3:  # grouped expert weight [experts, in, out] (transformers': out, in)
                        a = node.attrs
                        out_in = isinstance(a, MatmulAttrs) and a.n != a.k and w.out.shape[1:] == (a.n, a.k)
                        axis = (1 if out_in else 2) if style in ("colwise", "vocab") else (2 if out_in else 1)
                    else:  # nn.Linear weight [out, in]
                        axis = 0 if style in ("colwise", "vocab") else 1
                    styles[w.id] = (style, axis)
                    if len(node.inputs) > 2 and style != "rowwise":
                        styles[node.inputs[2]] = (style, 0)
            elif node.op is OpKind.EMBEDDING and style == "vocab":
                styles[node.inputs[1]] = ("vocab", 0)
        return styles

    def _node(self, node: Node, ins: list[int], params: dict[int, tuple[str, int]]) -> int:
        if self.whole and node.op is not OpKind.PARAMETER and (module := under(node.scope, self.whole)):
            return self._whole(node, ins, module)
        split_ins = [i for i in ins if i in self.split]
        if node.op is OpKind.PARAMETER:
            if node.id in params:
                style, axis = params[node.id]
                out = self.div(node.out, axis, f"{node.name} dim {axis}", uneven=style == "vocab")
                assert isinstance(node.attrs, ParamAttrs)
                attrs = replace(node.attrs, shard=node.attrs.shard * self.tp)
                v = self.out.add(node.op, [], out, attrs, scope=node.scope, name=node.name)
                self.split_params.add(v)
                return v
            if node.id in self.whole_experts and isinstance(node.attrs, ParamAttrs):
                # whole on every tensor-parallel rank: its gradient is reduced over the expert-data-parallel
                # ranks, which include the tensor-parallel ones
                return self.add(node, ins, node.out, replace(node.attrs, expert=True))
            return self.add(node, ins, node.out, node.attrs)
        if node.op is OpKind.MATMUL and isinstance(node.attrs, MatmulAttrs):
            return self._matmul(node, ins)
        if node.op is OpKind.EMBEDDING and isinstance(node.attrs, EmbeddingAttrs):
            if self.out[ins[1]].out.shape[0] != node.attrs.vocab:  # weight was split
                attrs = replace(node.attrs, vocab=-(-node.attrs.vocab // self.tp), tp="vocab")
                v = self.add(node, ins, node.out, attrs)
                return self.all_reduce(v, node, f"{node.name}.tp_all_reduce")
            return self.add(node, ins, node.out, node.attrs)
        if not split_ins:
            return self.add(node, ins, node.out, node.attrs)
        if any(i in self.seq for i in split_ins) and any(i not in self.seq for i in split_ins):
            # sequence-split tokens meet split features (RWKV's receptance, which no rule splits, gating its
            # split WKV): the tokens are gathered into the tensor-parallel region, as before a column-parallel layer
            ins = [self.gather(i, node) if i in self.seq else i for i in ins]
            split_ins = [i for i in ins if i in self.split]
        src_axis = self.split[split_ins[0]]
        src_shape = self.out[split_ins[0]].out.shape
        if node.op is OpKind.CROSS_ENTROPY and isinstance(node.attrs, CrossEntropyAttrs):
            attrs = replace(node.attrs, vocab=-(-node.attrs.vocab // self.tp), tp="vocab")
            v = self.add(node, ins, node.out, attrs)
            rows = self.out[ins[0]].out.numel // self.out[ins[0]].out.shape[-1]
            for what in ("max", "target", "sum_exp"):  # Megatron's vocab-parallel loss
                stat = TensorSpec((rows,), DType.FP32)
                self.out.add(
                    OpKind.ALL_REDUCE,
                    [v],
                    stat,
                    CollectiveAttrs(Axis.TP, self.tp, stat.nbytes),
                    scope=node.scope,
                    name=f"{node.name}.{what}_all_reduce",
                )
            return v
        if node.op is OpKind.ATTENTION and any(i in self.seq for i in ins):
            # q, k and v from projections no rule splits, on sequence-parallel tokens: attention reads every
            # token, so they are gathered and it runs whole (named by the report's unsplit-linears warning)
            ins = [self.gather(i, node) if i in self.seq else i for i in ins]
            if not any(i in self.split for i in ins):
                return self.add(node, ins, node.out, node.attrs)
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
        seq = split_ins[0] in self.seq
        if node.op is OpKind.REDUCTION:
            whole = self.src[node.inputs[ins.index(split_ins[0])]].out.shape
            kept = _reduction_keeps(whole, src_axis, node.out.shape)
            if kept is None:
                # over the split axis (a norm over split features, a mean over sequence-split tokens): each rank
                # reduces its part, and an all_reduce completes it, as Megatron's vocab-parallel loss does its max
                v = self.add(node, ins, node.out, node.attrs)
                return self.out.add(
                    OpKind.ALL_REDUCE,
                    [v],
                    node.out,
                    CollectiveAttrs(Axis.TP, self.tp, node.out.nbytes),
                    phase=node.phase,
                    scope=node.scope,
                    name=f"{node.name}.tp_all_reduce",
                )
            if kept >= 0:
                v = self.add(
                    node, ins, self.div(node.out, kept, f"axis {kept} of {node.name} at {node.scope}"), node.attrs
                )
                self.split[v] = kept
                if seq:
                    self.seq.add(v)
                return v
        if (
            seq
            and node.op is OpKind.VIEW
            and _slices_axis(self.src[node.inputs[0]].out.shape, src_axis, node.out.shape)
        ):
            # a slice of the tokens (BERT's masked positions, a class token): gather the sequence first, as Megatron's
            # gather_from_sequence_parallel_region does before a head that reads whole sequences
            ins = [self.gather(i, node) if i in self.seq else i for i in ins]
            return self.add(node, ins, node.out, node.attrs)
        inner = next((self.inner[i] for i in split_ins if i in self.inner), "")
        if node.op is OpKind.VIEW:
            before = self.src[node.inputs[0]].out.shape
            axis = _split_axis_after_view(before, src_axis, node.out.shape, seq, self.tp, node.attrs, self.tokens)
            outer, after = math.prod(before[:src_axis]), node.out.shape
            if not seq and sorted(before) != sorted(after) and math.prod(after[:axis]) > outer:  # passed inward
                at = (d for i, d in enumerate(after) if d != 1 and math.prod(after[:i]) == outer)
                if (found := next(at, 0)) and found % self.tp:
                    inner = f"axis of size {found} of {node.name} at {node.scope}"
        else:
            axis = src_axis + len(node.out.shape) - len(src_shape)
            axis = min(max(axis, 0), len(node.out.shape) - 1)
        what = (
            f"the sequence ({node.out.shape[axis]} tokens) at {node.scope or node.name}"
            if seq
            else f"axis {axis} of {node.name} at {node.scope}"
        )
        uneven = split_ins[0] in self.uneven and axis == len(node.out.shape) - 1
        v = self.add(node, ins, self.div(node.out, axis, what, uneven), node.attrs)
        self.split[v] = axis
        if seq:
            self.seq.add(v)
        if uneven:
            self.uneven.add(v)
        if inner:
            self.inner[v] = inner
        return v

    def _matmul(self, node: Node, ins: list[int]) -> int:
        attrs = node.attrs
        assert isinstance(attrs, MatmulAttrs)
        style = self.styles.get(node.id, "")
        weight_split = len(ins) > 1 and ins[1] in self.split_params
        if style in ("colwise", "vocab") and weight_split:
            if ins[0] in self.seq:  # sequence parallel: gather the tokens first
                ins = [self.gather(ins[0], node), *ins[1:]]
            vocab = style == "vocab"
            new = replace(attrs, n=-(-attrs.n // self.tp) if vocab else attrs.n // self.tp, tp=style)
            v = self.add(node, ins, self.div(node.out, len(node.out.shape) - 1, f"{node.scope} output", vocab), new)
            self.split[v] = len(node.out.shape) - 1
            if vocab:
                self.uneven.add(v)
            return v
        if style == "rowwise" and weight_split:
            if ins[0] not in self.split or ins[0] in self.seq:
                raise LayoutError(f"row-parallel {node.scope} reads an unsplit input: check the TP plan")
            new = replace(attrs, k=attrs.k // self.tp, tp="rowwise")
            v = self.add(node, ins, node.out, new)
            return self.all_reduce(v, node, f"{node.name}.tp_all_reduce")
        if ins[0] in self.seq and len(node.inputs) > 1 and node.inputs[1] in self.whole_experts:
            # whole experts on this rank's sequence-parallel rows (expert tensor parallelism 1): rows stay split
            axis = self.split[ins[0]]
            out = self.div(node.out, axis, f"the expert rows at {node.scope}")
            rows = math.prod(out.shape[:-1])
            v = self.add(node, ins, out, replace(attrs, m=-(-rows // max(1, attrs.batch))))
            self.split[v] = axis
            self.seq.add(v)
            return v
        if ins[0] in self.seq and len(self.out[ins[1]].out.shape) == 2:
            # a replicated linear on token-split rows (the MoE router under SP): rows stay split
            axis = self.split[ins[0]]
            if axis == len(self.out[ins[0]].out.shape) - 1:
                raise Unsplittable(
                    f"matmul at {node.scope} contracts the sequence-parallel axis", module_of(self.src, node)
                )
            new = replace(attrs, m=attrs.m // self.tp)
            v = self.add(node, ins, self.div(node.out, axis, f"the sequence at {node.scope}"), new)
            self.split[v] = axis
            self.seq.add(v)
            return v
        if any(i in self.split for i in ins):  # batched matmul inside a split region (heads)
            a = ins[0] if ins[0] in self.split else ins[1]
            axis = self.split[a]
            shape = self.out[a].out.shape
            grouped_conv = attrs.conv_io and a == ins[0] and axis == 1 and attrs.batch % self.tp == 0
            if grouped_conv:  # a depthwise (grouped) convolution on split channels: each rank has its groups
                new = replace(attrs, batch=attrs.batch // self.tp, conv_io=attrs.conv_io // self.tp)
                v = self.add(node, ins, self.div(node.out, 1, f"the channels of {node.scope}"), new)
                self.split[v] = 1
                return v
            if axis < len(shape) - 2:
                new = replace(attrs, batch=attrs.batch // self.tp)
                v = self.add(node, ins, self.div(node.out, axis, f"{node.scope} batch"), new)
                self.split[v] = axis
                return v
            if any(i in self.seq for i in ins) and all(i in self.seq for i in ins if i in self.split):
                # a product over sequence-parallel tokens in a layer no rule splits (a causal conv1d over the
                # sequence, as Mamba's and the linear attentions' short convolutions): gather them, run it whole
                ins = [self.gather(i, node) if i in self.seq else i for i in ins]
                return self.add(node, ins, node.out, replace(attrs, useful=attrs.useful / self.tp))
            inner = next((self.inner[i] for i in ins if i in self.inner), "")
            if inner:  # the split went inside an axis tp does not divide: no plan entry can help
                raise LayoutError(
                    f"tp={self.tp} does not divide the {inner}, which {node.name} needs whole on each rank "
                    "(Mamba-2's groups of B and C, attention's heads: use a tp that divides them)"
                )
            message = (
                f"matmul {node.name} at {node.scope} sums over an axis tensor parallelism splits: no rule of the plan "
                f"splits its layer, or tp={self.tp} (with cp) does not divide the heads (or groups) it runs on"
            )
            if not any(i in self.seq for i in ins if i in self.split):
                # split on channels (heads, groups of B and C), as without sequence parallelism, where the layout is
                # refused (Megatron-Core asserts ngroups % tp == 0): running the layer whole is no remedy for that
                raise LayoutError(message)
            raise Unsplittable(message, module_of(self.src, node))
        # every tensor-parallel rank computes this product whole (a router, a linear no rule matches): one rank's
        # copy is the model's work, the others count as hardware FLOPs only (MFU's numerator takes it once)
        return self.add(node, ins, node.out, replace(attrs, useful=attrs.useful / self.tp))
