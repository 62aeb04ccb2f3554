"""Mixture of experts and expert parallelism: the zoo model, routing traffic, IR, time and gradients."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_MOE, capture, check_golden
from hypothesis import given, settings
from hypothesis import strategies as st

from echosim.frontend.zoo import PUBLISHED_PARAMS, ZOO, ArchConfig
from echosim.frontend.zoo_modules import build_module
from echosim.ir import Graph, print_graph, verify
from echosim.ir.ops import CollectiveAttrs, ElementwiseAttrs, MatmulAttrs, OpKind, ParamAttrs, Phase
from echosim.passes.autodiff import Autodiff
from echosim.passes.base import LayoutError, run_passes
from echosim.passes.data_parallel import DataParallel
from echosim.passes.expert_parallel import ExpertParallel, Routing
from echosim.passes.flops import graph_flops
from echosim.passes.gradient_groups import GradientGroups
from echosim.passes.tensor_parallel import TensorParallel
from echosim.plan import Cluster, Plan


@pytest.fixture(scope="module")
def tiny_moe() -> Graph:
    return capture(TINY_MOE)


def a2a(g: Graph, phase: Phase) -> list:
    return [n for n in g if n.op is OpKind.ALL_TO_ALL and n.phase is phase]


def grouped(g: Graph, phase: Phase = Phase.FORWARD) -> list:
    return [n for n in g if n.phase is phase and isinstance(n.attrs, MatmulAttrs) and n.attrs.batch > 1]


# ---- the model -----------------------------------------------------------------------------


def test_moe_capture_golden(tiny_moe: Graph) -> None:
    verify(tiny_moe)
    check_golden("capture_moe.txt", print_graph(tiny_moe))


@pytest.mark.parametrize("name", [n for n, c in ZOO.items() if c.arch == "moe"])
def test_moe_zoo_matches_published_size(name: str) -> None:
    assert ZOO[name].param_count() == pytest.approx(PUBLISHED_PARAMS[name], rel=0.01)


def test_moe_module_param_count_equals_closed_form(tiny_moe: Graph) -> None:
    assert tiny_moe.param_count() == TINY_MOE.param_count()
    assert sum(p.numel() for p in build_module(TINY_MOE).parameters()) == TINY_MOE.param_count()


def test_moe_layer_computes_top_k_mixture_on_cpu() -> None:
    """The fx leaf ops are real PyTorch: on CPU the layer equals a per-token loop over chosen experts."""
    from echosim.frontend import zoo_modules

    torch.manual_seed(0)
    moe = zoo_modules.MoE(TINY_MOE.with_(shared_experts=0))
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.2)
    x = torch.randn(2, 5, 64)
    out = moe(x)
    tokens = x.flatten(0, 1)
    weights, ids = torch.topk(torch.softmax(moe.router(tokens), -1), 2, dim=-1)
    ref = torch.zeros_like(tokens)
    for t in range(tokens.shape[0]):
        for j in range(2):
            e = int(ids[t, j])
            ex = moe.experts
            h = torch.nn.functional.silu(tokens[t] @ ex.gate_proj.weight[e]) * (tokens[t] @ ex.up_proj.weight[e])
            ref[t] += weights[t, j] * (h @ ex.down_proj.weight[e])
    torch.testing.assert_close(out, ref.view_as(x), rtol=1e-4, atol=1e-5)


def test_moe_flops_closed_form(tiny_moe: Graph) -> None:
    """Forward matmul FLOPs of a layer: router 2ThE, routed experts 2Tk*3hf, shared 2T*3hf*shared."""
    c, t = TINY_MOE, TINY_MOE.seq_len
    g = run_passes(tiny_moe, [Autodiff()])
    moe = [n for n in g if n.phase is Phase.FORWARD and ".moe" in n.scope and isinstance(n.attrs, MatmulAttrs)]
    got = sum(n.attrs.flops for n in moe)
    f = c.expert_ffn
    assert got == 2 * t * c.hidden * c.experts + 2 * t * c.top_k * 3 * c.hidden * f + 2 * t * 3 * c.hidden * f


# ---- routing traffic -------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    ep=st.integers(1, 64),
    rows=st.integers(1, 1 << 20),
    skew=st.floats(0.0, 1.0),
    capacity=st.one_of(st.just(0.0), st.floats(0.25, 8.0)),
)
def test_all_to_all_bytes_are_conserved(ep: int, rows: int, skew: float, capacity: float) -> None:
    """Whatever the skew and capacity: every row sent is received, dispatch and combine mirror each other,
    and the busiest rank processes min(imbalance, capacity) times its share."""
    imbalance = 1.0 + skew * (ep - 1)
    r = Routing(ep, rows, imbalance, capacity)
    m = r.matrix()
    sent = [r.sent(i) for i in range(ep)]
    received = [r.received(i) for i in range(ep)]
    assert sum(sent) == pytest.approx(sum(received), rel=1e-9)
    combine = [[m[dst][src] for dst in range(ep)] for src in range(ep)]  # the way back: the transpose
    assert [sum(row) for row in combine] == pytest.approx(received)
    assert [sum(combine[s][d] for s in range(ep)) for d in range(ep)] == pytest.approx(sent)
    for i in range(ep):
        assert sent[i] + r.dropped(i) == pytest.approx(rows)
        assert r.dropped(i) >= -1e-9 * rows
    cap = capacity if capacity > 0 else float("inf")
    assert r.load_factor() == pytest.approx(min(imbalance, cap) if ep > 1 else min(1.0, cap), rel=1e-9)
    assert max(received) == pytest.approx(received[0])  # rank 0 is the busiest


def test_balanced_all_to_all_moves_the_nccl_buffer() -> None:
    """Balanced: each rank's buffer is its dispatched rows, (ep-1)/ep of which leave it (nccl-tests convention)."""
    for ep in (2, 4, 8, 64):
        assert Routing(ep, 4096).wire_factor() == pytest.approx(1.0)
    assert Routing(8, 4096, imbalance=2.0).wire_factor() > 1.0


