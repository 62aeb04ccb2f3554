"""CPU time of a DDP x2 (gloo) step of ``cpu_reality.py``'s models, thread by thread, against one process.

Usage::

    python benchmarks/ddp_threads_cpu.py [--model llama-4L-256] [--steps 8] [--rounds 2]

Runs the model's step (one intra-op thread, fused AdamW, ``cpu_reality.py``'s step) in fresh processes: one process
alone, and two ranks of ``DistributedDataParallel`` over gloo three ways: PyTorch's defaults, with
``gradient_as_bucket_view=True`` (no copies of gradients into the buckets and back), and under ``no_sync()`` (no
all-reduce and no bucket copies: the ranks only run side by side). Each rank reads every thread's CPU time from
``/proc/self/task/*/stat`` (utime + stime, clock ticks) around its timed steps, so the main thread (the model,
autograd, DDP's reducer) is told apart from gloo's threads (``gloo_tcp_loop``: the loopback TCP transport;
``pt_gloo_runloop``: the collectives' algorithm and reductions). CPU time leaves out the time the scheduler gave to
other processes, but a step that waits on a shared machine also finds colder caches: compare on a quiet machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import cpu_reality as cr  # noqa: E402

VARIANTS = {"1 process": 1, "DDP x2": 2, "DDP x2, bucket views": 2, "DDP x2, no_sync": 2}


def thread_cpu_s() -> dict[str, float]:
    """CPU seconds of each of this process's threads so far, keyed ``tid:name`` (proc(5): stat fields 14 and 15)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        except OSError:  # the thread ended
            continue
        out[f"{tid}:{name}"] = (int(fields[11]) + int(fields[12])) / tick
    return out


def rank_step(
    model_name: str, rank: int, world: int, port: int, *, ddp: bool, no_sync: bool = False, **ddp_kwargs: Any
) -> tuple[Callable[[], None], Any]:
    """One thread's training step of a ``cpu_reality`` model on this rank (zero_grad, forward, backward under
    ``no_sync()`` if asked, fused AdamW), DDP-wrapped if ``ddp``, after three warm-up steps; and the gloo group's
    element-wise maximum (:func:`cpu_reality.gloo_group`, None for one rank)."""
    import torch

    torch.set_num_threads(1)
    cfg = cr.MODELS[model_name]
    model = cr._build(cfg)
    ids = torch.randint(0, cfg.vocab, (cr.BATCH, cfg.seq_len), generator=torch.Generator().manual_seed(rank))
    reduce_max = cr.gloo_group(rank, world, port)
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(model, **ddp_kwargs)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    quiet = model.no_sync if no_sync else contextlib.nullcontext

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with quiet():
            model(ids, ids).backward()
        opt.step()

    for _ in range(3):
        step()
    return step, reduce_max


def worker(model_name: str, variant: str, rank: int, port: int, steps: int) -> dict[str, Any]:
    """One rank: median wall and CPU seconds of a step, and CPU seconds a step of each thread by name."""
    world = VARIANTS[variant]
    step, reduce_max = rank_step(
        model_name, rank, world, port, ddp=world > 1, no_sync=variant.endswith("no_sync"),
        **({"gradient_as_bucket_view": variant.endswith("views")} if world > 1 else {}),
    )  # fmt: skip
    before = thread_cpu_s()
    walls, cpus = [], []
    for _ in range(steps):
        if reduce_max is not None:
            reduce_max(None)  # the ranks start each step together
        c0, w0 = time.process_time(), time.perf_counter()
        step()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    after = thread_cpu_s()
    by_name: dict[str, float] = {}
    for key, seconds in after.items():
        name = "main" if key.split(":", 1)[0] == str(os.getpid()) else key.split(":", 1)[1]
        by_name[name] = by_name.get(name, 0.0) + (seconds - before.get(key, 0.0)) / steps
    if world > 1:
        import torch.distributed as dist

        dist.destroy_process_group()
    return {"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus), "threads_s": by_name}


def run(model_name: str, variant: str, steps: int) -> list[dict[str, Any]]:
    port = cr._free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, __file__, "--worker", model_name, "--variant", variant, "--port", str(port)]
    procs = [
        subprocess.Popen([*cmd, "--rank", str(r), "--steps", str(steps)], stdout=subprocess.PIPE, text=True, env=env)
        for r in range(VARIANTS[variant])
    ]
    return cr.rank_results(procs, variant)


def add_worker_options(parser: argparse.ArgumentParser) -> None:
    """The hidden options a rank's own process is started with (``--worker MODEL --variant --rank --port``)."""
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--variant", default="1 process", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-4L-256", choices=sorted(cr.MODELS))
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2, help="Times each variant runs, the variants interleaved.")
    parser.add_argument("--out", type=Path, help="Write the figures as JSON here.")
    add_worker_options(parser)
    args = parser.parse_args()
    if args.worker:
        print("R " + json.dumps(worker(args.worker, args.variant, args.rank, args.port, args.steps)), flush=True)
        return
    results = []
    print(f"{args.model}: CPU ms a step by thread (main: model, autograd, reducer; gloo: its transport and algorithm)")
    for _ in range(args.rounds):
        for variant in VARIANTS:
            load = os.getloadavg()[0]
            ranks = run(args.model, variant, args.steps)
            results.append({"variant": variant, "load": load, "ranks": ranks})
            for r, out in enumerate(ranks):
                threads = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in sorted(out["threads_s"].items()) if v > 0)
                print(
                    f"{variant:22s} rank {r}: wall {out['wall_s'] * 1e3:5.0f} CPU {out['cpu_s'] * 1e3:5.0f} "
                    f"({threads}); load {load:.2f}",
                    flush=True,
                )
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
