"""Google TPUs (v4, v5e, v5p, v6e): chips as data, systolic-array compute, ICI torus collectives.

Compute: a matmul runs on the MXUs (128 x 128 systolic arrays, 256 x 256 on v6e), so
its contracting and output-column dimensions are padded to the array size and its rows
to the 8 sublanes of a vector register; time is the padded work at the chip's matmul
rate, bounded below by operand traffic at achievable HBM bandwidth. XLA fuses
elementwise chains, so memory-bound ops cost their bytes plus a small per-fusion gap.

Collectives follow the scaling-book analysis (``../shared/notes/collective-cost-models.md``):
a group is laid out as the most cube-like block of the slice's torus; each axis runs a
bidirectional ring (both directions of every link carry data when the axis wraps
around, one when it does not), the axes of a multi-axis collective add their bandwidth,
and every hop costs about 1 µs. Groups that span several slices reduce inside each slice
over ICI and across slices over the data-centre network (DCN), per chip.

The :class:`~echosim.backends.base.Placement` a TPU backend receives counts *slices* as
nodes: ``per_node`` chips of the group share one ICI slice, ``nodes`` slices are joined
over DCN. A cluster's node is the slice: by default the whole job up to the largest slice
(:meth:`TPUBackend.node_devices`); ``--devices-per-node`` sets a smaller one.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields

from echosim.backends.base import KernelBackend, OverlapModel, Placement
from echosim.backends.topology import fill_domains
from echosim.ir.graph import Node
from echosim.ir.ops import AttentionAttrs, MatmulAttrs, OpKind

_SCALING_BOOK = "https://github.com/jax-ml/scaling-book/blob/main/tpus.md"

# A hop between neighbouring chips on ICI, and the fixed start of one XLA collective.
# Source: scaling-book tpus.md ("roughly 1 µs per hop"); no TPU collective measurements
# exist in the validation data (collective-cost-models.md, gap 1), so the per-op start is
# assumed equal to NCCL's Simple-protocol base latency on GPUs (8.4 µs, tuning.cc).
ICI_HOP_US = 1.0
COLLECTIVE_START_US = 8.4
# A DCN message crosses hosts through the NIC and the data-centre switches: NCCL's
# per-hop network latency for the Simple protocol (tuning.cc, NET row).
DCN_HOP_US = 14.0
# Gap between two XLA fusions on one TensorCore (launch of the next program region).
# Assumed equal to the GPU kernel overhead minus its launch share: 2 µs.
FUSION_OVERHEAD_US = 2.0
# Rows of a vector register (sublanes): the row dimension of an MXU pass is padded to 8.
# Source: scaling-book tpus.md (VREG shape 8 x 128).
SUBLANES = 8


@dataclass(frozen=True, slots=True)
class TPUSpec:
    """One TPU chip generation. Bandwidths are GB/s per direction unless named otherwise."""

    name: str
    peak_bf16_tflops: float
    peak_fp8_tflops: float | None  # None: fp8 runs at the bf16 rate
    peak_fp32_tflops: float  # f32 matmuls take ~3 bf16 passes (bf16_3x) on the MXU
    peak_int8_tops: float  # int8 x int8 -> int32 MXU rate (MaxText AQT int8 GEMMs)
    hbm_GB: float
    hbm_GBps: float
    hbm_stream_fraction: float  # achievable share of peak HBM bandwidth
    mxu_dim: int
    gemm_eff: float  # fraction of peak a large, aligned matmul sustains
    ici_link_GBps: float  # one direction of one ICI link
    ici_links: int  # links per chip (2 per torus axis)
    ici_chip_Gbps: float  # vendor's per-chip ICI figure (hw_specs.csv), for cross-checks
    torus_dims: int  # 2 (v5e, v6e) or 3 (v4, v5p)
    pod_chips: int  # largest single ICI slice
    wrap_multiple: int  # an axis wraps around when its length is a multiple of this
    chips_per_host: int
    dcn_GBps: float  # data-centre network per chip, per direction
    source: str

    def __post_init__(self) -> None:
        validate_tpu(self)

    def peak_tflops(self, dtype: str) -> float:
        if dtype == "fp8":
            return self.peak_fp8_tflops or self.peak_bf16_tflops
        if dtype == "int8":
            return self.peak_int8_tops
        if dtype in ("fp32", "tf32", "fp32-simt"):
            return self.peak_fp32_tflops
        return self.peak_bf16_tflops


def validate_tpu(spec: TPUSpec) -> None:
    """Raise ``ValueError`` naming the chip and the field of any missing or impossible value."""
    who = f"device {spec.name or '<unnamed>'!r}"
    if not spec.name:
        raise ValueError(f"{who}: field 'name' is missing")
    if not spec.source.strip():
        raise ValueError(f"{who}: field 'source' is missing (every number needs a source)")
    for f in fields(spec):
        if f.name in ("name", "source"):
            continue
        value = getattr(spec, f.name)
        if value is None and f.name == "peak_fp8_tflops":
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{who}: field {f.name!r} must be a positive number, got {value!r}")
    for name in ("hbm_stream_fraction", "gemm_eff"):
        if getattr(spec, name) > 1:
            raise ValueError(f"{who}: field {name!r} is a fraction, got {getattr(spec, name)!r} > 1")
    if spec.torus_dims not in (2, 3):
        raise ValueError(f"{who}: field 'torus_dims' must be 2 or 3, got {spec.torus_dims!r}")
    if spec.ici_links != 2 * spec.torus_dims:
        raise ValueError(f"{who}: field 'ici_links' must be 2 per torus axis ({2 * spec.torus_dims})")


# No TPU GEMM or HBM-bound measurement exists in the validation data (gap 1). Assumed:
# aligned matmuls reach 0.85 of peak (whole training steps reach 0.70 MFU on v5p in
# cases.csv, so matmuls alone run above that) and streaming fusions 0.85 of peak HBM
# bandwidth (H100 and H200 measure 0.87-0.89 in microbench.csv).
_GEMM_EFF = 0.85
_STREAM_FRACTION = 0.85

TPU_V4 = TPUSpec(
    name="tpu-v4",
    peak_bf16_tflops=275.0,  # Source: hw_specs.csv Google TPU v4
    peak_fp8_tflops=None,  # Source: hw_specs.csv ("no fp8")
    peak_fp32_tflops=275.0 / 3,  # f32 matmul as 3 bf16 passes (XLA default precision for f32 dots: bf16_3x)
    peak_int8_tops=275.0,  # Source: hw_specs.csv notes ("int8 275 TOPS")
    hbm_GB=32.0,  # Source: hw_specs.csv
    hbm_GBps=1200.0,  # Source: hw_specs.csv
    hbm_stream_fraction=_STREAM_FRACTION,
    mxu_dim=128,  # Source: scaling-book tpus.md (128 x 128 MXUs on v4/v5)
    gemm_eff=_GEMM_EFF,
    ici_link_GBps=45.0,  # Source: scaling-book tpus.md (4.5e10 B/s one way per link)
    ici_links=6,  # Source: hw_specs.csv (3D torus, 6 links per chip)
    ici_chip_Gbps=2160.0,  # Source: hw_specs.csv
    torus_dims=3,  # Source: hw_specs.csv
    pod_chips=4096,  # Source: hw_specs.csv (16 x 16 x 16)
    wrap_multiple=4,  # Source: hw_specs.csv (wraparound on dims that are multiples of 4)
    chips_per_host=4,  # Source: hw_specs.csv
    dcn_GBps=50.0 / 8,  # Source: hw_specs.csv (approximate: scaling-book ~2.5e10 B/s per 4-chip host)
    source=f"https://docs.cloud.google.com/tpu/docs/v4 ; {_SCALING_BOOK} ; https://glennklockwood.com/garden/processors/TPUv4",
)

TPU_V5E = TPUSpec(
    name="tpu-v5e",
    peak_bf16_tflops=197.0,  # Source: hw_specs.csv Google TPU v5e
    peak_fp8_tflops=None,  # Source: hw_specs.csv (int8 only)
    peak_fp32_tflops=197.0 / 3,
    peak_int8_tops=393.0,  # Source: hw_specs.csv notes; docs.cloud.google.com/tpu/docs/v5e ("Int8 393 TOPs")
    hbm_GB=16.0,  # Source: hw_specs.csv
    hbm_GBps=819.0,  # Source: hw_specs.csv
    hbm_stream_fraction=_STREAM_FRACTION,
    mxu_dim=128,  # Source: scaling-book tpus.md
    gemm_eff=_GEMM_EFF,
    ici_link_GBps=45.0,  # Source: scaling-book tpus.md
    ici_links=4,  # Source: hw_specs.csv (2D torus, 4 ICI ports per chip)
    ici_chip_Gbps=1600.0,  # Source: hw_specs.csv
    torus_dims=2,  # Source: hw_specs.csv
    pod_chips=256,  # Source: hw_specs.csv (16 x 16)
    wrap_multiple=16,  # Source: hw_specs.csv (wraparound only on full 16-chip axes)
    chips_per_host=8,  # Source: hw_specs.csv (4 x 2 per host)
    dcn_GBps=25.0 / 8,  # Source: hw_specs.csv (2 x 100 Gb/s per 8-chip host)
    source=f"https://docs.cloud.google.com/tpu/docs/v5e ; https://docs.cloud.google.com/tpu/docs/v6e ; {_SCALING_BOOK}",
)

TPU_V5P = TPUSpec(
    name="tpu-v5p",
    peak_bf16_tflops=459.0,  # Source: hw_specs.csv Google TPU v5p
    peak_fp8_tflops=459.0,  # Source: hw_specs.csv (docs list FP8 = 459, no speed-up)
    peak_fp32_tflops=459.0 / 3,
    peak_int8_tops=918.0,  # Source: hw_specs.csv notes ("int8 918 TOPS")
    hbm_GB=95.0,  # Source: hw_specs.csv
    hbm_GBps=2765.0,  # Source: hw_specs.csv
    hbm_stream_fraction=_STREAM_FRACTION,
    mxu_dim=128,  # Source: scaling-book tpus.md
    gemm_eff=_GEMM_EFF,
    ici_link_GBps=90.0,  # Source: scaling-book tpus.md (9e10 B/s one way per link)
    ici_links=6,  # Source: hw_specs.csv
    ici_chip_Gbps=4800.0,  # Source: hw_specs.csv
    torus_dims=3,  # Source: hw_specs.csv
    pod_chips=6144,  # Source: hw_specs.csv (largest single slice 16 x 16 x 24)
    wrap_multiple=4,  # Source: hw_specs.csv (4 x 4 x 4 cubes joined by optical switches)
    chips_per_host=4,  # Source: hw_specs.csv
    dcn_GBps=50.0 / 8,  # Source: hw_specs.csv (DCN 50 Gb/s per chip)
    source="https://docs.cloud.google.com/tpu/docs/v5p ; https://cloud.google.com/tpu/docs/v5p-training ; "
    f"{_SCALING_BOOK}",
)

TPU_V6E = TPUSpec(
    name="tpu-v6e",
    peak_bf16_tflops=918.0,  # Source: hw_specs.csv Google TPU v6e (Trillium)
    peak_fp8_tflops=None,  # Source: hw_specs.csv (fp8 not listed in Google docs)
    peak_fp32_tflops=918.0 / 3,
    peak_int8_tops=1836.0,  # Source: hw_specs.csv notes ("int8 1836 TOPS")
    hbm_GB=32.0,  # Source: hw_specs.csv
    hbm_GBps=1600.0,  # Source: hw_specs.csv
    hbm_stream_fraction=_STREAM_FRACTION,
    mxu_dim=256,  # Source: hw_specs.csv (2 MXUs of 256 x 256)
    gemm_eff=_GEMM_EFF,
    ici_link_GBps=90.0,  # Source: scaling-book tpus.md
    ici_links=4,  # Source: hw_specs.csv
    ici_chip_Gbps=3200.0,  # Source: hw_specs.csv
    torus_dims=2,  # Source: hw_specs.csv
    pod_chips=256,  # Source: hw_specs.csv (16 x 16)
    wrap_multiple=16,  # Source: hw_specs.csv
    chips_per_host=8,  # Source: hw_specs.csv
    dcn_GBps=100.0 / 8,  # Source: hw_specs.csv (4 x 200 Gb/s per 8-chip host)
    source=f"https://docs.cloud.google.com/tpu/docs/v6e ; https://cloud.google.com/tpu/docs/v6e ; {_SCALING_BOOK} ; "
    "https://github.com/AI-Hypercomputer/maxtext/blob/main/docs/reference/performance_metrics.md",
)

TPUS: dict[str, TPUSpec] = {t.name: t for t in (TPU_V4, TPU_V5E, TPU_V5P, TPU_V6E)}


# ---- compute ---------------------------------------------------------------------------


def _itemsize(dtype: str) -> int:
    return {"fp8": 1, "int8": 1, "bf16": 2, "fp16": 2, "fp32": 4, "tf32": 4}.get(dtype, 2)


def _pad(x: int, to: int) -> int:
    return -(-x // to) * to


@functools.lru_cache(maxsize=65536)
def matmul_time_s(chip: TPUSpec, m: int, n: int, k: int, batch: int = 1, dtype: str = "bf16") -> float:
    """Padded MXU work at the chip's matmul rate, or operand traffic, whichever is longer."""
    if min(m, n, k, batch) <= 0:
        raise ValueError(f"matmul dims must be positive, got m={m} n={n} k={k} batch={batch}")
    work = 2.0 * batch * _pad(m, SUBLANES) * _pad(n, chip.mxu_dim) * _pad(k, chip.mxu_dim)
    compute_s = work / (chip.peak_tflops(dtype) * 1e12 * chip.gemm_eff)
    traffic = batch * (m * k + k * n + m * n) * _itemsize(dtype)
    return max(compute_s, traffic / (chip.hbm_GBps * 1e9 * chip.hbm_stream_fraction)) + FUSION_OVERHEAD_US * 1e-6