def test_routing_rejects_impossible_imbalance() -> None:
    with pytest.raises(LayoutError, match="between 1"):
        Routing(4, 100, imbalance=5.0)
    with pytest.raises(LayoutError, match="capacity factor"):
        ExpertParallel(2, capacity_factor=-1.0)


# ---- the expert-parallel pass ----------------------------------------------------------------


def test_expert_parallel_golden(tiny_moe: Graph) -> None:
    g = run_passes(tiny_moe, [TensorParallel(2, sequence_parallel=True), ExpertParallel(2, imbalance=1.5), Autodiff()])
    check_golden("ep2_tp2_sp_moe.txt", print_graph(g))


@pytest.mark.parametrize("ep", [1, 2, 4])
def test_graph_all_to_all_bytes_are_conserved(tiny_moe: Graph, ep: int) -> None:
    g = run_passes(tiny_moe, [ExpertParallel(ep), Autodiff()])
    fwd, bwd = a2a(g, Phase.FORWARD), a2a(g, Phase.BACKWARD)
    if ep == 1:
        assert not fwd and not bwd
        return
    dispatch = next(n for n in g if isinstance(n.attrs, ElementwiseAttrs) and n.attrs.fn == "moe_dispatch")
    assert [n.attrs.bytes for n in fwd] == [dispatch.out.nbytes] * 2  # dispatch and combine, balanced
    assert sorted(n.attrs.bytes for n in bwd) == sorted(n.attrs.bytes for n in fwd)  # conjugates
    assert all(n.attrs.size == ep for n in fwd + bwd)


def test_expert_parallel_shards_experts_and_keeps_balanced_flops(tiny_moe: Graph) -> None:
    one = run_passes(tiny_moe, [ExpertParallel(1), Autodiff()])
    four = run_passes(tiny_moe, [ExpertParallel(4), Autodiff()])
    assert graph_flops(four) == graph_flops(one)  # each rank still processes its T*k rows
    experts = [n for n in four.params() if isinstance(n.attrs, ParamAttrs) and n.attrs.expert]
    assert experts and all(n.out.shape[0] == 1 and n.attrs.shard == 4 for n in experts)
    assert all(n.attrs.batch == 1 for n in grouped(four))


def test_imbalance_raises_compute_and_all_to_all(tiny_moe: Graph) -> None:
    def shape(r: float, cf: float = 0.0) -> tuple[int, int]:
        g = run_passes(tiny_moe, [ExpertParallel(2, cf, r)])
        return sum(n.attrs.m * n.attrs.batch for n in grouped(g)), sum(n.attrs.bytes for n in a2a(g, Phase.FORWARD))

    rows, wire = shape(1.0)
    hot_rows, hot_wire = shape(2.0)
    assert hot_rows == 2 * rows and hot_wire == 2 * wire
    assert shape(2.0, cf=1.25)[0] == pytest.approx(1.25 * rows, abs=3)  # capacity drops the excess


