"""Splash attention's backward on TPUs: MaxText's two-kernel default (7 block products) or the fused kernel (5)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from echosim.backends import tpu
from echosim.compiler import compile as compile_model
from echosim.ir.ops import AttentionAttrs
from echosim.plan import Cluster, Plan

CASES = "../shared/validation/cases.csv"


@pytest.mark.parametrize("name", sorted(tpu.TPUS))
def test_backward_runs_the_kernels_block_products(name: str) -> None:
    """dkv (q k^T, p^T do, do v^T, ds^T q) and dq (q k^T, do v^T, ds k): 7 products over the forward's 2;
    the fused kernel forms dq inside dkv: 5. Materialised attention keeps autodiff's 5."""
    chip = tpu.TPUS[name]
    a = AttentionAttrs(4, 32, 8, 8192, 8192, 128)
    fwd = tpu.attention_time_s(chip, a, "bf16")
    assert tpu.attention_time_s(chip, a, "bf16", backward=True) / fwd == pytest.approx(3.5)
    fused = replace(a, kernel=tpu.SPLASH_FUSED)
    assert tpu.attention_time_s(chip, fused, "bf16", backward=True) / fwd == pytest.approx(2.5)
    math = replace(a, flash=False)
    bwd, fwd_m = tpu.attention_time_s(chip, math, "bf16", True), tpu.attention_time_s(chip, math, "bf16")
    assert bwd > fwd_m  # the score passes differ; only flash changes with the kernel


def test_fused_framework_entry_costs_less_attention() -> None:
    def step(framework: str) -> float:
        plan = Plan(dp=8, micro_batch=1, global_batch=8, seq_len=8192, zero=3, recompute="full", framework=framework)
        return compile_model("llama3-8b", plan, Cluster("tpu-v6e", 8, 8)).breakdown["compute.attention"]

    # full remat: forward, its recomputation and the backward; the backward drops from 3.5 to 2.5 forwards
    assert step("maxtext-splash-fused") / step("maxtext") == pytest.approx((2 + 2.5) / (2 + 3.5), rel=1e-3)


def test_trillium_rows_read_their_recipes_backward_kernel() -> None:
    """The Llama-3.1 8B / 70B recipe configs set sa_use_fused_bwd_kernel: True; GPT-3, Llama 405B, Mixtral and
    Gemma 3 keep MaxText's default (benchmarks/maxtext_trillium_model_configs.py, MaxText e591f30)."""
    from echosim.validation.cases import read_cases
    from echosim.validation.rows import row_framework

    rows = {c.case_id: row_framework(c) for c in read_cases(CASES) if c.case_id.startswith("tpurecipes-")}
    fused = {k for k, v in rows.items() if v.endswith("-splash-fused")}
    assert fused == {k for k in rows if "v6e" in k and ("llama3-8b" in k or "llama3-70b" in k)}
    assert rows["tpurecipes-llama3-70b-bf16-v6e-32"] == "maxtext-bf16-weights-splash-fused"
    assert rows["tpurecipes-gpt3-175b-bf16-v6e-256"] == "maxtext"


@pytest.mark.parametrize("name", sorted(tpu.TPUS))
def test_splash_forward_is_its_padded_block_products_not_a_score_matrix(name: str) -> None:
    """Splash keeps the scores in VMEM: its forward is the two padded products at the matmul rate (the causal
    blocks), not a matmul that writes the q_len x kv_len scores to HBM. On v6e the old score-matrix traffic
    (13.4 GB for 96 heads-sequences of 8192^2) made it 2.3x slower than its compute."""
    chip = tpu.TPUS[name]
    a = AttentionAttrs(3, 32, 8, 8192, 8192, 128)
    pad = tpu._pad(128, chip.mxu_dim)  # head_dim 128 fills half of v6e's 256-wide MXU
    work = 2 * (2.0 * 3 * 32 * 8192 * 8192 * pad) * (136 / 256)  # q k^T and p v, 16 * 17 / 2 of 16^2 blocks
    compute = work / (chip.peak_bf16_tflops * 1e12 * chip.gemm_eff) + 2 * tpu.FUSION_OVERHEAD_US * 1e-6
    assert tpu.attention_time_s(chip, a, "bf16") == pytest.approx(compute, rel=1e-6)
    score_bytes = 3 * 32 * 8192 * 8192 * 2
    assert tpu.attention_time_s(chip, a, "bf16") < score_bytes / (chip.hbm_GBps * 1e9)  # no score round trip


