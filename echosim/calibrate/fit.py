"""Fit a backend's efficiency parameters to microbenchmark samples, and describe the machine.

A fit changes only named fields of the backend's spec, each bounded, by minimising the
mean squared log error between the backend's own cost functions and the samples
(coordinate descent with a golden-section search per parameter): the fitted backend is
the shipped model with measured efficiencies, not a curve drawn through the points.

Identity fields that a machine determines but a microbenchmark does not (peaks, cores per
rank, memory per rank) are derived from the machine and stored with the calibration; they
are listed apart from the fitted ones.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from echosim.calibrate.bench import Sample, compute_cores, physical_cores


@dataclass(frozen=True)
class Knob:
    """One fitted parameter: a spec field, its bounds and what it means."""

    name: str
    lo: float
    hi: float
    what: str


#: CPU backend parameters a calibration fits (echosim.backends.cpu.CPUSpec fields).
CPU_KNOBS = (
    Knob("gemm_eff_fp32", 0.02, 1.0, "fp32 matmul rate as a fraction of the derived fp32 peak"),
    Knob("gemm_eff_bf16", 0.001, 1.0, "bf16 matmul rate as a fraction of the bf16 peak"),
    Knob("gemm_pack_rows", 0.01, 1000.0, "matmul work per operand element outside the microkernel, rows of FMAs"),
    Knob("stream_fraction", 0.02, 1.0, "streaming kernels' DRAM traffic (copy, add, mul, add_) as a share of ddr_GBps"),
    Knob("math_fraction", 0.01, 1.0, "vector-math kernels' (GELU, norms, softmax) share of the streaming rate"),
    Knob("cache_GBps", 1.0, 2000.0, "streaming kernels' bandwidth on operands that fit in cache_bytes, GB/s"),
    Knob("attention_eff", 0.02, 2.0, "attention kernels' block products as a multiple of the big-GEMM rate"),
    Knob("fresh_memory_GBps", 0.05, 200.0, "zero-filling freshly mapped memory (page faults + unmap), GB/s"),
    Knob("bag_call_us", 0.5, 5000.0, "bookkeeping ops of one nn.EmbeddingBag call (forward or backward), µs"),
    Knob("bag_lookup_ns", 1.0, 20000.0, "adding one looked-up row in a dense embedding_bag backward, ns"),
    Knob("op_overhead_us", 0.2, 200.0, "fixed cost of one PyTorch CPU op (dispatch + launch), µs"),
    Knob("autograd_op_us", 0.01, 500.0, "host time autograd adds to each op of a training step, µs"),
    Knob("gloo_loopback_step_us", 1.0, 2000.0, "latency of one gloo ring step between local processes, µs"),
    Knob("gloo_loopback_GBps", 0.05, 200.0, "gloo bandwidth between local processes, GB/s"),
)
#: GPU backend parameters a calibration fits (echosim.backends.devices.DeviceSpec fields).
GPU_KNOBS = (
    Knob("gemm_eff_16bit", 0.05, 1.0, "largest-tile 16-bit matmul rate as a fraction of the peak"),
    Knob("hbm_stream_GBps", 10.0, 20000.0, "achievable HBM bandwidth of streaming kernels, GB/s"),
    Knob("kernel_overhead_us", 0.2, 100.0, "launch + drain gap per kernel in a busy stream, µs"),
)


# ---- the machine ---------------------------------------------------------------------------------


def _cpuinfo() -> dict[str, str]:
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return info


def cpu_flops_per_cycle(flags: set[str]) -> int:
    """fp32 FLOP/cycle/core of the vector units: 2 FMA pipes x lanes x 2 (x86 cores since Haswell/Zen)."""
    if "avx512f" in flags:
        return 64
    if "avx2" in flags and "fma" in flags:
        return 32
    if "avx" in flags:
        return 16
    return 8


def cpu_ghz() -> float:
    """The highest clock the OS reports: cpufreq's maximum, else /proc/cpuinfo's current clock."""
    try:
        return int(Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text()) / 1e6
    except (OSError, ValueError):
        pass
    mhz = _cpuinfo().get("cpu MHz")
    try:
        return float(mhz) / 1e3 if mhz else 2.0
    except ValueError:
        return 2.0


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def machine_identity(threads: int = 1, ranks: int = 1) -> dict[str, Any]:
    """What a calibration was measured on (stored with it, printed by ``echosim calibrate --list``)."""
    import torch

    info = _cpuinfo()
    flags = set(info.get("flags", "").split())
    memory_GB = 0.0
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        memory_GB = pages * size / 1e9
    except (ValueError, OSError, AttributeError):
        pass
    ident: dict[str, Any] = {
        "hostname": platform.node(),
        "cpu_model": info.get("model name", platform.processor() or "unknown"),
        "cpu_flags": sorted(flags & {"avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}),
        "usable_cores": usable_cores(),
        "physical_cores": physical_cores(),
        "cpu_ghz": round(cpu_ghz(), 3),
        "memory_GB": round(memory_GB, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads_per_rank": threads,
        "ranks": ranks,
    }
    if torch.cuda.is_available():
        ident["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return ident


# ---- fitting ---------------------------------------------------------------------------------------


def log_error(predicted: float, measured: float) -> float:
    return math.log(max(predicted, 1e-12) / max(measured, 1e-12))


def _golden(f: Callable[[float], float], lo: float, hi: float, steps: int = 40) -> float:
    """Minimise ``f`` over [lo, hi] on a log scale."""
    a, b = math.log(lo), math.log(hi)
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(math.exp(c)), f(math.exp(d))
    for _ in range(steps):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(math.exp(d))
    return math.exp((a + b) / 2)


def fit_spec(
    spec: Any,
    knobs: Sequence[Knob],
    samples: Sequence[Sample],
    predict: Callable[[Any, Sample], float | None],
    max_rounds: int = 60,
    tolerance: float = 1e-9,
) -> Any:
    """``spec`` with each knob set to minimise the mean squared log error of ``predict`` over ``samples``.

    Coordinate descent: one knob at a time, rounds until the loss stops improving. Knobs
    that share samples (the streaming and vector-math rates) need several rounds to settle.
    ``predict`` returns ``None`` for a sample it does not model.
    """

    def loss(s: Any) -> float:
        errs = [log_error(p, x.seconds) for x in samples if (p := predict(s, x)) is not None]
        return statistics.mean(e * e for e in errs) if errs else 0.0

    current = loss(spec)
    for _ in range(max_rounds):
        start = current
        for knob in knobs:

            def at(value: float, knob: Knob = knob, base: Any = spec) -> float:
                try:
                    return loss(replace(base, **{knob.name: value}))
                except ValueError:
                    return math.inf

            best = _golden(at, knob.lo, knob.hi)
            if (trial := at(best)) < current:
                spec, current = replace(spec, **{knob.name: best}), trial
        if start - current <= tolerance * max(start, 1e-30):
            break
    return spec


def quality(spec: Any, samples: Sequence[Sample], predict: Callable[[Any, Sample], float | None]) -> dict[str, Any]:
    """Mean and worst absolute percentage error of the fitted model, per kind of sample."""
    per: dict[str, list[float]] = {}
    for s in samples:
        p = predict(spec, s)
        if p is not None:
            key = f"{s.kind} {s.op}" if s.kind == "collective" else s.kind
            per.setdefault(key, []).append(abs(p / s.seconds - 1.0))
    return {k: {"samples": len(v), "mape": statistics.mean(v), "max": max(v)} for k, v in sorted(per.items())}


# ---- CPU ------------------------------------------------------------------------------------------


def cpu_identity_spec(base: Any, samples: Sequence[Sample], threads: int, ranks: int) -> tuple[Any, dict[str, str]]:
    """``base`` with this machine's derived identity: peaks of one rank, memory, ranks per node.

    Returns the spec and a note per derived field. A VM reports no DRAM peak: ``ddr_GBps``
    is the best bandwidth any memory-bound sample reached (``stream_fraction`` is then
    fitted against it); a matmul faster than the derived peak (a turbo clock above the
    reported one) raises the peak to the measured rate.
    """
    flags = set(_cpuinfo().get("flags", "").split())
    ghz = cpu_ghz()
    cores = compute_cores(threads)
    fp32 = cores * ghz * cpu_flops_per_cycle(flags) / 1e3
    notes = {
        "peak_fp32_tflops": f"{cores} physical core(s) for {threads} thread(s) x {ghz:.2f} GHz x "
        f"{cpu_flops_per_cycle(flags)} FLOP/cycle"
    }
    best = max((s.flops / s.seconds / 1e12 for s in samples if s.kind == "matmul" and s.dtype == "fp32"), default=0.0)
    if best > fp32:
        notes["peak_fp32_tflops"] += f"; raised to the best measured {best * 1e3:.1f} GFLOP/s (clock above reported)"
        fp32 = best
    bf16 = fp32 * (2 if "avx512_bf16" in flags else 1) * (16 if "amx_bf16" in flags else 1)
    notes["peak_bf16_tflops"] = "AMX / AVX512-BF16 multiples of the fp32 peak where the CPU has them, else equal"
    from echosim.calibrate.bench import cache_bytes

    cached = cores * cache_bytes(2)
    notes["cache_bytes"] = f"{cores} core(s) x the L2 cache the OS reports ({cache_bytes(2) / 2**20:g} MiB a core)"
    memory = [s for s in samples if s.kind == "memory"]
    beyond = [s for s in memory if resident_bytes(s) > cached] or memory
    bw = max((dram_traffic(s) / s.seconds / 1e9 for s in beyond), default=base.ddr_GBps)
    notes["ddr_GBps"] = (
        "best DRAM traffic rate (write-allocate reads counted) of the memory-bound samples beyond the cache "
        "(the OS reports no DRAM peak)"
    )
    memory_GB = machine_identity(threads, ranks).get("memory_GB") or base.ddr_GB
    per_node = max(1, usable_cores() // max(1, threads))
    notes["sockets_per_node"] = f"ranks of {threads} thread(s) this machine holds ({usable_cores()} cores)"
    spec = replace(
        base,
        cache_bytes=float(cached),
        peak_fp32_tflops=fp32,
        peak_bf16_tflops=bf16,
        ddr_GBps=bw,
        ddr_GB=memory_GB / per_node,
        sockets_per_node=per_node,
        stream_fraction=min(1.0, base.stream_fraction),
    )
    return spec, notes


#: Memory-bound samples that run at the vector-math rate on a CPU (see echosim.backends.cpu.is_math_kernel).
MATH_SAMPLES = frozenset({"gelu", "layernorm", "softmax", "silu", "cross_entropy"})
#: Share of a memory-bound sample's bytes that it writes out of place (bench.bench_cpu's kernels: a copy, a
#: multiply and the vector-math ones read one array and write one, an add reads two). Cross entropy is
#: costed as the model costs it (echosim.backends.cpu.CPUBackend.memory_cost_s: no write share).
WRITTEN_SHARE = {"copy": 1 / 2, "add": 1 / 3, "mul": 1 / 2, "gelu": 1 / 2, "layernorm": 1 / 2, "softmax": 1 / 2}
#: In-place samples and the share of their bytes they write over what they read (``x.add_(y)``).
INPLACE_SHARE = {"add_": 1 / 3}


def sample_writes(s: Sample) -> tuple[int, bool]:
    """(bytes written, in place) of a memory-bound sample, as the CPU model's ``memory_bound_time_s`` takes them."""
    if s.op in INPLACE_SHARE:
        return round(s.nbytes * INPLACE_SHARE[s.op]), True
    return round(s.nbytes * WRITTEN_SHARE.get(s.op, 0.0)), False


