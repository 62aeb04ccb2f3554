"""llm-foundry's attn_impl 'triton': FlashAttention's Triton kernel at the fastest rate it is documented to run,
FlashAttention v1's (FA2 paper's A100 / H100 forward + backward figures), and which benchmark rows ran it."""

from __future__ import annotations

import math

import pytest
from conftest import SHARED

from echosim.backends.compute import (
    attention_time_s,
    fa1_slowdown,
    fa2_view,
    flash_attention_time_s,
    triton_flash_slowdown,
)
from echosim.backends.devices import get_device
from echosim.frameworks import get_framework
from echosim.ir.ops import AttentionAttrs
from echosim.validation.cases import read_cases
from echosim.validation.rows import llm_foundry_attn_impl, row_framework

CASES = SHARED / "validation" / "cases.csv"


def test_the_kernel_takes_fa1s_bars_not_the_figures_other_triton_kernel() -> None:
    # The figure's "FlashAttention Triton" bars (A100 causal d=128 2k: 68 TFLOP/s) time OpenAI's triton.ops
    # kernel, not this one; the kernel is priced at FA1's bars on every part and head dimension.
    for arch in ("ampere", "hopper", "blackwell"):
        for d in (32, 64, 96, 128):
            for s in (256, 1024, 3000, 16384, 65536):
                assert triton_flash_slowdown(arch, d, s) == fa1_slowdown(arch, d, s)


def test_sequence_length_is_interpolated_in_log2_and_held_at_the_ends() -> None:
    lo, hi = triton_flash_slowdown("ampere", 128, 1024), triton_flash_slowdown("ampere", 128, 2048)
    mid = math.sqrt(1024 * 2048)  # halfway in log2 between the 1k and 2k bars
    assert triton_flash_slowdown("ampere", 128, round(mid)) == pytest.approx((lo + hi) / 2, rel=1e-3)
    assert triton_flash_slowdown("ampere", 128, 128) == triton_flash_slowdown("ampere", 128, 512)
    assert triton_flash_slowdown("ampere", 128, 65536) == triton_flash_slowdown("ampere", 128, 16384)
    # head dims: <= 64 read the d=64 bars, others the d=128 ones; Blackwell takes Hopper's figure
    assert triton_flash_slowdown("ampere", 32, 2048) == triton_flash_slowdown("ampere", 64, 2048)
    assert triton_flash_slowdown("ampere", 96, 2048) == triton_flash_slowdown("ampere", 128, 2048)
    assert triton_flash_slowdown("blackwell", 128, 2048) == triton_flash_slowdown("hopper", 128, 2048)


@pytest.mark.parametrize("device", ["a100-40gb", "h100-sxm"])
@pytest.mark.parametrize("backward", [False, True])
def test_triton_kernel_costs_fa2_time_times_its_slowdown(device: str, backward: bool) -> None:
    dev = get_device(device)
    fa2 = AttentionAttrs(8, 40, 40, 2048, 2048, 128, kernel="fa2")
    triton = AttentionAttrs(8, 40, 40, 2048, 2048, 128, kernel="triton")
    fa2_s = attention_time_s(dev, fa2, "bf16", backward)
    assert fa2_s == flash_attention_time_s(fa2_view(dev), fa2, "bf16", backward)
    ratio = triton_flash_slowdown(dev.arch, 128, 2048)
    assert 1.5 < ratio < 2.5
    assert attention_time_s(dev, triton, "bf16", backward) == pytest.approx(fa2_s * ratio, rel=1e-12)


def test_the_framework_entry_names_the_triton_kernel() -> None:
    fw = get_framework("composer-triton")
    assert fw.attention_kernel == "triton" and "flash_attn_triton" in fw.attention_source
    # memory rules and every other behaviour are Composer's
    assert fw.fsdp_reduce_fp32 == get_framework("composer").fsdp_reduce_fp32


@pytest.mark.skipif(not CASES.exists(), reason="shared/validation not present")
def test_llm_foundry_rows_take_the_kernel_their_sweep_ran() -> None:
    rows = [c for c in read_cases(CASES) if c["source_id"] == "llm_foundry_bench"]
    assert len(rows) == 37
    by_id = {c["case_id"]: c for c in rows}
    # sweep.py (commit 5e85bd6): 13b and 30b with --attn_impl triton, 1b/3b/7b/70b flash (flash-attn 1.0.9)
    large = {k: row_framework(c) for k, c in by_id.items() if "Large Scale" in c["table"]}
    assert len(large) == 18
    for k, name in large.items():
        triton = "-13b-" in k or "-30b-" in k
        assert name == ("composer-triton" if triton else "composer-fa1"), k
    # every other table: sweep.sh passes no --attn_impl; submit_benchmarks.py's default is triton
    others = [c for c in rows if "Large Scale" not in c["table"]]
    assert len(others) == 19
    assert {llm_foundry_attn_impl(c) for c in others} == {"triton"}
    assert {row_framework(c) for c in others} == {"composer-triton", "composer-triton-pure"}
    # the A100 tables ran submit_benchmarks.py's precision 'bf16' with FSDP mixed_precision 'PURE'
    assert {row_framework(c) for c in others if "A100" in c["table"]} == {"composer-triton-pure"}
    assert {row_framework(c) for c in others if "A100" not in c["table"]} == {"composer-triton"}
