"""Expert parallelism: each rank of an ``ep`` group holds ``experts / ep`` experts.

Between the router's dispatch (tokens permuted into expert order) and the
experts, an all_to_all sends every (token, choice) row to the rank that owns its
expert; a second all_to_all brings the results back before the combine. The
grouped expert GEMMs then run on the rows this rank *received*. As in
Megatron-Core's all-to-all dispatcher, rows that arrive grouped by source rank are
sorted into local-expert order before the experts (after the expert-tensor-parallel
all_gather) and back again after them, when a rank holds more than one expert.

Routing is rarely even. :class:`Routing` is the traffic matrix of one dispatch:
``imbalance`` is the load of the busiest rank over the mean (1 = the
force-balanced best case NVIDIA's benchmarks use; ``ep`` = every token to one
rank), and ``capacity_factor`` caps what each rank may send to each other rank at
``capacity_factor x`` its fair share, dropping the excess (0 = dropless). The ring
of all_to_alls advances in lock step, so the simulated rank is the busiest one:
its grouped GEMMs process its received rows and its all_to_all moves the larger of
what it sends and receives. Expert weights carry ``expert=True`` so that their
gradients are reduced over the expert-data-parallel group (EP is carved out of
data parallelism, as in Megatron-Core).

``padded``: the dropping path of frameworks that pad every expert to its capacity instead of
permuting rows (MaxText's ``dense_matmul`` with ``capacity_factor > 0``, src/maxtext/layers/moe.py,
commit e591f30: ``generate_masks`` and the ``"BSM,BSEC -> EBCM"`` / ``"EBCM,BSEC -> BSM"`` einsums).
Each sequence of ``S`` tokens gives every expert ``C = int(max(ceil(S k / E) cf, cf))`` slots; a
one-hot dispatch einsum (``2 B S E C M`` FLOPs) fills them, the experts run on all ``E C`` slots of
every sequence, whether filled or not, the all_to_alls move the padded buffers, and a combine einsum
(the router weights inside its mask) sums the slots back into tokens. The dispatch mask is boolean,
so only the tokens get its gradient; the combine's gradient reaches both the slots and the router
weights. The gather echosim builds the rows with stays as the mask's own memory-bound cost.

``quant_pad``: Megatron-Core's TEGroupedMLP under an FP8 / MXFP8 / NVFP4 recipe pads each local expert's
rows to the quantised GEMM's alignment with Transformer Engine's Fp8Padding before fc1 and strips them with
Fp8Unpadding after fc2 (megatron/core/transformer/moe/experts.py, TEGroupedMLP.forward: ``if self.config.fp8``
in core_v0.14.0 / core_v0.15.0, ``if self.config.fp8 or self.config.fp4`` in core_v0.16.0). Each is a copy of
the whole row buffer (transformer_engine/pytorch/module/fp8_padding.py and fp8_unpadding.py:
``tex.fused_multi_row_padding`` into a new tensor, unpadding in backward, and the reverse), so a MoE layer pays
four memory-bound passes over its routed rows per micro-batch: ``moe_quant_pad`` and ``moe_quant_unpad`` here,
their gradients in backward. The alignment rows themselves (at most 15 / 31 per local expert) are not added.
Segments that arrive aligned skip them (Fp8Padding returns its input when ``m_splits == padded_m_splits``):
token dropping with ``pad_to_capacity`` (Megatron-Core's --moe-pad-expert-input-to-capacity) gives every local
expert ``ep x capacity`` rows, ``capacity = ceil(tokens x top_k / experts x capacity_factor)`` (get_capacity,
megatron/core/transformer/moe/moe_utils.py, core_v0.14.0), aligned when that is a multiple of the
alignment; HybridEP pads inside its fused dispatch (``pad_multiple`` in _HybridEPManager.dispatch,
megatron/core/transformer/moe/token_dispatcher.py, core_v0.16.0), and so does ``moe_router_padding_for_fp8``
in the router, which the performance recipes behind the published tables leave off (Megatron-Bridge
v0.1.0rc4 - v0.4.1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property
from typing import ClassVar

from echosim.ir.graph import Graph, Node, elementwise_fn
from echosim.ir.ops import Axis, CollectiveAttrs, ElementwiseAttrs, MatmulAttrs, OpKind, ParamAttrs, Phase
from echosim.ir.types import TensorSpec
from echosim.passes.base import LayoutError


@dataclass(frozen=True)
class Routing:
    """Rows one dispatch moves between the ``ep`` ranks of a group; rank 0 is the busiest."""

    ep: int
    rows: float  # (token, expert) rows each rank routes
    imbalance: float = 1.0
    capacity_factor: float = 0.0
    padded: float = 0.0  # > 0: every rank's experts run this multiple of its routed rows, padded to capacity

    def __post_init__(self) -> None:
        check_routing(self.ep, self.imbalance, self.capacity_factor)

    def share(self, dst: int) -> float:
        """Fraction of every rank's rows that goes to ``dst``."""
        if self.ep == 1:
            return 1.0
        if dst == 0:
            return self.imbalance / self.ep
        return (self.ep - self.imbalance) / (self.ep * (self.ep - 1))

    @cached_property
    def _matrix(self) -> tuple[tuple[float, ...], ...]:
        cap = self.capacity_factor * self.rows / self.ep if self.capacity_factor > 0 else math.inf
        return tuple(tuple(min(self.rows * self.share(dst), cap) for dst in range(self.ep)) for _ in range(self.ep))

    def matrix(self) -> list[list[float]]:
        """``m[src][dst]``: rows sent from src to dst after capacity drops."""
        return [list(row) for row in self._matrix]

    def sent(self, src: int) -> float:
        return sum(self._matrix[src])

    def received(self, dst: int) -> float:
        return sum(row[dst] for row in self._matrix)

    def dropped(self, src: int) -> float:
        return self.rows - self.sent(src)

    def load_factor(self) -> float:
        """Rows the busiest rank's experts process, over the rows each rank routes."""
        if self.padded:
            return self.padded
        return self.received(0) / self.rows if self.rows else 1.0

    def wire_factor(self) -> float:
        """The busiest rank's all_to_all, as a multiple of a balanced exchange of its rows.

        nccl-tests sizes an all_to_all by the whole per-rank buffer, ``(ep-1)/ep`` of
        which leaves the rank; the busier direction of the hot rank sets the time.
        """
        if self.ep == 1 or not self.rows:
            return 0.0
        if self.padded:  # every rank sends its padded buffers whole, evenly
            return self.padded
        m = self._matrix
        off_sent = self.sent(0) - m[0][0]
        off_recv = self.received(0) - m[0][0]
        return max(off_sent, off_recv) * self.ep / ((self.ep - 1) * self.rows)


