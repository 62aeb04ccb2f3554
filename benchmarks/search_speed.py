"""Layouts simulated per second by ``echosim search`` on the full space, in-process and as a whole command.

Two problems: GPT-3 175B on 1,024 A100-80GB (global batch 1,536, Megatron-LM's) and Llama-3 70B on
512 H100 (global batch 512). For each it prints the size of the space (every dimension: tp, pp, dp,
cp, ep, vpp, sp, zero, micro-batch, recompute, schedule, tp-overlap), what the closed-form filters
removed, and the layouts simulated per second:

* *in-process*: :func:`echosim.layout_search.search` called in this process (the model captured once,
  caches empty at the start), with ``--workers W`` processes (``search(..., workers=W)``), wall time and CPU
  time of this process and of the worker processes it started;
* *whole command*: ``echosim search ... --json`` as its own process (start-up, capture, enumeration,
  simulation, JSON), wall time and CPU time of the child.

Every layout counted was simulated in full (the search runs the steps of :func:`echosim.compiler.lower`,
sharing what layouts share; tests/test_search_compose.py checks its figures equal ``lower``'s). CPU
time is the fairer figure on a shared machine. ``--sample N`` simulates every k-th layout of the full
space only (N of them, in-process: fewer neighbours share work than in a full run, so the rate is if
anything low); ``--command-space`` gives the whole command a sub-space; ``--workers W`` uses W local
processes, in-process and for the whole command.

    python benchmarks/search_speed.py [--sample N] [--command-space "tp=8 pp=8,16"] [--workers W]
                                      [--only gpt3|llama3] [--skip-command]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

# this checkout's echosim, in-process and in the child command (an editable install elsewhere, a worktree's
# shared venv, would otherwise be measured instead)
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CASES = {
    "gpt3": ("gpt3-175b", "a100-80gb", 1024, 1536),
    "llama3": ("llama3-70b", "h100-sxm", 512, 512),
}


def _script() -> str:
    beside = Path(sys.executable).with_name("echosim")
    return str(beside) if beside.exists() else (shutil.which("echosim") or "echosim")


def in_process(model: str, backend: str, devices: int, batch: int, sample: int, workers: int = 1) -> dict[str, float]:
    from echosim import fast_eval, memo
    from echosim.layout_search import search
    from echosim.plan import Cluster, Plan

    memo.clear_all()
    fast_eval.FALLBACKS.clear()
    cluster = Cluster(backend, devices)
    base = Plan(global_batch=batch)
    wall, cpu = time.perf_counter(), _cpu()
    if sample:
        probe = search(model, base, cluster, sample=slice(0, 0))
        stride = max(1, len(probe.enumeration.to_simulate) // sample)
        result = search(model, base, cluster, sample=slice(0, None, stride), workers=workers)
    else:
        result = search(model, base, cluster, progress=_report_every(2000, wall), workers=workers)
    wall, cpu = time.perf_counter() - wall, _cpu() - cpu
    c = result.counts()
    fallbacks = dict(fast_eval.FALLBACKS)
    return {**c, "wall_s": wall, "cpu_s": cpu, "per_s_wall": c["simulated"] / wall, "per_s_cpu": c["simulated"] / cpu,
            "fallbacks": fallbacks}  # fmt: skip


def _cpu() -> float:
    """CPU seconds of this process and of its children that have ended (a search's worker processes: it waits
    for them before it returns)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _report_every(n: int, start: float) -> Callable[[int, int], None]:
    """Progress on stderr every ``n`` layouts (a full-space run takes minutes)."""

    last = [0]

    def report(done: int, total: int) -> None:
        if done // n != last[0] or done == total:
            last[0] = done // n
            rate = done / (time.perf_counter() - start)
            print(f"  ... {done:,}/{total:,} simulated, {rate:.1f} layouts/s wall", file=sys.stderr, flush=True)

    return report


def whole_command(model: str, backend: str, devices: int, batch: int, workers: int, space: str) -> dict[str, float]:
    args = [_script(), "search", model, "--backend", backend, "--devices", str(devices), "--global-batch", str(batch),
            "--workers", str(workers), "--json"]  # fmt: skip
    if space:
        args += ["--space", space]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    out = subprocess.run(args, capture_output=True, text=True, check=True, env=env)
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    import json

    counts = json.loads(out.stdout)["counts"]
    return {**counts, "wall_s": wall, "cpu_s": cpu, "per_s_wall": counts["simulated"] / wall,
            "per_s_cpu": counts["simulated"] / cpu}  # fmt: skip


def _line(name: str, r: dict[str, float]) -> str:
    return (
        f"  {name:14s} simulated {r['simulated']:>7,}  wall {r['wall_s']:8.1f} s  cpu {r['cpu_s']:8.1f} s  "
        f"-> {r['per_s_wall']:8.1f} layouts/s wall, {r['per_s_cpu']:8.1f} layouts/s per CPU-second"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sample", type=int, default=0, help="simulate about N evenly spaced layouts (in-process)")
    ap.add_argument("--workers", type=int, default=1, help="local processes, in-process and for the whole command")
    ap.add_argument("--only", choices=sorted(CASES), help="one problem only")
    ap.add_argument("--command-space", default="", help="the whole command searches this --space (default: full)")
    ap.add_argument("--skip-command", action="store_true", help="in-process only")
    ap.add_argument("--command-only", action="store_true", help="the whole command only")
    opts = ap.parse_args()
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
        f"{opts.workers} worker process{'es' if opts.workers > 1 else ''}"
    )
    for key, (model, backend, devices, batch) in CASES.items():
        if opts.only and key != opts.only:
            continue
        print(f"{model} on {devices} x {backend}, global batch {batch}")
        if opts.command_only:
            print(_line("whole command", whole_command(model, backend, devices, batch, opts.workers,
                                                       opts.command_space)))  # fmt: skip
            continue
        r = in_process(model, backend, devices, batch, opts.sample, opts.workers)
        print(
            f"  space: {r['combinations']:,} combinations; {r['not_applicable']:,} not applicable, "
            f"{r['duplicates']:,} equivalent, {r['pruned']:,} pruned in closed form, "
            f"{r['simulated']:,} simulated{' (a sample)' if opts.sample else ''}, {r['fit']:,} fit"
        )
        print(_line("in-process", r))
        slow = sum(r["fallbacks"].values())
        why = ", ".join(f"{n:,} {k}" for k, n in sorted(r["fallbacks"].items(), key=lambda kv: -kv[1]))
        print(f"  fast path: {r['simulated'] - slow:,} of {r['simulated']:,} layouts; full path: {slow:,}"
              + (f" ({why})" if why else ""))  # fmt: skip
        if not opts.skip_command:
            w = whole_command(model, backend, devices, batch, opts.workers, opts.command_space)
            if opts.command_space:
                print(f"  whole command on --space {opts.command_space!r}: {w['combinations']:,} combinations")
            print(_line("whole command", w))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
