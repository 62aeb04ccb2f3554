"""x86 CPU sockets as training devices: roofline compute and gloo collectives over TCP.

One device is one CPU socket (PyTorch runs one rank per socket so that each rank has its
own memory controllers). Matmuls run on AMX tiles (Sapphire Rapids) or AVX-512 units at
an assumed fraction of the derived peak, memory-bound ops at an assumed fraction of DDR
bandwidth, each op pays PyTorch's CPU dispatch overhead. Collectives are gloo's: rings of
TCP messages, over the loopback between the sockets of a node and over the node's
Ethernet NIC between nodes.

The validation data holds no x86 measurement (collective-cost-models.md, gap 7): every
efficiency below is an assumption, named and flagged in ``describe()``, to be replaced by
the calibration database once a machine is measured.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields

from echosim.backends.base import KernelBackend, OverlapModel, Placement
from echosim.backends.topology import fill_domains
from echosim.ir.graph import Graph, Node, elementwise_fn
from echosim.ir.names import (
    all_steps_name,
    cell_of,
    is_cell_call,
    is_grad_accumulate,
    is_recurrent_step,
    recurrent_cell,
    recurrent_weight_use,
)
from echosim.ir.ops import (
    AttentionAttrs,
    CollectiveAttrs,
    CrossEntropyAttrs,
    ElementwiseAttrs,
    EmbeddingAttrs,
    MatmulAttrs,
    OpKind,
    Phase,
)

# PyTorch eager dispatch + a OneDNN primitive launch on CPU: a few µs per op.
# Assumed (no measurement in the validation data).
OP_OVERHEAD_US = 5.0
# One gloo ring step: a TCP send and receive through the kernel. Assumed: ~25 µs on
# loopback between sockets and ~50 µs over a datacentre Ethernet hop.
GLOO_LOOPBACK_STEP_US = 25.0
GLOO_NET_STEP_US = 50.0
# TCP over loopback is bounded by two kernel copies per message: assumed 10 GB/s.
GLOO_LOOPBACK_GBps = 10.0
# Zero-filling memory the process has just been given by the kernel: each 4 KiB page costs a
# page fault and the kernel's clear_page before the user's own fill, and returning it costs an
# munmap/trim. Assumed for a whole socket: ~1.3 us per page on one core (~3 GB/s; one core of a
# shared 2-core VM measured 1.9-2.2 GB/s, benchmarks/cpu_reality_nonllm.py), faulting on a few
# cores at once before the page-table and LRU locks serialise them: 10 GB/s. `echosim calibrate`
# measures it.
FRESH_MEMORY_GBps = 10.0
# glibc malloc (mallopt(3), malloc.c): a request of at least M_MMAP_THRESHOLD (DEFAULT_MMAP_THRESHOLD_MIN,
# 128 KiB, at start) is mapped for itself and unmapped when freed; a smaller one comes from the heap, and
# freed memory at the top of the heap beyond M_TRIM_THRESHOLD is given back to the kernel. The threshold is
# dynamic: freeing a mapped chunk larger than the threshold and at most DEFAULT_MMAP_THRESHOLD_MAX
# (4 * 1024 * 1024 * sizeof(long): 32 MiB on 64-bit) raises it to that chunk's size (its request plus the
# chunk header, rounded up to whole pages) and the trim threshold to twice that. So the threshold a
# training step runs under is set by the largest block freed before it (:func:`mmap_threshold_bytes`).
# Measured on this 2-core VM (torch 2.13, benchmarks/data/cpu_heap_thresholds.json,
# benchmarks/data/cpu_gloo_ddp_heap.json): the small DLRM's eight 2.56 MB table gradients, born each step in
# the dense backward and freed by zero_grad(set_to_none=True), fault ~2,500-4,400 pages a step in one process,
# where nothing that large is freed before the first optimizer step (AdamW's states are then mapped for
# themselves, and the gradients, heap-fed once the first zero_grad raised the threshold, sit at the heap's
# top and are trimmed); 0-48 pages when a block of 4-20 MB is freed before the first step (the states then
# come from the heap above the gradients, which are reused), and under DDP, whose constructor does that
# (DDP_BROADCAST_BUCKET_BYTES).
MMAP_THRESHOLD_BYTES = 128 * 1024
MMAP_THRESHOLD_MAX_BYTES = 4 * 1024 * 1024 * 8
# malloc.c: a mapped chunk is its request plus the chunk's size field (SIZE_SZ, 8 bytes on 64-bit) and the
# alignment padding of posix_memalign (c10's CPU allocator aligns to 64 bytes), rounded up to pages.
PAGE_BYTES = 4096
CHUNK_OVERHEAD_BYTES = 8 + 64
# torch.nn.parallel.DistributedDataParallel's constructor broadcasts rank 0's parameters and buffers
# (_sync_module_states -> dist._broadcast_coalesced) in flat buffers of up to broadcast_bucket_size =
# 250 MiB (torch/nn/parallel/distributed.py), filled tensor by tensor until one reaches the size
# (compute_bucket_assignment_by_size, torch/csrc/distributed/c10d/reducer.cpp); each buffer is freed after
# its broadcast, before the first step.
DDP_BROADCAST_BUCKET_BYTES = 250 * 1024 * 1024
# nn.EmbeddingBag on a CPU, beyond the bytes it moves (EmbeddingBag.cpp): each call (forward, and
# backward again) builds its bookkeeping in a dozen small aten ops (offsets, offset2bag by zeros +
# index_add + cumsum, bag sizes, max indices; in backward the sort's outputs and the bag numbers):
# assumed 12 ops x 5 us. The dense backward adds each looked-up row with its own BLAS axpy call
# (cpublas::axpy, dim elements): assumed 100 ns a row. `echosim calibrate` measures both.
BAG_CALL_US = 60.0
BAG_LOOKUP_NS = 100.0
# Bytes of one index: PyTorch promotes embedding_bag's indices and offsets to a common dtype,
# int64 from Python ids (EmbeddingBag.cpp, promoteIndicesAndOffsets).
INDEX_BYTES = 8
# A CPU GEMM (oneDNN / MKL, Goto and van de Geijn, "Anatomy of High-Performance Matrix Multiplication",
# ACM TOMS 34(3), 2008) packs its A and B operands into cache-sized panels and loads and stores each C
# tile around its register-blocked FMA microkernel: work proportional to m*k + k*n + m*n elements,
# outside the 2*m*n*k FLOPs the microkernel runs. ``gemm_pack_rows`` is that per-element work in
# rows of microkernel FMAs, so a GEMM runs at 1 / (1 + r/m + r/n + r/k) of the big-GEMM rate: a
# (batch x hidden) recurrent step's GEMM with m = 16 is ~25% slower per FLOP than a 2048-row one.
# 0 here (uncalibrated: all shapes at the big-GEMM rate); `echosim calibrate` fits it to matmuls of
# 1 to 2048 rows (measured on this 2-core Xeon VM, one thread: ~5 rows, fp32).
GEMM_PACK_ROWS = 0.0
# A training step's ops pay more host time than the same op called alone (``op_overhead_us``): autograd
# records a backward node for each forward op and its engine schedules each one in backward, parameters'
# gradients pass AccumulateGrad, and aten's composite ops dispatch their pieces (a linear on a 3-D input:
# t, view, mm, _unsafe_view). 0 here (uncalibrated); `echosim calibrate` measures it on a chain of tiny
# Linear + SiLU layers, forward and backward, whose kernels do no work (bench.AUTOGRAD_CHAIN): its time per
# IR node beyond ``op_overhead_us``. Measured on this 2-core VM: ~4 us a node beside ~1.4 us alone.
AUTOGRAD_OP_US = 0.0
# PyTorch trains a CPU LSTM layer with oneDNN's RNN primitive (fp32 and bf16 inputs: use_mkldnn,
# aten/src/ATen/native/RNN.cpp; mkldnn_rnn_layer and mkldnn_rnn_layer_backward, aten/src/ATen/native/mkldnn/RNN.cpp)
# and gives it the weights as views of the plain (ldigo) ATen tensors: "the weight reorder (if any) is handled
# automatically inside ideep" (RNN.cpp, "MKLDNN RNN integration notes", I.b). The primitive asks for blocked
# weights, so each call reorders them: the forward both weights (input and recurrent) into its layout; the
# backward both again into the backward primitive's layout and both weight gradients from its layout back into
# the plain tensors it returns. Seen with ONEDNN_VERBOSE=profile_exec (torch 2.13, oneDNN 3.12, 2 x 1 MiB fp32
# weights a layer): two weight reorders before each forward primitive, two before and two after each backward.
RNN_FORWARD_REORDERS_PER_WEIGHT = 1
RNN_BACKWARD_REORDERS_PER_WEIGHT = 2
# oneDNN's LSTM has four gates: the recurrent weight is (4 x hidden) x hidden.
LSTM_GATES = 4
# ... and the LSTM is the only cell PyTorch hands to it: ``lstm`` checks use_mkldnn, ``gru``, ``rnn_tanh`` and
# ``rnn_relu`` do not (aten/src/ATen/native/RNN.cpp, torch 2.13). Those run the native cells instead (below).
ONEDNN_RNN_CELLS = frozenset({"lstm"})


@dataclass(frozen=True, slots=True)
class NativeCell:
    """One time step of a cell PyTorch runs natively on a CPU (GRUCell, SimpleCell in RNN.cpp): the input
    projection of all steps is one linear, as in the fused layer, but each step is a linear of the state (addmm)
    then the cell's elementwise ops, one aten call each, each recorded by autograd; backward, autograd runs each
    step's nodes, gives each step's addmm its own weight-gradient GEMM (k = batch) and sums those into one
    gradient in its input buffer, one in-place add of the weight a step. Counts per step beyond the two GEMMs,
    tensors in units of one (batch x hidden) tensor read or written, from the cells' source and checked with
    torch.profiler (tests/test_native_rnn.py): forward kernels and the tensors they move; backward kernels
    (the state's and gates' gradients, the two chunk gradients a GRU concatenates, the recurrent bias's
    gradient: a sum and its step-by-step add) and theirs."""

    gates: int  # the gate blocks its weights stack: its gate gradient is gates x the state
    forward_kernels: int
    forward_tensors: int
    backward_kernels: int
    backward_tensors: int


#: GRU forward: add_, sigmoid_ (reset), add_, sigmoid_ (update), mul_, add, tanh_ (new), sub, mul_, add_ (state):
#: 17 reads and 10 writes. Backward: add, 2 add_, 4 mul, neg, 2 sigmoid_backward, tanh_backward (32), 2 cat of
#: three chunks (12), the bias's sum of (batch x 3h) (3) and its add_ (bias-sized). Elman RNN forward: add_ and
#: the activation (5); backward: add, the activation's backward (6), the bias's sum (1) and its add_.
NATIVE_CELLS = {
    "gru": NativeCell(gates=3, forward_kernels=10, forward_tensors=27, backward_kernels=15, backward_tensors=47),
    "rnn_tanh": NativeCell(gates=1, forward_kernels=2, forward_tensors=5, backward_kernels=4, backward_tensors=7),
    "rnn_relu": NativeCell(gates=1, forward_kernels=2, forward_tensors=5, backward_kernels=4, backward_tensors=7),
}
#: A cell the model's own loop calls (nn.LSTMCell, GRUCell, RNNCell: ``aten.lstm_cell``, ...; the LSTM's too, which
#: oneDNN does not run): the same gate math, but its projections are GEMMs of their own in the IR, each with its
#: weight gradient, and its biases' gradients are reductions of their own, so the counts leave those out. LSTM
#: forward: add_ (the two projections), sigmoid_ x3, tanh_, mul x2, add_ (the cell), tanh, mul (34: the gates' add
#: moves 12); backward: add_, 6 mul, 3 sigmoid_backward, 2 tanh_backward (36), a cat of four chunks (8). GRU
#: backward: 2 add_, 4 mul, neg, 2 sigmoid_backward, tanh_backward (29), 2 cat (12). RNN backward: the
#: activation's (3).
NATIVE_CELL_CALLS = {
    "lstm": NativeCell(gates=4, forward_kernels=10, forward_tensors=34, backward_kernels=13, backward_tensors=44),
    "gru": NativeCell(gates=3, forward_kernels=10, forward_tensors=27, backward_kernels=12, backward_tensors=41),
    "rnn_tanh": NativeCell(gates=1, forward_kernels=2, forward_tensors=5, backward_kernels=1, backward_tensors=3),
    "rnn_relu": NativeCell(gates=1, forward_kernels=2, forward_tensors=5, backward_kernels=1, backward_tensors=3),
}
# Attention's block products can outrun the big-GEMM rate (their blocks stay in cache) but not by much: a bound
# for the calibration's search, twice the big-GEMM rate.
ATTENTION_EFF_MAX = 2.0


@dataclass(frozen=True, slots=True)
class CPUSpec:
    """One CPU socket. Peaks are derived theoretical figures (hw_specs.csv), bandwidths GB/s."""

    name: str
    peak_bf16_tflops: float
    peak_fp32_tflops: float
    ddr_GB: float
    ddr_GBps: float
    stream_fraction: float  # achievable share of DDR bandwidth (assumed)
    gemm_eff_bf16: float  # achievable share of the bf16 peak (assumed)
    gemm_eff_fp32: float  # achievable share of the fp32 peak (assumed)
    sockets_per_node: int
    nic_GBps: float  # node Ethernet NIC per direction (assumed), shared by its sockets
    source: str
    # Calibratable (``echosim calibrate`` fits them on the machine it runs on); defaults assumed, see above.
    op_overhead_us: float = OP_OVERHEAD_US
    gloo_loopback_step_us: float = GLOO_LOOPBACK_STEP_US
    gloo_net_step_us: float = GLOO_NET_STEP_US
    gloo_loopback_GBps: float = GLOO_LOOPBACK_GBps
    # Kernels that evaluate transcendentals or reduce rows (GELU, SiLU, norms, softmax, cross
    # entropy) run on a core's vector units below streaming speed: their share of it.
    math_fraction: float = 1.0
    # Attention kernels' block products (head_dim wide) as a multiple of the big-GEMM rate: below 1 for
    # their small products, above it where blocks that stay in a core's L1/L2 outrun big GEMMs whose operands
    # stream from DRAM (calibrated 0.7-1.0 on one thread here, at most ATTENTION_EFF_MAX).
    attention_eff: float = 1.0
    # Allocating, zero-filling and returning memory the kernel maps fresh (page faults), GB/s.
    fresh_memory_GBps: float = FRESH_MEMORY_GBps
    # One embedding_bag call's bookkeeping ops (us), and a looked-up row's axpy in its backward (ns).
    bag_call_us: float = BAG_CALL_US
    bag_lookup_ns: float = BAG_LOOKUP_NS
    # A memory-bound op whose bytes fit in this much cache (a core's L2 per thread; 0: no cache
    # regime) finds its operands there, written by the op before, and moves them at cache_GBps;
    # a larger one streams from DRAM at ddr_GBps x stream_fraction. `echosim calibrate` derives the
    # size from the OS and measures both rates, the DRAM one with the caches evicted (bench.CacheEvictor).
    cache_bytes: float = 0.0
    cache_GBps: float = 100.0
    # Work per operand element outside a GEMM's microkernel, in rows of FMAs (GEMM_PACK_ROWS; 0: none).
    gemm_pack_rows: float = GEMM_PACK_ROWS
    # Host time a forward or backward op of a training step adds to ``op_overhead_us`` (AUTOGRAD_OP_US; 0: none).
    autograd_op_us: float = AUTOGRAD_OP_US

    def __post_init__(self) -> None:
        who = f"device {self.name or '<unnamed>'!r}"
        if not self.name:
            raise ValueError(f"{who}: field 'name' is missing")
        if not self.source.strip():
            raise ValueError(f"{who}: field 'source' is missing (every number needs a source)")
        for f in fields(self):
            if f.name in ("name", "source"):
                continue
            value = getattr(self, f.name)
            if f.name in ("cache_bytes", "gemm_pack_rows", "autograd_op_us") and value == 0:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{who}: field {f.name!r} must be a positive number, got {value!r}")
        if self.attention_eff > ATTENTION_EFF_MAX:
            raise ValueError(f"{who}: field 'attention_eff' is at most {ATTENTION_EFF_MAX}, got {self.attention_eff!r}")
        for name in ("stream_fraction", "gemm_eff_bf16", "gemm_eff_fp32", "math_fraction"):
            if getattr(self, name) > 1:
                raise ValueError(f"{who}: field {name!r} is a fraction, got {getattr(self, name)!r} > 1")

    def peak_tflops(self, dtype: str) -> float:
        return self.peak_fp32_tflops if dtype in ("fp32", "tf32", "fp32-simt") else self.peak_bf16_tflops

    def gemm_eff(self, dtype: str) -> float:
        return self.gemm_eff_fp32 if dtype in ("fp32", "tf32", "fp32-simt") else self.gemm_eff_bf16


_XEON = "https://www.intel.com/content/www/us/en/products/sku/231746/intel-xeon-platinum-8480-processor-105m-cache-2-00-ghz/specifications.html"
_EPYC = "https://www.amd.com/en/products/processors/server/epyc/4th-generation-9004-and-8004-series/amd-epyc-9654.html"
_ASSUMED = "no x86 STREAM/GEMM measurement in the validation data (gap 7)"

# Generic x86: one socket of a Sapphire Rapids Xeon Platinum 8480+ with AMX.
CPU_X86 = CPUSpec(
    name="cpu-x86",
    peak_bf16_tflops=114.7,  # Source: hw_specs.csv (derived: 56 cores x 1024 AMX FLOP/cycle x 2.0 GHz)
    peak_fp32_tflops=7.2,  # Source: hw_specs.csv (derived: 56 x 64 FLOP/cycle x 2.0 GHz)
    ddr_GB=512.0,  # Assumed: 8 channels x 64 GB DIMMs (a common configuration, not a specification)
    ddr_GBps=307.2,  # Source: hw_specs.csv (8 ch x DDR5-4800 x 8 B)
    stream_fraction=0.8,  # Assumed: STREAM triad typically reaches ~80% of DDR peak on servers
    gemm_eff_bf16=0.5,  # Assumed: AMX clocks drop under load (hw_specs.csv notes); half of the derived peak
    gemm_eff_fp32=0.8,  # Assumed: AVX-512 FMA GEMMs (oneDNN) run near peak
    sockets_per_node=2,  # Source: hw_specs.csv (2-socket node)
    nic_GBps=100.0 / 8,  # Assumed: one 100 GbE NIC per node
    source=f"{_XEON} ; https://en.wikipedia.org/wiki/Advanced_Matrix_Extensions ; https://realgenius.tistory.com/207",
)

EPYC_9654 = CPUSpec(
    name="epyc-9654",
    peak_bf16_tflops=14.7,  # Source: hw_specs.csv (derived: AVX512_BF16 ~2x fp32; no matrix engine)
    peak_fp32_tflops=7.37,  # Source: hw_specs.csv (derived: 96 cores x 32 FLOP/cycle x 2.4 GHz)
    ddr_GB=768.0,  # Assumed: 12 channels x 64 GB DIMMs
    ddr_GBps=460.8,  # Source: hw_specs.csv (12 ch x DDR5-4800 x 8 B)
    stream_fraction=0.8,  # Assumed, as for cpu-x86
    gemm_eff_bf16=0.8,  # Assumed: vector units, no tile engine whose clock drops
    gemm_eff_fp32=0.8,  # Assumed
    sockets_per_node=2,  # Source: hw_specs.csv
    nic_GBps=100.0 / 8,  # Assumed: one 100 GbE NIC per node
    source=f"{_EPYC} ; https://infohub.delltechnologies.com/en-us/p/ddr5-memory-bandwidth-for-next-generation-poweredge-servers-featuring-4th-gen-amd-epyc-processors/",
)

CPUS: dict[str, CPUSpec] = {c.name: c for c in (CPU_X86, EPYC_9654)}


def _itemsize(dtype: str) -> int:
    return {"fp8": 1, "bf16": 2, "fp16": 2, "fp32": 4}.get(dtype, 4)


def gemm_shape_factor(cpu: CPUSpec, m: int, n: int, k: int) -> float:
    """How much longer than at the big-GEMM rate a GEMM's FLOPs take: packing A and B and updating C
    cost ``gemm_pack_rows`` microkernel rows per element (GEMM_PACK_ROWS), 1 + r/m + r/n + r/k."""
    r = cpu.gemm_pack_rows
    return 1.0 + r / m + r / n + r / k


def _gemm_flops_per_s(cpu: CPUSpec, dtype: str) -> float:
    """The big-GEMM rate: peak x the calibrated GEMM efficiency (shape factors aside)."""
    return cpu.peak_tflops(dtype) * 1e12 * cpu.gemm_eff(dtype)


def matmul_time_s(cpu: CPUSpec, m: int, n: int, k: int, batch: int = 1, dtype: str = "fp32") -> float:
    """A roofline: the FLOPs at the shape's GEMM rate (:func:`gemm_shape_factor`) or the operands' bytes at
    the DRAM rate; plus the per-op overhead."""
    if min(m, n, k, batch) <= 0:
        raise ValueError(f"matmul dims must be positive, got m={m} n={n} k={k} batch={batch}")
    compute = 2.0 * batch * m * n * k / _gemm_flops_per_s(cpu, dtype)
    compute *= gemm_shape_factor(cpu, m, n, k)
    traffic = batch * (m * k + k * n + m * n) * _itemsize(dtype) / (cpu.ddr_GBps * 1e9 * cpu.stream_fraction)
    return max(compute, traffic) + cpu.op_overhead_us * 1e-6


def memory_bound_time_s(
    cpu: CPUSpec, nbytes: int, vector_math: bool = False, written: int = 0, inplace: bool = False
) -> float:
    """Bytes at the rate of where they sit, plus the per-op overhead.

    Up to ``cache_bytes`` at the cache rate, beyond it at the DRAM rate. ``written``: the bytes of
    ``nbytes`` the op writes. Out of place, each written line beyond the caches is first read from
    DRAM (write-allocate: a store that misses the cache fetches the line for ownership before it
    writes it; Intel 64 and IA-32 Architectures Optimization Reference Manual, "non-temporal stores",
    and STREAM's FAQ on the bytes it does not count), so DRAM moves ``nbytes + written``;
    ``inplace``, the op writes lines it has just read and moves ``nbytes``, and only
    ``nbytes - written`` distinct bytes have to fit in the cache. ``ddr_GBps x stream_fraction`` is
    that DRAM traffic rate (`echosim calibrate` fits it on samples of both kinds). A
    ``vector_math`` kernel is also bound by its arithmetic: a roofline, its bytes at no more than
    ``math_fraction x stream_fraction x ddr_GBps``, wherever they sit.
    """
    if nbytes < 0 or written < 0:
        raise ValueError(f"byte counts must be non-negative, got {nbytes} moved, {written} written")
    stream = cpu.ddr_GBps * 1e9 * cpu.stream_fraction
    resident = nbytes - written if inplace else nbytes
    if resident <= cpu.cache_bytes:
        seconds = nbytes / (cpu.cache_GBps * 1e9)
    else:
        seconds = (nbytes if inplace else nbytes + min(written, nbytes)) / stream
    if vector_math:
        seconds = max(seconds, nbytes / (stream * cpu.math_fraction))
    return seconds + cpu.op_overhead_us * 1e-6


def mapped_chunk_bytes(nbytes: int) -> int:
    """Bytes of the chunk glibc maps for a tensor of ``nbytes`` (CHUNK_OVERHEAD_BYTES, whole pages)."""
    return -(-(nbytes + CHUNK_OVERHEAD_BYTES) // PAGE_BYTES) * PAGE_BYTES


def mmap_threshold_bytes(freed: Iterable[int]) -> int:
    """glibc's mmap threshold after blocks of these sizes (bytes, in order) were allocated and freed.

    A block at or above the threshold when it is allocated is mapped for itself; freeing it raises the
    threshold to its chunk's size (:func:`mapped_chunk_bytes`) when that is larger and at most
    MMAP_THRESHOLD_MAX_BYTES. A smaller block came from the heap and leaves the threshold alone.
    """
    threshold = MMAP_THRESHOLD_BYTES
    for nbytes in freed:
        if nbytes >= threshold:  # mapped for itself
            chunk = mapped_chunk_bytes(nbytes)
            if threshold < chunk <= MMAP_THRESHOLD_MAX_BYTES:
                threshold = chunk
    return threshold


def ddp_broadcast_buckets(sizes: Sequence[int], limit: int = DDP_BROADCAST_BUCKET_BYTES) -> list[int]:
    """Bytes of the flat buffers DDP's constructor broadcasts ``sizes`` (its parameters and buffers) in:
    tensors in order, a buffer closed once it reaches ``limit`` (DDP_BROADCAST_BUCKET_BYTES)."""
    buckets, current = [], 0
    for nbytes in sizes:
        current += nbytes
        if current >= limit:
            buckets.append(current)
            current = 0
    return [*buckets, current] if current else buckets


def _param_grad(graph: Graph, node: Node) -> bool:
    return node.id in graph.derived("cpu-param-grads", lambda: frozenset(graph.grads.values()))


def step_mmap_threshold_bytes(graph: Graph) -> int:
    """The mmap threshold a rank's training steps run under (:func:`mmap_threshold_bytes`), from what its
    program frees before the first optimizer step: its forward and backward tensors but the parameters'
    gradients (freed by the next step's zero_grad, after the optimizer step), and under PyTorch DDP (gradient
    buckets its reducer copies into) the parameter broadcast of its constructor (:func:`ddp_broadcast_buckets`).
    Later frees raise it too, but by then the optimizer's states are mapped for themselves and the heap-fed
    gradients are trimmed from the heap's top each step (MMAP_THRESHOLD_BYTES): the steps still fault."""
    freed: list[int] = []
    if any(isinstance(n.attrs, CollectiveAttrs) and n.attrs.bucket_copy for n in graph):
        freed += ddp_broadcast_buckets([p.out.nbytes for p in graph.params()])
    for n in graph:
        if n.phase is Phase.OPTIMIZER or n.op in (OpKind.VIEW, OpKind.INPUT, OpKind.PARAMETER) or n.op.is_collective:
            continue
        if not is_inplace(n) and not _param_grad(graph, n):
            freed.append(n.out.nbytes)
    return mmap_threshold_bytes(freed)


def fresh_fill_time_s(cpu: CPUSpec, nbytes: int, threshold: int = MMAP_THRESHOLD_BYTES) -> float:
    """A tensor of ``nbytes`` allocated and zero-filled each step and freed in bulk at the next: at the
    fresh-page rate when glibc maps it for itself (at or above the mmap ``threshold``), else at the
    streaming rate (reused from the heap)."""
    if nbytes < threshold:
        return memory_bound_time_s(cpu, nbytes)  # reused from the heap: an ordinary fill
    return nbytes / (cpu.fresh_memory_GBps * 1e9) + cpu.op_overhead_us * 1e-6


def embedding_dense_backward_time_s(cpu: CPUSpec, table_bytes: int, rows: int, lookups: int, row_bytes: int,
                                    streamed_bytes: int, bag: bool,
                                    threshold: int = MMAP_THRESHOLD_BYTES) -> float:  # fmt: skip
    """PyTorch's CPU backward of a dense (``sparse=False``) embedding or embedding_bag table.

    Both kernels start with ``at::zeros`` of the whole ``rows x dim`` gradient (Embedding.cpp
    ``embedding_dense_backward_cpu``, EmbeddingBag.cpp ``_embedding_bag_dense_backward_cpu``):
    a table-sized tensor born every step and freed at the next ``zero_grad``, so on a CPU its
    pages come fresh from the kernel from the mmap ``threshold`` up (:func:`fresh_fill_time_s`).
    Then each of the ``lookups`` ids adds its output-gradient row into its table row (read the row of dy, read and write
    the gradient row). ``embedding_bag`` first sorts the ids (``indices.sort()``: a comparison
    sort's log2(n) passes over ids and positions), gathers their bag numbers and counts the
    ids per table row in a zeroed ``std::vector`` of ``rows`` indices (``compute_counts``).
    ``streamed_bytes``: the output gradient and ids read once. ``embedding_bag`` also pays its
    call's bookkeeping (``bag_call_us``) and one axpy call per looked-up row (``bag_lookup_ns``).
    """
    if min(table_bytes, rows, row_bytes) <= 0 or lookups < 0 or streamed_bytes < 0:
        raise ValueError(
            f"embedding backward needs a table, got {table_bytes} B, {rows} rows, {row_bytes} B a row, "
            f"{lookups} lookups, {streamed_bytes} B streamed"
        )
    time = fresh_fill_time_s(cpu, table_bytes, threshold)
    stream = streamed_bytes + 2 * lookups * row_bytes
    if bag and lookups:
        ids = lookups * INDEX_BYTES
        stream += rows * INDEX_BYTES + 2 * ids  # the zeroed counts, the bag numbers gathered
        # the sort compares and branches rather than streams: at the vector-math rate
        time += memory_bound_time_s(cpu, 2 * ids * max(1, math.ceil(math.log2(lookups))), vector_math=True)
        time += cpu.op_overhead_us * 1e-6  # the index_select
        time += cpu.bag_call_us * 1e-6 + lookups * cpu.bag_lookup_ns * 1e-9
    return time + memory_bound_time_s(cpu, stream)


def rnn_weight_reorder_bytes(node: Node) -> list[int]:
    """Bytes of each weight oneDNN reorders for the recurrent-layer call ``node`` stands for (RNN_*_REORDERS_*):
    at the forward input projection (MatmulAttrs n = 4h, k = inputs) the input weight n x k and the recurrent
    weight n x n/4, once each; at a weight gradient (its output, the weight's size) that weight in and its
    gradient out. Empty for any other node."""
    use = recurrent_weight_use(node.name)
    if not use or recurrent_cell(node.name) not in ONEDNN_RNN_CELLS:  # the cheap suffix test first: every node
        return []
    if use == "forward" and isinstance(node.attrs, MatmulAttrs) and node.phase is not Phase.BACKWARD:
        item = node.out.dtype.itemsize
        a = node.attrs
        weights = [a.n * a.k * item, a.n * (a.n // LSTM_GATES) * item]
        return weights * RNN_FORWARD_REORDERS_PER_WEIGHT
    if use == "wgrad" and node.phase is Phase.BACKWARD:
        return [node.out.nbytes] * RNN_BACKWARD_REORDERS_PER_WEIGHT
    return []


def native_step_time_s(backend: CPUBackend, node: Node, io_bytes: int, cell: NativeCell) -> float:
    """A node of a natively run cell's time steps (:class:`NativeCell`) as PyTorch runs it on a CPU: the step's
    GEMMs as they are; its gate kernel (forward) or gate-gradient kernel (backward) as the cell's elementwise
    kernels, each with its own call; autograd's host time for each of those calls. The recurrent weight's
    gradient, one GEMM over all steps in the IR (k = batch x steps, its inputs each step's state and gate
    gradient), is one GEMM a step and a weight-sized in-place add a step after the first."""
    cpu = backend.cpu
    autograd = cpu.autograd_op_us * 1e-6
    a = node.attrs
    if isinstance(a, MatmulAttrs) and node.name.endswith(f"{all_steps_name('', 'h')}.wgrad"):
        steps = max(1, len(node.inputs) // 2)
        dtype = backend.compute_dtype(node)
        gemm = matmul_time_s(cpu, a.m, a.n, max(1, a.k // steps), a.batch, dtype)
        weight = node.out.nbytes
        add = memory_bound_time_s(cpu, 3 * weight, written=weight, inplace=True)
        return steps * gemm + (steps - 1) * add
    if isinstance(a, MatmulAttrs):  # the step's addmm forward, its data gradient backward: one call each
        return KernelBackend.op_time_s(backend, node, io_bytes) + autograd
    if not cell_of(elementwise_fn(node).removesuffix("_grad")):  # not the gate kernel or its gradient
        return KernelBackend.op_time_s(backend, node, io_bytes) + (autograd if node.op is not OpKind.VIEW else 0.0)
    forward = node.phase is not Phase.BACKWARD
    state = node.out.nbytes if forward else node.out.nbytes // cell.gates
    kernels = cell.forward_kernels if forward else cell.backward_kernels
    tensors = cell.forward_tensors if forward else cell.backward_tensors
    moved = memory_bound_time_s(cpu, tensors * state, is_math_kernel(node), written=kernels * state)
    return moved + (kernels - 1) * cpu.op_overhead_us * 1e-6 + kernels * autograd


def reorder_time_s(cpu: CPUSpec, nbytes: int) -> float:
    """One oneDNN reorder of a ``nbytes`` tensor into another buffer: read it and write it out of place."""
    return memory_bound_time_s(cpu, 2 * nbytes, written=nbytes)


def embedding_bag_forward_time_s(cpu: CPUSpec, io_bytes: int) -> float:
    """A pooled lookup: its bytes at the streaming rate plus the call's bookkeeping ops (``bag_call_us``)."""
    return memory_bound_time_s(cpu, io_bytes) + cpu.bag_call_us * 1e-6


#: PyTorch's CPU flash attention (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp, fp32, bf16 and fp16, forward
#: and backward) splits the queries into blocks of 256 rows from 768 queries up, of 64 from 192, else of 32
#: ((min queries, rows) pairs), and the keys into blocks of 512 columns.
FLASH_Q_SPLITS = ((768, 256), (192, 64), (0, 32))
FLASH_KV_SPLIT = 512
#: Block products of the kernel a (query block, key block) pair: forward q k^T and p v; backward q k^T again
#: (the probabilities rebuilt from the saved log-sum-exp), p^T dO, dO v^T, ds k and ds^T q.
FLASH_FORWARD_PRODUCTS = 2
FLASH_BACKWARD_PRODUCTS = 5


@functools.lru_cache(maxsize=1024)
def flash_blocks(q_len: int, kv_len: int, causal: bool) -> tuple[float, int, int]:
    """(share of the q x kv scores PyTorch's CPU flash kernel computes, its query rows a block, its keys a block).

    A causal kernel stops each query block at the key block holding its last row's last visible key, but
    computes that key block whole (``kvBlockSize = min(kvSplitSize, kvSize - n)``) and masks it after the
    product: under 512 keys it computes every score, as many as without the mask; at 1,024 three quarters,
    at 2,048 five eighths (measured on this VM in a quiet window, causal over full time, forward and
    backward: 0.94-1.05, 0.93-1.01, 0.76-0.81, 0.62-0.65 for 256, 512, 1,024, 2,048 queries;
    ``benchmarks/data/cpu_attention_blocks.json``). Rows see keys up to their own position aligned to the
    end of the keys, as :func:`echosim.ir.ops.causal_fraction`.
    """
    if min(q_len, kv_len) <= 0:
        raise ValueError(f"attention needs queries and keys, got {q_len} x {kv_len}")
    rows = min(next(split for least, split in FLASH_Q_SPLITS if q_len >= least), q_len)
    cols = min(FLASH_KV_SPLIT, kv_len)
    if not causal:
        return 1.0, rows, cols
    computed = 0
    for m in range(0, q_len, rows):
        block = min(rows, q_len - m)
        keys = min(m + block + kv_len - q_len, kv_len)  # the block's last row sees keys [0, keys)
        if keys > 0:
            computed += block * min(math.ceil(keys / cols) * cols, kv_len)
    return computed / (q_len * kv_len), rows, cols


def attention_time_s(cpu: CPUSpec, a: AttentionAttrs, dtype: str, backward: bool = False) -> float:
    """The block products and the softmax over the scores PyTorch's CPU attention computes.

    Its flash kernel (fp32/bf16; the math path otherwise) multiplies query blocks by key blocks
    (:func:`flash_blocks`): two products a block forward (q k^T, p v), five backward (q k^T again
    to rebuild the probabilities from the saved log-sum-exp, then dv, dp, dq and dk), at
    ``attention_eff`` of the big-GEMM rate whatever the block shape (full attention's time per
    score at 1,024 and 2,048 queries is 0.81-1.17 of 512's over four quiet runs, no consistent sign;
    at 256 it is 1.00-1.40 forward and backward, a per-row cost left out); the exponentials over the
    computed scores run at the vector-math rate. A sliding window is not
    skipped: PyTorch's CPU SDPA has no window argument, a windowed model passes a mask, and the
    masked kernels compute every block up to the diagonal.
    """
    bh = a.batch * a.heads
    keep = flash_blocks(a.q_len, a.kv_len, a.causal)[0]
    scores = bh * a.q_len * a.kv_len * keep
    product = scores * 2 * a.head_dim / (_gemm_flops_per_s(cpu, dtype) * cpu.attention_eff)
    # backward reads the scores three times (rebuilt probabilities, dp, ds), forward twice
    products, passes = (FLASH_BACKWARD_PRODUCTS, 3) if backward else (FLASH_FORWARD_PRODUCTS, 2)
    softmax = memory_bound_time_s(cpu, passes * int(scores * _itemsize(dtype)), vector_math=True)
    return products * product + softmax + cpu.op_overhead_us * 1e-6


def check_placement(cpu: CPUSpec, p: Placement) -> None:
    if p.size < 1 or p.nodes < 1 or p.per_node < 1 or p.concurrent_per_node < 1:
        raise ValueError(f"placement fields must be >= 1, got {p}")
    if p.size != p.nodes * p.per_node:
        raise ValueError(f"placement size {p.size} != nodes {p.nodes} x per_node {p.per_node}")
    if p.per_node * p.concurrent_per_node > cpu.sockets_per_node:
        raise ValueError(
            f"placement puts {p.per_node} x {p.concurrent_per_node} ranks on a node of "
            f"{cpu.sockets_per_node} {cpu.name} sockets"
        )


def collective_time_s(cpu: CPUSpec, kind: OpKind, nbytes: int, p: Placement) -> float:
    """gloo: a ring of TCP messages; the slowest hop (NIC shared by the node's ranks, or loopback) sets the pace."""
    if nbytes < 0:
        raise ValueError(f"byte count must be non-negative, got {nbytes}")
    check_placement(cpu, p)
    n = p.size
    if n == 1 or nbytes == 0:
        return 0.0
    if p.nodes > 1:
        step_us, bw = cpu.gloo_net_step_us, cpu.nic_GBps / (p.per_node * p.concurrent_per_node)
    else:
        step_us, bw = cpu.gloo_loopback_step_us, cpu.gloo_loopback_GBps
    if kind in (OpKind.SEND, OpKind.RECV):
        steps, chunk = 1, float(nbytes)
    elif kind is OpKind.ALL_REDUCE:
        steps, chunk = 2 * (n - 1), nbytes / n
    elif kind in (OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER, OpKind.ALL_TO_ALL):
        steps, chunk = n - 1, nbytes / n
    elif kind is OpKind.BROADCAST:
        steps, chunk = math.ceil(math.log2(n)), float(nbytes)
    else:
        raise ValueError(f"{kind.value} is not a collective")
    return steps * (step_us * 1e-6 + chunk / (bw * 1e9))


MATH_OPS = frozenset({OpKind.NORM, OpKind.SOFTMAX, OpKind.CROSS_ENTROPY})
# PyTorch's CPU cross entropy materialises the log-probabilities (log_softmax + nll_loss): the
# forward writes a second logits-sized tensor, the backward zero-fills the gradient, reads the
# saved log-probabilities and writes the gradient. That is twice the traffic the IR counts
# (logits in; dy, logits in and gradient out) in either direction.
CROSS_ENTROPY_PASSES = 2
MATH_FUNCTIONS = frozenset({"gelu", "silu", "tanh", "sigmoid", "exp", "log", "softmax", "erf"})


def is_math_kernel(node: Node) -> bool:
    """A kernel bound by vector math rather than by memory on a CPU core (forward or gradient)."""
    if node.op in MATH_OPS:
        return True
    if isinstance(node.attrs, ElementwiseAttrs):
        return node.attrs.flops_per_element > 2 or node.attrs.fn.removesuffix("_grad") in MATH_FUNCTIONS
    return False


def is_inplace(node: Node) -> bool:
    """An op that writes over operands it reads: an optimizer step (torch.optim updates parameters and
    states in place; fused AdamW is one in-place kernel, ``_fused_adamw_``) or autograd's gradient sum.

    Autograd sums the gradients a tensor receives from several consumers in place: ``InputBuffer::accumulate``
    adds into the first gradient when it holds its last reference (torch/csrc/autograd/input_buffer.cpp),
    ``AccumulateGrad`` into a parameter's ``.grad`` (accumulate_grad.h); the IR names its sums so
    (:func:`echosim.ir.names.is_grad_accumulate`)."""
    if node.op is OpKind.OPTIMIZER_UPDATE:
        return True
    return node.op is OpKind.ELEMENTWISE and is_grad_accumulate(node.name)


class CPUBackend(KernelBackend):
    """A CPU socket in a 2-socket node, ranks connected by gloo."""

    #: PyTorch's CPU allocator hands each tensor its own allocation: no CUDA caching allocator blocks.
    caching_allocator = False
    #: Dropout's fused kernel (native_dropout, a bool mask) runs only on CUDA, XPU, lazy and
    #: privateuse1 tensors (is_fused_kernel_acceptable, aten/src/ATen/native/Dropout.cpp, torch 2.x):
    #: on CPU, dropout multiplies by a noise tensor in the input's dtype, which the product saves.
    fused_dropout = False

    def __init__(
        self, cpu: CPUSpec, overlap: OverlapModel | None = None, mmap_threshold: int = MMAP_THRESHOLD_BYTES
    ) -> None:
        self.cpu = cpu
        self.name = cpu.name
        # gloo runs on its own threads and copies through memory: overlapped memory-bound ops
        # share DDR bandwidth with its copies (two per byte received); assumed 1.1x.
        self._overlap = overlap if overlap is not None else OverlapModel(1.0, 1.0, 1.1)
        # glibc's mmap threshold the rank's steps run under (for_program); tensors below it are heap-fed
        self.mmap_threshold = mmap_threshold
        self._programs: dict[int, CPUBackend] = {}

    def for_program(self, graph: Graph) -> CPUBackend:
        """This backend for the steps of one rank's program ``graph``: its fresh-page fills priced under the mmap
        threshold the program leaves (:func:`step_mmap_threshold_bytes`). One object per threshold, so that
        costs cached by backend are shared by the programs that leave the same one."""
        threshold = graph.derived("cpu-mmap-threshold", lambda: step_mmap_threshold_bytes(graph))
        if threshold == self.mmap_threshold:
            return self
        known = self._programs.get(threshold)
        if known is None:
            known = self._programs[threshold] = CPUBackend(self.cpu, self._overlap, threshold)
        return known

    def __repr__(self) -> str:
        return f"CPUBackend({self.cpu.name!r})"

    def node_devices(self, devices: int) -> int:
        """A job's node is one machine: its sockets, one rank each."""
        return fill_domains(devices, self.cpu.sockets_per_node)

    DTYPES = ("bf16", "fp16", "fp32")
    FALLBACK_DTYPE = "fp32"

    def op_time_s(self, node: Node, io_bytes: int) -> float:
        """The kernel's time, plus autograd's host time per op for the forward and backward ops of a step
        (not for the time steps of a fused recurrent layer: one call runs them all), plus oneDNN's weight
        reorders where the node stands for a recurrent layer's call (:func:`rnn_weight_reorder_bytes`). The
        time steps of a cell PyTorch runs natively, and every cell the model's loop calls, are their aten calls
        (:func:`native_step_time_s`)."""
        cell = None
        if is_recurrent_step(node.name):
            cell = (NATIVE_CELL_CALLS if is_cell_call(node.name) else NATIVE_CELLS).get(recurrent_cell(node.name))
        if cell is not None:
            return native_step_time_s(self, node, io_bytes, cell)
        seconds = super().op_time_s(node, io_bytes)
        seconds += sum(reorder_time_s(self.cpu, b) for b in rnn_weight_reorder_bytes(node))
        if seconds and node.phase is not Phase.OPTIMIZER and not is_recurrent_step(node.name):
            seconds += self.cpu.autograd_op_us * 1e-6  # forward, backward or recomputed forward
        return seconds

    def matmul_cost_s(self, a: MatmulAttrs, dtype: str) -> float:
        return matmul_time_s(self.cpu, a.m, a.n, a.k, a.batch, dtype)

    def attention_cost_s(self, a: AttentionAttrs, dtype: str, backward: bool) -> float:
        return attention_time_s(self.cpu, a, dtype, backward)

    def memory_cost_s(self, node: Node, io_bytes: int) -> float:
        a = node.attrs
        if isinstance(a, EmbeddingAttrs) and not a.sparse and node.phase is Phase.BACKWARD:  # a dense table's gradient
            return self._dense_embedding_backward_s(node, a, io_bytes)
        if isinstance(a, EmbeddingAttrs) and a.lookups and not a.sparse:  # nn.EmbeddingBag's forward
            return embedding_bag_forward_time_s(self.cpu, io_bytes)
        if node.op is OpKind.CROSS_ENTROPY and not (isinstance(a, CrossEntropyAttrs) and a.kernel):
            # (a framework's own loss kernels, CrossEntropyAttrs.kernel, are counted whole by flops.io_bytes)
            io_bytes *= CROSS_ENTROPY_PASSES
            if node.phase is Phase.BACKWARD:
                # nll_loss's backward starts from at::zeros of the logits' size (LossNLL.cpp): a tensor
                # born every step, at the fresh-page rate from the mmap threshold up (fresh_fill_time_s)
                fill = node.out.nbytes
                rest = memory_bound_time_s(self.cpu, max(0, io_bytes - fill), vector_math=True)
                return fresh_fill_time_s(self.cpu, fill, self.mmap_threshold) + rest
        # a lookup or a sparse gradient writes rows of its output, not all of it: no write share counted
        written = 0 if node.op is OpKind.EMBEDDING else node.out.nbytes
        return memory_bound_time_s(self.cpu, io_bytes, is_math_kernel(node), written, is_inplace(node))

    def _dense_embedding_backward_s(self, node: Node, a: EmbeddingAttrs, io_bytes: int) -> float:
        """The IR's dense table backward (``io_bytes`` = table gradient + output gradient + ids) as
        PyTorch runs it on a CPU. A pooled table knows its ``lookups``; a plain embedding has one
        output-gradient row and one id per lookup, so its lookups follow from the bytes."""
        table = node.out.nbytes
        row = a.dim * node.out.dtype.itemsize
        streamed = max(0, io_bytes - table)
        lookups = a.lookups or streamed // (row + INDEX_BYTES)
        rows = max(1, node.out.numel // max(1, a.dim))
        return embedding_dense_backward_time_s(
            self.cpu, table, rows, lookups, row, streamed, bag=a.lookups > 0, threshold=self.mmap_threshold
        )

    def collective_time_s(self, kind: OpKind, nbytes: int, placement: Placement) -> float:
        return collective_time_s(self.cpu, kind, nbytes, placement)

    def memory_bytes(self) -> int:
        return int(self.cpu.ddr_GB * 2**30)

    def peak_bandwidth_Bps(self, path: str) -> float:
        """Bytes/s per socket: DDR (``memory``), or what can reach it (``links``: copies within the node
        go through DDR, plus the node's NIC)."""
        if path == "memory":
            return self.cpu.ddr_GBps * 1e9
        return (self.cpu.ddr_GBps + self.cpu.nic_GBps) * 1e9

    def peak_flops(self, dtype: str) -> float:
        return self.cpu.peak_tflops(dtype) * 1e12

    def describe(self) -> dict[str, object]:
        d = asdict(self.cpu)
        d.update(kind="cpu", devices_per_node=self.cpu.sockets_per_node, overlap=asdict(self._overlap))
        assumed = "ddr_GB, stream_fraction, gemm_eff_*, nic_GBps, gloo latencies, fresh_memory_GBps, bag_*"
        d["assumed"] = f"{assumed}: {_ASSUMED}"
        return d
