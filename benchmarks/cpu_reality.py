"""Really train small GPT and Llama models on this CPU and compare the step time with echosim.

Usage::

    python benchmarks/cpu_reality.py [--calibration ONE_RANK TWO_RANKS ALL_CORES] [--sweep standard] [--steps 10]
                                     [--order model|layout|row] [--out FILE.json]

Without ``--calibration`` it first calibrates the CPU backend on this machine three times
(``echosim calibrate``'s sweep into a temporary database): for one rank of one thread alone,
for two such ranks computing at once, since two ranks on one socket share its cache and memory
bandwidth, and for one rank with a thread on every core; each layout is predicted with the
calibration of its own ranks and threads (``--order layout``: each calibration just before its layout's
rows, all models of a layout back to back, so that minutes of drift do not sit between the two; ``--order row``:
each row's layout calibrated again just before it, the prediction and the measurement a minute apart). Then, for
each model and layout, it
trains with torch in fresh processes and predicts the same step with echosim on the
calibrated ``cpu-x86`` backend:

* ``1 process``: one rank, one intra-op thread.
* ``1 process (all cores)``: one rank with an intra-op thread on every core (PyTorch's default
  for a single process); echosim: one device calibrated with as many threads.
* ``DDP x2 (gloo)``: two processes, one thread each, ``DistributedDataParallel`` over gloo
  (``tcp://127.0.0.1``), each rank its own micro-batch; echosim: dp=2 on a node of 2 ranks.
* ``pipeline x2 (gloo)``: two processes, half the layers each, 1F1B over gloo send/recv
  with 4 micro-batches (Llama models: untied embeddings, so no weight is shared across
  stages); echosim: pp=2, 1F1B.

Honesty notes. Each process is limited to one thread (``torch.set_num_threads(1)``,
``OMP_NUM_THREADS=1``) so that two ranks share two cores as two devices would, but gloo
runs its own threads and the kernel's TCP stack on the same cores: that interference is
part of the measurement and of nothing echosim was told. The machine may be shared with
other work; every measurement records the load average and the share of wall time the
processes actually ran (CPU time / wall time), and the table flags contended rows. A step
is ``zero_grad`` + forward + backward (+ DDP's all-reduce) + ``AdamW.step``; the time is
the median of ``--steps`` steps after 3 warm-up steps (the slowest rank's, for two ranks).
A run during which other processes used a quarter of a core or more is re-measured (up to
``--retries`` times); every attempt is kept in the JSON and the quietest one is reported,
chosen by the load of the machine, never by its error.
AdamW runs ``fused=True`` (as in ``cpu_reality_nonllm.py``): one pass over each tensor, the
optimizer echosim's Adam cost describes. PyTorch's CPU default, a loop of eight element-wise
kernels per tensor (~80 bytes a parameter), is not modelled (``benchmarks/cpu_breakdown.py``
profiles it).
Models are fp32 (this CPU has no fast bf16 path), without dropout, sized so that no tensor
reaches glibc's 32 MiB mmap threshold (larger ones pay page faults on every allocation, a
regime the CPU model does not contain).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from echosim.frontend.zoo import ArchConfig  # noqa: E402

BATCH = 4  # sequences per micro-batch (per rank)
PIPELINE_MICROBATCHES = 4
MODELS: dict[str, ArchConfig] = {
    "gpt-4L-256": ArchConfig("gpt", layers=4, hidden=256, heads=4, vocab=4096, seq_len=256, tied_embeddings=True),
    "gpt-6L-384": ArchConfig("gpt", layers=6, hidden=384, heads=6, vocab=4096, seq_len=256, tied_embeddings=True),
    "llama-4L-256": ArchConfig("llama", layers=4, hidden=256, heads=4, kv_heads=2, ffn=688, vocab=4096, seq_len=256),
    "llama-6L-384": ArchConfig("llama", layers=6, hidden=384, heads=6, kv_heads=2, ffn=1024, vocab=4096, seq_len=256),
    # other shapes (issue 16): wider (hidden 512, its 4 MiB weights and 8 MiB MLP activations), deeper, and a
    # longer sequence (1,024 tokens: attention 4x the share of a 256-token step; vocabulary 1,024 so that
    # its 16 MiB logits stay under the 32 MiB mmap threshold)
    "gpt-4L-512": ArchConfig("gpt", layers=4, hidden=512, heads=8, vocab=4096, seq_len=256, tied_embeddings=True),
    "llama-8L-256": ArchConfig("llama", layers=8, hidden=256, heads=4, kv_heads=2, ffn=688, vocab=4096, seq_len=256),
    "llama-4L-256-s1024": ArchConfig(
        "llama", layers=4, hidden=256, heads=4, kv_heads=2, ffn=688, vocab=1024, seq_len=1024
    ),
}
ALL_CORES = "1 process (all cores)"
LAYOUTS = ("1 process", ALL_CORES, "DDP x2 (gloo)", "pipeline x2 (gloo)")
NOTES = [
    "* Each process runs one intra-op thread, so two ranks share the two cores as two devices would; gloo's "
    "own threads and the kernel's TCP stack share them too, which the calibration's derived overlap slowdown "
    "(a core time-shared by compute and communication) stands for.",
    "* The machine is shared with other work. `other load` is the CPU other processes used during the run, "
    "from /proc/stat; a run with a quarter of a core or more of it is re-measured and the quietest attempt is "
    "kept (every attempt is in `benchmarks/data/cpu_reality.json`), chosen by load, never by error.",
    "* The pipeline layout runs Llama models (untied embeddings, so no weight is shared between the stages), "
    "1F1B with 4 micro-batches, activations and gradients sent with gloo send/recv.",
    "* Models are fp32 (this CPU has no fast bf16 path) and sized so that no tensor reaches glibc's 32 MiB mmap "
    "threshold: larger allocations pay page faults on every step, a regime the CPU model does not contain.",
]
# Other processes using more than this many cores on average during a run make it "contended".
CONTENDED_CORES = 0.25


@dataclass
class Measured:
    step_s: float  # median wall time of a step
    cpu_share: float  # CPU time / wall time of the measured steps (1.0: the process never waited)
    steps: list[float]
    load_before: float
    load_after: float
    other_cores: float  # CPU cores other processes on the machine used, on average, during the run
    probe: dict[str, Any] | None = None  # the machine-speed probe timed just before the run (calibrate.probe)
    faults_per_step: float | None = None  # rank 0's minor page faults in its median timed step (getrusage)
    faults: list[float] | None = None  # ... in each timed step


def _busy_seconds() -> float:
    """CPU seconds the whole machine has been busy (all processes), from /proc/stat."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _children_cpu() -> float:
    t = os.times()
    return t.children_user + t.children_system


