"""Where a DDP x2 (gloo) step of benchmarks/cpu_reality_nonllm.py spends its CPU time, against one process.

Usage::

    python benchmarks/ddp_profile_cpu.py [--model dlrm-small] [--steps 20]

Runs the model three ways in fresh processes (one thread each, fused AdamW, the same step as
``cpu_reality_nonllm.py``): one process, DDP x2 with PyTorch's default
``gradient_as_bucket_view=False``, and DDP x2 with ``gradient_as_bucket_view=True``. For each it
prints rank 0's CPU time per step and the self CPU time per step of the ops that differ (torch.profiler):
``aten::mul`` holds the reducer's ``mul_out(bucket_view, grad, 1/world)``, ``aten::copy_`` its
``grad.copy_(bucket_view)`` after the all-reduce, ``aten::fill_`` the zero-fills of dense table
gradients. gloo's own threads are in the process CPU time but not in the profiled ops. The
profiler times ops by the wall clock, so on a loaded machine they include time the scheduler gave
to others (the CPU column does not): compare them on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

OPS = ("aten::mul", "aten::copy_", "aten::fill_", "aten::_fused_adamw_", "c10d::allreduce_")
VARIANTS = {"1 process": (1, False), "DDP x2": (2, False), "DDP x2, bucket views": (2, True)}


def worker(name: str, world: int, rank: int, port: int, views: bool, steps: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from cpu_reality_nonllm import MODELS, _batch, train_step
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model: Any = MODELS[name][0].build()
    inputs, labels = _batch(name, rank)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        model = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=views)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    step = train_step(name, model, opt, inputs, labels)

    for _ in range(3):
        step()
    c0 = time.process_time()
    for _ in range(steps):
        step()
    cpu = (time.process_time() - c0) / steps
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    ops = {e.key: e.self_cpu_time_total * 1e-6 / steps for e in prof.key_averages() if e.key in OPS}
    if world > 1:
        dist.destroy_process_group()
    return {"cpu_step_s": cpu, "self_cpu_s": ops}


def run(name: str, world: int, views: bool, steps: int) -> dict[str, Any]:
    from cpu_reality import _free_port

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    args = [sys.executable, __file__, "--worker", "--model", name, "--world", str(world), "--port",
            str(_free_port()), "--steps", str(steps)] + (["--views"] if views else [])  # fmt: skip
    procs = [subprocess.Popen([*args, "--rank", str(r)], stdout=subprocess.PIPE, text=True, env=env)
             for r in range(world)]  # fmt: skip
    outs = [p.communicate(timeout=1800)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"{name}: a worker failed")
    return dict(json.loads(outs[0].strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", default="dlrm-small", choices=("dlrm-small", "lstm-small"))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--views", action="store_true")
    args = parser.parse_args()
    if args.steps < 1:
        raise SystemExit(f"--steps must be at least 1, got {args.steps}")
    if args.worker:
        result = worker(args.model, args.world, args.rank, args.port, args.views, args.steps)
        if args.rank == 0:
            print(json.dumps(result))
        return
    print(f"{args.model}, load average {os.getloadavg()[0]:.1f}; ms per step (rank 0)")
    print(f"{'layout':<22}{'CPU':>8}" + "".join(f"{op.split('::')[1]:>14}" for op in OPS))
    for label, (world, views) in VARIANTS.items():
        r = run(args.model, world, views, args.steps)
        ops = "".join(f"{1e3 * r['self_cpu_s'].get(op, 0.0):>14.2f}" for op in OPS)
        print(f"{label:<22}{1e3 * r['cpu_step_s']:>8.2f}{ops}", flush=True)


if __name__ == "__main__":
    main()
