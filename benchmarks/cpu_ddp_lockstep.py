"""The DDP x2 CPU rows' lockstep, priced by echosim's straggler model from the machine's own step jitter.

A DDP step ends when both ranks reach the gradient all-reduce, so each step lasts as long as the slower rank's
(``benchmarks/ddp_decompose_cpu.py`` measured it: the larger of the two ranks' steps is 1-7% over either rank's
median). echosim prices identical ranks; its straggler model (:mod:`echosim.dynamics.stragglers`,
``echosim compile --straggler-file``) gives the expected slowest of N ranks from a file of measured step times.
This script feeds it, for each DDP x2 row of stored ``benchmarks/cpu_reality.py --order row`` runs, the
measured steps of the same model's one-process row of the same run (one thread, as each DDP rank), and prints
the row's error with and without that factor. The factor is not a default: the jitter is the machine's, not
PyTorch's, so it is an input a user gives (as the CLI's ``--straggler-file``), shown here on this VM.

    python benchmarks/cpu_ddp_lockstep.py [RUN.json ...]   (default: the four stored quiet runs)
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from echosim.dynamics.stragglers import expected_max_empirical  # noqa: E402

DATA = ROOT / "benchmarks" / "data"
RUNS = ("cpu_reality_s13.json", "cpu_reality_s13b.json", "cpu_reality_s14.json", "cpu_reality_s15.json")


def lockstep_rows(run: dict[str, Any], ranks: int = 2) -> list[dict[str, Any]]:
    """Each DDP row of ``run`` with the expected-slowest factor of its one-process twin's steps and its error
    before and after the factor (the prediction times the factor, against the same measurement)."""
    single = {r["model"]: r for r in run["rows"] if r["layout"] == "1 process" and r.get("steps_s")}
    out = []
    for r in run["rows"]:
        twin = single.get(r["model"])
        if not r["layout"].startswith("DDP") or r.get("error") is None or twin is None:
            continue
        factor = expected_max_empirical(twin["steps_s"], ranks)
        after = r["predicted_step_s"] * factor / r["measured_step_s"] - 1
        out.append({"model": r["model"], "factor": factor, "error": r["error"], "with_lockstep": after})
    return out


def main(argv: list[str]) -> None:
    paths = [Path(p) for p in argv] or [DATA / name for name in RUNS]
    rows = []
    print(f"{'run':24s} {'model':20s} {'E[max of 2]':>11s} {'error':>7s} {'with it':>8s}")
    for path in paths:
        for r in lockstep_rows(json.loads(path.read_text())):
            rows.append(r)
            print(f"{path.name:24s} {r['model']:20s} {r['factor']:11.4f} {r['error']:+7.1%} {r['with_lockstep']:+8.1%}")
    if not rows:
        print("no DDP row with a one-process twin")
        return
    before = [r["error"] for r in rows]
    after = [r["with_lockstep"] for r in rows]
    within = sum(abs(e) <= 0.10 for e in before), sum(abs(e) <= 0.10 for e in after)
    print(
        f"{len(rows)} DDP rows: mean signed error {statistics.mean(before):+.2%} -> {statistics.mean(after):+.2%}, "
        f"mean absolute {statistics.mean(map(abs, before)):.2%} -> {statistics.mean(map(abs, after)):.2%}, "
        f"within 10% {within[0]} -> {within[1]}"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