@pytest.mark.parametrize(("seq", "blocks"), [(512, 1), (2048, 10), (8192, 136)])
def test_splash_computes_every_causal_block_it_touches_whole(seq: int, blocks: int) -> None:
    """The causal mask skips only empty 512 x 512 blocks; the n diagonal blocks run whole, so n(n+1)/2 of
    n^2 blocks are computed: 0.625 of the scores at 2048 tokens (MaxText's default sa_block_q/kv), not 0.5."""
    a = AttentionAttrs(1, 8, 8, seq, seq, 128)
    assert tpu.attention_keep(a) == pytest.approx(blocks * 512**2 / seq**2)
    chip = tpu.TPU_V5P
    full = AttentionAttrs(1, 8, 8, seq, seq, 128, causal=False)
    launch = 2 * tpu.FUSION_OVERHEAD_US * 1e-6
    ratio = (tpu.attention_time_s(chip, a, "bf16") - launch) / (tpu.attention_time_s(chip, full, "bf16") - launch)
    assert ratio == pytest.approx(blocks * 512**2 / seq**2, rel=1e-6)


def test_splash_forward_is_bound_by_its_own_traffic() -> None:
    """A short query against long keys is bound by streaming k and v once per 512-row q block, plus q and o."""
    chip = tpu.TPU_V5E
    a = AttentionAttrs(1, 8, 8, 8, 262144, 128, causal=False)
    traffic = 2 * 128 * (2 * 8 * 8 + 2 * 8 * 262144 * 1)
    expected = traffic / (chip.hbm_GBps * 1e9 * chip.hbm_stream_fraction) + 2 * tpu.FUSION_OVERHEAD_US * 1e-6
    work = 2 * (2.0 * 8 * 8 * 262144 * 128)
    assert work / (chip.peak_bf16_tflops * 1e12 * chip.gemm_eff) < expected
    assert tpu.attention_time_s(chip, a, "bf16") == pytest.approx(expected, rel=1e-6)


def test_maxtext_gpt_rows_train_without_dropout() -> None:
    """MaxText's base.yml has dropout_rate 0.0 and gpt3-175b.yml enable_dropout False: its GPT-3 rows draw no
    dropout masks; a Megatron GPT row keeps GPT-3's 0.1."""
    from echosim.validation.cases import read_cases
    from echosim.validation.rows import row_model

    cases = {c.case_id: c for c in read_cases(CASES)}
    assert row_model(cases["tpurecipes-gpt3-175b-bf16-v6e-256"]).dropout == 0.0
    assert row_model(cases["korthikanti2022-t5-gpt-175b-full-a100-80gb-64"]).dropout == 0.1


@pytest.mark.parametrize(
    ("blocks", "touched", "grid"), [((2048, 2048), 10, 16), ((2048, 512), 40, 64), ((1024, 512), 72, 128)]
)
def test_splash_keep_follows_the_kernels_blocks(blocks: tuple[int, int], touched: int, grid: int) -> None:
    """At 8192 tokens 2048-blocks touch 4 * 5 / 2 of 16 (0.625, not 512-blocks' 136/256); a 2048-row q block
    over 512-key blocks touches 4 + 8 + 12 + 16 = 40 of 64; 1024 x 512: 2 + 4 + ... + 16 = 72 of 128."""
    a = AttentionAttrs(1, 8, 8, 8192, 8192, 128)
    assert tpu.attention_keep(a, *blocks) == pytest.approx(touched / grid)


