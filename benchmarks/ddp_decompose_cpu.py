"""A DDP x2 (gloo) CPU step decomposed against one process of the same model, alone and beside a neighbour.

Usage::

    python benchmarks/ddp_decompose_cpu.py [--model llama-4L-256] [--steps 6] [--profiled 3] [--rounds 2] [--out F]

Four ways to run ``cpu_reality.py``'s step (one intra-op thread, fused AdamW, micro-batch ``cpu_reality.BATCH``),
each in fresh processes, the ways interleaved round by round:

- ``1 process``: one process alone;
- ``1 process + neighbour``: two independent processes each running the one-process loop (joined by a gloo group
  only to start each step together, as DDP's ranks do): "a neighbour running training" without DDP;
- ``DDP x2``: PyTorch's ``DistributedDataParallel`` over gloo (its defaults);
- ``DDP x2, no_sync``: the same under ``no_sync()`` (no bucket copies, no all-reduce).

Each rank reports its median wall and process CPU time a step (and each step's, to pair the ranks step by step:
the median of their maximum is what lockstep costs), every thread's CPU time (``/proc/self/task/*/stat``), minor
page faults a step (``/proc/self/stat`` field 10), then ``torch.profiler`` self time a step (record_shapes) summed by
category: ``cpu_breakdown.py``'s (matmul, attention, cross entropy, optimizer, other kernels: the
memory-bound element-wise / norm / softmax / embedding ops, framework: autograd nodes, views, dispatch) plus ``ddp``
(``c10d::`` ops and the reducer's ``mul_out`` into the bucket views; its ``grad.copy_(bucket_view)`` back runs
under another range and stays with other kernels: the stored per-op table, keyed by category, name and input
shapes, tells them apart by the parameters' shapes). ``DistributedDataParallel.forward``'s self time is the
model's own Python between ops, which one process leaves outside any range. The profiler times ops by the wall
clock, so each category is also given scaled to the main thread's CPU time over the profiled steps; two busy
ranks on two cores are fine, a third process is not; every figure carries the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import cpu_breakdown as cb  # noqa: E402
import cpu_reality as cr  # noqa: E402
from ddp_threads_cpu import add_worker_options, rank_step, thread_cpu_s  # noqa: E402

VARIANTS = ("1 process", "1 process + neighbour", "DDP x2", "DDP x2, no_sync")
CATEGORIES = (*cb.CATEGORIES, "ddp")


def minor_faults() -> int:
    """Minor page faults of this process so far (proc(5): /proc/self/stat field 10, minflt)."""
    return int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[7])


def category(event: Any) -> str:
    """``cpu_breakdown.real_category`` of a profiled event, with DDP's own work (its ranges, the reducer's copies
    into and out of the bucket views, c10d ops) apart as ``ddp``."""
    names, parent = [event.name], event.cpu_parent
    while parent is not None:
        names.append(parent.name)
        parent = parent.cpu_parent
    if any(n.startswith("Optimizer.") for n in names):
        return "optimizer"
    if any(n.startswith(("c10d::", "Reducer", "gloo:")) for n in names):
        return "ddp"
    shapes = [list(s) for s in event.input_shapes or []]
    # reducer.cpp copy_grad_to_bucket: at::mul_out(bucket_view, grad, 1 / world) (mul.out: grad, scalar, out)
    if event.name == "aten::mul" and len(shapes) == 3 and shapes[1] == [] and shapes[0] == shapes[2]:
        return "ddp"
    return cb.real_category(event.name, False)


def worker(model_name: str, variant: str, rank: int, port: int, steps: int, profiled: int) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    world = 1 if variant == "1 process" else 2
    step, barrier = rank_step(
        model_name, rank, world, port, ddp=variant.startswith("DDP"), no_sync=variant.endswith("no_sync")
    )
    before, f0 = thread_cpu_s(), minor_faults()
    walls, cpus = [], []
    for _ in range(steps):
        if barrier is not None:
            barrier(None)
        c0, w0 = time.process_time(), time.perf_counter()
        step()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    after, faults = thread_cpu_s(), (minor_faults() - f0) / steps
    threads: dict[str, float] = {}
    for key, seconds in after.items():
        name = "main" if key.split(":", 1)[0] == str(os.getpid()) else key.split(":", 1)[1]
        threads[name] = threads.get(name, 0.0) + (seconds - before.get(key, 0.0)) / steps
    by = dict.fromkeys(CATEGORIES, 0.0)
    ops: dict[str, float] = {}
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        main0 = thread_cpu_s()
        for _ in range(profiled):
            if barrier is not None:
                barrier(None)
            step()
        main1 = thread_cpu_s()
    me = f"{os.getpid()}:"
    profiled_main = sum(v - main0.get(k, 0.0) for k, v in main1.items() if k.startswith(me)) / profiled
    for e in prof.events():
        if e.name.startswith(("c10d::allreduce_",)) and "MAX" in str(e.input_shapes):
            continue
        cat = category(e)
        by[cat] += e.self_cpu_time_total / 1e6 / profiled
        key = f"{cat}|{e.name}|{e.input_shapes}"
        ops[key] = ops.get(key, 0.0) + e.self_cpu_time_total / 1e6 / profiled
    if barrier is not None:
        import torch.distributed as dist

        dist.destroy_process_group()
    return {
        "wall_s": statistics.median(walls),
        "walls_s": walls,  # step by step, to pair with the other rank's (the median of their maximum: lockstep)
        "cpus_s": cpus,
        "cpu_s": statistics.median(cpus),
        "threads_s": threads,
        "minor_faults": faults,
        "categories_s": by,
        # the profiler times ops by the wall clock; scaled by the main thread's CPU time over the profiled steps,
        # a category reads CPU time where the scheduler's gaps fall evenly over the ops
        "categories_cpu_s": {c: v * profiled_main / max(sum(by.values()), 1e-12) for c, v in by.items()},
        "profiled_main_cpu_s": profiled_main,
        "ops_s": dict(sorted(ops.items(), key=lambda kv: -kv[1])[:80]),
    }


def run(model_name: str, variant: str, steps: int, profiled: int) -> list[dict[str, Any]]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    port = cr._free_port()
    cmd = [sys.executable, __file__, "--worker", model_name, "--variant", variant, "--port", str(port)]
    world = 1 if variant == "1 process" else 2
    procs = [
        subprocess.Popen(
            [*cmd, "--rank", str(r), "--steps", str(steps), "--profiled", str(profiled)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for r in range(world)
    ]
    return cr.rank_results(procs, variant)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", default="llama-4L-256", choices=sorted(cr.MODELS))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--profiled", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path)
    add_worker_options(parser)
    args = parser.parse_args()
    if args.worker:
        out = worker(args.worker, args.variant, args.rank, args.port, args.steps, args.profiled)
        print("R " + json.dumps(out), flush=True)
        return
    results = []
    print(f"{args.model}: rank 0, ms a step; profiled self time by category scaled to CPU time; minor faults a step")
    heads = "".join(f"{c[:9]:>10}" for c in CATEGORIES)
    print(f"{'variant':24s}{'wall':>6}{'cpu':>6}{'main':>6}{heads}  faults load")
    for _ in range(args.rounds):
        for variant in VARIANTS:
            load = os.getloadavg()[0]
            ranks = run(args.model, variant, args.steps, args.profiled)
            results.append({"variant": variant, "load": load, "load_after": os.getloadavg()[0], "ranks": ranks})
            r0 = ranks[0]
            cats = "".join(f"{r0['categories_cpu_s'][c] * 1e3:10.1f}" for c in CATEGORIES)
            main_ms = r0["threads_s"].get("main", 0) * 1e3
            print(
                f"{variant:24s}{r0['wall_s'] * 1e3:6.0f}{r0['cpu_s'] * 1e3:6.0f}{main_ms:6.0f}"
                f"{cats}  {r0['minor_faults']:6.0f} {load:.2f}",
                flush=True,
            )
    if args.out:
        args.out.write_text(json.dumps({"model": args.model, "batch": cr.BATCH, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
