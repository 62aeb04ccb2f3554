"""Does ``echosim search`` find layouts at least as fast as the published ones, and rank those in its top 10%?

For each dense row of ``../shared/validation/cases.csv`` whose published layout compiles, search the
row's model, cluster, global batch, sequence, precision and framework over a space that holds the
published layout: tp (every divisor up to the node), pp (every divisor up to the layers), dp (what they
leave), micro-batch {1, 2, published}, recompute {none, selective, full} and vpp {1, published}, with the
row's cp, sp, ZeRO stage and schedule. Prints per row the published layout's predicted step time and its
rank among the layouts that fit, the best layout found and its step time, and a summary: rows where the
best is at least as fast, rows where the published layout ranks in the top 10%, rows skipped and why.

Every row that misses (the best slower than published, or the published layout outside the top 10%) gets
a kind and a reason, found from the search itself (:func:`miss_reason`):

* ``space gap``: the published layout is not among the layouts the search enumerated (a value it does not list);
* ``pruned``: a closed-form rule rejected it before simulation (the rule's message; ``wrongly`` when the
  compile of the published layout fits, which would be a pruning bug);
* ``does not fit``: simulated, and echosim's memory model puts it over the device's memory;
* ``recompute`` / ``micro-batch``: the simulator's verdict: the layout is ranked, and among the layouts with
  the published recompute mode (and micro-batch) it is in the top 10%: the published run pays for a choice
  (e.g. full recomputation) that echosim's memory model finds unnecessary on these degrees;
* ``layout``: the simulator's verdict on the degrees themselves: the step-time terms where the best gains most.

``--table`` writes the per-row table (CSV, every row with its kind and reason); the one kept in
``benchmarks/data/search_vs_published.csv`` is from a run over every dense row.

    python benchmarks/search_vs_published.py [--rows N] [--filter source_id=narayanan2021] [--json out.json]
                                             [--table benchmarks/data/search_vs_published.csv] [--jobs J]

``--rows N`` takes N rows evenly spread over the selection (all by default); ``--jobs J`` searches J rows at
once in separate processes.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
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
        "recompute": tuple(dict.fromkeys(("none", "selective", "full", plan.recompute))),
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
    except EchosimError as exc:  # the published layout compiles: a search that removes everything misses it
        return {**out, "best_at_least_as_fast": False, "top_10_percent": False, "rank": None, "fit": 0,
                "kind": "pruned" if published.fits else "does not fit", "reason": f"search: {exc}"}  # fmt: skip
    out["search_s"] = time.perf_counter() - t
    target = canonical(plan, ModelFacts.of(model, plan))
    ranked = [e.plan for e in result.ranked]
    best = result.best
    out["fit"] = len(ranked)
    out["simulated"] = result.simulated
    if best is None:  # the published layout compiles: say why it is not ranked
        kind, reason = miss_reason(model, cluster, result, target, space, published.fits)
        return {**out, "best_at_least_as_fast": False, "top_10_percent": False, "rank": None, "kind": kind,
                "reason": f"no layout of the space fits; the published one: {reason}"}  # fmt: skip
    out["best"] = {**best.degrees(), "step_time_s": best.step_time_s}
    out["best_at_least_as_fast"] = (best.step_time_s or 0.0) <= published.step_time_s * (1 + 1e-9)
    if target in ranked:
        out["rank"] = ranked.index(target) + 1
        out["top_10_percent"] = out["rank"] <= _top(len(ranked))
    else:
        out["rank"] = None
        out["top_10_percent"] = False
    if not (out["best_at_least_as_fast"] and out["top_10_percent"]):
        out["kind"], out["reason"] = miss_reason(model, cluster, result, target, space, published.fits)
    return out


def _top(n: int) -> int:
    """How many of ``n`` ranked layouts are the top 10%."""
    return max(1, int(0.1 * n))


def miss_reason(
    model: Any, cluster: Any, result: Any, target: Any, space: dict[str, tuple[Any, ...]], fits: bool
) -> tuple[str, str]:
    """(kind, reason) of a row whose published layout is not in the top 10% (module docstring)."""
    from echosim.layout_search import _plan_key

    key = _plan_key(target)
    ranked = result.ranked
    at = next((i for i, e in enumerate(ranked) if _plan_key(e.plan) == key), None)
    if at is None:
        other = next((e for e in result.others if _plan_key(e.plan) == key), None)
        if other is None:
            gaps = [f"{k}={getattr(target, f)!r} not in {list(space[k])}" for k, f in _SPACE_FIELDS.items()
                    if k in space and getattr(target, f) not in space[k]]  # fmt: skip
            return "space gap", "not enumerated" + (f": {'; '.join(gaps)}" if gaps else " (an equivalent layout was)")
        if not other.simulated:
            return "pruned", f"{'wrongly ' if fits else ''}rejected before simulation: {other.reason}"
        if other.step_time_s is not None and not other.fits:
            return "does not fit", f"echosim's memory model: {other.reason}"
        return "failed", other.reason
    mine = ranked[at]
    for kind, same in (
        ("recompute", lambda e: e.plan.recompute == target.recompute),
        ("micro-batch", lambda e: (e.plan.recompute, e.plan.micro_batch) == (target.recompute, target.micro_batch)),
    ):
        peers = [e for e in ranked if same(e)]
        rank = next(i for i, e in enumerate(peers) if e is mine) + 1
        if rank <= _top(len(peers)) and len(peers) < len(ranked):
            what = (f"recompute={target.recompute}" if kind == "recompute"
                    else f"recompute={target.recompute}, micro-batch {target.micro_batch}")  # fmt: skip
            return kind, (
                f"rank {at + 1} of {len(ranked)}; among the {len(peers)} layouts with {what} it ranks {rank} "
                f"(top 10%): the published choice costs {_terms(ranked[0], model, target, cluster)}"
            )
    return "layout", f"rank {at + 1} of {len(ranked)}: {_terms(ranked[0], model, target, cluster)}"


_SPACE_FIELDS = {"tp": "tp", "pp": "pp", "dp": "dp", "cp": "cp", "ep": "ep", "vpp": "vpp", "sp": "sp", "zero": "zero",
                 "mb": "micro_batch", "recompute": "recompute", "schedule": "schedule",
                 "tp_overlap": "tp_overlap"}  # fmt: skip


def _terms(best: Any, model: Any, target: Any, cluster: Any) -> str:
    """How the best layout differs from the published one, and the step-time terms where it gains most."""
    from echosim.layout_search import _DEGREES, evaluate

    pub = evaluate(model, target, cluster)  # the full report, with its breakdown
    if best.breakdown == {}:
        best = evaluate(model, best.plan, cluster)
    diffs = {
        k: pub.breakdown.get(k, 0.0) - best.breakdown.get(k, 0.0) for k in set(best.breakdown) | set(pub.breakdown)
    }
    gains = sorted(((d, k) for k, d in diffs.items() if abs(d) > 1e-9), key=lambda dk: (-abs(dk[0]), dk[1]))[:3]
    changed = [f"{k} {getattr(target, k)}->{getattr(best.plan, k)}" for k in _DEGREES
               if getattr(best.plan, k) != getattr(target, k)]  # fmt: skip
    delta = (pub.step_time_s or 0.0) - (best.step_time_s or 0.0)
    terms = ", ".join(f"{k} {'-' if d > 0 else '+'}{abs(d):.3f} s" for d, k in gains) or "no single term"
    return f"{delta:.3f} s per step more than the best ({', '.join(changed)}: {terms})"


_TABLE = ("case_id", "published", "published_step_s", "rank", "fit", "top_10_percent", "best", "best_step_s",
          "best_at_least_as_fast", "kind", "reason")  # fmt: skip


def _layout(d: dict[str, Any]) -> str:
    mb = d.get("mb", d.get("micro_batch"))
    return f"tp{d['tp']} pp{d['pp']} dp{d['dp']} vpp{d['vpp']} mb{mb} {d['recompute']}"


def table_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per row: searched (with its kind and reason where it misses) or skipped (the reason)."""
    rows = []
    for r in results:
        if "skipped" in r:
            rows.append({"case_id": r["case_id"], "kind": "skipped", "reason": r["skipped"]})
            continue
        rows.append({
            "case_id": r["case_id"], "published": _layout(r["published"]),
            "published_step_s": f"{r['published']['step_time_s']:.4f}", "rank": r["rank"] or "",
            "fit": r.get("fit", ""),
            "top_10_percent": r["top_10_percent"], "best": _layout(r["best"]) if "best" in r else "",
            "best_step_s": f"{r['best']['step_time_s']:.4f}" if "best" in r else "",
            "best_at_least_as_fast": r["best_at_least_as_fast"],
            "kind": r.get("kind", ""), "reason": r.get("reason", ""),
        })  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=0, help="N rows evenly spread over the selection (0: all)")
    ap.add_argument("--filter", action="append", default=[], help="COLUMN=VALUE (repeatable)")
    ap.add_argument("--json", help="write every row's result here")
    ap.add_argument("--table", help="write the per-row table (CSV, with each miss's kind and reason) here")
    ap.add_argument("--jobs", type=int, default=1, help="rows searched at once, in separate processes")
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
    started = time.perf_counter()
    pool = ProcessPoolExecutor(opts.jobs) if opts.jobs > 1 else None
    rows = pool.map(check_row, cases) if pool else map(check_row, cases)
    for r in rows:
        results.append(r)
        if "skipped" in r:
            print(f"{r['case_id']}: skipped ({r['skipped'][:150]})")
        elif "best" not in r:
            p = r["published"]
            print(f"{r['case_id']}: published tp{p['tp']} pp{p['pp']} dp{p['dp']} mb{p['mb']} {p['recompute']} "
                  f"{p['step_time_s']:.3f} s; no layout ranked")  # fmt: skip
        else:
            p, b = r["published"], r["best"]
            print(
                f"{r['case_id']}: published tp{p['tp']} pp{p['pp']} dp{p['dp']} mb{p['mb']} {p['recompute']} "
                f"{p['step_time_s']:.3f} s, rank {r['rank']} of {r['fit']}; best tp{b['tp']} pp{b['pp']} "
                f"dp{b['dp']} mb{b['micro_batch']} vpp{b['vpp']} {b['recompute']} {b['step_time_s']:.3f} s "
                f"({r['simulated']} simulated in {r['search_s']:.0f} s){' - ' + r['note'] if 'note' in r else ''}"
            )
        if "kind" in r:
            print(f"    miss ({r['kind']}): {r['reason']}")
        sys.stdout.flush()
    if pool:
        pool.shutdown()
    done = [r for r in results if "skipped" not in r]
    faster = sum(r["best_at_least_as_fast"] for r in done)
    top = sum(r["top_10_percent"] for r in done)
    kinds: dict[str, int] = {}
    for r in done:
        if "kind" in r:
            kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    print(
        f"\n{len(done)} rows searched ({len(results) - len(done)} skipped) in {time.perf_counter() - started:.0f} s: "
        f"best at least as fast as published in {faster}/{len(done)}; published layout in the top 10% in "
        f"{top}/{len(done)}"
    )
    if kinds:
        print("misses by kind: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1])))
    if opts.json:
        Path(opts.json).write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    if opts.table:
        with open(opts.table, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, _TABLE, lineterminator="\n")
            writer.writeheader()
            writer.writerows(table_rows(results))


if __name__ == "__main__":
    main()