def memory_bound_time_s(chip: TPUSpec, nbytes: int) -> float:
    if nbytes < 0:
        raise ValueError(f"byte count must be non-negative, got {nbytes}")
    return nbytes / (chip.hbm_GBps * 1e9 * chip.hbm_stream_fraction) + FUSION_OVERHEAD_US * 1e-6


#: Splash attention's query and key block (MaxText ``sa_block_q`` / ``sa_block_kv`` and the backward's
#: ``sa_block_q_dkv`` ... ``sa_block_kv_dq``, all 512 by default: src/maxtext/configs/base.yml lines 1159-1166,
#: commit e591f30). The mask is costed at this granularity: a block the mask leaves empty is skipped, any
#: other is computed whole (see :func:`attention_keep`). A recipe that sets its own sizes reaches the cost through
#: :attr:`echosim.ir.ops.AttentionAttrs.blocks` (:func:`splash_blocks`).
SPLASH_BLOCK = 512


def splash_blocks(a: AttentionAttrs) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """The (q, kv) block of splash attention's forward, dkv and dq kernels: the run's sizes
    (``AttentionAttrs.blocks``, MaxText's ``sa_block_*`` order) or :data:`SPLASH_BLOCK` each. The kernel grids
    over these blocks (``BlockSizes(block_q, block_kv, block_q_dkv, block_kv_dkv, block_q_dq, block_kv_dq)``,
    jax/experimental/pallas/ops/tpu/splash_attention/splash_attention_kernel.py, jax commit cec06d1), so they
    fix which blocks the causal mask leaves out and how often k and v are read."""
    b = a.blocks or (SPLASH_BLOCK,) * 6
    return (b[0], b[1]), (b[2], b[3]), (b[4], b[5])


