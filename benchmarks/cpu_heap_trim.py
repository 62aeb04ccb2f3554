"""How much of a one-thread CPU training step is glibc's heap trim: the same step with and without it.

Usage::

    python benchmarks/cpu_heap_trim.py [--models llama-4L-256,gpt-4L-256] [--repeats 3] [--out FILE.json]

Trains ``benchmarks/cpu_reality.py``'s models (one process, one thread, fused AdamW, the same step) in fresh
processes, alternately under glibc's defaults and with its trim switched off
(``GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296``: the mmap
threshold at its dynamic maximum, DEFAULT_MMAP_THRESHOLD_MAX, and a trim threshold no heap reaches), and
records each run's median CPU time a step and minor page faults a step (getrusage). Under the defaults
(malloc.c, mallopt(3)) freeing a chunk of 64 KiB or more trims the heap's top once its free top reaches
M_TRIM_THRESHOLD, twice the dynamic mmap threshold; the loss's vocabulary-sized tensors (logits,
log-probabilities, their gradients: 16 MiB each for 1,024 tokens x 4,096) are a step's last allocations and
first frees, so whether they reach the heap's top together, and come back on fresh pages the next step,
depends on where earlier steps left holes: from 0 to 3-4 of them a step in fresh processes of one model.
The CPU backend prices tensors below the mmap threshold as heap-fed (no faults); this script measures what
that leaves out.
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

NO_TRIM = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296"


def worker(name: str, steps: int) -> dict[str, Any]:
    """Median CPU seconds and minor page faults of ``steps`` steps after 3 warm-up ones, in this process."""
    import resource

    import cpu_reality as cr

    step = cr.one_thread_step(name)
    cpu, faults = [], []
    for _ in range(steps):
        f0, c0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time()
        step()
        cpu.append(time.process_time() - c0)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    return {"cpu_s": statistics.median(cpu), "faults": statistics.median(faults), "cpu_steps_s": cpu}


def run(name: str, steps: int, trim: bool) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    if not trim:
        env["GLIBC_TUNABLES"] = NO_TRIM
    load = os.getloadavg()[0]
    out = subprocess.run(
        [sys.executable, __file__, "--worker", name, "--steps", str(steps)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {"model": name, "trim": trim, "load_before": load, **json.loads(out.strip().splitlines()[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--models", default="llama-4L-256,gpt-4L-256")
    parser.add_argument("--repeats", type=int, default=3, help="Fresh processes per model and allocator setting.")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.steps)))
        return
    runs = []
    print(f"{'model':<20}{'glibc':<10}{'CPU s/step':>11}{'faults/step':>12}{'load':>6}")
    for name in args.models.split(","):
        for _ in range(args.repeats):
            for trim in (True, False):  # alternated, so that drift falls on both alike
                r = run(name, args.steps, trim)
                runs.append(r)
                label = "default" if trim else "no trim"
                figures = f"{r['cpu_s']:>11.3f}{r['faults']:>12.0f}{r['load_before']:>6.2f}"
                print(f"{name:<20}{label:<10}{figures}", flush=True)
    if args.out:
        doc = {"no_trim_tunables": NO_TRIM, "runs": runs}
        args.out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
