"""Devices are data: checked against hw_specs.csv, validated with messages that name the field."""

from __future__ import annotations

import csv
import dataclasses
import re
from pathlib import Path

import pytest

from echosim.backends.base import Backend, OverlapModel, Placement
from echosim.backends.devices import DEVICES, get_device
from echosim.backends.gpu import GPUBackend, NullBackend, builtin_backends
from echosim.ir.graph import Node
from echosim.ir.ops import OpKind
from echosim.ir.types import DType, TensorSpec

HW_SPECS = Path(__file__).resolve().parents[2] / "shared" / "validation" / "hw_specs.csv"
CSV_NAME = {
    "a100-40gb": "NVIDIA A100-SXM4-40GB",
    "a100-80gb": "NVIDIA A100-SXM4-80GB",
    "h100-sxm": "NVIDIA H100-SXM5-80GB",
    "h800": "NVIDIA H800-SXM5-80GB",
    "h200": "NVIDIA H200-SXM-141GB",
    "b200": "NVIDIA B200 (HGX/DGX B200, 1000W)",
    "gb200": "NVIDIA GB200 (per GPU, NVL72)",
}


# Devices hw_specs.csv has no row for: their vendor's system totals (dense) instead, or (h100-a3mega) the cloud's NICs.
NOT_IN_HW_SPECS = ("b300", "gb300", "h100-96gb", "h100-a3mega")


# hw_specs.csv's B200 8 TB/s assumes an 8,192-bit bus; the driver reports 7,680 bits (pytorch/ao#4002).
HBM_NOT_AS_HW_SPECS = {"b200": 7672.0}


def test_every_device_is_checked_against_a_source():
    assert set(DEVICES) == set(CSV_NAME) | set(NOT_IN_HW_SPECS)


def test_blackwell_ultra_matches_the_vendor_system_totals():
    """GB300 NVL72 (72 GPUs): 360 PF FP8 and 1,080 PF FP4 dense, 576 TB/s HBM, 130 TB/s NVLink, one
    800 Gb/s NIC per GPU; HGX B300 (8 GPUs): 36 PF BF16 and 72 PF FP8 sparse, 105 PF FP4 dense."""
    gb300, b300 = DEVICES["gb300"], DEVICES["b300"]
    assert 72 * gb300.peak_fp8_tflops == 360_000 and 72 * gb300.peak_fp4_tflops == 1_080_000
    assert 72 * gb300.hbm_GBps == 576_000 and 72 * 2 * gb300.nvlink_GBps == pytest.approx(130_000, rel=0.01)
    assert gb300.nic_GBps == 800 / 8 == b300.nic_GBps and gb300.devices_per_node == 72
    assert 8 * 2 * b300.peak_bf16_tflops == 36_000 and 8 * 2 * b300.peak_fp8_tflops == 72_000
    assert 8 * b300.peak_fp4_tflops == 105_000 and b300.devices_per_node == 8
    for dev in (gb300, b300, DEVICES["b200"], DEVICES["gb200"]):
        assert dev.block_scaled_formats == ("mxfp8", "nvfp4")


def test_b300_fractions_are_its_microbenchmarks():
    """microbench.csv's MAMF rows for B300 SXM: bf16 1769.0 and fp8 e4m3 3353.3 TFLOP/s."""
    b300 = DEVICES["b300"]
    assert b300.gemm_eff_16bit * b300.peak_bf16_tflops == pytest.approx(1769.0)
    assert b300.gemm_eff_fp8 * b300.peak_fp8_tflops == pytest.approx(3353.3)


def test_blackwell_hbm_peaks_follow_bus_width_and_system_totals():
    """B200: a 7,680-bit bus at 3,996 MHz, double data rate (the driver's figures, pytorch/ao#4002); HGX B300:
    62 TB/s over 8 GPUs; the NVL72 parts: 576 TB/s over 72. Each STREAM rate keeps H200's measured fraction."""
    b200, b300, gb200, gb300, h200 = (DEVICES[n] for n in ("b200", "b300", "gb200", "gb300", "h200"))
    assert b200.hbm_GBps == pytest.approx(7680 / 8 * 3.996 * 2, abs=0.5)
    assert 8 * b300.hbm_GBps == 62_000 and 72 * gb200.hbm_GBps == 576_000 == 72 * gb300.hbm_GBps
    for dev in (b200, b300, gb200, gb300):
        assert dev.hbm_stream_GBps / dev.hbm_GBps == pytest.approx(h200.hbm_stream_GBps / h200.hbm_GBps)


