"""Compare two ``echosim search ... --json`` outputs: same layouts in the same order, same fit flags and counts, and
every figure equal (or within ``--rtol``, relative).

A speed-up of the search must keep its results: byte-identical output is best (``cmp``); a change that only
reorders a floating-point sum may move the last bits of a figure, which this script bounds. It exits 1 when
anything but the figures differs, or a figure differs by more than ``--rtol``, and prints the largest relative
difference per field.

    python benchmarks/search_compare.py BEFORE.json AFTER.json [--rtol 1e-9]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

#: The fields that say which layout a row is and whether it fits: compared exactly.
_EXACT = ("fits", "reason", "simulated")


def _identity(row: dict[str, Any]) -> tuple[Any, ...]:
    """A row's layout: every field that is not a number computed by the simulation (degrees, names, flags)."""
    return tuple(sorted((k, v) for k, v in row.items() if not isinstance(v, float) or k in _EXACT))


def _relative(a: float, b: float) -> float:
    if a == b or (math.isnan(a) and math.isnan(b)):
        return 0.0
    return abs(a - b) / max(abs(a), abs(b))


def compare(before: dict[str, Any], after: dict[str, Any], rtol: float) -> list[str]:
    """What differs (empty: the same results to ``rtol``)."""
    problems: list[str] = []
    for key in ("counts", "count", "candidates", "space", "model", "backend", "devices", "objective", "interrupted"):
        if before.get(key) != after.get(key):
            problems.append(f"{key}: {before.get(key)!r} != {after.get(key)!r}")
    for section in ("layouts", "best"):
        rows_a, rows_b = before.get(section, []), after.get(section, [])
        if len(rows_a) != len(rows_b):
            problems.append(f"{section}: {len(rows_a)} rows != {len(rows_b)}")
            continue
        worst: dict[str, float] = {}
        for i, (a, b) in enumerate(zip(rows_a, rows_b, strict=True)):
            if _identity(a) != _identity(b):
                problems.append(f"{section}[{i}]: another layout or fit ({_identity(a)} != {_identity(b)})")
                break
            for k, x in a.items():
                if isinstance(x, float):
                    worst[k] = max(worst.get(k, 0.0), _relative(x, b[k]))
        for k, r in sorted(worst.items()):
            flag = "  <-- over --rtol" if r > rtol else ""
            if r > 0.0 or flag:
                print(f"  {section}.{k}: largest relative difference {r:.3g}{flag}")
            if r > rtol:
                problems.append(f"{section}.{k}: relative difference {r:.3g} > {rtol:g}")
    return problems


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rtol", type=float, default=0.0, help="largest relative difference of a figure (default: 0)")
    opts = ap.parse_args()
    with open(opts.before) as fa, open(opts.after) as fb:
        before, after = json.load(fa), json.load(fb)
    problems = compare(before, after, opts.rtol)
    for p in problems:
        print(p)
    rows = len(before.get("layouts", []))
    print(f"{'DIFFERENT' if problems else 'same'}: {rows:,} layouts, ranking, fit flags and counts"
          f"{' compared' if problems else ' identical'}, figures within {opts.rtol:g}")  # fmt: skip
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
