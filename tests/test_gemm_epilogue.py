"""The last wave's epilogue store is paid after its math (compute.exposed_epilogue_s): closed forms.

A persistent warp-specialised GEMM (Hopper, Blackwell) overlaps one tile's epilogue with the next tile's math
(CUTLASS efficient_gemm.md, "Warp-Specialized Persistent Ping-Pong kernel design"); the last wave has no next
tile, so its share of the output goes to HBM at STREAM bandwidth after the compute-bound time. An earlier
wave's store hides only behind as much math as a tile has.
"""

from __future__ import annotations

import math

import pytest

from echosim.backends import compute
from echosim.backends.devices import DEVICES

GB = 1e9


def test_one_wave_stores_its_whole_output() -> None:
    assert compute.exposed_epilogue_s(8e6, 100, 1, 132, 5e-6, 2e12) == pytest.approx(8e6 / 2e12, rel=1e-12)


def test_earlier_waves_hide_behind_the_next_tiles_math() -> None:
    """264 + 66 tiles on 132 SMs: three waves, the last holding 66 / 330 of the output."""
    out, tiles, bw = 33e6, 330, 3e12
    full = out * 132 / tiles / bw  # 4.4 µs
    last = out * 66 / tiles / bw
    assert compute.exposed_epilogue_s(out, tiles, 3, 132, 10e-6, bw) == pytest.approx(last, rel=1e-12)
    # a tile's math shorter than a full wave's store: each earlier wave leaves the difference exposed
    assert compute.exposed_epilogue_s(out, tiles, 3, 132, 1e-6, bw) == pytest.approx(
        2 * (full - 1e-6) + last, rel=1e-12
    )


@pytest.mark.parametrize("name", ["a100-80gb", "h100-sxm", "b200"])
def test_a_gemm_plan_pays_its_last_waves_store(name: str) -> None:
    """4096 x 4096 x 8192 bf16, one 256 x 128 tile per candidate pinned: 512 tiles in ceil(512 / SMs) waves; the
    plan is its waves' math and fixed time plus the last wave's tiles' share of the 32 MiB output at STREAM rate."""
    dev = DEVICES[name]
    m = n = 4096
    k = 8192
    plan = compute.gemm_plan(dev, m, n, k, 1, "bf16", True, False, False, ((256, 128),), (1,))
    tiles = 16 * 32
    waves = math.ceil(tiles / dev.sm_count)
    rate = dev.peak_bf16_tflops * 1e12 * dev.gemm_eff_16bit / dev.sm_count
    math_s = waves * (2 * 256 * 128 * k / rate + compute.WAVE_FIXED_S)
    last = (tiles - (waves - 1) * dev.sm_count) / tiles * m * n * 2 / (dev.hbm_stream_GBps * GB)
    assert plan.waves == waves
    assert plan.compute_s == pytest.approx(math_s + last, rel=1e-12)
    assert last > 0


def test_split_k_pays_its_partials_in_the_reduction_not_twice() -> None:
    """A split-K plan's fp32 partial tiles are written and read back by its reduction (priced there)."""
    dev = DEVICES["h100-sxm"]
    m, n, k = 256, 256, 65536
    plan = compute.gemm_plan(dev, m, n, k, 1, "bf16", True, False, False, ((128, 128),), (4,))
    rate = dev.peak_bf16_tflops * 1e12 * dev.gemm_eff_16bit * compute.tile_efficiency("hopper", 128, 128)
    rate /= dev.sm_count
    bw = dev.hbm_stream_GBps * GB
    math_s = 1 * (2 * 128 * 128 * (k // 4) / rate + compute.WAVE_FIXED_S)
    reduce_s = 2 * m * n * 4 * 4 / bw + dev.kernel_overhead_us * 1e-6
    assert plan.compute_s == pytest.approx(math_s + reduce_s, rel=1e-12)
