"""Predicted vs published step time on the Megatron-LM papers' rows of cases.csv.

Usage: ``python benchmarks/megatron_accuracy.py [path/to/cases.csv]`` (default:
``../shared/validation/cases.csv`` next to the checkout). Prints one line per row
and the mean absolute percentage error per source; skipped rows say why.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from echosim.validation.cases import CasesError
from echosim.validation.run import validate_cases

DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "validation" / "cases.csv"


def main(path: Path) -> None:
    for source in ("narayanan2021", "korthikanti2022"):
        result = validate_cases(path, {"source_id": source})
        print(f"\n{source}")
        print(f"  {'case':<52}{'published s':>12}{'predicted s':>12}{'error':>8}")
        errors = []
        plain = []  # rows without ZeRO-3 (the paper's own Megatron-LM runs)
        for r in result.rows:
            if r.skipped:
                print(f"  {r.case_id:<52}{'':>12}{'':>12}  skipped: {r.skipped}")
                continue
            assert r.error is not None and r.predicted_step_time_s is not None
            errors.append(abs(r.error))
            if "zero3" not in r.case_id:
                plain.append(abs(r.error))
            print(f"  {r.case_id:<52}{r.measured_step_time_s:>12.2f}{r.predicted_step_time_s:>12.2f}"
                  f"{r.error * 100:>+7.1f}%")  # fmt: skip
        print(f"  rows compiled {len(errors)}, skipped {len(result.rows) - len(errors)}, "
              f"MAPE {sum(errors) / len(errors) * 100:.1f}%, worst {max(errors) * 100:.1f}%")  # fmt: skip
        if plain and len(plain) < len(errors):
            print(f"  without the ZeRO-3 rows: {len(plain)} rows, MAPE {sum(plain) / len(plain) * 100:.1f}%, "
                  f"worst {max(plain) * 100:.1f}%")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="?", type=Path, default=DEFAULT, help="cases.csv (default: %(default)s)")
    try:
        main(parser.parse_args().cases)
    except CasesError as exc:  # an unreadable or malformed table: one line, not a traceback
        sys.exit(f"error: {exc}")
