"""Microbenchmarks with torch on the machine echosim runs on: the data a calibration is fitted to.

* matmuls over a shape sweep (and batched products shaped like attention);
* memory-bound kernels (copy, add, mul, GELU, LayerNorm, softmax) over a size sweep, each
  writing a fresh output as a training step does, and an in-place add (as an optimizer step writes);
* zero-filling memory the kernel maps afresh (page faults), as a table-sized gradient born
  every step is, and ``nn.EmbeddingBag`` forward and backward on a small table (CPU only);
* the per-op overhead of a kernel on a tiny tensor;
* collectives (all-reduce, all-gather, broadcast) over a size sweep between local
  processes: gloo on CPUs, NCCL between local GPUs.

On a CPU every sample runs on ``threads`` intra-op threads (one rank's share of the
machine). Compute samples are timed by the CPU time of the process as well as the wall
clock: on a machine shared with other work, wall time also counts the time the scheduler
gave to someone else, CPU time does not. With one thread the CPU time is what the op takes
on a dedicated core, and that is the time a calibration stores; ``cpu_share`` (CPU over
wall time) says how contended the machine was. gloo collectives are timed by the slowest
rank's CPU time too (:func:`bench_collectives`), NCCL ones by the wall clock.
"""

from __future__ import annotations

import math
import os
import socket
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

Progress = Callable[[str], None]

#: Few-row matmuls (m of 1 to 64): a recurrent step's (batch x hidden) GEMMs, where packing the operands
#: outweighs the FMAs (echosim.backends.cpu.GEMM_PACK_ROWS) and the rate falls well below the big shapes'.
SMALL_M_MATMULS = [(1, 1024, 256, 1), (4, 1024, 256, 1), (16, 1024, 256, 1), (16, 256, 1024, 1), (64, 1024, 256, 1)]
#: Shape sweeps: (m, n, k, batch). ``tiny`` is for tests (well under a second).
MATMUL_SWEEPS: dict[str, list[tuple[int, int, int, int]]] = {
    "tiny": [(64, 64, 64, 1), (128, 256, 128, 1), (16, 16, 16, 4)],
    "quick": [
        *((m, n, k, 1) for m in (256, 1024) for n in (256, 1024) for k in (256, 1024)),
        (512, 512, 512, 1),
        (8, 128, 64, 32),
        *SMALL_M_MATMULS,
    ],
    "standard": [
        *((m, n, k, 1) for m in (128, 512, 2048) for n in (256, 1024, 4096) for k in (256, 1024)),
        (512, 512, 512, 1),
        (1024, 1024, 1024, 1),
        (2048, 2048, 2048, 1),
        (128, 128, 64, 16),
        (256, 256, 64, 16),
        (256, 64, 256, 16),
        *SMALL_M_MATMULS,
    ],
}
#: Elements per memory-bound sample.
MEMORY_SWEEPS: dict[str, list[int]] = {
    "tiny": [2**12, 2**14],
    "quick": [2**14, 2**17, 2**20, 2**22],
    # up to 16 MiB arrays: larger outputs cross glibc's 32 MiB mmap threshold and pay page faults
    # on every allocation, a regime the CPU model does not contain (docs/accuracy.md)
    "standard": [2**14, 2**16, 2**18, 2**20, 2**21, 2**22],
}
#: Bytes per fresh-memory sample: above glibc's largest dynamic mmap threshold (32 MiB on 64-bit,
#: DEFAULT_MMAP_THRESHOLD_MAX in mallopt(3)), so each is mapped afresh and unmapped when freed,
#: whatever the allocations before it: the cycle a table-sized gradient goes through every step.
FRESH_SWEEPS: dict[str, list[int]] = {
    "tiny": [40 * 2**20],
    "quick": [40 * 2**20, 80 * 2**20],
    "standard": [40 * 2**20, 80 * 2**20, 160 * 2**20],
}
#: Ids per nn.EmbeddingBag sample (256 bags of a 256 x 32 table: small enough to be refilled from the
#: heap, so the fresh-page rate stays out of it).
BAG_SWEEPS: dict[str, list[int]] = {"tiny": [1024], "quick": [256, 4096], "standard": [256, 1024, 4096]}
BAG_TABLE = (256, 32)
BAG_BATCH = 256
#: Bytes per collective sample (float32 buffers).
COLLECTIVE_SWEEPS: dict[str, list[int]] = {
    "tiny": [4096, 65536],
    "quick": [4096, 65536, 2**20, 2**23],
    "standard": [4096, 32768, 2**18, 2**20, 2**22, 2**24, 2**26],
}
#: Attention shapes (batch, heads, seq, head_dim), causal, forward and backward.
ATTENTION_SWEEPS: dict[str, list[tuple[int, int, int, int]]] = {
    "tiny": [(1, 2, 64, 32)],
    "quick": [(2, 4, 256, 64), (1, 8, 512, 64)],
    "standard": [(4, 4, 256, 64), (2, 8, 256, 64), (1, 8, 512, 64), (2, 4, 512, 128)],
}
SWEEPS = tuple(MATMUL_SWEEPS)


