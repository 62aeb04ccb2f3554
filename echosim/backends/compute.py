"""Roofline compute cost with shape-aware efficiency.

Matmuls: a cuBLAS-like kernel picks the fastest CTA tile (and split-K) for the shape;
time is wave-quantised on the SM count, each tile runs at a per-SM rate that falls for
small tiles (less operand reuse), and the whole is bounded below by the operand traffic
at achievable HBM bandwidth. The per-SM rate of the largest tile is the device's measured
large-GEMM efficiency, so a big square GEMM reproduces the measurement and everything
smaller follows from quantisation and reuse, not from per-shape constants.

Attention: flash kernels are tiled the same way (one CTA per 128 query rows looping over
key blocks) at the device's measured flash efficiency; the math path is batched matmuls
plus softmax passes over the materialised score tensor.

Memory-bound kernels: bytes / measured STREAM bandwidth plus a kernel overhead.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, replace

from echosim.backends import fp8_attention
from echosim.backends.devices import DeviceSpec, get_device
from echosim.ir.ops import AttentionAttrs, causal_fraction  # noqa: F401  (re-exported: cpu, tpu, cost)

# Operand reuse (MACs per loaded element, tm*tn/(tm+tn) for a tile) at which a tile runs
# at half its peak: tensor FMAs per clock over the operand elements shared memory delivers
# per clock (128 B/clk/SM = 64 fp16 elements). A100: 1024 dense fp16 FMA/clk/SM -> 16;
# H100: 2048 -> 32. (Blackwell: SMEM_ROOFLINE_FMAS below, from measurements.) Sources: NVIDIA
# A100 and H100 architecture whitepapers
# (images.nvidia.com/aem-dam/en-zz/Solutions/data-center/nvidia-ampere-architecture-whitepaper.pdf,
# resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper).
REUSE_HALF: dict[str, float] = {"ampere": 16.0, "hopper": 32.0}

# Output-tile rows one tensor-core MMA instruction covers per SM at its full rate. Blackwell's tcgen05.mma for
# one CTA (cta_group::1) takes M = 64 or M = 128; its accumulator lives in the SM's 128-lane tensor memory and an
# M = 64 MMA occupies half of those lanes (PTX ISA, tcgen05 "Data path layout organization": layout F for M = 64
# against layout D for M = 128), so half of the datapath idles and a tile of fewer than 128 rows takes the time
# of a 128-row one. Hopper's wgmma is issued per warpgroup at M = 64, one warp on each of the SM's four
# sub-partitions, so a 64-row tile keeps every tensor core busy; Ampere's mma.sync is per warp (m16n8k16):
# neither has such a floor. Checked on XLA's B200 table in microbench.csv (bf16 10.8 -> 9.2%, fp8 14.3 -> 12.1%;
# the same floor on Hopper would move its bf16 table 7.1 -> 9.6%): tests/test_gemm_tiles.py.
MMA_FULL_ROWS: dict[str, int] = {"blackwell": 128}

# Blackwell's tcgen05.mma is issued by one thread and runs asynchronously, reading both operands from shared
# memory (the "SS" form CUTLASS and cuBLAS GEMMs use) at 128 B/clk/SM; its tensor core does 64 FMAs per operand
# element shared memory delivers (4096 bf16 FMA/clk against 64 bf16 elements/clk; 8- and 4-bit formats double
# both). So a tile is a hard roofline, not a saturating curve: per k step it costs max(MMA clocks, operand
# clocks), with the MMA clocks of a tile under 128 rows those of 128 rows (MMA_FULL_ROWS). Measured on B200
# (SemiAnalysisAI/microbench-blackwell at 9a068d8): umma_throughput/tput_results_max.csv, SS, cta_group 1,
# FLOP/clk against the TS form's 8161 (bf16): M=128 N=64/80/96/112/128 0.662/0.764/0.851/0.928/0.994 (roofline
# 0.667/0.769/0.857/0.933/1), M=64 any N 0.493-0.500 (0.5), the same fractions for E4M3, S8 and F4; and the CUTLASS
# mainloop sweep (cutlass_gemm_mainloop/results.csv, one CTA streaming K = 131072 from HBM) relative to its 128x256
# tile: 128x16/32/64/128 0.203/0.388/0.648/0.972 (0.222/0.4/0.667/1), 64xN 0.48-0.50 (0.5). Both are in
# benchmarks/data/blackwell_umma.csv (tests/test_gemm_tiles.py). Ampere's mma.sync and Hopper's wgmma are issued
# by warps that wait on them, which the saturating REUSE_HALF curve stands for; no tile sweep exists for them here,
# and the same hard roofline at Hopper's 32 FMAs per element (each 64-row warpgroup reading its own B) moves XLA's
# H100 table the wrong way (bf16 5.9 -> 7.0 %, fp8 14.6 -> 15.5 %).
SMEM_ROOFLINE_FMAS: dict[str, float] = {"blackwell": 64.0}


def smem_roofline_rate(arch: str, tm: int, tn: int) -> float:
    """Share of the SM's MMA peak a tm x tn tile holds under :data:`SMEM_ROOFLINE_FMAS` (per k step: useful
    FMAs over the larger of the MMA's clocks and the operands' shared-memory clocks, in operand elements)."""
    fmas = SMEM_ROOFLINE_FMAS[arch]
    mma_clocks = max(tm, MMA_FULL_ROWS.get(arch, tm)) * tn / fmas
    return tm * tn / fmas / max(mma_clocks, tm + tn)


# CTA tiles cuBLAS/CUTLASS kernels offer for dense GEMMs (m x n of the output tile).
CTA_TILES: tuple[tuple[int, int], ...] = ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64))
SPLIT_K: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)
# Each wave of tiles starts by filling its multi-stage operand pipeline from HBM and ends
# with the epilogue store: about one DRAM round trip plus a tile store, ~1 µs.
WAVE_FIXED_S = 1.0e-6
# The last wave's epilogue (accumulators converted and stored to the output) is exposed. Hopper's and Blackwell's
# cuBLAS / CUTLASS GEMMs are persistent and warp-specialised: a CTA walks several output tiles, and one tile's
# epilogue runs while the other consumer warp group (or, on Blackwell, the MMA warp on its next accumulator stage
# in tensor memory) computes the next tile: "This allows for *epilogue* of one *consumer* warp group to be
# overlapped with the math operations of the other" (NVIDIA/cutlass media/docs/cpp/efficient_gemm.md,
# "Warp-Specialized Persistent Ping-Pong kernel design"; kernel/sm90_gemm_tma_warpspecialized_pingpong.hpp). The
# tiles of the last wave have no next tile: every SM of that wave stores its output tile at once, after its
# math, so that store runs at the device's STREAM bandwidth after the compute-bound time; an earlier wave's store
# hides only behind as much math as the next tile has (exposed_epilogue_s). Ampere's kernels are not persistent
# (one CTA per tile); their last wave has nothing after it either, so it is priced the same. Split-K plans pay
# their partials' stores in the reduction term instead (gemm_plan).

# Flash attention tiling: query rows per CTA and keys per inner-loop step.
# FA2 (sm80): 128 x 64 for head_dim <= 128; FA3 (sm90): 128 x 128.
# Source: Dao-AILab/flash-attention kernel traits (flash_fwd_launch_template.h, hopper/).
FLASH_BLOCK_Q = 128
FLASH_BLOCK_KV: dict[str, int] = {"ampere": 64, "hopper": 128, "blackwell": 128}
# Query tiles one forward CTA carries. FlashAttention-4's Blackwell forward runs two 128-row tiles of Q per CTA
# (Dao-AILab/flash-attention flash_attn/cute/flash_fwd_sm100.py, commit 001e273: FlashAttentionForwardSm100
# q_stage = 2, cta_tiler M = q_stage x m_block_size, one softmax warpgroup per tile, softmax0 / softmax1), so
# that one tile's MMA runs while the other's softmax does: a forward CTA covers 256 query rows and loops over
# the key blocks of both. The backward keeps one tile per CTA. Checked on cuDNN 9.27's published prefill sweep
# (benchmarks/cudnn_prefill_check.md): the Blackwell rows' shape error, with the level taken out, goes from
# 14.8 / 8.0 / 4.0 % to 2.8 / 3.8 / 2.7 % on B200 / GB200 / GB300; Hopper's (FA3: one tile) stays at 2.3 %.
FLASH_FWD_Q_TILES: dict[str, int] = {"blackwell": 2}
# Per-CTA fixed work (load Q, final rescale and store of O), in inner-loop steps. From the
# FA3 sequence sweep in microbench.csv (430 -> 621 TFLOP/s from S=512 to 16384 at B*S=16k):
# n/(n+c) with n = S/128 fits c ~= 2 at every point.
FLASH_CTA_FIXED_STEPS = 2.0
# Softmax (exp, max, rescale) per score element, expressed as an equivalent head_dim of
# matmul work; FA2 on A100 runs at 185 TFLOP/s with softmax and ~220 without at d=128
# (microbench.csv notes): 128 * (220/185 - 1) ~= 24.
FLASH_SOFTMAX_HEAD_DIM = 24.0
# The flash backward kernel runs 5 matmuls to the forward's 2 (QK^T is recomputed) and
# sustains a lower fraction of peak (dQ accumulation, more shared memory traffic): about
# 0.85 of the forward rate in the FlashAttention-2 paper's A100 plots (arXiv 2307.08691).
FLASH_BWD_WORK = 2.5
FLASH_BWD_RATE = 0.85


# GEMM libraries pick a kernel in one of two ways: an autotuner times every candidate and keeps
# the fastest (XLA's autotuner, mamf-finder's brute-force search: what gemm_eff_* are measured
# with), or a heuristic returns its first pick untimed (cuBLAS / cuBLASLt as PyTorch and
# Transformer Engine call them). Heuristic picks reach this fraction of the autotuned rate:
# the geometric mean of measured / modelled over the 34 heuristic-library GEMMs of >= 100 GFLOP
# in the validation data (Azure's cuBLASLt sweeps on A100, H100, H200, GB200 in microbench.csv;
# PyTorch on one H200 in benchmarks/data/h200_microbench.csv), each priced as its harness runs it:
# Azure's FP8 rows with fast accumulation (superbenchmark sets CUBLASLT_MATMUL_DESC_FAST_ACCUM), the
# H200 PyTorch FP8 rows promoted (torch._scaled_mm's default). Rows where the sustained plateau
# (:func:`sustained_tflops`) binds the fraction's own prediction (GB200 fp8 at 8192^3 and 32768^3, H100
# and H200 fp8 at 32768^3: the plateau is those rows) carry no information about the pick and are left
# out; the other 30 give 0.890, median 0.90 (0.892 before Blackwell's tiles took SMEM_ROOFLINE_FMAS; 0.888 and
# 0.89 before the last wave's output store was priced: exposed_epilogue_s; tests/test_heuristic_gemm_fraction.py).
# Fitted. Until the Azure FP8 rows were read as promoted it was 0.91 (0.906). What it carries is the long run, not
# the pick: in NVIDIA aiconfigurator's short-run PyTorch GEMMs (6 CUDA-graph replays; 1,076 bf16 shapes on A100,
# H100, H200, B200, GB200) cuBLAS's heuristic picks run at 0.94-1.02 of the autotuned rate at >= 100 GFLOP, so the
# 11 % is the power-limited clock of Azure's 10,000-warmup runs: the rate a training step's GEMMs hold
# (benchmarks/aic_gemm_check.md).
HEURISTIC_GEMM_FRACTION = 0.89

# MoE experts run as one grouped-GEMM kernel over every local expert (torch._grouped_mm, TE's opt-in CUTLASS
# path; Transformer Engine's default, one GEMM per expert on four streams, is :func:`expert_gemms_time_s`, not
# selected: benchmarks/moe_te_streams.md): a persistent CUTLASS kernel that walks the groups' tiles, each group
# with its own tile tail and its operands' own pipeline fill, and no per-shape tuning of the kind the
# dense heuristic has. On one H200 (benchmarks/moe_kernels_h200.json, `benchmarks/moe_kernels_gpu.py`:
# forward, dgrad and wgrad of the per-rank expert layers of the cases.csv MoE rows, 30 kernels) the
# grouped kernels ran at this fraction of the rate :func:`matmul_time_s` gives their shapes (geometric
# mean of modelled / measured: 0.919; tests/test_grouped_gemm.py recomputes it). Fitted, relative to the
# dense model, so it moves with HEURISTIC_GEMM_FRACTION: with that at 0.91 it was 0.90 (median 0.92, range
# 0.68-1.10; the same shapes as dense torch.bmm: 0.97).
GROUPED_GEMM_FRACTION = 0.92


# An MXFP8 GEMM runs below a per-tensor FP8 GEMM of the same shape on Blackwell: the same tcgen05 MMA rate,
# but each k-block also brings its 1x32 scale factors in (a second TMA stream and a copy into tensor memory).
# Transformer Engine's GEMM profiling guide measures both kernels on the same 12 shapes with pre-quantised
# operands (B300, benchmarks/gemm/benchmark_gemm.py --pre-quantize; hidden 4096, ffn 16384, 15,872 tokens):
# 7.161 ms per layer for MXFP8 against 6.812 ms for FP8 current scaling (per-tensor), so MXFP8 GEMMs run at
# this fraction of the per-tensor FP8 rate (fprop 0.91, dgrad 0.97, wgrad 0.97). NVIDIA/TransformerEngine
# docs/examples/gemm_profiling/gemm_profiling.rst (PR #2863, commit 8f2e635). Fitted (one vendor measurement).
MXFP8_GEMM_FRACTION = 6.812 / 7.161


def itemsize(dtype: str) -> float:
    """Bytes per operand element; block-scaled formats add their scales (MXFP8: one byte per 32
    elements, NVFP4: one byte per 16; OCP Microscaling spec v1.0, NVIDIA NVFP4 paper arXiv:2509.25149)."""
    sizes = {"fp8": 1, "mxfp8": 1 + 1 / 32, "nvfp4": 0.5 + 1 / 16, "bf16": 2, "fp16": 2}
    return sizes.get(dtype, {"fp32": 4, "tf32": 4, "fp32-simt": 4}.get(dtype, 2))


#: Block-scaled formats: a column-wise (weight-gradient) copy is a second quantisation with its own scales.
COLUMNWISE_FORMATS = ("mxfp8", "nvfp4")


# FP8 accumulation on Hopper. Its FP8 wgmma accumulates in reduced precision (about 14 bits: DeepSeek-V3
# technical report, arXiv:2412.19437, sec. 3.3.2), so cuBLASLt by default moves the partial sums into FP32
# registers every few k-blocks with the SIMT cores; CUBLASLT_MATMUL_DESC_FAST_ACCUM skips that ("problem
# execution might be faster but at the cost of lower accuracy because intermediate results will not
# periodically be promoted to a higher precision", cuBLAS docs, cublasLtMatmulDescAttributes_t). Who sets it:
# XLA for every FP8 dot of DEFAULT precision (openxla/xla stream_executor/cuda/cuda_blas_lt.cc,
# IsFastAccumEnabled); Transformer Engine for fprop only (pytorch/module/base.py: _2X_ACC_FPROP False,
# _2X_ACC_DGRAD and _2X_ACC_WGRAD True; recipe.Float8CurrentScaling likewise); torchao's float8 training for
# the output GEMM only (Float8LinearConfig.gemm_config_output use_fast_accum=True, the gradient GEMMs False);
# not torch._scaled_mm's default (use_fast_accum=False), which mamf-finder calls, so gemm_eff_fp8 is the
# promoted rate. With the promotion gone an FP8 GEMM is the 16-bit kernel at twice the MMA rate and the same
# operand bytes per k-step, so it runs at the part's 16-bit efficiency: where nothing is promoted, Blackwell's
# tcgen05 (FP32 accumulators in tensor memory), MAMF's FP8 and 16-bit fractions agree (B200 0.763 / 0.776,
# GB200 0.723 / 0.729), while on Hopper FP8 trails by 9-12% (H100 0.709 / 0.803, H200 0.734 / 0.803).
FP8_PROMOTING_ARCHS: tuple[str, ...] = ("hopper",)


def gemm_efficiency(dev: DeviceSpec, dtype: str, fast_accum: bool = False) -> float:
    """Fraction of peak a large, well-shaped GEMM of this dtype sustains (measured); ``fast_accum``: an FP8
    GEMM without the promotion of its partial sums (:data:`FP8_PROMOTING_ARCHS`)."""
    if dtype == "mxfp8" and dev.gemm_eff_fp8 is not None:
        return dev.gemm_eff_fp8 * MXFP8_GEMM_FRACTION  # the scale-factor stream (note at MXFP8_GEMM_FRACTION)
    if dtype == "fp8" and dev.gemm_eff_fp8 is not None:
        if fast_accum and dev.arch in FP8_PROMOTING_ARCHS:
            return max(dev.gemm_eff_fp8, dev.gemm_eff_16bit)
        return dev.gemm_eff_fp8
    if dtype == "nvfp4" and dev.gemm_eff_fp4 is not None:
        return dev.gemm_eff_fp4
    return dev.gemm_eff_16bit


@functools.lru_cache(maxsize=256)
def tile_efficiency(arch: str, tm: int, tn: int) -> float:
    """Per-SM rate of a tm x tn tile relative to the largest tile, from operand reuse and, where the
    MMA instruction has a row floor (:data:`MMA_FULL_ROWS`), the idle share of its datapath.

    Blackwell takes the hard shared-memory roofline of its asynchronous MMA (:data:`SMEM_ROOFLINE_FMAS`);
    Ampere and Hopper the saturating reuse curve (:data:`REUSE_HALF`)."""
    if arch in SMEM_ROOFLINE_FMAS:
        return smem_roofline_rate(arch, tm, tn) / smem_roofline_rate(arch, *CTA_TILES[0])
    half = REUSE_HALF[arch]

    def rate(a: int, b: int) -> float:
        reuse = a * b / (a + b)
        return reuse / (reuse + half)

    return rate(tm, tn) / rate(*CTA_TILES[0]) * min(1.0, tm / MMA_FULL_ROWS.get(arch, tm))


def exposed_epilogue_s(out_bytes: float, out_tiles: int, waves: int, sm_count: int, tile_s: float, bw: float) -> float:
    """Seconds of epilogue stores a GEMM's math does not hide (note at :data:`WAVE_FIXED_S`).

    Each wave's store (its share of the ``out_bytes`` output at ``bw``) overlaps the next wave's tile math of
    ``tile_s``, and only up to it; the last wave's store has no next tile and is paid whole."""
    full_wave_s = out_bytes * min(sm_count, out_tiles) / out_tiles / bw
    last_wave_s = out_bytes * (out_tiles - (waves - 1) * sm_count) / out_tiles / bw
    return (waves - 1) * max(0.0, full_wave_s - tile_s) + last_wave_s


