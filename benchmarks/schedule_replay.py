"""Replay a search's schedule timings: numpy level loops vs the compiled ones (``echosim[fast]``), and the
compiled kernels' start-up cost (the schedule timer's and the unit simulation's).

``--capture FILE``: run a full-space search in-process and pickle every ``time_schedule`` call (plan and
inputs) to FILE. ``--replay FILE``: time those calls with ``ECHOSIM_JIT=0`` (numpy) and with the compiled loops,
alternately ``--rounds`` times (CPU seconds of the replay alone; the first compiled round is after a warm-up call,
so it excludes compilation), and check that every result is byte-identical. ``--startup``: each kernel module's first
call's cost in a fresh process, with an empty numba cache (``NUMBA_CACHE_DIR``: compiling) and then with that cache
filled.

    PYTHONPATH=. python benchmarks/schedule_replay.py --capture /tmp/gpt3-calls.pkl --only gpt3
    PYTHONPATH=. python benchmarks/schedule_replay.py --replay /tmp/gpt3-calls.pkl
    PYTHONPATH=. python benchmarks/schedule_replay.py --startup
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def capture(path: str, only: str) -> None:
    from search_speed import CASES, in_process

    from echosim.timeline import composer

    calls: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
    real = composer.time_schedule

    def recorded(plan: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append((plan, args, kwargs))
        return real(plan, *args, **kwargs)

    composer.time_schedule = recorded  # layout_search imports it at each batch
    in_process(*CASES[only], 0)
    composer.time_schedule = real
    with open(path, "wb") as f:
        pickle.dump(calls, f, protocol=pickle.HIGHEST_PROTOCOL)
    levels = sum(len(p.levels) for p, _, _ in calls)
    print(f"{len(calls)} calls, {levels:,} levels, {sum(p.blocks for p, _, _ in calls):,} blocks -> {path}")


def _run(calls: list[Any], jit: bool) -> tuple[float, list[Any]]:
    from echosim.timeline.composer import time_schedule

    os.environ["ECHOSIM_JIT"] = "1" if jit else "0"
    cpu = time.process_time()
    out = [time_schedule(plan, *args, **kwargs) for plan, args, kwargs in calls]
    return time.process_time() - cpu, out


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def replay(path: str, rounds: int) -> None:
    with open(path, "rb") as f:
        calls = pickle.load(f)
    split = [c for c in calls if c[0].split_backward]
    plain = [c for c in calls if not c[0].split_backward]
    print(f"{len(calls)} calls: {len(plain)} plain ({sum(len(p.levels) for p, _, _ in plain):,} levels), "
          f"{len(split)} zero-bubble ({sum(len(p.levels) for p, _, _ in split):,} levels)")  # fmt: skip
    _run(calls[:1] + split[:1], True)  # compile (or load) the kernels outside the timing
    for r in range(rounds):
        for name, part in (("plain", plain), ("zero-bubble", split)):
            t_np, want = _run(part, False)
            t_jit, got = _run(part, True)
            same = all(
                _same(g.ends, w.ends) and _same(g.starts, w.starts) and _same(g.rank_ends, w.rank_ends)
                for g, w in zip(got, want, strict=True)
            )
            print(f"round {r}: {name:12s} numpy {t_np:6.2f} CPU-s, compiled {t_jit:6.2f} CPU-s, "
                  f"byte-identical {same}")  # fmt: skip


_FIRST = """
import time, numpy as np
t = time.perf_counter(); c = time.process_time()
from echosim.timeline import composer, schedule
ts = composer._compiled(); assert ts is not None
imp = time.perf_counter() - t
for name, split, cols in (("1f1b", False, schedule.one_f_one_b_columns), ("zb-h1", True, schedule.one_f_one_b_columns)):
    plan = composer.schedule_plan(schedule.one_f_one_b, 4, 8, 1, split, False, cols)
    x = np.ones((4, 3))
    composer.time_schedule(plan, x, x, x, x, x if split else None)
plan = composer.schedule_plan(schedule.dualpipe, 4, 8, 1, False, True)
composer.time_schedule(plan, np.ones(4), np.ones(4), np.ones(4), np.ones(4))
print(f"import numba and the module {imp:.2f} s wall; first calls of both kernels in all "
      f"{time.perf_counter() - t:.2f} s wall, {time.process_time() - c:.2f} CPU-s")
"""


#: The unit simulation kernel (:mod:`echosim.timeline._jit_unit`): imported, then called once on a two-op unit (a
#: matmul, then a collective reading it) with the argument types :func:`echosim.timeline.streams.simulate_compiled`
#: passes, with and without the overlap slowdown (one compiled specialisation serves both).
_FIRST_UNIT = """
import time, numpy as np
t = time.perf_counter(); c = time.process_time()
from echosim.timeline import streams
kernel = streams.compiled_unit(); assert kernel is not None
imp = time.perf_counter() - t
b, i = np.bool_, np.int64
for slowed in (False, True):
    kernel.simulate(np.array([1.0, 0.5]), np.array([False, True]), np.array([False, True]), np.array([False, True]),
                    np.array([0, 1], i), np.array([1.2, 1.1]), np.zeros(2, b), np.array([0, 0, 1], i), np.array([0], i),
                    np.zeros(1, b), slowed, np.empty(2), np.empty(2), np.zeros(2), np.zeros(2, i))
print(f"import numba and the module {imp:.2f} s wall; first calls {time.perf_counter() - t:.2f} s wall, "
      f"{time.process_time() - c:.2f} CPU-s")
"""


def startup() -> None:
    for kernels, script in (("schedule timer", _FIRST), ("unit simulation", _FIRST_UNIT)):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "NUMBA_CACHE_DIR": cache, "PYTHONPATH": str(ROOT)}
            for label in ("empty numba cache (compiles)", "numba cache filled"):
                run = [sys.executable, "-c", script]
                out = subprocess.run(run, env=env, capture_output=True, text=True, check=True)
                print(f"{kernels}, {label}: {out.stdout.strip()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capture", metavar="FILE")
    ap.add_argument("--only", default="gpt3", choices=["gpt3", "llama3"])
    ap.add_argument("--replay", metavar="FILE")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--startup", action="store_true")
    opts = ap.parse_args()
    if opts.capture:
        capture(opts.capture, opts.only)
    if opts.replay:
        replay(opts.replay, opts.rounds)
    if opts.startup:
        startup()


if __name__ == "__main__":
    main()
