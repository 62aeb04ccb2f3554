"""Whole-process time of what a newcomer types first: ``echosim --help``, the default compile, an hf: model.

Each command runs ``--runs`` times as its own process (the installed ``echosim`` script, as a
user runs it). *Cold*: every run gets an empty capture cache (a fresh ``ECHOSIM_CACHE_DIR``),
so the model is captured with torch. *Warm*: the runs share a cache primed by one run before
them, so the IR is read back and torch is never imported. Prints the median and the minimum of
wall time and of CPU time (user + system of the child), which a busy machine disturbs less.
Python writes its bytecode cache as it does by default (``PYTHONDONTWRITEBYTECODE`` is
dropped for the children), and one run before the measured ones compiles it.

    python benchmarks/startup_time.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_LLAMA = "compile hf:llama3-70b --backend h100-sxm --tp 8 --pp 4 --dp 2 --global-batch 64 --json"
COMMANDS = {
    "echosim --help": ["--help"],
    "echosim compile (default: gpt3-175b)": ["compile", "--json"],
    "echosim compile hf:llama3-70b (tp8 pp4 dp2)": _LLAMA.split(),
}


def _script() -> str:
    beside = Path(sys.executable).with_name("echosim")
    return str(beside) if beside.exists() else (shutil.which("echosim") or "echosim")


def _once(args: list[str], cache: str) -> tuple[float, float]:
    env = {**os.environ, "ECHOSIM_CACHE_DIR": cache}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("ECHOSIM_NO_CACHE", None)
    before = os.times()
    t0 = time.perf_counter()
    subprocess.run([_script(), *args], check=True, stdout=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - t0
    after = os.times()
    return wall, after.children_user - before.children_user + after.children_system - before.children_system


def measure(args: list[str], runs: int, warm: bool) -> tuple[list[float], list[float]]:
    walls, cpus = [], []
    with tempfile.TemporaryDirectory() as shared:
        _once(args, shared)  # bytecode compiled; for warm runs, the cache primed
        for _ in range(runs):
            if warm:
                wall, cpu = _once(args, shared)
            else:
                with tempfile.TemporaryDirectory() as fresh:
                    wall, cpu = _once(args, fresh)
            walls.append(wall)
            cpus.append(cpu)
    return walls, cpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    a = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs (CPU time is the steadier figure)")
    print(f"{'command':<46}{'cache':>6}{'wall median':>13}{'wall min':>10}{'CPU median':>12}{'CPU min':>9}")
    for label, args in COMMANDS.items():
        for warm in (False, True):
            walls, cpus = measure(args, a.runs, warm)
            print(
                f"{label:<46}{'warm' if warm else 'cold':>6}{statistics.median(walls):>12.2f}s{min(walls):>9.2f}s"
                f"{statistics.median(cpus):>11.2f}s{min(cpus):>8.2f}s",
                flush=True,
            )


if __name__ == "__main__":
    main()
