"""How long one compile takes: the whole ``echosim compile`` process, and a compile in-process.

Whole process: median wall time of ``echosim compile --json`` over ``--runs`` runs (imports,
plugin loading and the meta-device capture included), and its median CPU time (user + system
of the child), which a busy machine disturbs less. In-process: median CPU time of repeated
``compile()`` calls of each layout once its capture is cached (what ``search`` pays per
layout). Run with ``python benchmarks/compile_time.py [--runs 5]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

LAYOUTS = {
    "default (gpt3-175b, 1,024 a100, tp8 pp16 dp8)": ([], None),
    "llama3-70b, 64 h100, tp8 pp4 dp2": (
        ["llama3-70b", "--backend", "h100-sxm", "--tp", "8", "--pp", "4", "--dp", "2", "--global-batch", "64"],
        None,
    ),
    "mixtral-8x7b, 128 h100, tp2 ep8 dp8": (
        ["mixtral-8x7b", "--backend", "h100-sxm", "--tp", "2", "--ep", "8", "--dp", "8", "--global-batch", "64"],
        None,
    ),
}


def whole_process(args: list[str], runs: int) -> tuple[float, float]:
    """(median wall seconds, median CPU seconds) of the whole command."""
    walls, cpus = [], []
    for _ in range(runs):
        before = os.times()
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "echosim.cli", "compile", *args, "--json"], check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        walls.append(time.perf_counter() - t0)
        after = os.times()
        cpus.append(after.children_user - before.children_user + after.children_system - before.children_system)
    return statistics.median(walls), statistics.median(cpus)


def in_process(args: list[str], runs: int) -> float:
    from echosim.compiler import compile as compile_model
    from echosim.plan import plan_from_options

    opts: dict[str, object] = {}
    model = args[0] if args else None
    it = iter(args[1:])
    for flag in it:
        opts[flag.removeprefix("--").replace("-", "_")] = next(it)
    for key in ("tp", "pp", "dp", "ep", "global_batch"):
        if key in opts:
            opts[key] = int(str(opts[key]))
    name, plan, cluster = plan_from_options(model, opts)
    compile_model(name, plan, cluster)  # capture once
    times = []
    for _ in range(runs):
        t0 = time.process_time()
        compile_model(name, plan, cluster)
        times.append(time.process_time() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    a = parser.parse_args()
    print(f"{'layout':<48}{'whole s (wall)':>15}{'whole s (CPU)':>15}{'in-process ms (CPU)':>21}")
    for label, (args, _) in LAYOUTS.items():
        wall, cpu = whole_process(args, a.runs)
        inproc = in_process(args, max(a.runs, 10))
        print(f"{label:<48}{wall:>15.2f}{cpu:>15.2f}{inproc * 1e3:>21.1f}")


if __name__ == "__main__":
    main()