def test_h100_96gb_is_the_h100_sxm_with_its_hbm2e_at_500_watts():
    """torchtitan's page: 96 GB of HBM2e at 2.4 TB/s, reached at the SXM5's measured STREAM fraction;
    the compute peaks are the SXM5's at the clock a 500 W cap leaves (cube law), everything else
    (links, measured fractions of peak) is the H100 SXM5's."""
    h100, meta = DEVICES["h100-sxm"], DEVICES["h100-96gb"]
    memory = ("hbm_GB", "hbm_GBps", "hbm_stream_GBps")
    peaks = [f.name for f in dataclasses.fields(h100) if f.name.startswith("peak_")]
    own = ("name", "source", "host_memory_GB", *memory, *peaks)  # Grand Teton's host memory: not published
    same = [f.name for f in dataclasses.fields(h100) if f.name not in own]
    assert all(getattr(h100, f) == getattr(meta, f) for f in same)
    assert meta.host_memory_GB is None
    clock = (500 / 700) ** (1 / 3)
    assert clock == pytest.approx(0.8939, abs=1e-4)
    for p in peaks:
        assert getattr(meta, p) == (None if getattr(h100, p) is None else pytest.approx(getattr(h100, p) * clock))
    # inside the page's "between SXM and NVL": H100 NVL's dense bf16 835 TFLOP/s, SXM's 989
    assert 835 < meta.peak_bf16_tflops < 989 and meta.peak_bf16_tflops == pytest.approx(884.07, abs=0.01)
    assert (meta.hbm_GB, meta.hbm_GBps) == (96.0, 2400.0) and "2410.06511" in meta.source
    assert meta.hbm_stream_GBps / meta.hbm_GBps == pytest.approx(h100.hbm_stream_GBps / h100.hbm_GBps)
    assert "llama3_h100_202412_torchtitan" in meta.source
    assert not h100.block_scaled_formats and h100.peak_fp4_tflops is None


@pytest.mark.parametrize("name", sorted(CSV_NAME))
def test_device_numbers_match_hw_specs(name):
    if not HW_SPECS.exists():
        pytest.skip(f"validation data not found at {HW_SPECS}")
    with HW_SPECS.open() as f:
        row = {r["name"]: r for r in csv.DictReader(f)}[CSV_NAME[name]]
    dev = DEVICES[name]
    assert dev.peak_bf16_tflops == float(row["peak_bf16_tflops"])
    assert dev.peak_fp16_tflops == float(row["peak_fp16_tflops"])
    assert dev.peak_fp8_tflops == (float(row["peak_fp8_tflops"]) if row["peak_fp8_tflops"] else None)
    assert dev.peak_tf32_tflops == float(row["peak_tf32_tflops"])
    assert dev.peak_fp32_tflops == float(row["peak_fp32_tflops"])
    assert dev.hbm_GB == float(row["hbm_gb"])
    assert dev.hbm_GBps == pytest.approx(HBM_NOT_AS_HW_SPECS.get(name, 1000 * float(row["hbm_tbps"])))
    assert dev.nvlink_GBps == float(row["intra_node_link_gbps_per_direction"]) / 8  # Gbit/s -> GB/s
    assert dev.nic_GBps == float(row["nic_gbps_per_device"]) / 8
    first_url = row["source"].split(" ; ")[0].split(" ")[0]
    assert first_url in dev.source


