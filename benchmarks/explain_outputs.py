"""Sizes and times of what people look at, for the two largest runs: the trace, the HTML report, the PNG, explain.

GPT-3 175B on 16,384 A100-80GB (TP 8, PP 16, DP 128, 192 micro-batches per step) and
Llama-3 405B on 16,384 H100 (TP 8, PP 16, DP 128, interleaved with 2 chunks per stage,
sequence 8,192, global batch 2,048: Dubey et al. 2024, sec. 3.3). Each output is written
``--repeats`` times in this process after one compile; the table gives the file size and the
minimum and median of wall and CPU seconds. ``explain`` compiles the whole neighbourhood.
Run with ``python benchmarks/explain_outputs.py [--repeats 3] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from echosim.compiler import lower
from echosim.explain.html import write_report
from echosim.explain.step import explain
from echosim.plan import Cluster, Plan
from echosim.timeline.trace import write_trace

RUNS = {
    "gpt3-175b": (
        Plan(tp=8, pp=16, dp=128, global_batch=192 * 128, seq_len=2048, dtype="fp16", recompute="full",
             attention="math"),
        Cluster("a100-80gb", 16384),
    ),
    "llama3-405b": (
        Plan(tp=8, pp=16, dp=128, vpp=2, global_batch=2048, seq_len=8192, recompute="selective"),
        Cluster("h100-sxm", 16384),
    ),
}  # fmt: skip


def timed(fn: Callable[[], object], repeats: int) -> tuple[list[float], list[float]]:
    walls, cpus = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return walls, cpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="keep the files here (default: a temporary folder)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="echosim-outputs-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"{'model':<13}{'output':<10}{'size MB':>9}{'wall s min/med':>17}{'CPU s min/med':>16}")
    for model, (plan, cluster) in RUNS.items():
        compiled = lower(model, plan, cluster)
        jobs: dict[str, tuple[Path | None, Callable[[], object]]] = {
            "compile": (None, lambda model=model, plan=plan, cluster=cluster: lower(model, plan, cluster)),
            "trace": (out / f"{model}.trace.json",
                      lambda c=compiled, m=model: write_trace(c.costed, out / f"{m}.trace.json", m)),
            "html": (out / f"{model}.html",
                     lambda c=compiled, m=model, p=plan, k=cluster: write_report(c, out / f"{m}.html", m, p, k)),
            "png": (out / f"{model}.png",
                    lambda c=compiled, m=model, p=plan, k=cluster: write_report(c, out / f"{m}.png", m, p, k)),
            "explain": (None, lambda c=compiled, m=model, p=plan, k=cluster: explain(c, m, p, k)),
        }  # fmt: skip
        for name, (path, fn) in jobs.items():
            repeats = 1 if name == "explain" else args.repeats
            walls, cpus = timed(fn, repeats)
            size = f"{path.stat().st_size / 1e6:.1f}" if path else "-"
            wall = f"{min(walls):.2f}/{statistics.median(walls):.2f}"
            cpu = f"{min(cpus):.2f}/{statistics.median(cpus):.2f}"
            print(f"{model:<13}{name:<10}{size:>9}{wall:>17}{cpu:>16}", flush=True)
    print(f"files in {out}")


if __name__ == "__main__":
    main()