def check_routing(ep: int, imbalance: float, capacity_factor: float) -> None:
    if ep < 1:
        raise LayoutError(f"ep must be at least 1, got {ep}")
    if not 1.0 <= imbalance <= ep and ep > 1:
        raise LayoutError(
            f"routing imbalance {imbalance:g} must lie between 1 (balanced) and ep={ep} (every token on one rank)"
        )
    if capacity_factor < 0 or not math.isfinite(capacity_factor):
        raise LayoutError(f"capacity factor must be >= 0 (0 = dropless), got {capacity_factor:g}")


#: The op that ends an expert region: echosim's combine (the zoo), or the unpermute of a captured
#: MoE (:mod:`echosim.frontend.moe_routing`), which the weighted sum follows.
COMBINES = ("moe_combine", "moe_unpermute")


#: Token dispatchers (the plan's ``moe_dispatcher``): NCCL's all_to_all (Megatron-Core's ``alltoall``),
#: DeepEP's node-deduplicated network leg plus NVLink forwarding (Megatron-Core's ``flex`` dispatcher with
#: the deepep backend; :mod:`echosim.backends.deepep`), or HybridEP (the ``flex`` dispatcher with the hybridep
#: backend: "NVIDIA's optimized dispatcher using TMA and IBGDA ... native MNNVL support", megatron/core/
#: transformer/moe/README.md, core_v0.16.0). HybridEP's exchange is costed as DeepEP's: its design is the same
#: hierarchy, "Inter-node Communication: High-performance RDMA-based communication across nodes" and "Intra-node
#: Communication: NVLink-optimized data transfer", its dispatch sending tokens "to corresponding expert nodes"
#: (deepseek-ai/DeepEP branch hybrid-ep, docs/README_Hybrid-EP.md), and its H100 runs over 16-64 ranks move
#: 41-58 GB/s of "IB bandwidth" a rank (dispatch and combine, 8-16 SMs, same README), the line rate of one
#: 400 Gb/s NIC. Within one NVLink domain both are the flat all_to_all (:func:`echosim.backends.deepep.
#: deepep_time_s`). What differs is that HybridEP's fused dispatch pads the experts' rows itself (``quant_pad`` off).
DISPATCHERS = ("alltoall", "deepep", "hybridep")


