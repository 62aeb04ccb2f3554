"""GPU devices as data: peaks, memory, links and the few measured efficiencies the models need.

Every number carries a ``# Source:``. Peaks and links come from
``../shared/validation/hw_specs.csv`` (which cites the vendor datasheets); achievable
fractions come from ``../shared/validation/microbench.csv`` (measured STREAM, GEMM,
FlashAttention and nccl-tests plateaus). Where a device has no measurement the value is
carried over from the nearest measured part and the comment says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from echosim.backends.networks import NETWORKS, TCPXO

ARCHES = ("ampere", "hopper", "blackwell")

# URLs behind the hw_specs.csv rows, cited per device below.
_A100 = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
_A100_AZ = "https://github.com/Azure/AI-benchmarking-guide/blob/main/Azure_Results/ND_A100_v4_results.md"
_H100 = "https://www.nvidia.com/en-us/data-center/h100/"
_H100_AZ = "https://github.com/Azure/AI-benchmarking-guide/blob/main/Azure_Results/ND_H100_v5_results.md"
_H200_AZ = "https://github.com/Azure/AI-benchmarking-guide/blob/main/Azure_Results/ND_H200_v5_results.md"
_MLENG = "https://github.com/stas00/ml-engineering/blob/master/compute/accelerator/README.md"
_NCCL_TOPO = "https://github.com/NVIDIA/nccl/blob/master/src/graph/topo.h"
_DGXA100 = "https://docs.nvidia.com/dgx/dgxa100-user-guide/introduction-to-dgxa100.html"
_DGXH100 = "https://docs.nvidia.com/dgx/dgxh100-user-guide/introduction-to-dgxh100.html"
_H200_MLPERF = (
    "https://github.com/mlcommons/inference_results_v4.1/blob/main/closed/NVIDIA/systems/H200-SXM-141GBx8_TRT_MaxQ.json"
)
_GB200_NVL72 = "https://www.nvidia.com/en-us/data-center/gb200-nvl72/"
_H800 = (
    "https://www.philisun.com/technical-analysis/"
    "nvidia-h800-vs-h100-a-technical-deep-dive-into-politically-defined-ai-chips/"
)


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """One GPU model in an 8-GPU NVLink node with one NIC per GPU.

    Peaks are dense (no 2:4 sparsity). ``peak_fp8_tflops`` is ``None`` on parts without
    FP8 tensor cores; FP8 work then runs at the 16-bit rate. Efficiencies are fractions of
    the matching peak measured on the real part with a large, well-shaped problem.
    """

    name: str
    arch: str
    sm_count: int
    peak_bf16_tflops: float
    peak_fp16_tflops: float
    peak_fp8_tflops: float | None
    peak_tf32_tflops: float
    peak_fp32_tflops: float
    hbm_GB: float
    hbm_GBps: float
    hbm_stream_GBps: float  # measured achievable bandwidth of streaming kernels
    # gemm_eff_*: one rule for every device: the highest TFLOP/s the device's GEMM-library rows of
    # microbench.csv measured in that dtype (mamf-finder's best shape, cuBLASLt sweeps), over the dense
    # peak; a part without a row of its own takes its die-mate's. XLA's perf table is not a source: it
    # is the check of the shape model, and its fp8 maxima sit at 95% of the dense peak next to rows
    # above it (flagged SUSPECT). tests/test_backends_devices.py recomputes every value from the file.
    # The model runs its largest CTA tile at this fraction, so it reproduces the anchor on shapes that
    # fill whole waves, less its per-wave and launch times (tests/test_gemm_anchor.py, closed form); a MAMF
    # anchor, the best of a shape search, is checked as the model's best over that search.
    gemm_eff_16bit: float  # large-GEMM TFLOP/s over peak (bf16/fp16)
    gemm_eff_fp8: float | None
    flash_fwd_eff: float  # measured flash-attention forward TFLOP/s over 16-bit peak ...
    flash_fwd_shape: tuple[int, int, int, int]  # ... at this non-causal (batch, heads, seq, head_dim)
    nvlink_GBps: float  # per direction per GPU
    nvlink_links: int
    nccl_nvlink_GBps: float  # bandwidth NCCL's topology model assigns one NVLink (topo.h)
    nic_GBps: float  # per direction per GPU
    devices_per_node: int
    kernel_overhead_us: float  # launch + ramp-down gap per kernel in a busy stream
    nccl_launch_us: float  # host time one thread takes to launch one NCCL collective kernel
    source: str
    # Block-scaled formats the tensor cores take natively (Blackwell's tcgen05 MMA: MXFP8 and NVFP4);
    # a run in a format the part lacks is refused, never costed at another rate.
    block_scaled_formats: tuple[str, ...] = ()
    peak_fp4_tflops: float | None = None  # dense NVFP4 peak where the part has FP4 tensor cores
    gemm_eff_fp4: float | None = None  # large-GEMM NVFP4 TFLOP/s over peak_fp4_tflops
    # The GEMM rate the part holds in a sustained run (its power-limited clock): the highest TFLOP/s of its
    # long-warmup cuBLASLt rows at 8192^3 and larger (Azure's sweep: 10,000 warmup iterations), which caps
    # every GEMM of that dtype. gemm_eff_* come from short runs (MAMF: 50 warmup + 100 iterations per
    # shape). None: no sustained measurement; the short-run rate stands.
    sustained_16bit_tflops: float | None = None
    sustained_fp8_tflops: float | None = None
    # FlashAttention-2's forward (sm80 kernels: PyTorch SDPA's flash backend, flash-attn 2) where the part's
    # best flash kernel is another one (FA3, cuDNN); None: flash_fwd_eff is FA2's already (Ampere).
    fa2_fwd_eff: float | None = None  # TFLOP/s over 16-bit peak ...
    fa2_fwd_shape: tuple[int, int, int, int] = (2, 16, 8192, 128)  # ... at this non-causal (b, heads, seq, d)
    # cuDNN's fused attention (Transformer Engine's FusedAttention, cuDNN SDPA) where the part's flash figure is
    # another kernel (Hopper: FA3); None: no measurement, or flash_fwd_eff is cuDNN's already (Blackwell).
    cudnn_fwd_eff: float | None = None  # forward TFLOP/s over 16-bit peak ...
    cudnn_fwd_shape: tuple[int, int, int, int] = (1, 16, 16384, 128)  # ... at this non-causal (b, heads, seq, d)
    cudnn_bwd_over_fwd: float | None = None  # its backward TFLOP/s over its forward, measured at the same shape
    # The flash figure's own measured backward / forward rate; None: not measured with it (compute.FLASH_BWD_RATE)
    flash_bwd_over_fwd: float | None = None
    # Per-SM, per-clock throughputs of the units a flash-attention tile shares (FlashAttention-4 paper, sec. 2.2):
    # dense 16-bit tensor-core FLOPs, MUFU exponentials, shared-memory read bytes. They price the roofline of
    # each flash pass (compute.flash_pass_fraction); None: the part's passes are taken as tensor-core bound.
    tensor_flops_per_clk_sm: int | None = None
    mufu_ex2_per_clk_sm: int | None = None
    smem_bytes_per_clk_sm: int | None = None
    # CPU vendor of the node's host ("intel", "amd", "arm"; "" unknown). NCCL's tuner reads it on
    # multi-node communicators (tuning.cc, getNetOverhead and llMaxBws): only "amd" changes the model.
    host_cpu_vendor: str = ""
    # GPUs one host (one OS instance, one hostHash to NCCL) holds where an NVLink domain spans several
    # hosts (GB200/GB300 NVL72: a compute tray of 4 GPUs and 2 Grace CPUs); None: one host per node.
    gpus_per_host: int | None = None
    # The scale-out network its NICs sit on (networks.NETWORKS): "infiniband" (NCCL's defaults) or a cloud's
    # own, which changes what NCCL's tuner is told and the NCCL settings the deployment runs under.
    network: str = "infiniband"
    # The host side, which an offloaded optimizer (Plan.offload_optimizer) runs on and offloaded weight shards
    # (Plan.offload_params) live on: one GPU's copy rate to and from its host's memory per direction (pinned
    # copies, nvbandwidth), and the sustained DRAM bandwidth of one host, which its GPUs' optimizer processes
    # share. None: no figure, and no offload on this part.
    host_link_GBps: float | None = None
    host_memory_GBps: float | None = None
    # One host's system memory as its reference system's documents state it (decimal GB): what the offloaded
    # state of its GPUs must fit in. None: no figure, and no check.
    host_memory_GB: float | None = None

    def __post_init__(self) -> None:
        validate(self)

    @property
    def nvlink_busbw_GBps(self) -> float:
        """Ring bus bandwidth in one node as NCCL models it: links x per-link bandwidth."""
        return self.nvlink_links * self.nccl_nvlink_GBps

    def peak_tflops(self, dtype: str) -> float:
        """Dense tensor-core peak for a value dtype; fp32 means TF32 tensor cores."""
        return {
            "bf16": self.peak_bf16_tflops,
            "fp16": self.peak_fp16_tflops,
            "fp8": self.peak_fp8_tflops or self.peak_bf16_tflops,
            "mxfp8": self.peak_fp8_tflops or self.peak_bf16_tflops,
            "nvfp4": self.peak_fp4_tflops or self.peak_bf16_tflops,
            "tf32": self.peak_tf32_tflops,
            "fp32": self.peak_tf32_tflops,
            "fp32-simt": self.peak_fp32_tflops,
        }.get(dtype, self.peak_bf16_tflops)


_OPTIONAL = {
    "gpus_per_host",
    "host_link_GBps",
    "host_memory_GBps",
    "host_memory_GB",
    "peak_fp8_tflops",
    "gemm_eff_fp8",
    "peak_fp4_tflops",
    "gemm_eff_fp4",
    "fa2_fwd_eff",
    "cudnn_fwd_eff",
    "cudnn_bwd_over_fwd",
    "flash_bwd_over_fwd",
    "tensor_flops_per_clk_sm",
    "mufu_ex2_per_clk_sm",
    "smem_bytes_per_clk_sm",
    "sustained_16bit_tflops",
    "sustained_fp8_tflops",
}
_FRACTIONS = {"gemm_eff_16bit", "gemm_eff_fp8", "gemm_eff_fp4", "flash_fwd_eff", "fa2_fwd_eff", "cudnn_fwd_eff"}
BLOCK_SCALED_FORMATS = ("mxfp8", "nvfp4")
HOST_CPU_VENDORS = ("", "intel", "amd", "arm")


def validate(spec: DeviceSpec) -> None:
    """Raise ``ValueError`` naming the device and field of any missing or impossible value."""
    who = f"device {spec.name or '<unnamed>'!r}"
    if not spec.name:
        raise ValueError(f"{who}: field 'name' is missing")
    if spec.arch not in ARCHES:
        raise ValueError(f"{who}: field 'arch' is {spec.arch!r}, expected one of {', '.join(ARCHES)}")
    if not spec.source.strip():
        raise ValueError(f"{who}: field 'source' is missing (every number needs a source)")
    for f in fields(spec):
        if f.name in ("name", "arch", "source"):
            continue
        if f.name == "host_cpu_vendor":
            if spec.host_cpu_vendor not in HOST_CPU_VENDORS:
                raise ValueError(
                    f"{who}: field 'host_cpu_vendor' is {spec.host_cpu_vendor!r}, expected one of "
                    f"{', '.join(repr(v) for v in HOST_CPU_VENDORS)}"
                )
            continue
        if f.name == "network":
            if spec.network not in NETWORKS:
                raise ValueError(f"{who}: field 'network' is {spec.network!r}, expected one of {', '.join(NETWORKS)}")
            line_Gbps = NETWORKS[spec.network].nic_Gbps
            if line_Gbps is not None and not math.isclose(spec.nic_GBps * 8, line_Gbps):
                raise ValueError(
                    f"{who}: 'nic_GBps' {spec.nic_GBps} is not the {spec.network} NIC's {line_Gbps:g} Gb/s"
                )
            continue
        if f.name == "block_scaled_formats":
            unknown = [x for x in spec.block_scaled_formats if x not in BLOCK_SCALED_FORMATS]
            if unknown:
                raise ValueError(f"{who}: field 'block_scaled_formats' names {unknown} (known: mxfp8, nvfp4)")
            continue
        if f.name in ("flash_fwd_shape", "fa2_fwd_shape", "cudnn_fwd_shape"):
            if len(value := getattr(spec, f.name)) != 4 or any(not isinstance(v, int) or v <= 0 for v in value):
                raise ValueError(f"{who}: field {f.name!r} must be 4 positive ints, got {value!r}")
            continue
        value = getattr(spec, f.name)
        if value is None:
            if f.name in _OPTIONAL:
                continue
            raise ValueError(f"{who}: field {f.name!r} is missing")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"{who}: field {f.name!r} must be a finite number, got {value!r}")
        if value <= 0:
            raise ValueError(f"{who}: field {f.name!r} must be positive, got {value!r}")
        if f.type == "int" and not isinstance(value, int):
            raise ValueError(f"{who}: field {f.name!r} must be an integer, got {value!r}")
        if f.name in _FRACTIONS and value > 1:
            raise ValueError(f"{who}: field {f.name!r} is a fraction of peak, got {value!r} > 1")
    if (spec.peak_fp8_tflops is None) != (spec.gemm_eff_fp8 is None):
        raise ValueError(f"{who}: fields 'peak_fp8_tflops' and 'gemm_eff_fp8' must be given together")
    if (spec.peak_fp4_tflops is None) != (spec.gemm_eff_fp4 is None):
        raise ValueError(f"{who}: fields 'peak_fp4_tflops' and 'gemm_eff_fp4' must be given together")
    if "nvfp4" in spec.block_scaled_formats and spec.peak_fp4_tflops is None:
        raise ValueError(f"{who}: runs nvfp4 ('block_scaled_formats') but has no 'peak_fp4_tflops'")
    if spec.hbm_stream_GBps > spec.hbm_GBps:
        raise ValueError(f"{who}: field 'hbm_stream_GBps' exceeds the peak 'hbm_GBps'")
    if spec.nvlink_busbw_GBps > spec.nvlink_GBps:
        raise ValueError(f"{who}: 'nvlink_links' x 'nccl_nvlink_GBps' exceeds the line rate 'nvlink_GBps'")
    if spec.gpus_per_host is not None and spec.devices_per_node % spec.gpus_per_host:
        raise ValueError(f"{who}: 'gpus_per_host' {spec.gpus_per_host} does not divide 'devices_per_node'")
    for name in ("kernel_overhead_us", "nccl_launch_us"):
        if getattr(spec, name) > 100:
            raise ValueError(f"{who}: field {name!r} is {getattr(spec, name)} µs; expected a few µs")


# Kernel overhead: a kernel in a busy stream costs its run time plus the launch/drain gap
# to the next one, a few µs on CUDA GPUs. Source: the smallest products in microbench.csv's
# XLA H100 GEMM table (256x256x256 and the like) take 5-6 µs end to end, ~1 µs of it the
# single wave of tiles; NVIDIA CUDA C++ Best Practices Guide (kernel launch overhead).
_KERNEL_OVERHEAD_US = 4.0

# The host an offloaded optimizer steps on (DeviceSpec.host_link_GBps, host_memory_GBps). A GPU's host link is
# PCIe (Gen4 x16 on A100, Gen5 x16 on Hopper and HGX Blackwell) or NVLink-C2C (Grace). Its rate per direction is
# nvbandwidth's pinned copy, the faster direction where the two differ: the link carries the same rate each way,
# so a slower direction is a limit of that host (Azure's ND A100 v4 reads 26.28 GB/s host to device but 6.27
# device to host). One GPU was measured alone; eight copying at once are taken to keep that rate each.
_HOST_LINK_A100_GBPS = 26.28  # Source: _A100_AZ, nvbandwidth host_to_device (microbench.csv)
_HOST_LINK_HOPPER_GBPS = 52.0  # Source: _H100_AZ nvbandwidth device_to_host 52 (host_to_device 51); _H200_AZ 52, 52
_HOST_LINK_GRACE_GBPS = 201.0  # Source: _GB200_AZ nvbandwidth host_to_device 201 (device_to_host 193)
# A host's DRAM sustains its channels x transfer rate x 8 B at the share STREAM reaches, assumed 0.8 as the CPU
# backends assume it (backends/cpu.py, stream_fraction). The one host measured, a GB200 tray's two Grace CPUs,
# sustains 0.745 of its peak (Azure ND GB200 v6 STREAM triad 763 GB/s; 2 x 511 GB/s LPDDR5X, the NVL72's
# 18.4 TB/s over its 36 Grace CPUs: https://www.nvidia.com/en-us/data-center/gb200-nvl72/).
_HOST_STREAM_FRACTION = 0.8
# DGX A100: 2x AMD EPYC 7742 (_DGXA100), 8 channels of DDR4-3200 each (AMD's EPYC 7742 specifications)
_HOST_MEMORY_EPYC7742_GBPS = 2 * 8 * 3.2 * 8 * _HOST_STREAM_FRACTION
# DGX H100 / ND H100 v5 / ND H200 v5: 2x Xeon Platinum 8480C, hw_specs.csv 0.307 TB/s per socket (8 ch DDR5-4800)
_HOST_MEMORY_XEON8480_GBPS = 2 * 307.2 * _HOST_STREAM_FRACTION
# DGX B200: 2x Xeon Platinum 8570 (DGX B200 datasheet), 8 channels of DDR5-5600 each (Intel's 8570 specifications)
_HOST_MEMORY_XEON8570_GBPS = 2 * 8 * 5.6 * 8 * _HOST_STREAM_FRACTION
_HOST_MEMORY_GRACE_GBPS = 763.0  # Source: microbench.csv, Azure ND GB200 v6 CPU STREAM triad (one 4-GPU host)

# NCCL launch: host time for one thread to launch one NCCL collective kernel (NCCL's enqueue plus
# cudaLaunchKernel), a property of the host CPU and driver, not of the GPU. A collective never
# takes less than its launches; nccl-tests -g N launches N per collective from one thread, so
# its smallest messages read it directly: the median of time / N over a node type's Azure
# all_reduce rows of 1-32 KiB (microbench.csv, AI-benchmarking-guide, 4 rows each), where NCCL's
# own GPU time (LL ring 15 µs, NVLS 25 µs) is below N launches. Larger messages are not used:
# H100's NVLS rows at 64-512 KiB sit at 42 µs where H200's stay at 31 µs (GPU time, not launch).
_NCCL_LAUNCH_A100_US = 5.35  # ND A100 v4, AMD EPYC 7V12 host, NCCL 2.18.5: 42.8 µs / 8

# Units a flash-attention tile shares, per SM per clock. FlashAttention-4 paper (arXiv:2603.05451, sec. 2.2,
# "throughput of several hardware components on B200 (and GB200)"): BF16 MMA 8192 FLOPs (2.25 PFLOP/s / 1850 MHz
# / 148 SMs), 4096 on Hopper; MUFU 16 exponentials, as on Hopper, 32 on B300 / GB300 (also NVIDIA, "Inside NVIDIA
# Blackwell Ultra" and "Making Softmax More Efficient with NVIDIA Blackwell Ultra": SFU throughput doubled);
# shared memory 128 bytes read, as on Hopper. A100: 1024 dense FP16 FMAs (2048 FLOPs), 16 SFU ops and 128 bytes of
# shared memory per SM per clock (NVIDIA A100 Tensor Core GPU Architecture whitepaper; REUSE_HALF in compute.py).
# cuDNN's fused attention on Hopper, the kernel Transformer Engine's DotProductAttention runs there: its backend
# selection drops FlashAttention "to give FusedAttention preference" on compute capability 9.0 whenever both
# can run (TE v1.2 to v2.18: pytorch/attention.py, from v2.3 attention/dot_product_attention/utils.py
# get_attention_backend). Measured with cudnn-frontend's benchmark (benchmark/benchmark_results.csv at commit
# de355c7, 2024-09-23, "benchmark numbers with cudnn 9.4.0"; H200 at the README's locked 1980 MHz and 700 W),
# bf16, non-causal, at FA3's anchor shape (1 x 16 heads x 16,384 x 128): forward 687.97 TFLOP/s, backward
# 546.53 (its 5 GEMMs counted). H100 and H800 are the same die (132 SMs, same clocks and peaks). The same
# benchmark measured 641.9 / 538.5 with cuDNN 9.1 (commit 505fcfe, 2024-05) and 702 / 612 with cuDNN 9.19
# at 64 query heads (results/h200_919_only_cudnn/llama3.1, 2026-02).
_CUDNN_HOPPER_FWD_TFLOPS = 687.97
_CUDNN_HOPPER_BWD_TFLOPS = 546.53
_CUDNN_HOPPER_SHAPE = (1, 16, 16384, 128)
_CUDNN_FE = "https://github.com/NVIDIA/cudnn-frontend/blob/de355c7/benchmark/benchmark_results.csv"
_SMEM_BYTES_PER_CLK_SM = 128
_MUFU_PER_CLK_SM = 16
_MUFU_PER_CLK_SM_ULTRA = 32

A100_80GB = DeviceSpec(
    name="a100-80gb",
    arch="ampere",
    sm_count=108,  # Source: _A100 datasheet (108 SMs)
    peak_bf16_tflops=312.0,  # Source: hw_specs.csv NVIDIA A100-SXM4-80GB (dense)
    peak_fp16_tflops=312.0,  # Source: hw_specs.csv
    peak_fp8_tflops=None,  # Source: hw_specs.csv "No FP8 support"
    peak_tf32_tflops=156.0,  # Source: hw_specs.csv
    peak_fp32_tflops=19.5,  # Source: hw_specs.csv
    hbm_GB=80.0,  # Source: hw_specs.csv
    hbm_GBps=2039.0,  # Source: hw_specs.csv (2.039 TB/s HBM2e)
    hbm_stream_GBps=1674.0,  # Source: microbench.csv, mean of 5 Azure STREAM kernels (1.61–1.75 TB/s)
    gemm_eff_16bit=271.2 / 312.0,  # Source: microbench.csv, MAMF A100 SXM bf16 best shape 271.2 TFLOP/s (86.9%)
    gemm_eff_fp8=None,
    flash_fwd_eff=187.13 / 312.0,  # Source: microbench.csv, FA2 fwd non-causal = 187.1 TFLOP/s
    flash_fwd_shape=(1, 32, 4096, 128),  # Source: microbench.csv (liangan1 GPU_travel FA2 row)
    nvlink_GBps=300.0,  # Source: hw_specs.csv, 12 NVLink3 links x 25 GB/s per direction
    nvlink_links=12,  # Source: hw_specs.csv
    nccl_nvlink_GBps=20.0,  # Source: NCCL topo.h SM80_NVLINK_BW (12 x 20 = 240; Azure measured 231.6 busbw)
    nic_GBps=25.0,  # Source: hw_specs.csv, one 200 Gb/s HDR NIC per GPU
    devices_per_node=8,  # Source: hw_specs.csv (DGX/HGX A100)
    kernel_overhead_us=_KERNEL_OVERHEAD_US,
    nccl_launch_us=_NCCL_LAUNCH_A100_US,  # Source: Azure ND A100 v4 nccl-tests -g 8 (note above)
    host_cpu_vendor="amd",  # Source: DGX A100 (2x AMD EPYC 7742, _DGXA100); Azure ND A100 v4 (AMD EPYC 7V12)
    host_link_GBps=_HOST_LINK_A100_GBPS,
    host_memory_GBps=_HOST_MEMORY_EPYC7742_GBPS,
    host_memory_GB=2000.0,  # Source: DGX A100 user guide (_DGXA100), DGX A100 640GB: 2 TB system memory
    tensor_flops_per_clk_sm=2048,  # Source: per-SM unit throughputs (note above)
    mufu_ex2_per_clk_sm=_MUFU_PER_CLK_SM,
    smem_bytes_per_clk_sm=_SMEM_BYTES_PER_CLK_SM,
    sustained_16bit_tflops=253.7,  # Source: microbench.csv, Azure ND A100 v4 cuBLASLt fp16 8192^3 (sustained)
    source=f"{_A100} ; https://glennklockwood.com/garden/processors/A100 ; {_A100_AZ} ; {_MLENG} ; {_DGXA100}",
)

A100_40GB = DeviceSpec(
    name="a100-40gb",
    arch="ampere",
    sm_count=108,  # Source: _A100 datasheet
    peak_bf16_tflops=312.0,  # Source: hw_specs.csv NVIDIA A100-SXM4-40GB
    peak_fp16_tflops=312.0,  # Source: hw_specs.csv
    peak_fp8_tflops=None,  # Source: hw_specs.csv "No FP8 support"
    peak_tf32_tflops=156.0,  # Source: hw_specs.csv
    peak_fp32_tflops=19.5,  # Source: hw_specs.csv
    hbm_GB=40.0,  # Source: hw_specs.csv
    hbm_GBps=1555.0,  # Source: hw_specs.csv (1.555 TB/s HBM2)
    # No STREAM row for the 40 GB part: the 80 GB part's measured fraction (1674/2039 = 0.821).
    hbm_stream_GBps=1555.0 * 1674.0 / 2039.0,
    gemm_eff_16bit=271.2 / 312.0,  # Source: same die as A100-80GB (microbench.csv MAMF A100 SXM bf16)
    gemm_eff_fp8=None,
    flash_fwd_eff=187.13 / 312.0,  # Source: same die as A100-80GB (microbench.csv FA2 rows)
    flash_fwd_shape=(1, 32, 4096, 128),
    nvlink_GBps=300.0,  # Source: hw_specs.csv
    nvlink_links=12,  # Source: hw_specs.csv
    nccl_nvlink_GBps=20.0,  # Source: NCCL topo.h SM80_NVLINK_BW
    nic_GBps=25.0,  # Source: hw_specs.csv, DGX A100 8x ConnectX-6 HDR 200 Gb/s
    devices_per_node=8,  # Source: hw_specs.csv
    kernel_overhead_us=_KERNEL_OVERHEAD_US,
    nccl_launch_us=_NCCL_LAUNCH_A100_US,  # No 40 GB row: the ND A100 v4 (AMD EPYC host) reading
    host_cpu_vendor="amd",  # Source: DGX A100 user guide (_DGXA100), 2x AMD EPYC 7742
    host_link_GBps=_HOST_LINK_A100_GBPS,  # the 80 GB part's host (same DGX A100)
    host_memory_GBps=_HOST_MEMORY_EPYC7742_GBPS,
    host_memory_GB=1000.0,  # Source: DGX A100 user guide (_DGXA100), DGX A100 320GB: 1 TB system memory
    tensor_flops_per_clk_sm=2048,  # Source: per-SM unit throughputs (note above)
    mufu_ex2_per_clk_sm=_MUFU_PER_CLK_SM,
    smem_bytes_per_clk_sm=_SMEM_BYTES_PER_CLK_SM,
    sustained_16bit_tflops=253.7,  # Source: same die as A100-80GB (Azure cuBLASLt fp16 8192^3)
    source=f"{_A100} ; {_DGXA100} ; {_A100_AZ}",
)

H100_SXM = DeviceSpec(
    name="h100-sxm",
    arch="hopper",
    sm_count=132,  # Source: hw_specs.csv notes (132 SMs)
    peak_bf16_tflops=989.0,  # Source: hw_specs.csv NVIDIA H100-SXM5-80GB (dense)
    peak_fp16_tflops=989.0,  # Source: hw_specs.csv
    peak_fp8_tflops=1979.0,  # Source: hw_specs.csv
    peak_tf32_tflops=494.5,  # Source: hw_specs.csv
    peak_fp32_tflops=67.0,  # Source: hw_specs.csv
    hbm_GB=80.0,  # Source: hw_specs.csv
    hbm_GBps=3350.0,  # Source: hw_specs.csv
    hbm_stream_GBps=2984.0,  # Source: microbench.csv, mean of Azure STREAM rows 2.90–3.18 TB/s
    gemm_eff_16bit=794.5 / 989.0,  # Source: microbench.csv, MAMF bf16 best shape 794.5 TFLOP/s (80.3%)
    gemm_eff_fp8=1402.6 / 1979.0,  # Source: microbench.csv, MAMF fp8 e4m3 best shape 1402.6 TFLOP/s (70.9%)
    flash_fwd_eff=620.73 / 989.0,  # Source: microbench.csv, FA3 fwd = 620.7 TFLOP/s (pytorch/benchmark#2391)
    flash_fwd_shape=(1, 16, 16384, 128),  # Source: microbench.csv
    fa2_fwd_eff=327.9 / 989.0,  # Source: microbench.csv, Azure ND H100 v5 FlashAttention-2 b=2 s=8192 d=128
    cudnn_fwd_eff=_CUDNN_HOPPER_FWD_TFLOPS / 989.0,  # Source: cudnn-frontend benchmark, cuDNN 9.4 (above)
    cudnn_fwd_shape=_CUDNN_HOPPER_SHAPE,
    cudnn_bwd_over_fwd=_CUDNN_HOPPER_BWD_TFLOPS / _CUDNN_HOPPER_FWD_TFLOPS,  # Source: same run (above)
    nvlink_GBps=450.0,  # Source: hw_specs.csv, 18 NVLink4 links x 25 GB/s per direction
    nvlink_links=18,  # Source: hw_specs.csv
    nccl_nvlink_GBps=20.6,  # Source: NCCL topo.h SM90_NVLINK_BW (18 x 20.6 = 371; nccl-tests#212: ~370)
    nic_GBps=50.0,  # Source: hw_specs.csv, one 400 Gb/s NDR NIC per GPU
    devices_per_node=8,  # Source: hw_specs.csv (DGX/HGX H100)
    kernel_overhead_us=_KERNEL_OVERHEAD_US,
    nccl_launch_us=3.35,  # Source: Azure ND H100 v5 nccl-tests -g 8, 26.8 µs / 8 (note at _NCCL_LAUNCH_A100_US)
    host_cpu_vendor="intel",  # Source: DGX H100 / Azure ND H100 v5 hosts, 2x Xeon Platinum 8480C (_H100_AZ)
    host_link_GBps=_HOST_LINK_HOPPER_GBPS,
    host_memory_GBps=_HOST_MEMORY_XEON8480_GBPS,
    host_memory_GB=2000.0,  # Source: DGX H100 user guide (_DGXH100), 2 TB system memory
    tensor_flops_per_clk_sm=4096,  # Source: per-SM unit throughputs (note above)
    mufu_ex2_per_clk_sm=_MUFU_PER_CLK_SM,
    smem_bytes_per_clk_sm=_SMEM_BYTES_PER_CLK_SM,
    sustained_fp8_tflops=1382.2,  # Source: microbench.csv, Azure ND H100 v5 cuBLASLt fp8 32768^3 (sustained)
    source=f"{_H100} ; https://glennklockwood.com/garden/processors/h100 ; {_H100_AZ} ; {_MLENG} ; "
    "https://github.com/NVIDIA/nccl-tests/issues/212 ; https://github.com/NVIDIA/nccl-tests/issues/290 ; "
    f"{_CUDNN_FE} ; {_DGXH100}",
)

H800 = DeviceSpec(
    name="h800",
    arch="hopper",
    sm_count=132,  # Source: same GH100 die as H100 (hw_specs.csv notes)
    peak_bf16_tflops=989.0,  # Source: hw_specs.csv NVIDIA H800-SXM5-80GB
    peak_fp16_tflops=989.0,  # Source: hw_specs.csv
    peak_fp8_tflops=1979.0,  # Source: hw_specs.csv
    peak_tf32_tflops=494.5,  # Source: hw_specs.csv ("assumed identical to H100")
    peak_fp32_tflops=67.0,  # Source: hw_specs.csv
    hbm_GB=80.0,  # Source: hw_specs.csv
    hbm_GBps=3350.0,  # Source: hw_specs.csv
    hbm_stream_GBps=2984.0,  # Source: same HBM3 as H100 (microbench.csv H100 STREAM mean)
    gemm_eff_16bit=794.5 / 989.0,  # Source: same die as H100 (microbench.csv MAMF bf16)
    gemm_eff_fp8=1402.6 / 1979.0,  # Source: same die as H100 (microbench.csv MAMF fp8)
    flash_fwd_eff=620.73 / 989.0,  # Source: same die as H100 (microbench.csv FA3)
    flash_fwd_shape=(1, 16, 16384, 128),
    fa2_fwd_eff=327.9 / 989.0,  # Source: same die as H100 (microbench.csv, Azure FA2 row)
    cudnn_fwd_eff=_CUDNN_HOPPER_FWD_TFLOPS / 989.0,  # Source: same die as H200 (cudnn-frontend, above)
    cudnn_fwd_shape=_CUDNN_HOPPER_SHAPE,
    cudnn_bwd_over_fwd=_CUDNN_HOPPER_BWD_TFLOPS / _CUDNN_HOPPER_FWD_TFLOPS,
    nvlink_GBps=200.0,  # Source: hw_specs.csv, 400 GB/s bidirectional
    nvlink_links=8,  # Source: hw_specs.csv (8 links x 25 GB/s per direction)
    nccl_nvlink_GBps=20.6,  # Source: NCCL topo.h SM90_NVLINK_BW (8 x 20.6 = 165; DeepSeek-V3: ~160 achieved)
    nic_GBps=50.0,  # Source: hw_specs.csv, 400 Gb/s IB per GPU
    devices_per_node=8,  # Source: hw_specs.csv
    kernel_overhead_us=_KERNEL_OVERHEAD_US,
    nccl_launch_us=3.35,  # No H800 row: carried over from H100 (same HGX host class)
    host_cpu_vendor="intel",  # No H800 host in a source: carried over from H100 (same HGX host class)
    host_link_GBps=_HOST_LINK_HOPPER_GBPS,  # carried over from H100 (same HGX host class)
    host_memory_GBps=_HOST_MEMORY_XEON8480_GBPS,
    tensor_flops_per_clk_sm=4096,  # Source: per-SM unit throughputs (note above)
    mufu_ex2_per_clk_sm=_MUFU_PER_CLK_SM,
    smem_bytes_per_clk_sm=_SMEM_BYTES_PER_CLK_SM,
    sustained_fp8_tflops=1382.2,  # Source: same die as H100 (Azure cuBLASLt fp8 32768^3)
    source=f"{_H800} ; https://arxiv.org/abs/2412.19437 ; {_CUDNN_FE}",
)

H200 = DeviceSpec(
    name="h200",
    arch="hopper",
    sm_count=132,  # Source: same GH100 die as H100 (hw_specs.csv notes)
    peak_bf16_tflops=989.0,  # Source: hw_specs.csv NVIDIA H200-SXM-141GB
    peak_fp16_tflops=989.0,  # Source: hw_specs.csv
    peak_fp8_tflops=1979.0,  # Source: hw_specs.csv
    peak_tf32_tflops=494.5,  # Source: hw_specs.csv
    peak_fp32_tflops=67.0,  # Source: hw_specs.csv
    hbm_GB=141.0,  # Source: hw_specs.csv
    hbm_GBps=4800.0,  # Source: hw_specs.csv
    hbm_stream_GBps=4158.0,  # Source: microbench.csv, mean of Azure STREAM rows 4.00–4.48 TB/s
    gemm_eff_16bit=794.5 / 989.0,  # Source: microbench.csv MAMF H100 bf16 row: "H200 is the same"
    gemm_eff_fp8=1453.4 / 1979.0,  # Source: microbench.csv, MAMF H200 fp8 best shape 1453.4 TFLOP/s
    flash_fwd_eff=620.73 / 989.0,  # Source: same die as H100 (microbench.csv FA3)
    flash_fwd_shape=(1, 16, 16384, 128),
    fa2_fwd_eff=329.3 / 989.0,  # Source: microbench.csv, Azure ND H200 v5 FlashAttention-2 b=2 s=8192 d=128
    cudnn_fwd_eff=_CUDNN_HOPPER_FWD_TFLOPS / 989.0,  # Source: cudnn-frontend benchmark, cuDNN 9.4 (above)
    cudnn_fwd_shape=_CUDNN_HOPPER_SHAPE,
    cudnn_bwd_over_fwd=_CUDNN_HOPPER_BWD_TFLOPS / _CUDNN_HOPPER_FWD_TFLOPS,
    nvlink_GBps=450.0,  # Source: hw_specs.csv
    nvlink_links=18,  # Source: hw_specs.csv
    nccl_nvlink_GBps=20.6,  # Source: NCCL topo.h SM90_NVLINK_BW
    nic_GBps=50.0,  # Source: hw_specs.csv, typical HGX H200 = 8x 400G
    devices_per_node=8,  # Source: hw_specs.csv
    kernel_overhead_us=_KERNEL_OVERHEAD_US,
    nccl_launch_us=3.85,  # Source: Azure ND H200 v5 nccl-tests -g 8, 30.8 µs / 8
    host_cpu_vendor="intel",  # Source: Azure ND H200 v5, Xeon Platinum 8480C (_H200_AZ)
    host_link_GBps=_HOST_LINK_HOPPER_GBPS,
    host_memory_GBps=_HOST_MEMORY_XEON8480_GBPS,
    host_memory_GB=2000.0,  # Source: _H200_MLPERF, NVIDIA's 8x H200 system: host_memory_capacity "2 TB"
    tensor_flops_per_clk_sm=4096,  # Source: per-SM unit throughputs (note above)
    mufu_ex2_per_clk_sm=_MUFU_PER_CLK_SM,
    smem_bytes_per_clk_sm=_SMEM_BYTES_PER_CLK_SM,
    sustained_fp8_tflops=1349.5,  # Source: microbench.csv, Azure ND H200 v5 cuBLASLt fp8 32768^3 (sustained)
    source=f"https://www.nvidia.com/en-us/data-center/h200/ ; {_MLENG} ; {_H200_AZ} ; {_CUDNN_FE} ; {_H200_MLPERF}",
)

# NVFP4 GEMM fraction of peak: microbench.csv, Azure ND GB200 v6 cuBLASLt fp4 8192^3 = 7535.6 TFLOP/s of
# the 10,000 dense peak, the device's best fp4 library row (the rule at gemm_eff_16bit). Unlike the MAMF
# anchors it is a heuristic pick after 10,000 warmup iterations (Azure's GEMMCublasLt.py), as no MAMF fp4
# row exists; the rule takes it as it is.
# Blackwell attention: Megatron-Core / NeMo run Transformer Engine's fused attention, which on sm_100
# is cuDNN's flash kernel. The FlashAttention-4 paper (Zadouri, Hoehnerbach, Shah, Liu, Thakkar, Dao;
# https://github.com/Dao-AILab/flash-attention/blob/main/assets/fa4_paper.pdf, abstract) measures
# FA4's BF16 forward on B200 at up to 1613 TFLOP/s (71% of peak), up to 1.3x cuDNN 9.13: cuDNN's
# forward at that shape is 1613 / 1.3 = 1241 TFLOP/s, 55% of B200's 2250. The shape is taken as
# the FlashAttention benchmark's (batch x seqlen = 16k tokens, 16 heads of 128, seqlen 16k); the
# other Blackwell parts (GB200, B300, GB300) take the same fraction of their own peak.
_BLACKWELL_FLASH_EFF = 1613.0 / 1.3 / 2250.0
# GB200 is the B200 die at a higher power limit; its datasheet peak is 11% higher, but one cuDNN version measures
# its flash forward only 5% faster: cuDNN 9.27.0 causal GQA prefill, 16,384 query and key tokens, 64 heads of 128,
# bf16: 1562.9 TFLOP/s on GB200 against 1488.0 on B200 (NVIDIA/cudnn-frontend benchmark/attention_inference/
# results/prefill_sweep/{gb200,b200}/prefill_sweep_2026092*.csv; 8,192 tokens: 1438.1 / 1401.2), as its GEMMs
# measure 4-5% faster (MAMF 1822 / 1745 bf16, 3616 / 3433 fp8). So GB200 runs B200's rate times that ratio.
_CUDNN_GB200_OVER_B200 = 1562.874 / 1488.046
_GB200_FLASH_EFF = _BLACKWELL_FLASH_EFF * 2250.0 / 2500.0 * _CUDNN_GB200_OVER_B200
# Blackwell Ultra (B300, GB300) doubles the MUFU to 32 exponentials per SM per clock (FA4 paper sec. 2.2; NVIDIA,
# "Making Softmax More Efficient with NVIDIA Blackwell Ultra"), so its forward tile (d = 128) needs 512 MUFU cycles
# against 1024 of MMA: the balance of H100 (1024 against 2048), where the forward is tensor-core bound, not
# B200's co-bound one. No attention kernel has been measured on B300; it takes the fraction measured at that
# balance, H100's FlashAttention-3 forward (620.7 TFLOP/s of 989, microbench.csv), instead of B200's.
_BLACKWELL_ULTRA_FLASH_EFF = 620.73 / 989.0
# GB300 has been measured: the same cuDNN 9.27.0 sweep as GB200's (16,384 query and key tokens, 64 heads of 128,
# causal GQA, bf16) runs 1986.3 TFLOP/s on GB300 (prefill_sweep/gb300/prefill_sweep_20260928_183101.csv, NVIDIA/
# cudnn-frontend bd77903; 1961.0 in the 20260924 run; 8,192 tokens: 1875.9), 1.335x B200's 1488.0. So GB300 runs
# B200's rate times that ratio, as GB200 does, instead of Hopper's fraction. B300 has no such row and keeps it: the
# same results' DiT sweep puts B300 at 0.85-0.92x GB300 on shared shapes, and B300 at H100's fraction is 0.853x
# GB300 here (benchmarks/cudnn_prefill_check.md).
_CUDNN_GB300_OVER_B200 = 1986.33 / 1488.046
_GB300_FLASH_EFF = _BLACKWELL_FLASH_EFF * 2250.0 / 2500.0 * _CUDNN_GB300_OVER_B200
# FlashAttention-2 (its sm80 kernels, as PyTorch SDPA's flash backend runs them) on GB200: 373.9 TFLOP/s
# at b=2 s=8192 d=128 (microbench.csv, Azure ND GB200 v6), 15% of 2500.
_BLACKWELL_FA2_EFF = 373.9 / 2500.0
_FP4_EFF = 7535.6 / 10000.0


B200 = DeviceSpec(
    name="b200",
    arch="blackwell",
    sm_count=148,  # Source: hw_specs.csv notes (148 SMs)
    peak_bf16_tflops=2250.0,  # Source: hw_specs.csv NVIDIA B200 (HGX/DGX, 1000 W)
    peak_fp16_tflops=2250.0,  # Source: hw_specs.csv
    peak_fp8_tflops=4500.0,  # Source: hw_specs.csv
    peak_tf32_tflops=1125.0,  # Source: hw_specs.csv
    peak_fp32_tflops=80.0,  # Source: hw_specs.csv
    hbm_GB=180.0,  # Source: hw_specs.csv (usable)
    # The driver reports a 7,680-bit bus at 3,996 MHz (DDR): 7,680 / 8 x 3.996e9 x 2 = 7,672 GB/s, where hw_specs.csv's
    # 8 TB/s assumed 8,192 bits (pytorch/ao#4002, cudaGetDeviceProperties and nvidia-smi on a B200); NVIDIA's
    # Blackwell datasheet gives HGX B200 7.7 TB/s per GPU (ai-dynamo/aiconfigurator#1246).
    hbm_GBps=7672.0,
    # No STREAM row: H200's measured HBM3e fraction (4158/4800 = 0.866).
    hbm_stream_GBps=7672.0 * 4158.0 / 4800.0,
    gemm_eff_16bit=1745.0 / 2250.0,  # Source: microbench.csv, MAMF B200 SXM bf16 best shape 1745 TFLOP/s (77.6%)
    gemm_eff_fp8=3432.5 / 4500.0,  # Source: microbench.csv, MAMF B200 SXM fp8 e4m3 best shape 3432.5 TFLOP/s
    flash_fwd_eff=_BLACKWELL_FLASH_EFF,  # Source: FA4 paper, cuDNN 9.13 = 1613 / 1.3 TFLOP/s (above)
    flash_fwd_shape=(1, 16, 16384, 128),
    fa2_fwd_eff=_BLACKWELL_FA2_EFF,  # GB200's measured FA2 fraction (no B200 row)
    nvlink_GBps=900.0,  # Source: hw_specs.csv, 18 NVLink5 links x 50 GB/s per direction
    nvlink_links=18,  # Source: hw_specs.csv
    nccl_nvlink_GBps=40.1,  # Source: NCCL topo.h SM100_NVLINK_BW (hw_specs.csv notes)
    nic_GBps=50.0,  # Source: hw_specs.csv, DGX B200 8x 400 Gb/s ConnectX-7
    devices_per_node=8,  # Source: hw_specs.csv
    kernel_overhead_us=_KERNEL_OVERHEAD_US,
    nccl_launch_us=3.85,  # No B200 nccl-tests row: carried over from H200 (x86 HGX host, same launch path)
    host_cpu_vendor="intel",  # Source: DGX B200 datasheet, 2x Intel Xeon Platinum 8570
    host_link_GBps=_HOST_LINK_HOPPER_GBPS,  # no B200 nvbandwidth row: the Hopper hosts' PCIe Gen5 x16
    host_memory_GBps=_HOST_MEMORY_XEON8570_GBPS,
    host_memory_GB=4000.0,  # Source: DGX B200 datasheet, "System Memory: Up to 4TB" (the most it takes)
    tensor_flops_per_clk_sm=8192,  # Source: per-SM unit throughputs (note above)
    mufu_ex2_per_clk_sm=_MUFU_PER_CLK_SM,
    smem_bytes_per_clk_sm=_SMEM_BYTES_PER_CLK_SM,
    # No sustained B200 row: GB200's sustained / short-run ratio (2876.6 / 3615.6) on B200's MAMF rate; the
    # same Blackwell die, at B200's 1000 W limit (hw_specs.csv) and 90% of GB200's peaks.
    sustained_fp8_tflops=3432.5 * 2876.6 / 3615.6,
    source="https://resources.nvidia.com/en-us-dgx-systems/dgx-b200-datasheet ; "
    f"https://glennklockwood.com/garden/processors/B200 ; {_MLENG} ; {_NCCL_TOPO} ; "
    "https://github.com/pytorch/ao/pull/4002 ; https://github.com/ai-dynamo/aiconfigurator/pull/1246",
    block_scaled_formats=("mxfp8", "nvfp4"),  # Source: Blackwell tcgen05 MMA kinds mxf8f6f4 / mxf4nvf4 (PTX ISA)
    peak_fp4_tflops=9000.0,  # Source: hw_specs.csv notes "FP4 9000" (DGX B200 datasheet, dense)
    gemm_eff_fp4=_FP4_EFF,  # No B200 fp4 GEMM row: GB200's measured fraction (below)
)

_GB200_AZ = "https://github.com/Azure/AI-benchmarking-guide/blob/main/Azure_Results/ND_GB200_v6_results.md"

# GB200 NVL72: one NVLink domain of 72 GPUs (18 NVSwitch trays), so a "node" here is the
# whole rack: TP, EP and even DP groups up to 72 GPUs stay on NVLink. Scale-out is 400 Gb/s
# per GPU (scaling-book: 4 x 18 x 400 Gb/s per 72-GPU rack).
GB200 = DeviceSpec(
    name="gb200",
    arch="blackwell",
    sm_count=148,  # Source: same Blackwell GPU as B200 (hw_specs.csv B200 notes: 148 SMs)
    peak_bf16_tflops=2500.0,  # Source: hw_specs.csv NVIDIA GB200 (per GPU, NVL72)
    peak_fp16_tflops=2500.0,  # Source: hw_specs.csv
    peak_fp8_tflops=5000.0,  # Source: hw_specs.csv
    peak_tf32_tflops=1250.0,  # Source: hw_specs.csv
    peak_fp32_tflops=80.0,  # Source: hw_specs.csv
    hbm_GB=186.0,  # Source: hw_specs.csv
    # GB200 NVL72's 576 TB/s over 72 GPUs; no driver bus width is published for it, so B200's 7,672 is not carried.
    hbm_GBps=8000.0,  # Source: hw_specs.csv
    # No STREAM row: H200's measured HBM3e fraction (4158/4800 = 0.866), as for B200.
    hbm_stream_GBps=8000.0 * 4158.0 / 4800.0,
    gemm_eff_16bit=1822.0 / 2500.0,  # Source: microbench.csv, MAMF GB200 bf16 best shape 1822 TFLOP/s (72.9%)
    gemm_eff_fp8=3615.6 / 5000.0,  # Source: microbench.csv, MAMF GB200 fp8 best shape 3615.6 TFLOP/s (72.3%)
    flash_fwd_eff=_GB200_FLASH_EFF,  # B200's cuDNN rate x cuDNN's measured GB200 / B200 (above)
    flash_fwd_shape=(1, 16, 16384, 128),
    fa2_fwd_eff=_BLACKWELL_FA2_EFF,  # Source: microbench.csv, Azure ND GB200 v6 FlashAttention-2 (above)
    nvlink_GBps=900.0,  # Source: hw_specs.csv, NVLink5 900 GB/s per direction per GPU
    nvlink_links=18,  # Source: hw_specs.csv (NVLink5, 18 links)
    nccl_nvlink_GBps=40.1,  # Source: NCCL topo.h SM100_NVLINK_BW
    nic_GBps=50.0,  # Source: hw_specs.csv, 400 Gb/s per GPU
    devices_per_node=72,  # Source: hw_specs.csv, 72-GPU NVLink domain (NVL72)
    kernel_overhead_us=_KERNEL_OVERHEAD_US,
    nccl_launch_us=4.04,  # Source: Azure ND GB200 v6 nccl-tests -g 4, 16.2 µs / 4 (Grace host)
    host_cpu_vendor="arm",  # Source: Grace (Neoverse V2) host, Azure ND GB200 v6 (_GB200_AZ)
    gpus_per_host=4,  # Source: hw_specs.csv, "4 GPUs + 2 Grace CPUs per compute tray" (18 trays per NVL72)
    host_link_GBps=_HOST_LINK_GRACE_GBPS,
    host_memory_GBps=_HOST_MEMORY_GRACE_GBPS,
    host_memory_GB=17000.0 / 18,  # Source: _GB200_NVL72, "17 TB" LPDDR5X over the rack's 18 compute trays
    tensor_flops_per_clk_sm=8192,  # Source: per-SM unit throughputs (note above)
    mufu_ex2_per_clk_sm=_MUFU_PER_CLK_SM,
    smem_bytes_per_clk_sm=_SMEM_BYTES_PER_CLK_SM,
    sustained_fp8_tflops=2876.6,  # Source: microbench.csv, Azure ND GB200 v6 cuBLASLt fp8 8192^3 (sustained)
    source=f"{_MLENG} ; https://github.com/jax-ml/scaling-book/blob/main/gpus.md ; {_GB200_AZ} ; {_NCCL_TOPO} ; "
    f"{_GB200_NVL72}",
    block_scaled_formats=("mxfp8", "nvfp4"),  # Source: same Blackwell tensor cores as B200
    peak_fp4_tflops=10000.0,  # Source: hw_specs.csv notes (ml-engineering: nvfp4 10,000 dense per GPU)
    gemm_eff_fp4=_FP4_EFF,  # Source: microbench.csv, Azure ND GB200 v6 cuBLASLt fp4 (above)
)

# Blackwell Ultra (B300 die, 160 SMs). Per-GPU dense peaks: NVIDIA GB300 NVL72 (rack: 360 PF
# FP8, 1,080 PF FP4 dense, 20 TB HBM3e at 576 TB/s, 130 TB/s NVLink, one ConnectX-8 800 Gb/s per
# GPU) and HGX B300 (8 GPUs: 36 PF BF16 and 72 PF FP8 with sparsity, 105 PF FP4 dense, 2.3 TB);
# per-GPU tables: glennklockwood.com/garden/processors/B300, verda.com/blog/gb300-nvl72-architecture.
_GB300 = "https://www.nvidia.com/en-us/data-center/gb300-nvl72/"
_HGX_B300 = "https://www.nvidia.com/en-us/data-center/hgx/"
_B300_PAGES = "https://glennklockwood.com/garden/processors/B300 ; https://verda.com/blog/gb300-nvl72-architecture"

B300 = DeviceSpec(
    name="b300",
    arch="blackwell",
    sm_count=160,  # Source: verda.com per-GPU table / NVIDIA Blackwell Ultra (160 SMs)
    peak_bf16_tflops=2250.0,  # Source: HGX B300, 36 PF sparse / 8 GPUs / 2 (glennklockwood: 2250 dense)
    peak_fp16_tflops=2250.0,  # Source: as bf16
    peak_fp8_tflops=4500.0,  # Source: HGX B300, 72 PF sparse / 8 / 2
    peak_tf32_tflops=1125.0,  # Source: glennklockwood B300 table (1125 dense)
    peak_fp32_tflops=75.0,  # Source: glennklockwood B300 table (75)
    hbm_GB=270.0,  # Source: verda.com table, 270 GB usable of 288 GB HBM3e
    # HGX B300: 62 TB/s over its 8 GPUs (NVIDIA's datasheet as ai-dynamo/aiconfigurator's b300_sxm.yaml quotes it,
    # commit 095f58a); glennklockwood's 8 TB/s is the rounded figure.
    hbm_GBps=7750.0,
    # No STREAM row: H200's measured HBM3e fraction (4158/4800 = 0.866), as for B200.
    hbm_stream_GBps=7750.0 * 4158.0 / 4800.0,
    gemm_eff_16bit=1769.0 / 2250.0,  # Source: microbench.csv, MAMF B300 SXM bf16 best shape 1769 TFLOP/s (78.6%)
    gemm_eff_fp8=3353.3 / 4500.0,  # Source: microbench.csv, MAMF B300 SXM fp8 e4m3 best shape 3353.3 (74.5%)
    flash_fwd_eff=_BLACKWELL_ULTRA_FLASH_EFF,  # Hopper's measured fraction at the same MUFU:MMA balance (above)
    flash_fwd_shape=(1, 16, 16384, 128),
    fa2_fwd_eff=_BLACKWELL_FA2_EFF,  # GB200's measured FA2 fraction (no B300 row)
    nvlink_GBps=900.0,  # Source: HGX B300, NVLink5 1.8 TB/s per GPU (900 per direction)
    nvlink_links=18,  # Source: NVLink5, 18 links (as B200)
    nccl_nvlink_GBps=40.1,  # Source: NCCL topo.h SM100_NVLINK_BW
    # Two Megatron-Bridge rows measure far less than 2x B200 across nodes (26.02 gpt-oss ep 64: 9.80 vs 10.18 s);
    # no source says why, so the hardware rate stands (benchmarks/b300_scaleout.md).
    nic_GBps=100.0,  # Source: HGX B300, one ConnectX-8 SuperNIC of 800 Gb/s per GPU
    devices_per_node=8,  # Source: HGX B300 (8 GPUs per baseboard)
    kernel_overhead_us=_KERNEL_OVERHEAD_US,
    nccl_launch_us=3.85,  # No B300 nccl-tests row: carried over from B200/H200 (x86 HGX host, same launch path)
    host_cpu_vendor="intel",  # Source: DGX B300, Intel Xeon 6776P hosts
    host_link_GBps=_HOST_LINK_HOPPER_GBPS,  # no B300 nvbandwidth row: the Hopper hosts' PCIe Gen5 x16
    host_memory_GBps=_HOST_MEMORY_XEON8570_GBPS,  # no channel figure for the 6776P here: DGX B200's host
    tensor_flops_per_clk_sm=8192,  # Source: per-SM unit throughputs (note above)
    mufu_ex2_per_clk_sm=_MUFU_PER_CLK_SM_ULTRA,
    smem_bytes_per_clk_sm=_SMEM_BYTES_PER_CLK_SM,
    # No sustained row: not carried over from GB200 (another die, another power limit); uncapped.
    source=f"{_HGX_B300} ; {_B300_PAGES} ; {_MLENG} ; {_NCCL_TOPO} ; "
    "https://github.com/ai-dynamo/aiconfigurator/blob/095f58a51c4ca8e61b66ec108d86f223f8d559ce/aic-core/src/"
    "aiconfigurator_core/systems/b300_sxm.yaml",
    block_scaled_formats=("mxfp8", "nvfp4"),  # Source: Blackwell tensor cores (as B200)
    peak_fp4_tflops=105000.0 / 8,  # Source: HGX B300, 105 PF FP4 dense / 8 GPUs (glennklockwood: 13,125)
    gemm_eff_fp4=_FP4_EFF,  # No B300 fp4 GEMM row: GB200's measured fraction
)

GB300 = DeviceSpec(
    name="gb300",
    arch="blackwell",
    sm_count=160,  # Source: as B300 (same Blackwell Ultra GPU)
    peak_bf16_tflops=2500.0,  # Source: GB300 NVL72, 360 PF sparse / 72 GPUs / 2
    peak_fp16_tflops=2500.0,  # Source: as bf16
    peak_fp8_tflops=5000.0,  # Source: GB300 NVL72, 360 PF FP8 dense / 72 (glennklockwood)
    peak_tf32_tflops=1250.0,  # Source: verda.com per-GPU table (1.25 PF)
    peak_fp32_tflops=80.0,  # Source: verda.com per-GPU table (0.080 PF)
    hbm_GB=279.0,  # Source: verda.com per-GPU table, 279 GB usable of 288 GB HBM3e
    hbm_GBps=8000.0,  # Source: GB300 NVL72, 576 TB/s / 72
    hbm_stream_GBps=8000.0 * 4158.0 / 4800.0,  # No STREAM row: H200's HBM3e fraction, as for GB200
    # No GB300 GEMM row: the B300's measured MAMF fractions (same Blackwell Ultra GPU).
    gemm_eff_16bit=1769.0 / 2250.0,
    gemm_eff_fp8=3353.3 / 4500.0,
    flash_fwd_eff=_GB300_FLASH_EFF,  # Source: cuDNN 9.27's measured GB300 / B200 forward (above)
    flash_fwd_shape=(1, 16, 16384, 128),
    fa2_fwd_eff=_BLACKWELL_FA2_EFF,  # GB200's measured FA2 fraction (no GB300 row)
    nvlink_GBps=900.0,  # Source: GB300 NVL72, 130 TB/s / 72 GPUs = 1.8 TB/s (900 per direction)
    nvlink_links=18,  # Source: NVLink5, 18 links
    nccl_nvlink_GBps=40.1,  # Source: NCCL topo.h SM100_NVLINK_BW
    nic_GBps=100.0,  # Source: GB300 NVL72, 72 ConnectX-8 NICs of 800 Gb/s (one per GPU)
    devices_per_node=72,  # Source: GB300 NVL72, 72-GPU NVLink domain
    kernel_overhead_us=_KERNEL_OVERHEAD_US,
    nccl_launch_us=4.04,  # No GB300 nccl-tests row: carried over from GB200 (Grace host, same launch path)
    host_cpu_vendor="arm",  # Source: GB300 NVL72, Grace host (as GB200)
    gpus_per_host=4,  # Source: GB300 NVL72, 72 GPUs and 36 Grace CPUs in 18 compute trays
    host_link_GBps=_HOST_LINK_GRACE_GBPS,  # GB200's NVLink-C2C measurement (the same Grace host)
    host_memory_GBps=_HOST_MEMORY_GRACE_GBPS,  # GB200's measured tray (the same Grace host)
    tensor_flops_per_clk_sm=8192,  # Source: per-SM unit throughputs (note above)
    mufu_ex2_per_clk_sm=_MUFU_PER_CLK_SM_ULTRA,
    smem_bytes_per_clk_sm=_SMEM_BYTES_PER_CLK_SM,
    # No sustained row: not carried over from GB200 (another die, another power limit); uncapped.
    source=f"{_GB300} ; {_B300_PAGES} ; {_MLENG} ; {_NCCL_TOPO}",
    block_scaled_formats=("mxfp8", "nvfp4"),  # Source: Blackwell tensor cores
    peak_fp4_tflops=15000.0,  # Source: GB300 NVL72, 1,080 PF FP4 dense / 72
    gemm_eff_fp4=_FP4_EFF,  # No GB300 fp4 GEMM row: GB200's measured fraction
)

#: Board power the H100 SXM5's peaks and measured GEMM / flash fractions belong to: "Max thermal design
#: power (TDP) up to 700 W" (NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column).
H100_SXM_BOARD_W = 700.0
#: Grand Teton's H100s run at a 500 W power limit (torchtitan, arXiv:2410.06511, and its benchmark page).
GRAND_TETON_BOARD_W = 500.0


def power_capped_clock(cap_w: float, rated_w: float) -> float:
    """SM clock of a part held to ``cap_w`` over its clock at its rated board power ``rated_w``.

    A GPU enforces a power limit by lowering its SM clock (and with it the voltage) until the board
    draws no more than the limit. CMOS dynamic power is ``C V^2 f`` and in the DVFS range the voltage
    rises with the clock, so a part that draws its full rated power on dense math runs at
    ``(cap_w / rated_w) ** (1/3)`` of its rated clock under the cap. Static power is left out (it
    does not fall with the clock, so the true clock is lower): an upper bound, no constant fitted.
    Tensor-core and SIMT throughput scale with the clock; HBM keeps its own clock.
    """
    if cap_w <= 0 or rated_w <= 0:
        raise ValueError(f"board powers must be positive, got cap {cap_w} W, rated {rated_w} W")
    return min(1.0, cap_w / rated_w) ** (1.0 / 3.0)


def _clock_scaled_peaks(spec: DeviceSpec, clock: float) -> dict[str, float | None]:
    """``spec``'s FLOP/s peaks at ``clock`` times its rated SM clock."""
    names = ("peak_bf16_tflops", "peak_fp16_tflops", "peak_fp8_tflops", "peak_tf32_tflops", "peak_fp32_tflops",
             "peak_fp4_tflops")  # fmt: skip
    return {n: (None if getattr(spec, n) is None else getattr(spec, n) * clock) for n in names}


