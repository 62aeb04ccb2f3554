"""Does ``echosim search`` find layouts at least as fast as the published ones, and rank those in its top 10%?

For each dense row of ``../shared/validation/cases.csv`` whose published layout compiles, search the
row's model, cluster, global batch, sequence, precision and framework over a space that holds the
published layout: tp (every divisor up to the node), pp (every divisor up to the layers), dp (what they
leave), micro-batch {1, 2, published}, recompute {none, selective, full} and vpp {1, published}, with the
row's cp, sp, ZeRO stage and schedule. Prints per row the published layout's predicted step time and its
rank among the layouts that fit, the best layout found and its step time, and a summary: rows where the
best is at least as fast, rows where the published layout ranks in the top 10%, rows skipped and why.

    python benchmarks/search_vs_published.py [--rows N] [--filter source_id=narayanan2021] [--json out.json]

``--rows N`` takes N rows evenly spread over the selection (all by default; a full run takes hours on
two cores).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

CASES = Path(__file__).resolve().parents[2] / "shared" / "validation" / "cases.csv"


def row_space(plan: Any, devices: int, per_node: int, layers: int) -> dict[str, tuple[Any, ...]]:
    divisors = [d for d in range(1, devices + 1) if devices % d == 0]
    return {
        "tp": tuple(sorted({d for d in divisors if d <= per_node} | {plan.tp})),
        "pp": tuple(sorted({d for d in divisors if d <= layers} | {plan.pp})),
        "cp": (plan.cp,),
        "ep": (plan.ep,),
        "vpp": tuple(sorted({1, plan.vpp})),
        "sp": (plan.sp,),
        "zero": (plan.zero,),
        "mb": tuple(sorted({1, 2, plan.micro_batch})),
        "recompute": ("none", "selective", "full"),
        "schedule": (plan.schedule,),
        "tp_overlap": (plan.tp_overlap,),
    }


def check_row(c: Any) -> dict[str, Any]:
    from echosim.compiler import compile as compile_model
    from echosim.errors import EchosimError
    from echosim.layout_search import ModelFacts, canonical, search
    from echosim.validation.rows import row_model, row_plan, unsupported

    out: dict[str, Any] = {"case_id": c.case_id}
    if reason := unsupported(c):
        return {**out, "skipped": reason}
    plan, cluster = row_plan(c)
    model = row_model(c)
    try:
        published = compile_model(model, plan, cluster)
    except EchosimError as exc:
        return {**out, "skipped": f"published layout does not compile: {exc}"}
    out["published"] = {"tp": plan.tp, "pp": plan.pp, "dp": plan.dp, "mb": plan.micro_batch, "vpp": plan.vpp,
                        "recompute": plan.recompute, "step_time_s": published.step_time_s,
                        "fits": published.fits}  # fmt: skip
    if not published.fits:
        out["note"] = "the published layout does not fit in echosim's memory model"
    space = row_space(plan, cluster.devices, cluster.devices_per_node, model.layers)
    t = time.perf_counter()
    try:
        result = search(model, replace(plan, tp=1, pp=1, dp=1, vpp=1), cluster, space=space)
    except EchosimError as exc:
        return {**out, "skipped": f"search: {exc}"}
    out["search_s"] = time.perf_counter() - t
    target = canonical(plan, ModelFacts.of(model, plan))
    ranked = [e.plan for e in result.ranked]
    best = result.best
    out["fit"] = len(ranked)
    out["simulated"] = result.simulated
    if best is None:
        return {**out, "skipped": "no layout of the space fits"}
    out["best"] = {**best.degrees(), "step_time_s": best.step_time_s}
    out["best_at_least_as_fast"] = (best.step_time_s or 0.0) <= published.step_time_s * (1 + 1e-9)
    if target in ranked:
        out["rank"] = ranked.index(target) + 1
        out["top_10_percent"] = out["rank"] <= max(1, int(0.1 * len(ranked)))
    else:
        out["rank"] = None
        out["top_10_percent"] = False
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=0, help="N rows evenly spread over the selection (0: all)")
    ap.add_argument("--filter", action="append", default=[], help="COLUMN=VALUE (repeatable)")
    ap.add_argument("--json", help="write every row's result here")
    opts = ap.parse_args()
    from echosim.validation.cases import read_cases

    cases = [c for c in read_cases(CASES) if c["arch"] != "moe"]
    for f in opts.filter:
        col, _, value = f.partition("=")
        cases = [c for c in cases if c[col] == value]
    if opts.rows and opts.rows < len(cases):
        step = len(cases) / opts.rows
        cases = [cases[int(i * step)] for i in range(opts.rows)]
    results = []
    for c in cases:
        r = check_row(c)
        results.append(r)
        if "skipped" in r:
            print(f"{r['case_id']}: skipped ({r['skipped'][:150]})")
        else:
            p, b = r["published"], r["best"]
            print(
                f"{r['case_id']}: published tp{p['tp']} pp{p['pp']} dp{p['dp']} mb{p['mb']} {p['recompute']} "
                f"{p['step_time_s']:.3f} s, rank {r['rank']} of {r['fit']}; best tp{b['tp']} pp{b['pp']} "
                f"dp{b['dp']} mb{b['micro_batch']} vpp{b['vpp']} {b['recompute']} {b['step_time_s']:.3f} s "
                f"({r['simulated']} simulated in {r['search_s']:.0f} s){' - ' + r['note'] if 'note' in r else ''}"
            )
        sys.stdout.flush()
    done = [r for r in results if "skipped" not in r]
    faster = sum(r["best_at_least_as_fast"] for r in done)
    top = sum(r["top_10_percent"] for r in done)
    print(
        f"\n{len(done)} rows searched ({len(results) - len(done)} skipped): best at least as fast as published in "
        f"{faster}/{len(done)}; published layout in the top 10% in {top}/{len(done)}"
    )
    if opts.json:
        Path(opts.json).write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
