"""The search's fast evaluator (stages derived from stage graphs of depth 1-3, no pipeline split per layout)
gives a full compile's figures: seeded samples across every dimension, layout by layout, exactly."""

from __future__ import annotations

from typing import Any

import pytest
from layout_samples import drawn, small_moe

from echosim import fast_eval, memo
from echosim.layout_search import _evaluate_batch, evaluate, search
from echosim.plan import Cluster, Plan


def _assert_fast_equals_lower(model: object, plans: list[Plan], cluster: Cluster) -> None:
    memo.clear_all()
    fast_eval.FALLBACKS.clear()
    got = _evaluate_batch(model, plans, cluster, 1.0, fast=True)
    assert not fast_eval.FALLBACKS, fast_eval.FALLBACKS  # every layout here is one the fast path covers
    memo.clear_all()
    for g, plan in zip(got, plans, strict=True):
        want = evaluate(model, plan, cluster)  # lower(): what `echosim compile` reports
        assert g.as_dict() == want.as_dict(), plan
        assert g.breakdown == want.breakdown, plan


@pytest.mark.parametrize(
    ("model", "devices", "seed"),
    [
        ("gpt3-350m", 16, 5),  # 24 layers: pp up to 16, vpp up to 4, so depths 1 to 24 (derived from 4 on)
        pytest.param("moe", 16, 3, marks=pytest.mark.slow),
        pytest.param("gpt3-125m", 8, 11, marks=pytest.mark.slow),
    ],
)
def test_fast_figures_equal_compile_on_a_seeded_sample_of_the_whole_space(model: str, devices: int, seed: int) -> None:
    """Every dimension (tp, pp, dp, cp, ep, vpp, sp, ZeRO 0-3, micro-batch, recompute, four schedules,
    tp-overlap), 40 layouts drawn at random: the fast path's figures equal one cold ``lower()`` each."""
    arch: object = small_moe() if model == "moe" else model
    cluster = Cluster("h100-sxm", devices)
    plans = drawn(arch, Plan(global_batch=32), cluster, 40, seed)
    assert {p.zero for p in plans} == {0, 1, 2, 3} and len({p.pp for p in plans}) >= 3
    assert any(p.pp > 1 and 24 // (p.pp * p.vpp) > 3 for p in plans) or model != "gpt3-350m"  # a derived depth
    _assert_fast_equals_lower(arch, plans, cluster)


def test_fast_figures_equal_compile_with_context_parallel_and_one_data_parallel_rank() -> None:
    """dp = 1, cp > 1: the gradient reduction (and ZeRO's sharding) over the cp ranks the stage-level passes add
    is what the fast path derives too, at every ZeRO stage and pipeline depth."""
    cluster = Cluster("h100-sxm", 8)
    plans = [Plan(tp=tp, pp=pp, dp=1, cp=8 // (tp * pp), zero=zero, global_batch=4)
             for tp, pp in ((1, 1), (2, 1), (1, 2), (2, 2), (1, 4)) for zero in (0, 1, 3)]  # fmt: skip
    _assert_fast_equals_lower("gpt3-350m", plans, cluster)


def test_deep_stages_are_derived_not_built() -> None:
    """A 24-layer model split 2, 3, 4, 6 and 8 ways builds stage graphs of depths 1-3 only."""
    cluster = Cluster("h100-sxm", 8)
    plans = [Plan(pp=pp, dp=8 // pp, global_batch=16) for pp in (2, 4, 8)]
    memo.clear_all()
    _evaluate_batch("gpt3-350m", plans, cluster, 1.0, fast=True)
    depths = {stage.layers for stage in fast_eval._STAGES._data.values()}
    assert depths <= {1, 2, 3}
    _assert_fast_equals_lower("gpt3-350m", plans, cluster)


def test_layouts_outside_the_fast_path_fall_back_and_still_equal_compile() -> None:
    """CPU-offloaded layers (their saved bytes are not affine in the depth) take the full path, counted."""
    cluster = Cluster("h100-sxm", 8)
    plans = [Plan(pp=2, dp=4, global_batch=16, offload_layers=2)]
    memo.clear_all()
    fast_eval.FALLBACKS.clear()
    got = _evaluate_batch("gpt3-350m", plans, cluster, 1.0, fast=True)
    assert fast_eval.FALLBACKS == {"CPU-offloaded layers": 1}
    memo.clear_all()
    assert got[0].as_dict() == evaluate("gpt3-350m", plans[0], cluster).as_dict()


def test_search_reports_the_full_paths_figures_for_its_top_layouts() -> None:
    """A search (fast path on) and the same search on the full path rank and report identically."""
    cluster = Cluster("h100-sxm", 8)
    space = {"tp": (1, 2), "pp": (1, 2, 4), "zero": (0, 1, 3), "mb": (1, 2), "recompute": ("none", "full")}
    memo.clear_all()
    fast = search("gpt3-350m", Plan(global_batch=16), cluster, space=space)
    memo.clear_all()
    full = search("gpt3-350m", Plan(global_batch=16), cluster, space=space, fast=False)
    assert [e.as_dict() for e in fast.evaluated] == [e.as_dict() for e in full.evaluated]


def test_stage_depths_share_their_units_exactly() -> None:
    """Depths 2 and 3 of a stage shape are copies of depth 1's graph (the same node objects): their units are
    depth 1's with the block's repeat changed, and equal the units an analysis of each graph on its own gives."""
    from echosim.timeline.lower import _unit_parts, share_nodes, unit_parts

    cluster = Cluster("h100-sxm", 8)
    plans = [Plan(pp=pp, dp=8 // pp, global_batch=16, zero=z) for pp in (2, 4, 8) for z in (0, 3)]
    memo.clear_all()
    _evaluate_batch("gpt3-350m", plans, cluster, 1.0, fast=True)
    graphs = list(fast_eval._BASES._data.values())
    assert {next(iter(g.repeats.values())) for g in graphs} >= {1, 2, 3}
    for g in graphs:
        for split_w in (False, True):
            got, want = unit_parts(g, split_w), _unit_parts(g, split_w)
            assert [[(p.nodes, p.repeat, p.key, p.axes) for p in kind] for kind in got] == [
                [(p.nodes, p.repeat, p.key, p.axes) for p in kind] for kind in want
            ]
    other = graphs[0].copy()
    other.replace(next(iter(other)).id, name="renamed")
    with pytest.raises(ValueError, match="differ in more than their repeat counts"):
        share_nodes(other, graphs[0])


def test_stage_depths_share_their_timed_units_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    """A graph holding depth 1's nodes (depths 2 and 3) takes depth 1's timed units, the very timing objects,
    with its own repeats (timed once for the depths), equal to the units it times on its own."""
    from dataclasses import replace

    from echosim import plugins
    from echosim.compiler import prepare_joint
    from echosim.ir.graph import SAME_NODES
    from echosim.timeline import lower
    from echosim.timeline.lower import time_units, timed_units

    cluster = Cluster("h100-sxm", 8)
    plans = [Plan(pp=pp, dp=8 // pp, global_batch=16, zero=z) for pp in (2, 4, 8) for z in (0, 1)]
    memo.clear_all()
    _evaluate_batch("gpt3-350m", plans, cluster, 1.0, fast=True)
    j = prepare_joint("gpt3-350m", Plan(pp=2, dp=4, global_batch=16), cluster)
    schedules = plugins.get_registry().schedules
    timed_on: list[Any] = []
    monkeypatch.setattr(lower, "time_units", lambda graph, *a: timed_on.append(graph) or time_units(graph, *a))
    shared = 0
    for g in fast_eval._BASES._data.values():
        ref = g.derived(SAME_NODES, lambda: g)  # noqa: B023
        if ref is g:
            continue
        for x in (g, ref):  # timed afresh below
            for k in [k for k in x._derived if isinstance(k, tuple) and k[0] == "timed-units"]:
                del x._derived[k]
        for name in ("1f1b", "zb-h1"):  # the backward split or not: other units
            opts = replace(j.options, schedule=schedules[name].value)
            timed_on.clear()
            got = timed_units(g, j.backend, j.where, opts)
            assert timed_on == [ref]  # timed on depth 1's graph only
            theirs = timed_units(ref, j.backend, j.where, opts)
            own = time_units(g, j.backend, j.where, opts)  # this graph's units timed on their own
            assert all(
                x is y for kg, kt in zip(got, theirs, strict=True) for (x, _), (y, _) in zip(kg, kt, strict=True)
            )
            assert [[(u.duration, u.critical_end, u.busy, k) for u, k in kind] for kind in got] == [
                [(u.duration, u.critical_end, u.busy, k) for u, k in kind] for kind in own
            ]
            assert [k for kind in got for _, k in kind] != [k for kind in theirs for _, k in kind]  # its own repeats
            shared += 1
    assert shared >= 4


def test_stage_depths_share_their_working_set_terms_exactly() -> None:
    """Depths 1-3 of a stage shape hold the same nodes: the working set's terms and backward's freeing schedule
    (which read no repeat count) are depth 1's, equal to each depth's own walk, and so is every stage graph's
    working set (ZeRO 0-3, recompute policies with replayed values)."""
    from echosim.ir.graph import SAME_NODES
    from echosim.passes.memory import _freed_schedule, _working_terms, transient_bytes

    cluster = Cluster("h100-sxm", 8)
    plans = [Plan(pp=pp, dp=8 // pp, global_batch=16, zero=z, recompute=r)
             for pp in (2, 4, 8) for z in (0, 3) for r in ("none", "full", "selective")]  # fmt: skip
    memo.clear_all()
    _evaluate_batch("gpt3-350m", plans, cluster, 1.0, fast=True)
    stages = [s for s in fast_eval._STAGES._data.values() if s.base is not None and s.graph is not s.base]
    shared = 0
    for stage in stages:
        base = stage.base
        ref = base.derived(SAME_NODES, lambda: base)  # noqa: B023
        for saved in {k[1] for k in base._derived if isinstance(k, tuple) and k[0] == "working-terms"} | {
            k[1] for k in ref._derived if isinstance(k, tuple) and k[0] == "working-terms"
        }:
            own = base.copy()  # no link, no kept analyses: walked on its own
            assert _working_terms(own, list(own), saved) == _working_terms(ref, list(ref), saved)
            assert _freed_schedule(own, saved) == _freed_schedule(ref, saved)
            assert transient_bytes(stage.graph, saved, base) == transient_bytes(stage.graph.copy(), saved)
            shared += ref is not base
    assert shared >= 10
    # kept on the depth-1 graph by the added nodes: stage graphs of depths 2 and 3 (whose optimizer steps differ)
    # share an entry, and each was checked against its own walk above
    refs = {id(r): r for s in stages if (r := s.base.derived(SAME_NODES, lambda: None)) is not None}
    entries = sum(len(v[-1]) for r in refs.values() for k, v in r._derived.items()
                  if isinstance(k, tuple) and k[0] == "transient-by-added")  # fmt: skip
    asked = sum(1 for s in {id(s.graph): s for s in stages}.values() for k in s.graph._derived
                if isinstance(k, tuple) and k[0] == "transient-bytes")  # fmt: skip
    assert 0 < entries < asked


def test_working_set_kept_by_added_nodes_tells_their_sizes_apart_but_not_the_optimizer_step() -> None:
    """A stage graph's working set is kept on its depth-1 graph by the nodes the stage passes added: a reduce-scatter
    of another group size (another working set) is another entry, an optimizer step of another size is not; each
    equals a walk of the whole graph."""
    from echosim.ir import DType, OpKind, Phase, TensorSpec
    from echosim.ir.graph import SAME_NODES
    from echosim.ir.ops import Axis, CollectiveAttrs, OptimizerAttrs, Role
    from echosim.passes.memory import SavedPolicy, transient_bytes

    memo.clear_all()
    _evaluate_batch("gpt3-350m", [Plan(pp=2, dp=4, global_batch=16)], Cluster("h100-sxm", 8), 1.0, fast=True)
    stage = next(s for s in fast_eval._STAGES._data.values()
                 if s.base is not None and s.base.derived(SAME_NODES, lambda: None) is not None)  # fmt: skip
    base, saved = stage.base, SavedPolicy()
    grads = list(base.grads.values())
    big = 64 * max(n.out.nbytes for n in base)  # larger than any op's working set: it sets the peak

    def variant(size: int, params: int) -> int:
        g = base.copy()
        spec = TensorSpec((big // 4,), DType.FP32)
        g.add(OpKind.REDUCE_SCATTER, grads, spec, CollectiveAttrs(Axis.DP, size, big, Role.GRAD_SYNC),
              phase=Phase.BACKWARD, name="rs")  # fmt: skip
        g.add(OpKind.OPTIMIZER_UPDATE, grads, TensorSpec((params,), DType.FP32), OptimizerAttrs("adam", params, 16),
              phase=Phase.OPTIMIZER, name="optimizer.step")  # fmt: skip
        got = transient_bytes(g, saved, base)
        assert got == transient_bytes(g.copy(), saved)  # a copy has no base: its whole walk
        return got

    kept = base.derived(SAME_NODES, lambda: base).derived(("transient-by-added", saved), dict)
    before = len(kept)
    assert variant(2, 100) != variant(8, 100)
    assert variant(2, 100) == variant(2, 300)
    assert len(kept) == before + 2


@pytest.mark.parametrize("model", ["gpt3-350m", "moe"])
def test_zero3_units_extend_the_units_before_the_stage_passes_exactly(model: str) -> None:
    """A ZeRO-3 stage graph's units (its weight gathers and gradient reduce-scatters run inside them) are built
    from the units of its graph before the stage-level passes plus the appended collectives: the same nodes,
    repeats, axes and key content as splitting the whole graph, with and without the backward split."""
    from echosim.ir.graph import SAME_NODES
    from echosim.timeline.lower import _EXTENDS, _unit_graph, _unit_parts, unit_parts

    arch: object = small_moe() if model == "moe" else model
    cluster = Cluster("h100-sxm", 16)
    plans = [
        Plan(pp=pp, dp=16 // (pp * cp * ep), cp=cp, ep=ep, global_batch=32, zero=3)
        for pp in (1, 2, 4)
        for cp in (1, 2)
        for ep in ((1, 2) if model == "moe" else (1,))
    ]
    memo.clear_all()
    _evaluate_batch(arch, plans, cluster, 1.0, fast=True)
    stages = [s for s in fast_eval._STAGES._data.values() if s.base is not None and s.graph is not s.base]
    extended = from_depth_one = 0
    for stage in stages:
        if _unit_graph(stage) is not stage.graph or stage.graph.derived(_EXTENDS, lambda: None) is None:
            continue
        extended += 1
        for split_w in (False, True):
            got, want = unit_parts(stage.graph, split_w), _unit_parts(stage.graph, split_w)
            assert [[(p.nodes, p.repeat, p.key.flat(), p.axes) for p in kind] for kind in got] == [
                [(p.nodes, p.repeat, p.key.flat(), p.axes) for p in kind] for kind in want
            ]
            # a base at depth 2 or 3 holds depth 1's nodes: its split (descendants of the block) is depth 1's
            ref = stage.base._derived.get(SAME_NODES, (None, stage.base))[1]
            from_depth_one += ref is not stage.base
    assert extended >= 6
    assert from_depth_one >= 2


def test_stage_graph_flops_are_the_base_graphs_plus_the_appended_nodes() -> None:
    """A stage graph's FLOPs, from its graph before the stage-level passes plus what they appended, equal a walk
    of the whole graph (ZeRO 0-3, cp, several depths), integer for integer."""
    from echosim.passes.flops import graph_flops

    cluster = Cluster("h100-sxm", 16)
    plans = [Plan(pp=pp, dp=16 // (pp * cp), cp=cp, global_batch=32, zero=z)
             for pp in (1, 2, 4) for cp in (1, 2) for z in (0, 1, 3)]  # fmt: skip
    memo.clear_all()
    _evaluate_batch("gpt3-350m", plans, cluster, 1.0, fast=True)
    stages = [s for s in fast_eval._STAGES._data.values() if s.base is not None and s.graph is not s.base]
    assert len(stages) >= 10
    for stage in stages:
        assert graph_flops(stage.graph, stage.base) == graph_flops(stage.graph)
    # experts padded to capacity: the base's non-model products (FlopCount.overhead) are kept too
    padded = [Plan(pp=pp, dp=16 // pp, ep=2, global_batch=32, zero=z, framework="maxtext", moe_capacity_factor=1.25)
              for pp in (1, 2) for z in (0, 1)]  # fmt: skip
    memo.clear_all()
    _evaluate_batch(small_moe(), padded, cluster, 1.0, fast=True)
    stages = [s for s in fast_eval._STAGES._data.values() if s.base is not None and s.graph is not s.base]
    assert stages and all(graph_flops(s.graph).overhead > 0 for s in stages)
    for stage in stages:
        assert graph_flops(stage.graph, stage.base) == graph_flops(stage.graph)


def test_overlap_with_a_streams_spans_equals_the_sum_over_all_of_them_to_the_bit() -> None:
    """The dilation's overlap sum skips, by bisection, the spans of one stream that lie outside a window: the
    same float as summing over every span (sorted and disjoint spans), and the plain sum where they overlap."""
    import random

    from echosim.timeline.streams import _Spans

    rng = random.Random(7)
    for ordered in (True, False):
        for _ in range(200):
            spans, t = [], 0.0
            for _ in range(rng.randint(0, 30)):
                t += rng.choice([0.0, rng.random() * 1e-3])
                d = rng.random() * 1e-3 + 1e-9
                spans.append((t, t + d))
                t += d
            if not ordered:
                rng.shuffle(spans)
            s = rng.random() * max(t, 1e-3)
            e = s + rng.choice([rng.random() * 1e-3, rng.random() * t])
            want = sum(max(0.0, min(e, b_e) - max(s, b_s)) for b_s, b_e in spans)
            assert _Spans(spans).overlap(s, e) == want


def test_a_units_period_is_kept_and_forgotten_when_its_busy_time_grows() -> None:
    from echosim.timeline.streams import UnitTiming

    u = UnitTiming(duration=3.0, critical_end=2.0)
    u.add_busy("comm.dp", 1.0)
    assert u.period == 2.0
    u.add_busy("comm.dp", 2.5)
    assert u.period == 3.5
    u.critical_end = 4.0
    assert u.period == 4.0


def test_a_units_communication_split_is_kept_and_forgotten_when_its_busy_time_grows() -> None:
    """:attr:`UnitTiming.comm_split` (what the search's exposed communication reads) sums as the report's
    breakdown does, is kept once read, and is recomputed after :meth:`add_busy`."""
    from echosim.timeline.streams import UnitTiming

    u = UnitTiming(duration=3.0, critical_end=2.0)
    u.add_busy("comm.tp", 0.1)
    u.add_busy("compute.matmul", 1.5)
    u.add_busy("comm.dp", 0.2)
    assert u.comm_split == ((("comm.tp", 0.1), ("comm.dp", 0.2)), sum([0.1, 0.2]), 1.5)
    assert u.comm_split is u.comm_split
    u.add_busy("comm.dp", 1.0)
    u.add_busy("compute.attention", 0.5)
    assert u.comm_split == ((("comm.tp", 0.1), ("comm.dp", 0.2 + 1.0)), 0.1 + (0.2 + 1.0), 1.5 + 0.5)


def test_zero3_units_resume_their_layers_first_pass_exactly_and_by_placement() -> None:
    """A ZeRO-3 unit's first scheduling pass resumes the pass of the layer unit it extends (kept on that unit):
    its timing equals a simulation from scratch field for field, for TP placed in one node or across two and
    with and without TP overlap, in that order, so a pass kept for one placement is never read for another."""
    from dataclasses import replace

    from echosim.compiler import prepare_joint
    from echosim.ir.ops import Axis
    from echosim.timeline.lower import Coster, _unit_graph, _UnitPart, time_units, unit_parts
    from echosim.timeline.streams import pipelined_edges, simulate_unit

    cluster = Cluster("h100-sxm", 16)
    plans = [Plan(tp=2, pp=pp, dp=8 // pp, global_batch=32, zero=3) for pp in (1, 2)]
    memo.clear_all()
    _evaluate_batch("gpt3-350m", plans, cluster, 1.0, fast=True)
    joint = prepare_joint("gpt3-350m", plans[1], cluster)
    tp = joint.where[Axis.TP]
    across = replace(tp, nodes=2, per_node=1)  # the same group split over two nodes: slower TP collectives
    stages = [s for s in fast_eval._STAGES._data.values() if s.base is not None and _unit_graph(s) is s.graph]
    resumed = 0
    for stage in stages:
        g = stage.graph
        for where in (joint.where, {**joint.where, Axis.TP: across}):
            for tp_overlap in (False, True):
                options = replace(joint.options, tp_overlap=tp_overlap)
                memo.clear_all()  # the unit timings, not the first passes kept on the units
                got = time_units(g, joint.backend, where, options)
                cost = Coster(g, joint.backend, where)
                for kind, timed in zip(unit_parts(g, False), got, strict=True):
                    for part, (timing, _) in zip(kind, timed, strict=True):
                        assert isinstance(part, _UnitPart)
                        resumed += part.prefix is not None
                        edges = pipelined_edges(part.nodes) if tp_overlap else None
                        want = simulate_unit(g, part.nodes, cost, joint.backend.overlap(), edges)
                        assert (timing.duration, timing.busy, timing.critical_end, timing.events) == (
                            want.duration, want.busy, want.critical_end, want.events
                        )  # fmt: skip
    assert resumed >= 8


def test_units_without_chunked_edges_share_one_simulation_with_and_without_tp_overlap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A unit with no matmul next to a TP collective times the same with TP overlap: the second lowering of a stage
    graph (TP overlap on) simulates only the units TP overlap chunks, and every unit equals a simulation from
    scratch with its pipelined edges (ZeRO 0 and 3, whose units extend the layer's)."""
    from dataclasses import replace

    from echosim.compiler import prepare_joint
    from echosim.timeline import lower
    from echosim.timeline.lower import Coster, _unit_graph, time_units, unit_parts
    from echosim.timeline.streams import pipelined_edges, simulate_unit

    cluster = Cluster("h100-sxm", 16)
    plans = [Plan(tp=2, pp=2, dp=4, global_batch=32, zero=z) for z in (0, 3)]
    memo.clear_all()
    _evaluate_batch("gpt3-350m", plans, cluster, 1.0, fast=True)
    joint = prepare_joint("gpt3-350m", plans[1], cluster)
    graphs = list(dict.fromkeys(_unit_graph(s) for s in fast_eval._STAGES._data.values()))
    memo.clear_all()
    simulated = [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        simulated[0] += 1
        return simulate_unit(*args, **kwargs)

    monkeypatch.setattr(lower, "simulate_unit", counted)
    plain = chunked = 0
    for g in graphs:
        parts = [p for kind in unit_parts(g, False) for p in kind]
        edges = [pipelined_edges(p.nodes) for p in parts]
        for first in (False, True):  # either lowering first: the other reuses its timings of the unchunked units
            memo.clear_all()
            for tp_overlap in (first, not first):
                options = replace(joint.options, tp_overlap=tp_overlap)
                before = simulated[0]
                got = [t for kind in time_units(g, joint.backend, joint.where, options) for t, _ in kind]
                cost = Coster(g, joint.backend, joint.where)
                for part, timing, e in zip(parts, got, edges, strict=True):
                    want = simulate_unit(g, part.nodes, cost, joint.backend.overlap(), e if tp_overlap else None)
                    assert (timing.duration, timing.busy, timing.critical_end, timing.events, timing.chunked) == (
                        want.duration, want.busy, want.critical_end, want.events, want.chunked
                    )  # fmt: skip
            # the second lowering simulated only the units TP overlap chunks
            assert simulated[0] - before <= sum(bool(e) for e in edges)
        plain += sum(not e for e in edges)
        chunked += sum(bool(e) for e in edges)
    assert plain and chunked  # both kinds met


def test_a_derived_stages_optimizer_step_is_priced_once_for_every_schedule_and_tp_overlap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Layouts that differ in schedule or TP overlap alone share their stage graphs but not their lowerings: the
    optimizer step of a derived depth is checked against depths 2 and 3, built and priced for the first of them only,
    and every layout's figures equal a full compile's."""
    calls = [0]

    def counted(f: Any) -> Any:
        def call(*args: Any) -> Any:
            calls[0] += 1
            return f(*args)

        return call

    monkeypatch.setattr(fast_eval, "_optimizer_node", counted(fast_eval._optimizer_node))
    monkeypatch.setattr(fast_eval, "_optimizer_check", counted(fast_eval._optimizer_check))
    cluster = Cluster("h100-sxm", 64)
    plans = [
        Plan(tp=2, pp=4, dp=8, global_batch=64, zero=1, schedule=s, tp_overlap=o)
        for s in ("1f1b", "zb-h1")
        for o in (False, True)
    ]  # 24 layers: stages of depth 6, derived from depths 2 and 3
    memo.clear_all()
    counts = []
    for plan in plans:
        before = calls[0]
        (fast,) = _evaluate_batch("gpt3-1.3b", [plan], cluster, 1.0, fast=True)
        counts.append(calls[0] - before)
        assert fast.step_time_s == evaluate("gpt3-1.3b", plan, cluster).step_time_s
    assert counts[0] > 0 and counts[1:] == [0, 0, 0]


def test_zero_1_and_2_share_their_stage_graphs_and_lowerings_not_their_memory() -> None:
    """ZeRO 1 and 2 build one stage graph (the same reduce-scatter buckets and step-end all-gather) and lower it
    once; only the state policy differs (ZeRO 2 shards the gradients too: less memory), and each layout's figures
    equal a full compile's."""
    cluster = Cluster("h100-sxm", 64)
    plans = [Plan(tp=2, pp=4, dp=8, global_batch=64, zero=z) for z in (1, 2)]  # depth 6: derived from 2 and 3
    memo.clear_all()
    one = _evaluate_batch("gpt3-1.3b", plans[:1], cluster, 1.0, fast=True)
    stages, direct = len(fast_eval._STAGES), len(fast_eval._DIRECT)
    two = _evaluate_batch("gpt3-1.3b", plans[1:], cluster, 1.0, fast=True)
    assert (len(fast_eval._STAGES), len(fast_eval._DIRECT)) == (stages, direct)
    assert one[0].step_time_s == two[0].step_time_s and one[0].peak_bytes > two[0].peak_bytes
    _assert_fast_equals_lower("gpt3-1.3b", plans, cluster)


def test_zero3_stage_depths_share_their_units_and_timings_exactly() -> None:
    """ZeRO-3 stage graphs of one shape and passes at depths 2 and 3 append equal per-layer gathers and
    reduce-scatters (new node objects): one takes the other's units and timed units with its own repeats, equal
    to its own split and timing; a graph whose appended in-unit node differs is not told so."""
    from dataclasses import replace

    from echosim import plugins
    from echosim.compiler import prepare_joint
    from echosim.ir.ops import CollectiveAttrs
    from echosim.passes.memory import added_nodes
    from echosim.passes.pipeline import Stage
    from echosim.timeline.lower import (
        SAME_UNITS,
        _in_units,
        _unit_parts,
        share_units,
        time_units,
        timed_units,
        unit_parts,
    )

    cluster = Cluster("h100-sxm", 16)
    plans = [Plan(pp=pp, dp=16 // pp, global_batch=32, zero=3) for pp in (4, 8)]
    memo.clear_all()
    _evaluate_batch("gpt3-350m", plans, cluster, 1.0, fast=True)
    j = prepare_joint("gpt3-350m", Plan(pp=4, dp=4, global_batch=32, zero=3), cluster)
    schedules = plugins.get_registry().schedules
    shared = 0
    for stage in fast_eval._STAGES._data.values():
        g = stage.graph
        ref = g.derived(SAME_UNITS, lambda: g)  # noqa: B023
        if ref is g:
            continue
        assert ref.repeats != g.repeats
        for split_w, name in ((False, "1f1b"), (True, "zb-h1")):
            own_parts = [[(p.nodes, p.repeat, p.key.flat(), p.axes) for p in kind] for kind in _unit_parts(g, split_w)]
            kept_parts = [[(p.nodes, p.repeat, p.key.flat(), p.axes) for p in kind] for kind in unit_parts(g, split_w)]
            assert kept_parts == own_parts
            opts = replace(j.options, schedule=schedules[name].value)
            kept = timed_units(g, j.backend, j.where, opts)
            own = time_units(g, j.backend, j.where, opts)  # timed on its own graph
            assert [[(u.duration, u.critical_end, u.busy, u.events, u.nodes, k) for u, k in kind] for kind in kept] == [
                [(u.duration, u.critical_end, u.busy, u.events, u.nodes, k) for u, k in kind] for kind in own
            ]
        shared += 1
        # the same graph with one appended in-unit collective's bytes changed is not the reference's
        nodes = added_nodes(g, stage.base)
        assert nodes is not None
        n = next(n for n in nodes if _in_units(n) and isinstance(n.attrs, CollectiveAttrs))
        other = g.copy()
        other.replace(n.id, attrs=replace(n.attrs, bytes=n.attrs.bytes + 2))
        refs = [s for s in fast_eval._STAGES._data.values() if s.graph is ref]
        assert not share_units(Stage(stage.index, other, stage.layers, stage.base), refs[0])
    assert shared >= 2


def test_a_known_stage_graph_relowered_reads_its_tail_and_graph_figures_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Layouts that differ only in the schedule split and TP overlap lower the same stage graphs again (their units
    differ); the step tail, buckets, sends and graph figures of a stage graph are read once (one cached value each),
    and the figures still equal a full compile's."""
    from echosim.timeline import lower

    calls = {"sends": 0, "reads": 0}
    p2p, tail_parts = lower.p2p_seconds, fast_eval.tail_parts

    def counted_sends(*args: Any) -> Any:
        calls["sends"] += 1
        return p2p(*args)

    def counted_parts(stage: Any) -> Any:
        calls["reads"] += 1
        return tail_parts(stage)

    monkeypatch.setattr(lower, "p2p_seconds", counted_sends)
    monkeypatch.setattr(fast_eval, "tail_parts", counted_parts)
    cluster = Cluster("h100-sxm", 8)
    plans = [Plan(tp=2, pp=2, dp=2, zero=zero, schedule=schedule, tp_overlap=overlap, global_batch=16)
             for zero in (0, 3) for schedule in ("1f1b", "zb-h1") for overlap in (False, True)]  # fmt: skip
    memo.clear_all()
    _evaluate_batch("gpt3-350m", plans, cluster, 1.0, fast=True)
    graphs = len(fast_eval._STAGES)
    assert len(fast_eval._DIRECT) == 4 * graphs  # each stage graph lowered for 2 splits x 2 TP overlaps
    assert calls == {"sends": 2 * graphs, "reads": graphs}  # forward and backward sends priced once per graph
    monkeypatch.undo()
    _assert_fast_equals_lower("gpt3-350m", plans, cluster)


def test_units_timed_again_with_tp_overlap_reuse_their_op_costs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A layout that differs from another only in TP overlap times its units again (its GEMMs are chunked), on the
    same op costs: they are kept on each unit (ZeRO-3's too: its prefix's and the appended gathers'), not priced
    again, and the figures still equal a full compile's."""
    from echosim.timeline import lower

    cluster = Cluster("h100-sxm", 8)
    plans = [Plan(tp=4, pp=1, dp=2, zero=zero, tp_overlap=overlap, global_batch=16)
             for zero in (0, 3) for overlap in (False, True)]  # fmt: skip
    priced: list[int] = []
    call = lower.Coster.__call__

    def counted(self: Any, node: Any) -> float:
        priced.append(node.id)
        return call(self, node)  # type: ignore[no-any-return]

    memo.clear_all()
    _evaluate_batch("gpt3-350m", plans[0::2], cluster, 1.0, fast=True)  # without TP overlap
    misses = lower._UNITS.misses
    monkeypatch.setattr(lower.Coster, "__call__", counted)
    _evaluate_batch("gpt3-350m", plans[1::2], cluster, 1.0, fast=True)  # the same layouts with it
    assert lower._UNITS.misses > misses and priced == []  # units timed again, no op priced again
    monkeypatch.undo()
    _assert_fast_equals_lower("gpt3-350m", plans, cluster)


def test_layouts_with_the_same_stage_inputs_share_one_stage_list() -> None:
    """1F1B and GPipe of one split lower every stage alike (neither splits the backward): the second layout's
    stage costs and figures are the first's (``fast_eval._LAYOUTS``), and both still equal a full compile."""
    cluster = Cluster("h100-sxm", 8)
    plans = [Plan(pp=4, dp=2, global_batch=16, schedule=s) for s in ("1f1b", "gpipe")]
    memo.clear_all()
    _evaluate_batch("gpt3-350m", plans, cluster, 1.0, fast=True)
    assert (fast_eval._LAYOUTS.misses, fast_eval._LAYOUTS.hits) == (1, 1)
    _assert_fast_equals_lower("gpt3-350m", plans, cluster)


def test_a_units_categories_are_kept_on_it_and_extend_its_prefixs() -> None:
    """The op categories a unit simulation reads are found once per unit (``lower._categories``), a ZeRO-3 unit
    taking its layer's and its gathers' own; the simulation given them is the one that finds them itself."""
    from echosim.timeline import lower, streams

    cluster = Cluster("h100-sxm", 16)
    plans = [Plan(tp=2, pp=2, dp=4, zero=3, global_batch=16, tp_overlap=True)]
    memo.clear_all()
    _evaluate_batch("gpt3-350m", plans, cluster, 1.0, fast=True)
    extended = [p for s in fast_eval._STAGES._data.values() for kind in lower.unit_parts(s.graph, False) for p in kind
                if p.prefix is not None]  # fmt: skip
    assert extended
    for part in extended:
        cats = lower._categories(part)
        assert cats == [streams.category(n) for n in part.nodes]
        assert lower._categories(part) is cats and cats[: len(part.prefix.nodes)] == lower._categories(part.prefix)
    from echosim.backends.base import OverlapModel
    from echosim.compiler import prepare

    step = prepare("gpt3-350m", plans[0], cluster)
    part, graph = extended[0], step.stages[0].graph
    cost = lower.Coster(graph, step.backend, step.where)
    slowed = OverlapModel(compute_slowdown=1.2, comm_slowdown=1.1)
    given = streams.simulate_unit(graph, part.nodes, cost, slowed, None, None, lower._categories(part))
    assert given == streams.simulate_unit(graph, part.nodes, cost, slowed)


def test_zero_1_and_2_derive_a_deep_stage_once() -> None:
    """ZeRO 1 and 2 differ in the state policies alone: a stage derived from depths 2 and 3 is derived once for
    both (``fast_eval._DERIVED_COSTS``), each with its own static memory, and both equal a full compile."""
    cluster = Cluster("h100-sxm", 8)
    plans = [Plan(pp=2, dp=4, zero=zero, global_batch=16) for zero in (1, 2)]
    memo.clear_all()
    _evaluate_batch("gpt3-350m", plans, cluster, 1.0, fast=True)
    assert fast_eval._DERIVED_COSTS.misses == 2 and fast_eval._DERIVED_COSTS.hits == 2  # first and last stage
    _assert_fast_equals_lower("gpt3-350m", plans, cluster)


def test_a_dualpipe_layout_falls_back_after_the_1f1b_one_of_its_split() -> None:
    """DualPipe is timed by the full compile even when a 1F1B layout of the same split (same stage keys) came
    first and its stages are cached: the fast path refuses the layout before looking them up."""
    cluster = Cluster("h100-sxm", 8)
    plans = [Plan(pp=2, dp=4, global_batch=16, schedule=s) for s in ("1f1b", "dualpipe")]
    memo.clear_all()
    fast_eval.FALLBACKS.clear()
    got = _evaluate_batch("gpt3-350m", plans, cluster, 1.0, fast=True)
    assert list(fast_eval.FALLBACKS) == ["a schedule with its own placement and pairs (DualPipe) is timed by the full "
                                         "compile"]  # fmt: skip
    memo.clear_all()
    want = evaluate("gpt3-350m", plans[1], cluster)
    assert got[1].as_dict() == want.as_dict()


@pytest.mark.parametrize("zero", [0, 1, 3])
def test_bucket_terms_reused_from_the_bucket_before_equal_those_of_every_bucket_on_its_own(zero: int) -> None:
    """dp_bucket_seconds and the working set's terms reuse a bucket's terms for the next one of the same op,
    attributes object, output object and inputs (a scope's buckets); with every added node given its own equal
    attributes and output (nothing reused) the figures are the same to the bit."""
    from dataclasses import replace
    from itertools import pairwise

    from echosim.compiler import prepare_joint
    from echosim.passes.memory import SavedPolicy, _working_terms, added_nodes
    from echosim.timeline.lower import Coster, dp_bucket_seconds, tail_parts

    cluster = Cluster("h100-sxm", 16)
    plan = Plan(pp=2, dp=8, global_batch=32, zero=zero)
    memo.clear_all()
    _evaluate_batch("gpt3-350m", [plan], cluster, 1.0, fast=True)
    j = prepare_joint("gpt3-350m", plan, cluster)
    repeated = 0
    for stage in fast_eval._STAGES._data.values():
        g, added = stage.graph, added_nodes(stage.graph, stage.base)
        assert added is not None
        apart = g.copy()
        for n in added:
            apart.replace(n.id, attrs=replace(n.attrs), out=replace(n.out))
        repeated += sum(a.attrs is b.attrs and a.inputs == b.inputs for a, b in pairwise(added))
        grad_sync = tail_parts(stage)[0]
        own = dp_bucket_seconds(g, grad_sync, Coster(g, j.backend, j.where))
        alone = dp_bucket_seconds(apart, [apart[n.id] for n in grad_sync], Coster(apart, j.backend, j.where))
        assert own == alone
        for saved in (SavedPolicy(), SavedPolicy(fused_gated=True)):
            assert _working_terms(g, list(g), saved) == _working_terms(apart, list(apart), saved)
            assert _working_terms(g, added, saved, 0) == _working_terms(apart, list(apart)[-len(added) :], saved, 0)
    assert repeated if zero != 3 else True  # buckets of one scope, one after another: the reuse is exercised


def test_a_searchs_enumerated_layouts_are_not_checked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """``checked``: the enumeration ran ``check_plan`` on each layout, so neither ``_prepare``'s copies nor
    ``prepare_joint`` / ``prepare`` of a first layout run it again; unchecked batches still do."""
    from echosim import compiler

    calls: list[object] = []
    real = compiler.check_plan
    monkeypatch.setattr(compiler, "check_plan", lambda plan, *a: calls.append(plan) or real(plan, *a))
    cluster = Cluster("h100-sxm", 8)
    plans = [Plan(pp=2, dp=4, global_batch=16, zero=z) for z in (0, 1)]
    for fast in (True, False):
        memo.clear_all()
        _evaluate_batch("gpt3-350m", plans, cluster, 1.0, fast=fast, brief=fast, checked=True)
        assert calls == []
        memo.clear_all()  # the search's prepared joints are kept across batches
        _evaluate_batch("gpt3-350m", plans, cluster, 1.0, fast=fast, brief=fast, checked=False)
        assert calls == plans
        calls.clear()


def test_the_stage_passes_key_is_built_once_per_prepared_joint(monkeypatch: pytest.MonkeyPatch) -> None:
    """Layouts that differ only in their schedule or TP overlap are copies of one prepared joint sharing its stage
    passes (``layout_search._prepare``): the passes' key is hashed for the first and carried by the copies
    (``Joint.stage_key``)."""
    calls: list[object] = []
    real = fast_eval.output_key
    monkeypatch.setattr(fast_eval, "output_key", lambda p: calls.append(p) or real(p))
    cluster = Cluster("h100-sxm", 8)
    plans = [Plan(pp=4, dp=2, global_batch=16, schedule=s) for s in ("1f1b", "gpipe", "zb-h1")]
    memo.clear_all()
    _evaluate_batch("gpt3-350m", plans, cluster, 1.0, fast=True, brief=True, checked=True)
    from echosim.compiler import prepare_joint

    assert len(calls) == len(prepare_joint("gpt3-350m", plans[0], cluster).stage_passes) > 0


def test_a_layouts_stages_are_its_shapes_own_costs_and_indexed_only_for_a_full_assembly() -> None:
    """``fast_eval.stages`` gives virtual stage ``i``'s cost and figures at position ``i`` (a list each), the
    shapes' own cost objects (no copy per virtual stage); ``fast_eval.indexed`` tells them their virtual stage
    and the virtual stages of their shape as a full compile's lowering does (``lower_stages``)."""
    from echosim.compiler import prepare, prepare_joint
    from echosim.timeline.lower import lower_stages

    cluster = Cluster("h100-sxm", 8)
    plan = Plan(pp=4, vpp=2, dp=2, global_batch=16, schedule="interleaved")
    memo.clear_all()
    costs, figures = fast_eval.stages(prepare_joint("gpt3-350m", plan, cluster))
    assert isinstance(figures, list) and len(figures) == len(costs) == 8
    middle = costs[1:7]
    assert all(c is middle[0] for c in middle) and costs[0] is not middle[0] and costs[7] is not middle[0]
    assert all(figures[i] is figures[1] for i in range(1, 7))
    p = prepare("gpt3-350m", plan, cluster)
    want = lower_stages(p.stages, p.backend, p.where, p.options)
    got = fast_eval.indexed(costs)
    assert [(c.index, c.vstages) for c in got] == [(c.index, c.vstages) for c in want]
    assert got[1] is not got[2] and got[1].fwd == middle[0].fwd


def test_a_batch_builds_each_schedule_plan_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path's layouts of one schedule object, pp, micro-batches and vpp share one schedule plan, looked up
    once per batch (``step_plan`` hashes the schedule's orders function in its own cache)."""
    from echosim.timeline import lower

    calls: list[object] = []
    real = lower.step_plan
    monkeypatch.setattr(lower, "step_plan", lambda o: calls.append(o) or real(o))
    cluster = Cluster("h100-sxm", 8)
    plans = [Plan(pp=2, dp=4, global_batch=16, zero=z, schedule=s) for z in (0, 1, 2) for s in ("1f1b", "gpipe")]
    memo.clear_all()
    got = _evaluate_batch("gpt3-350m", plans, cluster, 1.0, fast=True, brief=True, checked=True)
    assert len(calls) == 2 and len(got) == len(plans)
