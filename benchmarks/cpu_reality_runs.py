"""Every stored ``cpu_reality.py --order row`` run at once: how close echosim stays, run after run.

``benchmarks/cpu_reality.py --order row`` trains 25 small GPT and Llama layouts with torch on this machine
and predicts each with the ``cpu-x86`` backend calibrated again just before that row. One run is one
draw of a shared 2-core VM's noise; this reads every run kept in ``benchmarks/data/`` (the files whose
``order`` is ``row``) and prints, as Markdown:

* per run: rows, mean absolute error, mean signed error, the worst row, rows within 10 %;
* per layout (one process, all cores, DDP x2, pipeline x2): the same over every run's rows;
* per row: its mean signed error over the runs, its worst, and in how many runs it was within 10 %.

Nothing is measured here and nothing is predicted again: the figures are the runs' own.

    python benchmarks/cpu_reality_runs.py [--data benchmarks/data]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"
WITHIN = 0.10


def runs(data: Path) -> list[tuple[str, list[dict[str, Any]]]]:
    """(file name, rows with an error) of every stored row-order run, in the order they were taken."""

    def taken(path: Path) -> tuple[int, str]:
        m = re.search(r"_s(\d+)(\w*)\.json$", path.name)
        return (int(m.group(1)), m.group(2)) if m else (0, path.name)

    out = []
    for path in sorted(data.glob("cpu_reality_s*.json"), key=taken):
        run = json.loads(path.read_text())
        if run.get("order") != "row":
            continue
        out.append((path.name, [r for r in run["rows"] if r.get("error") is not None]))
    return out


def summary(rows: list[dict[str, Any]]) -> tuple[int, float, float, float, int]:
    """(rows, mean absolute error, mean signed error, worst signed error, rows within 10 %)."""
    errors = [r["error"] for r in rows]
    worst = max(errors, key=abs)
    within = sum(abs(e) <= WITHIN for e in errors)
    return len(errors), statistics.mean(map(abs, errors)), statistics.mean(errors), worst, within


def kind(layout: str) -> str:
    return layout.split(" (")[0] if layout.startswith(("DDP", "pipeline")) else layout


def pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    args = ap.parse_args()
    stored = runs(args.data)
    if not stored:
        raise SystemExit(f"no cpu_reality_s*.json run with order 'row' in {args.data}")
    print(f"{len(stored)} runs of `cpu_reality.py --order row`\n")
    print("| run | rows | mean abs. error | mean error | worst | within 10% |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, rows in stored:
        n, mae, mean, worst, within = summary(rows)
        w = next(r for r in rows if r["error"] == worst)
        print(f"| `{name}` | {n} | {mae * 100:.1f}% | {pct(mean)} | {pct(worst)} ({w['model']}, {w['layout']}) | "
              f"{within} |")  # fmt: skip
    every = [r for _, rows in stored for r in rows]
    n, mae, mean, worst, within = summary(every)
    print(f"| all | {n} | {mae * 100:.1f}% | {pct(mean)} | {pct(worst)} | {within} ({within / n:.0%}) |")
    print("\n| layout | rows | mean abs. error | mean error | worst | within 10% |")
    print("|---|---:|---:|---:|---:|---:|")
    for layout in dict.fromkeys(kind(r["layout"]) for r in every):
        n, mae, mean, worst, within = summary([r for r in every if kind(r["layout"]) == layout])
        print(f"| {layout} | {n} | {mae * 100:.1f}% | {pct(mean)} | {pct(worst)} | {within} ({within / n:.0%}) |")
    print("\n| model | layout | runs | mean error | worst | runs within 10% |")
    print("|---|---|---:|---:|---:|---:|")
    keys = list(dict.fromkeys((r["model"], r["layout"]) for r in every))
    always = 0
    for model, layout in keys:
        n, _, mean, worst, within = summary([r for r in every if (r["model"], r["layout"]) == (model, layout)])
        always += within == n
        print(f"| {model} | {layout} | {n} | {pct(mean)} | {pct(worst)} | {within} |")
    print(f"\n{always} of {len(keys)} rows are within 10% in every run that measured them.")


if __name__ == "__main__":
    main()
