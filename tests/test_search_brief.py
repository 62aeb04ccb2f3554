"""A search's brief figures (read from stage costs and the schedule's column, no costed graph or report) equal
the full report's, field by field and exactly, on seeded samples of the whole space."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from layout_samples import drawn, small_moe

from echosim import fast_eval, memo
from echosim.frontend.zoo import ArchConfig
from echosim.layout_search import _evaluate_batch, search
from echosim.plan import Cluster, Plan


@pytest.mark.parametrize(
    ("model", "devices", "seed", "framework"),
    [
        ("gpt3-350m", 16, 7, "megatron"),  # 24 layers: pp up to 16 and vpp up to 4 (ranks of several chunks)
        ("moe", 16, 4, "megatron"),
        ("gpt3-125m", 8, 13, "eager"),  # PyTorch DDP: bucket copies in the step tail
    ],
)
def test_brief_figures_equal_the_full_report(model: str, devices: int, seed: int, framework: str) -> None:
    """60 layouts drawn from every dimension (tp, pp, dp, cp, ep, vpp, sp, ZeRO 0-3, micro-batch, recompute,
    four schedules, tp-overlap): each brief figure equals the one the report gives, to the last bit."""
    arch: object = small_moe() if model == "moe" else model
    cluster = Cluster("h100-sxm", devices)
    base = Plan(global_batch=32, framework=framework)
    plans = drawn(arch, base, cluster, 60, seed)
    assert {p.zero for p in plans} == {0, 1, 2, 3} and any(p.vpp > 1 for p in plans)
    assert any(p.schedule == "zb-h1" and p.pp > 1 for p in plans)
    memo.clear_all()
    fast_eval.FALLBACKS.clear()
    brief = _evaluate_batch(arch, plans, cluster, 0.03, fast=True, brief=True)
    assert not fast_eval.FALLBACKS, fast_eval.FALLBACKS
    memo.clear_all()
    full = _evaluate_batch(arch, plans, cluster, 0.03, fast=True)
    assert sum(e.ok for e in full) >= 5 and sum(not e.fits for e in full if e.simulated) >= 5  # both kinds
    for b, f, plan in zip(brief, full, plans, strict=True):
        assert b.as_dict() == f.as_dict(), plan
        assert b.breakdown == {} and (f.breakdown or not f.simulated or f.step_time_s is None), plan


def test_a_search_explains_its_best_layouts_with_the_full_breakdown() -> None:
    """The brief path leaves the breakdown out; the top layouts are re-evaluated in full, so why_better has it."""
    cluster = Cluster("h100-sxm", 8)
    space = {"tp": (1, 2), "pp": (1, 2, 4), "zero": (0, 1), "mb": (1, 2)}
    memo.clear_all()
    result = search("gpt3-350m", Plan(global_batch=16), cluster, space=space)
    assert len(result.ranked) > 20
    assert all(e.breakdown for e in result.ranked[:20])
    assert sum(not e.breakdown for e in result.ranked) >= 1  # the rest took the brief path


# -- what the published layouts of the validation table showed the search missing ---------------------------


def test_the_base_plans_recompute_policy_is_searched_and_costed_alike_on_both_paths() -> None:
    """MaxText's remat policies (kept tensors, offloaded tensors) are in the space when the base plan names one,
    any known policy may be asked for, and the fast path gives the full path's rows for them."""
    from echosim.layout_search import SearchError

    cluster = Cluster("h100-sxm", 8)
    base = Plan(global_batch=16, recompute="qkv_proj_offloaded", framework="maxtext")
    result = search("gpt3-350m", base, cluster, space={"pp": (1, 2), "zero": (0, 3)}, sample=slice(0, 0))
    assert result.enumeration.space.values["recompute"] == ("none", "selective", "full", "qkv_proj_offloaded")
    space = {"tp": (1, 2), "pp": (1, 2), "recompute": ("minimal", "qkv_proj_offloaded", "custom:qkv_proj=offload")}
    memo.clear_all()
    fast_eval.FALLBACKS.clear()
    fast = search("gpt3-350m", base, cluster, space=space)
    assert not fast_eval.FALLBACKS
    memo.clear_all()
    full = search("gpt3-350m", base, cluster, space=space, fast=False)
    assert [e.as_dict() for e in fast.evaluated] == [e.as_dict() for e in full.evaluated]
    assert {e.plan.recompute for e in fast.ranked} == set(space["recompute"])
    with pytest.raises(SearchError, match="--space recompute: unknown recompute policy 'sometimes'"):
        search("gpt3-350m", base, cluster, space={"recompute": ("sometimes",)})


