"""Where a full-space ``echosim search`` spends its CPU time, and what no cache can remove.

For one problem of ``benchmarks/search_speed.py`` (GPT-3 175B on 1,024 A100-80GB, Llama-3 70B on 512 H100) it runs
:func:`echosim.layout_search.search` in this process twice, caches emptied before the first run only:

* the *cold* run: CPU seconds spent in each phase of a layout's evaluation (inclusive: a phase's time holds the
  phases it calls; ``_direct`` is inside ``stages``), counted by wrapping the functions, and how many of the fast
  evaluator's direct stage lowerings were of a stage graph met before (another schedule or TP overlap of it) or of
  a new one, by ZeRO stage;
* the *warm* run: the same search with every stage, unit timing and graph already cached. Its CPU time is the
  floor of the current design: what a layout costs when it shares all of its stage work (preparation, stage
  lookups, the schedule composer, the per-layout figures, the enumeration). Layouts per CPU-second above
  ``simulated / warm`` need the per-layout work itself to shrink, not more sharing between layouts.

The wrappers add about 10% to the cold run's CPU time; the rates of ``search_speed.py`` are the ones to quote.

    PYTHONPATH=. python benchmarks/search_profile.py [--only gpt3|llama3]
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from search_speed import CASES  # noqa: E402  (benchmarks/ is on sys.path when run as a script)


def _wrap(seconds: Counter[str], calls: Counter[str], module: Any, name: str) -> None:
    """Count the CPU seconds and calls of ``module.name`` (looked up at call time by its callers)."""
    fn: Callable[..., Any] = getattr(module, name)

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds[name] += time.process_time() - start
            calls[name] += 1

    setattr(module, name, timed)


def _count_direct(kinds: Counter[tuple[int, bool]]) -> None:
    """Count fast_eval's direct stage lowerings (cache misses) by ZeRO stage and whether their stage graph is new."""
    from echosim import fast_eval

    direct = fast_eval._direct

    @functools.wraps(direct)
    def counted(joint: Any, first: bool, last: bool, count: int, alone: bool, timing: Any) -> Any:
        key = (*fast_eval._family(joint, first, last), count, alone, timing)
        cached, graphs = key in fast_eval._DIRECT._data, len(fast_eval._STAGES)
        out = direct(joint, first, last, count, alone, timing)
        if not cached:
            zero = next((p.zero for p in joint.stage_passes if getattr(p, "name", "") == "data-parallel"), 0)
            kinds[zero, len(fast_eval._STAGES) > graphs] += 1
        return out

    fast_eval._direct = counted


def profile(model: str, backend: str, devices: int, batch: int) -> None:
    from echosim import fast_eval, layout_search, memo
    from echosim.plan import Cluster, Plan
    from echosim.timeline import composer, lower, report

    seconds: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    for module, name in (
        (layout_search, "_prepare"), (fast_eval, "stages"), (fast_eval, "_direct"), (fast_eval, "_template"),
        (fast_eval, "lower_stage"), (lower, "time_units"), (composer, "time_schedule"), (lower, "step_plan"),
        (report, "brief_figures"), (layout_search, "enumerate_layouts"),
    ):  # fmt: skip
        _wrap(seconds, calls, module, name)
    kinds: Counter[tuple[int, bool]] = Counter()
    _count_direct(kinds)
    memo.clear_all()
    for run in ("cold", "warm"):
        seconds.clear()
        calls.clear()
        start = time.process_time()
        result = layout_search.search(model, Plan(global_batch=batch), Cluster(backend, devices))
        total = time.process_time() - start
        n = result.counts()["simulated"]
        print(f"  {run}: {n:,} layouts simulated in {total:.1f} CPU-s -> {n / total:,.0f} layouts per CPU-second")
        for name, s in seconds.most_common():
            print(f"    {name:18s} {s:7.2f} s {100 * s / total:5.1f}%  {calls[name]:>9,} calls")
        if run == "cold":
            print("    direct stage lowerings (cache misses) by ZeRO stage, of a new / a known stage graph:")
            for zero in sorted({z for z, _ in kinds}):
                print(f"      zero {zero}: {kinds[zero, True]:,} new, {kinds[zero, False]:,} known")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=sorted(CASES), help="one problem only")
    opts = ap.parse_args()
    for key, (model, backend, devices, batch) in CASES.items():
        if opts.only and key != opts.only:
            continue
        print(f"{model} on {devices} x {backend}, global batch {batch}")
        profile(model, backend, devices, batch)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
