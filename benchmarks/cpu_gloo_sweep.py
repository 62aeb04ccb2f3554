"""gloo all_reduce between two local processes (one thread each) from 4 KiB to 64 MiB: wall and CPU time.

Usage::

    python benchmarks/cpu_gloo_sweep.py [--order up|down] [--out FILE.json]

Per size, each rank times ``all_reduce`` after a barrier (so the two start together) and reports the
medians of its wall time and process CPU time (user and system apart, from getrusage) and the share of
wall time its process ran. The calibration's sweep times the same collective by the slower rank's CPU
time; this one shows both clocks over the sizes DDP sends (buckets up to 25 MiB) and beyond. Issue 15.
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

SIZES = [4096, 65536, 262144, 2**20, 2**21, 2**22, 2**23, 12 * 2**20, 2**24, 20_800_000, 2**25, 48 * 2**20, 2**26]


def rank_main(rank: int, port: int, order: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    out = []
    for nbytes in SIZES if order == "up" else SIZES[::-1]:
        x = torch.ones(nbytes // 4)
        reps = max(5, min(40, int(0.35 / (nbytes / 0.8e9 + 3e-4))))
        for _ in range(2):
            dist.all_reduce(x)
        walls, cpus, users, syss = [], [], [], []
        for _ in range(reps):
            dist.barrier()
            r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            dist.all_reduce(x)
            wall, r1 = time.perf_counter() - w0, resource.getrusage(resource.RUSAGE_SELF)
            user, system = r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime
            walls.append(wall)
            users.append(user)
            syss.append(system)
            cpus.append(user + system)
        mine = [statistics.median(v) for v in (walls, cpus, users, syss)] + [sum(cpus) / sum(walls)]
        both = [torch.zeros(5, dtype=torch.float64) for _ in range(2)]
        dist.all_gather(both, torch.tensor(mine, dtype=torch.float64))
        out.append({"nbytes": nbytes, "reps": reps, "ranks": [b.tolist() for b in both]})
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--order", choices=("up", "down"), default="up")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.port, args.order)
        return
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, __file__, "--order", args.order, "--port", str(port), "--rank"]
    procs = [subprocess.Popen([*cmd, str(r)], stdout=subprocess.PIPE, text=True, env=env) for r in range(2)]
    rows = json.loads(procs[0].communicate()[0])
    procs[1].communicate()
    print(f"{'bytes':>10}{'wall ms':>9}{'cpu ms':>8}{'share':>11}{'GB/s wall':>10}{'cpu':>6}")
    for r in rows:
        a, b = r["ranks"]
        wall, cpu = max(a[0], b[0]), max(a[1], b[1])
        print(f"{r['nbytes']:>10}{wall * 1e3:>9.2f}{cpu * 1e3:>8.2f}  {a[4]:.2f}/{b[4]:.2f}"
              f"{r['nbytes'] / wall / 1e9:>10.2f}{r['nbytes'] / cpu / 1e9:>6.2f}")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
