"""What a DDP neighbour costs a rank's GEMMs on this CPU: the calibration's neighbour against a training one.

Usage::

    python benchmarks/cpu_neighbour.py [--model llama-4L-256] [--rounds 4] [--passes 3] [--out FILE.json]

The two-rank calibration (``echosim calibrate --ranks 2``) times each matmul sample in two processes at once,
both running the same sample. A DDP x2 row's ranks run training steps side by side: each rank's GEMMs share the
caches and memory with the other rank's whole step (attention, norms, the optimizer, allocations). This script
times the warm GEMMs of one step of a ``benchmarks/cpu_reality.py`` model (``cpu_matmul_cold.gemm_calls``, one
thread, summed by process CPU time) in one process three ways, interleaved round by round: alone, beside a
process that runs the same GEMM sum over and over (the calibration's situation), and beside a process that
runs the model's training steps (``cpu_reality.one_thread_step``: a DDP rank without the all-reduce). Issue 16.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import cpu_matmul_cold as cold  # noqa: E402
import cpu_reality as cr  # noqa: E402

NEIGHBOURS = ("alone", "same GEMMs", "training steps")


def neighbour_main(kind: str, model: str) -> None:
    """Run the neighbour workload until killed."""
    import torch

    torch.set_num_threads(1)
    if kind == "same GEMMs":
        calls = cold.gemm_calls(model)
        while True:
            cold.summed_s(calls, None)
    step = cr.one_thread_step(model)
    while True:
        step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-4L-256", choices=sorted(cr.MODELS))
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--passes", type=int, default=3, help="GEMM sums per condition and round (median kept)")
    parser.add_argument("--neighbour", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.neighbour:
        neighbour_main(args.neighbour, args.model)
        return
    import torch

    torch.set_num_threads(1)
    calls = cold.gemm_calls(args.model)
    cold.summed_s(calls, None)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out: dict[str, list[float]] = {k: [] for k in NEIGHBOURS}
    loads = [os.getloadavg()[0]]
    for _ in range(args.rounds):
        for kind in NEIGHBOURS:
            proc = None
            if kind != "alone":
                cmd = [sys.executable, __file__, "--neighbour", kind, "--model", args.model]
                proc = subprocess.Popen(cmd, env=env)
                time.sleep(3.0)  # its model built and warmed up
            try:
                out[kind].append(statistics.median(cold.summed_s(calls, None) for _ in range(args.passes)))
            finally:
                if proc is not None:
                    proc.kill()
                    proc.wait()
        loads.append(os.getloadavg()[0])
    alone = statistics.median(out["alone"])
    span = f"{min(loads):.2f}-{max(loads):.2f}"
    print(f"{args.model}: GEMMs of one step, CPU ms (median of {args.rounds} rounds); load {span}")
    for kind in NEIGHBOURS:
        med = statistics.median(out[kind])
        each = ", ".join(f"{1e3 * v:.0f}" for v in out[kind])
        print(f"  {kind:<16}{1e3 * med:8.1f}  {100 * (med / alone - 1):+5.1f}%   ({each})")
    if args.out:
        payload = {"model": args.model, "passes": args.passes, "seconds": out, "load_average": loads}
        args.out.write_text(json.dumps(payload, indent=1) + "\n")


if __name__ == "__main__":
    main()
