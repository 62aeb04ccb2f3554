"""The compute model against measured GEMM, STREAM and attention rows, plus invariants."""

from __future__ import annotations

import csv
import re
import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echosim.backends import compute
from echosim.backends.devices import DEVICES
from echosim.backends.gpu import GPUBackend
from echosim.ir.graph import Node
from echosim.ir.ops import AttentionAttrs, ElementwiseAttrs, MatmulAttrs, OpKind, Phase
from echosim.ir.types import DType, TensorSpec

MICROBENCH = Path(__file__).resolve().parents[2] / "shared" / "validation" / "microbench.csv"
A100, H100, H200 = DEVICES["a100-80gb"], DEVICES["h100-sxm"], DEVICES["h200"]


@pytest.fixture(scope="module")
def rows() -> list[dict[str, str]]:
    if not MICROBENCH.exists():
        pytest.skip(f"validation data not found at {MICROBENCH}")
    with MICROBENCH.open() as f:
        return list(csv.DictReader(f))


def gemm_rows(rows: list[dict[str, str]], device: str, op: str, dtype: str) -> list[tuple[int, ...]]:
    """(batch, m, n, k) and measured TFLOP/s of every matching GEMM row."""
    out = []
    for r in rows:
        if r["device"] == device and r["op"].startswith(op) and r["dtype"].startswith(dtype):
            dims = {key: int(v) for key, v in re.findall(r"(\w)=(\d+)", r["shape"])}
            out.append((dims.get("b", 1), dims["m"], dims["n"], dims["k"], float(r["value"])))
    return out


def mape(pairs: list[tuple[float, float]]) -> float:
    return 100 * statistics.mean(abs(pred - meas) / meas for pred, meas in pairs)


def gemm_tflops(dev, b: int, m: int, n: int, k: int, dtype: str) -> float:
    return 2 * b * m * n * k / compute.matmul_time_s(dev, m, n, k, b, dtype) / 1e12


# Each row priced as its harness ran it (validation.microbench._matmul_probe): Azure's cuBLASLt sweep is a heuristic
# pick with FP8 fast accumulation, XLA's table autotuned with it. Achieved on the shared data: A100 fp16 6.2 %,
# H100 fp8 5.8 %, H200 fp8 5.6 %, H100 XLA bf16 5.9 % (priced with the library defaults, heuristic and promoted, the
# last two were 10.4 % and 10.3 % once the last wave's output store was priced, compute.exposed_epilogue_s).
@pytest.mark.parametrize(
    ("dev", "device", "op", "dtype", "model_dtype", "count"),
    [
        (A100, "A100-SXM4-80GB", "GEMM", "fp16", "fp16", 5),
        (H100, "H100-SXM-80GB", "GEMM", "fp8", "fp8", 6),
        (H200, "H200-SXM-141GB", "GEMM", "fp8", "fp8", 6),
        (H100, "H100-SXM (sm_90)", "dot", "bf16", "bf16", 292),
    ],
    ids=["a100-cublaslt-fp16", "h100-cublaslt-fp8", "h200-cublaslt-fp8", "h100-xla-bf16"],
)
def test_matmul_matches_measured_gemms_within_10_percent(rows, dev, device, op, dtype, model_dtype, count):
    cases = gemm_rows(rows, device, op, dtype)
    assert len(cases) == count
    autotuned = op == "dot"  # XLA's autotuner
    pairs = [
        (2 * b * m * n * k / compute.matmul_time_s(dev, m, n, k, b, model_dtype, autotuned, fast_accum=True) / 1e12, t)
        for b, m, n, k, t in cases
    ]
    assert mape(pairs) <= 10.0, f"{device} {dtype} GEMM MAPE {mape(pairs):.1f}%"


