"""Compile time of GPT-3 175B as the cluster grows with the same work per device.

Weak scaling over data parallelism: TP 8 inside a node, 16 micro-batches per
data-parallel rank, 8 to 16,384 devices (PP 1); then the Megatron layout TP 8 /
PP 16 from 128 to 16,384 devices. Symmetry means the simulated work is one rank
per pipeline stage, so the time should stay flat. Prints a table; run with
``python benchmarks/compile_scale.py``.
"""

from __future__ import annotations

import statistics
import time

from echosim.compiler import compile_full
from echosim.plan import Cluster, Plan


def timed(plan: Plan, cluster: Cluster, repeats: int = 7) -> tuple[float, float]:
    times = []
    step = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        step = compile_full("gpt3-175b", plan, cluster).report.step_time_s
        times.append(time.perf_counter() - t0)
    return statistics.median(times), step


def main() -> None:
    compile_full(
        "gpt3-175b",
        Plan(tp=8, dp=1, micro_batch=1, global_batch=16, seq_len=2048, dtype="fp16"),
        Cluster("a100-80gb", 8),
    )  # warm caches (imports, meta kernels)
    print(f"{'layout':<22}{'devices':>8}{'compile s':>11}{'step s':>9}")
    rows = []
    for devices in (8, 64, 1024, 16384):
        dp = devices // 8
        plan = Plan(
            tp=8, pp=1, dp=dp, micro_batch=1, global_batch=16 * dp, seq_len=2048, dtype="fp16", recompute="full"
        )
        t, step = timed(plan, Cluster("a100-80gb", devices))
        rows.append(t)
        print(f"{'TP8 DP' + str(dp):<22}{devices:>8}{t:>11.3f}{step:>9.2f}")
    print(f"ratio largest/smallest (TP8 x DP): {rows[-1] / rows[0]:.2f}")
    pp_rows = []
    for devices in (128, 1024, 16384):
        dp = devices // 128
        plan = Plan(
            tp=8, pp=16, dp=dp, micro_batch=1, global_batch=192 * dp, seq_len=2048, dtype="fp16", recompute="full"
        )
        t, step = timed(plan, Cluster("a100-80gb", devices))
        pp_rows.append(t)
        print(f"{'TP8 PP16 DP' + str(dp):<22}{devices:>8}{t:>11.3f}{step:>9.2f}")
    print(f"ratio largest/smallest (TP8 x PP16 x DP): {pp_rows[-1] / pp_rows[0]:.2f}")


if __name__ == "__main__":
    main()