# Meta's Grand Teton H100 (torchtitan, arXiv:2410.06511; cases.csv torchtitan_2412 rows): an H100
# SXM5 with 96 GB HBM2e run at a 500 W power limit. torchtitan's benchmark page gives its memory:
# "96GB HBM2e with 2.4 TB/sec peak memory bandwidth", and says of its compute only that the peak
# "is between SXM and NVL, and we don't know its exact value" (benchmarks/llama3_h100_202412_torchtitan.md,
# pytorch/torchtitan commit b5bcd76). So the HBM is the page's, achieved at the H100 SXM5's measured
# STREAM fraction (same Hopper memory system, other stacks); the compute peaks are the SXM5's at the
# clock the 500 W limit leaves (:func:`power_capped_clock`: 0.894, 884 bf16 TFLOP/s dense, inside the
# page's "between SXM (989) and NVL (835)"), with the SXM5's measured fractions of peak; links are the SXM5's.
_H100_96GB_HBM_GBPS = 2400.0
H100_96GB = DeviceSpec(
    **{
        **{f.name: getattr(H100_SXM, f.name) for f in fields(DeviceSpec)},
        "name": "h100-96gb",
        "hbm_GB": 96.0,  # Source: torchtitan (arXiv:2410.06511), H100 96 GB HBM2e
        "hbm_GBps": _H100_96GB_HBM_GBPS,  # Source: torchtitan benchmarks/llama3_h100_202412_torchtitan.md
        "hbm_stream_GBps": _H100_96GB_HBM_GBPS * H100_SXM.hbm_stream_GBps / H100_SXM.hbm_GBps,
        # Source: the SXM5's peaks at the 500 W clock (power_capped_clock, above)
        **_clock_scaled_peaks(H100_SXM, power_capped_clock(GRAND_TETON_BOARD_W, H100_SXM_BOARD_W)),
        "host_memory_GB": None,  # Grand Teton's host memory is not published: no check
        "source": f"{H100_SXM.source} ; https://arxiv.org/abs/2410.06511 (H100 96 GB HBM2e, 500 W limit) ; "
        "https://github.com/pytorch/torchtitan/blob/b5bcd76c6/benchmarks/llama3_h100_202412_torchtitan.md "
        "(2.4 TB/s HBM2e)",
    }
)