def attention_keep(a: AttentionAttrs, block_q: int = SPLASH_BLOCK, block_kv: int = SPLASH_BLOCK) -> float:
    """Share of the score matrix splash attention computes: the ``block_q`` x ``block_kv`` blocks the causal
    mask (within the sliding window, if any) touches, each computed whole.

    The kernel runs a grid step only for a (q block, kv block) whose ``block_mask`` entry is non-zero and
    then computes every ``bkv_compute`` slice of the kv block, masking the partial ones (jax commit cec06d1,
    jax/experimental/pallas/ops/tpu/splash_attention/splash_attention_kernel.py: ``_next_nonzero`` gives
    ``should_run``, ``flash_attention_kernel`` loops ``num_iters = bkv // bkv_compute`` unconditionally). A
    causal mask over n square blocks per side computes n(n+1)/2 of them, not n^2/2: 0.625 at 2048 tokens
    in 512-blocks, 1.0 in one 2048-block.
    """
    from echosim.backends.compute import band_kv_blocks

    if not a.causal:
        return 1.0
    blocks = band_kv_blocks(a.q_len, a.kv_len, block_q, block_kv, a.window or None)
    return min(1.0, sum(blocks) * block_q * block_kv / (a.q_len * a.kv_len))


#: Block products of splash attention's backward, per pair of forward products (q k^T and p v). MaxText's
#: default, ``sa_use_fused_bwd_kernel: False`` (src/maxtext/configs/base.yml line 1167, commit e591f30; the
#: same at tags tpu-recipes-v0.1.2 to v0.1.5, and the hard-coded ``block_q_dq`` of early 2024), runs two
#: kernels: dkv recomputes q k^T and forms dv = p^T do, dp = do v^T, dk = ds^T q (4 products); dq recomputes
#: q k^T and dp and forms dq = ds k (3 products): 7 in all (jax.experimental.pallas.ops.tpu.splash_attention,
#: ``_flash_attention_dkv_kernel`` and ``_flash_attention_dq_kernel``). The fused kernel (``kernel ==
#: "splash-fused"``, a recipe's ``sa_use_fused_bwd_kernel: True``) forms dq inside the dkv kernel: 5.
SPLASH_BWD_PRODUCTS = 7
SPLASH_DKV_PRODUCTS = 4  # of the 7: q k^T, p^T do, do v^T, ds^T q in the dkv kernel; the dq kernel runs the rest
SPLASH_FUSED_BWD_PRODUCTS = 5
#: ``AttentionAttrs.kernel`` of splash attention with its fused backward kernel (:mod:`echosim.frameworks`).
SPLASH_FUSED = "splash-fused"


