"""Where the TPU rows' error sits: per-chip compute or communication, by generation. An analysis.

Issue 16: the ``tpu_recipes`` group misses (16.9 %, every row too fast) while MaxText's own v4 / v5e / v5p tables
stay within 6-9 %. ``benchmarks/tpu_fsdp_dtype.md`` ruled out the FSDP collectives' dtype. This script asks the
next question for every TPU row of ``cases.csv``: is the missing time communication that echosim hides, or
per-chip compute that runs slower than echosim's rates? For each row it prints

* the error, and the hardware-FLOP utilisation (HFU: the step's FLOPs with recompute, over devices x step x the
  chip's bf16 peak) that echosim predicts and that the published step implies;
* the predicted step's shares: MXU work (matmuls and attention), memory-bound fusions, exposed communication;
* ``serial``: the error if every collective of the step ran exposed, after the compute (an upper bound on what
  any overlap rule can add);
* ``1-way``: as ``serial``, with every wrapped torus axis carrying one direction (:func:`wrap_factor`);
* ``mxu x``: the factor the MXU time would need for the prediction to meet the published step, the rest held;
* ``miss/B`` and ``coll/B``: the published step's surplus over the prediction, and the time of every collective
  of the step run exposed, in ms per billion parameters (a surplus that follows the parameter count, not the
  per-chip work, points at a per-parameter cost: the FSDP collectives or the update).

Then, per generation, the dense rows' (MoE rows have their own cause: ``benchmarks/moe_*.md``) measured HFU and
the range of the two counterfactuals. Nothing here changes a prediction.

    PYTHONPATH=. python benchmarks/tpu_generations.py [--cases ../shared/validation/cases.csv]
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from typing import Any

from echosim.backends.tpu import TPUS, torus_block
from echosim.compiler import lower
from echosim.validation.cases import Case, read_cases
from echosim.validation.published import published_step_time
from echosim.validation.rows import row_model, row_plan

MXU = ("compute.matmul", "compute.attention")


def wrap_factor(device: str, chips_per_slice: int) -> float:
    """How much longer the slice's collectives would take if each wrapped axis carried one direction, as an
    axis without wraparound does: echosim gives a wrapped axis twice the bandwidth (``ici_all_gather_us``).
    x2 on a 16 x 16 v6e slice, x1.5 on 8 x 16, x1 below 128 chips."""
    chip = TPUS[device]
    axes = [a for a in torus_block(chip, chips_per_slice) if a > 1]
    wraps = [a % chip.wrap_multiple == 0 and a > 2 for a in axes]
    return sum(2 if w else 1 for w in wraps) / len(axes) if axes else 1.0


def attribution(c: Case) -> dict[str, Any] | None:
    """The row's error, HFU both ways and the two counterfactuals (None: no published step, or a chip with no
    backend, such as the GShard v3 row, which has neither)."""
    measured, _ = published_step_time(c)
    if not measured or c["device"] not in TPUS:
        return None
    plan, cluster = row_plan(c)
    comp = lower(row_model(c), plan, cluster)
    r = comp.report
    breakdown = r.to_dict()["breakdown"]
    peak = TPUS[c["device"]].peak_bf16_tflops * 1e12
    flops_per_device = r.hardware_flops_per_step / r.devices
    mxu = sum(breakdown.get(k, 0.0) for k in MXU)
    comm = sum(v for k, v in breakdown.items() if k.startswith("comm"))
    # Every collective the step issues, once per run of its unit: what full exposure would add.
    collectives = sum(
        a["duration_s"] * a.get("runs", 1)
        for _, a in comp.costed.dag().nodes(data=True)
        if a.get("kind") == "collective"
    )
    step = r.step_time_s
    one_way = wrap_factor(c["device"], r.devices // (c.int("slices") or 1))
    return {
        "case_id": c["case_id"],
        "device": c["device"],
        "moe": c["arch"] == "moe",
        "dtype": plan.dtype,
        "error": step / measured - 1,
        "hfu_predicted": flops_per_device / (step * peak),
        "hfu_measured": flops_per_device / (measured * peak),
        "mxu_share": mxu / step,
        "memory_share": breakdown.get("compute.memory_bound", 0.0) / step,
        "comm_share": comm / step,
        "serial_error": (step + collectives) / measured - 1,
        "serial_one_way_error": (step + collectives * one_way) / measured - 1,
        "mxu_factor": (measured - (step - mxu)) / mxu if mxu else float("nan"),
        # The published step's surplus over the prediction per billion parameters, against what every collective
        # run exposed would add per billion: a cost that follows the parameter count, not the per-chip work.
        "missing_ms_per_bparam": (measured - step) * 1e3 / (r.params / 1e9),
        "collectives_ms_per_bparam": collectives * 1e3 / (r.params / 1e9),
    }


def generations(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per device, over its dense 16-bit rows: median measured HFU and the range of both counterfactuals."""
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if not r["moe"] and r["dtype"] == "bf16":
            by[r["device"]].append(r)
    out: dict[str, dict[str, float]] = {}
    for device, rs in sorted(by.items()):
        out[device] = {
            "rows": len(rs),
            "mape": statistics.fmean(abs(r["error"]) for r in rs),
            "bias": statistics.fmean(r["error"] for r in rs),
            "hfu_measured_median": statistics.median(r["hfu_measured"] for r in rs),
            "hfu_predicted_median": statistics.median(r["hfu_predicted"] for r in rs),
            "serial_min": min(r["serial_error"] for r in rs),
            "serial_max": max(r["serial_error"] for r in rs),
            "one_way_min": min(r["serial_one_way_error"] for r in rs),
            "one_way_max": max(r["serial_one_way_error"] for r in rs),
            "mxu_factor_min": min(r["mxu_factor"] for r in rs),
            "mxu_factor_max": max(r["mxu_factor"] for r in rs),
        }
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="../shared/validation/cases.csv")
    args = ap.parse_args(argv)
    rows = [a for c in read_cases(args.cases) if c["device"].startswith("tpu") and (a := attribution(c))]
    head = {"row": "46", "error": ">7", "HFU pred": ">8", "meas": ">5", "MXU": ">5", "mem": ">5", "comm": ">5",
            "serial": ">7", "1-way": ">7", "mxu x": ">5", "miss/B": ">6", "coll/B": ">6"}  # fmt: skip
    print(" ".join(f"{h:{w}}" for h, w in head.items()))
    for r in rows:
        print(
            f"{r['case_id'][:46]:46} {r['error']:+7.1%} {r['hfu_predicted']:8.2f} {r['hfu_measured']:5.2f} "
            f"{r['mxu_share']:5.0%} {r['memory_share']:5.0%} {r['comm_share']:5.0%} {r['serial_error']:+7.1%} "
            f"{r['serial_one_way_error']:+7.1%} "
            f"{r['mxu_factor']:5.2f} {r['missing_ms_per_bparam']:6.1f} {r['collectives_ms_per_bparam']:6.1f}"
        )
    print("\ndense bf16 rows per generation (HFU over the bf16 peak; serial, 1-way and mxu x: min..max over the rows)")
    for device, g in generations(rows).items():
        print(
            f"{device:8} {g['rows']:3.0f} rows  MAPE {g['mape']:5.1%} bias {g['bias']:+6.1%}  HFU measured "
            f"{g['hfu_measured_median']:.2f} (predicted {g['hfu_predicted_median']:.2f})  serial "
            f"{g['serial_min']:+.1%}..{g['serial_max']:+.1%}  1-way {g['one_way_min']:+.1%}..{g['one_way_max']:+.1%}  "
            f"mxu x {g['mxu_factor_min']:.2f}..{g['mxu_factor_max']:.2f}"
        )


if __name__ == "__main__":
    main()