# ---- the real training (worker processes) -------------------------------------------------------


def _build(cfg: ArchConfig) -> Any:
    import torch

    from echosim.frontend import zoo_modules

    torch.manual_seed(0)
    model = (zoo_modules.GPT if cfg.arch == "gpt" else zoo_modules.Llama)(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    return model


def one_thread_step(name: str, fused: bool = True) -> Callable[[], None]:
    """The '1 process' rows' training step of model ``name`` on one intra-op thread, warmed up 3 times.

    ``cpu_breakdown.py`` and ``cpu_heap_trim.py`` time this step, so they diagnose exactly what the rows run.
    """
    import torch

    torch.set_num_threads(1)
    cfg = MODELS[name]
    model = _build(cfg)
    ids = torch.randint(0, cfg.vocab, (BATCH, cfg.seq_len), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(ids, ids).backward()
        opt.step()

    for _ in range(3):
        step()
    return step


def _time_steps(
    step: Any, steps: int, reduce_max: Any = None, faults: list[float] | None = None
) -> tuple[list[float], float]:
    """Wall seconds of ``steps`` steps after 3 warm-up ones, and the CPU share of them; ``faults``: gets the
    minor page faults (pages the kernel mapped afresh) of each timed step."""
    import resource

    for _ in range(3):
        step()
    walls, cpus = [], []
    for _ in range(steps):
        if reduce_max is not None:
            reduce_max(None)  # a barrier: ranks start each step together
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        c0, w0 = time.process_time(), time.perf_counter()
        step()
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        if faults is not None:
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        if reduce_max is not None:
            wall, cpu = reduce_max((wall, cpu))
        walls.append(wall)
        cpus.append(cpu)
    return walls, sum(cpus) / sum(walls)


def gloo_group(rank: int, world: int, port: int) -> Callable[[tuple[float, float] | None], tuple[float, float]] | None:
    """Join a gloo group of ``world`` ranks (none for one process); the function that takes the
    element-wise maximum of a pair of timings across the ranks."""
    if world <= 1:
        return None
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)

    def reduce_max(values: tuple[float, float] | None) -> tuple[float, float]:
        t = torch.tensor(values if values is not None else (0.0, 0.0), dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t[0]), float(t[1])

    return reduce_max


def worker(model_name: str, layout: str, rank: int, world: int, port: int, steps: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads_of(layout))
    cfg = MODELS[model_name]
    model = _build(cfg)
    ids = torch.randint(0, cfg.vocab, (BATCH, cfg.seq_len), generator=torch.Generator().manual_seed(rank))
    reduce_max = gloo_group(rank, world, port)
    if layout == "pipeline x2 (gloo)":
        step = _pipeline_step(model, cfg, ids, rank, world)
    else:
        if layout == "DDP x2 (gloo)":
            model = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            model(ids, ids).backward()
            opt.step()

    faults: list[float] = []
    walls, share = _time_steps(step, steps, reduce_max, faults)
    if world > 1:
        import torch.distributed as dist

        dist.destroy_process_group()
    return {"steps": walls, "cpu_share": share, "faults_per_step": statistics.median(faults), "faults": faults}


def _pipeline_step(model: Any, cfg: ArchConfig, ids: Any, rank: int, world: int) -> Any:
    """1F1B over two stages with blocking gloo send/recv of activations and their gradients."""
    import torch
    import torch.distributed as dist

    if cfg.arch != "llama" or world != 2:
        raise ValueError("the pipeline layout runs Llama models on two stages")
    half = cfg.layers // 2
    mine = model.layers[:half] if rank == 0 else model.layers[half:]
    params = list(mine.parameters()) + (
        list(model.embed.parameters()) if rank == 0 else [*model.norm.parameters(), *model.lm_head.parameters()]
    )
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    m = PIPELINE_MICROBATCHES
    micro = ids.repeat(m, 1).chunk(m)  # m micro-batches of BATCH sequences
    s = cfg.seq_len
    cos, sin = model.cos.narrow(0, 0, s), model.sin.narrow(0, 0, s)
    shape = (BATCH, s, cfg.hidden)
    handles: list[tuple[Any, torch.Tensor]] = []  # sends in flight (isend: a blocking send could deadlock 1F1B)

    def forward(i: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        if rank == 0:
            x = model.embed(micro[i])
            for layer in mine:
                x = layer(x, cos, sin)
            sent = x.detach()
            handles.append((dist.isend(sent, 1), sent))  # waited at the end of the step
            return x, None
        x_in = torch.empty(shape)
        dist.recv(x_in, 0)
        x_in.requires_grad_(True)
        x = x_in
        for layer in mine:
            x = layer(x, cos, sin)
        logits = model.lm_head(model.norm(x))
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), micro[i].flatten())
        return loss, x_in

    def backward(out: torch.Tensor, x_in: torch.Tensor | None) -> None:
        if rank == 0:
            grad = torch.empty(shape)
            dist.recv(grad, 1)
            out.backward(grad)
        else:
            out.backward()
            grad = x_in.grad  # type: ignore[union-attr]
            handles.append((dist.isend(grad, 0), grad))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        warmup = world - rank - 1
        pending: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        for i in range(m):
            pending.append(forward(i))
            if i >= warmup:
                backward(*pending.pop(0))
        while pending:
            backward(*pending.pop(0))
        for handle, _ in handles:
            handle.wait()
        handles.clear()
        opt.step()

    return step