def splash_backward_factor(a: AttentionAttrs) -> float:
    """Backward time over forward time of splash attention at one block size: its backward block products over
    the forward's 2."""
    return (SPLASH_FUSED_BWD_PRODUCTS if a.kernel == SPLASH_FUSED else SPLASH_BWD_PRODUCTS) / 2


def splash_backward_s(chip: TPUSpec, a: AttentionAttrs, dtype: str) -> float:
    """Splash attention's backward: each kernel's block products at its own blocks (:func:`splash_blocks`). The
    dkv kernel runs 4 of the 7 products on the dkv blocks and the dq kernel 3 on the dq blocks; the fused kernel
    all 5 on the dkv blocks (:data:`SPLASH_BWD_PRODUCTS`). With one block size throughout this is
    :func:`splash_backward_factor` times the forward."""
    _, dkv, dq = splash_blocks(a)
    if a.kernel == SPLASH_FUSED:
        return splash_forward_s(chip, a, dtype, dkv) * SPLASH_FUSED_BWD_PRODUCTS / 2
    dq_products = SPLASH_BWD_PRODUCTS - SPLASH_DKV_PRODUCTS
    return (splash_forward_s(chip, a, dtype, dkv) * SPLASH_DKV_PRODUCTS + splash_forward_s(chip, a, dtype, dq)
            * dq_products) / 2  # fmt: skip