def test_gpt3_175b_matmuls_run_at_65_to_80_percent_of_a100_peak():
    """The Megatron GPT-3 175B (TP 8) products, forward and both gradients.

    The ceiling is MAMF's 86.9 % of peak at cuBLAS's heuristic pick (0.89 of it, 77 %); wave
    quantisation on 108 SMs keeps the m=2048 products near 70 % (cuBLASLt's own 4096^3 row
    loses the same ~10 % against 8192^3); the wgrad products 68-76 %. Mean 69.7 % (71.3 % with the
    heuristic fraction at 0.91, before Azure's FP8 rows were priced with the fast accumulation their harness sets).
    """
    effs = []
    for m, n, k in [(2048, 4608, 12288), (2048, 12288, 1536), (2048, 6144, 12288), (2048, 12288, 6144)]:
        for shape in [(m, n, k), (m, k, n), (k, n, m)]:  # forward, dgrad, wgrad
            effs.append(gemm_tflops(A100, 1, *shape, "fp16") / 312)
            assert 0.65 <= effs[-1] <= 0.80, (shape, effs[-1])
    assert statistics.mean(effs) >= 0.69


def test_small_gemms_are_slower_per_flop_than_large_ones():
    big = gemm_tflops(A100, 1, 8192, 8192, 8192, "fp16")
    assert gemm_tflops(A100, 1, 1024, 1024, 1024, "fp16") < 0.5 * big


def test_wave_quantisation_shows_when_tiles_just_exceed_the_sm_count():
    # 108 tiles of 256x128 fill the 108 SMs once; one more row of tiles forces a smaller
    # tile or a second wave, and the rate drops by a quarter or more.
    one_wave = compute.gemm_plan(A100, 256 * 54, 256, 8192, dtype="fp16")
    assert (one_wave.tile, one_wave.waves) == ((256, 128), 1)
    full = gemm_tflops(A100, 1, 256 * 54, 256, 8192, "fp16")
    assert gemm_tflops(A100, 1, 256 * 54 + 128, 256, 8192, "fp16") < 0.75 * full


def test_fp8_uses_the_fp8_peak_and_a100_falls_back_to_16_bit():
    assert compute.matmul_time_s(H100, 8192, 8192, 8192, dtype="fp8") < 0.7 * compute.matmul_time_s(
        H100, 8192, 8192, 8192, dtype="bf16"
    )
    assert compute.matmul_time_s(A100, 4096, 4096, 4096, dtype="fp8") == pytest.approx(
        compute.matmul_time_s(A100, 4096, 4096, 4096, dtype="bf16"), rel=0.15
    )


# ---- memory-bound kernels -------------------------------------------------------------

STREAM_ARRAYS = {"copy": 2, "mul(scale)": 2, "add": 3, "triad": 3, "dot": 2}


@pytest.mark.parametrize(
    ("dev", "device"), [(A100, "A100-SXM4-80GB"), (H100, "H100-SXM-80GB"), (H200, "H200-SXM-141GB")]
)
def test_streaming_kernels_match_stream_rows_within_10_percent(rows, dev, device):
    n = 2**28  # fp32 elements per array, 1 GiB: large enough that launch cost vanishes
    pairs = []
    for r in rows:
        if r["device"] == device and r["op"].startswith("HBM STREAM-like kernel: "):
            arrays = STREAM_ARRAYS[r["op"].removeprefix("HBM STREAM-like kernel: ")]
            nbytes = arrays * n * 4
            pairs.append((nbytes / compute.memory_bound_time_s(dev, nbytes) / 1e12, float(r["value"])))
    assert len(pairs) == 5
    assert mape(pairs) <= 10.0  # achieved 3.1 % (A100), 2.3 % (H100), 2.9 % (H200)


def test_jax_elementwise_add_on_h100(rows):
    (row,) = [r for r in rows if r["op"] == "elementwise add fp32[N]" and r["device"] == "H100-SXM"]
    nbytes = 3 * 1024**3 * 4  # two reads and one write of fp32[2^30]
    assert compute.memory_bound_time_s(H100, nbytes) * 1e3 == pytest.approx(float(row["value"]), rel=0.10)


# ---- attention ------------------------------------------------------------------------