def resident_bytes(s: Sample) -> int:
    """Distinct bytes a memory-bound sample touches (in place, it writes over what it reads): what must fit
    in the cache for it to run there, as the model decides (``memory_bound_time_s``)."""
    written, inplace = sample_writes(s)
    return s.nbytes - written if inplace else s.nbytes


def dram_traffic(s: Sample) -> float:
    """Bytes a memory-bound sample moves to and from DRAM: its own, plus a write-allocate read of each
    line it writes out of place."""
    written, inplace = sample_writes(s)
    return s.nbytes + (0 if inplace else written)


#: The collective a training step runs (DDP's gradient all-reduce); gloo parameters are fitted to it alone.
FITTED_COLLECTIVES = frozenset({"all_reduce"})


def predict_cpu(spec: Any, s: Sample) -> float | None:
    from echosim.backends import cpu as model
    from echosim.backends.base import Placement
    from echosim.ir.ops import OpKind

    if s.kind == "matmul":
        return model.matmul_time_s(spec, s.m, s.n, s.k, s.batch, s.dtype)
    if s.kind == "memory":
        written, inplace = sample_writes(s)
        return model.memory_bound_time_s(spec, s.nbytes, s.op in MATH_SAMPLES, written, inplace)
    if s.kind == "overhead":
        return model.memory_bound_time_s(spec, s.nbytes)
    if s.kind == "autograd":  # one layer of the tiny chain: ``m`` IR ops, each with autograd's host time
        return s.m * (model.memory_bound_time_s(spec, s.nbytes) + spec.autograd_op_us * 1e-6)
    if s.kind == "fresh":
        return model.fresh_fill_time_s(spec, s.nbytes)
    if s.kind == "embedding":  # m rows x k dims, n ids in `batch` bags
        row = s.k * 4
        if s.op == "embedding_bag_fwd":
            return model.embedding_bag_forward_time_s(spec, s.n * model.INDEX_BYTES + s.n * row + s.batch * row)
        streamed = s.batch * row + s.n * model.INDEX_BYTES
        return model.embedding_dense_backward_time_s(spec, s.m * row, s.m, s.n, row, streamed, bag=True)
    if s.kind == "attention":
        from echosim.ir.ops import AttentionAttrs

        attrs = AttentionAttrs(s.batch, 1, 1, s.m, s.n, s.k, causal=True, flash=True)
        return model.attention_time_s(spec, attrs, s.dtype, backward=s.op == "attention_bwd")
    if s.kind == "collective":
        kind = OpKind[s.op.upper()]
        return model.collective_time_s(spec, kind, s.nbytes, Placement(s.ranks, 1, s.ranks))
    return None