def attention_time_s(chip: TPUSpec, a: AttentionAttrs, dtype: str, backward: bool = False) -> float:
    """Splash/flash attention on the MXU: the two products per block, padded, masked blocks skipped; the
    backward runs the block products of MaxText's kernel choice at its kernels' blocks (:func:`splash_backward_s`).

    Materialised (``flash`` off) attention computes and stores every score, masked or not; XLA's autodiff
    of it runs the textbook 5 products (2.5 x the forward)."""
    if not a.flash:  # materialised scores: write, softmax read + write, read
        qk = matmul_time_s(chip, a.q_len, a.kv_len, a.head_dim, a.batch * a.heads, dtype)
        pv = matmul_time_s(chip, a.q_len, a.head_dim, a.kv_len, a.batch * a.heads, dtype)
        score_bytes = a.batch * a.heads * a.q_len * a.kv_len * _itemsize(dtype)
        passes = 4 if not backward else 6
        return (qk + pv) * (2.5 if backward else 1.0) + memory_bound_time_s(chip, passes * score_bytes)
    return splash_backward_s(chip, a, dtype) if backward else splash_forward_s(chip, a, dtype)


def splash_forward_s(chip: TPUSpec, a: AttentionAttrs, dtype: str, blocks: tuple[int, int] | None = None) -> float:
    """Splash attention's forward: its two block products (q k^T, p v) on the MXU, padded as any matmul and
    scaled by the blocks the mask keeps, bounded below by the kernel's own HBM traffic.

    The scores never reach HBM: each q block stays in VMEM while the kernel streams the k and v blocks past it
    and writes only the output (jax/experimental/pallas/ops/tpu/splash_attention/splash_attention_kernel.py
    ``flash_attention_kernel``, jax commit cec06d1: the running max, sum and output live in VMEM scratch refs).
    The traffic is q and o once and k, v once per q block (``block_q`` rows), not the q_len x kv_len
    score matrix a plain matmul of the same shape writes. ``blocks``: the (q, kv) block of the kernel
    (default: the forward's, :func:`splash_blocks`); the backward's kernels cost their products at theirs.
    """
    block_q, block_kv = blocks or splash_blocks(a)[0]
    size = _itemsize(dtype)
    keep = attention_keep(a, block_q, block_kv)
    padded = _pad(a.q_len, SUBLANES) * _pad(a.kv_len, chip.mxu_dim) * _pad(a.head_dim, chip.mxu_dim)
    work = 2.0 * a.batch * a.heads * padded  # one product; q k^T and p v pad the same way
    compute_s = 2 * work * keep / (chip.peak_tflops(dtype) * 1e12 * chip.gemm_eff)
    q_blocks = -(-a.q_len // block_q)
    traffic = (
        a.batch * size * a.head_dim * (2 * a.heads * a.q_len + 2 * a.kv_heads * a.kv_len * max(1.0, q_blocks * keep))
    )
    return max(compute_s, traffic / (chip.hbm_GBps * 1e9 * chip.hbm_stream_fraction)) + 2 * FUSION_OVERHEAD_US * 1e-6


# ---- collectives -----------------------------------------------------------------------


def torus_block(chip: TPUSpec, chips: int) -> tuple[int, ...]:
    """The most cube-like block of ``chips`` chips on the chip's torus (axes, longest first)."""
    if chips < 1:
        raise ValueError(f"group size must be positive, got {chips}")
    dims = [1] * chip.torus_dims
    rest = chips
    while rest % 2 == 0:
        dims[dims.index(min(dims))] *= 2
        rest //= 2
    if rest > 1:  # odd factor: put it on the shortest axis
        dims[dims.index(min(dims))] *= rest
    return tuple(sorted(dims, reverse=True))


@dataclass(frozen=True, slots=True)
class IciCost:
    """How one collective crosses the torus, for reports and tests."""

    axes: tuple[int, ...]
    wraps: tuple[bool, ...]
    bandwidth_GBps: float  # aggregate one-way bandwidth the collective's rings use per chip
    latency_us: float
    time_us: float


def ici_all_gather_us(chip: TPUSpec, nbytes: float, chips: int) -> IciCost:
    """All-gather (or reduce-scatter) of an ``nbytes`` buffer over ``chips`` chips of one slice.

    Each axis of length L moves (L-1)/L of the data it sees; the axes run one after the
    other on shrinking (reduce-scatter) or growing (all-gather) buffers, but XLA splits
    the buffer so every axis is busy at once: the time is the total bytes over the sum
    of the axes' ring bandwidths, which is the scaling-book's multi-axis rule.
    """
    axes = tuple(a for a in torus_block(chip, chips) if a > 1)
    wraps = tuple(a % chip.wrap_multiple == 0 and a > 2 for a in axes)
    # A ring that wraps uses both directions of its links; a line uses one direction per half.
    bw = sum(chip.ici_link_GBps * (2 if w else 1) for w in wraps)
    hops = sum((a // 2 if w else a - 1) for a, w in zip(axes, wraps, strict=True))
    latency = COLLECTIVE_START_US + hops * ICI_HOP_US
    moved = nbytes * (chips - 1) / chips if chips > 1 else 0.0
    time = latency + (moved / (bw * 1e3) if bw else 0.0)
    return IciCost(axes, wraps, bw, latency, time)


def collective_time_s(chip: TPUSpec, kind: OpKind, nbytes: int, p: Placement) -> float:
    """Seconds for one collective of ``nbytes`` (nccl-tests buffer convention) on ICI and DCN."""
    if nbytes < 0:
        raise ValueError(f"byte count must be non-negative, got {nbytes}")
    check_placement(chip, p)
    if p.size == 1 or nbytes == 0:
        return 0.0
    ici = p.per_node
    if kind in (OpKind.SEND, OpKind.RECV):
        if p.nodes > 1:
            return (DCN_HOP_US + COLLECTIVE_START_US) * 1e-6 + nbytes / (chip.dcn_GBps * 1e9)
        return (COLLECTIVE_START_US + ICI_HOP_US) * 1e-6 + nbytes / (chip.ici_link_GBps * 1e9)
    if kind not in (
        OpKind.ALL_REDUCE,
        OpKind.ALL_GATHER,
        OpKind.REDUCE_SCATTER,
        OpKind.ALL_TO_ALL,
        OpKind.BROADCAST,
    ):
        raise ValueError(f"{kind.value} is not a collective")
    passes = 2 if kind is OpKind.ALL_REDUCE else 1
    us = 0.0
    if ici > 1:
        one = ici_all_gather_us(chip, nbytes, ici)
        transfer = one.time_us - one.latency_us
        if kind is OpKind.ALL_TO_ALL:
            # Each chip's data crosses on average a quarter of each wrapped axis (half on a
            # line) rather than streaming around a ring: bisection-bound, scaling-book.
            transfer *= sum(a / 4 if w else a / 2 for a, w in zip(one.axes, one.wraps, strict=True)) / max(
                1, len(one.axes)
            )
        us += passes * (one.latency_us + transfer)
    if p.nodes > 1:
        # Across slices every chip exchanges its 1/ici share with its peers in the other slices.
        shard = nbytes / ici
        steps = 2 * (p.nodes - 1) if kind is OpKind.ALL_REDUCE else p.nodes - 1
        us += COLLECTIVE_START_US + steps * DCN_HOP_US + shard * steps / p.nodes / (chip.dcn_GBps * 1e3)
    return us * 1e-6


def check_placement(chip: TPUSpec, p: Placement) -> None:
    if p.size < 1 or p.nodes < 1 or p.per_node < 1 or p.concurrent_per_node < 1:
        raise ValueError(f"placement fields must be >= 1, got {p}")
    if p.size != p.nodes * p.per_node:
        raise ValueError(f"placement size {p.size} != slices {p.nodes} x chips per slice {p.per_node}")
    if p.per_node * p.concurrent_per_node > chip.pod_chips:
        raise ValueError(
            f"group of {p.per_node} x {p.concurrent_per_node} chips does not fit in one {chip.name} slice "
            f"(at most {chip.pod_chips} chips); span slices over DCN instead"
        )


# ---- the backend -----------------------------------------------------------------------


def default_overlap(chip: TPUSpec) -> OverlapModel:
    """ICI collectives run on their own DMA engines, not on the TensorCore.

    Overlapped compute loses only the HBM bandwidth the DMAs take: at most every ICI
    link's traffic in and out of HBM, ``2 x links x link_GBps`` of the chip's HBM
    bandwidth (v5e: 360 of 819 GB/s when every link is busy, but collectives rarely
    keep all links busy, so half that), which slows memory-bound fusions; MXU work is
    unaffected.
    """
    share = min(0.5, chip.ici_links * chip.ici_link_GBps / (chip.hbm_GBps * chip.hbm_stream_fraction) / 2)
    return OverlapModel(compute_slowdown=1.0, comm_slowdown=1.0, memory_bound_slowdown=1.0 / (1.0 - share))


#: Chips without fp8 of any kind (hw_specs.csv: TPU v4 "no fp8", TPU v5e "int8 only").
NO_FP8 = frozenset({"tpu-v4", "tpu-v5e"})


class TPUBackend(KernelBackend):
    """A TPU chip in an ICI slice; ``devices_per_node`` of a cluster is the slice size."""

    DTYPES = (*KernelBackend.DTYPES, "int8")
    #: XLA assigns every buffer of the step at compile time (buffer assignment over the scheduled HLO),
    #: so there is no caching allocator to fragment and no NCCL buffers: the memory report leaves both out.
    static_buffers = True

    def __init__(self, chip: TPUSpec, overlap: OverlapModel | None = None) -> None:
        self.chip = chip
        self.name = chip.name
        self._overlap = overlap if overlap is not None else default_overlap(chip)

    def __repr__(self) -> str:
        return f"TPUBackend({self.chip.name!r})"

    def node_devices(self, devices: int) -> int:
        """A job's node is its ICI slice: the whole job up to the largest slice, else equal slices over DCN."""
        return devices if devices <= self.chip.pod_chips else fill_domains(devices, self.chip.pod_chips)

    def matmul_cost_s(self, a: MatmulAttrs, dtype: str) -> float:
        return matmul_time_s(self.chip, a.m, a.n, a.k, a.batch, dtype)

    def attention_cost_s(self, a: AttentionAttrs, dtype: str, backward: bool) -> float:
        return attention_time_s(self.chip, a, dtype, backward)

    def memory_cost_s(self, node: Node, io_bytes: int) -> float:
        return memory_bound_time_s(self.chip, io_bytes)

    def collective_time_s(self, kind: OpKind, nbytes: int, placement: Placement) -> float:
        return collective_time_s(self.chip, kind, nbytes, placement)

    def memory_bytes(self) -> int:
        return int(self.chip.hbm_GB * 2**30)

    def peak_bandwidth_Bps(self, path: str) -> float:
        """Datasheet bytes/s per chip: HBM (``memory``), or every ICI link one way plus the DCN share (``links``)."""
        if path == "memory":
            return self.chip.hbm_GBps * 1e9
        return (self.chip.ici_link_GBps * self.chip.ici_links + self.chip.dcn_GBps) * 1e9

    def peak_flops(self, dtype: str) -> float:
        return self.chip.peak_tflops(dtype) * 1e12

    def supports_dtype(self, dtype: str) -> bool:
        """fp8 is refused on the chips hw_specs.csv says have none (v4: "no fp8"; v5e: "int8 only").

        v6e lists no fp8 peak but trains fp8-quantized matmuls at the bf16 rate. Every generation has
        int8 MXUs (``peak_int8_tops``), which MaxText's ``quantization: int8`` uses.
        """
        if dtype == "int8":
            return True
        return dtype != "fp8" or self.chip.name not in NO_FP8

    def describe(self) -> dict[str, object]:
        from dataclasses import asdict

        d = asdict(self.chip)
        d.update(kind="tpu", devices_per_node=self.chip.pod_chips, overlap=asdict(self._overlap))
        d["assumed"] = "gemm_eff, hbm_stream_fraction: no TPU microbenchmarks in the validation data (gap 1)"
        return d
