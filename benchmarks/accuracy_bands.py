"""Write the accuracy bands a compile reports (``echosim/data/accuracy_bands.json``) and print them.

Each band is echosim's signed error on one group of the published runs of ``cases.csv`` (module doc of
:mod:`echosim.bands`). It also prints how many runs of each source lie inside the band built without
that source: what a band holds on a source the table has not seen. Run it after any change to a cost rule, as
``docs/accuracy.md`` is; ``tests/test_accuracy_bands.py`` fails while the stored table is not what this writes.

    PYTHONPATH=. python benchmarks/accuracy_bands.py [--cases ../shared/validation/cases.csv] [--check]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from echosim.bands import MIN_RUNS, PERCENTILES, TABLE_FILE, group_label, summarise
from echosim.validation.bands import coverage_on, held_out_by_generation, held_out_coverage, runs_from_cases

sys.path.insert(0, str(Path(__file__).resolve().parent))
from newer_rows import CHECKS

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CASES = ROOT.parent / "shared" / "validation" / "cases.csv"
OUT = ROOT / "echosim" / "data" / TABLE_FILE
#: Published runs cases.csv does not hold, checked and not fitted (benchmarks/newer_rows.CHECKS): what the bands hold
#: on runs they were not built from.
NEWER = tuple(CHECKS)


def render(table: dict) -> str:
    return json.dumps(table, indent=1, sort_keys=True) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, default=DEFAULT_CASES)
    parser.add_argument("--check", action="store_true", help="exit 1 if the stored table differs, write nothing")
    args = parser.parse_args()
    runs = runs_from_cases(args.cases)
    table = summarise((t, e) for _, t, e in runs)
    low, high = table["percentiles"]
    print(f"{'group':50s} {'runs':>4s} {f'p{low}':>7s} {'median':>7s} {f'p{high}':>7s}")
    for key, row in table["groups"].items():
        if row["runs"] >= table["min_runs"]:
            print(
                f"{group_label(key):50s} {row['runs']:4d} {row['low'] * 100:+6.1f}% {row['median'] * 100:+6.1f}% "
                f"{row['high'] * 100:+6.1f}%"
            )
    print("held out by source: runs inside the band built without their source, per setting")
    for percentiles, min_runs in ((10, 90), 10), ((5, 95), 10), ((10, 90), 20), (PERCENTILES, MIN_RUNS), ((2, 98), 20):
        inside, total = held_out_coverage(runs, percentiles, min_runs)
        chosen = "  <- the bands compile reports" if (percentiles, min_runs) == (PERCENTILES, MIN_RUNS) else ""
        print(
            f"  {percentiles[0]:2d}th-{percentiles[1]}th percentile, >= {min_runs} runs a group: {inside} of {total} "
            f"({inside / total:.1%}; nominal {percentiles[1] - percentiles[0]} %){chosen}"
        )
    print("held out by source, per model kind and device generation (the chosen setting):")
    for key, (inside, total) in held_out_by_generation(runs).items():
        print(f"  {key:20s} {inside:3d} of {total:3d} ({inside / total:.0%})")
    print("published runs cases.csv does not hold (benchmarks/data), inside the band built from all of cases.csv:")
    errors: list[float] = []
    for name in NEWER:
        newer = runs_from_cases(ROOT / "benchmarks" / "data" / name)
        errors += [e for _, _, e in newer]
        inside, total = coverage_on(newer, table)
        print(f"  {name:28s} {inside:3d} of {total:3d} ({inside / total:.0%})")
    mape, bias = sum(abs(e) for e in errors) / len(errors), sum(errors) / len(errors)
    within = sum(abs(e) <= 0.15 for e in errors)
    print(f"  echosim's error on all {len(errors)} of them: MAPE {mape:.1%}, mean {bias:+.1%}, {within} within 15 %")
    text = render(table)
    if args.check:
        same = OUT.exists() and OUT.read_text() == text
        print("stored table is current" if same else f"{OUT} is stale: run this script without --check")
        sys.exit(0 if same else 1)
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
