"""Do the Megatron-Bridge MoE rows miss by system (DGX B200 vs NVL72) or by experts per GPU? An analysis.

Issue 16 asks why DGX B200 / B300 MoE rows (8 GPUs per node, x86 hosts) miss far more than the GB200 / GB300
(NVL72, Grace) rows of the same model. This script groups the Megatron-Bridge MoE rows of a
``validate --cases --json`` output by the local experts each GPU holds (experts / ep) and by system, and prints
each row's routed rows per local expert and micro-batch (seq x micro-batch x top_k x ep / experts: balanced
routing, as NVIDIA's benchmarks force it; etp = 1 in every such row). Nothing here changes a prediction.

    python -m echosim validate --cases ../shared/validation/cases.csv --json > v.json
    python benchmarks/moe_local_experts.py v.json [--cases ../shared/validation/cases.csv]
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from collections.abc import Callable

DGX = ("b200", "b300")  # 8 GPUs per node, x86 host; the NVL72 parts are gb200 / gb300


def moe_rows(validate_json: str, cases_csv: str) -> list[dict[str, object]]:
    """Megatron-Bridge MoE rows with a prediction: local experts, micro-batch, rows per expert, device, error."""
    with open(validate_json, encoding="utf-8") as fh:
        rows = json.load(fh)["rows"]
    with open(cases_csv, encoding="utf-8") as fh:
        cases = {c["case_id"]: c for c in csv.DictReader(fh)}
    out: list[dict[str, object]] = []
    for r in rows:
        c = cases[r["case_id"]]
        if c["arch"] != "moe" or not r.get("predicted_step_time_s") or not c["source_id"].startswith("megatron_bridge"):
            continue
        experts, ep, top_k = int(c["experts"]), int(c["ep"] or 1), int(c["top_k"])
        mb, seq = int(c["micro_batch"] or 1), int(c["seq_len"])
        out.append({
            "case_id": r["case_id"], "device": c["device"], "local": experts // ep, "mb": mb,
            "rows": seq * mb * top_k * ep // experts, "error": float(r["error"]),
        })  # fmt: skip
    return out


def summary(rows: list[dict[str, object]], keep: Callable[[dict[str, object]], bool]) -> str:
    """'n rows, mean error, MAPE' of the rows ``keep`` selects."""
    errs = [float(r["error"]) for r in rows if keep(r)]
    if not errs:
        return "0 rows"
    return f"{len(errs)} rows, mean {statistics.mean(errs):+.1%}, MAPE {statistics.mean(map(abs, errs)):.1%}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("validate_json")
    p.add_argument("--cases", default="../shared/validation/cases.csv")
    args = p.parse_args(argv)
    rows = moe_rows(args.validate_json, args.cases)
    for r in sorted(rows, key=lambda r: (r["local"], r["mb"], r["device"], r["error"])):
        print(f"local {r['local']:3} mb {r['mb']} rows/expert {r['rows']:6} {r['device']:8} "
              f"{float(r['error']):+6.1%} {r['case_id']}")  # fmt: skip
    gpt_oss = "gpt-oss"
    groups: dict[str, Callable[[dict[str, object]], bool]] = {
        "local >= 16": lambda r: int(r["local"]) >= 16,
        "local < 16": lambda r: int(r["local"]) < 16,
        "local >= 16, DGX B200/B300": lambda r: int(r["local"]) >= 16 and r["device"] in DGX,
        "local >= 16, NVL72 / H100": lambda r: int(r["local"]) >= 16 and r["device"] not in DGX,
        "local < 16, DGX B200/B300": lambda r: int(r["local"]) < 16 and r["device"] in DGX,
        "local < 16, NVL72 / H100": lambda r: int(r["local"]) < 16 and r["device"] not in DGX,
        "local < 16, not gpt-oss": lambda r: int(r["local"]) < 16 and gpt_oss not in str(r["case_id"]),
    }
    for name, keep in groups.items():
        print(f"{name}: {summary(rows, keep)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
