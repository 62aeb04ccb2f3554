"""Context parallelism: every rank holds ``1/cp`` of each sequence, attention sees all of it.

Every activation with a sequence axis is divided ``cp`` ways, following the axis from
the per-sample inputs through views, matmuls and elementwise ops (weights and
position tables are static and stay whole). Each attention becomes one of the two
schemes Megatron-Core runs through Transformer Engine:

* ``p2p`` (ring attention): ``cp`` steps; at step ``j`` the rank attends its queries to
  the K/V chunk it holds while a ring exchange (send to the next rank, receive from
  the previous) brings chunk ``j + 1``, so the transfer hides behind the partial
  attention. The partial outputs are merged with their softmax statistics. Model
  FLOPs are the same as without context parallelism.
* ``all_gather``: K/V are all-gathered before a local attention (Llama 3's scheme);
  backward reduce-scatters dK/dV. With load balancing each of the rank's two chunks
  attends only to the keys before it (within a sliding window, if the layer has one).
* ``a2a`` (DeepSpeed-Ulysses; Transformer Engine's QKVO all-to-all, TE pull request 1160):
  inside the attention call an all_to_all each gives Q, K and V every token of ``1/cp``
  of the heads, the attention runs over the whole sequence, and one more brings its
  output back to the rank's tokens. Everything else (projections, rotary embedding)
  runs on the rank's tokens.
* ``a2a+p2p`` (hierarchical; Megatron-Core's ``--hierarchical-context-parallel-sizes A P``, Transformer Engine's
  ``AttnFuncWithCPAndKVP2P`` with a list of two groups): an all_to_all inside each group of ``a2a`` neighbouring
  CP ranks gives Q, K and V the group's tokens of ``1/a2a`` of the heads, the ring runs over the ``cp / a2a``
  ranks the groups leave apart on those heads and longer chunks, and a last all_to_all brings the output back.
  Megatron-Core builds the first level of its hierarchical groups from neighbouring ranks of each CP group
  (``create_hierarchical_groups``), so the all_to_alls stay on the fast links and the ring crosses nodes. With
  load balancing, the chunks of an all-to-all group are Transformer Engine's reordering of the ranks' two
  chunks each, so every ring rank again holds a balanced pair of ``2 * cp / a2a`` chunks.

Transformer Engine's ring (alone or under the all_to_alls) does not run sliding-window attention; ``all_gather``
and ``a2a`` do (Megatron-LM pull request 1160, issue 2222), so a window under ``p2p`` is
refused with those two named.

Causal load balancing (``balance``) cuts each sequence into ``2 * cp`` chunks and
gives rank ``r`` chunks ``r`` and ``2cp - 1 - r``, so every rank does the same share
of the causal work: the diagonal step is causal over the rank's own chunks and
every other ring step is exactly half a block (Transformer Engine skips the masked
half). Without it, rank ``cp - 1`` holds the last chunk and does the most work;
since the ring advances in lock step, that rank is the one simulated.

A layer whose products run along the sequence (Mamba-2's causal convolution and scan, the gated delta rule's)
cannot run on a share of the tokens: as Megatron-Core's "all-to-all" context parallelism for Mamba does
(``MambaContextParallel``, megatron/core/ssm/mamba_context_parallel.py, Megatron-LM commit d98e8a6), the
output of its input projection is exchanged by an all_to_all from ``1/cp`` of the tokens with every channel to
every token with ``1/cp`` of the channels (whole heads, and whole groups of B and C), the convolution and the scan
run on those heads over the whole sequence, and a second all_to_all brings the result back to the rank's tokens
before the output projection. Such a layer is found where a product would contract the sequence axis, a scan
kernel would read split tokens, or a product multiplies two token-split tensors (attention written out, which a
ring cannot split: BLOOM's ALiBi ``baddbmm``, a linear attention; DeepSpeed-Ulysses' scheme); its module (the
linears in it excepted) is then made head-parallel and the graph split again. Only what its input projections
produce trades tokens for heads; the residual stream that passes through the module stays on the rank's tokens.

``torch``: PyTorch's experimental ``context_parallel`` instead (torchtitan's CP; PyTorch
torch/distributed/tensor/experimental/_attention.py, ``_templated_ring_attention`` and its backward, as
of commit 1963fc8, 2024-12-23). It rings the K/V that reach ``scaled_dot_product_attention``, which
torchtitan's Llama has already expanded to the query heads (``repeat_kv`` before SDPA,
torchtitan/models/llama/model.py at 9dec370): the exchanged bytes grow by heads / kv_heads. Its default
rotater (``_cp_options.rotate_method = ALL_GATHER``; torchtitan's
``--experimental.context_parallel_rotate_method`` default ``allgather``) all-gathers every chunk once,
issued before the diagonal step and read from the next (``all_gather`` here); ``alltoall`` permutes one
chunk per step (``p2p`` here). Its backward all-gathers K/V again and sends the fp32 dK/dV accumulators
round the ring (``convert_to_f32``, a separate ALL_TO_ALL rotater): one permute per step, ``cp`` in all
(costed as one ``cp``-piece exchange after the last step's backward: eager PyTorch hides all but the last
behind the next step, so an eager run is an upper bound here; the cases rows all compile).
Each step's output merges into an fp32 accumulator (``_SDPAMerger``; bytes in
:func:`echosim.passes.flops.io_bytes`). Its later balanced steps are non-causal calls on half the
queries or half the keys; they are costed as the causal block of the same work, as for TE (priced
as the non-causal shapes, the torchtitan rows move 0.1-0.2 points faster).
``waited``: the block is compiled whole (torch.compile, fullgraph), and a functional collective traced by
it is waited on where it is issued (``_maybe_wrap_tensor`` returns ``wait_tensor(...)`` while tracing,
torch/distributed/_functional_collectives.py; Inductor's ``reorder_for_compute_comm_overlap`` is off by
default), so every exchange runs in line with the attention instead of beside it.

:class:`ContextParallelBackward` runs after autodiff: like Transformer Engine, the
backward keeps only the local K/V and brings the other chunks round again (the
ring in the other direction, one step ahead of the attention backward; a second
all_gather for the other scheme) instead of saving every chunk for backward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

from echosim.ir.graph import Graph, Node
from echosim.ir.ops import (
    AttentionAttrs,
    Axis,
    CollectiveAttrs,
    ElementwiseAttrs,
    MatmulAttrs,
    OpKind,
    Phase,
    ViewAttrs,
    band_pairs,
    causal_fraction,
)
from echosim.ir.types import TensorSpec
from echosim.passes.base import LayoutError
from echosim.passes.tensor_parallel import (
    Unsplittable,
    _reduction_keeps,
    _slices_axis,
    _split_axis_after_view,
    module_of,
    sequence_length,
    split_retrying,
    under,
)

COMMS = ("p2p", "all_gather", "a2a", "a2a+p2p")
#: The axes a context-parallel ring exchanges K/V on: the whole CP group, or hierarchical CP's outer tier
RING_AXES = (Axis.CP, Axis.CP_P2P)
#: The elementwise sequence kernels the frontends capture (``echosim.frontend.ssm_ops`` lowered by
#: ``aten_rules``): Mamba-1's selective scan, RWKV's WKV, Mamba-2's scan steps and the gated delta rule's. Each
#: runs along the tokens, so its layer is made head-parallel, never split by tokens as a pointwise op.
SEQUENCE_KERNELS = frozenset({"selective_scan", "wkv", "ssd_dt", "ssd_state_pass", "delta_rule_ut"})
#: The name of the all_to_all that brings a head-parallel layer its heads (the report names such layers by it).
TO_HEADS = "cp_to_heads"
#: Why ``a2a`` is refused under PyTorch's context parallelism.
NO_TORCH_A2A = (
    "--cp-comm a2a: PyTorch's context_parallel rotates K/V round the ranks (allgather or alltoall); it has no "
    "head-parallel (DeepSpeed-Ulysses) scheme"
)
#: PyTorch's merge of the ring's partial outputs, in fp32 (echosim.passes.flops.io_bytes)
MERGE_FP32 = "attn_merge_fp32"


def head_parallel_note(graph: Graph, cp: int) -> list[str]:
    """What the report says of the layers the pass made head-parallel (found only while splitting), if any."""
    scopes = sorted({n.scope for n in graph if n.op is OpKind.ALL_TO_ALL and n.name.endswith(f".{TO_HEADS}")})
    if not scopes:
        return []
    which = f"{', '.join(scopes[:2])}{', ...' if len(scopes) > 2 else ''}"
    one = len(scopes) == 1
    return [
        f"cp={cp}: {which} {'runs' if one else 'run'} head-parallel, as {'it runs' if one else 'they run'} along "
        f"the tokens (a scan, or attention written out): an all_to_all trades each rank's tokens for every token of "
        f"1/{cp} of the heads and back (Megatron-Core's Mamba context parallelism, DeepSpeed-Ulysses)"
    ]


def check_hierarchy(cp: int, a2a: int) -> None:
    """Hierarchical CP's two tiers: Megatron-LM asserts that their sizes multiply to cp; each has two ranks or
    more (one tier of one rank is plain ``a2a`` or ``p2p``)."""
    if not 1 < a2a < cp or cp % a2a:
        raise LayoutError(
            f"--cp-comm a2a+p2p: the all-to-all groups ({a2a or 'none'} ranks) must divide cp={cp} into two tiers of "
            "2 ranks or more (Megatron's --hierarchical-context-parallel-sizes A P, A x P = cp)"
        )


def check_sequence(cp: int, seq_len: int, balance: bool = True) -> None:
    """The layout rule, named the way users think of it."""
    if seq_len % cp:
        raise LayoutError(f"cp={cp} does not divide seq_len {seq_len}")
    if balance and seq_len % (2 * cp):
        raise LayoutError(
            f"cp={cp} with causal load balancing needs seq_len divisible by 2*cp={2 * cp}, got seq_len {seq_len}"
        )


@dataclass(frozen=True)
class ContextParallel:
    cp: int
    comm: str = "p2p"
    balance: bool = True
    torch: bool = False  # PyTorch's experimental context_parallel (module docstring)
    waited: bool = False  # compiled: each exchange waited on where it is issued
    tp: int = 1  # the tensor-parallel degree the graph is split by next: a head-parallel layer's heads take both
    a2a: int = 0  # a2a+p2p: the all-to-all groups' size (a proper divisor of cp)
    name: ClassVar[str] = "context-parallel"

    def __post_init__(self) -> None:
        if self.comm not in COMMS:
            raise LayoutError(f"unknown context-parallel communication {self.comm!r} (known: {', '.join(COMMS)})")
        if self.torch and self.comm in ("a2a", "a2a+p2p"):
            raise LayoutError(NO_TORCH_A2A)
        if self.comm == "a2a+p2p" and self.cp > 1:
            check_hierarchy(self.cp, self.a2a)

    def run(self, graph: Graph) -> Graph:
        if self.cp == 1:
            return graph
        # a layer that runs along the sequence: head-parallel, and the graph split again
        return split_retrying(lambda heads: _Splitter(graph, self, heads).run())


def _is_linear(graph: Graph, node: Node) -> bool:
    """A linear layer: a product with a 2-D weight, not a convolution."""
    return (
        node.op is OpKind.MATMUL
        and len(node.inputs) > 1
        and graph[node.inputs[1]].op is OpKind.PARAMETER
        and len(graph[node.inputs[1]].out.shape) == 2
        and not (isinstance(node.attrs, MatmulAttrs) and node.attrs.conv_io)
    )


class _Splitter:
    def __init__(self, graph: Graph, opts: ContextParallel, heads: set[str] | None = None) -> None:
        self.src = graph
        self.cp = opts.cp
        self.opts = opts
        self.out = Graph(graph.name, graph.repeats, graph.block_layers)
        self.map: dict[int, int] = {}
        self.axis: dict[int, int] = {}  # new value id -> its sequence axis
        self.tokens = sequence_length(graph)
        self.regions = tuple(sorted(heads or ()))  # modules run head-parallel (module docstring)
        self.heads: dict[int, int] = {}  # new value id -> its channel axis, split cp ways over the whole sequence
        # ... and where in that axis the split factor sits: (its stride inside the axis, its whole size)
        self.factor: dict[int, tuple[int, int]] = {}
        self.exchanged: dict[int, int] = {}  # value -> its all_to_all to the other split
        self.gathered: dict[int, int] = {}  # head-split value -> its all_gather (every channel on every rank)
        self.entering: set[int] = set()  # outputs of a head-parallel layer's input projections (on tokens)

    def to_heads(self, value: int, node: Node) -> int:
        """Megatron-Core's ``_all_to_all_cp2hp``: the rank's tokens with every channel -> every token, ``1/cp`` of
        the channels (the last axis, or the one before a sequence axis that is last)."""
        if value not in self.exchanged:
            spec, seq = self.out[value].out, self.axis[value]
            channel = len(spec.shape) - 1 if seq != len(spec.shape) - 1 else len(spec.shape) - 2
            shape = list(spec.shape)
            if channel < 0 or channel == seq or shape[channel] % self.cp:
                raise LayoutError(
                    f"cp={self.cp} does not divide the channels of {node.name} at {node.scope} "
                    f"({shape[channel] if channel >= 0 else 1}): a layer that runs along the sequence splits its "
                    "heads over the context-parallel ranks (Megatron-Core's Mamba context parallelism)"
                )
            shape[seq] *= self.cp
            shape[channel] //= self.cp
            v = self._exchange_a2a(value, spec.with_shape(tuple(shape)), node, TO_HEADS)
            self.heads[v] = channel
            self.factor[v] = (1, shape[channel] * self.cp)
            self.exchanged[value] = v
        return self.exchanged[value]

    def to_tokens(self, value: int, node: Node) -> int:
        """``_all_to_all_hp2cp``: back to the rank's tokens with every channel."""
        if value not in self.exchanged:
            spec, channel = self.out[value].out, self.heads[value]
            seq = len(spec.shape) - 2 if channel == len(spec.shape) - 1 else len(spec.shape) - 1
            shape = list(spec.shape)
            shape[channel] *= self.cp
            v = self._exchange_a2a(value, self.div(spec.with_shape(tuple(shape)), seq, node), node, "cp_to_tokens")
            self.axis[v] = seq
            self.exchanged[value] = v
        return self.exchanged[value]

    def gather_heads(self, value: int, node: Node) -> int:
        """All of a head-split value's channels on every rank."""
        if value not in self.gathered:
            spec, channel = self.out[value].out, self.heads[value]
            shape = list(spec.shape)
            shape[channel] *= self.cp
            full = spec.with_shape(tuple(shape))
            attrs = CollectiveAttrs(Axis.CP, self.cp, full.nbytes)
            name = f"{self.out[value].name}.cp_all_gather"
            self.gathered[value] = self.out.add(
                OpKind.ALL_GATHER, [value], full, attrs, phase=node.phase, scope=node.scope, name=name
            )
        return self.gathered[value]

    def _exchange_a2a(
        self, value: int, out: TensorSpec, node: Node, tag: str, axis: Axis = Axis.CP, size: int = 0
    ) -> int:
        """The all_to_all between tokens and heads, in line with compute: Megatron-Core's ``_AllToAll`` (the Mamba
        layer's) is a synchronous ``all_to_all_single``, and Transformer Engine's QKVO all-to-all runs inside the
        attention call after every projection, so nothing else computes while it runs. ``axis`` and ``size``:
        hierarchical CP's all-to-all groups instead of the whole CP group."""
        attrs = CollectiveAttrs(axis, size or self.cp, self.out[value].out.nbytes, blocking=True)
        return self.out.add(OpKind.ALL_TO_ALL, [value], out, attrs, phase=node.phase, scope=node.scope,
                            name=f"{self.out[value].name}.{tag}")  # fmt: skip

    def _heads_node(self, node: Node, ins: list[int]) -> int:
        """A node of a head-parallel layer: its inputs on the rank's heads over the whole sequence, as the tensor
        parallel pass splits a column-parallel region."""
        ins = [self.to_heads(i, node) if i in self.axis else i for i in ins]
        split = [i for i in ins if i in self.heads]
        if not split:
            return self._replicated(node, ins)
        src = split[0]
        axis = self.heads[src]
        factor = self.factor[src]
        before = self.src[node.inputs[ins.index(src)]].out.shape
        attrs = node.attrs
        if node.op is OpKind.VIEW:
            axis, factor = self._follow(before, axis, factor, node)
        elif node.op is OpKind.MATMUL and isinstance(attrs, MatmulAttrs):
            operands = [i for i in ins[:2] if i in self.heads]
            depthwise = attrs.conv_io and ins[0] in self.heads and self.heads[ins[0]] == 1
            inside = [i for i in operands if not depthwise and self.heads[i] >= len(self.out[i].out.shape) - 2]
            if inside:
                # split inside a product (fewer groups of B and C than ranks that split heads, Mamba-1's time step):
                # every rank gathers that operand, as Megatron-Core repeats a group's B and C on each rank
                return self._heads_node(node, [self.gather_heads(i, node) if i in inside else i for i in ins])
            if not operands:  # only a third operand (the decays) is split: the product is every rank's whole
                return self._replicated(node, [self.gather_heads(i, node) if i in self.heads else i for i in ins])
            # the operand laid out as the product (heads x chunks), not one broadcast over its heads (B, C)
            src = next((i for i in operands if self._whole_shape(i)[self.heads[i]] == node.out.shape[self.heads[i]]),
                       operands[0])  # fmt: skip
            axis, factor = self.heads[src], self.factor[src]
            if attrs.batch % self.cp:
                raise LayoutError(
                    f"cp={self.cp} does not divide the {attrs.batch} products of {node.name} at {node.scope}"
                )
            attrs = replace(attrs, batch=attrs.batch // self.cp, conv_io=attrs.conv_io // self.cp)
        elif node.op is OpKind.ATTENTION and isinstance(attrs, AttentionAttrs):  # every token, the rank's heads
            if axis != len(before) - 3 or attrs.heads % self.cp or attrs.kv_heads % self.cp:
                raise LayoutError(
                    f"cp={self.cp} does not divide the heads {attrs.heads} / kv_heads {attrs.kv_heads} of the "
                    f"head-parallel attention at {node.scope}"
                )
            attrs = replace(attrs, heads=attrs.heads // self.cp, kv_heads=attrs.kv_heads // self.cp)
        elif node.op is OpKind.REDUCTION:
            kept = _reduction_keeps(before, axis, node.out.shape)
            if kept is None:  # over the split channels: each rank's part, then an all_reduce
                v = self.add(node, ins, node.out, attrs, None)
                reduce = CollectiveAttrs(Axis.CP, self.cp, node.out.nbytes)
                return self.out.add(OpKind.ALL_REDUCE, [v], node.out, reduce, phase=node.phase, scope=node.scope,
                                    name=f"{node.name}.cp_all_reduce")  # fmt: skip
            axis = kept if kept >= 0 else axis
        else:
            axis = min(max(axis + len(node.out.shape) - len(before), 0), len(node.out.shape) - 1)
        shape = list(node.out.shape)
        if shape[axis] % self.cp:
            raise LayoutError(
                f"cp={self.cp} does not divide axis {axis} ({shape[axis]}) of {node.name} at {node.scope}: a layer "
                "that runs along the sequence splits its heads (and groups) over the context-parallel ranks"
            )
        shape[axis] //= self.cp
        v = self.add(node, ins, node.out.with_shape(tuple(shape)), attrs, None)
        self.heads[v] = axis
        self.factor[v] = factor
        return v

    def _replicated(self, node: Node, ins: list[int]) -> int:
        """A node of a head-parallel layer every rank computes whole (``C B^T`` of groups its heads share): one
        rank's product is the model's work, the others' hardware FLOPs only (MFU's numerator takes it once)."""
        attrs = node.attrs
        if isinstance(attrs, MatmulAttrs):
            attrs = replace(attrs, useful=attrs.useful / self.cp)
        return self.add(node, ins, node.out, attrs, None)

    def _whole_shape(self, value: int) -> tuple[int, ...]:
        """A head-split value's shape with every head."""
        shape = list(self.out[value].out.shape)
        shape[self.heads[value]] *= self.cp
        return tuple(shape)

    def _follow(
        self, before: tuple[int, ...], axis: int, factor: tuple[int, int], node: Node
    ) -> tuple[int, tuple[int, int]]:
        """Where a view puts the split factor (its stride inside ``axis`` and its size) of ``before``: followed by
        element strides, so a factor merged into a larger axis and unmerged again comes back to its own place
        (Qwen3-Next's gated norm flattens ``[b, T, heads, d]`` to ``[b * T * heads, d]`` and back). A factor that
        now spans several axes splits on the outermost (the channels are contiguous blocks of whole heads); a
        slice of the split axis keeps the split on each part (the fused input projection's z, x, B, C, dt)."""
        after = node.out.shape
        inner, size = factor
        if isinstance(node.attrs, ViewAttrs) and node.attrs.perm:
            return node.attrs.perm.index(axis), factor
        if math.prod(before) != math.prod(after):  # a slice: of the split axis (each part split), or of another
            if len(before) == len(after) and before[axis] != after[axis]:
                return axis, (1, after[axis])
            moved = _split_axis_after_view(before, axis, after, degree=self.cp)
            return moved, (1, after[moved])
        low = math.prod(before[axis + 1 :]) * inner  # the factor covers element strides [low, low * size)
        high = low * size
        spanned, stride = [], 1
        for j in range(len(after) - 1, -1, -1):
            if after[j] != 1 and stride < high and stride * after[j] > low:
                spanned.append(j)
            stride *= after[j]
        for j in reversed(spanned):  # outermost first; tensor parallelism splits the same heads next
            below = math.prod(after[j + 1 :])
            part = min(high, below * after[j]) // max(low, below)  # the factor's extent inside axis j
            if j == spanned[0] or part % (self.cp * self.opts.tp) == 0:
                return j, (max(1, low // below), part)
        return axis, factor

    def div(self, spec: TensorSpec, axis: int, node: Node) -> TensorSpec:
        shape = list(spec.shape)
        if shape[axis] % self.cp:
            raise LayoutError(
                f"cp={self.cp} does not divide the sequence axis of {node.name} ({shape[axis]}) at {node.scope or '-'}"
            )
        shape[axis] //= self.cp
        return spec.with_shape(tuple(shape))

    def add(self, node: Node, inputs: list[int], out: TensorSpec, attrs: object, axis: int | None) -> int:
        v = self.out.add(
            node.op,
            inputs,
            out,
            attrs,
            phase=node.phase,
            scope=node.scope,
            name=node.name,  # type: ignore[arg-type]
        )
        if axis is not None:
            self.axis[v] = axis
        return v

    def run(self) -> Graph:
        for nid in self.src.inputs:
            shape = self.src[nid].out.shape
            check_sequence(self.cp, shape[-1], self.opts.balance)
        for node in self.src:
            ins = [self.map[i] for i in node.inputs]
            if node.id in self.src.inputs:
                spec = node.out
                self.map[node.id] = self.add(
                    node, ins, self.div(spec, len(spec.shape) - 1, node), node.attrs, len(spec.shape) - 1
                )
            else:
                self.map[node.id] = self._node(node, ins)
        self.out.inputs = [self.map[i] for i in self.src.inputs]
        self.out.outputs = [self.map[o] for o in self.src.outputs]
        return self.out

    def _node(self, node: Node, ins: list[int]) -> int:
        if not self.regions or node.op is OpKind.PARAMETER:
            return self._tokens_node(node, ins)
        region, linear = bool(under(node.scope, self.regions)), _is_linear(self.src, node)
        along = node.op is OpKind.MATMUL or (
            isinstance(node.attrs, ElementwiseAttrs) and node.attrs.fn in SEQUENCE_KERNELS
        )
        if (
            region
            and not linear
            and any(i in self.heads or i in self.entering or (along and i in self.axis) for i in ins)
        ):
            return self._heads_node(node, ins)
        returned = any(i in self.heads for i in ins)
        v = self._tokens_node(node, [self.to_tokens(i, node) if i in self.heads else i for i in ins])
        if region and linear and not returned:  # an input projection: what reads it in the layer takes heads
            self.entering.add(v)
        return v

    def _tokens_node(self, node: Node, ins: list[int]) -> int:
        """A node on the rank's tokens (every node outside a head-parallel layer, its linears, and the ops of the
        residual stream that pass through it)."""
        split = [i for i in ins if i in self.axis]
        if not split:
            return self.add(node, ins, node.out, node.attrs, None)
        if isinstance(node.attrs, ElementwiseAttrs) and node.attrs.fn in SEQUENCE_KERNELS:
            raise Unsplittable(f"{node.attrs.fn} at {node.scope} runs along the sequence", node.scope)
        if node.op is OpKind.ATTENTION and isinstance(node.attrs, AttentionAttrs):
            return self._attention(node, ins)
        if node.op is OpKind.MATMUL and isinstance(node.attrs, MatmulAttrs):
            return self._matmul(node, ins)
        if node.op is OpKind.CROSS_ENTROPY:  # the loss of this rank's tokens
            return self.add(node, ins, node.out, node.attrs, None)
        src = split[0]
        src_axis = self.axis[src]
        full = self.src[node.inputs[0]].out
        if node.op is OpKind.VIEW and _slices_axis(full.shape, src_axis, node.out.shape):
            # a slice of the tokens (BERT's masked positions): the whole sequence is gathered from the cp ranks first
            attrs = CollectiveAttrs(Axis.CP, self.cp, full.nbytes)
            whole = self.out.add(OpKind.ALL_GATHER, [src], full, attrs, phase=node.phase, scope=node.scope,
                                 name=f"{node.name}.cp_all_gather")  # fmt: skip
            return self.add(node, [whole if i == src else i for i in ins], node.out, node.attrs, None)
        if node.op is OpKind.REDUCTION:
            whole = self.src[node.inputs[ins.index(src)]].out.shape
            kept = _reduction_keeps(whole, src_axis, node.out.shape)
            if kept is None:  # over the tokens (a mean over the sequence): each rank's part, then an all_reduce
                v = self.add(node, ins, node.out, node.attrs, None)
                attrs = CollectiveAttrs(Axis.CP, self.cp, node.out.nbytes)
                return self.out.add(OpKind.ALL_REDUCE, [v], node.out, attrs, phase=node.phase, scope=node.scope,
                                    name=f"{node.name}.cp_all_reduce")  # fmt: skip
            if kept >= 0:
                return self.add(node, ins, self.div(node.out, kept, node), node.attrs, kept)
        if node.op is OpKind.VIEW:
            before = self.src[node.inputs[0]].out.shape
            axis = _split_axis_after_view(before, src_axis, node.out.shape, True, attrs=node.attrs, tokens=self.tokens)
        elif node.op is OpKind.EMBEDDING:
            axis = src_axis  # [b, s] ids -> [b, s, h]
        else:
            axis = src_axis + len(node.out.shape) - len(self.out[src].out.shape)
            axis = min(max(axis, 0), len(node.out.shape) - 1)
        return self.add(node, ins, self.div(node.out, axis, node), node.attrs, axis)

    def _matmul(self, node: Node, ins: list[int]) -> int:
        a = node.attrs
        assert isinstance(a, MatmulAttrs)
        if ins[1] in self.axis:  # attention (or a linear attention) written out: its layer runs head-parallel
            raise Unsplittable(f"{node.name} at {node.scope} multiplies two sequence-split tensors", node.scope)
        axis = self.axis[ins[0]]
        x = self.out[ins[0]].out
        if axis == len(x.shape) - 1:
            raise Unsplittable(
                f"matmul {node.name} at {node.scope} contracts the sequence axis", module_of(self.src, node)
            )
        out = self.div(node.out, axis, node)
        w = self.out[ins[1]].out.shape
        if len(w) == 3 and a.batch == w[0]:  # grouped expert matmul: rows / experts per expert
            attrs = replace(a, m=-(-out.shape[0] // a.batch))
        elif a.batch == 1 or axis == len(x.shape) - 2:
            attrs = replace(a, m=a.m // self.cp)
        else:
            attrs = replace(a, batch=a.batch // self.cp)
        return self.add(node, ins, out, attrs, axis)

    def _attention(self, node: Node, ins: list[int]) -> int:
        a = node.attrs
        assert isinstance(a, AttentionAttrs)
        q, k, v, *mask = ins
        if mask:
            raise LayoutError(
                f"context parallelism supports causal or full attention, not an explicit mask ({node.scope})"
            )
        if a.window and (refusal := window_refusal(self.cp, self.opts.comm, self.opts.torch, node.scope)):
            raise LayoutError(refusal)
        if self.opts.comm == "a2a":
            return self._ulysses(node, [q, k, v])
        if self.opts.comm == "a2a+p2p":
            return self._hierarchical(node, [q, k, v])
        s_local = a.q_len // self.cp
        out = self.div(node.out, len(node.out.shape) - 2, node)
        kspec, vspec = self.out[k].out, self.out[v].out
        packed = kspec.with_shape((kspec.shape[0], kspec.shape[1] + vspec.shape[1], *kspec.shape[2:]))
        if self.opts.torch:  # K and V reach SDPA expanded to the query heads (repeat_kv)
            heads = self.out[q].out.shape[1]
            packed = kspec.with_shape((kspec.shape[0], 2 * heads, *kspec.shape[2:]))
            if self.opts.comm == "all_gather":
                return self._gathered_ring(node, q, k, v, out, packed, s_local)
        if self.opts.comm == "all_gather":
            return self._all_gather(node, q, k, v, out, packed, s_local)
        return self._ring(node, a, q, k, v, out, packed, s_local)

    def _ulysses(self, node: Node, qkv: list[int]) -> int:
        """Transformer Engine's QKVO all-to-all inside the attention call: Q, K and V from the rank's tokens of
        every head to every token of ``1/cp`` of the heads, the attention over the whole sequence, and its output
        back to the rank's tokens (all four in line with compute)."""
        a = node.attrs
        assert isinstance(a, AttentionAttrs)
        if a.heads % self.cp or a.kv_heads % self.cp:
            raise LayoutError(
                f"--cp-comm a2a: cp={self.cp} does not divide the heads {a.heads} / key/value heads {a.kv_heads} of "
                f"the attention at {node.scope} (each rank attends whole heads over the whole sequence)"
            )
        heads = self._qkv_to_heads(node, qkv, self.cp, Axis.CP, "a2a")
        shape = list(node.out.shape)
        shape[-3] //= self.cp
        attrs = replace(a, heads=a.heads // self.cp, kv_heads=a.kv_heads // self.cp)
        v = self.add(node, heads, node.out.with_shape(tuple(shape)), attrs, None)
        back = self._exchange_a2a(v, self.div(node.out, len(node.out.shape) - 2, node), node, "cp_a2a_tokens")
        self.axis[back] = len(node.out.shape) - 2
        return back

    def _qkv_to_heads(self, node: Node, qkv: list[int], size: int, axis: Axis, comm: str) -> list[int]:
        """Q, K and V from the rank's tokens of every head to ``size`` times the tokens of ``1/size`` of the heads:
        one all_to_all each over ``axis``. Each is ``[b, heads, tokens, d]`` or ``[b * heads, ...]``, K perhaps
        ``[..., d, tokens]``."""
        out = []
        for value in qkv:
            spec, seq = self.out[value].out, self.axis[value]
            shape = list(spec.shape)
            if len(shape) < 3 or seq < len(shape) - 2:
                raise LayoutError(f"--cp-comm {comm}: the attention at {node.scope} reads its tokens on axis {seq}")
            shape[seq] *= size
            shape[len(shape) - 3] //= size
            exchanged = self._exchange_a2a(value, spec.with_shape(tuple(shape)), node, "cp_a2a_heads", axis, size)
            self.axis[exchanged] = seq
            out.append(exchanged)
        return out

    def _hierarchical(self, node: Node, qkv: list[int]) -> int:
        """Transformer Engine's a2a+p2p: Q, K and V from the rank's tokens of every head to its all-to-all group's
        tokens of ``1/a2a`` of the heads, the ring over the ``cp / a2a`` groups on them, and the output back."""
        a = node.attrs
        assert isinstance(a, AttentionAttrs)
        inner = self.opts.a2a
        ring = self.cp // inner
        if a.heads % inner or a.kv_heads % inner:
            raise LayoutError(
                f"--cp-comm a2a+p2p: the all-to-all groups of {inner} ranks do not divide the heads {a.heads} / "
                f"key/value heads {a.kv_heads} of the attention at {node.scope} (each rank of a group takes whole "
                "heads)"
            )
        q, k, v = self._qkv_to_heads(node, qkv, inner, Axis.CP_A2A, "a2a+p2p")
        attrs = replace(a, heads=a.heads // inner, kv_heads=a.kv_heads // inner)
        shape = list(node.out.shape)
        shape[-3] //= inner
        shape[-2] //= ring
        kspec, vspec = self.out[k].out, self.out[v].out
        packed = kspec.with_shape((kspec.shape[0], kspec.shape[1] + vspec.shape[1], *kspec.shape[2:]))
        out = node.out.with_shape(tuple(shape))
        merged = self._ring(node, attrs, q, k, v, out, packed, a.q_len // ring, ring, Axis.CP_P2P)
        back = self._exchange_a2a(
            merged, self.div(node.out, len(node.out.shape) - 2, node), node, "cp_a2a_tokens", Axis.CP_A2A, inner
        )
        self.axis[back] = len(node.out.shape) - 2
        return back

    def _partial(self, node: Node, ins: list[int], out: TensorSpec, attrs: AttentionAttrs, tag: str) -> int:
        return self.out.add(
            OpKind.ATTENTION, ins, out, attrs, phase=node.phase, scope=node.scope, name=f"{node.name}.{tag}"
        )

    def _exchange(
        self, node: Node, op: OpKind, ins: list[int], packed: TensorSpec, tag: str, axis: Axis = Axis.CP, size: int = 0
    ) -> tuple[int, int, int]:
        """A K/V transfer (ring step or all_gather) and views of the K and V halves it delivers (``axis`` and
        ``size``: hierarchical CP's ring instead of the whole CP group)."""
        kv = self.out.add(
            op,
            ins,
            packed,
            CollectiveAttrs(axis, size or self.cp, packed.nbytes, blocking=self.opts.waited),
            phase=node.phase,
            scope=node.scope,
            name=f"{node.name}.{tag}",
        )
        kspec, vspec = self.out[ins[0]].out, self.out[ins[1]].out
        heads = packed.shape[1] // 2
        shape = (packed.shape[0], heads, *packed.shape[2:])
        kview, vview = (
            self.out.add(OpKind.VIEW, [kv], spec.with_shape(shape), phase=node.phase, scope=node.scope, name=name)
            for spec, name in ((kspec, f"{node.name}.{tag}.k"), (vspec, f"{node.name}.{tag}.v"))
        )
        self.axis[kv] = self.axis[kview] = self.axis[vview] = len(packed.shape) - 2
        return kv, kview, vview

    def _steps(self, a: AttentionAttrs, s: int) -> tuple[AttentionAttrs, AttentionAttrs]:
        """The diagonal step's attention and every later step's."""
        full_step = replace(a, q_len=s, kv_len=s, causal=False)
        # Balanced causal: every later step is exactly half a block (Transformer Engine runs
        # the unmasked half). It is costed as a causal block of the same size: the same work.
        # Otherwise whole blocks (non-causal attention, or the last rank of an unbalanced
        # causal ring). A causal model needs half a block per later step on the average
        # rank either way, so those steps count half a block of model FLOPs: with the
        # diagonal step, cp ranks count exactly the causal sequence's FLOPs.
        half_step = replace(a, q_len=s, kv_len=s, causal=True)
        later = half_step if a.causal and self.opts.balance else full_step
        if a.causal:
            later = replace(later, model_scale=0.5 / (causal_fraction(s, s) if later.causal else 1.0))
        first = replace(a, q_len=s, kv_len=s) if a.causal else full_step
        # K/V expanded to the query heads (AttentionAttrs.repeat_kv) once, on the rank's own chunk before the
        # ring: the diagonal step carries the copies, the later steps read chunks already expanded
        return first, replace(later, repeat_kv=False)

    def _ring(
        self,
        node: Node,
        a: AttentionAttrs,
        q: int,
        k: int,
        v: int,
        out: TensorSpec,
        packed: TensorSpec,
        s: int,
        size: int = 0,
        axis: Axis = Axis.CP,
    ) -> int:
        """Ring attention of ``a`` over ``size`` ranks (the CP group, or hierarchical CP's ring tier)."""
        first, later = self._steps(a, s)
        parts = [self._partial(node, [q, k, v], out, first, "cp0")]
        kj, vj = k, v
        for j in range(1, size or self.cp):
            _kv, kj, vj = self._exchange(node, OpKind.RECV, [kj, vj], packed, f"cp_ring{j}", axis, size)
            parts.append(self._partial(node, [q, kj, vj], out, later, f"cp{j}"))
        return self._merge(node, parts, out)

    def _merge(self, node: Node, parts: list[int], out: TensorSpec) -> int:
        merged = self.out.add(
            OpKind.ELEMENTWISE,
            parts,
            out,
            ElementwiseAttrs(MERGE_FP32 if self.opts.torch else "attn_merge", 4),
            phase=node.phase,
            scope=node.scope,
            name=f"{node.name}.cp_merge",
        )
        self.axis[merged] = len(out.shape) - 2
        return merged

    def _gathered_ring(self, node: Node, q: int, k: int, v: int, out: TensorSpec, packed: TensorSpec, s: int) -> int:
        """PyTorch's all-gather rotater: one gather before the diagonal step, each later step reads its chunk."""
        a = node.attrs
        assert isinstance(a, AttentionAttrs)
        first, later = self._steps(a, s)
        gathered = packed.with_shape((*packed.shape[:2], packed.shape[2] * self.cp, *packed.shape[3:]))
        attrs = CollectiveAttrs(Axis.CP, self.cp, gathered.nbytes, blocking=self.opts.waited)
        kv = self.out.add(OpKind.ALL_GATHER, [k, v], gathered, attrs, phase=node.phase, scope=node.scope,
                          name=f"{node.name}.cp_all_gather")  # fmt: skip
        self.axis[kv] = len(gathered.shape) - 2
        parts = [self._partial(node, [q, k, v], out, first, "cp0")]
        heads = packed.shape[1] // 2
        shape = (packed.shape[0], heads, *packed.shape[2:])
        for j in range(1, self.cp):  # chunk j of the gathered K/V: its K and V halves
            kj, vj = (
                self.out.add(OpKind.VIEW, [kv], spec.with_shape(shape), phase=node.phase, scope=node.scope,
                             name=f"{node.name}.cp_chunk{j}.{t}")
                for spec, t in ((self.out[k].out, "k"), (self.out[v].out, "v"))
            )  # fmt: skip
            self.axis[kj] = self.axis[vj] = len(shape) - 2
            parts.append(self._partial(node, [q, kj, vj], out, later, f"cp{j}"))
        return self._merge(node, parts, out)

    def _all_gather(self, node: Node, q: int, k: int, v: int, out: TensorSpec, packed: TensorSpec, s: int) -> int:
        a = node.attrs
        assert isinstance(a, AttentionAttrs)
        gathered = packed.with_shape((*packed.shape[:2], packed.shape[2] * self.cp, *packed.shape[3:]))
        _kv, kf, vf = self._exchange(node, OpKind.ALL_GATHER, [k, v], gathered, "cp_all_gather")
        seq = s * self.cp
        if not (a.causal and self.opts.balance):  # one local attention (the last rank when unbalanced)
            attrs = replace(a, q_len=s, kv_len=seq)
            if a.window:  # model FLOPs: the average rank's 1/cp of the band, not the last rank's
                attrs = replace(
                    attrs, model_scale=band_pairs(seq, seq, a.window) / (self.cp * band_pairs(s, seq, a.window))
                )
            elif a.causal:  # model FLOPs: the average rank's 1/cp of the causal sequence, not the last rank's
                attrs = replace(attrs, model_scale=causal_fraction(seq, seq) / causal_fraction(s, seq))
            v_out = self._partial(node, [q, kf, vf], out, attrs, "cp")
            self.axis[v_out] = len(out.shape) - 2
            return v_out
        # the balanced layout: rank r's chunks r and 2cp-1-r each see the keys before them. Without a window every
        # rank has the same work (rank 0: chunk 0 sees one chunk, chunk 2cp-1 all of them); with one, a chunk sees
        # at most the window, so the ranks holding the middle chunks do the most and the slowest one is simulated
        c = s // 2
        lo_kv, hi_kv = _busiest_balanced_rank(self.cp, c, a.window)
        lo_attrs, hi_attrs = replace(a, q_len=c, kv_len=lo_kv), replace(a, q_len=c, kv_len=hi_kv)
        if a.window:  # model FLOPs: the average rank's 1/cp of the band
            mine = band_pairs(c, lo_kv, a.window) + band_pairs(c, hi_kv, a.window)
            scale = band_pairs(seq, seq, a.window) / (self.cp * mine)
            lo_attrs, hi_attrs = replace(lo_attrs, model_scale=scale), replace(hi_attrs, model_scale=scale)
        half = out.with_shape((*out.shape[:-2], c, out.shape[-1]))
        lo = self._partial(node, [q, kf, vf], half, lo_attrs, "cp_lo")
        hi = self._partial(node, [q, kf, vf], half, hi_attrs, "cp_hi")
        cat = self.out.add(OpKind.ELEMENTWISE, [lo, hi], out, ElementwiseAttrs("cat", 0),
                           phase=node.phase, scope=node.scope, name=f"{node.name}.cp_cat")  # fmt: skip
        self.axis[cat] = len(out.shape) - 2
        return cat


def _busiest_balanced_rank(cp: int, chunk: int, window: int) -> tuple[int, int]:
    """Where the two chunks of the balanced layout's busiest rank (the most (query, key) pairs) end.

    Rank ``r`` holds chunks ``r`` and ``2cp - 1 - r`` of ``chunk`` tokens each; chunk ``j`` sees the keys up to
    its end, ``(j + 1) * chunk``, within ``window`` (0: all of them, when every rank does the same work and
    rank 0 is taken)."""

    def pairs(r: int) -> int:
        return sum(band_pairs(chunk, (j + 1) * chunk, window or None) for j in (r, 2 * cp - 1 - r))

    r = max(range(cp), key=pairs) if window else 0
    return (r + 1) * chunk, (2 * cp - r) * chunk


def window_refusal(cp: int, comm: str, torch: bool, scope: str) -> str:
    """Why a sliding window (at ``scope``) cannot run on this context-parallel scheme, and what can; "" where it
    can (Transformer Engine's all_gather and a2a)."""
    if not torch and comm in ("all_gather", "a2a"):
        return ""
    if torch:
        return (
            f"cp={cp}: PyTorch's context_parallel rings scaled-dot-product attention without a mask, and "
            f"sliding-window attention needs one ({scope})"
        )
    return (
        f"cp={cp}: Transformer Engine's ring (--cp-comm {comm}) does not run sliding-window attention ({scope}); "
        "--cp-comm all_gather or a2a does, as Megatron-Core's --cp-comm-type"
    )


# ---- backward: bring the other K/V chunks round again instead of saving them -----------------


def _is_cp(node: Node, op: OpKind) -> bool:
    return (
        node.op is op
        and node.phase is Phase.FORWARD
        and isinstance(node.attrs, CollectiveAttrs)
        and node.attrs.axis in RING_AXES
        and bool(node.inputs)
    )


@dataclass(frozen=True)
class ContextParallelBackward:
    torch: bool = False  # PyTorch's ring: dK/dV travel as fp32 accumulators, one permute per step
    name: ClassVar[str] = "context-parallel-backward"

    def run(self, graph: Graph) -> Graph:
        g = graph.copy()
        if self.torch:
            _fp32_grad_ring(g)
        views: dict[int, list[int]] = {}  # exchange -> its K and V views, in creation order
        for n in g:
            if n.op is OpKind.VIEW and n.phase is Phase.FORWARD and n.inputs and n.inputs[0] in g.nodes:
                src = g[n.inputs[0]]
                if _is_cp(src, OpKind.RECV) or _is_cp(src, OpKind.ALL_GATHER):
                    views.setdefault(src.id, []).append(n.id)
        if not views:
            return g
        merges = ("attn_merge", MERGE_FP32)
        merged = {i: n.id for n in g if isinstance(n.attrs, ElementwiseAttrs) and n.attrs.fn in merges
                  for i in n.inputs}  # fmt: skip
        position = {nid: i for i, nid in enumerate(g.nodes)}
        insert: dict[int, list[int]] = {}  # backward consumer -> new nodes to place before it
        rewire: dict[int, dict[int, int]] = {}
        owner = {vid: x for x, vs in views.items() for vid in vs}
        for chain in _ring_chains(g, views, owner):  # the other chunks again, the other way round
            steps = list(reversed(chain))  # chunk n is one hop away the other way, then n-1, ...
            users = [_consumers(g, views[r]) for r in steps]
            if not any(users):
                continue
            earliest = min((b for u in users for b in u), key=position.__getitem__)
            prev = list(g[chain[0]].inputs)
            for idx, r in enumerate(steps):
                x, xviews = _refetch(g, g[r], OpKind.RECV, prev, [g[v] for v in views[r]])
                prev = xviews
                for b in users[idx]:
                    rewire.setdefault(b, {}).update(dict(zip(views[r], xviews, strict=True)))
                # one step ahead: fetched while the previous step's attention backward runs
                target = users[max(0, idx - 1)] or users[idx]
                first = min(target, key=position.__getitem__) if target else earliest
                insert.setdefault(first, []).extend([x, *xviews])
        for x, vs in views.items():  # all_gather: gather again right before the attention backward
            if g[x].op is not OpKind.ALL_GATHER:
                continue
            users = _consumers(g, vs)
            if not users:
                continue
            y, yviews = _refetch(g, g[x], OpKind.ALL_GATHER, list(g[x].inputs), [g[v] for v in vs])
            first = min(users, key=position.__getitem__)
            insert.setdefault(first, []).extend([y, *yviews])
            for b in users:
                rewire.setdefault(b, {}).update(dict(zip(vs, yviews, strict=True)))
        for n in list(g):  # the backward of each ring step reads the merged output, not its partial one
            if n.op is OpKind.ATTENTION and n.phase is Phase.BACKWARD and n.origin in merged:
                rewire.setdefault(n.id, {})[n.origin] = merged[n.origin]
        for b, mapping in rewire.items():
            g.replace(b, inputs=tuple(mapping.get(i, i) for i in g[b].inputs))
        placed = {nid for new in insert.values() for nid in new}
        order: list[int] = []
        for nid in g.nodes:
            if nid in placed:
                continue
            order.extend(insert.get(nid, []))
            order.append(nid)
        g.nodes = {nid: g.nodes[nid] for nid in order}
        return g


def _fp32_grad_ring(g: Graph) -> None:
    """PyTorch's ring backward sends the fp32 dK/dV accumulators (``convert_to_f32``) to the next rank after
    every step, a permute each: the gradient of a gathered K/V is ``cp`` chunk-sized fp32 permutes, not a
    reduce_scatter; the gradient of a ring step is its exchange in fp32."""
    for n in list(g):
        a = n.attrs
        if n.phase is not Phase.BACKWARD or not isinstance(a, CollectiveAttrs) or a.axis is not Axis.CP:
            continue
        fwd = g.nodes.get(n.origin) if n.origin is not None else None
        if fwd is None or not (_is_cp(fwd, OpKind.RECV) or _is_cp(fwd, OpKind.ALL_GATHER)):
            continue
        widen = 4 // fwd.out.dtype.itemsize
        if n.op is OpKind.REDUCE_SCATTER:
            piece = a.bytes // a.size * widen
            g.replace(n.id, op=OpKind.RECV, attrs=replace(a, bytes=piece * a.size, pieces=(piece,) * a.size))
        elif n.op is OpKind.RECV:
            g.replace(n.id, attrs=replace(a, bytes=a.bytes * widen))


def _ring_chains(g: Graph, views: dict[int, list[int]], owner: dict[int, int]) -> list[list[int]]:
    """Ring exchanges of one attention, first step first."""
    nxt: dict[int, int] = {}
    roots = []
    for x in views:
        if g[x].op is not OpKind.RECV:
            continue
        prev = {owner[i] for i in g[x].inputs if i in owner}
        if prev:
            nxt[prev.pop()] = x
        else:
            roots.append(x)
    chains = []
    for r in roots:
        chain = [r]
        while chain[-1] in nxt:
            chain.append(nxt[chain[-1]])
        chains.append(chain)
    return chains


def _consumers(g: Graph, values: list[int]) -> list[int]:
    return sorted({u for v in values for u in g.users(v) if g[u].phase is Phase.BACKWARD})


def _refetch(g: Graph, fwd: Node, op: OpKind, ins: list[int], views: list[Node]) -> tuple[int, list[int]]:
    x = g.add(op, ins, fwd.out, fwd.attrs, phase=Phase.BACKWARD, scope=fwd.scope, name=f"{fwd.name}.refetch",
              origin=fwd.id)  # fmt: skip
    out = [
        g.add(OpKind.VIEW, [x], v.out, phase=Phase.BACKWARD, scope=v.scope, name=f"{v.name}.refetch", origin=v.id)
        for v in views
    ]
    return x, out
