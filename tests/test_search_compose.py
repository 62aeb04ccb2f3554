"""The search's shared work gives a full compile's figures: batched schedules, stage work kept before the
stage-level passes (units, activations, working set), checked layout by layout across every dimension."""

from __future__ import annotations

from dataclasses import replace

import pytest

from echosim import memo
from echosim.compiler import lower
from echosim.frontend.zoo import ArchConfig
from echosim.layout_search import _evaluate_batch, evaluate, search
from echosim.passes.memory import SavedPolicy, activation_bytes, added_nodes, transient_bytes
from echosim.plan import Cluster, Plan
from echosim.timeline.lower import StepOptions, _unit_graph, time_units

DENSE_SPACE = {
    "tp": (1, 2),
    "pp": (1, 2),
    "cp": (1, 2),
    "vpp": (1, 2),
    "sp": (False, True),
    "zero": (0, 1, 2, 3),
    "mb": (1, 2),
    "recompute": ("none", "selective", "full"),
    "schedule": ("1f1b", "gpipe", "interleaved", "zb-h1"),
    "tp_overlap": (False, True),
}


def _moe() -> ArchConfig:
    return ArchConfig(
        "moe", layers=4, hidden=1024, heads=16, kv_heads=4, vocab=32000, seq_len=2048, experts=8, top_k=2,
        moe_ffn=1024,
    )  # fmt: skip


