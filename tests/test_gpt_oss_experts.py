"""gpt-oss's experts as Megatron-Core runs them: the clamped SwiGLU's clamps and concatenation outside the
fused activation (megatron/core/fusions/fused_bias_geglu.py ``weighted_bias_quick_geglu_impl``)."""

from __future__ import annotations

import pytest
from conftest import SHARED

from echosim.compiler import lower
from echosim.frontend.zoo import GPT_OSS_SWIGLU_LIMIT, ArchConfig
from echosim.ir.ops import ElementwiseAttrs, Phase
from echosim.plan import Cluster, Plan

CASES = SHARED / "validation" / "cases.csv"
T, K, H, F = 128, 2, 256, 192  # tokens of one micro-batch, top-k, hidden, expert FFN
MOE = ArchConfig(
    "moe", layers=2, hidden=H, heads=4, kv_heads=2, vocab=1024, ffn=F, seq_len=T, experts=4, top_k=K, moe_ffn=F
)
CLAMPED = MOE.with_(expert_clamp=GPT_OSS_SWIGLU_LIMIT)


def _ops(cfg: ArchConfig, plan: Plan) -> list:
    return list(lower(cfg, plan, Cluster("h100-sxm", 1)).stages[0].graph)


def _fn(n: object) -> str:
    attrs = getattr(n, "attrs", None)
    return attrs.fn if isinstance(attrs, ElementwiseAttrs) else ""


def test_clamped_swiglu_clamps_each_half_then_concatenates() -> None:
    """Forward: two clamps over [T*k, F] and one concatenation into [T*k, 2F] per MoE layer (folded: one
    layer's ops stand for both); none without a clamp. Backward: each clamp's masked gradient and the
    gradient of the chunk, gathered into one [T*k, 2F] tensor."""
    plain = _ops(MOE, Plan())
    assert not [n for n in plain if _fn(n).startswith("clamp")]
    ops = _ops(CLAMPED, Plan())
    fwd = [n for n in ops if n.phase is Phase.FORWARD and "experts" in (n.scope or "")]
    clamps = [n for n in fwd if _fn(n) == "clamp"]
    cats = [n for n in fwd if _fn(n) == "cat"]
    assert [c.out.shape for c in clamps] == [(T * K, F)] * 2
    assert [c.out.shape for c in cats] == [(T * K, 2 * F)]
    grads = [n for n in ops if n.phase is Phase.BACKWARD and _fn(n) == "clamp_grad"]
    assert [g.out.shape for g in grads] == [(T * K, F)] * 2
    assert [n.out.shape for n in ops if n.phase is Phase.BACKWARD and n.name.endswith("grad_cat")].count(
        (T * K, 2 * F)
    ) == 1


def test_clamped_swiglu_costs_its_passes_over_fc1s_output() -> None:
    """The clamp adds memory-bound time only: the same GEMMs, more streaming kernels."""
    a = lower(MOE, Plan(), Cluster("h100-sxm", 1)).report.breakdown
    b = lower(CLAMPED, Plan(), Cluster("h100-sxm", 1)).report.breakdown
    assert b["compute.matmul"] == pytest.approx(a["compute.matmul"])
    assert b["compute.memory_bound"] > a["compute.memory_bound"]


def test_moe_act_recompute_replays_the_clamps_with_the_activation() -> None:
    """Megatron's ``moe_act`` checkpoints ``bias_act_func``, clamps included: the replay holds the clamps,
    the concatenation and the activation."""
    ops = _ops(CLAMPED, Plan(framework="megatron", recompute="selective:moe_act"))
    replayed = {_fn(n) for n in ops if n.phase is Phase.RECOMPUTE}
    assert {"clamp", "cat", "silu", "mul"} <= replayed


@pytest.mark.skipif(not CASES.exists(), reason="shared/validation not present")
def test_gpt_oss_rows_carry_the_clamp() -> None:
    from echosim.validation.cases import read_cases
    from echosim.validation.rows import row_model

    rows = {c["case_id"]: c for c in read_cases(CASES)}
    assert row_model(rows["mbridge260401-gpt-oss-120b-bf16-gb200-64"]).expert_clamp == 7.0
    assert row_model(rows["mbridge260401-gpt-oss-120b-bf16-gb200-64"]).expert_bias
    deepseek = row_model(rows["mbridge2604-deepseekv3-mxfp8-b200-256"])
    assert deepseek.expert_clamp == 0.0 and not deepseek.expert_bias


BIASED = MOE.with_(expert_bias=True)


def test_expert_bias_is_added_after_the_grouped_gemm_as_megatron_does() -> None:
    """fc2's bias: the scaled bias rows ``b * p`` ([T*k, h], one write), the add (two reads, one write) and the
    concatenation of the experts' pieces (one read, one write): 6 T*k*h elements moved forward."""
    ops = _ops(BIASED, Plan())
    fwd = [n for n in ops if n.phase is Phase.FORWARD and "experts" in (n.scope or "")]
    (scaled,) = [n for n in fwd if _fn(n) == "moe_expert_bias"]
    assert scaled.out.shape == (T * K, H)
    (add,) = [n for n in fwd if _fn(n) == "add" and scaled.id in n.inputs]
    (cat,) = [n for n in fwd if _fn(n) == "cat" and add.id in n.inputs]
    assert cat.out.shape == (T * K, H)
    grads = {_fn(n) for n in ops if n.phase is Phase.BACKWARD}
    assert "moe_expert_bias_grad" in grads  # the bias and the router weights get gradients
    assert BIASED.param_count() - MOE.param_count() == 2 * 4 * H  # [experts, hidden] per MoE layer
    a = lower(MOE, Plan(), Cluster("h100-sxm", 1)).report.breakdown
    b = lower(BIASED, Plan(), Cluster("h100-sxm", 1)).report.breakdown
    assert b["compute.matmul"] == pytest.approx(a["compute.matmul"])
    assert b["compute.memory_bound"] > a["compute.memory_bound"]


def test_expert_bias_rows_scale_each_rows_expert_bias_by_its_router_weight() -> None:
    """The leaf's plain-PyTorch body (run on CPU): row r of the dispatch gets bias[expert(r)] * weight(r)."""
    import torch

    from echosim.frontend.moe_ops import expert_bias_rows

    bias = torch.arange(6.0).view(3, 2)  # 3 experts, hidden 2
    ids = torch.tensor([[2, 0], [0, 1]])  # 2 tokens, top-2
    weights = torch.tensor([[0.5, 0.25], [1.0, 2.0]])
    rows = expert_bias_rows(bias, ids, weights)
    # rows grouped by expert (stable): (t0, e0, .25), (t1, e0, 1), (t1, e1, 2), (t0, e2, .5)
    want = torch.stack([bias[0] * 0.25, bias[0] * 1.0, bias[1] * 2.0, bias[2] * 0.5])
    assert torch.equal(rows, want)
