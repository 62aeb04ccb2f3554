"""Blackwell's tcgen05 MMA covers 128 rows per SM at full rate (compute.MMA_FULL_ROWS); Hopper, Ampere: no floor."""

from __future__ import annotations

from pathlib import Path

import pytest

from echosim.backends import devices
from echosim.backends.compute import CTA_TILES, MMA_FULL_ROWS, gemm_plan, tile_efficiency
from echosim.validation.microbench import validate_microbench

MICROBENCH = Path(__file__).resolve().parents[2] / "shared" / "validation" / "microbench.csv"


def test_blackwell_tiles_below_128_rows_pay_the_idle_half_of_the_datapath():
    """A 64-row tile on Blackwell runs at half the reuse-limited rate of the same tile on Hopper's rule."""
    assert MMA_FULL_ROWS == {"blackwell": 128}
    # Reuse alone (REUSE_HALF = 32 on both): 64x64 -> reuse 32 -> 0.5 against 256x128's 85.3 / 117.3 = 0.727.
    reuse_only = 0.5 / (85.333 / 117.333)
    assert tile_efficiency("hopper", 64, 64) == pytest.approx(reuse_only, rel=1e-3)
    assert tile_efficiency("blackwell", 64, 64) == pytest.approx(reuse_only * 64 / 128, rel=1e-3)
    assert tile_efficiency("blackwell", 64, 128) == pytest.approx(tile_efficiency("hopper", 64, 128) / 2)
    for tm, tn in CTA_TILES:  # tiles of 128 rows and more are untouched; Ampere and Hopper never are
        if tm >= 128:
            assert tile_efficiency("blackwell", tm, tn) == tile_efficiency("hopper", tm, tn)
        assert tile_efficiency("ampere", tm, tn) <= 1.0


def test_small_blackwell_gemm_takes_128_row_tiles():
    """256 x 2048 x 1024 fp8 on B200 (XLA's table: 148 TFLOP/s): the 64 x 64 split the model chose
    before (194 TFLOP/s predicted) now loses to 128-row tiles."""
    plan = gemm_plan(devices.B200, 256, 2048, 1024, 1, "fp8", True, False)
    assert plan.tile[0] >= 128
    h100 = gemm_plan(devices.H100_SXM, 256, 2048, 1024, 1, "fp8", True, False)
    assert h100.tile == (64, 64)  # Hopper's 64-row wgmma keeps its small tiles


@pytest.mark.skipif(not MICROBENCH.exists(), reason="validation data not found")
def test_xla_b200_matmul_groups():
    """XLA's B200 table (autotuned, 292 bf16 and 125 fp8 shapes): 10.8 -> 9.2% and 14.3 -> 12.1% MAPE with the
    128-row floor; 5.0% and 7.1% once the last wave's output store is priced (compute.exposed_epilogue_s)."""
    groups = validate_microbench(MICROBENCH).groups()
    assert groups["B200 (sm_100) | matmul bf16"]["mape"] == pytest.approx(0.050, abs=0.003)
    assert groups["B200 (sm_100) | matmul fp8"]["mape"] == pytest.approx(0.071, abs=0.003)
    # no floor on Hopper; 7.1 -> 5.9% with the exposed epilogue store
    assert groups["H100-SXM (sm_90) | matmul bf16"]["mape"] == pytest.approx(0.059, abs=0.003)