def test_a_pipeline_may_give_the_embedding_and_the_loss_stages_of_their_own() -> None:
    """pp x vpp up to the layers plus two compiles (the pipeline split gives the embedding and the loss a stage
    of their own: NeMo's Llama 3.1 405B proxy, 30 layers over 4 x 8 stages), so it is not pruned; beyond that
    it is, with the pipeline split's reason."""
    arch = ArchConfig("gpt", layers=6, hidden=512, heads=8, kv_heads=8, vocab=32000, seq_len=1024)
    cluster = Cluster("h100-sxm", 8)
    space = {"tp": (1,), "cp": (1,), "pp": (2, 4), "vpp": (1, 2, 4), "schedule": ("interleaved",), "zero": (0,),
             "mb": (1,), "recompute": ("none",), "sp": (False,), "tp_overlap": (False,)}  # fmt: skip
    result = search(arch, Plan(global_batch=16), cluster, space=space)
    simulated = {(e.plan.pp, e.plan.vpp) for e in result.evaluated if e.simulated}
    assert simulated == {(2, 1), (2, 2), (2, 4), (4, 1), (4, 2)}  # 8 virtual stages for 6 layers among them
    assert all(e.ok for e in result.evaluated if e.simulated)
    rejected = {(e.plan.pp, e.plan.vpp): e.reason for e in result.enumeration.rejected}
    assert rejected == {(4, 4): "pp*vpp = 16 exceeds the layers (6) plus the embedding and loss stages"}


def test_the_memory_lower_bound_keeps_the_frameworks_state_bytes() -> None:
    """MaxText with 16-bit weights keeps 8 bytes of state a parameter (not 16): the bound stays below the
    compiled peak, so the layout that fits is not pruned."""
    from echosim.compiler import compile as compile_model
    from echosim.layout_search import ModelFacts, memory_lower_bound

    plan = Plan(dp=8, zero=3, global_batch=8, framework="maxtext-bf16-weights")
    facts = ModelFacts.of("gpt3-1.3b", plan)
    rep = compile_model("gpt3-1.3b", plan, Cluster("h100-sxm", 8))
    bound = memory_lower_bound(plan, facts.params)
    assert 0 < bound <= min(m["peak"] for m in rep.memory)
    assert bound == int(facts.params / 8 * (2 + 2 + 4))  # weights, gradients and Adam's moments in bf16, / dp


