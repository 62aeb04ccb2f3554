"""Where DDP x2 (gloo) adds to a one-process step of benchmarks/cpu_reality_nonllm.py: page faults, copies, gloo.

Usage::

    python benchmarks/ddp_heap_cpu.py [--model dlrm-small] [--repeats 2] [--variants 1p,1p-prefree,noop,timed,ddp]
                                      [--out FILE.json]

Each variant runs in fresh processes (one thread each, fused AdamW, the step of ``cpu_reality_nonllm.py``,
10 steps after 6 warm-up ones); per run: the median step (wall), the CPU share, minor page faults and
system time per step (getrusage):

* ``1p``: one process.
* ``1p-prefree``: one process that first allocates and frees one 20 MB tensor. glibc maps such a block for
  itself and, freeing it, raises its mmap threshold to the block's size and its trim threshold to twice
  that (mallopt(3): M_MMAP_THRESHOLD is dynamic up to DEFAULT_MMAP_THRESHOLD_MAX, 32 MiB on 64-bit), so
  the table gradients born every step come from the heap instead of fresh pages.
* ``1p-prefree:MB``: the same with a block of MB megabytes (10^6 bytes). The trim threshold then decides:
  the table gradients freed together at ``zero_grad`` (8 x 2.56 MB for the DLRM) stay in the heap only if
  they fit under twice the block; beyond it, free() gives the heap's top back to the kernel and the next
  step faults them in again.
* ``1p-latefree:MB``: the block is freed after three steps instead, once AdamW's states exist (mapped for
  themselves in the first step, under the initial 128 KiB threshold): whether the gradients stay in the
  heap then depends on the trim threshold alone.
* ``noop``: DDP x2 with a comm hook that returns the bucket untouched: DDP's reducer (bucket copies, its
  initial frees) without gloo.
* ``timed``: DDP x2 with a hook that all-reduces each bucket and records its bytes and wall time.
* ``ddp``: plain DDP x2.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

VARIANTS = ("1p", "1p-prefree", "noop", "timed", "ddp")


def worker(variant: str, rank: int, world: int, port: int, steps: int, name: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from cpu_reality import _time_steps, gloo_group
    from cpu_reality_nonllm import MODELS, _batch, train_step

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model: Any = MODELS[name][0].build()
    inputs, labels = _batch(name, rank)
    reduce_max = gloo_group(rank, world, port)
    if variant.startswith("1p-prefree"):
        megabytes = float(variant.partition(":")[2] or 20)
        big = torch.empty(int(megabytes * 1e6 / 4))
        big.fill_(0)
        del big
    log: list[tuple[int, float]] = []
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
        if variant == "noop":

            def hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects non-GradBucket annotations
                fut: Any = torch.futures.Future()
                fut.set_result(bucket.buffer())
                return fut

            model.register_comm_hook(None, hook)
        elif variant == "timed":

            def hook(state, bucket):  # type: ignore[no-untyped-def]
                buf = bucket.buffer().div_(world)
                t0 = time.perf_counter()
                fut = dist.all_reduce(buf, async_op=True).get_future()

                def done(f: Any, t0: float = t0, n: int = buf.numel() * 4) -> Any:
                    log.append((n, time.perf_counter() - t0))
                    return f.value()[0]

                return fut.then(done)

            model.register_comm_hook(None, hook)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    step = train_step(name, model, opt, inputs, labels)
    for _ in range(3):
        step()
    if variant.startswith("1p-latefree"):
        late = torch.empty(int(float(variant.partition(":")[2] or 20) * 1e6 / 4))
        late.fill_(0)
        del late
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    walls, share = _time_steps(step, steps, reduce_max)  # 3 more warm-up steps, then the timed ones
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    if world > 1:
        dist.destroy_process_group()
    per = steps + 3
    return {"steps": walls, "cpu_share": share, "buckets": log[-20:],
            "faults": (r1.ru_minflt - r0.ru_minflt) / per, "sys_s": (r1.ru_stime - r0.ru_stime) / per}  # fmt: skip


def run(variant: str, steps: int, name: str) -> dict[str, Any]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    world = 1 if variant.startswith("1p") else 2
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, __file__, "--worker", variant, "--world", str(world), "--port", str(port),
           "--steps", str(steps), "--model", name, "--rank"]  # fmt: skip
    procs = [subprocess.Popen([*cmd, str(r)], stdout=subprocess.PIPE, text=True, env=env) for r in range(world)]
    outs = [p.communicate()[0] for p in procs]
    res = json.loads(outs[0].strip().splitlines()[-1])
    step = statistics.median(res["steps"])
    return {"variant": variant, "step_s": step, "cpu_share": res["cpu_share"], "cpu_step_s": step * res["cpu_share"],
            "faults": res["faults"], "sys_s": res["sys_s"], "buckets": res["buckets"]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="dlrm-small")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        result = worker(args.worker, args.rank, args.world, args.port, args.steps, args.model)
        if args.rank == 0:
            print(json.dumps(result))
        return
    rows = []
    print(f"{'variant':<12}{'wall ms':>9}{'cpu ms':>8}{'share':>7}{'faults':>8}{'sys ms':>8}")
    for i in range(args.repeats):
        for variant in args.variants.split(","):
            row = {**run(variant, args.steps, args.model), "repeat": i}
            rows.append(row)
            print(f"{variant:<12}{row['step_s'] * 1e3:>9.2f}{row['cpu_step_s'] * 1e3:>8.2f}{row['cpu_share']:>7.2f}"
                  f"{row['faults']:>8.0f}{row['sys_s'] * 1e3:>8.2f}", flush=True)  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