@dataclass(frozen=True)
class Sample:
    """One measured kernel: what ran, on what, and how long it took (medians)."""

    kind: str  # matmul | memory | fresh | embedding | overhead | autograd | collective
    op: str  # matmul | copy | add | ... | all_reduce | ...
    dtype: str
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1
    nbytes: int = 0  # memory-bound: bytes read + written; collective: buffer size
    ranks: int = 1
    seconds: float = 0.0  # the time the calibration uses (see the module docstring)
    wall_s: float = 0.0
    cpu_share: float = 1.0  # CPU time / wall time of the samples (1: a dedicated core)
    device: str = "cpu"

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _torch() -> Any:
    import torch

    return torch


#: The shortest span one timing covers: a call shorter than this is repeated back to back inside the timing.
#: The process CPU clock is a system call (``clock_gettime(CLOCK_PROCESS_CPUTIME_ID)`` has no vDSO fast path;
#: ~0.8 us a read on this 2-core VM), so a timing of one 4 us op also counts most of a read, 20% of the op;
#: over 1 ms it is under 0.1%.
MIN_TIMED_S = 1e-3


def calls_per_timing(fn: Callable[[], Any], min_timed_s: float = MIN_TIMED_S) -> int:
    """How many back-to-back calls of ``fn`` one timing needs to last ``min_timed_s`` (one call timed to tell)."""
    w0 = time.perf_counter()
    fn()
    one = time.perf_counter() - w0
    return max(1, min(100_000, math.ceil(min_timed_s / max(one, 1e-9))))


def timed_calls(fn: Callable[[], Any], calls: int, sync: Callable[[], None] | None = None) -> tuple[float, float]:
    """(wall seconds, process-CPU seconds) of one call of ``fn``, from ``calls`` back-to-back calls timed together
    (and ``sync`` after them, inside the timing)."""
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(calls):
        fn()
    if sync:
        sync()
    return (time.perf_counter() - w0) / calls, (time.process_time() - c0) / calls


def time_fn(
    fn: Callable[[], Any],
    repeats: int,
    warmup: int = 1,
    sync: Callable[[], None] | None = None,
    before: Callable[[], None] | None = None,
    min_timed_s: float = MIN_TIMED_S,
) -> tuple[float, float]:
    """(median wall seconds, median process-CPU seconds) of one call of ``fn`` after ``warmup`` calls.

    Each of the ``repeats`` timings runs enough calls back to back to last ``min_timed_s``
    (:data:`MIN_TIMED_S`: the clocks' own cost stays out of short ops), except with ``before``,
    which runs ahead of each timed call, outside the timing (:class:`CacheEvictor`), and with ``sync``."""
    for _ in range(warmup):
        fn()
    if sync:
        sync()
    inner = calls_per_timing(fn, min_timed_s) if before is None and sync is None and min_timed_s > 0 else 1
    walls, cpus = [], []
    for _ in range(repeats):
        if before is not None:
            before()
        wall, cpu = timed_calls(fn, inner, sync)
        walls.append(wall)
        cpus.append(cpu)
    return statistics.median(walls), statistics.median(cpus)