FLASH_ROWS = [  # (device, attrs, measured TFLOP/s, FLOPs counted by the source)
    (A100, AttentionAttrs(16, 32, 32, 1024, 1024, 128, False), 177.67, "full"),
    (A100, AttentionAttrs(4, 32, 32, 1024, 4096, 128, False), 183.27, "full"),
    (A100, AttentionAttrs(4, 32, 8, 1024, 4096, 128, False), 185.22, "full"),
    (A100, AttentionAttrs(1, 32, 8, 4096, 4096, 128, False), 187.13, "full"),
    (A100, AttentionAttrs(16, 32, 32, 1024, 1024, 128, True), 143.7, "half"),
    (A100, AttentionAttrs(4, 32, 32, 1024, 4096, 128, True), 98.1, "half"),
    (A100, AttentionAttrs(4, 32, 8, 1024, 4096, 128, True), 99.84, "half"),
    (A100, AttentionAttrs(1, 32, 8, 4096, 4096, 128, True), 159.41, "half"),
    (A100, AttentionAttrs(2, 32, 32, 8192, 8192, 64, False), 179.5, "full"),  # Azure, head_dim 64
    (H100, AttentionAttrs(32, 16, 16, 512, 512, 128, False), 430.32, "full"),  # FA3
    (H100, AttentionAttrs(8, 16, 16, 2048, 2048, 128, False), 565.544, "full"),
    (H100, AttentionAttrs(4, 16, 16, 4096, 4096, 128, False), 590.233, "full"),
    (H100, AttentionAttrs(1, 16, 16, 16384, 16384, 128, False), 620.73, "full"),
]


def test_flash_attention_matches_fa2_and_fa3_rows_within_10_percent(rows):
    assert any(r["op"].startswith("FlashAttention-2 forward") for r in rows)  # the rows below are these
    for dev in (A100, H100):
        pairs = []
        for d, a, tflops, counted in FLASH_ROWS:
            if d is dev:
                flops = a.flops / 2 if counted == "half" else a.flops
                pairs.append((flops / compute.attention_time_s(dev, a, "bf16") / 1e12, tflops))
        assert mape(pairs) <= 10.0, f"{dev.name} flash MAPE {mape(pairs):.1f}%"  # achieved 3.0 % / 1.7 %


def test_causal_attention_costs_about_half_and_backward_about_three_times():
    full = AttentionAttrs(4, 32, 32, 4096, 4096, 128, causal=False)
    causal = AttentionAttrs(4, 32, 32, 4096, 4096, 128, causal=True)
    t_full = compute.attention_time_s(A100, full, "bf16")
    assert 0.5 < compute.attention_time_s(A100, causal, "bf16") / t_full < 0.65
    assert 2.5 < compute.attention_time_s(A100, full, "bf16", backward=True) / t_full < 3.5
    assert compute.causal_fraction(4096, 4096) == pytest.approx(0.5, abs=1e-3)