@pytest.mark.parametrize("name", sorted(tpu.TPUS))
def test_splash_costs_each_kernel_at_its_own_blocks(name: str) -> None:
    """A recipe's sa_block_* reach the cost through AttentionAttrs.blocks: the forward at (sa_block_q, sa_block_kv),
    the dkv kernel's 4 products at its blocks and the dq kernel's 3 at its; the fused kernel's 5 at dkv's.
    The default (all 512) is the old 3.5 x forward."""
    chip = tpu.TPUS[name]
    a = AttentionAttrs(2, 32, 8, 8192, 8192, 128)
    launch = 2 * tpu.FUSION_OVERHEAD_US * 1e-6

    def compute(keep: float) -> float:  # the forward's two products over the kept blocks, as splash_forward_s
        pad = tpu._pad(128, chip.mxu_dim)
        return 2 * (2.0 * 2 * 32 * 8192 * 8192 * pad) * keep / (chip.peak_bf16_tflops * 1e12 * chip.gemm_eff)

    gpt3 = replace(a, blocks=(1024, 512, 2048, 512, 2048, 512))  # gpt_3_175b's sa_block_q / _dkv / _dq
    assert tpu.attention_time_s(chip, gpt3, "bf16") == pytest.approx(compute(72 / 128) + launch, rel=1e-6)
    bwd = (4 * (compute(40 / 64) + launch) + 3 * (compute(40 / 64) + launch)) / 2
    assert tpu.attention_time_s(chip, gpt3, "bf16", backward=True) == pytest.approx(bwd, rel=1e-6)
    llama = replace(a, blocks=(2048,) * 6, kernel=tpu.SPLASH_FUSED)  # llama3_1_8b_8192: 2048 each, fused
    assert tpu.attention_time_s(chip, llama, "bf16", backward=True) == pytest.approx(
        2.5 * (compute(10 / 16) + launch), rel=1e-6
    )
    assert tpu.attention_time_s(chip, replace(a, blocks=(512,) * 6), "bf16", backward=True) == pytest.approx(
        tpu.attention_time_s(chip, a, "bf16", backward=True)
    )


def test_plan_splash_blocks_reach_the_attention() -> None:
    """Plan.splash_blocks is carried to every attention op; a plan without it states none (as_dict)."""

    def step(blocks: tuple[int, ...]) -> float:
        plan = Plan(dp=8, micro_batch=1, global_batch=8, seq_len=8192, zero=3, recompute="full",
                    framework="maxtext-splash-fused", splash_blocks=blocks)  # fmt: skip
        return compile_model("llama3-8b", plan, Cluster("tpu-v6e", 8, 8)).breakdown["compute.attention"]

    assert step((2048,) * 6) / step(()) == pytest.approx((10 / 16) / (136 / 256), rel=0.02)
    assert "splash_blocks" not in Plan().as_dict()
    assert Plan(splash_blocks=(2048,) * 6).as_dict()["splash_blocks"] == (2048,) * 6


def test_maxtext_rows_read_their_recipes_splash_blocks() -> None:
    """The Trillium Llama-3.1 8B / 70B configs set every sa_block_* to 2048; GPT-3 and Llama 405B set sa_block_q
    1024, sa_block_q_dkv and sa_block_q_dq 2048; Mixtral 8x22B the three q blocks 2048; the v5p Llama 4 configs
    2048 each; Gemma 3's notes name no config, but its READMEs run gemma3_12b_32768_{2x,4x}_v6e256 (q and kv
    1024, dkv 512 x 2048, dq 1024); rows without a config (the v5p GPT-3 script, the MaxText READMEs) keep
    base.yml's 512."""
    from echosim.validation.cases import read_cases
    from echosim.validation.rows import row_plan

    plans = {c.case_id: row_plan(c)[0] for c in read_cases(CASES) if "tpu" in c["device"]}
    blocks = {k: p.splash_blocks for k, p in plans.items()}
    assert blocks["tpurecipes-llama3-8b-bf16-v6e-16"] == (2048,) * 6
    assert blocks["tpurecipes-llama3-70b-bf16-v6e-32"] == (2048,) * 6
    assert blocks["tpurecipes-gpt3-175b-fp8-v6e-256"] == (1024, 512, 2048, 512, 2048, 512)
    assert blocks["tpurecipes-llama3-405b-bf16-v6e-512-x2"] == (1024, 512, 2048, 512, 2048, 512)
    assert blocks["tpurecipes-mixtral-8x22b-bf16-v6e-256"] == (2048, 512, 2048, 512, 2048, 512)
    assert blocks["tpurecipes-llama4-scout-bf16-v5p-512"] == (2048,) * 6
    assert blocks["tpurecipes-gemma3-12b-bf16-v6e-512-x2"] == (1024, 1024, 512, 2048, 1024, 1024)
    assert blocks["tpurecipes-gemma3-12b-bf16-v6e-1024-x4"] == (1024, 1024, 512, 2048, 1024, 1024)
    assert blocks["tpurecipes-gpt3-175b-bf16-v5p-512"] == ()
    assert all(not b for k, b in blocks.items() if k.startswith("maxtext-"))
