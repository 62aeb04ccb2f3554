"""llm-foundry's attn_impl 'flash' on flash-attn 1.x: FlashAttention v1 at its published rate next to
FlashAttention-2 (FA2 paper's A100 / H100 forward + backward figures), and which benchmark rows ran it."""

from __future__ import annotations

import pytest
from conftest import SHARED

from echosim.backends.compute import (
    FA1_FWD_BWD_TFLOPS,
    FIGURE_DEVICES,
    attention_flops,
    attention_time_s,
    fa1_slowdown,
    fa2_figure_tflops,
    fa2_view,
    flash_attention_time_s,
    pad_copies_time_s,
)
from echosim.backends.devices import get_device
from echosim.frameworks import get_framework
from echosim.ir.ops import AttentionAttrs
from echosim.validation.cases import read_cases
from echosim.validation.rows import llm_foundry_flash_v1, row_framework

CASES = SHARED / "validation" / "cases.csv"


def figure_point(seq_len: int, head_dim: int, kernel: str) -> AttentionAttrs:
    """One point of the FA2 paper's figures: causal, 16k tokens a batch, 2,048 model width."""
    heads = 2048 // head_dim
    return AttentionAttrs(16384 // seq_len, heads, heads, seq_len, seq_len, head_dim, kernel=kernel)


@pytest.mark.parametrize(("arch", "head_dim"), sorted(FA1_FWD_BWD_TFLOPS))
def test_fa1_at_the_figures_shapes_costs_exactly_its_bars(arch: str, head_dim: int) -> None:
    dev = get_device(FIGURE_DEVICES[arch])
    for seq_len, fa1_tflops, fa2_tflops in FA1_FWD_BWD_TFLOPS[(arch, head_dim)]:
        a = figure_point(seq_len, head_dim, "fa1")
        seconds = attention_time_s(dev, a, "fp16") + attention_time_s(dev, a, "fp16", backward=True)
        assert 3.5 * attention_flops(a) / seconds / 1e12 == pytest.approx(fa1_tflops, rel=1e-9)
        # the figure's FA2 bars are not the reference: echosim's FA2 there is within 0.85-1.04x of them
        assert 0.84 < fa2_figure_tflops(arch, head_dim, seq_len) / fa2_tflops < 1.05
        assert fa1_tflops < fa2_tflops  # every FA1 point is slower than FA2 on its part


@pytest.mark.parametrize("device", ["a100-80gb", "h100-sxm"])
@pytest.mark.parametrize("backward", [False, True])
def test_fa1_costs_fa2_time_times_its_slowdown_plus_its_unpad_copies(device: str, backward: bool) -> None:
    dev = get_device(device)
    fa2 = AttentionAttrs(12, 16, 16, 2048, 2048, 128, kernel="fa2")
    fa2_s = flash_attention_time_s(fa2_view(dev), fa2, "bf16", backward)
    ratio = fa1_slowdown(dev.arch, 128, 2048)
    fa1 = AttentionAttrs(12, 16, 16, 2048, 2048, 128, kernel="fa1")
    assert attention_time_s(dev, fa1, "bf16", backward) == pytest.approx(fa2_s * ratio, rel=1e-12)
    padded = AttentionAttrs(12, 16, 16, 2048, 2048, 128, kernel="fa1", padded=True)
    copies = pad_copies_time_s(dev, padded, "bf16", backward)
    assert copies > 0
    assert attention_time_s(dev, padded, "bf16", backward) == pytest.approx(fa2_s * ratio + copies, rel=1e-12)


def test_the_framework_entry_names_flash_attn_1() -> None:
    fw, fa2 = get_framework("composer-fa1"), get_framework("composer")
    assert fw.attention_kernel == "fa1" and "flash_attn_unpadded_func" in fw.attention_source
    # flash_attn_fn unpads q, k and v before either version's kernel; every other behaviour is Composer's
    assert fw.attention_unpad == fa2.attention_unpad != ""
    assert (fw.fsdp_reduce_fp32, fw.optimizer_bytes) == (fa2.fsdp_reduce_fp32, fa2.optimizer_bytes)


@pytest.mark.skipif(not CASES.exists(), reason="shared/validation not present")
def test_only_the_large_scale_flash_rows_ran_flash_attn_1() -> None:
    rows = [c for c in read_cases(CASES) if c["source_id"] == "llm_foundry_bench"]
    v1 = {c.case_id for c in rows if llm_foundry_flash_v1(c)}
    assert len(v1) == 12  # 1b, 3b, 7b, 70b on 128 / 256 / 512 H100s
    assert all("Large Scale" in c["table"] for c in rows if c.case_id in v1)
    assert {row_framework(c) for c in rows if c.case_id in v1} == {"composer-fa1"}
    assert "composer-fa1" not in {row_framework(c) for c in rows if c.case_id not in v1}