def repeats_for(seconds_guess: float, budget_s: float = 0.3) -> int:
    """Timings of a sample: as many as ``budget_s`` holds, 3 to 50."""
    return max(3, min(50, int(budget_s / max(seconds_guess, 1e-6))))


#: Repeats of a sample timed after evicting the caches (each eviction streams the whole last-level cache).
EVICTED_REPEATS = 7
#: Caches assumed when the OS does not report them: a core's L2 and the last level.
DEFAULT_L2_BYTES = 1 * 2**20
DEFAULT_LLC_BYTES = 32 * 2**20


def _size_bytes(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
    return int(text.rstrip("KMG") or 0) * scale


def cache_bytes(level: int | None = None) -> int:
    """A CPU cache's size as the OS reports it (sysfs ``cpu0/cache/index*``): data or unified cache of
    ``level``, or the largest one (``None``: the last level); the defaults above where none is reported."""
    from pathlib import Path

    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            if level is None or int((index / "level").read_text()) == level:
                sizes.append(_size_bytes((index / "size").read_text()))
        except (OSError, ValueError):
            continue
    return max(sizes, default=0) or (DEFAULT_LLC_BYTES if level is None else DEFAULT_L2_BYTES)


#: Where Linux describes the CPUs' topology (``topology/core_id``, ``topology/physical_package_id`` per CPU).
SYSFS_CPU = Path("/sys/devices/system/cpu")


def physical_cores(root: Path = SYSFS_CPU) -> int:
    """Distinct physical cores among the CPUs this process may run on: SMT siblings (hyperthreads) share one.

    The OS lists each CPU's package and core id (Documentation/ABI/stable/sysfs-devices-system-cpu); two
    logical CPUs with the same pair are hyperthreads of one core and share its FMA units and its L2.
    Where the OS does not say, every usable CPU counts as a core. A VM shows its vCPUs as the hypervisor
    presents them (this 2-vCPU KVM guest: two cores, one thread each)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # no affinity call (not Linux): every CPU counts as a core
        return os.cpu_count() or 1
    cores = set()
    for cpu in cpus:
        topo = root / f"cpu{cpu}" / "topology"
        try:
            cores.add(((topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))  # no topology: the CPU counts as a core of its own
    return max(1, len(cores))


def compute_cores(threads: int, root: Path = SYSFS_CPU) -> int:
    """Physical cores ``threads`` intra-op threads compute on: one each, up to the cores there are (threads
    beyond them land on SMT siblings, which add no FMA units; :func:`physical_cores`)."""
    return max(1, min(threads, physical_cores(root)))


class CacheEvictor:
    """Pushes the caches' contents out to DRAM by rewriting a buffer as large as the last-level cache.

    A training step's working set (weights, gradients, optimizer states, the activations the
    forward saves for the backward) is far larger than a CPU's caches, and its kernels read
    operands written many kernels before: they stream from DRAM. A microbenchmark that repeats
    one kernel on the same tensors finds them in cache instead and measures the cache's
    bandwidth (on a 2-core Xeon VM: a 2.8 MB multiply 2x faster warm than after an eviction,
    benchmarks/cpu_breakdown.py). So each timed call of a streaming kernel larger than a core's L2
    runs after an eviction. Smaller ones stay warm: in a step their operands are mostly what the
    kernel before wrote, still in L2 (and after an eviction a VM's first touch of each page walks
    evicted nested page tables, ~2 us a 4 KiB page, a fixed cost the step does not pay). Matmuls
    and attention stay warm too: compute-bound, they read each operand byte many times. Timing the
    matmuls after an eviction was measured and left out (benchmarks/cpu_matmul_cold.py, 2-core EPYC
    VM): a step's GEMMs ran between their warm and their evicted sums, and a calibration with evicted
    matmuls priced a profiled step's matmuls 5-14% too slow where the warm one is within -5..+4%: an
    eviction adds a fixed cost to the sweep's small shapes (a 128x1024x256 product 1.5-1.7x, ones of
    512 rows and more 1.0-1.1x) that the fit reads as packing work (CHANGELOG, 2026-12-05).
    """

    def __init__(self, nbytes: int | None = None) -> None:
        torch = _torch()
        self.nbytes = int(nbytes if nbytes is not None else cache_bytes())
        self._buffer = torch.zeros(max(1, self.nbytes // 4))

    def __call__(self) -> None:
        self._buffer.add_(1.0)


def _cpu_sample(kind: str, op: str, dtype: str, wall: float, cpu: float, threads: int, **shape: int) -> Sample:
    share = min(1.0, cpu / (wall * threads)) if wall > 0 else 1.0
    seconds = cpu / threads if threads == 1 else wall  # several threads: CPU time adds up over them
    return Sample(kind, op, dtype, seconds=max(seconds, 1e-9), wall_s=wall, cpu_share=share, **shape)


def _fwd_bwd_samples(
    kind: str, op: str, fwd: tuple[float, float], both: tuple[float, float], threads: int, shape: dict[str, int]
) -> list[Sample]:
    """``{op}_fwd`` and ``{op}_bwd`` from (wall, CPU) times of the forward and of forward + backward:
    the backward is their difference (at least 1 ns), since it cannot run without its forward."""
    (wall_f, cpu_f), (wall_b, cpu_b) = fwd, both
    return [
        _cpu_sample(kind, f"{op}_fwd", "fp32", wall_f, cpu_f, threads, **shape),
        _cpu_sample(kind, f"{op}_bwd", "fp32", max(wall_b - wall_f, 1e-9), max(cpu_b - cpu_f, 1e-9), threads, **shape),
    ]


#: Rounds of a calibration sweep: the whole sweep runs this many times, one after the other, and each sample
#: keeps its median round. A 2-core VM's speed moves by 10-25% within a minute (back-to-back quick calibrations
#: here: every matmul of one 10-25% slower than of the other, the per-op overhead and the autograd sample by up
#: to 2x, notes in docs/beyond-transformers.md); one slow spell then sets a few samples, not the whole of one
#: kind. The repeats per round are cut to keep the sweep's length.
ROUNDS = 3


def bench_cpu(
    sweep: str = "standard",
    dtypes: tuple[str, ...] = ("fp32",),
    threads: int = 1,
    progress: Progress | None = None,
    barrier: Callable[[], None] | None = None,
    rounds: int | None = None,
) -> list[Sample]:
    """Matmuls, memory-bound kernels, attention and the per-op overhead on this CPU, on ``threads`` threads.

    ``barrier`` (several ranks measuring at once) is called before each sample, so that
    every rank runs the same kernel at the same time. The sweep runs ``rounds`` times
    (:data:`ROUNDS`; one for the tests' ``tiny`` sweep) and each sample is its median round.
    """
    torch = _torch()

    torch.set_num_threads(threads)
    if barrier is not None:
        user_progress = progress

        def progress(text: str) -> None:
            if user_progress:
                user_progress(text)
            barrier()

        barrier()
    rounds = rounds if rounds is not None else (1 if sweep == "tiny" else ROUNDS)
    if rounds < 1:
        raise ValueError(f"a calibration needs at least one round, got {rounds}")
    runs = [_bench_cpu_round(sweep, dtypes, threads, progress, 1.0 / rounds) for _ in range(rounds)]
    return [median_sample(same) for same in zip(*runs, strict=True)]


def median_sample(same: Sequence[Sample]) -> Sample:
    """The sample of median time among rounds of one measurement (the lower middle one of an even count)."""
    return sorted(same, key=lambda s: s.seconds)[(len(same) - 1) // 2]


def _bench_cpu_round(
    sweep: str, dtypes: tuple[str, ...], threads: int, progress: Progress | None, share: float
) -> list[Sample]:
    """One round of :func:`bench_cpu`: every sample once, with ``share`` of the repeats of a whole sweep."""
    torch = _torch()
    import torch.nn.functional as F

    def _repeats(seconds_guess: float, budget_s: float = 0.3) -> int:
        return repeats_for(seconds_guess, budget_s * share)

    tdtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    out: list[Sample] = []
    # streaming kernels beyond L2 are timed with their operands out of cache, as in a training step
    # (CacheEvictor); the tests' tiny sweep keeps them warm for speed
    evict = CacheEvictor() if sweep != "tiny" else None
    l2 = compute_cores(threads) * cache_bytes(2)  # the model's cache_bytes (fit.cpu_identity_spec)

    def timed(fn: Callable[[], Any], repeats: int, nbytes: int = 0) -> tuple[float, float]:
        if evict is None or nbytes <= l2:
            return time_fn(fn, repeats)
        return time_fn(fn, min(repeats, max(3, round(EVICTED_REPEATS * share))), before=evict)

    for dtype in dtypes:
        for m, n, k, b in MATMUL_SWEEPS[sweep]:
            shape_a, shape_b = ((b, m, k), (b, k, n)) if b > 1 else ((m, k), (k, n))
            x = torch.randn(*shape_a, dtype=tdtype[dtype])
            y = torch.randn(*shape_b, dtype=tdtype[dtype])
            guess = 2.0 * b * m * n * k / 50e9
            wall, cpu = time_fn(lambda x=x, y=y: torch.matmul(x, y), _repeats(guess))
            out.append(_cpu_sample("matmul", "matmul", dtype, wall, cpu, threads, m=m, n=n, k=k, batch=b))
            if progress:
                progress(f"matmul {dtype} {b}x{m}x{n}x{k}")
    kernels: dict[str, tuple[Callable[[Any, Any], Any], int]] = {
        "copy": (lambda x, y: x.clone(), 2),
        "add": (lambda x, y: x + y, 3),  # two operands: x + x would read one array once and count it twice
        "mul": (lambda x, y: x * 1.5, 2),
        "gelu": (lambda x, y: F.gelu(x), 2),
        "layernorm": (lambda x, y: F.layer_norm(x, (x.shape[-1],)), 2),
        "softmax": (lambda x, y: torch.softmax(x, dim=-1), 2),
        # in place, as an optimizer step or autograd's gradient sum writes: no write-allocate read
        "add_": (lambda x, y: x.add_(y), 3),
    }
    for elements in MEMORY_SWEEPS[sweep]:
        x, y = torch.randn(elements // 256, 256), torch.randn(elements // 256, 256)
        for op, (fn, passes) in kernels.items():
            nbytes = passes * elements * 4
            resident = (
                nbytes - elements * 4 if op.endswith("_") else nbytes
            )  # in place: x read and written (fit.resident_bytes)
            wall, cpu = timed(lambda fn=fn, x=x, y=y: fn(x, y), _repeats(nbytes / 5e9), resident)
            out.append(_cpu_sample("memory", op, "fp32", wall, cpu, threads, nbytes=nbytes))
            if progress:
                progress(f"{op} {nbytes / 2**20:.1f} MiB")
    for elements in MEMORY_SWEEPS[sweep]:
        vocab = 1024
        logits = torch.randn(max(1, elements // vocab), vocab)
        labels = torch.randint(0, vocab, (logits.shape[0],))
        nbytes = 2 * logits.numel() * 4  # log_softmax reads and writes the logits
        wall, cpu = timed(lambda x=logits, y=labels: F.cross_entropy(x, y), _repeats(nbytes / 3e9), nbytes)
        out.append(_cpu_sample("memory", "cross_entropy", "fp32", wall, cpu, threads, nbytes=nbytes))
        if progress:
            progress(f"cross_entropy {nbytes / 2**20:.1f} MiB")
    for nbytes in FRESH_SWEEPS[sweep]:
        wall, cpu = time_fn(lambda n=nbytes // 4: torch.zeros(n), _repeats(nbytes / 2e9))
        out.append(_cpu_sample("fresh", "zeros", "fp32", wall, cpu, threads, nbytes=nbytes))
        if progress:
            progress(f"fresh zeros {nbytes / 2**20:.0f} MiB")
    rows, dim = BAG_TABLE
    table = torch.nn.EmbeddingBag(rows, dim, mode="sum")
    for lookups in BAG_SWEEPS[sweep]:
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, rows, (BAG_BATCH, max(1, lookups // BAG_BATCH)), generator=gen)
        dy = torch.ones(BAG_BATCH, dim)

        def bag_fwd(table: Any = table, ids: Any = ids) -> Any:
            return table(ids)

        def bag_both(table: Any = table, ids: Any = ids, dy: Any = dy) -> None:
            table.weight.grad = None
            table(ids).backward(dy)

        wall_f, cpu_f = time_fn(bag_fwd, _repeats(1e-4))
        wall_b, cpu_b = time_fn(bag_both, _repeats(5e-4))
        shape = {"m": rows, "n": ids.numel(), "k": dim, "batch": BAG_BATCH}
        out += _fwd_bwd_samples("embedding", "embedding_bag", (wall_f, cpu_f), (wall_b, cpu_b), threads, shape)
        if progress:
            progress(f"embedding_bag {ids.numel()} ids")
    for b, h, s, d in ATTENTION_SWEEPS[sweep]:
        q, k, v = (torch.randn(b, h, s, d, requires_grad=True) for _ in range(3))
        grad = torch.randn(b, h, s, d)

        def fwd(q: Any = q, k: Any = k, v: Any = v) -> Any:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def both(q: Any = q, k: Any = k, v: Any = v, g: Any = grad) -> None:
            torch.autograd.grad(fwd(q, k, v), (q, k, v), g)

        guess = 4.0 * b * h * s * s * d / 20e9
        wall_f, cpu_f = time_fn(fwd, _repeats(guess))
        wall_b, cpu_b = time_fn(both, _repeats(3 * guess))
        shape = {"m": s, "n": s, "k": d, "batch": b * h}
        out += _fwd_bwd_samples("attention", "attention", (wall_f, cpu_f), (wall_b, cpu_b), threads, shape)
        if progress:
            progress(f"attention {b}x{h}x{s}x{d}")
    tiny = torch.ones(8)
    wall, cpu = time_fn(lambda: tiny + tiny, max(20, round(200 * share)), warmup=20)
    out.append(_cpu_sample("overhead", "add", "fp32", wall, cpu, threads, nbytes=96))
    if progress:
        progress("per-op overhead")
    out.append(autograd_sample(threads, max(10, round(100 * share))))
    if progress:
        progress("autograd overhead")
    return out


#: The autograd overhead sample: chains of tiny Linear + SiLU layers (depths), on a (batch, seq, width) input
#: shaped like a transformer's activations, so that a linear dispatches what it does in a model (t, view, mm,
#: _unsafe_view). A layer is AUTOGRAD_LAYER_OPS IR ops: the linear's forward and its two gradients (input and
#: weight), SiLU's forward and its gradient.
AUTOGRAD_CHAIN = {"depths": (4, 12), "shape": (1, 4, 8)}
AUTOGRAD_LAYER_OPS = 5


def autograd_sample(threads: int = 1, repeats: int = 100) -> Sample:
    """Host time of one tiny Linear + SiLU layer, forward and backward (zeroed gradients set to None first):
    the difference of two chain depths per layer, so that the loss and the engine's start cancel.

    The two depths are timed in turn, ``repeats`` pairs, and the sample is the median of the pairs'
    differences: a difference of two medians timed one after the other takes in any change of the
    machine's speed between them, a fifth of the difference or more (a one-layer step is ~50 us)."""
    torch = _torch()
    x = torch.randn(*AUTOGRAD_CHAIN["shape"])
    width = AUTOGRAD_CHAIN["shape"][-1]
    steps = []
    for depth in AUTOGRAD_CHAIN["depths"]:
        # modules, as a model calls them (nn.Module.__call__ and its hook checks are part of the host time)
        layers = [(torch.nn.Linear(width, width, bias=False), torch.nn.SiLU()) for _ in range(depth)]

        def step(layers: list[tuple[Any, Any]] = layers) -> None:
            for linear, _ in layers:
                linear.weight.grad = None
            h = x
            for linear, act in layers:
                h = act(linear(h))
            h.sum().backward()

        for _ in range(10):
            step()
        steps.append(step)
    inner = [calls_per_timing(step) for step in steps]
    walls, cpus = [], []
    for _ in range(repeats):
        (wall_a, cpu_a), (wall_b, cpu_b) = (timed_calls(step, calls) for step, calls in zip(steps, inner, strict=True))
        walls.append(wall_b - wall_a)
        cpus.append(cpu_b - cpu_a)
    layers = AUTOGRAD_CHAIN["depths"][1] - AUTOGRAD_CHAIN["depths"][0]
    tiny_bytes = 2 * x.numel() * 4  # each op reads and writes a tiny activation
    wall, cpu = max(0.0, statistics.median(walls)) / layers, max(0.0, statistics.median(cpus)) / layers
    return _cpu_sample("autograd", "linear_silu", "fp32", wall, cpu, threads, m=AUTOGRAD_LAYER_OPS, nbytes=tiny_bytes)


# ---- collectives between local processes ----------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bench_cpu_ranks(
    sweep: str = "standard",
    dtypes: tuple[str, ...] = ("fp32",),
    threads: int = 1,
    ranks: int = 2,
    progress: Progress | None = None,
) -> list[Sample]:
    """:func:`bench_cpu` in ``ranks`` processes at once: a rank's rates when ``ranks`` ranks share the machine.

    Ranks on one socket share its last-level cache and memory bandwidth (and its turbo
    headroom), so a rank computes slower beside a busy neighbour than alone. The samples
    are rank 0's.
    """
    out = _run_workers(
        ["--mode", "compute", "--sweep", sweep, "--threads", str(threads), "--dtypes", ",".join(dtypes)],
        ranks,
        "gloo",
        progress,
    )
    return [Sample(**s) for s in out]