# ---- orchestration -----------------------------------------------------------------------------


def threads_of(layout: str) -> int:
    """Intra-op threads of each rank: one, or every usable core for the all-cores layout."""
    return len(os.sched_getaffinity(0)) if layout == ALL_CORES else 1


def ranks_of(layout: str) -> int:
    return 1 if layout in ("1 process", ALL_CORES) else 2


def measure(model_name: str, layout: str, steps: int) -> Measured:
    """Run one layout in fresh processes and collect the slowest rank's steps."""
    world = ranks_of(layout)
    args = ["--worker", model_name, "--layout", layout, "--world", str(world), "--port", str(_free_port()),
            "--steps", str(steps)]  # fmt: skip
    return run_ranks(__file__, args, world, f"{model_name} / {layout}", threads_of(layout))


def run_ranks(script: str, args: list[str], world: int, label: str, threads: int = 1) -> Measured:
    """Start ``world`` ranks of ``script --rank R`` (``threads`` each) and read rank 0's steps and the load."""
    from echosim.calibrate.probe import run_probe

    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, script, *args]
    probe = run_probe(threads=threads)  # the speed now, on the run's threads: drift since calibration, not model error
    load_before = os.getloadavg()[0]
    busy0, ours0, t0 = _busy_seconds(), _children_cpu(), time.perf_counter()
    procs = [
        subprocess.Popen([*cmd, "--rank", str(r)], stdout=subprocess.PIPE, text=True, env=env) for r in range(world)
    ]
    outs = [p.communicate(timeout=1800)[0] for p in procs]
    elapsed = time.perf_counter() - t0
    others = max(0.0, (_busy_seconds() - busy0) - (_children_cpu() - ours0)) / elapsed
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{label}: a worker failed")
    result = json.loads(outs[0].strip().splitlines()[-1])
    return Measured(
        statistics.median(result["steps"]),
        result["cpu_share"],
        result["steps"],
        load_before,
        os.getloadavg()[0],
        others,
        probe,
        result.get("faults_per_step"),
        result.get("faults"),
    )