@dataclass(frozen=True, slots=True)
class GemmPlan:
    """The kernel configuration the model picked, for reports and tests."""

    tile: tuple[int, int]
    split_k: int
    waves: int
    compute_s: float
    memory_s: float

    @property
    def time_s(self) -> float:
        return max(self.compute_s, self.memory_s)


@functools.lru_cache(maxsize=65536)
def gemm_plan(
    dev: DeviceSpec,
    m: int,
    n: int,
    k: int,
    batch: int = 1,
    dtype: str = "bf16",
    autotuned: bool = False,
    sustained: bool = True,
    fast_accum: bool = False,
    tiles: tuple[tuple[int, int], ...] = CTA_TILES,
    splits: tuple[int, ...] = SPLIT_K,
) -> GemmPlan:
    """The fastest tile / split-K choice for ``batch`` products of (m x k) @ (k x n).

    ``autotuned``: the library timed its candidates (XLA); otherwise its heuristic's pick runs
    at :data:`HEURISTIC_GEMM_FRACTION` of that rate (cuBLAS as PyTorch calls it). ``sustained``: the GEMM
    runs within a long stream of work (a training step) and no faster than :func:`sustained_tflops`.
    ``fast_accum``: an FP8 GEMM with fast accumulation (:data:`FP8_PROMOTING_ARCHS`). ``tiles`` and ``splits``:
    the candidates (one of each: the plan of a kernel whose tile is already chosen).
    """
    if min(m, n, k, batch) <= 0:
        raise ValueError(f"matmul dims must be positive, got m={m} n={n} k={k} batch={batch}")
    if dtype == "nvfp4" and dev.gemm_eff_fp4 is None:  # never costed at another format's rate
        raise ValueError(f"{dev.name} has no FP4 tensor cores: an nvfp4 GEMM cannot run on it")
    selection = 1.0 if autotuned else HEURISTIC_GEMM_FRACTION
    per_sm = dev.peak_tflops(dtype) * 1e12 * gemm_efficiency(dev, dtype, fast_accum) * selection / dev.sm_count
    bw = dev.hbm_stream_GBps * 1e9
    # fp8 GEMMs read fp8 operands and write a 16-bit result (Transformer Engine, cuBLASLt).
    out_size = 2 if dtype in ("fp8", "mxfp8", "nvfp4") else itemsize(dtype)
    memory_s = batch * ((m * k + k * n) * itemsize(dtype) + m * n * out_size) / bw
    out_bytes = batch * m * n * out_size
    best: GemmPlan | None = None
    best_s = math.inf
    for tm, tn in tiles:
        rate = per_sm * tile_efficiency(dev.arch, tm, tn)
        out_tiles = batch * math.ceil(m / tm) * math.ceil(n / tn)
        for split in splits:
            waves = math.ceil(out_tiles * split / dev.sm_count)
            tile_s = 2 * tm * tn * math.ceil(k / split) / rate
            compute_s = waves * (tile_s + WAVE_FIXED_S)
            if split == 1:  # epilogue stores not hidden behind a next tile's math (note at WAVE_FIXED_S)
                compute_s += exposed_epilogue_s(out_bytes, out_tiles, waves, dev.sm_count, tile_s, bw)
            # split-K partials: fp32 tiles written and read back by a second reduction kernel.
            reduce_s = 0.0
            if split > 1:
                reduce_s = 2 * batch * m * n * 4 * split / bw + dev.kernel_overhead_us * 1e-6
            if max(compute_s + reduce_s, memory_s) < best_s:  # GemmPlan.time_s, without building every plan
                best = GemmPlan((tm, tn), split, waves, compute_s + reduce_s, memory_s)
                best_s = best.time_s
    assert best is not None
    if sustained and (cap := sustained_tflops(dev, dtype)) is not None:
        best = replace(best, compute_s=max(best.compute_s, 2.0 * batch * m * n * k / (cap * 1e12)))
    return best