# Google Cloud A3 Mega (a3-megagpu-8g): the H100 SXM5 (80 GB) in an 8-GPU NVSwitch node whose GPUs each
# have one 200 Gb/s NIC on GPUDirect-TCPXO (networks.TCPXO: the rate, the plugin's latency and the NCCL
# settings Google's guides set, with their sources). Everything else is the H100 SXM's.
H100_A3MEGA = DeviceSpec(
    **{
        **{f.name: getattr(H100_SXM, f.name) for f in fields(DeviceSpec)},
        "name": "h100-a3mega",
        "nic_GBps": 200.0 / 8,  # Source: networks.TCPXO.nic_Gbps, 8 GPU NICs x 200 Gb/s per VM
        "network": TCPXO.name,
        "host_memory_GB": 1872.0,  # Source: Compute Engine's A3 machine types, a3-megagpu-8g: 1,872 GB of memory
        "source": f"{H100_SXM.source} ; {TCPXO.source} ; "
        "https://cloud.google.com/compute/docs/accelerator-optimized-machines#a3-vms",
    }
)

DEVICES: dict[str, DeviceSpec] = {
    d.name: d for d in (A100_40GB, A100_80GB, H100_SXM, H100_96GB, H100_A3MEGA, H800, H200, B200, GB200, B300, GB300)
}


def get_device(name: str) -> DeviceSpec:
    """Look a device up by name; an unknown name lists the known ones."""
    try:
        return DEVICES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown device {name!r} (known: {', '.join(DEVICES)})") from None
