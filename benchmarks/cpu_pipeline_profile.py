"""Where each rank of ``cpu_reality.py``'s two-stage 1F1B pipeline spends its step, against echosim's stages.

Usage::

    python benchmarks/cpu_pipeline_profile.py [--model llama-4L-256] [--calibration TWO_RANKS] [--steps 6]

Runs the pipeline layout of ``benchmarks/cpu_reality.py`` (two processes, one thread each, gloo send/recv, the same
``_pipeline_step``) and, in each rank, times every step by the wall clock and the process CPU clock, the time it
is blocked in ``dist.recv`` and in waiting for its ``isend`` handles, and then profiles three steps with
``torch.profiler`` (self CPU time a step by ``cpu_breakdown``'s categories). Beside it, echosim's stages on the
calibrated ``cpu-x86`` backend (``--calibration``: a two-rank calibration; default: one made now): each stage's
forward and backward time per micro-batch, and the step that 1F1B on two stages gives when the last stage is
the slower one: the first stage's forward of the first micro-batch, the last stage's m forwards and backwards,
the first stage's backward of the last micro-batch (``f0 + m (f1 + b1) + b0``). In the real run the first is
rank 1's time blocked in its first ``recv``, the second rank 1's step without it (and its CPU time, which leaves
out time the scheduler gave to other processes on a shared machine), and the step rank 0's.
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import cpu_breakdown as cb  # noqa: E402
import cpu_reality as cr  # noqa: E402

PIPELINE = "pipeline x2 (gloo)"


def rank_main(model_name: str, rank: int, port: int, steps: int) -> dict[str, Any]:
    """One rank: its steps' wall and CPU seconds, the seconds blocked in gloo, its profiled categories."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(1)
    cfg = cr.MODELS[model_name]
    model = cr._build(cfg)
    ids = torch.randint(0, cfg.vocab, (cr.BATCH, cfg.seq_len), generator=torch.Generator().manual_seed(rank))
    reduce_max = cr.gloo_group(rank, 2, port)
    assert reduce_max is not None
    blocked = {"recv_wall": 0.0, "recv_cpu": 0.0, "first_recv_wall": 0.0, "wait_wall": 0.0}
    recv, isend = dist.recv, dist.isend

    def timed_recv(tensor: Any, src: int) -> Any:
        c0, w0 = time.process_time(), time.perf_counter()
        out = recv(tensor, src)
        wall = time.perf_counter() - w0
        if blocked["recv_wall"] == 0.0:
            blocked["first_recv_wall"] = wall
        blocked["recv_wall"] += wall
        blocked["recv_cpu"] += time.process_time() - c0
        return out

    class Handle:
        def __init__(self, handle: Any) -> None:
            self.handle = handle

        def wait(self) -> None:
            w0 = time.perf_counter()
            self.handle.wait()
            blocked["wait_wall"] += time.perf_counter() - w0

    dist.recv = timed_recv  # _pipeline_step looks them up on the module when it runs
    dist.isend = lambda tensor, dst: Handle(isend(tensor, dst))
    step = cr._pipeline_step(model, cfg, ids, rank, 2)
    for _ in range(3):
        step()
    rows = []
    for _ in range(steps):
        reduce_max(None)  # the ranks start each step together
        blocked.update(dict.fromkeys(blocked, 0.0))
        c0, w0 = time.process_time(), time.perf_counter()
        step()
        rows.append({"wall": time.perf_counter() - w0, "cpu": time.process_time() - c0, **blocked})
    reduce_max(None)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            step()
    by: dict[str, float] = {}
    for e in prof.events():
        parent, under = e.cpu_parent, e.name.startswith("Optimizer.")
        while parent is not None and not under:
            under, parent = parent.name.startswith("Optimizer."), parent.cpu_parent
        cat = cb.real_category(e.name, under)
        by[cat] = by.get(cat, 0.0) + e.self_cpu_time_total / 1e6 / 3
    dist.destroy_process_group()
    return {"rank": rank, "steps": rows, "categories_s": by}