def sustained_tflops(dev: DeviceSpec, dtype: str) -> float | None:
    """The rate the part holds over a sustained run of GEMMs of this dtype (its power-limited clock), if measured.

    A training step runs its GEMMs back to back for seconds to minutes; the short runs behind
    :func:`gemm_efficiency` (MAMF's search: 50 warmup and 100 timed iterations a shape) can stay at boost
    clocks. Where the part's long-warmup rows measure a lower plateau (GB200 FP8: 2826-2877 TFLOP/s from
    8192^3 to 32768^3 after 10,000 warmup iterations, against MAMF's 3616), no GEMM runs faster than it;
    on A100 the plateau sits above what the model gives a heuristic pick; on H100 and H200 it binds only FP8
    with fast accumulation at the largest shapes (the plateau rows themselves ran fast).
    """
    if dtype == "mxfp8" and dev.sustained_fp8_tflops is not None:
        return dev.sustained_fp8_tflops * MXFP8_GEMM_FRACTION  # fewer MMAs per clock at the same clock
    if dtype in ("fp8", "mxfp8"):
        return dev.sustained_fp8_tflops
    if dtype in ("bf16", "fp16"):
        return dev.sustained_16bit_tflops
    return None


def matmul_time_s(
    dev: DeviceSpec,
    m: int,
    n: int,
    k: int,
    batch: int = 1,
    dtype: str = "bf16",
    autotuned: bool = False,
    grouped: bool = False,
    sustained: bool = True,
    fast_accum: bool = False,
) -> float:
    """Seconds of ``batch`` (m x k) @ (k x n) products; ``grouped``: one MoE grouped-GEMM kernel over them;
    ``fast_accum``: FP8 without the promotion of partial sums (:data:`FP8_PROMOTING_ARCHS`)."""
    plan = gemm_plan(dev, m, n, k, batch, dtype, autotuned, sustained, fast_accum)
    seconds = plan.time_s + dev.kernel_overhead_us * 1e-6
    return seconds / GROUPED_GEMM_FRACTION if grouped else seconds