def test_one_chunk_per_rank_prices_the_peak_of_the_rank_holding_most_of_each_chunk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With one chunk per rank, brief_figures prices the memory peak of one rank per distinct chunk (the one
    holding the most micro-batches), not of every rank: the same peak as pricing every rank."""
    from echosim.timeline import report

    cluster = Cluster("h100-sxm", 8)
    plans = [Plan(pp=8, dp=1, global_batch=32, zero=z) for z in (0, 1)]
    memo.clear_all()
    priced: list[int] = []
    rank_peak, chunk_peak = report._rank_peak, report._chunk_peak

    def priced_alike(figures: object, held: int, caching: bool) -> int:  # equal to _rank_peak of that rank
        peak = chunk_peak(figures, held, caching)  # type: ignore[arg-type]
        stage = SimpleNamespace(index=0)
        plan, facts = SimpleNamespace(in_flight=[{0: held}]), SimpleNamespace(caching_allocator=caching)
        assert rank_peak(0, [stage], [figures], (0,), plan, {}, facts) == peak  # type: ignore[arg-type, list-item]
        priced.append(held)
        return peak

    monkeypatch.setattr(report, "_chunk_peak", priced_alike)
    monkeypatch.setattr(report, "_rank_peak", lambda *a: pytest.fail("a rank of one chunk priced by _rank_peak"))
    brief = _evaluate_batch("gpt3-350m", plans, cluster, 0.03, fast=True, brief=True)
    assert priced and len(priced) <= 3 * len(plans)  # first, middle and last chunk: ranks 0, 1 and 7
    memo.clear_all()
    full = _evaluate_batch("gpt3-350m", plans, cluster, 0.03, fast=True)
    for b, f in zip(brief, full, strict=True):
        assert b.as_dict() == f.as_dict()


@pytest.mark.parametrize(("pp", "m", "vpp"), [(4, 8, 2), (4, 12, 3), (8, 16, 2)])
def test_interleaved_peaks_are_the_largest_dot_product_over_the_held_counts(pp: int, m: int, vpp: int) -> None:
    """An interleaved pipeline's peak per group of ranks holding the same chunks (_grouped_peak) is the highest
    rank's :func:`~echosim.timeline.costed.peak_held` plus its fixed bytes, to the byte, for random integer sizes."""
    import random

    from echosim.passes.memory import MemoryBreakdown
    from echosim.timeline import report
    from echosim.timeline.composer import schedule_plan
    from echosim.timeline.costed import peak_held
    from echosim.timeline.schedule import interleaved

    memo.clear_all()
    plan = schedule_plan(interleaved, pp, m, vpp, False)
    rng = random.Random(pp * 100 + m + vpp)
    groups = [(0,), tuple(range(1, pp - 1)), (pp - 1,)]  # first, middle and last ranks
    for trial in range(20):
        caching = bool(trial % 2)
        kinds = []
        for _ in range(3 * vpp):  # act, blocks and the state of each chunk of first, middle and last ranks
            state = (rng.randrange(10**9) for _ in range(3))
            part = MemoryBreakdown(*state, 0, rng.randrange(10**8), rng.randrange(10**6), 0, 0)
            kinds.append((rng.randrange(10**9), rng.randrange(10**9) if caching else None, part))
        chunks = [(None, part, act, blocks) for act, blocks, part in kinds]
        figures: list[tuple[object, MemoryBreakdown, int, int | None]] = [
            (None, MemoryBreakdown(0, 0, 0, 0, 0, 0, 0, 0), 0, None)
        ] * (pp * vpp)
        for g, ranks in enumerate(groups):
            for r in ranks:
                for j in range(vpp):  # one figures object per distinct chunk, as fast_eval gives
                    figures[r + j * pp] = chunks[g * vpp + j]
        idents = [tuple(id(figures[r + j * pp]) for j in range(vpp)) for r in range(pp)]
        assert len(set(idents)) == 3
        want = 0
        for r in range(pp):
            mine = figures[r::pp]
            parts = [f[1] for f in mine]
            fixed = (sum(p.params for p in parts) + sum(p.grads for p in parts) + sum(p.optimizer for p in parts)
                     + max(p.transient for p in parts) + sum(p.comm_buffers for p in parts))  # fmt: skip
            sizes = {r + j * pp: (f[3] or 0) if caching else f[2] for j, f in enumerate(mine)}
            want = max(want, fixed + peak_held(plan, r, sizes))
        assert report._grouped_peak(plan, idents, figures, caching) == want  # type: ignore[arg-type]
    assert len(report._held_points(plan, list(range(pp)))) < m * vpp  # a few vectors, not every block's


