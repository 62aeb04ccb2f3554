"""Transformer Engine's per-expert GEMMs on four streams (compute.expert_gemms_time_s): closed forms.

A round of up to ``streams`` concurrent GEMMs packs its tiles into ceil(gemms x tiles / SMs) waves and pays
one launch gap; the experts go in ceil(experts / streams) rounds. One stream is the serial bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from echosim.backends import compute
from echosim.backends.devices import DEVICES

H100 = DEVICES["h100-sxm"]
GAP_S = H100.kernel_overhead_us * 1e-6


def _store_s(m: int, n: int) -> float:
    """One expert's 16-bit output at STREAM bandwidth: the store a last wave pays after its math."""
    return m * n * 2 / (H100.hbm_stream_GBps * 1e9)


def _round_s(m: int, n: int, k: int) -> Callable[[int], float]:
    """The closed form of one round of ``c`` concurrent GEMMs, from one expert's plan (checked: one wave, no
    split-K): ceil(c x tiles / SMs) of its waves' math, then the last wave's share of the c outputs stored
    (compute.exposed_epilogue_s; earlier waves' stores hide behind the next tile's math, checked), or its
    operand traffic c times, plus one launch gap."""
    one = compute.gemm_plan(H100, m, n, k, 1, "bf16", False, False)
    assert one.waves == 1 and one.split_k == 1
    tiles = math.ceil(m / one.tile[0]) * math.ceil(n / one.tile[1])
    wave_math_s = one.compute_s - _store_s(m, n)  # one wave's tile math and fixed time
    assert H100.sm_count * _store_s(m, n) / tiles < wave_math_s - compute.WAVE_FIXED_S  # a full wave's store hides

    def round_s(c: int) -> float:
        waves = math.ceil(c * tiles / H100.sm_count)
        last_wave_tiles = c * tiles - (waves - 1) * H100.sm_count
        return max(waves * wave_math_s + last_wave_tiles * _store_s(m, n) / tiles, c * one.memory_s) + GAP_S

    return round_s


@pytest.mark.parametrize(("m", "n", "k"), [(256, 768, 2048), (256, 1024, 4096), (1024, 2048, 8192)])
def test_rounds_of_four_pack_their_tiles_into_waves(m: int, n: int, k: int) -> None:
    round_s = _round_s(m, n, k)
    experts = 10  # two rounds of four GEMMs, one of two
    got = compute.expert_gemms_time_s(H100, m, n, k, experts, "bf16", streams=4)
    assert got == pytest.approx(2 * round_s(4) + round_s(2), rel=1e-12)
    serial = compute.expert_gemms_time_s(H100, m, n, k, experts, "bf16", streams=1)
    assert serial == pytest.approx(experts * round_s(1), rel=1e-12)
    assert got < serial
    # fewer experts than streams: one round of them all
    assert compute.expert_gemms_time_s(H100, m, n, k, 3, "bf16", streams=4) == pytest.approx(round_s(3), rel=1e-12)


def test_two_small_gemms_share_a_wave() -> None:
    """48 tiles each on 132 SMs: two run in one wave together (and store both outputs after it), four need two
    (the second wave: 60 tiles, 1.25 outputs); 16 experts take four rounds."""
    round_s = _round_s(256, 768, 2048)
    store = _store_s(256, 768)
    assert round_s(2) == pytest.approx(round_s(1) + store, rel=1e-12)
    assert compute.expert_gemms_time_s(H100, 256, 768, 2048, 16, "bf16", streams=4) == pytest.approx(
        4 * (2 * (round_s(1) - GAP_S - store) + 60 / 48 * store + GAP_S), rel=1e-12
    )


@pytest.mark.parametrize("dev", ["h100-sxm", "b200", "gb200", "a100-80gb"])
@pytest.mark.parametrize(
    ("m", "n", "k", "dtype"), [(2048, 768, 2048, "bf16"), (8192, 4096, 6144, "fp8"), (96, 2880, 2880, "bf16")]
)
def test_one_stream_is_the_serial_bound(dev: str, m: int, n: int, k: int, dtype: str) -> None:
    """Each expert's GEMM exactly as :func:`matmul_time_s` costs it alone (sustained cap included)."""
    d = DEVICES[dev]
    if dtype == "fp8" and d.gemm_eff_fp8 is None:
        pytest.skip("no fp8 tensor cores")
    one = compute.matmul_time_s(d, m, n, k, 1, dtype)
    assert compute.expert_gemms_time_s(d, m, n, k, 8, dtype, streams=1) == pytest.approx(8 * one, rel=1e-12)
    four = compute.expert_gemms_time_s(d, m, n, k, 8, dtype, streams=4)
    assert four <= 8 * one  # concurrency never costs more than one after another


def test_against_one_grouped_kernel() -> None:
    """16 small experts (256 x 768 x 2048, 48 tiles of 64 x 64 each): the grouped kernel picks its tile for all
    16 and runs at GROUPED_GEMM_FRACTION of the rate; four streams keep each GEMM's own tile, 4 rounds of 2
    waves at the dense rate (each round's last wave storing 60 of its 192 tiles' outputs), one launch gap a
    round; one stream pays 16 waves, 16 outputs stored and 16 gaps."""
    m, n, k, experts = 256, 768, 2048, 16
    plan = compute.gemm_plan(H100, m, n, k, experts, "bf16")
    grouped = compute.matmul_time_s(H100, m, n, k, experts, "bf16", grouped=True)
    assert grouped == pytest.approx((plan.time_s + GAP_S) / compute.GROUPED_GEMM_FRACTION, rel=1e-12)
    wave_s = compute.gemm_plan(H100, m, n, k, 1, "bf16", False, False).compute_s  # math and its output's store
    store = _store_s(m, n)
    streams = compute.expert_gemms_time_s(H100, m, n, k, experts, "bf16", streams=4)
    assert streams == pytest.approx(4 * (2 * (wave_s - store) + 60 / 48 * store) + 4 * GAP_S, rel=1e-12)
    serial = compute.expert_gemms_time_s(H100, m, n, k, experts, "bf16", streams=1)
    assert serial == pytest.approx(16 * (wave_s + GAP_S), rel=1e-12)
    assert streams < serial


def test_bad_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="streams"):
        compute.expert_gemms_time_s(H100, 64, 64, 64, 4, "bf16", streams=0)