@dataclass(frozen=True)
class ExpertParallel:
    """Shard experts ``ep`` ways; insert the dispatch and combine all_to_alls (after TP/SP)."""

    ep: int
    capacity_factor: float = 0.0
    imbalance: float = 1.0
    dispatcher: str = "alltoall"
    router_groups: tuple[int, int] = (0, 0)  # (groups, groups per token) of group-limited routing; 0: none
    padded: bool = False  # experts padded to capacity, one-hot einsum dispatch and combine (module docstring)
    seq_len: int = 0  # tokens of one sequence, the group a capacity is counted over (0: a dispatch's tokens)
    quant_pad: int = 0  # rows Fp8Padding aligns each expert's segment to; 0: no such copies (module docstring)
    pad_to_capacity: bool = False  # dropping pads every expert's rows to its capacity (Megatron-Core's option)
    name: ClassVar[str] = "expert-parallel"

    def __post_init__(self) -> None:
        check_routing(self.ep, self.imbalance, self.capacity_factor)
        if self.dispatcher not in DISPATCHERS:
            raise LayoutError(f"MoE dispatcher {self.dispatcher!r}: unknown (known: {', '.join(DISPATCHERS)})")
        groups, per_token = self.router_groups
        if groups < 0 or per_token < 0 or bool(groups) != bool(per_token) or per_token > groups:
            raise LayoutError(
                f"router groups {per_token} of {groups}: give both, with 1 <= groups per token <= groups (0, 0: none)"
            )

    def run(self, graph: Graph) -> Graph:
        dispatches = [n for n in graph if n.phase is Phase.FORWARD and elementwise_fn(n) == "moe_dispatch"]
        if not dispatches:
            if self.ep > 1:
                raise LayoutError(
                    f"ep={self.ep} needs routed experts: a dispatch, grouped expert GEMMs and a combine "
                    "(the zoo's moe models and transformers MoE layers are recognised; this model's are not)"
                )
            return graph
        if self.padded and self.capacity_factor <= 0:
            raise LayoutError("padding experts to capacity needs a capacity factor > 0")
        plain = not self.padded and not self.quant_pad
        if self.ep == 1 and plain and (self.capacity_factor == 0 or self.capacity_factor >= 1):
            return graph  # one rank holds every expert, drops nothing and copies nothing
        return _Rewriter(graph, self, dispatches).run()


