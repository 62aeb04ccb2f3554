"""Would costing Transformer Engine's per-expert GEMMs as they run fix the MoE rows? A measurement.

Megatron-Core's TEGroupedMLP (the NeMo / Megatron-Bridge MoE recipes, ``moe_grouped_gemm``) runs its experts
through Transformer Engine's GroupedLinear, which launches one cuBLAS GEMM per local expert, round-robin on
four compute streams (``multi_stream_cublas_gemm``; see :func:`echosim.backends.compute.expert_gemms_time_s`
for the sources). echosim costs a grouped GEMM as one grouped kernel at ``GROUPED_GEMM_FRACTION`` of the dense
rate (fitted on torch._grouped_mm). This script re-runs ``validate --cases`` with the grouped GEMMs of the rows
whose framework runs TEGroupedMLP (``nemo``, ``megatron``) costed by ``expert_gemms_time_s`` on ``--streams``
streams (4: TE's; 1: the serial bound) and every other row as echosim costs it, and prints MAPE / mean error
overall, for the MoE rows, per MoE source and device, and per MoE device. Nothing here changes a prediction.

    PYTHONPATH=. python benchmarks/moe_te_streams.py [--cases ../shared/validation/cases.csv] [--streams 4]
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from echosim import memo
from echosim.backends import compute
from echosim.frameworks import get_framework
from echosim.validation.cases import known_device_names, read_cases
from echosim.validation.rows import row_plan
from echosim.validation.run import validate_row

#: Frameworks whose MoE experts are Megatron-Core's TEGroupedMLP (echosim.frameworks: "megatron" is
#: Megatron-LM with Transformer Engine, "nemo" the NeMo 2.0 / Megatron-Bridge recipes on it).
TE_GROUPED_FRAMEWORKS = ("megatron", "nemo")


@contextmanager
def te_expert_gemms(streams: int) -> Iterator[None]:
    """Grouped GEMMs costed as per-expert GEMMs on ``streams`` streams while inside (0: unchanged)."""
    original = compute.matmul_time_s

    def per_expert(dev: Any, m: int, n: int, k: int, batch: int = 1, dtype: str = "bf16", autotuned: bool = False,
                   grouped: bool = False, sustained: bool = True, fast_accum: bool = False) -> float:  # fmt: skip
        if not grouped:
            return original(dev, m, n, k, batch, dtype, autotuned, grouped, sustained, fast_accum)
        return compute.expert_gemms_time_s(dev, m, n, k, batch, dtype, autotuned, sustained, fast_accum, streams)

    if streams > 0:
        compute.matmul_time_s = per_expert  # type: ignore[assignment]
    memo.clear_all()  # costs memoised under the other rule must not be reused
    try:
        yield
    finally:
        compute.matmul_time_s = original  # type: ignore[assignment]
        memo.clear_all()


def _stat(errors: list[float]) -> str:
    if not errors:
        return "n=  0"
    mape = 100 * statistics.mean(abs(e) for e in errors)
    return f"n={len(errors):3d}  MAPE {mape:6.2f}%  mean {100 * statistics.mean(errors):+7.2f}%"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="../shared/validation/cases.csv")
    ap.add_argument("--streams", type=int, default=4, help="TE's compute streams (4); 1: serial; 0: unchanged")
    ap.add_argument("--json", default="", help="also write the rows (case_id, source, device, moe, error) here")
    args = ap.parse_args(argv)
    if args.streams < 0:
        print(f"--streams {args.streams}: must be >= 0", file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    for case in read_cases(args.cases, known_device_names()):
        moe = int(case["experts"] or 0) > 1
        te = False
        if moe:
            try:
                te = get_framework(row_plan(case)[0].framework).name in TE_GROUPED_FRAMEWORKS
            except Exception:  # a row echosim cannot plan is reported skipped by validate_row itself
                te = False
        with te_expert_gemms(args.streams if te else 0):
            r = validate_row(case)
        if r.error is not None:
            rows.append({"case_id": r.case_id, "source": case["source_id"], "device": case["device"], "moe": moe,
                         "te": te, "error": r.error})  # fmt: skip
    errors = [r["error"] for r in rows]
    moe_rows = [r for r in rows if r["moe"]]
    print(f"streams={args.streams}  (TE-grouped rows: {sum(r['te'] for r in moe_rows)} of {len(moe_rows)} MoE)")
    print(f"overall  {_stat(errors)}")
    print(f"MoE      {_stat([r['error'] for r in moe_rows])}")
    groups: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    devices: dict[str, list[float]] = collections.defaultdict(list)
    for r in moe_rows:
        groups[(r["source"], r["device"])].append(r["error"])
        devices[r["device"]].append(r["error"])
    for (source, device), errs in sorted(groups.items()):
        print(f"  {source:28s} {device:10s} {_stat(errs)}")
    for device, errs in sorted(devices.items()):
        print(f"  device {device:30s} {_stat(errs)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