def test_expert_parallel_layout_errors(tiny_moe: Graph) -> None:
    with pytest.raises(LayoutError, match="ep=8 does not divide experts 4"):
        run_passes(tiny_moe, [ExpertParallel(8)])
    with pytest.raises(LayoutError, match="needs routed experts"):
        run_passes(capture(TINY_MOE.with_(arch="llama")), [ExpertParallel(2)])


def test_expert_gradients_sync_over_expert_data_parallel_ranks(tiny_moe: Graph) -> None:
    dp, cp, ep = 4, 2, 4
    g = run_passes(tiny_moe, [ExpertParallel(ep), Autodiff()])
    plain = DataParallel(dp * cp)  # gradients reduce over dp x cp ranks
    before = run_passes(g, [plain])
    after = run_passes(before, [GradientGroups(ep=ep)])
    syncs = [n for n in after if isinstance(n.attrs, CollectiveAttrs) and n.attrs.axis.value in ("dp", "edp")]
    assert {n.attrs.axis.value: n.attrs.size for n in syncs} == {"dp": dp * cp, "edp": dp * cp // ep}
    total = sum(n.attrs.bytes for n in before if isinstance(n.attrs, CollectiveAttrs) and n.attrs.axis.value == "dp")
    assert sum(n.attrs.bytes for n in syncs) == total
    expert = sum(n.out.numel for n in g.params() if n.attrs.expert) * 4  # fp32 grads of one layer
    assert sum(n.attrs.bytes for n in syncs if n.attrs.axis.value == "edp") == pytest.approx(expert, rel=1e-6)


# ---- expert tensor parallelism 1 (Megatron's MoE parallel folding) ---------------------------


def _etp1(tiny_moe: Graph, ep: int = 2) -> Graph:
    passes = [TensorParallel(2, sequence_parallel=True, expert_tp=1), ExpertParallel(ep, imbalance=1.5), Autodiff()]
    return run_passes(tiny_moe, passes)


def test_expert_tensor_parallel_one_golden(tiny_moe: Graph) -> None:
    check_golden("etp1_ep2_tp2_sp_moe.txt", print_graph(_etp1(tiny_moe)))


def test_whole_experts_run_on_each_ranks_own_tokens(tiny_moe: Graph) -> None:
    """etp 1 under tp 2 (SP): no tensor-parallel collective touches the routed rows; each rank dispatches
    its 16 / 2 = 8 tokens x top-2 = 16 rows of 64 fp16 features (2048 B), the busiest of ep 2 receives
    1.5 / 2 of both ranks' rows (24) and runs them through whole experts, so the grouped GEMMs do the
    FLOPs of the etp = tp layout (twice the rows, half the width) and the wire carries the same bytes."""
    folded = _etp1(tiny_moe)
    split = run_passes(
        tiny_moe, [TensorParallel(2, sequence_parallel=True), ExpertParallel(2, imbalance=1.5), Autodiff()]
    )
    experts = [n for n in folded.params() if isinstance(n.attrs, ParamAttrs) and n.attrs.expert]
    assert experts and all(n.out.shape[0] == 2 and n.attrs.shard == 2 for n in experts)  # 4 experts / ep 2, whole
    assert {n.out.shape[1:] for n in experts} == {(64, 32), (32, 64)}
    region = {n.scope for n in grouped(folded)}
    tp_in_region = [n for n in folded if isinstance(n.attrs, CollectiveAttrs) and n.attrs.axis.value == "tp"
                    and n.scope in region]  # fmt: skip
    assert not tp_in_region
    dispatch = a2a(folded, Phase.FORWARD)[0]
    assert dispatch.attrs.bytes == round(1.5 * 16 * 64 * 2) and dispatch.out.shape == (24, 64)
    assert [n.attrs.bytes for n in a2a(folded, Phase.FORWARD)] == [n.attrs.bytes for n in a2a(split, Phase.FORWARD)]
    assert sum(n.attrs.flops for n in grouped(folded)) == sum(n.attrs.flops for n in grouped(split))
    assert [n.attrs.m * n.attrs.batch for n in grouped(folded)] == [24] * 3  # the repeated layer's gate, up, down


def test_whole_expert_gradients_sync_over_the_folded_expert_data_parallel_group(tiny_moe: Graph) -> None:
    """tp 2, dp 4, ep 4, etp 1: an expert lives on tp*dp/(etp*ep) = 2 ranks; dense weights on dp = 4."""
    g = run_passes(_etp1(tiny_moe, ep=4), [DataParallel(4), GradientGroups(ep=4, expert_fold=2)])
    syncs = {n.attrs.axis.value: n.attrs.size for n in g if isinstance(n.attrs, CollectiveAttrs)
             and n.attrs.axis.value in ("dp", "edp")}  # fmt: skip
    assert syncs == {"dp": 4, "edp": 2}


def test_folded_expert_groups_are_placed_etp_ep_edp() -> None:
    """Megatron-Core orders expert ranks etp-ep-edp-pp: with etp 1 an EP group of 16 is 16 consecutive
    ranks (two 8-GPU nodes) and its expert-data-parallel peers are 16 apart; tp 2 dp 16 pp 8 (qwen3-235b)."""
    from echosim.ir.ops import Axis
    from echosim.timeline.placement import Degrees, axis_placements

    where = axis_placements(Degrees(tp=2, pp=8, dp=16, ep=16, etp=1), 8)
    assert (where[Axis.EP].size, where[Axis.EP].nodes, where[Axis.EP].per_node) == (16, 2, 8)
    assert (where[Axis.EDP].size, where[Axis.EDP].nodes, where[Axis.EDP].per_node) == (2, 2, 1)
    assert Plan(tp=2, dp=16, ep=32, etp=1).expert_dp == 1 and Plan(tp=2, dp=64, ep=64, etp=1).expert_dp == 2
    assert Plan(tp=2, dp=64, ep=64).expert_dp == 1  # etp = tp: dp / ep


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        (Plan(tp=4, sp=True, dp=2, ep=2, etp=2), "--etp 2: echosim shards routed experts over all"),
        (Plan(tp=2, sp=True, dp=4, ep=16, etp=1), "ep=16 does not divide tp\\*cp\\*dp = 8"),
        (Plan(tp=2, dp=4, ep=8, etp=1), "needs sequence parallelism"),
        (Plan(tp=2, sp=True, dp=4, ep=8), "etp\\*ep = 2\\*8 = 16 does not divide tp\\*cp\\*dp = 8"),
    ],
)
def test_expert_tensor_parallel_layout_errors(plan: Plan, message: str) -> None:
    from echosim.layout import check_experts
    from echosim.plan import PlanError

    with pytest.raises(PlanError, match=message):
        check_experts(plan)


