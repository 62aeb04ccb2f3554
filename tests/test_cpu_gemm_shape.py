"""The CPU backend's shape-dependent GEMM rate (operand packing outside the microkernel, GEMM_PACK_ROWS) and its
calibration from few-row matmuls."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from echosim.backends import cpu
from echosim.calibrate import bench
from echosim.calibrate.bench import Sample
from echosim.calibrate.fit import CPU_KNOBS, fit_spec, fitted_knobs, predict_cpu

# compute-bound throughout: a DRAM rate high enough that no sample below is traffic-bound
SPEC = replace(cpu.CPU_X86, peak_fp32_tflops=0.1, gemm_eff_fp32=1.0, ddr_GBps=1e6, op_overhead_us=1.0)


def test_packing_work_adds_r_over_each_dimension_to_the_flop_time() -> None:
    spec = replace(SPEC, gemm_pack_rows=4.0)
    flops_s = 2 * 16 * 1024 * 256 / 0.1e12
    expected = flops_s * (1 + 4 / 16 + 4 / 1024 + 4 / 256) + 1e-6
    assert cpu.matmul_time_s(spec, 16, 1024, 256) == pytest.approx(expected)
    assert cpu.gemm_shape_factor(spec, 16, 1024, 256) == pytest.approx(1 + 4 / 16 + 4 / 1024 + 4 / 256)


def test_few_row_gemms_run_slower_per_flop_and_big_ones_approach_the_big_gemm_rate() -> None:
    spec = replace(SPEC, gemm_pack_rows=5.0)

    def rate(m: int) -> float:
        return 2 * m * 1024 * 256 / (cpu.matmul_time_s(spec, m, 1024, 256) - 1e-6)

    rates = [rate(m) for m in (1, 4, 16, 64, 256, 2048)]
    assert rates == sorted(rates)
    assert rates[0] < 0.2 * 0.1e12  # one row: mostly packing
    assert rates[-1] > 0.97 * 0.1e12 * (1 / (1 + 5 / 1024 + 5 / 256))


def test_uncalibrated_backend_keeps_every_shape_at_the_big_gemm_rate() -> None:
    assert cpu.CPU_X86.gemm_pack_rows == 0.0
    assert cpu.gemm_shape_factor(cpu.CPU_X86, 1, 1, 1) == 1.0
    with pytest.raises(ValueError, match="gemm_pack_rows"):
        replace(SPEC, gemm_pack_rows=-1.0)


def test_calibration_sweeps_hold_few_row_matmuls_and_fit_the_packing_rows() -> None:
    for sweep in ("quick", "standard"):
        rows = {m for m, _n, _k, _b in bench.MATMUL_SWEEPS[sweep]}
        assert {1, 4, 16} <= rows, sweep
    truth = replace(SPEC, gemm_eff_fp32=0.6, gemm_pack_rows=5.0)
    samples = [Sample("matmul", "matmul", "fp32", m=m, n=n, k=k) for m, n, k, _b in bench.MATMUL_SWEEPS["standard"]]
    samples = [replace(s, seconds=predict_cpu(truth, s)) for s in samples]
    knobs = [k for k in fitted_knobs(CPU_KNOBS, samples) if k.name in ("gemm_eff_fp32", "gemm_pack_rows")]
    assert [k.name for k in knobs] == ["gemm_eff_fp32", "gemm_pack_rows"]
    fitted = fit_spec(replace(SPEC, gemm_eff_fp32=0.9), knobs, samples, predict_cpu)
    assert math.isclose(fitted.gemm_pack_rows, 5.0, rel_tol=0.02)
    assert math.isclose(fitted.gemm_eff_fp32, 0.6, rel_tol=0.02)