def fit_cpu(
    base: Any, samples: Sequence[Sample], threads: int = 1, ranks: int = 1
) -> tuple[Any, dict[str, tuple[float, str]]]:
    """The CPU spec fitted to ``samples`` and the derived (not fitted) parameters with a note each.

    Knobs without samples (bf16 matmuls, gloo) keep their value. When the ranks' compute
    threads fill the machine's cores, a collective overlapping compute time-shares a core
    with it (gloo copies and reduces on its own thread): both run at threads/(threads+1)
    of their speed, an overlap slowdown of (threads+1)/threads derived, not fitted.
    """
    spec, notes = cpu_identity_spec(base, samples, threads, ranks)
    spec = replace(spec, op_overhead_us=max(0.2, min(200.0, _overhead_us(samples, spec.op_overhead_us))))
    knobs = [k for k in CPU_KNOBS if _informed(k, samples)]
    used = [s for s in samples if s.kind != "collective" or s.op in FITTED_COLLECTIVES]
    spec = fit_spec(spec, knobs, used, predict_cpu)
    derived = {name: (float(getattr(spec, name)), note) for name, note in notes.items()}
    if ranks * threads >= usable_cores() and ranks > 1:
        factor = (threads + 1) / threads
        note = f"gloo's thread shares the cores of {ranks} rank(s) x {threads} thread(s) with compute"
        for name in ("compute_slowdown", "comm_slowdown", "memory_bound_slowdown"):
            derived[f"overlap.{name}"] = (factor, note)
    return spec, derived


