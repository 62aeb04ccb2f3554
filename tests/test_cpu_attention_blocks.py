"""PyTorch's CPU flash attention computes whole key blocks of 512 (echosim.backends.cpu.flash_blocks): a causal
mask saves nothing below 512 keys; its backward runs five block products to the forward's two."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from echosim.backends import cpu
from echosim.calibrate.bench import Sample
from echosim.calibrate.fit import CPU_KNOBS, fit_spec, predict_cpu
from echosim.ir.ops import AttentionAttrs, causal_fraction

SPEC = replace(cpu.CPU_X86, op_overhead_us=0.2, attention_eff=0.8, math_fraction=0.3)


@pytest.mark.parametrize(
    ("seq", "share", "rows", "cols"),
    [(100, 1.0, 32, 100), (256, 1.0, 64, 256), (512, 1.0, 64, 512), (1024, 0.75, 256, 512), (2048, 0.625, 256, 512)],
)
def test_a_causal_kernel_computes_every_key_block_up_to_the_diagonal_whole(
    seq: int, share: float, rows: int, cols: int
) -> None:
    assert cpu.flash_blocks(seq, seq, True) == (share, rows, cols)
    assert cpu.flash_blocks(seq, seq, False) == (1.0, rows, cols)
    # always at least the scores the mask keeps; the split follows the queries (768 and 192 rows up)
    assert share >= causal_fraction(seq, seq)


def test_long_sequences_approach_the_masks_share_and_queries_shorter_than_keys_see_more() -> None:
    assert cpu.flash_blocks(8192, 8192, True)[0] == pytest.approx(0.5 + 512 / 8192 / 2 + 256 / 8192 / 2, rel=0.05)
    # 256 queries at the end of 1,024 keys (the mask aligned to the end): every block holds a visible key
    assert cpu.flash_blocks(256, 1024, True)[0] == 1.0
    with pytest.raises(ValueError, match="queries and keys"):
        cpu.flash_blocks(0, 16, True)


def _attn(seq: int, causal: bool = True) -> AttentionAttrs:
    return AttentionAttrs(1, 8, 8, seq, seq, 64, causal=causal)


def test_the_causal_saving_starts_past_512_keys() -> None:
    for backward in (False, True):
        for seq, share in ((512, 1.0), (1024, 0.75), (2048, 0.625)):
            causal = cpu.attention_time_s(SPEC, _attn(seq), "fp32", backward)
            full = cpu.attention_time_s(SPEC, _attn(seq, False), "fp32", backward)
            assert causal / full == pytest.approx(share, rel=0.01)


def test_the_backward_runs_five_block_products_to_the_forwards_two() -> None:
    fast_math = replace(SPEC, math_fraction=1.0, cache_GBps=2000.0, ddr_GBps=1e6)  # the softmax's bytes ~free
    fwd = cpu.attention_time_s(fast_math, _attn(1024), "fp32")
    bwd = cpu.attention_time_s(fast_math, _attn(1024), "fp32", backward=True)
    assert bwd / fwd == pytest.approx(5 / 2, rel=0.02)
    # a product: 2 x head_dim FLOPs a computed score at attention_eff of the GEMM rate
    scores = 8 * 1024 * 1024 * 0.75
    rate = SPEC.peak_fp32_tflops * 1e12 * SPEC.gemm_eff_fp32 * SPEC.attention_eff
    assert fwd == pytest.approx(2 * scores * 2 * 64 / rate, rel=0.02)


def test_the_calibration_recovers_attention_eff_from_samples_below_and_above_512_keys() -> None:
    truth = replace(SPEC, attention_eff=0.63)
    samples = [
        Sample("attention", f"attention_{d}", "fp32", m=s, n=s, k=64, batch=bh)
        for d in ("fwd", "bwd")
        for bh, s in ((8, 256), (8, 512), (2, 1024))
    ]
    samples = [replace(s, seconds=predict_cpu(truth, s)) for s in samples]
    knobs = [k for k in CPU_KNOBS if k.name == "attention_eff"]
    fitted = fit_spec(SPEC, knobs, samples, predict_cpu)
    assert math.isclose(fitted.attention_eff, 0.63, rel_tol=0.01)


def test_block_products_may_outrun_the_big_gemm_rate_up_to_a_bound() -> None:
    truth = replace(SPEC, attention_eff=1.3)  # blocks in cache against big GEMMs streaming their operands
    samples = [
        Sample("attention", f"attention_{d}", "fp32", m=512, n=512, k=k, batch=8)
        for d in ("fwd", "bwd")
        for k in (64, 128)
    ]
    samples = [replace(s, seconds=predict_cpu(truth, s)) for s in samples]
    fitted = fit_spec(SPEC, [k for k in CPU_KNOBS if k.name == "attention_eff"], samples, predict_cpu)
    assert math.isclose(fitted.attention_eff, 1.3, rel_tol=0.01)
    with pytest.raises(ValueError, match="attention_eff' is at most"):
        replace(SPEC, attention_eff=2.5)
