"""Megatron-Core's combined 1F1B (--moe-ep-overlap): EP all-to-alls beside the adjacent micro-batch."""

from __future__ import annotations

import pytest

from echosim.backends.base import OverlapModel
from echosim.frontend.zoo import ArchConfig
from echosim.plan import Cluster, Plan, PlanError
from echosim.timeline.ep_overlap import hidden_per_pair, paired_fraction, row_saving, windows
from echosim.timeline.streams import COMM, COMPUTE, OpEvent, UnitTiming

FREE = OverlapModel()  # compute and communication that do not slow each other


def _unit(spans: list[tuple[str, float, float]]) -> UnitTiming:
    """A unit from (kind, start, end) spans: 'c' compute, 'a' an EP all-to-all."""
    events = [
        OpEvent(i, f"op{i}", COMPUTE if kind == "c" else COMM, a, b - a, "compute.matmul" if kind == "c" else "comm.ep")
        for i, (kind, a, b) in enumerate(spans)
    ]
    u = UnitTiming(duration=max(b for _, _, b in spans), events=events)
    u.critical_end = u.duration
    for e in events:
        u.add_busy(e.category, e.duration)
    return u


# forward: attention 3 s, dispatch 1 s, experts 2 s, combine 1 s
FWD = _unit([("c", 0, 3), ("a", 3, 4), ("c", 4, 6), ("a", 6, 7)])
# backward: combine's gradient 1 s, experts 4 s, dispatch's gradient 1 s, attention 6 s
BWD = _unit([("a", 0, 1), ("c", 1, 5), ("a", 5, 6), ("c", 6, 12)])


def test_a_row_saves_the_overlap_less_the_compute_slowdown() -> None:
    assert row_saving(3.0, 2.0, FREE) == pytest.approx(2.0)  # the all-to-all hides whole
    assert row_saving(1.0, 2.0, FREE) == pytest.approx(1.0)  # the compute is the shorter
    # compute slowed 1.25x while 2 s of it overlap: max(3 + 2 * 0.25, 2) = 3.5 instead of 5
    assert row_saving(3.0, 2.0, OverlapModel(compute_slowdown=1.25)) == pytest.approx(1.5)


def test_windows_split_a_layer_at_its_all_to_alls() -> None:
    assert windows(FWD) == (1.0, 1.0, 3.0, 2.0)  # dispatch, combine, attention, experts
    assert windows(BWD) == (1.0, 1.0, 6.0, 4.0)  # combine's gradient, dispatch's, attention, experts


def test_pair_hides_each_all_to_all_under_the_other_micro_batch() -> None:
    """min(fa=3, bc=1) + min(be=4, fd=1) + min(fe=2, bd=1) + min(ba=6, fc=1) = 4 s per layer, all exposed."""
    assert hidden_per_pair((FWD, 1), (BWD, 1), FREE) == pytest.approx(4.0)
    assert hidden_per_pair((FWD, 3), (BWD, 3), FREE) == pytest.approx(12.0)
    # a dispatch longer than the backward experts (4 s) hides only 4 of its 6 s
    long = _unit([("c", 0, 3), ("a", 3, 9), ("c", 9, 11), ("a", 11, 12)])
    assert hidden_per_pair((long, 1), (BWD, 1), FREE) == pytest.approx(1 + 4 + 1 + 1)


def test_only_steady_state_pairs_overlap() -> None:
    """pp 1: the first forward and the last backward run alone; interleaved: Megatron's warm-up + 1."""
    assert paired_fraction(0, 1, 1, 8) == pytest.approx(7 / 8)
    assert paired_fraction(0, 1, 1, 1) == 0.0
    assert paired_fraction(0, 4, 2, 8) == pytest.approx((16 - (3 * 2 + 4 + 1)) / 16)
    assert paired_fraction(3, 4, 2, 8) == pytest.approx((16 - (0 + 4 + 1)) / 16)


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        (Plan(dp=8, moe_ep_overlap=True), "needs expert parallelism"),
        (Plan(pp=2, dp=8, ep=8, moe_ep_overlap=True), "needs virtual pipeline stages"),
        (Plan(pp=2, vpp=2, dp=8, ep=8, schedule="zb-h1", moe_ep_overlap=True), "1f1b / interleaved"),
    ],
)
def test_overlap_layout_errors(plan: Plan, message: str) -> None:
    from echosim.layout import check_ep_overlap

    with pytest.raises(PlanError, match=message):
        check_ep_overlap(plan)


def _moe() -> ArchConfig:
    return ArchConfig(
        "moe", layers=2, hidden=2048, heads=16, kv_heads=4, vocab=32000, seq_len=4096, experts=16, top_k=4,
        moe_ffn=1024,
    )  # fmt: skip


def test_overlap_shortens_the_step_by_the_hidden_all_to_all() -> None:
    """ep 16 over two 8-GPU nodes, 8 micro-batches: the step drops by 7 paired micro-batches' hidden
    all-to-all, and the breakdown (comm.ep less what hid) still adds up to the step."""
    from echosim.compiler import lower

    plan = Plan(dp=16, ep=16, micro_batch=1, global_batch=128, seq_len=4096)
    cluster = Cluster("h100-sxm", 16, 8)
    base = lower(_moe(), plan, cluster)
    over = lower(_moe(), Plan(**{**plan.as_dict(), "moe_ep_overlap": True}), cluster)
    hidden = over.costed.stages[0].ep_hidden
    assert hidden > 0
    assert base.report.step_time_s - over.report.step_time_s == pytest.approx(8 * hidden, rel=1e-6)
    assert sum(over.report.breakdown.values()) == pytest.approx(over.report.step_time_s, rel=1e-9)
    assert base.report.breakdown["comm.ep"] - over.report.breakdown["comm.ep"] == pytest.approx(8 * hidden, rel=1e-6)
    assert over.report.plan["moe_ep_overlap"] is True and "moe_ep_overlap" not in base.report.plan
