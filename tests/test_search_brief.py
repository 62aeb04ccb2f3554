"""A search's brief figures (read from stage costs and the schedule's column, no costed graph or report) equal
the full report's, field by field and exactly, on seeded samples of the whole space."""

from __future__ import annotations

import random

import pytest

from echosim import fast_eval, memo
from echosim.frontend.zoo import ArchConfig
from echosim.layout_search import _evaluate_batch, search
from echosim.plan import Cluster, Plan


def _moe() -> ArchConfig:
    return ArchConfig(
        "moe", layers=8, hidden=1024, heads=16, kv_heads=4, vocab=32000, seq_len=2048, experts=8, top_k=2,
        moe_ffn=1024,
    )  # fmt: skip


def _drawn(model: object, base: Plan, cluster: Cluster, n: int, seed: int) -> list[Plan]:
    space = {"schedule": ("1f1b", "gpipe", "interleaved", "zb-h1"), "mb": (1, 2, 4)}
    plans = search(model, base, cluster, space=space, sample=slice(0, 0)).enumeration.to_simulate
    return random.Random(seed).sample(plans, min(n, len(plans)))


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
    arch: object = _moe() if model == "moe" else model
    cluster = Cluster("h100-sxm", devices)
    base = Plan(global_batch=32, framework=framework)
    plans = _drawn(arch, base, cluster, 60, seed)
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
