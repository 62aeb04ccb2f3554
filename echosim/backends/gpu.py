"""GPU backends: a device's data plus the compute and NCCL models, behind the Backend contract."""

from __future__ import annotations

from typing import Any

from echosim.backends import collectives, compute
from echosim.backends.base import DEFAULT_NODE_DEVICES, Backend, KernelBackend, OverlapModel, Placement
from echosim.backends.devices import DEVICES, DeviceSpec
from echosim.backends.topology import fill_domains
from echosim.ir.graph import Node
from echosim.ir.ops import REFERENCE_RMSNORM, AttentionAttrs, MatmulAttrs, NormAttrs, OpKind, OptimizerAttrs, Phase

CONV_LAYOUTS = ("nhwc", "nchw")
# Which FP8 GEMMs run with fast accumulation (compute.FP8_PROMOTING_ARCHS): "forward" as Transformer Engine's
# per-tensor recipes and torchao's float8 training set it (fprop only), "all" as XLA does for FP8 dots of
# DEFAULT precision, "none" as cuBLASLt and torch._scaled_mm do by default.
FP8_FAST_ACCUM = ("forward", "all", "none")
# bytes of one activation element a tensor-core convolution of this compute dtype reads and writes
# (fp8 operands are quantised copies; the activations stay 16-bit)
ACTIVATION_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 2}

MEMORY_BOUND_OPS = frozenset(
    {
        OpKind.ELEMENTWISE,
        OpKind.NORM,
        OpKind.SOFTMAX,
        OpKind.EMBEDDING,
        OpKind.REDUCTION,
        OpKind.CROSS_ENTROPY,
        OpKind.OPTIMIZER_UPDATE,
    }
)