@functools.lru_cache(maxsize=4096)
def expert_gemms_time_s(
    dev: DeviceSpec,
    m: int,
    n: int,
    k: int,
    experts: int,
    dtype: str = "bf16",
    autotuned: bool = False,
    sustained: bool = True,
    fast_accum: bool = False,
    streams: int = 1,
) -> float:
    """Seconds of ``experts`` (m x k) @ (k x n) GEMMs issued one per expert, round-robin on ``streams`` streams.

    Transformer Engine's GroupedLinear (Megatron-Core's TEGroupedMLP) runs a MoE layer's experts this way:
    ``multi_stream_cublas_gemm`` launches expert i's cuBLAS GEMM on compute stream ``i % 4``, the streams
    fenced by events before and after (transformer_engine/common/gemm/cublaslt_gemm.cu; four streams:
    ``num_streams`` in include/transformer_engine/gemm.h at v1.13, commit e5edd6c, ``num_compute_streams`` in
    common/util/multi_stream.cpp at v2.7 to v2.18, commit 27486e0). Its grouped kernels are opt-in
    (``NVTE_USE_CUTLASS_GROUPED_GEMM``, Hopper 16-bit only; ``NVTE_GROUPED_LINEAR_USE_FUSED_GROUPED_GEMM`` from
    v2.18), and no NeMo / Megatron-Bridge recipe sets them. Not selected for any framework: on the cases.csv
    rows that run it, it predicts worse than the grouped kernel (benchmarks/moe_te_streams.md).

    Each GEMM runs the tile and split-K the library picks for its own shape (:func:`gemm_plan` with batch 1:
    cuBLAS's heuristic sees one GEMM, not the streams). Kernels on different streams run concurrently and
    their thread blocks share the SMs (CUDA C++ Programming Guide, "Concurrent Kernel Execution"; up to 128
    resident grids per device from compute capability 7.0), so the experts go in rounds of ``streams`` GEMMs:
    a round's tiles pack into ``ceil(streams x tiles / SMs)`` waves, its operand traffic shares HBM, and its
    launch gaps (``kernel_overhead_us``) overlap into one. ``streams=1`` is the serial bound, ``experts``
    times :func:`matmul_time_s` of one GEMM. Not the grouped kernel's rate (:data:`GROUPED_GEMM_FRACTION`):
    these are the dense library's own GEMMs. A closed form of equal experts (echosim routes evenly); the
    streams' tails drifting into one another across rounds is not modelled (a round ends with its last tile).
    """
    if streams <= 0 or experts <= 0:
        raise ValueError(f"expert GEMMs need experts and streams >= 1, got experts={experts} streams={streams}")
    one = gemm_plan(dev, m, n, k, 1, dtype, autotuned, False, fast_accum)  # the pick for one expert's shape

    def round_s(gemms: int) -> float:  # ``gemms`` of them side by side: one grid of their tiles, one launch gap
        grid = gemm_plan(dev, m, n, k, gemms, dtype, autotuned, sustained, fast_accum, (one.tile,), (one.split_k,))
        return grid.time_s + dev.kernel_overhead_us * 1e-6

    rounds, rest = divmod(experts, streams)
    return rounds * round_s(streams) + (round_s(rest) if rest else 0.0)