@pytest.mark.parametrize("name", sorted(DEVICES))
def test_every_device_cites_sources_and_measured_fractions_are_below_peak(name):
    dev = DEVICES[name]
    assert "https://" in dev.source
    assert dev.hbm_stream_GBps < dev.hbm_GBps
    assert dev.nvlink_busbw_GBps < dev.nvlink_GBps
    assert 0.5 < dev.gemm_eff_16bit < 0.9 and 0.4 < dev.flash_fwd_eff < 0.8


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hbm_GBps": 0.0}, "device 'h100-sxm': field 'hbm_GBps' must be positive"),
        ({"sm_count": -1}, "device 'h100-sxm': field 'sm_count' must be positive"),
        ({"devices_per_node": 7.5}, "field 'devices_per_node' must be an integer"),
        ({"nic_GBps": None}, "device 'h100-sxm': field 'nic_GBps' is missing"),
        ({"gemm_eff_16bit": 1.2}, "field 'gemm_eff_16bit' is a fraction of peak"),
        ({"arch": "volta"}, "field 'arch' is 'volta'"),
        ({"source": " "}, "field 'source' is missing"),
        ({"hbm_stream_GBps": 4000.0}, "'hbm_stream_GBps' exceeds the peak"),
        ({"gemm_eff_fp8": None}, "'peak_fp8_tflops' and 'gemm_eff_fp8' must be given together"),
        ({"flash_fwd_shape": (1, 16, 0, 128)}, "'flash_fwd_shape' must be 4 positive ints"),
        ({"name": "", "sm_count": 0}, "device '<unnamed>': field 'name' is missing"),
        ({"gpus_per_host": 3}, "'gpus_per_host' 3 does not divide 'devices_per_node'"),
        ({"gpus_per_host": 0}, "field 'gpus_per_host' must be positive"),
    ],
)
def test_invalid_specs_name_the_device_and_the_field(change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(DEVICES["h100-sxm"], **change)


def test_unknown_device_lists_known_ones():
    assert get_device("H100-SXM") is DEVICES["h100-sxm"]
    with pytest.raises(ValueError, match=r"unknown device 'v100' \(known: a100-40gb, a100-80gb"):
        get_device("v100")


def test_builtin_backends_implement_the_protocol():
    backends = builtin_backends()
    assert {"a100-40gb", "a100-80gb", "h100-sxm", "gb200", "tpu-v5e", "cpu-x86", "null"} <= set(backends)
    for name, backend in backends.items():
        assert isinstance(backend, Backend) and backend.name == name


def test_backend_memory_peaks_and_overlap():
    a100 = GPUBackend(DEVICES["a100-80gb"])
    assert a100.memory_bytes() == 80 * 2**30
    assert a100.peak_flops("bf16") == 312e12 and a100.peak_flops("fp8") == 312e12
    assert GPUBackend(DEVICES["h100-sxm"]).peak_flops("fp8") == 1979e12
    overlap = a100.overlap()
    assert 1.05 <= overlap.compute_slowdown <= 1.2 and overlap.comm_slowdown == 1.0
    assert overlap.compute_slowdown < overlap.slowdown("compute.memory_bound") < 1.3  # HBM shared with NCCL copies
    assert overlap.slowdown("compute.matmul") == overlap.compute_slowdown and overlap.slowdown("comm.dp") == 1.0
    custom = OverlapModel(compute_slowdown=1.3, comm_slowdown=1.1)
    assert GPUBackend(DEVICES["a100-80gb"], custom).overlap() is custom


def test_collective_nodes_must_go_through_collective_time():
    node = Node(0, OpKind.ALL_REDUCE, (), TensorSpec((1024,), DType.BF16))
    with pytest.raises(ValueError, match="cost it with collective_time_s"):
        GPUBackend(DEVICES["a100-80gb"]).op_time_s(node, 2048)


def test_null_backend_costs_a_tick_and_never_runs_out_of_memory():
    null = NullBackend()
    node = Node(0, OpKind.INPUT, (), TensorSpec((8,), DType.BF16))
    assert null.op_time_s(node, 10**12) == 1e-9
    assert null.collective_time_s(OpKind.ALL_REDUCE, 10**12, Placement(8, 1, 8)) == 1e-9
    assert null.memory_bytes() > 10**18 and null.peak_flops("bf16") == 1e15
    assert null.overlap() == OverlapModel()


@pytest.mark.parametrize("name", ["b200", "gb200", "b300", "gb300"])
def test_blackwell_attention_runs_at_cudnns_rate_from_the_fa4_paper(name: str) -> None:
    """TE's fused attention on sm_100 is cuDNN's kernel: 1613 / 1.3 TFLOP/s on B200 at the anchor shape
    (FlashAttention-4 paper); GB200 and GB300 that rate times cuDNN 9.27's measured GB200 / B200 and GB300 / B200
    forward (1562.9 and 1986.3 / 1488.0 TFLOP/s, same version and shape), not B200's fraction of their peaks.
    B300, whose MUFU is twice B200's and which has no measured row, takes H100's measured fraction: its forward
    tile has Hopper's MUFU:MMA balance."""
    from echosim.backends.compute import flash_attention_time_s
    from echosim.ir.ops import AttentionAttrs

    dev = DEVICES[name]
    b, h, s, d = dev.flash_fwd_shape
    anchor = AttentionAttrs(b, h, h, s, s, d, causal=False, flash=True)
    rate = anchor.flops / (flash_attention_time_s(dev, anchor, "bf16") - dev.kernel_overhead_us * 1e-6)
    ultra = dev.mufu_ex2_per_clk_sm == 32
    expected = DEVICES["h100-sxm"].flash_fwd_eff if name == "b300" else 1613.0 / 1.3 / 2250.0
    if name == "gb200":
        expected *= 2250.0 / 2500.0 * 1562.874 / 1488.046
    if name == "gb300":
        expected *= 2250.0 / 2500.0 * 1986.33 / 1488.046
    assert rate / (dev.peak_bf16_tflops * 1e12) == pytest.approx(expected, rel=1e-3)
    if not ultra:
        assert dev.flash_fwd_eff < DEVICES["h100-sxm"].flash_fwd_eff  # below FA3's share of Hopper's peak


def test_flash_roofline_reproduces_the_fa4_papers_cycle_counts() -> None:
    """FlashAttention-4 paper, B200, M = N = d = 128: forward MMA and MUFU 1024 cycles, shared memory 768
    (Table 1): tensor-core bound, fraction 1; backward shared memory 3328 cycles against 2560 of MMA
    (Table 3): 2560 / 3328 of the tensor-core rate. A100 and H100 stay tensor-core bound in both passes,
    so their backward keeps FLASH_BWD_RATE; Blackwell's backward runs at 0.85 x 0.769 of its forward."""
    from echosim.backends.compute import FLASH_BWD_RATE, flash_bwd_rate, flash_pass_fraction

    b200 = DEVICES["b200"]
    assert flash_pass_fraction(b200, 128, backward=False) == 1.0
    assert flash_pass_fraction(b200, 128, backward=True) == pytest.approx(2560 / 3328)
    for name in ("a100-80gb", "h100-sxm", "h200"):
        dev = DEVICES[name]
        assert flash_pass_fraction(dev, 128, True) == flash_pass_fraction(dev, 128, False) == 1.0
        assert flash_bwd_rate(dev, 128) == FLASH_BWD_RATE
    for name in ("b200", "gb200", "b300", "gb300"):
        assert flash_bwd_rate(DEVICES[name], 128) == pytest.approx(0.85 * 2560 / 3328)
    # a small head: B200's forward waits on the MUFU (1024 cycles against 512 of MMA), B300's does not
    assert flash_pass_fraction(b200, 64, False) == 0.5
    assert flash_pass_fraction(DEVICES["b300"], 64, False) == 1.0


def test_blackwell_forward_ctas_carry_two_query_tiles() -> None:
    """FlashAttention-4's Blackwell forward runs two 128-row Q tiles per CTA (q_stage = 2): a forward grid has half
    as many CTAs, each walking its key blocks once per tile; the backward and Hopper's forward keep one tile."""
    from echosim.backends.compute import FLASH_CTA_FIXED_STEPS, _flash_steps
    from echosim.ir.ops import AttentionAttrs

    b200, h100 = DEVICES["b200"], DEVICES["h100-sxm"]
    one_cta = AttentionAttrs(1, 1, 1, 256, 1024, 128, causal=False, flash=True)  # 256 query rows, 8 key blocks
    assert _flash_steps(b200, one_cta) == 2 * 8 + FLASH_CTA_FIXED_STEPS  # one CTA, two tiles
    assert _flash_steps(b200, one_cta, backward=True) == 8 + FLASH_CTA_FIXED_STEPS  # two CTAs side by side
    assert _flash_steps(h100, one_cta) == _flash_steps(h100, one_cta, backward=True) == 8 + FLASH_CTA_FIXED_STEPS
    # causal: the CTA of rows 256-511 walks key blocks 0-3 for both of its tiles, and sets the makespan
    causal = AttentionAttrs(1, 1, 1, 512, 512, 128, causal=True, flash=True)
    assert _flash_steps(b200, causal) == 2 * 4 + FLASH_CTA_FIXED_STEPS


@pytest.mark.parametrize("name", ["a100-80gb", "h100-sxm", "b200", "gb200", "b300", "gb300"])
def test_flash_backward_keeps_its_measured_ratio_at_the_anchor(name: str) -> None:
    """At the device's measured anchor the backward takes FLASH_BWD_WORK / flash_bwd_rate times the forward's time,
    however the two passes tile the queries (the forward's two tiles per CTA on Blackwell quantise into waves
    differently from the backward's one)."""
    from echosim.backends.compute import FLASH_BWD_WORK, flash_attention_time_s, flash_bwd_rate
    from echosim.ir.ops import AttentionAttrs

    dev = DEVICES[name]
    b, h, s, d = dev.flash_fwd_shape
    anchor = AttentionAttrs(b, h, h, s, s, d, causal=False, flash=True)
    overhead = dev.kernel_overhead_us * 1e-6
    fwd = flash_attention_time_s(dev, anchor, "bf16") - overhead
    bwd = flash_attention_time_s(dev, anchor, "bf16", backward=True) - overhead
    assert bwd / fwd == pytest.approx(FLASH_BWD_WORK / flash_bwd_rate(dev, d), rel=1e-9)


def _microbench_rows() -> list[tuple[str, dict[str, str]]]:
    """(backend name, row) of every microbench.csv row whose device has a backend; skips without the data."""
    from echosim.backends.device_names import backend_for_device

    bench = HW_SPECS.parent / "microbench.csv"
    if not bench.exists():
        pytest.skip(f"validation data not found at {bench}")
    with bench.open() as f:
        return [(backend_for_device(r["device"]), r) for r in csv.DictReader(f)]


def test_gemm_efficiency_is_each_devices_best_library_measurement():
    """One rule for every device (devices.DeviceSpec): gemm_eff_<dtype> x peak = the highest TFLOP/s of
    the device's mamf-finder and cuBLASLt rows in microbench.csv (A100: MAMF 271.2, above cuBLASLt's
    253.7), XLA's perf table excluded."""
    best: dict[tuple[str, str], float] = {}
    for name, r in _microbench_rows():
        library = "MAMF" in r["op"] or r["op"].startswith("GEMM (cuBLASLt)")
        if not library or r["metric"] != "TFLOPS" or name not in DEVICES or "SUSPECT" in r["notes"]:
            continue
        dtype = {"bf16": "16bit", "fp16": "16bit", "fp8": "fp8", "fp4": "fp4"}[r["dtype"].split()[0]]
        best[name, dtype] = max(best.get((name, dtype), 0.0), float(r["value"]))
    assert len(best) == 11  # a100 16-bit; h100, b200, gb200, b300 16-bit and fp8; h200 fp8; gb200 fp4
    for (name, dtype), tflops in best.items():
        dev = DEVICES[name]
        eff, peak = {
            "16bit": (dev.gemm_eff_16bit, dev.peak_bf16_tflops),
            "fp8": (dev.gemm_eff_fp8, dev.peak_fp8_tflops),
            "fp4": (dev.gemm_eff_fp4, dev.peak_fp4_tflops),
        }[dtype]
        assert eff * peak == pytest.approx(tflops), (name, dtype)


def test_sustained_gemm_rate_is_each_devices_long_run_plateau():
    """sustained_<dtype>_tflops = the highest TFLOP/s of the device's long-warmup cuBLASLt rows (Azure's sweep,
    10,000 warmup iterations) at 8192^3 and larger; B200, without a row, takes GB200's plateau over its MAMF rate."""
    plateau: dict[tuple[str, str], float] = {}
    for name, r in _microbench_rows():
        if not r["op"].startswith("GEMM (cuBLASLt)") or "10,000 warmup" not in r["notes"] or name not in DEVICES:
            continue
        dims = [int(x) for x in re.findall(r"=(\d+)", r["shape"])]
        if min(dims) < 8192:
            continue
        dtype = {"fp16": "16bit", "bf16": "16bit", "fp8": "fp8"}[r["dtype"]]
        plateau[name, dtype] = max(plateau.get((name, dtype), 0.0), float(r["value"]))
    assert set(plateau) == {("a100-80gb", "16bit"), ("h100-sxm", "fp8"), ("h200", "fp8"), ("gb200", "fp8")}
    for (name, dtype), tflops in plateau.items():
        dev = DEVICES[name]
        assert (dev.sustained_16bit_tflops if dtype == "16bit" else dev.sustained_fp8_tflops) == tflops
    b200, gb200 = DEVICES["b200"], DEVICES["gb200"]
    ratio = gb200.sustained_fp8_tflops / (gb200.gemm_eff_fp8 * gb200.peak_fp8_tflops)
    assert b200.sustained_fp8_tflops == pytest.approx(ratio * b200.gemm_eff_fp8 * b200.peak_fp8_tflops)
    assert DEVICES["b300"].sustained_fp8_tflops is None and DEVICES["gb300"].sustained_fp8_tflops is None


def test_the_sustained_rate_caps_gemms_of_a_training_step_only():
    """GB200's large FP8 GEMMs run at its long-run plateau; a short run (sustained=False, MAMF's harness) does not
    see it; on H100 the plateau is above the heuristic pick's promoted FP8 rate, so nothing changes there, but it
    caps a fast-accumulation one (the plateau's own row, Azure's cuBLASLt 32768^3, ran with fast accumulation)."""
    from echosim.backends.compute import matmul_time_s

    gb200, h100 = DEVICES["gb200"], DEVICES["h100-sxm"]
    n = 32768
    flops = 2.0 * n**3
    capped = flops / matmul_time_s(gb200, n, n, n, dtype="fp8") / 1e12
    assert capped == pytest.approx(2876.6, rel=1e-3)
    assert flops / matmul_time_s(gb200, n, n, n, dtype="fp8", sustained=False) / 1e12 > 3000
    assert matmul_time_s(h100, n, n, n, dtype="fp8") == matmul_time_s(h100, n, n, n, dtype="fp8", sustained=False)
    fast = flops / matmul_time_s(h100, n, n, n, dtype="fp8", fast_accum=True) / 1e12
    assert fast == pytest.approx(1382.2, rel=1e-3)
    assert flops / matmul_time_s(h100, n, n, n, dtype="fp8", fast_accum=True, sustained=False) / 1e12 > 1382.2


def test_a100_gemms_follow_mamf_best_rate_and_the_cublaslt_plateau_only_caps():
    """Issue 16's A100 question under the one rule of devices.DeviceSpec: the efficiency is the highest measured
    library rate (MAMF 271.2 TFLOP/s, not cuBLASLt's 253.7); 253.7, the long-warmup plateau, is only a cap. A
    heuristic pick (PyTorch, TE: 0.89 x the autotuned rate) stays below it at every size, so training GEMMs are
    the MAMF rate x HEURISTIC_GEMM_FRACTION; an autotuned 32768^3 GEMM reaches the cap exactly."""
    from echosim.backends.compute import HEURISTIC_GEMM_FRACTION, matmul_time_s

    for name in ("a100-80gb", "a100-40gb"):
        a100 = DEVICES[name]
        assert a100.gemm_eff_16bit * a100.peak_bf16_tflops == pytest.approx(271.2)
        assert a100.sustained_16bit_tflops == 253.7
        assert 271.2 * HEURISTIC_GEMM_FRACTION < 253.7
        for n in (4096, 8192, 32768):
            step = matmul_time_s(a100, n, n, n, dtype="bf16")
            assert step == matmul_time_s(a100, n, n, n, dtype="bf16", sustained=False)
        tuned = 2.0 * 32768**3 / matmul_time_s(a100, 32768, 32768, 32768, dtype="bf16", autotuned=True) / 1e12
        assert tuned == pytest.approx(253.7, rel=1e-3)


@pytest.mark.parametrize(
    ("device", "fmt", "extra_per_element"),
    [
        ("h100-sxm", "fp8", 1.0),  # cast_transpose: the TN-only FP8 GEMM needs a transposed copy
        ("b200", "fp8", 0.0),  # sm_100 runs non-TN FP8 GEMMs: one row-wise copy
        ("gb300", "fp8", 0.0),
        ("b200", "mxfp8", 1.0 + 2 / 32),  # row-wise scales plus a column-wise copy with its own scales
        ("b200", "nvfp4", 0.5 + 2 / 16),
    ],
)
def test_quantising_casts_write_the_copies_transformer_engine_keeps(
    device: str, fmt: str, extra_per_element: float
) -> None:
    """TE quantises a training linear's activations row-wise and column-wise in one kernel; per-tensor FP8
    needs the column-wise (transposed) copy only where FP8 GEMMs are TN-only (before sm_100)."""
    from echosim.backends.gpu import GPUBackend
    from echosim.ir.graph import Node
    from echosim.ir.ops import ElementwiseAttrs
    from echosim.passes.precision import FORMATS

    numel = 4096 * 8192
    cast = Node(1, OpKind.ELEMENTWISE, (0,), TensorSpec((4096, 8192), FORMATS[fmt]), ElementwiseAttrs(f"{fmt}_cast", 2))
    backend = GPUBackend(DEVICES[device])
    assert backend.quantised_copy_bytes(cast) == pytest.approx(extra_per_element * numel)
    plain = Node(2, OpKind.ELEMENTWISE, (0,), TensorSpec((4096, 8192), DType.BF16), ElementwiseAttrs("gelu"))
    assert backend.quantised_copy_bytes(plain) == 0.0


def test_power_capped_clock_follows_the_cube_law():
    from echosim.backends.devices import power_capped_clock

    assert power_capped_clock(700, 700) == 1.0
    assert power_capped_clock(900, 700) == 1.0  # a limit above the rating does not overclock
    assert power_capped_clock(350, 700) == pytest.approx(0.5 ** (1 / 3))
    with pytest.raises(ValueError, match="positive"):
        power_capped_clock(0, 700)


@pytest.mark.parametrize(
    ("name", "backend"),
    [
        ("NVIDIA GB200", "gb200"),  # torch.cuda.get_device_name() on a GB200 tray (aiconfigurator's tables)
        ("NVIDIA GB300", "gb300"),
        ("GB200 (sm_100, NVL72)", "gb200"),
        ("NVIDIA B200", "b200"),
        ("B300 SXM", "b300"),
        ("Grace CPU (Neoverse-V2, GB200 node)", None),
        ("NVIDIA A100-PCIE-40GB", None),  # torch's spelling of the PCIe board: not the SXM backend
        ("NVIDIA A100 80GB PCIe", None),
        ("NVIDIA H100 NVL", None),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ],
)
def test_vendor_names_find_their_backend(name: str, backend: str | None) -> None:
    """The Grace-Blackwell parts are not taken for the B200 / B300 whose names they contain."""
    from echosim.backends.device_names import backend_for_device

    assert backend_for_device(name) == backend