def test_a_float_byte_count_takes_each_rank_on_its_own() -> None:
    """_grouped_peak leaves to the per-rank loop what a float's rounding could tell apart (None)."""
    from echosim.passes.memory import MemoryBreakdown
    from echosim.timeline import report
    from echosim.timeline.composer import schedule_plan
    from echosim.timeline.schedule import interleaved

    plan = schedule_plan(interleaved, 2, 4, 2, False)
    part = MemoryBreakdown(1, 2, 3, 0, 4.5, 6, 0, 0)  # type: ignore[arg-type]
    figures = [(None, part, 10, None)] * 4
    idents = [(id(figures[0]), id(figures[0]))] * 2
    assert report._grouped_peak(plan, idents, figures, False) is None  # type: ignore[arg-type]
    whole = [(None, MemoryBreakdown(1, 2, 3, 0, 4, 6, 0, 0), 10.0, None)] * 4
    assert report._grouped_peak(plan, idents, whole, False) is None  # type: ignore[arg-type]


def test_exposed_comm_terms_are_kept_by_the_units_of_a_stage() -> None:
    """A chunk's exposed-communication terms are computed once per unit lists and micro-batches: a copy of the stage
    cost (another layout's) reads them back; a different micro-batch count computes its own."""
    import copy

    from echosim.timeline import report

    cluster = Cluster("h100-sxm", 8)
    memo.clear_all()
    plan = Plan(tp=2, pp=2, dp=2, global_batch=16, tp_overlap=False)
    from echosim.compiler import lower

    costed = lower("gpt3-125m", plan, cluster).costed  # type: ignore[attr-defined]
    stage = costed.stages[0]
    first = report._exposed_terms(stage, 4)
    assert first and report._exposed_terms(copy.copy(stage), 4) is first
    assert report._exposed_terms(stage, 8) is not first
    assert report.exposed_comm([stage], 4, []) == dict(report.exposed_comm([copy.copy(stage)], 4, []))


def test_layouts_that_share_their_stages_build_each_rank_tail_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank's step tail is kept by its stages' figures objects (one per stage cost): the same layout under
    another schedule of the same backward split (GPipe after 1F1B) builds none again, with the same figures."""
    from echosim.timeline import report

    built: list[int] = []
    real = report.rank_tail

    def counted(mine: list[object], last: object) -> object:
        built.append(len(mine))
        return real(mine, last)  # type: ignore[arg-type]

    monkeypatch.setattr(report, "rank_tail", counted)
    cluster = Cluster("h100-sxm", 8)
    plans = [Plan(pp=4, dp=2, global_batch=32, schedule=s) for s in ("1f1b", "gpipe")]
    memo.clear_all()
    first = _evaluate_batch("gpt3-350m", plans[:1], cluster, 0.03, fast=True, brief=True)
    assert 0 < len(built) <= 4  # first, middle and last ranks' tails
    built.clear()
    second = _evaluate_batch("gpt3-350m", plans[1:], cluster, 0.03, fast=True, brief=True)
    assert built == []
    memo.clear_all()
    full = _evaluate_batch("gpt3-350m", plans, cluster, 0.03, fast=True)
    assert [e.as_dict() for e in first + second] == [e.as_dict() for e in full]


def test_each_ranks_peak_reads_its_chunks_virtual_stages_from_their_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """A brief layout's costs are its shapes' own objects, not told their virtual stage (``fast_eval.stages``):
    ``_rank_peak`` takes rank ``r``'s ``j``-th chunk as virtual stage ``r + j * pp``, so an interleaved pipeline
    priced rank by rank (``_grouped_peak`` declining) has the full report's peak."""
    from echosim.timeline import report

    cluster = Cluster("h100-sxm", 8)
    plans = [Plan(pp=4, vpp=v, dp=2, global_batch=32, schedule="interleaved", zero=1) for v in (2, 3)]
    monkeypatch.setattr(report, "_grouped_peak", lambda *a: None)
    memo.clear_all()
    brief = _evaluate_batch("gpt3-350m", plans, cluster, 0.03, fast=True, brief=True)
    memo.clear_all()
    full = _evaluate_batch("gpt3-350m", plans, cluster, 0.03, fast=True)
    for b, f in zip(brief, full, strict=True):
        assert b.as_dict() == f.as_dict()
