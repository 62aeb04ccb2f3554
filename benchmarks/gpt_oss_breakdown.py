"""Where the gpt-oss-120b rows' predicted step goes, and what the attention questions can move. An analysis.

Issue 16: every gpt-oss-120b Megatron-Bridge row is predicted too fast (-13 to -40 %). For each row this prints
the predicted time of one repeated block (a sliding-window layer and a full-attention layer, first stage, one
micro-batch) split by kind (expert GEMMs, other GEMMs, attention kernels, all-to-all, everything else), the
measured and predicted step per block, and the row's error under two attention readings that the sources leave
open or rule out (``benchmarks/gpt_oss_breakdown.md``):

* ``no-window-skip``: the sliding-window layers' flash kernel visits every key tile up to the diagonal
  (as if the 128-token band skipped nothing), an upper bound on what the window's tile handling can add;
* ``unfused``: every attention as TE's UnfusedDotProductAttention (scores materialised), the backend TE picks
  for ``softmax_type="learnable"`` when cuDNN is older than 9.13.1.

Nothing here changes a prediction.

    PYTHONPATH=. python benchmarks/gpt_oss_breakdown.py [--cases ../shared/validation/cases.csv]
"""

from __future__ import annotations

import argparse
import collections
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import echosim.backends.compute as compute
from echosim import memo
from echosim.compiler import lower
from echosim.validation.cases import Case, read_cases
from echosim.validation.published import published_step_time
from echosim.validation.rows import row_model, row_plan
from echosim.validation.run import validate_row

KINDS = ("expert_mm", "mm", "attention", "all_to_all", "other")


def kind(op: str, scope: str) -> str:
    """The breakdown column of one costed op."""
    if op == "matmul":
        return "expert_mm" if ".experts" in scope or scope.endswith("experts") else "mm"
    if op in ("attention", "softmax"):
        return "attention"
    return "all_to_all" if op == "all_to_all" else "other"


def block_breakdown(c: Case) -> tuple[dict[str, float], float, float]:
    """(seconds per kind in one repeated block, measured step per block, predicted step per block)."""
    plan, cluster = row_plan(c)
    comp = lower(row_model(c), plan, cluster)
    spent: dict[str, float] = collections.defaultdict(float)
    for _, a in comp.costed.dag().nodes(data=True):
        if a.get("kind") not in ("op", "collective") or not a.get("unit", "").endswith(".block"):
            continue
        if a.get("vstages", "0").split(",")[0] not in ("0", ""):
            continue  # the first stage shape only
        spent[kind(a["op"], a["scope"])] += a["duration_s"]
    measured, _ = published_step_time(c)
    micro = max(1, plan.global_batch // (plan.dp * plan.micro_batch))
    blocks = micro * (c.int("layers") or 1) / plan.pp / 2  # a block holds a local and a global layer
    return spent, (measured or 0.0) / blocks, comp.report.step_time_s / blocks


@contextmanager
def patched(name: str) -> Iterator[None]:
    """Run with one of the module docstring's attention readings in place ('' for none)."""
    band, attention = compute.band_kv_blocks, compute.attention_time_s
    memo.clear_all()  # op costs are memoised by shape and device: a reading must cost them afresh
    if name == "no-window-skip":
        no_skip: Callable[..., list[int]] = lambda q, kv, bq, bkv, window=None: band(q, kv, bq, bkv, None)  # noqa: E731
        compute.band_kv_blocks = no_skip  # type: ignore[assignment]
    elif name == "unfused":

        def unfused(dev: Any, a: Any, dtype: str, backward: bool = False) -> float:
            return compute.math_attention_time_s(dev, a, dtype, backward)

        compute.attention_time_s = unfused  # type: ignore[assignment]
    try:
        yield
    finally:
        compute.band_kv_blocks, compute.attention_time_s = band, attention
        memo.clear_all()


def error(c: Case) -> float:
    r = validate_row(c)
    assert r.predicted_step_time_s is not None and r.measured_step_time_s
    return r.predicted_step_time_s / r.measured_step_time_s - 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="../shared/validation/cases.csv")
    args = p.parse_args(argv)
    rows = [c for c in read_cases(args.cases) if "gpt-oss" in c.case_id]
    readings = ("", "no-window-skip", "unfused")
    errors: dict[str, list[float]] = {r: [] for r in readings}
    print("case | meas ms/block | pred ms/block | block sum | " + " | ".join(KINDS) + " | error | no skip | unfused")
    for c in rows:
        spent, meas, pred = block_breakdown(c)
        total = sum(spent.values())
        errs = []
        for r in readings:
            with patched(r):
                errs.append(error(c))
            errors[r].append(errs[-1])
        shares = " | ".join(f"{spent[k] / total:.0%}" for k in KINDS)
        print(
            f"{c.case_id} | {meas * 1e3:.1f} | {pred * 1e3:.1f} | {total * 1e3:.1f} | {shares} | "
            + " | ".join(f"{e:+.1%}" for e in errs)
        )
    for r in readings:
        e = errors[r]
        print(f"{r or 'as modelled'}: {len(e)} rows, mean {sum(e) / len(e):+.1%}, MAPE {sum(map(abs, e)) / len(e):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