def calibration_probe(ref: str) -> dict[str, Any] | None:
    """The machine-speed probe a calibration stored when it was made (``None`` for older calibrations)."""
    from echosim.calibrate import load_calibration

    return load_calibration(ref).machine.get("cpu-x86", {}).get("probe")


def drift_of(ref: str, probe: dict[str, Any] | None) -> dict[str, float] | None:
    """How much slower (+) the machine ran ``probe`` than when calibration ``ref`` was made."""
    from echosim.calibrate.probe import probe_drift

    then = calibration_probe(ref)
    return probe_drift(then, probe) if then and probe else None


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_results(procs: list[subprocess.Popen[str]], what: str) -> list[dict[str, Any]]:
    """Each rank's result: the JSON of its first ``R `` line on stdout (the profiling scripts' worker protocol)."""
    outs = []
    for p in procs:
        lines = [line for line in p.communicate()[0].splitlines() if line.startswith("R ")]
        if p.returncode != 0 or not lines:
            raise SystemExit(f"a {what} rank exited with status {p.returncode}")
        outs.append(json.loads(lines[0][2:]))
    return outs


def plan_for(cfg: ArchConfig, layout: str) -> tuple[Any, Any]:
    from echosim.plan import Plan

    if layout in ("1 process", ALL_CORES):
        return Plan(micro_batch=BATCH, global_batch=BATCH, dtype="fp32", attention="flash"), 1
    if layout == "DDP x2 (gloo)":
        return Plan(dp=2, micro_batch=BATCH, global_batch=2 * BATCH, dtype="fp32", attention="flash"), 2
    plan = Plan(
        pp=2,
        micro_batch=BATCH,
        global_batch=PIPELINE_MICROBATCHES * BATCH,
        dtype="fp32",
        attention="flash",
        schedule="1f1b",
    )
    return plan, 2


def predict(cfg: ArchConfig, layout: str, calibration: str) -> dict[str, Any]:
    from echosim.compiler import compile as compile_model
    from echosim.plan import Cluster

    plan, devices = plan_for(cfg, layout)
    report = compile_model(cfg.with_(dropout=0.0), plan, Cluster("cpu-x86", devices, 2, calibration=calibration))
    return {"step_time_s": report.step_time_s, "breakdown": report.breakdown}


def applicable(cfg: ArchConfig, layout: str) -> bool:
    return layout != "pipeline x2 (gloo)" or cfg.arch == "llama"


#: The calibration each layout is predicted with: its (ranks, threads per rank).
CALIBRATION_OF = {"1 process": (1, 1), ALL_CORES: (1, 0), "DDP x2 (gloo)": (2, 1), "pipeline x2 (gloo)": (2, 1)}


def calibration_key(layout: str) -> int | str:
    """The key of a layout's calibration in :func:`calibrate`'s result: 1 and 2 ranks of one thread, or "all"."""
    return "all" if layout == ALL_CORES else CALIBRATION_OF[layout][0]


