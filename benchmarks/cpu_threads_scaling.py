"""How a training step scales from one intra-op thread to every core on this CPU, measured without drift.

Usage::

    python benchmarks/cpu_threads_scaling.py [--models a,b] [--seconds 480] [--steps 3] [--out FILE.json]

One process builds the models of ``benchmarks/cpu_reality.py`` (fp32, fused AdamW, the same batch) and,
in cycles until ``--seconds`` have passed, times each model's step on every core and on one thread back
to back (``torch.set_num_threads``; the order alternates between cycles), with the machine-speed probe
(``echosim.calibrate.probe``) on one thread and on every core before each cycle. A speed-up taken from
two timings seconds apart is free of the drift that moves this VM's speed by 10-25% within minutes
(``docs/beyond-transformers.md``, "Calibration stability"), which a comparison of two separate runs
(``cpu_reality.py``'s "1 process" and "1 process (all cores)" rows) is not.

It also asks whether the two vCPUs compute independently (two host cores) or share one (SMT siblings
on the host, which the guest's ``lscpu`` cannot show): a one-thread 512^3 matmul loop pinned to each
vCPU, alone and both at once; each vCPU's rate beside the other over its rate alone is ~1 for separate
cores and ~0.5-0.7 for SMT siblings sharing FMA units.

Every cycle records the other processes' CPU use and the host's steal time from /proc/stat.
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

PAIR_CODE = """
import os, sys, time, torch
os.sched_setaffinity(0, {int(sys.argv[1])})
torch.set_num_threads(1)
a, b = torch.randn(512, 512), torch.randn(512, 512)
c = torch.empty(512, 512)
for _ in range(20):
    torch.mm(a, b, out=c)
start = float(sys.argv[2])
while time.time() < start:
    time.sleep(0.001)
n, c0, w0 = 0, time.process_time(), time.perf_counter()
while time.perf_counter() - w0 < float(sys.argv[3]):
    torch.mm(a, b, out=c)
    n += 1
print((time.perf_counter() - w0) / n, (time.process_time() - c0) / n)
"""


def stat_counters() -> tuple[float, float, float]:
    """(busy, steal, total) jiffies of the whole machine, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return user + nice + system + irq + softirq, steal, sum(fields)


def pair_check(seconds: float = 1.0) -> dict[str, Any]:
    """Per-matmul wall and CPU seconds on each vCPU alone and with both vCPUs busy at once."""
    cores = sorted(os.sched_getaffinity(0))[:2]

    def run(which: list[int]) -> list[tuple[float, float]]:
        start = time.time() + 4.0  # after the interpreters have imported torch and warmed up
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", PAIR_CODE, str(c), str(start), str(seconds)], stdout=subprocess.PIPE, text=True
            )
            for c in which
        ]
        return [tuple(float(x) for x in p.communicate()[0].split()) for p in procs]  # type: ignore[misc]

    alone = [run([c])[0] for c in cores]
    both = run(cores)
    return {
        "cores": cores,
        "alone_wall_s": [a[0] for a in alone],
        "alone_cpu_s": [a[1] for a in alone],
        "both_wall_s": [b[0] for b in both],
        "both_cpu_s": [b[1] for b in both],
        "rate_beside_other": [a[0] / b[0] for a, b in zip(alone, both, strict=True)],
        "cpu_rate_beside_other": [a[1] / b[1] for a, b in zip(alone, both, strict=True)],
    }


def main() -> None:
    import torch
    from cpu_reality import BATCH, MODELS, _build

    from echosim.calibrate.probe import run_probe

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="llama-4L-256,llama-4L-256-s1024,llama-8L-256,gpt-4L-512")
    parser.add_argument("--seconds", type=float, default=480.0)
    parser.add_argument("--steps", type=int, default=3, help="Timed steps per model and thread count per cycle.")
    parser.add_argument("--no-pairs", action="store_true", help="Skip the vCPU pairing check.")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    every = len(os.sched_getaffinity(0))
    t_start = time.time()
    result: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t_start)),
        "threads": every,
        "pairs": [],
        "cycles": [],
    }

    def save() -> None:
        if args.out:
            args.out.write_text(json.dumps(result, indent=1, sort_keys=True))

    if not args.no_pairs:
        result["pairs"].append(pair_check())
        print("pairs", json.dumps(result["pairs"][-1]), flush=True)
    steps: dict[str, Any] = {}
    for name in args.models.split(","):
        cfg = MODELS[name]
        model = _build(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        ids = torch.randint(0, cfg.vocab, (BATCH, cfg.seq_len), generator=torch.Generator().manual_seed(0))

        def step(model: Any = model, opt: Any = opt, ids: Any = ids) -> None:
            opt.zero_grad(set_to_none=True)
            model(ids, ids).backward()
            opt.step()

        steps[name] = step
    cycle, t_loop = 0, time.time()
    while time.time() - t_loop < args.seconds:
        busy0, steal0, total0 = stat_counters()
        w0 = time.perf_counter()
        c0 = os.times()
        row: dict[str, Any] = {"t_s": round(time.time() - t_start, 1), "probe": {}, "models": {}}
        for threads in (1, every):
            row["probe"][str(threads)] = run_probe(threads=threads)
        order = (every, 1) if cycle % 2 == 0 else (1, every)
        for name, step in steps.items():
            per: dict[str, Any] = {}
            for threads in order:
                torch.set_num_threads(threads)
                step()  # one untimed step after the switch
                walls, cpus = [], []
                for _ in range(args.steps):
                    cw, ww = time.process_time(), time.perf_counter()
                    step()
                    walls.append(time.perf_counter() - ww)
                    cpus.append(time.process_time() - cw)
                per[str(threads)] = {"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus)}
            per["speedup"] = per["1"]["wall_s"] / per[str(every)]["wall_s"]
            row["models"][name] = per
        busy1, steal1, total1 = stat_counters()
        c1 = os.times()
        tick = os.sysconf("SC_CLK_TCK")
        ours = (c1.user + c1.system) - (c0.user + c0.system)
        elapsed = time.perf_counter() - w0
        row["other_cores"] = max(0.0, (busy1 - busy0) / tick - ours) / elapsed
        row["steal_share"] = (steal1 - steal0) / max(1, total1 - total0)
        result["cycles"].append(row)
        save()
        p1, pn = row["probe"]["1"], row["probe"][str(every)]
        print(
            f"t={row['t_s']:6.1f}s probe1 {p1['matmul_s'] * 1e3:.2f}/{p1['stream_s'] * 1e3:.2f} ms "
            f"probe{every} {pn['matmul_s'] * 1e3:.2f}/{pn['stream_s'] * 1e3:.2f} ms "
            f"others {row['other_cores']:.2f} steal {row['steal_share']:.1%}  "
            + "  ".join(
                f"{n}: {m['1']['wall_s']:.3f}/{m[str(every)]['wall_s']:.3f} x{m['speedup']:.2f}"
                for n, m in row["models"].items()
            ),
            flush=True,
        )
        cycle += 1
    if not args.no_pairs:
        result["pairs"].append(pair_check())
        print("pairs", json.dumps(result["pairs"][-1]), flush=True)
    save()


if __name__ == "__main__":
    main()
