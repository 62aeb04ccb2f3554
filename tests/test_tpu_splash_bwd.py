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