def calibrate(db: Path, sweep: str, tag: str = "", keys: tuple[int | str, ...] = (1, 2)) -> dict[int | str, str]:
    """Calibrations of this machine (:func:`calibration_key`): one rank alone (1), two ranks computing at once,
    with gloo (2), one rank with a thread on every core ("all"); ``tag`` tells apart several sets in one
    database. Each one's samples are kept beside it (NAME.json)."""
    from echosim.calibrate.run import run_calibration

    refs: dict[int | str, str] = {}
    every: list[tuple[int | str, int, int]] = [(1, 1, 1), (2, 2, 1), ("all", 1, threads_of(ALL_CORES))]
    for key, ranks, threads in (x for x in every if x[0] in keys):
        name = f"cpu-reality-{ranks}rank{tag}" if key != "all" else f"cpu-reality-allcores{tag}"
        result = run_calibration(
            backend="cpu-x86", name=name, db=db, sweep=sweep, ranks=ranks, threads=threads, echo=print
        )
        # the samples beside the database, so that another model can be fitted to the same measurements
        (db.parent / f"{name}.json").write_text(json.dumps(result, indent=1, sort_keys=True))
        refs[key] = f"{db}#{name}"
    return refs


def calibrations_for(args: argparse.Namespace, keys: tuple[int | str, ...] = (1, 2)) -> dict[int | str, str]:
    """The ``--calibration`` references (one rank, two ranks, all cores) when given, else those of ``keys``
    made now."""
    if args.calibration:
        return dict(zip((1, 2, "all"), args.calibration, strict=False))
    return calibrate(Path(tempfile.mkdtemp()) / "calibration.sqlite", args.sweep, keys=keys)


