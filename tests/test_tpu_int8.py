"""MaxText's ``quantization: int8`` (AQT integer GEMMs) on TPUs."""

from __future__ import annotations

import pytest

from echosim.backends import tpu
from echosim.compiler import compile as compile_model
from echosim.plan import Cluster, Plan, PlanError

CASES = "../shared/validation/cases.csv"


@pytest.mark.parametrize("name", sorted(tpu.TPUS))
def test_int8_gemms_run_at_the_int8_rate(name: str) -> None:
    chip = tpu.TPUS[name]
    bf16 = tpu.matmul_time_s(chip, 16384, 16384, 16384)
    int8 = tpu.matmul_time_s(chip, 16384, 16384, 16384, dtype="int8")
    assert bf16 / int8 == pytest.approx(chip.peak_int8_tops / chip.peak_bf16_tflops, rel=0.01)


def _step(backend: str, dtype: str) -> object:
    plan = Plan(dp=8, micro_batch=2, global_batch=16, seq_len=2048, dtype=dtype, zero=3, framework="maxtext")
    return compile_model("llama3-8b", plan, Cluster(backend, 8, 8))


def test_int8_quantises_the_linear_layers_only() -> None:
    """On v6e (int8 twice the bf16 rate) the linear layers' GEMMs halve; attention stays 16-bit; the
    quantising casts, weights included (AQT quantises both operands of every dot), add memory-bound time."""
    bf16, int8 = _step("tpu-v6e", "bf16"), _step("tpu-v6e", "int8")
    b, i = bf16.breakdown, int8.breakdown
    assert i["compute.attention"] == pytest.approx(b["compute.attention"], rel=1e-6)
    assert 0.45 < i["compute.matmul"] / b["compute.matmul"] < 0.6  # the output layer's GEMMs stay bf16
    assert i["compute.memory_bound"] > b["compute.memory_bound"]
    assert int8.mfu > bf16.mfu  # MFU stays against the bf16 peak, as MaxText reports it


def test_int8_weight_copies_are_not_held_from_forward_to_backward() -> None:
    """AQT quantises the weight inside each dot, so under ZeRO-3 the forward's int8 copy of a gathered weight
    dies with its GEMM like the bf16 gather does; sharing it with the dlhs held every layer's full weight
    (the Trillium GPT-3 int8 row needed 192.6 GiB of 32)."""
    bf16, int8 = _step("tpu-v6e", "bf16"), _step("tpu-v6e", "int8")
    peak = {k: max(float(m["peak"]) for m in r.memory) for k, r in (("bf16", bf16), ("int8", int8))}
    assert peak["int8"] <= peak["bf16"] * 1.02


def test_int8_is_refused_off_tpus() -> None:
    with pytest.raises(PlanError, match="--dtype int8: backend 'h100-sxm' has no int8 support"):
        _step("h100-sxm", "int8")


def test_maxtext_recipe_rows_read_their_quantization_and_script_layout() -> None:
    """The Trillium GPT-3 "fp8" recipe runs config gpt_3_175b (quantization: int8); the v5p GPT-3 row's
    script (v5p_1024.sh) runs fsdp 64 x tensor 8, per-device batch 4, full remat and quantization=int8."""
    from echosim.validation.cases import read_cases
    from echosim.validation.rows import row_plan

    plans = {c.case_id: row_plan(c)[0] for c in read_cases(CASES) if c.case_id.startswith("tpurecipes-gpt3")}
    assert plans["tpurecipes-gpt3-175b-fp8-v6e-256"].dtype == "int8"
    assert plans["tpurecipes-gpt3-175b-bf16-v6e-256"].dtype == "bf16"
    v5p = plans["tpurecipes-gpt3-175b-bf16-v5p-512"]
    assert (v5p.tp, v5p.dp, v5p.micro_batch, v5p.dtype, v5p.recompute) == (8, 64, 32, "int8", "full")
    assert v5p.sp  # MaxText's default under tp > 1
