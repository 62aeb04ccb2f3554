"""transformers' dense Llama 4 MoE forward replaced by a routed one while capturing (echosim.frontend.moe_patches)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from echosim.compiler import lower  # noqa: E402
from echosim.frontend.moe_patches import routed_experts  # noqa: E402
from echosim.ir.ops import OpKind, Phase  # noqa: E402
from echosim.plan import Cluster, Plan  # noqa: E402

TINY_LLAMA4 = Path(__file__).parent / "configs" / "tiny-llama4.json"


@pytest.mark.parametrize("top_k", [1, 2])
def test_the_routed_forward_computes_what_the_dense_one_computes(top_k: int) -> None:
    """Each token through its top-k experts only, its input scaled by its router score: the dense forward's
    result (every token through every expert, scaled by a score that is zero off its top-k)."""
    from transformers import AutoConfig
    from transformers.models.llama4.modeling_llama4 import Llama4TextMoe

    config = AutoConfig.from_pretrained(TINY_LLAMA4).get_text_config()
    config.num_experts_per_tok = top_k
    torch.manual_seed(0)
    moe = Llama4TextMoe(config).float()
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.2)
    x = torch.randn(2, 7, config.hidden_size)
    dense, dense_logits = moe(x)
    with routed_experts() as patched:
        routed, logits = moe(x)
    assert patched == 1
    torch.testing.assert_close(routed, dense, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(logits, dense_logits)
    assert Llama4TextMoe.forward.__name__ == "forward"  # put back


def test_llama4_experts_do_each_tokens_top_k_and_expert_parallelism_splits_them() -> None:
    """The dense forward ran every token through all 4 experts (4x the experts' FLOPs at top-1; 128x for Llama 4
    Maverick) and --ep was refused: the grouped GEMMs now take tokens x top-k rows, and ep=2 splits them."""
    compiled = lower(f"hf:{TINY_LLAMA4}", Plan(seq_len=256), Cluster("null", devices=1))
    experts = [
        n
        for n in compiled.graph
        if n.op is OpKind.MATMUL and n.phase is Phase.FORWARD and n.scope == "model.layers.1.feed_forward.experts"
    ]
    assert [(n.attrs.m, n.attrs.batch) for n in experts] == [(64, 4), (64, 4)]  # 256 tokens x top-1 / 4 experts
    two = lower(f"hf:{TINY_LLAMA4}", Plan(seq_len=256, dp=2, ep=2, global_batch=2), Cluster("null", devices=2))
    assert two.report.breakdown["comm.ep"] > 0
    assert two.report.model_flops_per_step == pytest.approx(2 * compiled.report.model_flops_per_step, rel=1e-9)