def memory_bound_time_s(dev: DeviceSpec, nbytes: int, kernels: int = 1) -> float:
    """A streaming kernel: bytes at measured STREAM bandwidth plus per-kernel overhead."""
    if nbytes < 0:
        raise ValueError(f"byte count must be non-negative, got {nbytes}")
    return nbytes / (dev.hbm_stream_GBps * 1e9) + kernels * dev.kernel_overhead_us * 1e-6


#: Bytes per parameter an offloaded optimizer step moves over the GPU's host link: the fp32 gradient down and the
#: updated fp32 weight back. DeepSpeed casts a gradient partition to fp32 before it copies it to the host and
#: copies the fp32 partition back before casting it (``async_inplace_copy_grad_to_fp32_buffer_from_gpu`` and
#: ``step``, deepspeed/runtime/zero/stage_1_and_2.py at 38327e0); Megatron-Core's hybrid device optimizer copies
#: the fp32 main gradients down and, with ``param_update_in_fp32``, fp32 weights back
#: (megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py).
HOST_LINK_BYTES_PER_PARAM = 8


def offload_refusal(dev: DeviceSpec) -> str:
    """Why nothing can be offloaded to this part's host, optimizer or weights ("" where it can): a figure of its
    host is missing."""
    missing = [n for n in ("host_link_GBps", "host_memory_GBps") if getattr(dev, n) is None]
    return f"device {dev.name!r} has no {' or '.join(missing)} figure" if missing else ""


def host_copy_time_s(dev: DeviceSpec, nbytes: int) -> float:
    """``nbytes`` copied between host memory and the device over the GPU's host link (pinned, one direction)."""
    if why := offload_refusal(dev):
        raise ValueError(f"host copy: {why}")
    assert dev.host_link_GBps is not None
    return nbytes / (dev.host_link_GBps * 1e9)


def host_optimizer_time_s(
    dev: DeviceSpec, params: int, bytes_per_param: int, ranks: int, overlapped: bool = False
) -> float:
    """An optimizer step of ``params`` elements on the host: the gradients down the host link, the step's
    ``bytes_per_param`` through host DRAM, the weights back, one after another (Megatron-Core without
    ``--overlap-cpu-optimizer-d2h-h2d``). Each of a job's ``ranks`` on one host steps its own share at the same
    time (the ranks keep in step), so each gets the host's DRAM bandwidth over the job's GPUs on that host.

    ``overlapped``: the three pipelined over parameter groups (Megatron-Core's hybrid device optimizer with that
    flag: one group's gradients come down while another is stepped and a third goes back), the link carrying its
    two directions at once: the slowest of the three, the pipeline's fill and drain left out (a lower bound)."""
    if why := offload_refusal(dev):
        raise ValueError(f"optimizer offload: {why}")
    assert dev.host_link_GBps is not None and dev.host_memory_GBps is not None
    sharing = min(ranks, dev.gpus_per_host or dev.devices_per_node)
    link = params * HOST_LINK_BYTES_PER_PARAM / (dev.host_link_GBps * 1e9)
    dram = params * bytes_per_param * sharing / (dev.host_memory_GBps * 1e9)
    return max(link / 2, dram) if overlapped else link + dram


# ---- attention -----------------------------------------------------------------------


