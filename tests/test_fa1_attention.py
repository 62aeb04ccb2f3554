"""llm-foundry's attn_impl 'flash' on flash-attn 1.x: FlashAttention v1 at its published rate next to
FlashAttention-2 (FA2 paper's A100 / H100 forward + backward figures), and which benchmark rows ran it."""

from __future__ import annotations

import pytest
from conftest import SHARED

from echosim.backends.compute import (
    FA1_FWD_BWD_TFLOPS,
    attention_time_s,
    fa1_slowdown,
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


def test_the_published_points_are_the_figures_fa1_bars() -> None:
    # causal: A100 d=128 seq 2k FA1 69 vs FA2 155 TFLOP/s, d=64 seq 16k 97 vs 171; H100 d=128 seq 2k 108 vs 265
    assert fa1_slowdown("ampere", 128, 2048) == pytest.approx(155 / 69)
    assert fa1_slowdown("ampere", 64, 16384) == pytest.approx(171 / 97)
    assert fa1_slowdown("hopper", 128, 2048) == pytest.approx(265 / 108)
    assert fa1_slowdown("blackwell", 128, 2048) == fa1_slowdown("hopper", 128, 2048)
    # every FA1 point is slower than FA2 on its part
    assert all(k < f for rows in FA1_FWD_BWD_TFLOPS.values() for _, k, f in rows)


@pytest.mark.parametrize(("device", "ratio"), [("a100-80gb", 155 / 69), ("h100-sxm", 265 / 108)])
@pytest.mark.parametrize("backward", [False, True])
def test_fa1_costs_fa2_time_at_the_published_ratio_plus_its_unpad_copies(
    device: str, ratio: float, backward: bool
) -> None:
    dev = get_device(device)
    fa2 = AttentionAttrs(12, 16, 16, 2048, 2048, 128, kernel="fa2")
    fa2_s = flash_attention_time_s(fa2_view(dev), fa2, "bf16", backward)
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
