"""Sensitivity of ``validate --cases`` to the model's module-level fitted constants (+-10 % each).

The per-device fields (GEMM and flash efficiencies, HBM bandwidth, launch gaps) are moved through
calibrations by ``benchmarks/accuracy_page.py --sensitivity``; the constants of the cost modules
(``compute.HEURISTIC_GEMM_FRACTION``, ``collectives.IB_EFFICIENCY``, ...: the list in
``echosim.validation.accuracy.GPU_MODULE_FITTED``) are not fields, so each move runs the whole
table in a fresh process with the constant multiplied before anything is costed (the op-cost
caches of one process would otherwise keep the old prices). Writes
``benchmarks/data/constant_sensitivity.json``, which the accuracy page adds to its sensitivity table.

    python benchmarks/constant_sensitivity.py [--cases ../shared/validation/cases.csv] [--only NAME ...]

Shares of a rate (efficiencies, fractions) are capped at 1, as the device-field table caps its fractions.
``--only`` recomputes the named constants and keeps the others' stored figures.

About one whole-table validation per move (two per constant): ~15-25 CPU minutes in all.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from echosim.validation.accuracy import GPU_MODULE_FITTED  # noqa: E402

CASES = ROOT.parent / "shared" / "validation" / "cases.csv"
OUT = ROOT / "benchmarks" / "data" / "constant_sensitivity.json"
STEP = 0.10
#: Constants that are a share of a rate: moved values are capped at 1.
FRACTIONS = {
    "collectives.IB_EFFICIENCY",
    "collectives.P2P_NVLINK_EFFICIENCY",
    "compute.HEURISTIC_GEMM_FRACTION",
    "compute.GROUPED_GEMM_FRACTION",
    "compute.MXFP8_GEMM_FRACTION",
    "compute.FLASH_BWD_RATE",
}

_CHILD = """
import json, sys
import echosim.backends.collectives as collectives
import echosim.backends.compute as compute
module = {"compute": compute, "collectives": collectives}[sys.argv[1]]
moved = getattr(module, sys.argv[2]) * float(sys.argv[3])
setattr(module, sys.argv[2], min(moved, 1.0) if sys.argv[5] == "fraction" else moved)
from echosim.validation.run import validate_cases
from echosim.validation.stats import TARGET_GROUP
groups = validate_cases(sys.argv[4]).groups()
print(json.dumps({"overall": groups["overall"]["mape"], "target": groups.get(TARGET_GROUP, {}).get("mape")}))
"""


def child_json(child: str, *args: str) -> Any:
    """Run ``child`` in a fresh interpreter on this checkout and read the JSON of its last line.

    A fresh process per run so that a patched module constant cannot leak into the next run's caches.
    """
    out = subprocess.run(
        [sys.executable, "-c", child, *args],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def moved(dotted: str, factor: float, cases: Path) -> dict[str, float]:
    """Overall and target-group MAPE with ``dotted`` multiplied by ``factor``."""
    module, attr = dotted.split(".")
    kind = "fraction" if dotted in FRACTIONS else "value"
    return child_json(_CHILD, module, attr, repr(factor), str(cases), kind)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=Path, default=CASES)
    parser.add_argument("--only", nargs="*", default=None, help="Recompute only these constants.")
    args = parser.parse_args()
    table: dict[str, dict[str, dict[str, float]]] = {}
    if args.only and OUT.exists():
        table = json.loads(OUT.read_text())["table"]
    unknown = set(args.only or ()) - set(GPU_MODULE_FITTED)
    if unknown:
        parser.error(f"unknown constant(s) {', '.join(sorted(unknown))} (known: {', '.join(GPU_MODULE_FITTED)})")
    for dotted in args.only or GPU_MODULE_FITTED:
        for sign, factor in ((f"-{STEP:.0%}", 1 - STEP), (f"+{STEP:.0%}", 1 + STEP)):
            result = moved(dotted, factor, args.cases)
            table.setdefault(dotted, {})[sign] = result
            print(f"{dotted:36s} {sign:>5s}  overall {100 * result['overall']:5.2f}%", flush=True)
    OUT.write_text(json.dumps({"step": STEP, "table": table}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