class _Rewriter:
    def __init__(self, graph: Graph, opts: ExpertParallel, dispatches: list[Node]) -> None:
        self.src = graph
        self.opts = opts
        self.out = Graph(graph.name, graph.repeats, graph.block_layers)
        self.map: dict[int, int] = {}
        self.region: dict[int, int] = {}  # node in an expert region -> its dispatch
        self.combine_of: dict[int, int] = {}  # combine -> dispatch
        self.experts: dict[int, int] = {}  # expert weight -> experts in the layer
        for d in dispatches:
            self._find_region(d)
        self.routing: dict[int, Routing] = {}
        self.sorted: dict[tuple[int, str], int] = {}  # (new expert-input value, fn) -> its copy before the GEMMs
        # the einsums lay the slots out expert by expert: nothing to sort or align
        local = min(self.experts.values(), default=0) // opts.ep
        self.sort = not opts.padded and opts.ep > 1 and local >= 2
        self.quant_pad = not opts.padded and opts.quant_pad > 0 and bool(self.experts) and not self._aligned(dispatches)
        self.entry, self.exit = self._ends()

    def _aligned(self, dispatches: list[Node]) -> bool:
        """Whether padding to capacity already hands every local expert an aligned segment (``ep x capacity``)."""
        if not self.opts.pad_to_capacity or self.opts.capacity_factor <= 0:
            return False
        experts = max(self.experts.values())
        rows = {d.out.shape[0] for d in dispatches}  # (token, choice) rows each rank routes
        capacities = {math.ceil(r / experts * self.opts.capacity_factor) for r in rows}
        return all(self.opts.ep * c % self.opts.quant_pad == 0 for c in capacities)

    def _ends(self) -> tuple[set[int], set[int]]:
        """Expert GEMMs that read the region's input rows, and those whose output leaves the experts."""
        if not self.sort and not self.quant_pad:
            return set(), set()
        grouped = {
            nid for nid in self.region if self.src[nid].op is OpKind.MATMUL and self.src[nid].inputs[1] in self.experts
        }
        after: set[int] = set()
        for n in self.src:
            if n.id in self.region and any(i in grouped or i in after for i in n.inputs):
                after.add(n.id)
        before: set[int] = set()
        for n in reversed(list(self.src)):
            if n.id in self.region and any(u in grouped or u in before for u in self.src.users(n.id)):
                before.add(n.id)
        return grouped - after, grouped - before

    def _find_region(self, d: Node) -> None:
        below: set[int] = {d.id}
        combine = None
        for n in self.src:  # graph order is topological
            if n.id != d.id and any(i in below for i in n.inputs):
                below.add(n.id)
                if elementwise_fn(n) in COMBINES and n.inputs[0] in below:
                    combine = n
                    break
        if combine is None:
            raise LayoutError(f"expert dispatch {d.name} at {d.scope} has no combine")
        above: set[int] = set()
        stack = [combine.inputs[0]]
        while stack:
            i = stack.pop()
            if i in above or i == d.id:
                continue
            above.add(i)
            stack.extend(self.src[i].inputs)
        for nid in above & below:
            self.region[nid] = d.id
            node = self.src[nid]
            if node.op is OpKind.MATMUL and len(node.inputs) > 1:
                w = self.src[node.inputs[1]]
                if w.op is OpKind.PARAMETER and len(w.out.shape) == 3:
                    experts = w.out.shape[0]
                    if experts % self.opts.ep:
                        raise LayoutError(f"ep={self.opts.ep} does not divide experts {experts}")
                    self.experts[w.id] = experts
        self.combine_of[combine.id] = d.id

    def run(self) -> Graph:
        for node in self.src:
            ins = [self.map[i] for i in node.inputs]
            if node.id in self.experts:
                self.map[node.id] = self._weight(node)
            elif node.id in self.region:
                # Megatron's order: sort_chunks, Fp8Padding, fc1 ... fc2, Fp8Unpadding, unsort_chunks
                if node.id in self.entry:
                    first = ins[0]
                    if self.sort:
                        first = self._chunks(node, first, "moe_sort_chunks")
                    if self.quant_pad:
                        first = self._chunks(node, first, "moe_quant_pad")
                    ins = [first, *ins[1:]]
                self.map[node.id] = self._scaled(node, ins)
                if node.id in self.exit:
                    if self.quant_pad:
                        self.map[node.id] = self._chunks(node, self.map[node.id], "moe_quant_unpad")
                    if self.sort:
                        self.map[node.id] = self._chunks(node, self.map[node.id], "moe_unsort_chunks")
            elif node.id in self.combine_of:
                d = self.combine_of[node.id]
                back = self._all_to_all(self.src[d], ins[0], self.src[node.inputs[0]], "combine")
                if self.opts.padded:
                    self.map[node.id] = self._combine_einsum(node, back, ins)
                else:
                    self.map[node.id] = self._copy(node, [back, *ins[1:]])
            else:
                self.map[node.id] = self._copy(node, ins)
            if elementwise_fn(node) == "moe_dispatch" and node.phase is Phase.FORWARD:
                self._dispatched(node)
        self.out.inputs = [self.map[i] for i in self.src.inputs]
        self.out.outputs = [self.map[o] for o in self.src.outputs]
        return self.out

    def _copy(self, node: Node, ins: list[int], **changes: object) -> int:
        fields = {"out": node.out, "attrs": node.attrs, **changes}
        return self.out.add(
            node.op,
            ins,
            fields["out"],  # type: ignore[arg-type]
            fields["attrs"],  # type: ignore[arg-type]
            phase=node.phase,
            scope=node.scope,
            name=node.name,
        )

    def _chunks(self, node: Node, value: int, fn: str) -> int:
        """A copy of the expert rows: Megatron's sort_chunks_by_idxs (rows from each source rank regrouped by
        local expert) or its inverse, or TE's Fp8Padding / Fp8Unpadding; one per value read by several GEMMs."""
        entry = fn in ("moe_sort_chunks", "moe_quant_pad")
        if entry and (value, fn) in self.sorted:
            return self.sorted[(value, fn)]
        v = self.out.add(OpKind.ELEMENTWISE, [value], self.out[value].out, ElementwiseAttrs(fn),
                         phase=node.phase, scope=node.scope, name=f"{node.name}.{fn}")  # fmt: skip
        if entry:
            self.sorted[(value, fn)] = v
        return v

    def _weight(self, node: Node) -> int:
        shape = (node.out.shape[0] // self.opts.ep, *node.out.shape[1:])
        attrs = node.attrs if isinstance(node.attrs, ParamAttrs) else ParamAttrs()
        if self.opts.ep > 1:
            attrs = replace(attrs, shard=attrs.shard * self.opts.ep, expert=True)
        return self._copy(node, [], out=node.out.with_shape(shape), attrs=attrs)

    def _slots(self, d: Node) -> tuple[float, int, int]:
        """(sequences, tokens per sequence, expert slots per sequence E x C) of dispatch ``d``'s padded path."""
        tokens = self.src[d.inputs[0]].out.shape[0]
        seq = self.opts.seq_len or tokens  # a whole sequence even where SP / CP leave a rank part of one
        experts, top_k, cf = self._layer_experts(d), self._top_k(d), self.opts.capacity_factor
        if not experts:
            raise LayoutError(f"expert dispatch {d.name} at {d.scope}: no expert weights to pad")
        capacity = int(max(math.ceil(seq * top_k / experts) * cf, cf))
        return tokens / seq, seq, experts * capacity

    def _dispatched(self, node: Node) -> None:
        """After the dispatch: the rows leave for their experts' ranks."""
        rows = node.out.shape[0]
        pad = 0.0
        if self.opts.padded:
            groups, seq, slots = self._slots(node)
            pad = groups * slots / rows
            self.map[node.id] = self._dispatch_einsum(node, groups, seq, slots)
        routing = Routing(self.opts.ep, rows, self.opts.imbalance, self.opts.capacity_factor, pad)
        self.routing[node.id] = routing
        if self.opts.ep > 1:
            self.map[node.id] = self._all_to_all(node, self.map[node.id], node, "dispatch")

    def _dispatch_einsum(self, d: Node, groups: float, seq: int, slots: int) -> int:
        """``"BSM,BSEC -> EBCM"``: the tokens times the boolean dispatch mask, one product per sequence."""
        tokens, ids = (self.map[i] for i in d.inputs[:2])
        hidden = d.out.shape[1]
        batch = int(groups) if groups == int(groups) else 1
        attrs = MatmulAttrs(m=round(slots * groups / batch), n=hidden, k=seq, batch=batch, useful=0.0)
        out = d.out.with_shape((max(1, round(slots * groups)), *d.out.shape[1:]))
        return self.out.add(OpKind.MATMUL, [tokens, ids], out, attrs, phase=d.phase, scope=d.scope,
                            name=f"{d.name}.dispatch_einsum")  # fmt: skip

    def _combine_einsum(self, c: Node, back: int, ins: list[int]) -> int:
        """``"EBCM,BSEC -> BSM"``: the slots times the combine mask (router weights inside), per sequence."""
        if elementwise_fn(c) != "moe_combine" or len(ins) < 3:
            raise LayoutError(f"padding experts to capacity needs a weighted combine (rows, ids, weights): {c.name}")
        groups, seq, slots = self._slots(self.src[self.combine_of[c.id]])
        batch = int(groups) if groups == int(groups) else 1
        attrs = MatmulAttrs(m=round(seq * groups / batch), n=c.out.shape[1], k=slots, batch=batch, useful=0.0)
        return self.out.add(OpKind.MATMUL, [back, ins[2]], c.out, attrs, phase=c.phase, scope=c.scope,
                            name=f"{c.name}.combine_einsum")  # fmt: skip

    def _all_to_all(self, d: Node, value: int, shape_of: Node, what: str) -> int:
        routing = self.routing[d.id]
        if self.opts.ep == 1:
            return value
        src = self.out[value].out
        out = shape_of.out if what == "combine" else self._rows(shape_of, routing)
        nbytes = round(routing.wire_factor() * (shape_of.out.nbytes if what == "dispatch" else out.nbytes))
        if what == "combine" and routing.padded:  # the padded slots come back whole
            out = out.with_shape((max(1, round(out.shape[0] * routing.padded)), *out.shape[1:]))
        attrs = CollectiveAttrs(Axis.EP, self.opts.ep, nbytes)
        if self.opts.dispatcher in ("deepep", "hybridep"):  # network once per node, then NVLink (DISPATCHERS)
            experts, (groups, group_topk) = self._layer_experts(d), self.opts.router_groups
            if groups and experts % groups:
                raise LayoutError(f"router groups {groups} do not divide the layer's {experts} experts")
            attrs = replace(attrs, experts=experts, top_k=self._top_k(d), groups=groups, group_topk=group_topk)
        return self.out.add(
            OpKind.ALL_TO_ALL,
            [value],
            out if what == "combine" else src.with_shape(out.shape),
            attrs,
            phase=d.phase,
            scope=d.scope,
            name=f"{d.name}.{what}_all_to_all",
        )

    def _layer_experts(self, d: Node) -> int:
        """Routed experts of dispatch ``d``'s layer (its expert weights' leading dimension)."""
        found = {self.experts[n.inputs[1]] for n in self.src if self.region.get(n.id) == d.id
                 and n.op is OpKind.MATMUL and len(n.inputs) > 1 and n.inputs[1] in self.experts}  # fmt: skip
        return max(found, default=0)

    def _top_k(self, d: Node) -> int:
        """Choices per token of dispatch ``d``: its (token, expert) rows over the tokens it reads."""
        tokens = self.src[d.inputs[0]].out.shape[0] if d.inputs else 0
        return max(1, d.out.shape[0] // tokens) if tokens else 1

    def _rows(self, node: Node, routing: Routing) -> TensorSpec:
        rows = math.ceil(node.out.shape[0] * routing.load_factor())
        return node.out.with_shape((max(1, rows), *node.out.shape[1:]))

    def _scaled(self, node: Node, ins: list[int]) -> int:
        """An op between dispatch and combine: it now sees the busiest rank's rows and local experts."""
        routing = self.routing[self.region[node.id]]
        out = self._rows(node, routing)
        attrs = node.attrs
        if isinstance(attrs, MatmulAttrs) and node.id not in self.experts:
            experts = self.out[ins[1]].out.shape[0] if len(self.out[ins[1]].out.shape) == 3 else 0
            if experts:
                attrs = replace(attrs, batch=experts, m=-(-out.shape[0] // experts))
            if routing.padded:  # the routed rows are the model's work, the empty slots are not
                attrs = replace(attrs, useful=1.0 / routing.padded)
        elif isinstance(attrs, CollectiveAttrs):
            attrs = replace(attrs, bytes=max(out.nbytes, self.out[ins[0]].out.nbytes))
        return self._copy(node, ins, out=out, attrs=attrs)