def test_unfused_attention_is_several_times_slower_than_flash(rows):
    """Azure measured 3.9x (A100, d=64) and 2.3x (H100, FA2 vs math, d=128) at seq 8192."""
    for dev, d, ratio in [(A100, 64, 2.0), (H100, 128, 2.0)]:
        a = AttentionAttrs(2, 2048 // d, 2048 // d, 8192, 8192, d, causal=False)
        math_a = AttentionAttrs(2, 2048 // d, 2048 // d, 8192, 8192, d, causal=False, flash=False)
        flash_s = compute.attention_time_s(dev, a, "fp16")
        assert compute.attention_time_s(dev, math_a, "fp16") > ratio * flash_s


# ---- the backend on IR nodes ----------------------------------------------------------


def node(op: OpKind, attrs, shape=(2048, 12288), dtype=DType.FP16, phase=Phase.FORWARD) -> Node:
    return Node(0, op, (), TensorSpec(shape, dtype), attrs, phase)


def test_backend_costs_nodes_by_op_kind_and_phase():
    gpu = GPUBackend(A100)
    mm = node(OpKind.MATMUL, MatmulAttrs(2048, 4608, 12288))
    assert gpu.op_time_s(mm, 0) == pytest.approx(compute.matmul_time_s(A100, 2048, 4608, 12288, 1, "fp16"))
    attn = AttentionAttrs(1, 12, 12, 2048, 2048, 128)
    fwd = gpu.op_time_s(node(OpKind.ATTENTION, attn), 0)
    assert gpu.op_time_s(node(OpKind.ATTENTION, attn, phase=Phase.RECOMPUTE), 0) == fwd
    assert gpu.op_time_s(node(OpKind.ATTENTION, attn, phase=Phase.BACKWARD), 0) > 2.5 * fwd
    gelu = node(OpKind.ELEMENTWISE, ElementwiseAttrs("gelu"))
    assert gpu.op_time_s(gelu, 2 * 10**9) == pytest.approx(2e9 / 1674e9 + 4e-6)
    from echosim.ir.ops import NoAttrs

    for free in (OpKind.VIEW, OpKind.INPUT):
        assert gpu.op_time_s(node(free, NoAttrs()), 10**9) == 0.0


def test_fp32_matmuls_use_tf32_unless_disabled():
    mm = node(OpKind.MATMUL, MatmulAttrs(4096, 4096, 4096), dtype=DType.FP32)
    tf32, simt = GPUBackend(A100), GPUBackend(A100, allow_tf32=False)
    assert tf32.peak_flops("fp32") == 156e12 and simt.peak_flops("fp32") == 19.5e12
    assert simt.op_time_s(mm, 0) > 5 * tf32.op_time_s(mm, 0)


# ---- invariants -----------------------------------------------------------------------

dims = st.integers(1, 20000)


@settings(max_examples=150, deadline=None)
@given(m=dims, n=dims, k=dims, grow=st.integers(1, 5000), axis=st.sampled_from("mnk"))
def test_matmul_time_never_decreases_when_a_dimension_grows(m, n, k, grow, axis):
    base = {"m": m, "n": n, "k": k}
    bigger = dict(base, **{axis: base[axis] + grow})
    for dev, dtype in ((A100, "fp16"), (H100, "fp8")):
        before = compute.matmul_time_s(dev, **base, dtype=dtype)
        assert compute.matmul_time_s(dev, **bigger, dtype=dtype) >= before


@settings(max_examples=100, deadline=None)
@given(nbytes=st.integers(0, 10**11), more=st.integers(0, 10**10))
def test_memory_bound_time_never_decreases_with_bytes(nbytes, more):
    assert compute.memory_bound_time_s(H100, nbytes + more) >= compute.memory_bound_time_s(H100, nbytes)


def test_bad_dimensions_are_rejected():
    with pytest.raises(ValueError, match="positive"):
        compute.matmul_time_s(A100, 0, 1, 1)


def test_fa2_kernels_on_h200_match_the_measured_sdpa_flash_backend() -> None:
    """FA2's anchor is Azure's H200 row; PyTorch SDPA's flash backend measured here on an H200
    (benchmarks/data/h200_microbench.csv, causal shapes) is a held-out check: within 15% forward + backward."""
    from dataclasses import replace

    from echosim.backends.compute import attention_time_s
    from echosim.ir.ops import AttentionAttrs

    path = Path(__file__).resolve().parents[1] / "benchmarks/data/h200_microbench.csv"
    rows = [
        r for r in csv.DictReader(path.open()) if r["op"] == "attention fwd+bwd (flash)" and r["metric"] == "time_us"
    ]
    assert len(rows) >= 3
    dev = DEVICES["h200"]
    for r in rows:
        b, h, s, d = (int(x) for x in re.findall(r"\d+", r["shape"]))
        fa2 = AttentionAttrs(b, h, h, s, s, d, causal=True, flash=True, kernel="fa2")
        seconds = attention_time_s(dev, fa2, "bf16") + attention_time_s(dev, fa2, "bf16", backward=True)
        assert abs(seconds * 1e6 / float(r["value"]) - 1) < 0.15, r["shape"]
        best = replace(fa2, kernel="")  # FA3 on Hopper: faster than PyTorch's FA2 kernels
        assert attention_time_s(dev, best, "bf16") < attention_time_s(dev, fa2, "bf16")


def test_fa2_is_the_ampere_flash_figure_itself() -> None:
    from echosim.backends.compute import fa2_view

    assert fa2_view(DEVICES["a100-80gb"]) is DEVICES["a100-80gb"]
    assert fa2_view(DEVICES["h100-sxm"]).flash_fwd_eff == DEVICES["h100-sxm"].fa2_fwd_eff
