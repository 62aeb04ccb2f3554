"""Invariants of whole compiles, checked with hypothesis on a small GPT."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from echosim.compiler import lower
from echosim.frontend.zoo import ArchConfig
from echosim.plan import Cluster, Plan

CFG = ArchConfig("gpt", layers=8, hidden=512, heads=8, vocab=4096, seq_len=512, dropout=0.1, tied_embeddings=True)
pytestmark = pytest.mark.slow
SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])

layouts = st.sampled_from([(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 1), (2, 2, 2), (1, 4, 2)])


def run(tp: int, pp: int, dp: int, micro: int, batches: int, **kw):  # type: ignore[no-untyped-def]
    plan = Plan(tp=tp, pp=pp, dp=dp, micro_batch=micro, global_batch=micro * dp * batches, **kw)
    return lower(CFG, plan, Cluster("a100-80gb", tp * pp * dp))


@SETTINGS
@given(layout=layouts, micro=st.integers(1, 4), batches=st.integers(1, 8),
       recompute=st.sampled_from(["none", "selective", "full"]))  # fmt: skip
def test_step_time_is_never_below_the_compute_bound(layout, micro, batches, recompute) -> None:  # type: ignore[no-untyped-def]
    c = run(*layout, micro, batches, recompute=recompute)
    compute = sum(v for k, v in c.report.breakdown.items() if k.startswith("compute."))
    assert c.report.step_time_s >= compute * (1 - 1e-9)
    assert abs(sum(c.report.breakdown.values()) - c.report.step_time_s) <= 1e-6 * c.report.step_time_s
    assert abs(c.costed.longest_path_s() - c.report.step_time_s) <= 1e-9 * c.report.step_time_s


@SETTINGS
@given(layout=layouts, micro=st.integers(1, 3), zero=st.sampled_from([0, 1, 2, 3]))
def test_memory_never_falls_when_the_micro_batch_grows(layout, micro, zero) -> None:  # type: ignore[no-untyped-def]
    small = run(*layout, micro, 2, zero=zero).report.memory
    large = run(*layout, micro + 1, 2, zero=zero).report.memory
    for a, b in zip(small, large, strict=True):
        assert b["activations"] >= a["activations"] and b["peak"] >= a["peak"]


@SETTINGS
@given(layout=layouts, batches=st.integers(1, 6))
def test_more_microbatches_never_raise_the_bubble(layout, batches) -> None:  # type: ignore[no-untyped-def]
    a = run(*layout, 1, batches)
    b = run(*layout, 1, batches + 1)
    assert b.report.bubble_fraction <= a.report.bubble_fraction + 0.02  # p2p stalls: see test_timeline


def test_zero_stages_never_raise_memory() -> None:
    peaks = [run(1, 1, 8, 1, 1, zero=z).report.memory[0]["peak"] for z in (0, 1, 2, 3)]
    assert peaks == sorted(peaks, reverse=True)
