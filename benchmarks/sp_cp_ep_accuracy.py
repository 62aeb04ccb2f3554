"""Predicted vs published step time for the cases.csv rows that use SP, CP or EP/MoE.

Groups are arch x device x feature (sp, cp, ep); each row counts in every feature it
uses. Rows that also need a feature this branch does not model (ZeRO, interleaving,
FP8 ...) are skipped with their reason, as ``echosim.validation`` does.

    python benchmarks/sp_cp_ep_accuracy.py [../shared/validation/cases.csv] [--all-dtypes]
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

from echosim.validation.run import validate_cases

FEATURES = {"sp": ("", "0"), "cp": ("", "1"), "ep": ("", "1")}


def features(row: dict[str, str]) -> list[str]:
    used = [f for f, off in FEATURES.items() if row[f].strip() not in off]
    if row["arch"] == "moe" and "ep" not in used:
        used.append("ep")
    return used


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    path = Path(args[0] if args else Path(__file__).resolve().parents[2] / "shared" / "validation" / "cases.csv")
    import csv

    with open(path, encoding="utf-8") as fh:
        rows = {r["case_id"]: r for r in csv.DictReader(fh)}
    result = validate_cases(path)
    groups: dict[tuple[str, str, str, str], list[float]] = defaultdict(list)
    print(f"{'case':62} conf  measured  predicted   error")
    for r in result.rows:
        row = rows[r.case_id]
        used = features(row)
        if not used:
            continue
        if "--all-dtypes" not in sys.argv and row["dtype"].strip() not in ("", "bf16", "fp16"):
            continue
        if r.error is None:
            print(f"{r.case_id[:62]:62} {row['confidence']:>4}  skipped: {r.skipped[:70]}")
            continue
        print(
            f"{r.case_id[:62]:62} {row['confidence']:>4} {r.measured_step_time_s:9.3f} "
            f"{r.predicted_step_time_s:10.3f} {r.error:+7.1%}"
        )
        for f in used:
            groups[(row["arch"], row["device"], f, row["confidence"])].append(abs(r.error))
    print(f"\n{'arch':6} {'device':10} {'feature':8} conf rows  MAE")
    for (arch, device, f, conf), errs in sorted(groups.items()):
        print(f"{arch:6} {device:10} {f:8} {conf:>4} {len(errs):4} {sum(errs) / len(errs):6.1%}")


if __name__ == "__main__":
    main()