def band_kv_blocks(q: int, kv: int, block_q: int, block_kv: int, window: int | None = None) -> list[int]:
    """Key blocks each query block visits under a bottom-right aligned causal mask, within a sliding
    ``window`` (:func:`echosim.ir.ops.band_pairs`); ``None``: every block up to the diagonal.

    A block partly inside the band is computed whole (masked); blocks wholly outside are skipped.
    FlashAttention's local path bounds its key-block loop the same way: ``n_block_min`` is the block
    holding the first query row's first visible key, ``n_block_max`` the one holding the last row's
    last key (Dao-AILab/flash-attention csrc/flash_attn/src/flash_fwd_kernel.h ``Is_local``;
    hopper/block.h ``get_n_block_min_max``). Splash attention keeps the same block-sparse map from its
    ``LocalMask`` (jax.experimental.pallas.ops.tpu.splash_attention ``MaskInfo``).
    """
    blocks = []
    offset = kv - q
    for i in range(math.ceil(q / block_q)):
        first_row, last_row = i * block_q, min((i + 1) * block_q, q) - 1
        hi = min(kv, last_row + offset + 1)  # one past the last row's last visible key
        lo = 0 if window is None else max(0, first_row + offset + 1 - window)  # the first row's first key
        blocks.append(max(0, math.ceil(hi / block_kv) - lo // block_kv) if hi > lo else 0)
    return blocks


def _flash_steps(dev: DeviceSpec, a: AttentionAttrs, backward: bool = False) -> float:
    """Makespan, in inner-loop steps of one SM, of the flash grid (one CTA per query block of
    :data:`FLASH_FWD_Q_TILES` tiles in the forward, one tile in the backward); a CTA with two tiles runs
    each key block once per tile."""
    tiles = 1 if backward else FLASH_FWD_Q_TILES.get(dev.arch, 1)
    bq, bkv = FLASH_BLOCK_Q * tiles, FLASH_BLOCK_KV[dev.arch]
    if a.causal:
        per_q_block = [tiles * n for n in band_kv_blocks(a.q_len, a.kv_len, bq, bkv, a.window or None)]
    else:
        per_q_block = [tiles * math.ceil(a.kv_len / bkv)] * math.ceil(a.q_len / bq)
    ctas = a.batch * a.heads
    steps = [n + FLASH_CTA_FIXED_STEPS for n in per_q_block]
    if a.causal:  # uneven CTAs: SMs back-fill; on average half the longest CTA is left as tail
        return max(ctas * sum(steps) / dev.sm_count + max(steps) / 2, max(steps))
    return math.ceil(ctas * len(steps) / dev.sm_count) * steps[0]


def _flash_step_flops(dev: DeviceSpec, head_dim: int) -> float:
    """Tensor-core FLOPs of one step (QK^T and PV of a block pair), with softmax as extra work."""
    softmax = (head_dim + FLASH_SOFTMAX_HEAD_DIM) / head_dim
    return 4 * FLASH_BLOCK_Q * FLASH_BLOCK_KV[dev.arch] * head_dim * softmax


@functools.lru_cache(maxsize=64)
def flash_inner_efficiency(dev: DeviceSpec) -> float:
    """Per-SM efficiency of the inner loop, solved from the device's measured flash forward.

    The measurement includes the CTA fixed work, wave tails and softmax of its own shape;
    dividing those out leaves the rate of the loop itself, which then prices other shapes.
    """
    b, h, s, d = dev.flash_fwd_shape
    anchor = AttentionAttrs(b, h, h, s, s, d, causal=False, flash=True)
    ideal_s = _flash_steps(dev, anchor) * _flash_step_flops(dev, d) / (dev.peak_bf16_tflops * 1e12 / dev.sm_count)
    return dev.flash_fwd_eff * ideal_s * dev.peak_bf16_tflops * 1e12 / anchor.flops


@functools.lru_cache(maxsize=64)
def _backward_anchor_steps(dev: DeviceSpec) -> float:
    """Forward over backward makespan steps at the device's measured anchor: 1 where both passes tile the queries
    alike. Where the forward CTA carries more tiles (:data:`FLASH_FWD_Q_TILES`) the two grids quantise into waves
    differently at the anchor, and this keeps the backward at its measured ratio to the forward there
    (:func:`flash_bwd_rate`) instead of letting the anchor's wave tails move it."""
    b, h, s, d = dev.flash_fwd_shape
    anchor = AttentionAttrs(b, h, h, s, s, d, causal=False, flash=True)
    return _flash_steps(dev, anchor) / _flash_steps(dev, anchor, backward=True)


def _pass_cycles(dev: DeviceSpec, head_dim: int, backward: bool) -> tuple[float, float, float] | None:
    """(MMA, shared-memory, MUFU) cycles of one 128 x 128 tile step of a flash pass (:func:`flash_pass_fraction`);
    None where the part's unit throughputs are not given."""
    flops, mufu, smem = dev.tensor_flops_per_clk_sm, dev.mufu_ex2_per_clk_sm, dev.smem_bytes_per_clk_sm
    if flops is None or mufu is None or smem is None:
        return None
    m = n = FLASH_BLOCK_Q
    d = head_dim
    if backward:
        mma = 10 * m * n * d / flops
        smem_bytes = 2 * (4 * m * d + 3 * n * d + m * n) + 2 * m * n + 8 * m * d
    else:
        mma = 4 * m * n * d / flops
        smem_bytes = 2 * (256 * d * math.ceil(m / 128) * math.ceil(n / 128) + 128 * n * math.ceil(d / 128))
    return mma, smem_bytes / smem, m * n / mufu


def flash_pass_fraction(dev: DeviceSpec, head_dim: int, backward: bool) -> float:
    """Tensor-core time / the slowest unit's time of one 128 x 128 tile step of a flash pass (1 when the
    tensor cores bound it). The FlashAttention-4 paper's roofline (arXiv:2603.05451, sec. 3.1.1 and 3.2.1,
    M = N = 128 tiles of 16-bit operands, one CTA per MMA): forward 4MNd MMA FLOPs, 2(256d + 128N ceil(d/128))
    shared-memory bytes (QK^T reads both operands, PV reads V), MN exponentials; backward 10MNd MMA FLOPs,
    2(4Md + 3Nd + MN) operand bytes plus dS written (2MN) and the fp32 dQ staged and read back (8Md), MN
    exponentials. On B200 at d = 128 the forward is balanced (MMA and MUFU 1024 cycles each, shared memory
    768) and the backward is shared-memory bound (3328 cycles against 2560 of MMA: the paper's Table 3); on
    A100 and H100 both passes are tensor-core bound."""
    cycles = _pass_cycles(dev, head_dim, backward)
    if cycles is None:
        return 1.0
    mma, smem, mufu = cycles
    return mma / max(mma, smem, mufu)


def _fwd_tile_cycles(dev: DeviceSpec, head_dim: int) -> tuple[float, float] | None:
    """(tile cycles, tensor-core cycles with the softmax's equivalent work) of one forward tile step: the
    tensor cores' share as the measured model prices it (:func:`_flash_step_flops`), or the shared memory
    or MUFU where either takes longer; None without the part's unit throughputs."""
    cycles = _pass_cycles(dev, head_dim, False)
    if cycles is None:
        return None
    mma, smem, mufu = cycles
    work = mma * (head_dim + FLASH_SOFTMAX_HEAD_DIM) / head_dim
    return max(work, smem, mufu), work


def flash_fwd_rate(dev: DeviceSpec, head_dim: int) -> float:
    """Forward rate at ``head_dim`` / the rate at the device's measured anchor (1 where the tensor cores bind
    both). A tile's exponentials do not shrink with the head: on B200 at 64 the MMA needs 512 cycles a tile
    (704 with the softmax's equivalent work) while the MUFU still needs 1024, so the tile runs at
    704 / 1024 of the rate the anchor's (tensor-bound, 1216 cycles) gives its work. B300's doubled MUFU, A100
    and H100 stay tensor-core bound at every head in use. The backward takes the roofline through
    :func:`flash_bwd_rate`. An upper bound on the loss: kernels that emulate part of the exponentials as a
    polynomial on the FMA units (the FlashAttention-4 paper) relieve the MUFU somewhat."""
    tile, anchor = _fwd_tile_cycles(dev, head_dim), _fwd_tile_cycles(dev, dev.flash_fwd_shape[3])
    if tile is None or anchor is None:
        return 1.0
    return (tile[1] / tile[0]) / (anchor[1] / anchor[0])


def flash_bwd_rate(dev: DeviceSpec, head_dim: int) -> float:
    """Backward rate / forward rate at the device's measured forward anchor: the kernel's own measured ratio
    (``flash_bwd_over_fwd``) or :data:`FLASH_BWD_RATE` (measured where both passes are tensor-core bound), times
    the backward's roofline fraction over the anchor's forward one."""
    anchor_d = dev.flash_fwd_shape[3]
    measured = dev.flash_bwd_over_fwd or FLASH_BWD_RATE
    return measured * flash_pass_fraction(dev, head_dim, True) / flash_pass_fraction(dev, anchor_d, False)


# FlashAttention's kernels are compiled for a few head dimensions; a call runs the smallest that holds its head_dim
# and computes on the padded columns (its loads are predicated, so the bytes are the real ones). FA2: 32, 64, 96,
# 128, 192, 256 (csrc/flash_attn/src/static_switch.h, HEADDIM_SWITCH); FA3: 64, 96, 128, 192, 256
# (hopper/flash_api.cpp, round_up_headdim); Dao-AILab/flash-attention at 0251105. So head_dim 80 or 88 (ViT-H/14,
# ViT-g/14) runs as 96, and 112 as 128. cuDNN's kernels (Transformer Engine; Blackwell's flash figure)
# publish no such set and take the head_dim as it is.
FLASH_KERNEL_HEAD_DIMS: dict[str, tuple[int, ...]] = {
    "fa2": (32, 64, 96, 128, 192, 256),
    "fa3": (64, 96, 128, 192, 256),
}


def flash_kernel_head_dim(family: str, a: AttentionAttrs) -> int:
    """The head dimension FlashAttention's ``family`` kernel computes on for ``a`` (``a.head_dim`` for other
    kernels): the query/key and the value sizes each padded to a template size, then their mean, as ``head_dim``."""
    sizes = FLASH_KERNEL_HEAD_DIMS.get(family, ())

    def padded(d: int) -> int:
        return next((t for t in sizes if t >= d), d)

    qk, v = a.head_dims
    return (padded(qk) + padded(v)) // 2


def flash_view(dev: DeviceSpec, kernel: str = "") -> DeviceSpec:
    """The device as a flash call of ``kernel`` (``AttentionAttrs.kernel``) runs on it: FA2's sm80 kernels
    (:func:`fa2_view`), Transformer Engine's pick (:func:`te_view`), or the part's own flash figure."""
    return fa2_view(dev) if kernel == "fa2" else te_view(dev) if kernel == "te" else dev


def flash_family(view: DeviceSpec, kernel: str = "") -> str:
    """Which FlashAttention kernel a flash call of ``kernel`` (``AttentionAttrs.kernel``) priced on ``view`` is: FA2's
    sm80 kernels (:func:`fa2_view`, or the part's own on Ampere), FA3 (Hopper's own figure), or "" (cuDNN: TE's pick,
    Blackwell's figure)."""
    if view.arch == "ampere":
        return "fa2"
    return "fa3" if view.arch == "hopper" and kernel != "te" else ""


def flash_attention_time_s(
    dev: DeviceSpec, a: AttentionAttrs, dtype: str, backward: bool = False, family: str = ""
) -> float:
    """Tiled flash kernel: CTAs of one or two 128-row query tiles loop over key blocks; makespan over SMs.
    ``family``: a FlashAttention kernel ("fa2", "fa3"), which computes on its padded head dimension
    (:data:`FLASH_KERNEL_HEAD_DIMS`)."""
    d = flash_kernel_head_dim(family, a)
    per_sm = dev.peak_tflops(dtype) * 1e12 * flash_inner_efficiency(dev) / dev.sm_count
    step_s = _flash_step_flops(dev, d) / per_sm
    if backward:
        step_s *= FLASH_BWD_WORK / flash_bwd_rate(dev, d) * _backward_anchor_steps(dev)
    else:
        step_s /= flash_fwd_rate(dev, d)
    io = (2 * a.batch * a.heads * a.q_len + 2 * a.batch * a.kv_heads * a.kv_len) * a.head_dim * itemsize(dtype)
    if backward:
        io *= 2  # reads q, k, v, o, do; writes dq, dk, dv
    compute_s = _flash_steps(dev, a, backward) * step_s
    return max(compute_s, io / (dev.hbm_stream_GBps * 1e9)) + dev.kernel_overhead_us * 1e-6


def math_attention_time_s(dev: DeviceSpec, a: AttentionAttrs, dtype: str, backward: bool = False) -> float:
    """Unfused attention: batched matmuls plus softmax (and mask) passes over the scores.

    The math path (PyTorch's ``_scaled_dot_product_attention_math``, an eager ``softmax(QK^T + mask) V``)
    computes and stores the whole q x kv score matrix whatever the mask keeps: a sliding window
    costs here what full causal attention costs."""
    bh = a.batch * a.heads
    score_bytes = bh * a.q_len * a.kv_len * itemsize(dtype)
    qk = matmul_time_s(dev, a.q_len, a.kv_len, a.head_dim, bh, dtype)
    pv = matmul_time_s(dev, a.q_len, a.head_dim, a.kv_len, bh, dtype)
    mask_passes = 1 if a.causal else 0
    # dropout on the probabilities: forward reads P, writes P' and a one-byte mask; backward reads
    # dP' and the mask, writes dP (PyTorch's native_dropout); one kernel each way
    drop_bytes = 2 * score_bytes + bh * a.q_len * a.kv_len if a.dropout else 0
    drop_kernels = 1 if a.dropout else 0
    if not backward:  # scale+mask, softmax: each reads and writes the scores
        passes = 2 * score_bytes * (1 + mask_passes) + drop_bytes
        return qk + pv + memory_bound_time_s(dev, passes, 1 + mask_passes + drop_kernels)
    # dV = P^T dO, dP = dO V^T, softmax backward (read P, dP; write dS), dQ = dS K, dK = dS^T Q
    passes = score_bytes * (3 + 2 * mask_passes) + drop_bytes
    return 2 * pv + 2 * qk + memory_bound_time_s(dev, passes, 1 + mask_passes + drop_kernels)


@functools.lru_cache(maxsize=64)
def fa2_view(dev: DeviceSpec) -> DeviceSpec:
    """The device as FlashAttention-2's kernels use it: its sm80 tiles (128 query rows x 64 keys, the
    same kernels on Hopper and Blackwell) at FA2's measured forward rate on the part."""
    if dev.fa2_fwd_eff is None:
        return dev  # its own flash figure is FA2's already
    # sm80 kernels (mma.sync, no tensor memory) do not run at the part's own tensor-core rate: no roofline
    return replace(
        dev,
        arch="ampere",
        flash_fwd_eff=dev.fa2_fwd_eff,
        flash_fwd_shape=dev.fa2_fwd_shape,
        tensor_flops_per_clk_sm=None,
        mufu_ex2_per_clk_sm=None,
        smem_bytes_per_clk_sm=None,
    )


@functools.lru_cache(maxsize=64)
def te_view(dev: DeviceSpec) -> DeviceSpec:
    """The device as Transformer Engine's DotProductAttention uses it: cuDNN's fused attention at its measured
    forward and backward rates where the part's flash figure is another kernel's (Hopper: FA3). TE's backend
    selection prefers FusedAttention over FlashAttention on compute capability 9.0 and later (TE v1.2 on,
    ``get_attention_backend``); below it, FlashAttention (FA2 on Ampere: the part's own figure). Blackwell's
    flash figure is cuDNN's already."""
    if dev.cudnn_fwd_eff is None:
        return dev
    return replace(
        dev,
        flash_fwd_eff=dev.cudnn_fwd_eff,
        flash_fwd_shape=dev.cudnn_fwd_shape,
        flash_bwd_over_fwd=dev.cudnn_bwd_over_fwd,
    )


# FlashAttention v1 (the flash-attn 1.x package's CUDA kernels, ``flash_attn_unpadded_func``): its published
# forward + backward speed next to FlashAttention-2's on the same part, causal mask, 16-bit, batch x seq_len = 16k
# tokens, 2048 model width (FA2 paper, Dao 2023, arXiv 2307.08691, Figs. 4 and 7; the same bars as flash-attention
# commit 4f285b3 assets/flash2_a100_fwd_bwd_benchmark.png and flash2_h100_fwd_bwd_benchmark.png), the
# "FlashAttention" bars. Rows: (seq_len, FA1 TFLOP/s, FA2 TFLOP/s) by (arch, head_dim).
FA1_FWD_BWD_TFLOPS: dict[tuple[str, int], tuple[tuple[int, float, float], ...]] = {
    ("ampere", 64): (
        (512, 58.0, 88.0),
        (1024, 70.0, 119.0),
        (2048, 77.0, 140.0),
        (4096, 87.0, 156.0),
        (8192, 92.0, 165.0),
        (16384, 97.0, 171.0),
    ),
    ("ampere", 128): (
        (512, 55.0, 99.0),
        (1024, 62.0, 133.0),
        (2048, 69.0, 155.0),
        (4096, 76.0, 173.0),
        (8192, 80.0, 182.0),
        (16384, 83.0, 189.0),
    ),
    ("hopper", 64): (
        (512, 104.0, 141.0),
        (1024, 123.0, 192.0),
        (2048, 136.0, 232.0),
        (4096, 138.0, 257.0),
        (8192, 149.0, 273.0),
        (16384, 156.0, 284.0),
    ),
    ("hopper", 128): (
        (512, 98.0, 163.0),
        (1024, 109.0, 221.0),
        (2048, 108.0, 265.0),
        (4096, 126.0, 294.0),
        (8192, 135.0, 308.0),
        (16384, 137.0, 328.0),
    ),
}


#: The parts the FA2 paper's figures were measured on (Figs. 4 and 7: A100 80GB SXM4, H100 80GB SXM5), by arch.
FIGURE_DEVICES = {"ampere": "a100-80gb", "hopper": "h100-sxm"}


@functools.lru_cache(maxsize=256)
def fa2_figure_tflops(arch: str, head_dim: int, seq_len: int) -> float:
    """echosim's FlashAttention-2 forward + backward rate at one point of the FA2 paper's figures: causal, 16-bit,
    16k tokens a batch (batch = 16,384 / seq_len), 2,048 model width (heads = 2,048 / head_dim), the FLOPs the
    benchmark counts (3.5 x the causal forward's), on the figure's part."""
    heads = 2048 // head_dim
    a = AttentionAttrs(max(1, 16384 // seq_len), heads, heads, seq_len, seq_len, head_dim, kernel="fa2")
    view = fa2_view(get_device(FIGURE_DEVICES[arch]))
    seconds = flash_attention_time_s(view, a, "fp16") + flash_attention_time_s(view, a, "fp16", backward=True)
    return 3.5 * attention_flops(a) / seconds / 1e12


def _published_slowdown(
    table: dict[tuple[str, int], tuple[tuple[int, float, float], ...]], arch: str, head_dim: int, seq_len: int
) -> float:
    """echosim's FlashAttention-2 rate over another kernel's published one in ``table`` (time multiplier).

    At each of the figure's points the multiplier is echosim's FA2 rate there (:func:`fa2_figure_tflops`) over
    the kernel's bar, so that the kernel at the figure's own shape on the figure's part costs exactly its bar;
    elsewhere it moves as echosim's FA2 model moves. (The figure's FA2 bars are not the reference: echosim's FA2
    runs 0.85-1.04x of them there, and a ratio of bars would carry that gap into the kernel's price.) The head
    dimension's table is the published one nearest above (64 for <= 64, else 128); the sequence length is
    interpolated in log2 between the published points and held at the ends. A part with no published figure
    takes the newest one's (Hopper): neither kernel has a Hopper- or Blackwell-specific path."""
    fig_arch, fig_dim = ("ampere" if arch == "ampere" else "hopper"), (64 if head_dim <= 64 else 128)
    rows = [(s, fa2_figure_tflops(fig_arch, fig_dim, s) / k) for s, k, _ in table[(fig_arch, fig_dim)]]
    x = math.log2(max(rows[0][0], min(seq_len, rows[-1][0])))
    for (s0, r0), (s1, r1) in itertools.pairwise(rows):
        x0, x1 = math.log2(s0), math.log2(s1)
        if x <= x1:
            return r0 + (x - x0) / (x1 - x0) * (r1 - r0)
    return rows[-1][1]


def triton_flash_slowdown(arch: str, head_dim: int, seq_len: int) -> float:
    """echosim's FlashAttention-2 rate over FlashAttention's Triton kernel's on ``arch`` (time multiplier).

    The kernel is flash_attn/flash_attn_triton.py (flash-attention commit eff9fe6, triton 2.0.0.dev20221202), which
    llm-foundry copies as llmfoundry/models/layers/flash_attn_triton.py (attn_impl 'triton'). No figure times it:
    the FA2 paper's "FlashAttention Triton" bars are OpenAI's ``triton.ops.flash_attention``, another kernel on the
    MLIR Triton (benchmarks/benchmark_flash_attention.py at flash-attention 60499ab imports it; Tri Dao in
    Dao-AILab/flash-attention#390 points to Triton's own regression data for them). The kernel's docstring says
    its forward + backward is "slightly slower" than the CUDA FlashAttention (v1), so it takes FA1's bars: the
    fastest it is documented to be, on every part."""
    return fa1_slowdown(arch, head_dim, seq_len)


def fa1_slowdown(arch: str, head_dim: int, seq_len: int) -> float:
    """echosim's FlashAttention-2 rate over FlashAttention v1's published one on ``arch`` (time multiplier)."""
    return _published_slowdown(FA1_FWD_BWD_TFLOPS, arch, head_dim, seq_len)


#: Flash kernels costed as FlashAttention-2's time at their published rate (``AttentionAttrs.kernel``).
PUBLISHED_RATIO_KERNELS = {"triton": triton_flash_slowdown, "fa1": fa1_slowdown}


def attention_time_s(dev: DeviceSpec, a: AttentionAttrs, dtype: str, backward: bool = False) -> float:
    if a.flash and a.kernel in PUBLISHED_RATIO_KERNELS:  # FA2's time, scaled to the kernel's published rate
        slow = PUBLISHED_RATIO_KERNELS[a.kernel](dev.arch, a.head_dim, a.kv_len)
        kernel = flash_attention_time_s(fa2_view(dev), a, dtype, backward, "fa2") * slow
    elif a.flash:
        view = flash_view(dev, a.kernel)
        kernel = flash_attention_time_s(view, a, dtype, backward, flash_family(view, a.kernel))
    else:
        kernel = math_attention_time_s(dev, a, dtype, backward)
    if a.fp8:  # the BF16 kernel's time over its measured FP8 speed-up (unmeasured shapes: the BF16 time)
        kernel /= fp8_attention.speedup(dev.name, a, backward) or 1.0
    return kernel + pad_copies_time_s(dev, a, dtype, backward)


def pad_copies_time_s(dev: DeviceSpec, a: AttentionAttrs, dtype: str, backward: bool = False) -> float:
    """The varlen unpad / pad copies around a flash call (:data:`echosim.ir.ops.VARLEN_PAD_COPIES`) and the
    K/V expansion to the query heads (``AttentionAttrs.repeat_kv``), as streaming kernels; 0 when the caller
    hands the kernel its tensors as they are."""
    elements, kernels = a.pad_copy_elements(backward)
    expanded, copies = a.repeat_kv_elements(backward)
    if not kernels + copies:
        return 0.0
    return memory_bound_time_s(dev, (elements + expanded) * itemsize(dtype), kernels + copies)


def attention_flops(a: AttentionAttrs) -> float:
    """Forward FLOPs of the scores the mask keeps (a causal mask about half, a sliding window its band)."""
    return float(a.flops) * a.keep
