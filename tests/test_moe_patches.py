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
    assert patched >= 2  # Llama4TextMoe and Llama4TextExperts (and any other imported class patched)
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


def test_dbrx_experts_as_grouped_gemms_compute_what_its_loop_computes(tmp_path: Path) -> None:
    """DbrxExperts loops over the experts a batch hits and picks each one's tokens with torch.where: a shape that
    depends on the routing, so torch.export could not capture DBRX at all. The grouped form gives the same result,
    the capture costs tokens x top-k rows through the experts, and expert parallelism splits them."""
    from transformers import AutoConfig
    from transformers.models.dbrx.modeling_dbrx import DbrxFFN

    config = AutoConfig.for_model(
        "dbrx",
        d_model=64,
        n_heads=4,
        n_layers=2,
        max_seq_len=256,
        vocab_size=512,
        attn_config={"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
        ffn_config={"ffn_hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2},
    )
    torch.manual_seed(0)
    ffn = DbrxFFN(config).float()
    for p in ffn.parameters():
        torch.nn.init.normal_(p, std=0.2)
    x = torch.randn(2, 7, 64)
    expected = ffn(x)
    with routed_experts():
        torch.testing.assert_close(ffn(x), expected, rtol=1e-4, atol=1e-5)
    config.to_json_file(tmp_path / "config.json")
    compiled = lower(f"hf:{tmp_path}", Plan(seq_len=128), Cluster("null", devices=1))
    experts = [n for n in compiled.graph if n.op is OpKind.MATMUL and n.phase is Phase.FORWARD and n.attrs.grouped]
    assert {(n.attrs.m, n.attrs.batch) for n in experts} == {(64, 4)}  # 128 tokens x top-2 / 4 experts
    # its [experts * ffn, hidden] weights viewed per expert are held as expert stacks, which ep=2 splits
    two = lower(f"hf:{tmp_path}", Plan(seq_len=128, dp=2, ep=2, global_batch=2), Cluster("null", devices=2))
    stacks = {n.out.shape[0] for n in two.graph if n.op is OpKind.PARAMETER and ".experts." in n.name}
    assert stacks == {2} and two.report.breakdown["comm.ep"] > 0
    assert two.report.params == compiled.report.params