def worker_parser(doc: str | None) -> argparse.ArgumentParser:
    """The arguments a CPU-reality script gives its own rank processes (:func:`run_ranks`)."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("--worker")
    parser.add_argument("--layout", default="1 process")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--steps", type=int, default=10)
    return parser


def main() -> None:
    parser = worker_parser(__doc__)
    parser.add_argument(
        "--calibration",
        nargs="+",
        metavar="REF",
        help="Calibrations for one process, two processes and one process on all cores (NAME, PATH or "
        "PATH#NAME; the third only with the all-cores layout); default: calibrate now.",
    )
    parser.add_argument("--sweep", default="standard", help="Calibration sweep when calibrating now.")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="Comma-separated subset of the layouts.")
    parser.add_argument("--out", type=Path, help="Write the results as JSON here.")
    parser.add_argument("--retries", type=int, default=3, help="Re-measure a contended row up to this many times.")
    parser.add_argument("--retry-wait", type=float, default=20.0, help="Seconds to wait before re-measuring.")
    parser.add_argument(
        "--order",
        choices=("model", "layout", "row"),
        default="model",
        help="Rows model by model (each model's layouts back to back), or layout by layout with each layout "
        "calibrated just before its rows, or model by model with each row's layout calibrated again just before "
        "it (without --calibration; 'row' adds 0.5-1.5 minutes a row).",
    )
    args = parser.parse_args()
    if args.worker:
        result = worker(args.worker, args.layout, args.rank, args.world, args.port, args.steps)
        if args.rank == 0:
            print(json.dumps(result))
        return
    layouts = args.layouts.split(",")
    if unknown := [x for x in layouts if x not in LAYOUTS]:
        parser.error(f"unknown layout {unknown[0]!r}; known: {', '.join(LAYOUTS)}")
    if args.calibration and len(args.calibration) < 2 + (ALL_CORES in layouts):
        parser.error("--calibration needs ONE_RANK TWO_RANKS, and ALL_CORES with the all-cores layout")
    keys = tuple(dict.fromkeys(calibration_key(x) for x in layouts))
    # --order layout / row: each layout's calibration is made just before its rows / each row (less drift between
    # the two: this VM's one-thread step time moved by 25% within an hour while a calibration 50 minutes old
    # predicted it, from -21% to +7% for llama-4L-256; one made just before, -7% to -1%: docs/backends.md)
    per_row = args.order == "row" and not args.calibration
    calibrations = {} if args.order in ("layout", "row") and not args.calibration else calibrations_for(args, keys)
    database = Path(tempfile.mkdtemp()) / "calibration.sqlite"
    from echosim.calibrate import load_calibration
    from echosim.calibrate.fit import machine_identity

    ident = machine_identity(1, 2)
    header: dict[str, Any] = {
        "machine": f"{ident['cpu_model']}, {ident['usable_cores']} cores, {ident['memory_GB']:.0f} GB, "
        f"torch {ident['torch']}",
        "notes": NOTES,
        "order": args.order,
    }

    def describe_calibrations() -> None:
        header["calibration"] = {str(k): ref for k, ref in calibrations.items()}
        header["parameters"] = {
            str(k): load_calibration(ref).parameters.get("cpu-x86", {}) for k, ref in calibrations.items()
        }
        header["calibration_probes"] = {str(k): calibration_probe(ref) for k, ref in calibrations.items()}

    describe_calibrations()
    rows = []
    print(f"{'model':<20}{'layout':<22}{'measured s':>11}{'cpu share':>10}{'predicted s':>12}{'error':>8}"
          f"{'drift mm/st':>13}")  # fmt: skip
    models = args.models.split(",")
    if args.order == "layout":
        pairs = [(name, layout) for layout in layouts for name in models]
    else:
        pairs = [(name, layout) for name in models for layout in layouts]
    for name, layout in pairs:
        cfg = MODELS[name]
        if not applicable(cfg, layout):
            continue
        if calibration_key(layout) not in calibrations or per_row:
            tag = f"-row{len(rows)}" if per_row else ""
            calibrations.update(calibrate(database, args.sweep, tag, keys=(calibration_key(layout),)))
            describe_calibrations()
        first = measure_or_retry(name, layout, args.steps)
        if first is None:
            continue
        attempts = [first]
        while attempts[-1].other_cores >= CONTENDED_CORES and len(attempts) <= args.retries:
            time.sleep(args.retry_wait)  # other work is running: measure again, keep every attempt
            again = measure_or_retry(name, layout, args.steps)
            if again is None:
                break
            attempts.append(again)
        m = min(attempts, key=lambda a: a.other_cores)  # the quietest attempt, whatever its step time
        p = predict(cfg, layout, calibrations[calibration_key(layout)])
        error = p["step_time_s"] / m.step_s - 1
        drift = drift_of(calibrations[calibration_key(layout)], m.probe)
        rows.append(
            {
                "model": name,
                "layout": layout,
                "measured_step_s": m.step_s,
                "cpu_share": m.cpu_share,
                "steps_s": m.steps,
                "load_before": m.load_before,
                "load_after": m.load_after,
                "other_cores": m.other_cores,
                "attempts": [{"step_s": a.step_s, "other_cores": a.other_cores} for a in attempts],
                "probe": m.probe,
                "probe_drift": drift,
                "faults_per_step": m.faults_per_step,
                "faults": m.faults,
                "calibration": calibrations[calibration_key(layout)],
                "predicted_step_s": p["step_time_s"],
                "error": error,
                "breakdown": p["breakdown"],
            }
        )
        if args.out:  # after every row, so that an interrupted run keeps what it measured
            args.out.write_text(json.dumps({**header, "rows": rows}, indent=1, sort_keys=True))
        flag = "" if m.other_cores < CONTENDED_CORES else f"  (contended: others used {m.other_cores:.1f} cores)"
        print(
            f"{name:<20}{layout:<22}{m.step_s:>11.3f}{m.cpu_share:>10.2f}{p['step_time_s']:>12.3f}"
            f"{100 * error:>+7.1f}%{_drift_text(drift):>13}{flag}",
            flush=True,
        )
    errors = [abs(r["error"]) for r in rows]
    print(f"mean absolute error {100 * statistics.mean(errors):.1f}%, worst {100 * max(errors):.1f}% over {len(rows)}")
    if args.out:
        args.out.write_text(json.dumps({**header, "rows": rows}, indent=1, sort_keys=True))


def measure_or_retry(name: str, layout: str, steps: int) -> Measured | None:
    """:func:`measure`, run again once if a worker process dies; None, with one line, if it dies again.

    A two-rank gloo run has aborted in teardown ("terminate called without an active exception", once in the
    50 pipeline rows of two runs): one lost row should not end a 25-row, half-hour run.
    """
    for attempt in range(2):
        try:
            return measure(name, layout, steps)
        except RuntimeError as err:
            then = "measuring it again" if attempt == 0 else "row skipped"
            print(f"{err}: {then}", file=sys.stderr, flush=True)
    return None


def _drift_text(drift: dict[str, float] | None) -> str:
    return f"{drift['matmul_s']:+.0%}/{drift['stream_s']:+.0%}" if drift else "-"


if __name__ == "__main__":
    main()