def _run_workers(args: list[str], ranks: int, backend: str, progress: Progress | None) -> Any:
    """Run ``python -m echosim.calibrate.worker`` as ``ranks`` processes; rank 0's JSON result."""
    import json
    import subprocess
    import sys

    from echosim.calibrate.db import CalibrationError

    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    cmd = [
        sys.executable,
        "-m",
        "echosim.calibrate.worker",
        "--world",
        str(ranks),
        "--port",
        str(port),
        "--backend",
        backend,
        *args,
    ]
    procs = [
        subprocess.Popen([*cmd, "--rank", str(r)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for r in range(ranks)
    ]
    result: Any = None
    try:
        assert procs[0].stdout is not None
        for line in procs[0].stdout:  # rank 0 reports progress as it goes, the result last
            if line.startswith("P ") and progress:
                progress(line[2:].strip())
            elif line.startswith("R "):
                result = json.loads(line[2:])
        errors = [p.communicate(timeout=900)[1] for p in procs]
    except subprocess.TimeoutExpired:
        raise CalibrationError(f"calibration workers ({backend}) did not finish in 900 s") from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, err in zip(procs, errors, strict=True):
        if p.returncode != 0:
            last = (err.strip().splitlines() or ["no output"])[-1]
            raise CalibrationError(f"a calibration worker ({backend}) exited with status {p.returncode}: {last}")
    if result is None:
        raise CalibrationError(f"calibration workers ({backend}) returned no result")
    return result


def collective_worker(
    rank: int, world: int, port: int, sizes: list[int], backend: str
) -> list[tuple[str, int, float, float]]:
    """One rank of the collective sweep (run by ``python -m echosim.calibrate.worker``): per op and
    size, the slowest rank's median wall time and median process CPU time."""
    torch = _torch()
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
    sync = torch.cuda.synchronize if backend == "nccl" else None
    results = []
    try:
        for nbytes in sizes:
            x = torch.ones(max(1, nbytes // 4), device=device)
            gathered = [torch.empty_like(x) for _ in range(world)]
            ops = {
                "all_reduce": lambda x=x: dist.all_reduce(x),
                "all_gather": lambda x=x, g=gathered: dist.all_gather(g, x),
                "broadcast": lambda x=x: dist.broadcast(x, 0),
            }
            for op, fn in ops.items():
                dist.barrier()
                # one call a timing: ranks that each chose their own count of calls would not match up
                wall, cpu = time_fn(fn, repeats_for(nbytes / 1e9 + 1e-4, 0.2), warmup=2, sync=sync, min_timed_s=0)
                t = torch.tensor([wall, cpu], device=device, dtype=torch.float64)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank sets the collective's time
                results.append((op, nbytes, float(t[0]), float(t[1])))
    finally:
        dist.destroy_process_group()
    return results


def bench_collectives(
    sweep: str = "standard", ranks: int = 2, backend: str = "gloo", progress: Progress | None = None
) -> list[Sample]:
    """All-reduce, all-gather and broadcast between ``ranks`` local processes (gloo or nccl).

    A gloo collective between local processes is CPU work on every rank (the kernel's TCP copies,
    gloo's reduction), so, like a compute sample, it is timed by the CPU time of the slowest rank:
    on a machine shared with other work the wall clock also counts the time the scheduler gave to
    someone else (a loaded 2-core machine measured 0.3 GB/s by the wall clock and 1.3 GB/s by CPU
    time for the same 32 MiB all-reduce). The CPU time leaves out a wake-up of the peer that a
    quiet machine would pay, so small messages read a little fast. NCCL is timed by the wall clock
    (the GPUs do the work)."""
    sizes = COLLECTIVE_SWEEPS[sweep]
    results = _run_workers(["--mode", "collectives", "--sizes", ",".join(map(str, sizes))], ranks, backend, None)
    out = []
    for op, nbytes, wall, cpu in results:
        device = "cuda" if backend == "nccl" else "cpu"
        seconds = wall if backend == "nccl" else max(min(cpu, wall), 1e-9)
        share = min(1.0, seconds / wall) if wall > 0 else 1.0
        out.append(
            Sample(
                "collective",
                op,
                "fp32",
                nbytes=nbytes,
                ranks=ranks,
                seconds=seconds,
                wall_s=wall,
                cpu_share=share,
                device=device,
            )
        )
        if progress:
            progress(f"{op} {nbytes} B x {ranks} ranks")
    return out


# ---- GPUs ------------------------------------------------------------------------------------------


def bench_gpu(sweep: str = "standard", progress: Progress | None = None) -> list[Sample]:
    """bf16 matmuls, memory-bound kernels and the kernel overhead on ``cuda:0`` (CUDA-event timing)."""
    torch = _torch()
    import torch.nn.functional as F

    dev = torch.device("cuda:0")
    scale = {"tiny": 1, "quick": 4, "standard": 8}[sweep]

    def timed(fn: Callable[[], Any], repeats: int = 10) -> float:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        return statistics.median(times)

    out: list[Sample] = []
    for m, n, k, b in MATMUL_SWEEPS[sweep]:
        m, n, k = m * scale, n * scale, k * scale
        x = torch.randn(b, m, k, device=dev, dtype=torch.bfloat16).squeeze(0)
        y = torch.randn(b, k, n, device=dev, dtype=torch.bfloat16).squeeze(0)
        s = timed(lambda x=x, y=y: torch.matmul(x, y))
        out.append(Sample("matmul", "matmul", "bf16", m=m, n=n, k=k, batch=b, seconds=s, wall_s=s, device="cuda"))
        if progress:
            progress(f"matmul bf16 {b}x{m}x{n}x{k}")
    for elements in MEMORY_SWEEPS[sweep]:
        x = torch.randn(elements * 64, device=dev, dtype=torch.bfloat16)
        for op, fn, passes in (
            ("copy", lambda x=x: x.clone(), 2),
            ("add", lambda x=x: x + x, 3),
            ("gelu", lambda x=x: F.gelu(x), 2),
        ):
            s = timed(fn)
            out.append(Sample("memory", op, "bf16", nbytes=passes * x.numel() * 2, seconds=s, wall_s=s, device="cuda"))
            if progress:
                progress(f"{op} {x.numel() * 2 / 2**20:.0f} MiB")
    tiny = torch.ones(8, device=dev)
    s = timed(lambda: tiny + tiny, 100)
    out.append(Sample("overhead", "add", "bf16", nbytes=48, seconds=s, wall_s=s, device="cuda"))
    return out