def default_overlap(device: DeviceSpec) -> OverlapModel:
    """Compute slows by the share of SMs NCCL kernels hold, memory-bound kernels also by the HBM share.

    NCCL runs one CTA per channel, on one SM each, and uses about one ring channel per
    NVLink (12 on A100, 18 on H100/B200), so overlapped compute keeps
    ``1 - links / sm_count`` of the GPU: 1.13x on A100, 1.16x on H100, 1.14x on B200.
    A collective's copies also read and write HBM: for the collective that overlaps
    compute in a training step (the data-parallel gradient reduction across nodes, at
    NIC rate) that is about three bytes of HBM traffic (read to send, write received,
    read for the reduction) per byte on the wire, ``3 x nic_GBps`` of the achievable
    HBM bandwidth, which memory-bound kernels lose on top of the SMs. Both sit at the
    low end of what Echo measured for kernels under a concurrent all-reduce (mean 1.38x
    for a 25 MB all-reduce on A100, small DDP kernels, arXiv 2412.12487 sec. 2): big
    GEMMs hide memory traffic better. Communication is not slowed by compute (Echo
    applies slowdown to compute only). All three are calibratable fields of
    :class:`OverlapModel`.
    """
    sm_share = min(device.nvlink_links, device.sm_count // 2) / device.sm_count
    hbm_share = min(0.5, 3 * device.nic_GBps / device.hbm_stream_GBps)
    return OverlapModel(
        compute_slowdown=1.0 / (1.0 - sm_share),
        comm_slowdown=1.0,
        memory_bound_slowdown=1.0 / (1.0 - sm_share - hbm_share),
    )


class GPUBackend(KernelBackend):
    """An NVIDIA GPU in an NVLink node with one NIC per GPU, costed analytically.

    fp32 matmuls are costed on TF32 tensor cores, as training recipes configure PyTorch
    (``torch.set_float32_matmul_precision("high")``); ``allow_tf32=False`` costs them on
    the FP32 pipes instead. The MFU denominator follows the same choice.

    The software stack is part of the answer: GEMMs run cuBLAS's heuristic pick, as PyTorch
    and Transformer Engine call it (``autotuned_gemms=True``: an autotuner's, as XLA does), and
    collectives run under NCCL's defaults unless ``nccl`` says otherwise. :meth:`variant`
    gives the same device under another stack. ``fp8_fast_accum`` says which FP8 GEMMs skip the
    promotion of their partial sums (:data:`FP8_FAST_ACCUM`; it changes the rate on Hopper only).

    Convolutions are costed on NHWC (channels_last) activations, the layout tensor cores take
    (``conv_layout="nhwc"``). With ``conv_layout="nchw"`` (PyTorch's default memory format) a
    convolution on tensor cores also pays cuDNN's transposes of its activations in and out
    (NVIDIA, "Convolutional Layers User's Guide", Tensor Layouts In Memory: NCHW vs NHWC,
    https://docs.nvidia.com/deeplearning/performance/dl-performance-convolutional/index.html);
    on the FP32 pipes (``allow_tf32=False``) cuDNN runs NCHW natively, so there are none.
    """

    def __init__(
        self,
        device: DeviceSpec,
        overlap: OverlapModel | None = None,
        *,
        allow_tf32: bool = True,
        nccl: collectives.NcclConfig = collectives.DEFAULT_NCCL,
        autotuned_gemms: bool = False,
        conv_layout: str = "nhwc",
        sustained_gemms: bool = True,
        fp8_fast_accum: str = "forward",
    ):
        if conv_layout not in CONV_LAYOUTS:
            raise ValueError(f"conv_layout {conv_layout!r}: unknown (known: {', '.join(CONV_LAYOUTS)})")
        if fp8_fast_accum not in FP8_FAST_ACCUM:
            raise ValueError(f"fp8_fast_accum {fp8_fast_accum!r}: unknown (known: {', '.join(FP8_FAST_ACCUM)})")
        self.device = device
        self.name = device.name
        self._overlap = overlap if overlap is not None else default_overlap(device)
        self.allow_tf32 = allow_tf32
        self.nccl = nccl
        self.autotuned_gemms = autotuned_gemms
        self.sustained_gemms = sustained_gemms
        self.conv_layout = conv_layout
        self.fp8_fast_accum = fp8_fast_accum

    def variant(self, **settings: Any) -> GPUBackend:
        """The same device under another stack: ``nccl``, ``autotuned_gemms``, ``allow_tf32``, ``conv_layout``,
        ``sustained_gemms`` (False: a short benchmark run, GEMMs not held to the power-limited rate),
        ``fp8_fast_accum``."""
        current = {
            "allow_tf32": self.allow_tf32,
            "nccl": self.nccl,
            "autotuned_gemms": self.autotuned_gemms,
            "conv_layout": self.conv_layout,
            "sustained_gemms": self.sustained_gemms,
            "fp8_fast_accum": self.fp8_fast_accum,
        }
        unknown = set(settings) - set(current)
        if unknown:
            raise ValueError(f"unknown backend setting(s) {', '.join(sorted(unknown))} (known: {', '.join(current)})")
        return GPUBackend(self.device, self._overlap, **{**current, **settings})

    def __repr__(self) -> str:
        return f"GPUBackend({self.device.name!r}, {self._overlap})"

    def compute_dtype(self, node: Node) -> str:
        dtype = super().compute_dtype(node)
        if dtype == "fp32" and not self.allow_tf32:
            return "fp32-simt"
        return dtype

    def formats(self) -> tuple[str, ...]:
        """Block-scaled formats the tensor cores take (the device's data)."""
        return self.device.block_scaled_formats

    def node_devices(self, devices: int) -> int:
        """A job's node is its NVLink domain: 8 GPUs (HGX/DGX) or the 72 of an NVL72 rack."""
        return fill_domains(devices, self.device.devices_per_node)

    def op_time_s(self, node: Node, io_bytes: int) -> float:
        """A forward GEMM under ``fp8_fast_accum="forward"`` runs with fast accumulation; the rest as the base."""
        forward = self.fp8_fast_accum == "forward" and node.phase is Phase.FORWARD
        if forward and node.op is OpKind.MATMUL and isinstance(node.attrs, MatmulAttrs):
            return self._gemm_s(node.attrs, self.compute_dtype(node), fast_accum=True)
        if isinstance(node.attrs, OptimizerAttrs) and node.attrs.host_ranks:
            a = node.attrs
            return compute.host_optimizer_time_s(self.device, a.params, a.bytes_per_param, a.host_ranks, a.overlapped)
        return super().op_time_s(node, io_bytes)

    def host_copy_time_s(self, nbytes: int) -> float:
        """Seconds to copy ``nbytes`` between host memory and this GPU (a weight shard kept on the host)."""
        return compute.host_copy_time_s(self.device, nbytes)

    def matmul_cost_s(self, a: MatmulAttrs, dtype: str) -> float:
        return self._gemm_s(a, dtype, fast_accum=self.fp8_fast_accum == "all")

    def _gemm_s(self, a: MatmulAttrs, dtype: str, fast_accum: bool) -> float:
        gemm = compute.matmul_time_s(
            self.device,
            a.m,
            a.n,
            a.k,
            a.batch,
            dtype,
            self.autotuned_gemms,
            a.grouped,
            self.sustained_gemms,
            fast_accum,
        )
        return gemm + self.conv_transpose_s(a, dtype)

    def conv_transpose_s(self, a: MatmulAttrs, dtype: str) -> float:
        """cuDNN's NCHW<->NHWC transposes around a tensor-core convolution: each of its activations
        in and out read and written once, one kernel each; 0 for a GEMM, NHWC, or the FP32 pipes."""
        if not a.conv_io or self.conv_layout == "nhwc" or dtype == "fp32-simt":
            return 0.0
        element = ACTIVATION_BYTES.get(dtype, 2)
        return compute.memory_bound_time_s(self.device, 2 * a.conv_io * element, kernels=2)

    def attention_cost_s(self, a: AttentionAttrs, dtype: str, backward: bool) -> float:
        return compute.attention_time_s(self.device, a, dtype, backward)

    def memory_cost_s(self, node: Node, io_bytes: int) -> float:
        if node.op not in MEMORY_BOUND_OPS:
            raise ValueError(f"{self.name} has no cost rule for {node.op.value} (node {node.id} {node.name})")
        io_bytes += self.quantised_copy_bytes(node)
        if isinstance(node.attrs, NormAttrs) and node.attrs.reference:  # the eager reference RMSNorm's kernels
            kernels = REFERENCE_RMSNORM[node.phase is Phase.BACKWARD][2]
            return compute.memory_bound_time_s(self.device, io_bytes, kernels)
        if (amax_bytes := self.global_amax_bytes(node)) > 0:
            return compute.memory_bound_time_s(self.device, io_bytes + amax_bytes, kernels=2)
        return compute.memory_bound_time_s(self.device, io_bytes)

    def global_amax_bytes(self, node: Node) -> float:
        """Bytes of the separate amax pass an NVFP4 cast needs before it can quantise (0 for other casts).

        NVFP4 scales in two levels: an e4m3 scale per 16 elements under one FP32 scale per tensor, and that
        tensor scale comes from the tensor's global amax (NVIDIA, "Pretraining Large Language Models with
        NVFP4", arXiv:2509.25149, sec. 2). Transformer Engine computes the amax in its own kernel that reads
        the 16-bit input once more (for the column-wise copy, the amax after the random Hadamard transform
        in the same pass), and its GEMM profiling guide lists "the extra memory pass for per-tensor amax
        computation" among NVFP4's costs (docs/examples/gemm_profiling/gemm_profiling.rst). MXFP8's
        power-of-two block scales need no global amax: its cast is one pass.
        """
        fn = getattr(node.attrs, "fn", "")
        if node.op is not OpKind.ELEMENTWISE or fn != "nvfp4_cast":
            return 0.0
        return float(node.out.numel * 2)  # the 16-bit input read again

    def quantised_copy_bytes(self, node: Node) -> float:
        """Bytes a Transformer Engine quantising cast writes beyond its node's one row-wise output.

        A training linear needs each quantised activation (its input, its output gradient) in two
        usages: row-wise for the forward / input-gradient GEMM and column-wise for the weight gradient,
        and TE's quantizers write both in the one cast kernel. Block-scaled formats (MXFP8, NVFP4) carry
        one scale per block along the contracted dimension, so the column-wise copy is a second
        quantisation with its own scales, on every part. Per-tensor FP8 needs a transposed copy only
        where cuBLASLt runs FP8 GEMMs in the TN layout alone: TE's ``is_non_tn_fp8_gemm_supported``
        is true from sm_100 (Blackwell) on (transformer_engine/pytorch/utils.py), so Hopper writes the
        transpose and Blackwell does not. Scales: one byte per 32 elements (MXFP8) or 16 (NVFP4).
        """
        fn = getattr(node.attrs, "fn", "")
        if node.op is not OpKind.ELEMENTWISE or not fn.endswith("_cast"):
            return 0.0
        fmt = fn.removesuffix("_cast")
        if fmt not in compute.COLUMNWISE_FORMATS and not (fmt == "fp8" and self.device.arch == "hopper"):
            return 0.0
        numel = node.out.numel
        row = compute.itemsize(fmt) * numel
        written = node.out.nbytes  # the node's own row-wise elements, already in io_bytes
        return 2 * row - written

    def collective_time_s(self, kind: OpKind, nbytes: int, placement: Placement) -> float:
        return collectives.collective_time_s(self.device, kind, nbytes, placement, self.nccl)

    def explain_collective(self, kind: OpKind, nbytes: int, placement: Placement) -> dict[str, object]:
        """The (algorithm, protocol) NCCL's tuner would pick, for ``echosim cost``."""
        choice = collectives.best_choice(self.device, kind, nbytes, placement, self.nccl)
        return {"algorithm": choice.algo, "protocol": choice.proto}

    def describe(self) -> dict[str, object]:
        """Every number of the device (``echosim backends --json``), the overlap model and the sources."""
        from dataclasses import asdict

        d: dict[str, object] = {"kind": "gpu", **asdict(self.device)}
        d["nvlink_busbw_GBps"] = round(self.device.nvlink_busbw_GBps, 3)
        d["overlap"] = asdict(self._overlap)
        d["allow_tf32"] = self.allow_tf32
        d["autotuned_gemms"] = self.autotuned_gemms
        d["sustained_gemms"] = self.sustained_gemms
        d["fp8_fast_accum"] = self.fp8_fast_accum
        d["conv_layout"] = self.conv_layout
        return d

    def memory_bytes(self) -> int:
        """HBM capacity; NVIDIA's "80 GB" parts expose 80 GiB to CUDA."""
        return int(self.device.hbm_GB * 2**30)

    def supports_dtype(self, dtype: str) -> bool:
        """fp8 needs fp8 tensor cores (``peak_fp8_tflops``; None on A100 and older: hw_specs.csv); int8 GEMM
        training (MaxText's AQT quantization) is modelled on TPUs only."""
        if dtype == "int8":
            return False
        return dtype != "fp8" or self.device.peak_fp8_tflops is not None

    def peak_bandwidth_Bps(self, path: str) -> float:
        """Datasheet bytes/s per GPU: HBM (``memory``), or everything its links can bring in (``links``:
        NVLink per direction plus its NIC), the bounds of the report's bandwidth invariant."""
        if path == "memory":
            return self.device.hbm_GBps * 1e9
        return (self.device.nvlink_GBps + self.device.nic_GBps) * 1e9

    def peak_flops(self, dtype: str) -> float:
        if dtype in ("fp32", "tf32") and not self.allow_tf32:
            dtype = "fp32-simt"
        return self.device.peak_tflops(dtype) * 1e12


class NullBackend:
    """Costs (almost) nothing: every op 1 ns so orderings stay stable; for fast tests."""

    name = "null"
    TICK_S = 1e-9

    def op_time_s(self, node: Node, io_bytes: int) -> float:
        return self.TICK_S

    def collective_time_s(self, kind: OpKind, nbytes: int, placement: Placement) -> float:
        return self.TICK_S

    def overlap(self) -> OverlapModel:
        return OverlapModel()

    def memory_bytes(self) -> int:
        return 2**62

    def peak_flops(self, dtype: str) -> float:
        return 1e15

    def node_devices(self, devices: int) -> int:
        return DEFAULT_NODE_DEVICES

    def describe(self) -> dict[str, object]:
        return {"kind": "null", "peak_bf16_tflops": 1000.0, "source": "no hardware: every op costs 1 ns (for tests)"}


def builtin_backends() -> dict[str, Backend]:
    """Every built-in backend by name: GPUs (:data:`DEVICES`), TPUs, CPUs, plus ``null``."""
    from echosim.backends.cpu import CPUS, CPUBackend
    from echosim.backends.tpu import TPUS, TPUBackend

    backends: dict[str, Backend] = {name: GPUBackend(dev) for name, dev in DEVICES.items()}
    backends.update({name: TPUBackend(chip) for name, chip in TPUS.items()})
    backends.update({name: CPUBackend(cpu) for name, cpu in CPUS.items()})
    backends["null"] = NullBackend()
    return backends