def test_compile_folds_expert_parallelism_over_tensor_parallel_ranks() -> None:
    """ep 8 over tp 2 x dp 4 (ep does not divide dp) compiles with etp 1; every expert lives on one rank."""
    from echosim.compiler import lower

    plan = Plan(tp=2, sp=True, dp=4, ep=8, etp=1, global_batch=8, seq_len=4096)
    c = lower(_moe_cfg(), plan, Cluster("h100-sxm", 8, 8))
    sizes = {(n.attrs.axis.value, n.attrs.size) for n in c.stages[0].graph if isinstance(n.attrs, CollectiveAttrs)}
    assert {("tp", 2), ("ep", 8), ("dp", 4), ("edp", 1)} <= sizes  # edp = 2*4/8 = 1: costs nothing
    assert c.report.step_time_s > 0


def test_zero_updates_expert_parameters_over_their_expert_data_parallel_ranks(tiny_moe: Graph) -> None:
    """ZeRO-1 with dp 8, ep 4: dense weights split 8 ways, routed experts 8 / 4 = 2 ways (their state's sharding)."""
    from echosim.passes.data_parallel import Optimizer

    g = run_passes(tiny_moe, [ExpertParallel(4), Autodiff()])
    experts = sum(p.out.numel * g.multiplicity(p) for p in g.params() if p.attrs.expert)
    dense = g.param_count() - experts
    step = next(n for n in run_passes(g, [Optimizer(shard=8, expert_shard=2)]) if n.op is OpKind.OPTIMIZER_UPDATE)
    assert experts and step.attrs.params == -(-dense // 8) + experts // 2
    plain = next(n for n in run_passes(g, [Optimizer(shard=8)]) if n.op is OpKind.OPTIMIZER_UPDATE)
    assert plain.attrs.params == -(-dense // 8) + -(-experts // 8)


# ---- end to end ---------------------------------------------------------------------------


def _moe_cfg() -> ArchConfig:
    return ArchConfig(
        "moe", layers=2, hidden=2048, heads=16, kv_heads=4, vocab=32000, seq_len=4096, experts=16, top_k=2,
        moe_ffn=2048,
    )  # fmt: skip


def test_compile_moe_with_tp_sp_ep_cp() -> None:
    from echosim.compiler import lower

    plan = Plan(tp=2, sp=True, dp=4, ep=4, cp=2, global_batch=8, seq_len=4096)
    c = lower(_moe_cfg(), plan, Cluster("h100-sxm", 16, 8))
    for s in c.stages:
        verify(s.graph)
    axes = {n.attrs.axis.value for n in c.stages[0].graph if isinstance(n.attrs, CollectiveAttrs)}
    assert {"tp", "cp", "ep", "dp", "edp"} <= axes
    assert c.report.step_time_s > 0 and 0 < c.report.mfu < 1


def test_step_time_rises_with_routing_imbalance() -> None:
    from echosim.compiler import compile

    times = []
    for r in (1.0, 1.5, 2.0, 4.0):
        plan = Plan(dp=8, ep=8, global_batch=8, seq_len=4096, moe_imbalance=r)
        times.append(compile(_moe_cfg(), plan, Cluster("h100-sxm", 8, 8)).step_time_s)
    assert times == sorted(times) and times[-1] > 1.2 * times[0]


# ---- DeepEP's dispatcher -------------------------------------------------------------------


def test_deepep_network_copies_per_node_closed_form() -> None:
    """A token's k distinct experts, drawn evenly from E, reach a given other node with probability
    1 - C(E - E/N, k) / C(E, k); the network leg's buffer is the flat one x N x reach / k."""
    from math import comb

    from echosim.backends.deepep import node_reach, rdma_buffer

    assert node_reach(8, 2, 2) == pytest.approx(1 - comb(4, 2) / comb(8, 2))  # 22/28
    assert node_reach(256, 8, 4) == pytest.approx(1 - comb(192, 8) / comb(256, 8))
    assert node_reach(128, 8, 1) == 1.0 and node_reach(8, 1, 8) == pytest.approx(1 / 8)
    # top-1: every token crosses once to the node of its expert -> the same off-node bytes as NCCL's
    flat = 1 << 20
    assert rdma_buffer(flat, 8, 1, 8) == flat
    # top-8 of 256 on 4 nodes: 4 x 0.9 / 8 of the flat buffer
    assert rdma_buffer(flat, 256, 8, 4) == round(flat * 4 * node_reach(256, 8, 4) / 8)


def test_deepep_time_is_the_slower_leg_and_nccl_within_a_node() -> None:
    from echosim.backends.base import Placement
    from echosim.backends.deepep import deepep_time_s, rdma_buffer

    seen: list[tuple[int, Placement]] = []

    def cost(kind: OpKind, nbytes: int, where: Placement) -> float:
        seen.append((nbytes, where))
        return nbytes / (1e9 if where.nodes > 1 else 8e9)  # network 8x slower than NVLink

    inside = Placement(8, 1, 8)
    assert deepep_time_s(cost, 800, inside, 128, 8) == 800 / 8e9 and seen == [(800, inside)]
    seen.clear()
    across = Placement(32, 4, 8)
    rdma = rdma_buffer(800, 128, 8, 4)
    assert deepep_time_s(cost, 800, across, 128, 8) == max(rdma / 1e9, 800 / 8e9)
    assert seen == [(rdma, Placement(4, 4, 1, 8)), (800, Placement(8, 1, 8))]  # one rail per GPU, then NVLink


def test_deepep_dispatcher_marks_the_expert_all_to_alls(tiny_moe: Graph) -> None:
    plain = run_passes(tiny_moe, [ExpertParallel(2), Autodiff()])
    deep = run_passes(tiny_moe, [ExpertParallel(2, dispatcher="deepep"), Autodiff()])
    fwd, bwd = a2a(deep, Phase.FORWARD), a2a(deep, Phase.BACKWARD)
    assert fwd and bwd and {(n.attrs.experts, n.attrs.top_k) for n in fwd + bwd} == {(4, 2)}
    assert [n.attrs.bytes for n in fwd] == [n.attrs.bytes for n in a2a(plain, Phase.FORWARD)]
    assert all(n.attrs.top_k == 0 for n in a2a(plain, Phase.FORWARD))
    with pytest.raises(LayoutError, match="MoE dispatcher 'nvshmem': unknown"):
        ExpertParallel(2, dispatcher="nvshmem")


def test_group_limited_routing_reaches_fewer_nodes() -> None:
    """DeepSeek-V3: 256 experts in 8 groups, a token's 8 experts from 4 of them (n_group 8, topk_group 4)."""
    from math import comb

    from echosim.backends.deepep import node_reach

    free = node_reach(256, 8, 8)
    assert free == pytest.approx(1 - comb(224, 8) / comb(256, 8))  # 0.662
    # one group per node: the node's group is taken with p = 4/8, then one of its 32 experts of the 128 chosen
    assert node_reach(256, 8, 8, 8, 4) == pytest.approx(0.5 * (1 - comb(96, 8) / comb(128, 8)))  # 0.454
    # two groups per node: 0, 1 or 2 of the node's groups taken (hypergeometric), then its experts
    two = sum(comb(2, j) * comb(6, 4 - j) / comb(8, 4) * comb(128 - 32 * j, 8) / comb(128, 8) for j in range(3))
    assert node_reach(256, 8, 4, 8, 4) == pytest.approx(1 - two)
    # half a group per node (16 nodes of 16 experts)
    assert node_reach(256, 8, 16, 8, 4) == pytest.approx(0.5 * (1 - comb(112, 8) / comb(128, 8)))
    # every group allowed is no limit; one node is always reached
    assert node_reach(256, 8, 8, 8, 8) == free and node_reach(256, 8, 1, 8, 4) == 1.0
    for nodes in (2, 4, 8, 16, 32):
        assert node_reach(256, 8, nodes, 8, 4) <= node_reach(256, 8, nodes) + 1e-12


def test_router_groups_ride_on_the_deepep_all_to_alls(tiny_moe: Graph) -> None:
    deep = run_passes(tiny_moe, [ExpertParallel(2, dispatcher="deepep", router_groups=(2, 1)), Autodiff()])
    assert {(n.attrs.groups, n.attrs.group_topk) for n in a2a(deep, Phase.FORWARD) + a2a(deep, Phase.BACKWARD)} == {
        (2, 1)
    }
    with pytest.raises(LayoutError, match="do not divide the layer's 4 experts"):
        run_passes(tiny_moe, [ExpertParallel(2, dispatcher="deepep", router_groups=(3, 1))])
    for bad in ((4, 0), (0, 1), (2, 3), (-2, 1)):
        with pytest.raises(LayoutError, match="router groups"):
            ExpertParallel(2, router_groups=bad)
    assert "moe_router_groups" not in Plan().as_dict()
    assert Plan(moe_router_groups=8, moe_router_group_topk=4).as_dict()["moe_router_group_topk"] == 4


def test_deepep_cuts_cross_node_expert_traffic_only() -> None:
    """ep 16 over two 8-GPU nodes: DeepEP's (and HybridEP's) network leg carries each token once per node it
    reaches; with ep 8 on one node every dispatcher is the same NVLink exchange."""
    from dataclasses import replace

    from echosim.compiler import compile

    def ep_s(plan: Plan, devices: int) -> float:
        return compile(_moe_cfg(), plan, Cluster("h100-sxm", devices, 8)).breakdown["comm.ep"]

    across = Plan(dp=16, ep=16, global_batch=16, seq_len=4096)
    # top-2 of 16 experts: a token reaches the other node with p = 1 - C(8,2)/C(16,2) = 0.77 instead of
    # sending both copies: 0.77 of the flat network bytes
    assert ep_s(replace(across, moe_dispatcher="deepep"), 16) < 0.85 * ep_s(across, 16)
    inside = Plan(dp=8, ep=8, global_batch=8, seq_len=4096)
    assert ep_s(replace(inside, moe_dispatcher="deepep"), 8) == ep_s(inside, 8)
    # HybridEP's exchange is the same hierarchy (network once per node, then NVLink): the same seconds as
    # DeepEP's across nodes, and as the flat all_to_all inside one domain
    assert ep_s(replace(across, moe_dispatcher="hybridep"), 16) == ep_s(replace(across, moe_dispatcher="deepep"), 16)
    assert ep_s(replace(inside, moe_dispatcher="hybridep"), 8) == ep_s(inside, 8)


# ---- padded capacity: MaxText's dropping path (dense_matmul with capacity_factor > 0) --------


def _einsums(g: Graph, tag: str) -> list:
    return [n for n in g if n.op is OpKind.MATMUL and tag in n.name]


def test_padded_capacity_runs_every_slot_and_prices_the_one_hot_einsums(tiny_moe: Graph) -> None:
    """MaxText pads each expert to C = int(ceil(S k / E) cf) slots per sequence (16 x 2 / 4 x 1.25 = 10) and
    fills and empties them with one-hot einsums: the experts run 40 slots per 32 routed rows, the all_to_alls
    move the padded buffers, and each einsum costs 2 T (E C) M FLOPs."""
    plain = run_passes(tiny_moe, [ExpertParallel(2)])
    padded = run_passes(tiny_moe, [ExpertParallel(2, 1.25, padded=True, seq_len=16)])
    rows = sum(n.attrs.m * n.attrs.batch for n in grouped(plain))
    assert sum(n.attrs.m * n.attrs.batch for n in grouped(padded)) == pytest.approx(1.25 * rows, abs=2)
    wire = sum(n.attrs.bytes for n in a2a(plain, Phase.FORWARD))
    assert sum(n.attrs.bytes for n in a2a(padded, Phase.FORWARD)) == pytest.approx(1.25 * wire, rel=1e-3)
    dispatches = [n for n in tiny_moe if isinstance(n.attrs, ElementwiseAttrs) and n.attrs.fn == "moe_dispatch"]
    tokens, hidden = tiny_moe[dispatches[0].inputs[0]].out.shape
    for tag in ("dispatch_einsum", "combine_einsum"):
        found = _einsums(padded, tag)
        assert len(found) == len(dispatches)  # one per MoE layer held
        assert all(n.attrs.flops == 2 * tokens * 4 * 10 * hidden for n in found)
    assert not [n for n in padded if "moe_sort_chunks" in n.name]  # the slots are laid out expert by expert
    # a rank holding half a sequence (SP / CP) counts capacity over the whole one: C = 20 for S = 32
    half = run_passes(tiny_moe, [ExpertParallel(2, 1.25, padded=True, seq_len=2 * tokens)])
    assert all(n.attrs.flops == 2 * tokens * 4 * 20 * hidden for n in _einsums(half, "einsum"))


def test_padded_einsum_gradients_skip_the_boolean_mask(tiny_moe: Graph) -> None:
    """The dispatch mask is boolean (no gradient): its einsum's backward is one product, for the tokens; the
    combine mask holds the router weights: two products, for the slots and for the weights."""
    g = run_passes(tiny_moe, [ExpertParallel(2, 1.25, padded=True, seq_len=16), Autodiff()])
    back = [n for n in g if n.phase is Phase.BACKWARD and n.op is OpKind.MATMUL and "einsum" in n.name]
    assert sorted({n.name.rsplit(".", 1)[1] for n in back if "dispatch_einsum" in n.name}) == ["dgrad"]
    assert sorted({n.name.rsplit(".", 1)[1] for n in back if "combine_einsum" in n.name}) == ["dgrad", "wgrad"]
    with pytest.raises(LayoutError, match="capacity factor > 0"):
        run_passes(tiny_moe, [ExpertParallel(2, padded=True)])
    # MFU counts the model's work: padding and einsums are hardware FLOPs only
    plain = graph_flops(run_passes(tiny_moe, [ExpertParallel(2), Autodiff()]))
    padded = graph_flops(g)
    assert padded.model == pytest.approx(plain.model, rel=1e-3)
    assert padded.hardware - padded.model == padded.overhead > 0


def test_maxtext_pads_experts_only_with_a_capacity_factor() -> None:
    from echosim.frameworks import get_framework
    from echosim.passes.plugin import _expert

    assert get_framework("maxtext").moe_capacity_padding and not get_framework("nemo").moe_capacity_padding
    assert _expert(Plan(ep=4, dp=4, framework="maxtext", moe_capacity_factor=1.25)).padded
    assert not _expert(Plan(ep=4, dp=4, framework="maxtext")).padded  # dropless (megablox)
    assert not _expert(Plan(ep=4, dp=4, framework="nemo", moe_capacity_factor=1.25)).padded  # drops, no padding