def _sample(model: object, base: Plan, cluster: Cluster, space: dict[str, tuple[object, ...]], n: int) -> list[Plan]:
    plans = search(model, base, cluster, space=space, sample=slice(0, 0)).enumeration.to_simulate
    step = max(1, len(plans) // n)
    return plans[::step][:n]


def _assert_same(batch: list[object], plans: list[Plan], model: object, cluster: Cluster) -> None:
    memo.clear_all()
    for got, plan in zip(batch, plans, strict=True):
        want = evaluate(model, plan, cluster)  # lower(): what `echosim compile` reports
        assert got.as_dict() == want.as_dict(), plan  # type: ignore[attr-defined]
        assert got.breakdown == want.breakdown, plan  # type: ignore[attr-defined]


@pytest.mark.parametrize("attention", ["flash", "math"])
def test_batched_figures_equal_compile_across_every_dimension(attention: str) -> None:
    """tp, pp, dp, cp, vpp, sp, ZeRO 0-3, micro-batch, recompute, four schedules, tp-overlap: exact equality."""
    cluster = Cluster("h100-sxm", 8)
    base = Plan(global_batch=16, attention=attention)
    plans = _sample("gpt3-125m", base, cluster, DENSE_SPACE, 48)
    assert {p.zero for p in plans} == {0, 1, 2, 3} and {p.schedule for p in plans} >= {"1f1b", "zb-h1"}
    assert {p.tp for p in plans} == {1, 2} and {p.pp for p in plans} == {1, 2} and {p.cp for p in plans} == {1, 2}
    memo.clear_all()
    batch = _evaluate_batch("gpt3-125m", plans, cluster, 1.0)
    _assert_same(batch, plans, "gpt3-125m", cluster)


def test_batched_figures_equal_compile_with_experts() -> None:
    """Expert parallelism (its gradient groups split the reductions): exact equality too."""
    cluster = Cluster("h100-sxm", 8)
    space = {"ep": (1, 2, 4), "zero": (0, 1, 3), "tp": (1, 2), "pp": (1, 2), "cp": (1,), "vpp": (1,), "mb": (1,)}
    plans = _sample(_moe(), Plan(global_batch=8), cluster, space, 24)
    assert {p.ep for p in plans} == {1, 2, 4}
    memo.clear_all()
    batch = _evaluate_batch(_moe(), plans, cluster, 1.0)
    _assert_same(batch, plans, _moe(), cluster)


def test_batched_figures_equal_compile_with_vocabulary_tiling() -> None:
    """Vocabulary tiling replays the logits outside the layers (a working-set term of its own, merged
    across the stage passes' added nodes): exact equality too."""
    cluster = Cluster("h100-sxm", 8)
    space = {"zero": (0, 1, 3), "tp": (1, 2), "pp": (1, 2), "cp": (1,), "vpp": (1,), "mb": (1, 2),
             "recompute": ("none", "full")}  # fmt: skip
    plans = _sample("gpt3-125m", Plan(global_batch=16, loss_chunks=4), cluster, space, 16)
    assert plans and all(p.loss_chunks == 4 for p in plans)
    memo.clear_all()
    batch = _evaluate_batch("gpt3-125m", plans, cluster, 1.0)
    _assert_same(batch, plans, "gpt3-125m", cluster)


def test_layouts_differing_in_their_schedule_alone_share_one_preparation_and_equal_compile() -> None:
    """A batch prepares a layout once for all its schedules and TP overlaps (the passes read neither) and lowers
    its stages once per backward split and TP overlap; each layout's figures still equal its own cold compile."""
    import echosim.compiler

    cluster = Cluster("h100-sxm", 8)
    space = {"tp": (2,), "pp": (2,), "cp": (1,), "vpp": (1, 2), "sp": (True,), "zero": (1,), "mb": (1,),
             "recompute": ("full",), "tp_overlap": (False, True),
             "schedule": ("1f1b", "gpipe", "interleaved", "zb-h1")}  # fmt: skip
    plans = search("gpt3-125m", Plan(global_batch=16), cluster, space=space, sample=slice(0, 0)).enumeration.to_simulate
    assert len({p.schedule for p in plans}) >= 3 and {p.vpp for p in plans} == {1, 2}
    assert {p.tp_overlap for p in plans} == {False, True}
    calls = []
    real = echosim.compiler.prepare

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(args[1])
        return real(*args, **kwargs)  # type: ignore[arg-type]

    memo.clear_all()
    echosim.compiler.prepare = counted  # type: ignore[assignment]
    try:
        batch = _evaluate_batch("gpt3-125m", plans, cluster, 1.0)
    finally:
        echosim.compiler.prepare = real
    assert len(calls) == len({p.vpp for p in plans}) < len(plans)
    _assert_same(batch, plans, "gpt3-125m", cluster)
    joints, real_joint = [], echosim.compiler.prepare_joint

    def counted_joint(*args: object, **kwargs: object) -> object:
        joints.append(args[1])
        return real_joint(*args, **kwargs)  # type: ignore[arg-type]

    memo.clear_all()
    echosim.compiler.prepare_joint = counted_joint  # type: ignore[assignment]
    try:
        fast = _evaluate_batch("gpt3-125m", plans, cluster, 1.0, fast=True)
    finally:
        echosim.compiler.prepare_joint = real_joint
    assert len(joints) == len({p.vpp for p in plans})  # the fast path prepares up to the split alike
    _assert_same(fast, plans, "gpt3-125m", cluster)


@pytest.mark.parametrize(
    ("model", "devices", "seed"),
    [
        ("gpt3-125m", 8, 1912),
        pytest.param("gpt3-125m", 16, 12, marks=pytest.mark.slow),
        pytest.param("moe", 8, 7, marks=pytest.mark.slow),
    ],
)
def test_batched_figures_equal_compile_on_a_seeded_random_sample_of_the_whole_space(
    model: str, devices: int, seed: int
) -> None:
    """Not only the top layouts: 40 layouts drawn at random (seeded) from every applicable layout of the
    default space (every dimension, every schedule, every ZeRO stage), batched as a search batches them,
    equal one cold `lower()` each, figure by figure (no tolerance)."""
    import random

    arch: object = _moe() if model == "moe" else model
    cluster = Cluster("h100-sxm", devices)
    space = {"schedule": ("1f1b", "gpipe", "interleaved", "zb-h1"), "mb": (1, 2, 4)}
    plans = search(arch, Plan(global_batch=32), cluster, space=space, sample=slice(0, 0)).enumeration.to_simulate
    drawn = random.Random(seed).sample(plans, 40)
    for key in (
        "tp",
        "pp",
        "cp",
        "sp",
        "tp_overlap",
        "zero",
        "micro_batch",
        "recompute",
        "schedule",
        *(("ep",) if model == "moe" else ()),
    ):
        assert len({getattr(p, key) for p in drawn}) > 1, key  # the draw spans the dimension
    memo.clear_all()
    batch = _evaluate_batch(arch, drawn, cluster, 1.0)
    _assert_same(batch, drawn, arch, cluster)


@pytest.mark.parametrize(
    "plan",
    [
        Plan(dp=8, global_batch=16),
        Plan(dp=8, zero=1, global_batch=16, loss_chunks=4, recompute="full"),
        Plan(dp=4, pp=2, zero=1, global_batch=16, recompute="selective", attention="math"),
        Plan(dp=4, tp=2, zero=2, global_batch=16, recompute="full", sp=True),
        Plan(dp=8, zero=3, global_batch=16),
        Plan(dp=2, cp=2, tp=2, zero=1, global_batch=8, schedule="zb-h1", pp=1),
        Plan(dp=4, pp=2, zero=3, global_batch=16, schedule="zb-h1"),
    ],
)
def test_stage_work_kept_before_the_stage_passes_equals_the_stage_graph(plan: Plan) -> None:
    """Units, saved activations and working set read from the graph before data parallelism and the
    optimizer equal those of the stage graph itself, whenever the search shares them."""
    c = lower("gpt3-125m", plan, Cluster("h100-sxm", 8))
    for stage in c.stages:
        assert stage.base is not None and added_nodes(stage.graph, stage.base) is not None
        for saved in (
            SavedPolicy(),
            SavedPolicy(fused_gated=True, offload=frozenset({"decoder_layer_input"})),
            SavedPolicy(loss_chunks=plan.loss_chunks),
        ):
            alone = replace(stage, base=None)
            assert transient_bytes(stage.graph, saved, stage.base) == transient_bytes(alone.graph, saved)
            assert activation_bytes(stage.graph, saved, stage.base) == activation_bytes(alone.graph, saved)
    from echosim.compiler import _backend
    from echosim.plugins import get_registry
    from echosim.timeline.placement import Degrees, axis_placements

    registry = get_registry()
    be = _backend("h100-sxm", registry)
    where = axis_placements(Degrees(plan.tp, plan.pp, plan.dp, plan.cp, plan.ep), 8)
    sched = registry.schedules[plan.schedule].value
    options = StepOptions(sched, plan.pp, plan.vpp, plan.microbatches, plan.tp, plan.sp, plan.tp_overlap)
    shared = 0
    for stage in c.stages:
        units_of = _unit_graph(stage)
        if units_of is stage.base:
            shared += 1
            memo.clear_all()
            own = time_units(stage.graph, be, where, options)
            memo.clear_all()
            kept = time_units(units_of, be, where, options)
            assert [[(u.duration, u.period, u.busy, k) for u, k in part] for part in own] == [
                [(u.duration, u.period, u.busy, k) for u, k in part] for part in kept
            ]
    assert shared == (len(c.stages) if plan.zero < 3 else 0)  # ZeRO-3 gathers weights inside the units


@pytest.mark.slow
def test_search_ranks_the_top_20_as_one_full_compile_per_layout() -> None:
    """The batched search and one `lower` per layout (the path before batching) rank the top 20 alike."""
    from echosim.layout_search import rank

    cluster = Cluster("h100-sxm", 8)
    space = {**DENSE_SPACE, "schedule": ("1f1b", "zb-h1"), "recompute": ("none", "full")}
    result = search("gpt3-125m", Plan(global_batch=16), cluster, space=space)
    memo.clear_all()
    full = [evaluate("gpt3-125m", p, cluster) for p in result.enumeration.to_simulate]
    ranked, _ = rank(full + result.enumeration.rejected, "step-time")
    assert len(ranked) >= 20
    assert [e.as_dict() for e in result.ranked[:20]] == [e.as_dict() for e in ranked[:20]]


def test_unit_timings_shared_across_pipeline_splits_are_told_in_each_graphs_ids() -> None:
    """A layer's units are kept by their ops, not their node ids: a pipeline split met after another
    reuses them, and every unit (events, node ids, names, chunked edges) equals a cold compile's."""
    from echosim.timeline.lower import _UNITS

    cluster = Cluster("h100-sxm", 8)
    plan = Plan(pp=4, dp=1, tp=2, sp=True, tp_overlap=True, global_batch=16, schedule="zb-h1")
    memo.clear_all()
    cold = lower("gpt3-125m", plan, cluster)
    memo.clear_all()
    lower("gpt3-125m", replace(plan, pp=2, dp=2), cluster)  # the same layers, other node ids
    simulated = _UNITS.misses
    warm = lower("gpt3-125m", plan, cluster)
    assert _UNITS.misses == simulated  # every unit of the 4-stage split was met in the 2-stage one
    for a, b in zip(cold.costed.stages, warm.costed.stages, strict=True):
        assert a.fwd_units == b.fwd_units and a.bwd_units == b.bwd_units
        assert {e.node for u, _ in b.fwd_units + b.bwd_units for e in u.events} <= set(b.graph.nodes) | set(
            b.base.nodes if b.base is not None else ()
        )
    assert cold.report.to_dict() == warm.report.to_dict()


def test_a_batch_times_each_distinct_schedule_column_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Layouts whose stages take the same seconds (ZeRO 1 and 2 build one stage graph) have one schedule: a batch
    times it once (one column of the composer's arrays) and reads both layouts' figures from it, each equal to its
    own compile; columns are told apart by their bytes (``-0.0`` is not ``0.0``)."""
    import numpy as np

    import echosim.timeline.composer as composer
    from echosim.layout_search import _distinct_columns

    cluster = Cluster("h100-sxm", 8)
    plans = [Plan(tp=2, pp=2, dp=2, global_batch=16, zero=z, schedule=s) for s in ("1f1b", "zb-h1") for z in (1, 2)]
    timed: list[int] = []
    real = composer.time_schedule

    def counted(plan: object, fwd: np.ndarray, *args: object, **kwargs: object) -> object:
        timed.append(np.asarray(fwd).reshape(len(fwd), -1).shape[1])
        return real(plan, fwd, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(composer, "time_schedule", counted)
    memo.clear_all()
    for fast in (False, True):
        timed.clear()
        batch = _evaluate_batch("gpt3-125m", plans, cluster, 1.0, fast=fast, brief=fast)
        assert timed == [1, 1], fast  # one column per schedule shape, not one per layout
        assert [e.as_dict() for e in batch] == [evaluate("gpt3-125m", p, cluster).as_dict() for p in plans]
    columns, column_of = _distinct_columns([([1.0], [2.0], [0.0], [0.0], []), ([1.0], [2.0], [-0.0], [0.0], []),
                                            ([1.0], [2.0], [0.0], [0.0], [])], False)  # fmt: skip
    assert column_of == [0, 1, 0] and columns[0].shape == (1, 2) and columns[4] is None
    assert np.signbit(columns[2][0]).tolist() == [False, True]
