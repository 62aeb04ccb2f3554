"""The fused grouped expert MLP (echosim.passes.fused_mlp): the GLU and its casts in the grouped GEMMs' epilogues."""

from __future__ import annotations

from dataclasses import replace

import pytest
from click.testing import CliRunner
from conftest import TINY_MOE, capture, check_golden

from echosim.cli import cli
from echosim.frontend.zoo import ArchConfig
from echosim.ir import Graph, print_graph, verify
from echosim.ir.ops import ElementwiseAttrs, MatmulAttrs, OpKind
from echosim.passes.autodiff import Autodiff
from echosim.passes.base import run_passes
from echosim.passes.expert_parallel import ExpertParallel
from echosim.passes.flops import io_bytes
from echosim.passes.fused_mlp import FusedExpertMlp, epilogue_nodes
from echosim.passes.precision import Fp8Linears
from echosim.plan import Cluster, Plan, PlanError


@pytest.fixture(scope="module")
def fused() -> Graph:
    graph = capture(TINY_MOE)
    return run_passes(graph, [ExpertParallel(2), Autodiff(), Fp8Linears("mxfp8"), FusedExpertMlp()])


def _grouped(g: Graph) -> set[int]:
    return {n.id for n in g if isinstance(n.attrs, MatmulAttrs) and n.attrs.grouped}


def test_the_golden_ir(fused: Graph) -> None:
    verify(fused)
    check_golden("fused_mlp_ep2_mxfp8_moe.txt", print_graph(fused))


def test_only_the_glu_between_grouped_gemms_moves_into_their_epilogues(fused: Graph) -> None:
    marked = {n.id for n in fused if isinstance(n.attrs, ElementwiseAttrs) and n.attrs.epilogue}
    assert marked == epilogue_nodes(fused) and marked
    # the SwiGLU, its product and the cast of the down projection's input; backward, their gradients and the casts
    # of the gate and up projections' output gradients: 3 forward and 5 backward kernels a layer
    fns = sorted(str(fused[i].attrs).removesuffix(" [epilogue]") for i in marked)
    assert fns == sorted(["silu", "mul", "mxfp8_cast", "mul_grad", "mul_grad", "silu_grad", "mxfp8_cast", "mxfp8_cast"])
    grouped = _grouped(fused)
    for i in marked:  # fed by grouped GEMMs (or each other), and feeding only those
        n = fused[i]
        srcs = [fused[j] for j in n.inputs]
        while any(s.op is OpKind.VIEW for s in srcs):
            srcs = [fused[s.inputs[0]] if s.op is OpKind.VIEW else s for s in srcs]
        assert all(s.id in grouped or s.id in marked or s.op is OpKind.PARAMETER for s in srcs), n.name
    for n in fused:  # the exchange's permutes, the combine and the shared expert's (dense) MLP stay kernels
        if any(k in n.name for k in ("sort_chunks", "moe_dispatch", "moe_combine")) or "shared" in n.scope:
            assert n.id not in marked, n.name


def test_an_epilogue_node_moves_no_bytes_and_costs_nothing() -> None:
    from echosim.compiler import compile, lower

    cfg = ArchConfig(
        "moe", layers=2, hidden=2048, heads=16, kv_heads=4, vocab=32000, seq_len=4096, experts=16, top_k=2,
        moe_ffn=2048,
    )  # fmt: skip
    plan = Plan(dp=8, ep=8, global_batch=8, dtype="mxfp8", framework="megatron-bridge")
    base = compile(cfg, plan, Cluster("gb200", 8, 8))
    fast = compile(cfg, replace(plan, moe_fused_mlp=True), Cluster("gb200", 8, 8))
    assert fast.breakdown["compute.memory_bound"] < base.breakdown["compute.memory_bound"]
    assert fast.breakdown["compute.matmul"] == pytest.approx(base.breakdown["compute.matmul"])
    assert fast.step_time_s < base.step_time_s
    assert fast.plan["moe_fused_mlp"] is True and "moe_fused_mlp" not in base.plan
    stage = lower(cfg, replace(plan, moe_fused_mlp=True), Cluster("gb200", 8, 8)).stages[0].graph
    epilogue = [n for n in stage if isinstance(n.attrs, ElementwiseAttrs) and n.attrs.epilogue]
    assert epilogue and all(io_bytes(stage, n) == 0 for n in epilogue)


@pytest.mark.parametrize(
    ("plan", "backend", "message"),
    [
        (Plan(dp=8, ep=8, dtype="bf16", moe_fused_mlp=True), "gb200", "needs a block-scaled recipe"),
        (Plan(dp=8, ep=8, dtype="fp8", moe_fused_mlp=True), "b200", "needs a block-scaled recipe"),
        (Plan(dp=8, ep=8, dtype="fp8", moe_fused_mlp=True), "h100-sxm", "needs a block-scaled recipe"),
    ],
)
def test_the_fused_mlp_is_refused_off_blackwell_block_scaled_runs(plan: Plan, backend: str, message: str) -> None:
    from echosim.compiler import compile

    with pytest.raises(PlanError, match=message):
        compile(TINY_MOE, replace(plan, global_batch=8), Cluster(backend, 8, 8))


def test_the_cli_refuses_it_off_blackwell() -> None:
    from echosim.layout import check_fused_mlp

    with pytest.raises(PlanError, match="Blackwell GPUs"):
        check_fused_mlp(Plan(dtype="mxfp8", moe_fused_mlp=True), "h200")
    args = ["compile", "qwen3-30b-a3b", "--backend", "gb200", "--devices", "8", "--ep", "8", "--moe-fused-mlp"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert result.output.strip().splitlines()[-1].startswith("Error: --moe-fused-mlp needs a block-scaled recipe")