def measure(model_name: str, steps: int) -> list[dict[str, Any]]:
    port = cr._free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, __file__, "--worker", model_name, "--port", str(port), "--steps", str(steps)]
    procs = [subprocess.Popen([*cmd, "--rank", str(r)], stdout=subprocess.PIPE, text=True, env=env) for r in range(2)]
    return cr.rank_results(procs, "pipeline")


def predicted_stages(model_name: str, calibration: str) -> dict[str, Any]:
    from echosim.compiler import compile as compile_model
    from echosim.plan import Cluster

    cfg = cr.MODELS[model_name]
    plan, devices = cr.plan_for(cfg, PIPELINE)
    report = compile_model(cfg.with_(dropout=0.0), plan, Cluster("cpu-x86", devices, 2, calibration=calibration))
    return {"step_s": report.step_time_s, "stages": report.stages}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-4L-256", choices=[m for m in cr.MODELS if m.startswith("llama")])
    parser.add_argument("--calibration", help="Two-rank calibration (NAME, PATH or PATH#NAME); default: one now.")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", type=Path, help="Write the figures as JSON here.")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print("R " + json.dumps(rank_main(args.worker, args.rank, args.port, args.steps)), flush=True)
        return
    db = Path(tempfile.mkdtemp()) / "calibration.sqlite"
    calibration = args.calibration or cr.calibrate(db, "standard", keys=(2,))[2]
    load0 = os.getloadavg()[0]
    ranks = measure(args.model, args.steps)
    load1 = os.getloadavg()[0]
    pred = predicted_stages(args.model, calibration)
    m = cr.PIPELINE_MICROBATCHES
    print(f"{args.model}, {PIPELINE}, {m} micro-batches, load {load0:.2f} -> {load1:.2f}")
    real: dict[int, dict[str, float]] = {}
    for r in ranks:
        med = {k: statistics.median(row[k] for row in r["steps"]) for k in r["steps"][0]}
        real[r["rank"]] = med
        walls = ", ".join(f"{row['wall'] * 1e3:.0f}" for row in r["steps"])
        cats = ", ".join(f"{k} {v * 1e3:.0f}" for k, v in sorted(r["categories_s"].items()))
        print(
            f"rank {r['rank']}: step {med['wall'] * 1e3:.0f} ms (CPU {med['cpu'] * 1e3:.0f}), blocked in recv "
            f"{med['recv_wall'] * 1e3:.0f} ms (first {med['first_recv_wall'] * 1e3:.0f}), in isend waits "
            f"{med['wait_wall'] * 1e3:.0f} ms; steps {walls}"
        )
        print(f"        profiled self CPU ms a step: {cats} (sum {sum(r['categories_s'].values()) * 1e3:.0f})")
    s0, s1 = pred["stages"][0], pred["stages"][-1]
    f0, b0, f1, b1 = s0["fwd_s"], s0["bwd_s"], s1["fwd_s"], s1["bwd_s"]
    last = m * (f1 + b1) + s1["optimizer_s"]
    rows = [
        ("stage 0's first forward", f0, real[1]["first_recv_wall"]),
        ("last stage's micro-batches + optimizer", last, real[1]["wall"] - real[1]["first_recv_wall"]),
        ("  the same by rank 1's CPU time", last, real[1]["cpu"] - real[1]["recv_cpu"]),
        ("stage 0's last backward + optimizer", b0 + s0["optimizer_s"], real[0]["wall"] - real[1]["wall"]),
        ("step", pred["step_s"], real[0]["wall"]),
    ]
    print(f"{'part':40s} {'echosim ms':>10s} {'real ms':>9s} {'error':>7s}")
    for label, p, r in rows:
        print(f"{label:40s} {p * 1e3:10.1f} {r * 1e3:9.1f} {p / r - 1:+7.1%}")
    if args.out:
        args.out.write_text(json.dumps({"ranks": ranks, "predicted": pred, "load": [load0, load1]}, indent=1))


if __name__ == "__main__":
    main()