def _overhead_us(samples: Sequence[Sample], default: float) -> float:
    tiny = [s.seconds for s in samples if s.kind == "overhead"]
    return statistics.median(tiny) * 1e6 if tiny else default


def _informed(knob: Knob, samples: Sequence[Sample]) -> bool:
    kinds = {s.kind + ":" + s.dtype for s in samples}
    need = {
        "gemm_eff_fp32": "matmul:fp32",
        "gemm_eff_bf16": "matmul:bf16",
        "gemm_pack_rows": "matmul:fp32",
        "stream_fraction": "memory:fp32",
        "math_fraction": "memory:fp32",
        "cache_GBps": "memory:fp32",
        "attention_eff": "attention:fp32",
        "op_overhead_us": "overhead:fp32",
        "autograd_op_us": "autograd:fp32",
        "fresh_memory_GBps": "fresh:fp32",
        "bag_call_us": "embedding:fp32",
        "bag_lookup_ns": "embedding:fp32",
        "gloo_loopback_step_us": "collective:fp32",
        "gloo_loopback_GBps": "collective:fp32",
        "gemm_eff_16bit": "matmul:bf16",
        "hbm_stream_GBps": "memory:bf16",
        "kernel_overhead_us": "overhead:bf16",
    }
    return need.get(knob.name, "") in kinds


def fitted_knobs(knobs: Sequence[Knob], samples: Sequence[Sample]) -> list[Knob]:
    return [k for k in knobs if _informed(k, samples)]


# ---- GPU -------------------------------------------------------------------------------------------


def predict_gpu(spec: Any, s: Sample) -> float | None:
    from echosim.backends import compute

    if s.kind == "matmul":
        return compute.matmul_time_s(spec, s.m, s.n, s.k, s.batch, s.dtype)
    if s.kind in ("memory", "overhead"):
        return compute.memory_bound_time_s(spec, s.nbytes)
    return None


def fit_gpu(base: Any, samples: Sequence[Sample]) -> Any:
    """The GPU spec fitted to ``samples`` (16-bit matmuls, streaming kernels, kernel overhead)."""
    knobs = [k for k in GPU_KNOBS if _informed(k, samples)]
    if "hbm_stream_GBps" in {k.name for k in knobs}:  # bounded by the datasheet peak
        knobs = [Knob(k.name, k.lo, base.hbm_GBps, k.what) if k.name == "hbm_stream_GBps" else k for k in knobs]
    return fit_spec(base, knobs, samples, predict_gpu)
