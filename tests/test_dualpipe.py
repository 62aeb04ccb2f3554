"""DualPipe (DeepSeek-V3, arXiv:2412.19437 sec. 3.2.1, Table 2): micro-batches from both ends, two copies
of the weights, PP + 1 micro-batches of activations, overlapped forward-backward pairs."""

from __future__ import annotations

import itertools

import pytest
from conftest import SHARED

from echosim.frontend.zoo import ArchConfig
from echosim.plan import Cluster, Plan, PlanError
from echosim.timeline.composer import schedule_plan, time_schedule
from echosim.timeline.schedule import Block, dualpipe, dualpipe_paired, one_f_one_b
from echosim.timeline.sequential import order_plan, plan_orders, time_orders

SHAPES = [(2, 4), (4, 8), (4, 12), (6, 14), (8, 20), (16, 120)]


@pytest.mark.parametrize(("pp", "m"), SHAPES)
def test_each_rank_runs_its_stage_and_its_mirror_for_half_the_micro_batches(pp: int, m: int) -> None:
    orders = dualpipe(pp, m)
    for r, seq in enumerate(orders):
        assert {v for _, v, _ in seq} == {r, pp - 1 - r}
        for v in {r, pp - 1 - r}:
            ids = [j for k, w, j in seq if k == "F" and w == v]
            assert len(ids) == m // 2 == len([j for k, w, j in seq if k == "B" and w == v])
            # stage v of the first half's micro-batches runs on rank v, of the second half on rank pp-1-v
            assert all((j < m // 2) == (r == v) for j in ids)
    blocks = [b for seq in orders for b in seq]
    assert len(blocks) == len(set(blocks)) == 2 * m * pp  # every micro-batch through every stage once


def _bubble_with_whole_pairs(orders: list[list[Block]], pp: int, f: float, b: float) -> float:
    """Reference timer: an overlapped pair (a forward then a backward of the other stage) starts when both of
    its inputs are there and lasts F&B = F + B (no overlap gain); returns the last rank's idle time."""
    units = []
    for seq in orders:
        mine, i = [], 0
        while i < len(seq):
            pair = i + 1 < len(seq) and seq[i][0] == "F" and seq[i + 1][0] == "B" and seq[i][1] != seq[i + 1][1]
            mine.append(tuple(seq[i : i + 2 if pair else i + 1]))
            i += 2 if pair else 1
        units.append(mine)
    end: dict[Block, float] = {}
    at, free = [0] * pp, [0.0] * pp
    left = sum(len(u) for u in units)
    while left:
        before = left
        for r in range(pp):
            while at[r] < len(units[r]):
                unit = units[r][at[r]]
                deps = []
                for kind, v, j in unit:
                    if kind == "F" and v:
                        deps.append(("F", v - 1, j))
                    elif kind == "B":
                        deps.append(("F", v, j) if v == pp - 1 else ("B", v + 1, j))
                if any(d not in end for d in deps):
                    break
                start = max([free[r], *(end[d] for d in deps)])
                free[r] = start + sum(f if kind == "F" else b for kind, _, _ in unit)
                for block in unit:
                    end[block] = free[r]
                at[r], left = at[r] + 1, left - 1
        assert left < before, "deadlock"
    return max(free) - len(orders[0]) / 2 * (f + b)


@pytest.mark.parametrize(("pp", "m"), SHAPES)
@pytest.mark.parametrize(("f", "b"), [(1.0, 2.0), (1.5, 2.5)])
def test_whole_pairs_give_the_papers_bubble(pp: int, m: int, f: float, b: float) -> None:
    """Table 2: (PP/2 - 1)(F&B + B - 3W); backwards kept whole (W = 0) and F&B = F + B."""
    assert _bubble_with_whole_pairs(dualpipe(pp, m), pp, f, b) == pytest.approx((pp / 2 - 1) * (f + b + b))


@pytest.mark.parametrize(("pp", "m"), SHAPES)
@pytest.mark.parametrize(("f", "b", "lag"), [(1.0, 2.0, 0.0), (1.5, 2.5, 0.0), (0.3, 0.7, 0.05)])
def test_echosims_timers_run_pairs_as_one_unit_and_agree_to_the_bit(
    pp: int, m: int, f: float, b: float, lag: float
) -> None:
    """The schedule's fused pairs: a pair's forward also waits on its backward's input. With no transfer
    time the bubble is the paper's (PP/2 - 1)(F&B + B), below 1F1B's (PP - 1)(F + B); the batch composer
    equals the block-by-block timer to the last bit, transfers included."""
    fw, bw, p2p = [f] * pp, [b] * pp, [lag] * pp
    alone = time_orders(order_plan(dualpipe, pp, m, 1, False, True), fw, bw, p2p, p2p)
    plan = schedule_plan(dualpipe, pp, m, 1, False, True)
    batch = time_schedule(plan, fw, bw, p2p, p2p, keep_blocks=True).layout(0)
    assert alone.blocks == batch.blocks and alone.rank_ends == batch.rank_ends
    if lag:
        return
    bubble = max(alone.rank_ends) - m * (f + b)
    assert bubble == pytest.approx((pp / 2 - 1) * (f + b + b))
    loose = time_orders(order_plan(dualpipe, pp, m, 1, False), fw, bw, p2p, p2p)  # halves start on their own input
    assert max(loose.rank_ends) <= max(alone.rank_ends)
    if pp > 2:
        one = time_orders(order_plan(one_f_one_b, pp, m, 1, False), fw, bw, p2p, p2p)
        assert bubble < max(one.rank_ends) - m * (f + b) == pytest.approx((pp - 1) * (f + b))


@pytest.mark.parametrize(("pp", "m"), SHAPES)
def test_a_rank_holds_pp_plus_one_micro_batches_of_activations(pp: int, m: int) -> None:
    plan = plan_orders(dualpipe(pp, m))
    for r in range(pp):
        assert plan.peak_held(r, dict.fromkeys(range(pp), 1)) == pp + 1


def test_paired_share_counts_the_steady_state_and_cool_down_pairs() -> None:
    """pp 8, 20 micro-batches (the paper's Fig. 5): rank 0 pairs 2 (10 - 8 + 1) + 3 of its 20 backwards."""
    assert dualpipe_paired(0, 8, 1, 20) == pytest.approx(9 / 20)
    assert dualpipe_paired(3, 8, 1, 20) == dualpipe_paired(4, 8, 1, 20) == pytest.approx(12 / 20)
    orders = dualpipe(8, 20)
    seq = orders[0]
    pairs = sum(1 for a, c in itertools.pairwise(seq) if a[0] == "F" and c[0] == "B" and a[1] != c[1])
    assert pairs == 9


def _moe() -> ArchConfig:
    return ArchConfig(
        "moe", layers=4, hidden=2048, heads=16, kv_heads=4, vocab=32000, seq_len=4096, experts=16, top_k=4,
        moe_ffn=1024,
    )  # fmt: skip


def test_two_copies_of_the_weights_and_the_all_to_alls_hidden_in_pairs() -> None:
    from echosim.compiler import lower

    cluster = Cluster("h100-sxm", 32, 8)
    base = Plan(pp=4, dp=8, ep=8, micro_batch=1, global_batch=96, seq_len=4096)
    one = lower(_moe(), base, cluster)
    dual = lower(_moe(), Plan(**{**base.as_dict(), "schedule": "dualpipe"}), cluster)
    # rank r holds stage r and stage pp-1-r: each rank's weights are those of a mirrored pair of 1F1B's ranks
    weights = [row["params"] for row in one.report.memory]
    assert [row["params"] for row in dual.report.memory] == [weights[r] + weights[3 - r] for r in range(4)]
    assert all(s.ep_hidden > 0 for s in dual.costed.stages)  # the pairs hide EP all-to-all without a flag
    assert dual.report.step_time_s < one.report.step_time_s
    assert sum(dual.report.breakdown.values()) == pytest.approx(dual.report.step_time_s, rel=1e-9)
    # each rank runs half of each of its two stages' micro-batches: its busy time is one stage pair's
    crit = dual.costed.critical_rank
    assert sorted(dual.costed.runs(crit, s.index) for s in dual.costed.chunks(crit)) == [6, 6]


@pytest.mark.parametrize(
    ("pp", "dp", "batch", "message"),
    [(3, 8, 96, "even pp"), (4, 8, 56, "micro-batches >= 2\\*pp = 8, got 7"), (4, 8, 48, ">= 2\\*pp = 8, got 6")],
)
def test_shapes_dualpipe_cannot_run_are_one_clear_error(pp: int, dp: int, batch: int, message: str) -> None:
    from echosim.compiler import lower

    plan = Plan(pp=pp, dp=dp, ep=8, micro_batch=1, global_batch=batch, seq_len=4096, schedule="dualpipe")
    with pytest.raises(PlanError, match=message):
        lower(_moe(), plan, Cluster("h100-sxm", pp * dp, 8))


def test_deepseek_v3_row_runs_dualpipe_and_others_keep_1f1b() -> None:
    from echosim.validation.cases import read_cases
    from echosim.validation.rows import row_plan

    cases = read_cases(SHARED / "validation" / "cases.csv")
    by_id = {c.case_id: c for c in cases}
    deepseek = next(c for i, c in by_id.items() if i.startswith("deepseekv3-2024-t1"))
    assert row_plan(deepseek)[0].schedule == "dualpipe"
    others = {row_plan(c)[0].schedule for c in cases if c["source_id"].startswith("megatron_bridge")}
    assert "dualpipe" not in others


def test_a_search_lists_dualpipe_only_when_asked() -> None:
    from echosim.layout_search import distinct_schedules
    from echosim.plugins import get_registry

    schedules = {name: e.value for name, e in get_registry().schedules.items()}
    assert "dualpipe" in schedules and "dualpipe" not in distinct_schedules(schedules)
