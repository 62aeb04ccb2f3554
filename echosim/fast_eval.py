"""A layout search's second evaluator: a layout's stages costed without building its pipeline split.

:func:`echosim.compiler.prepare` cuts the model into its pipeline stages and runs the stage-level passes
on each stage graph; lowering and the report then analyse every stage graph (its units, gradient
buckets, step tail, FLOPs, saved activations and working set). A search over pp and vpp meets
thousands of splits of one model, and their stage graphs differ in one number: how many of the
repeated layers a stage holds (``Graph.repeats``). Everything else (the embedding's ops on the first
stage, the output layer and loss on the last, the layer itself) is the same nodes.

So a stage is a *family* (the whole model after the graph-level passes, first or not, last or not, the
stage-level passes) at a *depth* (its layer count). This module builds the stage graphs of a family at
depths 1, 2 and 3 only (:func:`_template`: the nodes :class:`~echosim.passes.pipeline.PipelineParallel`
gives a stage of that shape) and lowers and analyses them as :func:`~echosim.compiler.lower` does. A
stage of depth ``c > 3`` is derived from depths 2 and 3:

* its units are depth 2's with the block's repeat set to ``c`` (a unit's timing is a function of its ops,
  not of the repeat), and its forward, backward and gradient-reduction overlap are computed from them by
  the functions lowering uses (:func:`~echosim.timeline.lower.repeated`,
  :func:`~echosim.timeline.lower.dp_tail_times`), so they equal lowering's to the last bit;
* the gradient buckets (per layer and the rest), pipeline transfers and working set do not depend on the
  depth (checked: depths 2 and 3 agree, else the layout falls back);
* the integers that count repeated layers (parameters, FLOPs, activation bytes, the ZeRO weight gather)
  are affine in the depth: ``x(c) = x(2) + (c - 2) * (x(3) - x(2))``, exactly;
* the optimizer step is rebuilt with the parameter count the optimizer pass would give it (checked against
  depths 2 and 3) and costed by the backend like any op.

A layout whose stages fall outside this (a plugin's pass, more stages than layers, CPU-offloaded layers, a
check above that fails) is evaluated by the full path; :data:`FALLBACKS` counts why. Tests compare both
paths with ``lower()`` layout by layout (tests/test_fast_eval.py).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from echosim.backends.base import program_dependent
from echosim.compiler import Joint
from echosim.ir.graph import Graph, Node
from echosim.ir.ops import CollectiveAttrs, OpKind, OptimizerAttrs
from echosim.ir.types import DType, TensorSpec
from echosim.memo import HashedKey, Memo
from echosim.passes.base import LayoutError, output_key, run_passes
from echosim.passes.flops import FlopCount, graph_flops
from echosim.passes.memory import MemoryBreakdown, activation_bytes, transient_bytes
from echosim.passes.pipeline import Stage, _classify, _stage_graph, _static, layer_split, leading_spill
from echosim.timeline.costed import StageCost
from echosim.timeline.lower import (
    _COSTS,
    BucketSeconds,
    Coster,
    dp_tail_times,
    lower_stage,
    repeated_total,
    share_nodes,
    share_units,
    stage_bucket_seconds,
    tail_parts,
    where_key,
)
from echosim.timeline.report import StageFigures, _expert_params, _sparse_tables, static_memory
from echosim.timeline.streams import UnitTiming

#: Why layouts left the fast path (reason -> layouts), since this process started or was last cleared.
FALLBACKS: Counter[str] = Counter()


class Fallback(Exception):
    """The fast path does not cover this layout exactly: evaluate it in full."""


@dataclass(frozen=True)
class Derived:
    """One stage (family at a depth) as lowering and the report read it."""

    cost: StageCost
    figures: StageFigures


@dataclass
class _Direct:
    """A stage graph built and analysed in full (depths 1-3, or the one stage of pp = 1)."""

    stage: Stage
    cost: StageCost
    flops: FlopCount
    params: int
    experts: int
    transient: int
    act: int
    blocks: int | None
    buckets: BucketSeconds
    grad_sync: bool
    step_end: list[Node]
    optimizer: list[Node]


# Keyed by the whole model's graph object (kept alive by the key), the stage's shape and depth, and what
# lowering and the report read (backend, placements, lowering options, saved activations; the state policies for
# derived stages' static memory only, so ZeRO 1 and 2 share their stage graphs and direct stages). Templates: one per
# captured graph after the graph-level passes, stage shape and depth (2.4k in a full-space GPT-3 search).
_BASES: Memo[Graph] = Memo("fast stage templates", maxsize=1 << 15)
# Sized so that a full-space search (GPT-3 175B on 1,024 A100: 24k stage graphs and 83k direct stages;
# Llama-3 70B on 512 H100: 28k and 95k) evicts none: layouts that share a stage lie far apart in the
# enumeration, so an evicted stage was built again (at 16k / 32k the Llama-3 search took 99 CPU s, not 83).
# Such a search peaks near 2.8 GB resident.
_STAGES: Memo[Stage] = Memo("fast stage graphs", maxsize=1 << 16)
_DIRECT: Memo[_Direct] = Memo("fast direct stages", maxsize=1 << 17)
_DERIVED: Memo[Derived] = Memo("fast derived stages", maxsize=1 << 17)
# The first stage graph built of each family and stage-level passes: the one whose units the others' are, when they
# run units on their own graphs (ZeRO-3 / FSDP) and append equal nodes in them (timeline.lower.share_units).
_UNIT_REFS: Memo[Stage] = Memo("fast stage unit references", maxsize=1 << 16)
# Depth 2 and 3 of a stage checked once (by the ids of their cached _Direct, verified on a hit).
_PAIRS: Memo[Any] = Memo("fast depth pairs", maxsize=1 << 16)
# A derived stage's cost and the figures its static memory is built from (:func:`_derive`), by what they read: its
# timing key, not the state policies (ZeRO 1 and 2 of a stage derive one cost; 9,824 of GPT-3's 38,452 derivations).
_DERIVED_COSTS: Memo[tuple[Any, ...]] = Memo("fast derived stage costs", maxsize=1 << 17)
# A layout's stage costs and figures (:func:`stages`) by what they are a function of: the model graph, the layers of
# each virtual stage and the lowering key. Layouts that differ only in what no stage lowering reads (schedules
# that split the backward alike: 1F1B and GPipe) get the same list: GPT-3's full space asks for 24,280 distinct
# ones in 39,972 layouts. Read, never changed, as a batch's full-path layouts share their lowered stages
# (layout_search._evaluate).
_LAYOUTS: Memo[tuple[list[StageCost], list[StageFigures]]] = Memo("fast layout stages", maxsize=1 << 16)


def stage_counts(joint: Joint) -> list[int]:
    """Layers of each virtual stage, as the pipeline split gives them (raises :class:`Fallback`)."""
    plan, graph = joint.plan, joint.graph
    n = plan.pp * plan.vpp
    if n == 1:
        return [next(iter(graph.repeats.values()), 1)]
    if len(graph.repeats) != 1:
        raise Fallback("no single repeated block")
    ((block, _),) = graph.repeats.items()
    cls = graph.derived(("pp-classes", block), lambda: _classify(graph, block))
    try:
        counts = layer_split(graph, n, plan.pp_balance, cls)
    except LayoutError:
        raise Fallback("pipeline split refused") from None
    if min(counts) < 1:
        raise Fallback("a stage without layers")
    if leading_spill(graph, n, plan.pp_balance):  # a stage after the first holds a leading layer: not its shape
        raise Fallback("leading layers beyond the first stage")
    return counts


def stages(joint: Joint) -> tuple[list[StageCost], list[StageFigures]]:
    """Every virtual stage's cost and graph figures, in virtual-stage order, each distinct (first, last, depth) once;
    or :class:`Fallback`.

    The costs are the shapes' own objects (virtual stages of one shape share one): their ``index`` and ``vstages``
    are not this layout's. What a search's brief figures and the schedule inputs read of a cost is its durations,
    units and graph, never those two, so they are told only to the layouts assembled in full (:func:`indexed`):
    copying each virtual stage's cost for every layout cost a million copies in GPT-3 175B's full space.
    """
    if not joint.own_passes_only:
        raise Fallback("a plugin's pass")
    if joint.facts.saved.offload_layers:
        raise Fallback("CPU-offloaded layers")
    if joint.graph.replay_layers or joint.graph.replay_every:  # the replayed layers depend on a stage's depth
        raise Fallback("full:N and full:every-N recompute only some layers of each stage")
    if joint.graph.replay_group:  # a stage's checkpoints and its replay's working set depend on its depth
        raise Fallback("full:uniform-N checkpoints chunks of a stage's layers")
    # the layout's own refusals, before any cache lookup: the keys below hold what a stage's lowering reads, not the
    # schedule's pairing or the backend's program dependence, so a layout sharing them with an earlier one would
    # otherwise take that one's stages (a DualPipe layout after the 1F1B one of the same split)
    if getattr(joint.options.schedule, "fused_pairs", False):
        raise Fallback("a schedule with its own placement and pairs (DualPipe) is timed by the full compile")
    if joint.options.ep_overlap:
        raise Fallback("EP all-to-all overlap (combined 1F1B) pairs chunks across pipeline ranks")
    if program_dependent(joint.backend):
        raise Fallback("a backend that prices ops by the whole stage program (a CPU rank's heap) needs each stage")
    counts = stage_counts(joint)
    # the stage-level passes and what lowering reads, hashed once for the layout's cache lookups (a pass hashes
    # field by field: hashing them on every lookup cost more than the lookups). The passes by what their graph
    # reads (``output_key``: ZeRO 1 and 2 build one stage graph); the stage's timing without the state policies,
    # which only its static memory reads (ZeRO 1 and 2 differ in them alone)
    passes = joint.stage_key
    if passes is None:  # kept on the joint: _prepare's copies of it (schedules, TP overlap) share its stage passes
        passes = joint.stage_key = HashedKey(tuple(output_key(p) for p in joint.stage_passes))
    timing = HashedKey((passes, *_timing_key(joint)))
    lowering = HashedKey((timing, joint.facts.state, joint.facts.expert_state))
    layout = (joint.graph, tuple(counts), lowering)  # every input of what follows (:data:`_LAYOUTS`)
    hit = _LAYOUTS.lookup(layout)
    if hit is not None:
        return hit
    last = len(counts) - 1
    derived: dict[tuple[bool, bool, int], Derived] = {}
    costs, figures = [], []
    for i, c in enumerate(counts):
        key = (i == 0, i == last, c)
        d = derived.get(key)
        if d is None:
            d = derived[key] = _stage(joint, key[0], key[1], key[2], last == 0, lowering)
        costs.append(d.cost)
        figures.append(d.figures)
    _LAYOUTS.put(layout, (costs, figures))
    return costs, figures


def indexed(costs: list[StageCost]) -> list[StageCost]:
    """:func:`stages`' costs told their virtual stage (``index``) and the virtual stages sharing their shape
    (``vstages``): what a costed graph and its report read. A shallow copy of each, as copy.copy makes, without its
    __reduce_ex__ round trip. Virtual stages of one shape share one cost object (and distinct shapes never do:
    each (first, last, depth) is its own :func:`_stage` entry), so the objects themselves tell the sharing."""
    shared: dict[int, tuple[int, ...]] = {}
    for i, c in enumerate(costs):
        shared[id(c)] = (*shared.get(id(c), ()), i)
    out = []
    for i, c in enumerate(costs):
        cost = object.__new__(StageCost)
        cost.__dict__.update(c.__dict__)
        cost.index, cost.vstages = i, shared[id(c)]
        out.append(cost)
    return out


def _timing_key(joint: Joint) -> tuple[Any, ...]:
    """What a stage's lowering and its graph figures read besides its graph (:class:`_Direct`): not the state
    policies (ZeRO's sharding of weights, gradients and optimizer state), which only static memory reads
    (:func:`_static_of`), but whether experts have their own (the expert parameter count is read then)."""
    o, f = joint.options, joint.facts
    return (joint.backend, where_key(joint.where), o.schedule.split_backward, o.tp, o.sp, o.tp_overlap,
            o.overlap_dp, f.expert_state is not None, f.saved, f.caching_allocator)  # fmt: skip


def _family(joint: Joint, first: bool, last: bool) -> tuple[Any, ...]:
    """The stage's family less its stage-level passes (in the ``timing`` key :func:`stages` builds)."""
    return (joint.graph, first, last)


def _stage(joint: Joint, first: bool, last: bool, count: int, alone: bool, lowering: HashedKey) -> Derived:
    key = (*_family(joint, first, last), count, lowering)
    hit = _DERIVED.lookup(key)
    if hit is not None:
        return hit
    timing = lowering.value[0]
    if alone or count <= 3:
        d = _direct(joint, first, last, count, alone, timing)
        out = Derived(d.cost, (d.flops, _static_of(d, joint), d.act, d.blocks))
    else:
        sc, flops, params, experts, transient, act, blocks = _DERIVED_COSTS.get(
            (*_family(joint, first, last), count, timing), lambda: _derive(joint, first, last, count, timing)
        )
        out = Derived(sc, (flops, static_memory(params, experts, (0, (0, 0)), transient, joint.facts), act, blocks))
    _DERIVED.put(key, out)
    return out


def _static_of(d: _Direct, joint: Joint) -> MemoryBreakdown:
    return static_memory(d.params, d.experts, (0, (0, 0)), d.transient, joint.facts)


def _template(joint: Joint, first: bool, last: bool, count: int, alone: bool, passes: HashedKey) -> Stage:
    """The stage graph of this shape and depth, after the stage-level passes. The graph before them is kept
    per (model graph, shape, depth), so what lowering and the report keep on it (units, saved activations,
    working set) is shared by every data-parallel degree and ZeRO stage."""
    graph = joint.graph
    base = graph if alone else _BASES.get((graph, first, last, count), lambda: _base_graph(graph, first, last, count))
    key = (base, passes)  # the stage-level passes (hashed once)
    hit = _STAGES.lookup(key)
    if hit is not None:
        return hit
    try:
        after = run_passes(base, joint.stage_passes, check=joint.checked, reuse=joint.reuse)
    except LayoutError:
        raise Fallback("a stage pass refused the stage") from None
    stage = Stage(0 if first else 1, after, count, base)
    if not alone:  # its units are another depth's when that depth's graph appended the same nodes in them
        family = (graph, first, last, passes)
        ref = _UNIT_REFS.lookup(family)
        if ref is None:
            _UNIT_REFS.put(family, stage)
        else:
            share_units(stage, ref)
    _STAGES.put(key, stage)
    return stage


def _base_graph(graph: Graph, first: bool, last: bool, count: int) -> Graph:
    """The nodes :class:`~echosim.passes.pipeline.PipelineParallel` gives a stage of this shape, ``count`` layers.

    The split builds a stage's nodes the same way whatever its layer count (only ``Graph.repeats`` differs),
    so one depth's graph is built and the others are copies of it, sharing its node objects and, with them,
    its units (:func:`~echosim.timeline.lower.share_nodes`)."""
    ((block, _),) = graph.repeats.items()
    if count != 1:
        ref = _BASES.get((graph, first, last, 1), lambda: _base_graph(graph, first, last, 1))
        g = ref.copy()
        g.repeats = {block: count}
        share_nodes(g, ref)
        return g
    cls = graph.derived(("pp-classes", block), lambda: _classify(graph, block))
    static = graph.derived("pp-static", lambda: _static(graph))
    keep = {"block"} | ({"pre"} if first else set()) | ({"post"} if last else set())
    members = {nid for nid, c in cls.items() if c in keep and nid not in static}
    # a recv/send's group size (pp) is read by nothing that costs or sizes a stage: 2 stands for any pp
    return _stage_graph(graph, members, static, 0 if first else 1, 2, {block: count})


def _direct(joint: Joint, first: bool, last: bool, count: int, alone: bool, timing: HashedKey) -> _Direct:
    """The stage graph of this shape and depth lowered and analysed, kept by what that reads (``timing``,
    :func:`stages`): one for ZeRO 1 and 2."""
    key = (*_family(joint, first, last), count, alone, timing)
    hit = _DIRECT.lookup(key)
    if hit is not None:
        return hit
    stage = _template(joint, first, last, count, alone, timing.value[0])
    g = stage.graph
    if g.derived("sparse-tables", lambda: _sparse_tables(g))[0]:
        raise Fallback("sparse embedding tables")
    cost = lower_stage(stage, joint.backend, joint.where, joint.options, ())
    d = _Direct(stage, cost, *_graph_reads(stage, joint))
    _DIRECT.put(key, d)
    return d


def _graph_reads(stage: Stage, joint: Joint) -> tuple[Any, ...]:
    """:class:`_Direct`'s fields after the stage's lowering: FLOPs, parameter counts, working set, saved activations,
    gradient buckets and step tail. A function of the stage graph, the saved-activation policy, the allocator, whether
    experts keep their own state, the backend and placements, kept on the graph as one value: a search lowers each
    stage graph again for every schedule split and TP overlap, which change none of them."""
    facts, g = joint.facts, stage.graph
    key = ("fast-direct-reads", stage.base, facts.saved, facts.caching_allocator, facts.expert_state is not None,
           joint.backend, where_key(joint.where))  # fmt: skip

    def compute() -> tuple[Any, ...]:
        transient = g.derived(("transient-bytes", facts.saved), lambda: transient_bytes(g, facts.saved, stage.base))
        act = g.derived(("activation-bytes", facts.saved), lambda: activation_bytes(g, facts.saved, stage.base))
        blocks = (
            g.derived(("activation-blocks", facts.saved), lambda: activation_bytes(g, facts.saved, stage.base, True))
            if facts.caching_allocator
            else None
        )
        grad_sync, step_end, optimizer = tail_parts(stage)
        buckets = stage_bucket_seconds(stage, joint.backend, joint.where)
        return (
            g.derived("flops", lambda: graph_flops(g, stage.base)), g.derived("param-count", g.param_count),
            g.derived("expert-params", lambda: _expert_params(g)) if facts.expert_state is not None else 0,
            transient, act, blocks, buckets, bool(grad_sync), step_end, optimizer,
        )  # fmt: skip

    return g.derived(key, compute)


def _affine(a: int, b: int, count: int) -> int:
    """``x(count)`` of an integer that is ``a`` at depth 2 and ``b`` at depth 3 and affine in the depth."""
    return a + (count - 2) * (b - a)


def _same_unit(a: UnitTiming, b: UnitTiming) -> bool:
    return a.duration == b.duration and a.critical_end == b.critical_end and a.busy == b.busy


def _unit_pairs(a: list[tuple[UnitTiming, int]], b: list[tuple[UnitTiming, int]]) -> list[tuple[UnitTiming, int, bool]]:
    """Depth 2's units, each marked if it is the block (every third unit from the second), whose repeat is the
    depth; checked against depth 3's."""
    if len(a) != len(b):
        raise Fallback("units differ with depth")
    out = []
    for k, ((ua, ka), (ub, kb)) in enumerate(zip(a, b, strict=True)):
        block = k % 3 == 1
        if not _same_unit(ua, ub) or (ka, kb) != ((2, 3) if block else (ka, ka)):
            raise Fallback("units differ with depth")
        out.append((ua, ka, block))
    return out


@dataclass(frozen=True)
class _Pair:
    """What :func:`_derive` reads of depths 2 and 3 of a stage, checked once per pair (a pair serves every
    depth of its shape that the splits of a search meet)."""

    a: _Direct
    b: _Direct
    fwd: list[tuple[UnitTiming, int, bool]]  # depth 2's units, the block's marked
    bwd: list[tuple[UnitTiming, int, bool]]
    # per step-end collective: (axis, None, the node, 0) priced as built, or (axis, node, bytes at 2, at 3) affine
    step_end: list[tuple[str, Node | None, Any, int]]
    optimizer: list[tuple[Node, int, int] | Node]  # how each optimizer step is built (:func:`_optimizer_check`)


def _pair(joint: Joint, a: _Direct, b: _Direct) -> _Pair:
    """:class:`_Pair` of depths 2 and 3 (or :class:`Fallback`), kept while both stay cached."""
    key = (id(a), id(b))
    hit = _PAIRS.lookup(key)
    if hit is not None and hit.a is a and hit.b is b:
        return hit
    ca, cb = a.cost, b.cost
    if (ca.p2p_fwd, ca.p2p_bwd, a.buckets, a.transient, a.grad_sync) != (
        cb.p2p_fwd, cb.p2p_bwd, b.buckets, b.transient, b.grad_sync
    ):  # fmt: skip
        raise Fallback("transfers, buckets or working set differ with depth")
    fwd, bwd = _unit_pairs(ca.fwd_units, cb.fwd_units), _unit_pairs(ca.bwd_units, cb.bwd_units)
    if len(bwd) == 3 and (ca.wgrad or cb.wgrad):
        raise Fallback("weight-gradient units outside the block")
    if len(a.step_end) != len(b.step_end):
        raise Fallback("step-end collectives differ with depth")
    step_end: list[Any] = []
    for na, nb in zip(a.step_end, b.step_end, strict=True):
        assert isinstance(na.attrs, CollectiveAttrs) and isinstance(nb.attrs, CollectiveAttrs)
        axis = na.attrs.axis.value
        if (na.op, na.attrs, na.out) == (nb.op, nb.attrs, nb.out):
            step_end.append((axis, None, na, 0))
        elif na.op is nb.op and replace(nb.attrs, bytes=na.attrs.bytes) == na.attrs:  # bytes grow with layers
            step_end.append((axis, na, na.attrs.bytes, nb.attrs.bytes))
        else:
            raise Fallback("a step-end collective changes with depth")
    if len(a.optimizer) != len(b.optimizer):
        raise Fallback("optimizer steps differ with depth")
    pa, pb = (a.params, a.experts), (b.params, b.experts)
    # a function of the two stage graphs (their optimizer steps and passes) and parameter counts: kept on depth 2's,
    # which every schedule and TP overlap of the stage shares (their pairs do not)
    optimizer = a.stage.graph.derived(
        ("optimizer-check", b.stage.graph, pa, pb),
        lambda: [_optimizer_check(joint, na, nb, pa, pb) for na, nb in zip(a.optimizer, b.optimizer, strict=True)],
    )
    out = _Pair(a, b, fwd, bwd, step_end, optimizer)
    _PAIRS.put(key, out)
    return out


def _derive(joint: Joint, first: bool, last: bool, count: int, timing: HashedKey) -> tuple[Any, ...]:
    """Depth ``count`` from depths 2 and 3 (module docstring): its cost, FLOPs, parameter elements (all, routed
    experts'), working set, activation bytes and allocator blocks, what the stage's figures are built from besides
    the state policies (:func:`_stage` adds its static memory)."""
    a, b = (_direct(joint, first, last, c, False, timing) for c in (2, 3))
    pair = _pair(joint, a, b)
    ca = a.cost
    fwd_units = [(u, count if block else k) for u, k, block in pair.fwd]
    bwd_units = [(u, count if block else k) for u, k, block in pair.bwd]
    fwd = repeated_total(fwd_units)
    bwd = repeated_total(bwd_units[:3])
    wgrad = repeated_total(bwd_units[3:]) if len(bwd_units) > 3 else 0.0
    overlap = joint.backend.overlap()
    dp = (
        dp_tail_times(a.buckets, bwd_units, joint.options.overlap_dp, overlap.compute_slowdown)
        if a.grad_sync
        else (0.0, 0.0, 0.0)
    )
    params = _affine(a.params, b.params, count)
    cost = Coster(a.stage.graph, joint.backend, joint.where)
    step_end: dict[str, float] = {}
    for axis, grows, x, y in pair.step_end:
        sec = cost(x) if grows is None else _collective(joint, grows, _affine(x, y, count))
        step_end[axis] = step_end.get(axis, 0.0) + sec
    experts = _affine(a.experts, b.experts, count)
    # kept on depth 2's stage graph, which every schedule and TP overlap of this stage shares (their pairs do not)
    opt = a.stage.graph.derived(
        ("optimizer-s-at", joint.backend, params, experts),
        lambda: sum(cost(_optimizer_node(how, (params, experts))) for how in pair.optimizer),
    )
    sc = StageCost(0, count, fwd, bwd, wgrad, fwd_units, bwd_units, ca.p2p_fwd, ca.p2p_bwd, dp[0], dp[1], step_end,
                   opt, ca.graph, (), ca.base, dp[2])  # fmt: skip
    flops = FlopCount(*(_affine(x, y, count) for x, y in zip(_flop_parts(a.flops), _flop_parts(b.flops), strict=True)))
    act = _affine(a.act, b.act, count)
    blocks = _affine(a.blocks, b.blocks, count) if a.blocks is not None and b.blocks is not None else None
    return sc, flops, params, experts, a.transient, act, blocks


def _flop_parts(f: FlopCount) -> tuple[int, int, int, int]:
    return (f.forward, f.backward, f.recompute, f.overhead)


def _collective(joint: Joint, node: Node, nbytes: int) -> float:
    """:class:`~echosim.timeline.lower.Coster`'s price of a collective of ``nbytes`` on ``node``'s axis."""
    assert isinstance(node.attrs, CollectiveAttrs)
    if node.attrs.size <= 1:
        return 0.0
    if node.op is OpKind.ALL_TO_ALL and node.attrs.top_k:
        raise Fallback("an expert dispatch in the step tail")
    if node.attrs.host_bytes:
        raise Fallback("a collective fed from host memory in the step tail")
    backend, kind, where = joint.backend, node.op, joint.where[node.attrs.axis]
    return _COSTS.get((backend, kind, nbytes, where), lambda: backend.collective_time_s(kind, nbytes, where))


def _optimizer_check(
    joint: Joint, a: Node, b: Node, pa: tuple[int, int], pb: tuple[int, int]
) -> tuple[Node, int, int] | Node:
    """How depth ``c``'s optimizer step is built from depth 2's (``a``) and 3's (``b``): ``a`` itself when they are
    equal, else (``a``, shard, expert shard), the optimizer pass's parameter count over its shards, checked
    against both (``pa``, ``pb``: their parameter elements, of them routed experts')."""
    if a == b:
        return a
    found = next((p for p in joint.stage_passes if getattr(p, "name", "") == "optimizer"), None)
    if found is None or not isinstance(a.attrs, OptimizerAttrs):
        raise Fallback("an optimizer step of another kind")
    shard, expert_shard = found.shard, getattr(found, "expert_shard", 0) or found.shard
    if _built(a, shard, expert_shard, pa) != a or replace(_built(a, shard, expert_shard, pb), id=b.id,
                                                          inputs=b.inputs) != b:  # fmt: skip
        raise Fallback("the optimizer step is not the parameter count over its shards")
    return (a, shard, expert_shard)


def _optimizer_node(how: tuple[Node, int, int] | Node, params: tuple[int, int]) -> Node:
    """The optimizer step for ``params`` (parameter elements, of them routed experts') (:func:`_optimizer_check`)."""
    return how if isinstance(how, Node) else _built(*how, params)


def _built(a: Node, shard: int, expert_shard: int, counts: tuple[int, int]) -> Node:
    """``a`` as the optimizer pass builds it for ``counts`` parameter elements (of them routed experts')."""
    total, experts = counts
    n = math.ceil((total - experts) / shard) + math.ceil(experts / expert_shard)
    assert isinstance(a.attrs, OptimizerAttrs)
    return replace(a, out=TensorSpec((max(n, 1),), DType.FP32), attrs=replace(a.attrs, params=n))


__all__ = ["FALLBACKS", "Derived", "Fallback", "stage_counts", "stages"]
