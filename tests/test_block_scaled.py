"""Block-scaled training on Blackwell: MXFP8 GEMM rate, NVFP4's global-amax pass, and which published rows run MXFP8."""

from __future__ import annotations

import pytest
from conftest import SHARED

from echosim.backends import compute
from echosim.backends.devices import DEVICES
from echosim.ir.ops import OpKind
from echosim.ir.types import TensorSpec

CASES = SHARED / "validation" / "cases.csv"


def test_mxfp8_fraction_is_the_profiling_guides_kernel_times() -> None:
    """TE's GEMM profiling guide, B300, pre-quantised operands: 6.812 ms per layer (FP8 current scaling)
    against 7.161 ms (MXFP8) over the same twelve GEMMs."""
    assert pytest.approx(6.812 / 7.161) == compute.MXFP8_GEMM_FRACTION
    assert 0.9 < compute.MXFP8_GEMM_FRACTION < 1.0


@pytest.mark.parametrize("device", ["b200", "gb200", "b300", "gb300"])
def test_a_large_mxfp8_gemm_runs_at_the_fraction_of_per_tensor_fp8(device: str) -> None:
    """Compute-bound shapes scale by the fraction, capped or not by the sustained plateau (GB200, B200); the
    per-wave fill (compute.WAVE_FIXED_S) does not scale, hence the tolerance on the uncapped parts."""
    dev = DEVICES[device]
    for n in (8192, 16384):
        fp8 = compute.matmul_time_s(dev, n, n, n, dtype="fp8") - dev.kernel_overhead_us * 1e-6
        mx = compute.matmul_time_s(dev, n, n, n, dtype="mxfp8") - dev.kernel_overhead_us * 1e-6
        assert fp8 / mx == pytest.approx(compute.MXFP8_GEMM_FRACTION, rel=0.005)


def test_per_tensor_fp8_rate_is_unchanged() -> None:
    dev = DEVICES["b200"]
    assert compute.gemm_efficiency(dev, "fp8") == dev.gemm_eff_fp8
    assert compute.sustained_tflops(dev, "fp8") == dev.sustained_fp8_tflops
    assert compute.sustained_tflops(dev, "mxfp8") == pytest.approx(
        dev.sustained_fp8_tflops * compute.MXFP8_GEMM_FRACTION
    )


@pytest.mark.parametrize(
    ("fmt", "amax_per_element", "kernels"), [("nvfp4", 2.0, 2), ("mxfp8", 0.0, 1), ("fp8", 0.0, 1)]
)
def test_only_nvfp4_casts_read_their_input_again_for_the_global_amax(fmt: str, amax_per_element: float, kernels: int):
    """NVFP4's per-tensor FP32 scale needs the tensor's amax before the cast: one more read of the 16-bit input
    in its own kernel. MXFP8's power-of-two block scales are computed inside the one cast kernel."""
    from echosim.backends.gpu import GPUBackend
    from echosim.ir.graph import Node
    from echosim.ir.ops import ElementwiseAttrs
    from echosim.passes.precision import FORMATS

    dev = DEVICES["gb200"]
    backend = GPUBackend(dev)
    shape = (8192, 8192)
    cast = Node(1, OpKind.ELEMENTWISE, (0,), TensorSpec(shape, FORMATS[fmt]), ElementwiseAttrs(f"{fmt}_cast", 2))
    assert backend.global_amax_bytes(cast) == pytest.approx(amax_per_element * 8192 * 8192)
    io = 3 * 8192 * 8192
    expected_bytes = io + backend.quantised_copy_bytes(cast) + backend.global_amax_bytes(cast)
    assert backend.memory_cost_s(cast, io) == pytest.approx(compute.memory_bound_time_s(dev, expected_bytes, kernels))


@pytest.mark.skipif(not CASES.exists(), reason="shared/validation not present")
def test_megatron_bridge_2509_block_scaled_rows_run_mxfp8_on_blackwell_only() -> None:
    """25.09's parenthesised FP8 variant (dtype fp8 in the file) is MXFP8 on Blackwell, fp8 on Hopper; its
    per-tensor rows (blank dtype) and other releases' fp8 rows are left alone."""
    from echosim.validation.cases import read_cases
    from echosim.validation.rows import block_scaled_dtype, row_plan

    cases = {c.case_id: c for c in read_cases(CASES)}
    assert row_plan(cases["mbridge2509-llama3-8b-fp8-b200-8"])[0].dtype == "mxfp8"
    assert row_plan(cases["mbridge2509-llama3p1-405b-fp8-gb200-128"])[0].dtype == "mxfp8"
    assert block_scaled_dtype(cases["mbridge2509-deepseekv3-dropless-fp8-h100-sxm-1024"]) == ""
    assert row_plan(cases["mbridge2509-llama3-8b-b200-8"])[0].dtype == "fp8"  # per-tensor, from SOURCE_FLAGS
    assert block_scaled_dtype(cases["mbridge2511-llama3-8b-fp8-b200-8"]) == ""


@pytest.mark.parametrize("dtype", ["fp8", "mxfp8", "nvfp4"])
def test_a_quantised_recipe_under_fsdp_gathers_and_reduces_16_bit_weights(dtype: str) -> None:
    """ZeRO-3 / FSDP with a block-scaled recipe (torchtitan trains MXFP8 and NVFP4 under FSDP2): the recipe quantises
    only the GEMMs' operands, so the weights FSDP gathers and the gradients it reduces are the 16-bit ones, as under
    BF16, and the step is shorter. It once failed on the data-parallel pass's dtype ('unknown dtype mxfp8')."""
    from echosim.compiler import lower
    from echosim.frontend.zoo import ZOO
    from echosim.plan import Cluster, Plan

    cfg = ZOO["llama3-8b"].with_(layers=2, seq_len=256)

    def run(precision: str) -> tuple[float, list[int]]:
        plan = Plan(dp=4, zero=3, micro_batch=2, global_batch=8, dtype=precision, framework="torchtitan")
        compiled = lower(cfg, plan, Cluster("gb200", 4))
        graph = compiled.stages[0].graph
        moved = [sum(n.attrs.bytes for n in graph if n.op is op) for op in (OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER)]
        return compiled.report.step_time_s, moved

    step, moved = run(dtype)
    bf16_step, bf16_moved = run("bf16")
    assert moved == bf16_moved and moved[0] > 0
    assert step < bf16_step
