"""Compile time of GPT-3 175B as the cluster grows with the same work per device.

Weak scaling over data parallelism: TP 8 inside a node, 16 micro-batches per
data-parallel rank, 8 to 16,384 devices (PP 1); then the Megatron layout TP 8 /
PP 16 from 128 to 16,384 devices. Symmetry means the simulated work is one rank
per pipeline stage, so the time should stay flat. Prints a table; run with
``python benchmarks/compile_scale.py``.
"""

from __future__ import annotations

import time

from echosim.compiler import lower
from echosim.plan import Cluster, Plan


def timed(plan: Plan, cluster: Cluster, repeats: int = 7) -> tuple[float, float]:
    """Fastest CPU time of a whole compile over ``repeats``, model capture included (cache cleared).

    CPU time of this process (``time.process_time``) and the minimum over repeats keep the
    figure stable on a shared machine; the compile is single-threaded, so it equals wall time
    on a quiet one.
    """
    from echosim.frontend.capture import _capture_arch_cached

    times = []
    step = 0.0
    for _ in range(repeats):
        _capture_arch_cached.cache_clear()
        t0 = time.process_time()
        step = lower("gpt3-175b", plan, cluster).report.step_time_s
        times.append(time.process_time() - t0)
    return min(times), step


def main() -> None:
    lower(
        "gpt3-175b",
        Plan(tp=8, dp=1, micro_batch=1, global_batch=16, seq_len=2048, dtype="fp16"),
        Cluster("a100-80gb", 8),
    )  # warm caches (imports, meta kernels)
    print(f"{'layout':<22}{'devices':>8}{'compile s (CPU)':>16}{'step s':>9}")
    rows = []
    for devices in (8, 64, 1024, 16384):
        dp = devices // 8
        plan = Plan(
            tp=8, pp=1, dp=dp, micro_batch=1, global_batch=16 * dp, seq_len=2048, dtype="fp16", recompute="full"
        )
        t, step = timed(plan, Cluster("a100-80gb", devices))
        rows.append(t)
        print(f"{'TP8 DP' + str(dp):<22}{devices:>8}{t:>16.3f}{step:>9.2f}")
    print(f"ratio largest/smallest (TP8 x DP): {rows[-1] / rows[0]:.2f}")
    pp_rows = []
    for devices in (128, 1024, 16384):
        dp = devices // 128
        plan = Plan(
            tp=8, pp=16, dp=dp, micro_batch=1, global_batch=192 * dp, seq_len=2048, dtype="fp16", recompute="full"
        )
        t, step = timed(plan, Cluster("a100-80gb", devices))
        pp_rows.append(t)
        print(f"{'TP8 PP16 DP' + str(dp):<22}{devices:>8}{t:>16.3f}{step:>9.2f}")
    print(f"ratio largest/smallest (TP8 x PP16 x DP): {pp_rows[-1] / pp_rows[0]:.2f}")


if __name__ == "__main__":
    main()
