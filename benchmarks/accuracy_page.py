"""Generate docs/accuracy.md: echosim against published runs, a real H200 and real training on this CPU.

Usage::

    python benchmarks/accuracy_page.py [--cases ../shared/validation/cases.csv] [--sensitivity] [--out docs/accuracy.md]

* the cases table comes from ``echosim validate --cases`` (compiled now, about 30 s);
* ``--sensitivity`` recomputes the +-10 % sensitivity table (several minutes) into
  ``benchmarks/data/sensitivity.json``; without it the stored table is used;
* the H200 table is ``benchmarks/gpu_check.py`` against ``benchmarks/data/h200_microbench.csv``;
* the CPU table is the latest ``benchmarks/cpu_reality.py --order row`` run and its repeat
  (``CPU_RUN`` and ``CPU_REPEAT`` below), each row calibrated just before it.

The page ends with a machine-readable summary (an HTML comment) that
``tests/test_accuracy_page.py`` compares with a fresh run: any group whose error grows by
more than one point fails the test.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from newer_rows import CHECKS  # noqa: E402
from weak_scaling import gap_per_doubling, group_series, paired  # noqa: E402

from echosim.bands import group_label, summarise  # noqa: E402
from echosim.validation.accuracy import count_constants, fitted_constants, format_values, sensitivity  # noqa: E402
from echosim.validation.bands import (  # noqa: E402
    coverage_on,
    held_out_by_generation,
    held_out_coverage,
    runs_from_cases,
)
from echosim.validation.cases import backend_for  # noqa: E402
from echosim.validation.run import validate_cases  # noqa: E402
from echosim.validation.stats import TARGET_GROUP, TARGET_MAPE, TARGET_ROW, Validation  # noqa: E402

CASES = ROOT.parent / "shared" / "validation" / "cases.csv"
DATA = ROOT / "benchmarks" / "data"
SUMMARY = re.compile(r"<!-- accuracy-summary (\{.*\}) -->")
WORST = 15

#: Why rows miss, by what they share (first match wins). Stated causes are measured or
#: documented; "not explained yet" is said where no measurement pins the cause down.
WHY: tuple[tuple[str, str], ...] = (
    (
        r"^narayanan2021.*zero3",
        "DeepSpeed ZeRO-3 of 2021: the step stays at 66.7 s from 768 to 1,536 GPUs (175B) and at 180-184 s from "
        "1,120 to 2,240 (530B), one micro-batch each: 4 x 2 bytes per parameter per GPU (forward, recompute and "
        "backward gathers, gradient reduce-scatter) at 21-23 GB/s, one HDR NIC's rate; NCCL's ring moves that at "
        "the node's eight NICs' rate, as echosim prices it, and no documented DeepSpeed behaviour of 2021 accounts "
        "for the 8x: not modelled",
    ),
    (
        r"^llmfoundry.*h100",
        "llm-foundry's H100 tables (2024-01, torch 2.1 image): rows that ran attn_impl 'triton' (sweep.py: "
        "13b/30b large-scale; every other table: submit_benchmarks.py's default) are priced at the FA2 paper's "
        "published Triton/FA1 rate (composer-triton); the FSDP gathers and reductions hide under compute (an "
        "fp32 reduce-scatter moves no row); the flash-attn 2 rows without activation checkpointing (1b/3b/7b "
        "large-scale, -18..-28%) and the 13b H100 rows of micro-batch 2 (-21%) miss most: not explained yet",
    ),
    (
        r"^torchtitan-h200",
        "torchtitan float8 + FSDP2 on H200: attention is priced at PyTorch SDPA's FlashAttention-2 rate "
        "(checked against SDPA measured on an H200); the float8 linears' remaining gap is not explained yet",
    ),
    (r"^tpurecipes-gpt3-175b-bf16-v5p", "confidence C: a single log line that implies >85% MFU (flagged SUSPECT)"),
    (
        r"^tpurecipes-.*-v6e-",
        "Trillium runs at a measured HFU of 0.42-0.56 where v4/v5e/v5p reach 0.54-0.86 under MaxText; in 9 of 11 "
        "dense rows the missing time exceeds every collective of the step run exposed. Two readings fit the v6e "
        "rows and not the older chips': slower MXUs (the factor needed grows with the model, x1.09 at 8B to x1.41 "
        "at 405B, so none is fitted) or exposed collectives at one direction per wrapped axis (9 of 11 within "
        "-5..+8 %, v5e/v5p then +9..+83 %) (benchmarks/tpu_generations.md); TPU matmul and HBM efficiencies are "
        "assumed (0.85), not measured",
    ),
    (
        r"^tpurecipes-llama4-maverick",
        "MoE row (128 experts, megablox dropless): the MoE rows' gap (benchmarks/moe_*.md)",
    ),
    (
        r"^(tpurecipes|maxtext)",
        "TPU row: the TPU model's matmul and HBM efficiencies are assumed (0.85), not measured (validation data gap 1)",
    ),
    (
        r"h100-96gb",
        "H100 96 GB HBM2e at a 500 W power limit: peaks at the clock the cap leaves by the cube law (an upper "
        "bound: static power ignored); the long-context rows (context parallelism 4 and 8) run torch 2.6's ring "
        "attention, 92% of their predicted step, at a rate the FA2 figure does not explain: not explained yet",
    ),
    (
        r"^dgxc2504-nemotron-4-340b-fp8",
        "run with VP=12 as the source's launch.sh passes it (its table prints NA); the bf16 twins are within +1%, "
        "so the fp8 gap is the fp8 rule (fp8 linears and casts), not the layout",
    ),
    (
        r"^(mbridge2509-deepseekv3-dropless-.*h100|mbridge260401-deepseekv3-mxfp8-b200-256|deepseekv3-2024)",
        "expert parallelism across nodes, priced with DeepEP's dispatch (one network copy per destination node, "
        "a token's experts in 4 of 8 groups as DeepSeek-V3 routes); the recipes also overlap it with the other "
        "micro-batch's compute (overlap_moe_expert_parallel_comm), not modelled",
    ),
    (
        r"^mbridge2509-(?!.*fp8)",
        "priced as FP8 (current scaling): the 25.09 table has no precision column, but its footnote's "
        "'different quantization granularities' and the 25.11 table's 'FP8-CS (FP8-MX)' for the same layouts say so",
    ),
    (
        r"qwen3-30b-a3b-(fp8|mxfp8)-(h100|b200)",
        "the source's own releases disagree on this layout: qwen3-30b on 8 B200 ran 28.2 s (25.11, mbs 1) and 9.7 s "
        "(26.04.01, mbs 4); on 16 H100 fp8 took 24.8 s where bf16 took 12.5 s (25.09)",
    ),
    (
        r"gb[23]00|b[23]00",
        "Blackwell: attention is priced from cuDNN's forward rate in the FlashAttention-4 paper (1613/1.3 TFLOP/s on "
        "B200; GB200/GB300 by cuDNN 9.27's measured ratios to B200, B300 at H100's fraction) and the paper's "
        "shared-memory-bound backward roofline (30-70 % slower than cuDNN 9.13 / 9.19's measured backward, kept: "
        "benchmarks/cudnn_training_check.md), FP8 "
        "GEMMs at GB200's measured sustained plateau (carried to B200); no kernel of these runs is measured",
    ),
)


def why(case_id: str) -> str:
    for pattern, text in WHY:
        if re.search(pattern, case_id):
            return text
    return "not explained yet"


def _pct(x: float | None, signed: bool = True) -> str:
    return "" if x is None else (f"{100 * x:+.1f}%" if signed else f"{100 * x:.1f}%")


def _points(x: float) -> str:
    """A difference of two fractions, in percentage points."""
    return f"{100 * x:+.1f} points"


def group_table(groups: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["| group | rows | MAPE | mean error | worst | within 15% |", "|---|---:|---:|---:|---:|---:|"]
    order = ["overall", TARGET_GROUP] + [k for k in groups if k not in ("overall", TARGET_GROUP)]
    for key in order:
        if key in groups:
            g = groups[key]
            lines.append(
                f"| {key} | {g['rows']} | {_pct(g['mape'], False)} | {_pct(g['mean_error'])} | "
                f"{_pct(g['max'], False)} | {g['within_15pct']} |"
            )
    return lines


def cases_section(v: Validation) -> tuple[list[str], dict[str, Any]]:
    d = v.as_dict()
    groups = d["groups"]
    overall, target = groups["overall"], groups.get(TARGET_GROUP)
    compiled = [r for r in v.rows if r.error is not None]
    within = sum(1 for r in compiled if abs(r.error) <= TARGET_ROW)  # type: ignore[arg-type]
    misses = {"narayanan2021 ZeRO-3": r"^narayanan2021.*zero3", "llm_foundry": r"^llmfoundry"}
    rest = [
        r
        for r in compiled
        if r.group["device"] in ("a100-40gb", "a100-80gb", "h100-sxm")
        and r.group["confidence"] == "A"
        and not any(re.search(p, r.case_id) for p in misses.values())
    ]
    rest_mape = statistics.mean(abs(r.error) for r in rest) if rest else None  # type: ignore[arg-type]
    constants = fitted_constants(b for r in compiled if (b := backend_for(r.group["device"])))
    lines = [
        "## Published training runs (`echosim validate --cases`)",
        "",
        f"`{CASES.name}` holds {d['in_file']} rows; echosim compiled **{d['compiled']}** and skipped "
        f"{d['skipped']} (reasons below, every one counted). Error = predicted / published step time - 1 "
        "(negative: echosim is faster than the run).",
        "",
        f"* Overall: MAPE **{_pct(overall['mape'], False)}**, mean error {_pct(overall['mean_error'])} "
        f"(optimistic on average), {within} of {len(compiled)} rows within {TARGET_ROW:.0%}.",
        "* Target of the issue (dense A100/H100 rows of confidence A, "
        f"group `{TARGET_GROUP}`): MAPE **{_pct(target['mape'] if target else None, False)}** over "
        f"{target['rows'] if target else 0} rows against {TARGET_MAPE:.0%}: "
        f"**{'met' if target and target['mape'] <= TARGET_MAPE else 'not met'}**. Without the two families "
        f"discussed below (narayanan2021's ZeRO-3 rows, llm-foundry's rows) the same group is at "
        f"{_pct(rest_mape, False)} over {len(rest)} rows; they are not removed from any figure.",
        f"* Every row within {TARGET_ROW:.0%}: **{'met' if within == len(compiled) else 'not met'}** "
        f"({len(compiled) - within} rows outside).",
        f"* Constants fitted to measurements: **{count_constants(constants)}**, all to microbenchmarks "
        "(listed below); none was fitted to a row of this table.",
        "",
        "### Error by group",
        "",
        *group_table(groups),
        "",
        "### Worst rows and why",
        "",
        "| case | published s | predicted s | error | why |",
        "|---|---:|---:|---:|---|",
    ]
    for r in sorted(compiled, key=lambda r: -abs(r.error))[:WORST]:  # type: ignore[arg-type]
        lines.append(
            f"| {r.case_id} | {r.measured_step_time_s:.4g} | {r.predicted_step_time_s:.4g} | "
            f"{_pct(r.error)} | {why(r.case_id)} |"
        )
    lines += ["", "### Rows not compiled", "", "| reason | rows |", "|---|---:|"]
    lines += [f"| {reason} | {n} |" for reason, n in d["skip_reasons"].items()]
    lines += [
        "",
        "### Constants fitted to measurements",
        "",
        "| parameter | kind | what | values |",
        "|---|---|---|---|",
    ]
    for c in constants:
        values = format_values(c["values"])
        lines.append(f"| `{c['parameter']}` | {c['kind']} | {c['what']} | {values} |")
    summary = {
        "compiled": d["compiled"],
        "groups": {k: round(g["mape"], 4) for k, g in groups.items()},
        "rows": {r.case_id: round(r.error, 4) for r in compiled},  # type: ignore[arg-type]
    }
    return lines, summary


def scale_section(v: Validation, cases: Path = CASES) -> list[str]:
    """What scale alone adds: the rows that differ only in ``dp`` (benchmarks/weak_scaling.py), per source."""
    found = group_series(paired(v.rows, cases))
    if not found:
        return []
    gaps: dict[str, list[float]] = {}
    for key, pts in found.items():
        published, predicted = gap_per_doubling(pts)
        gaps.setdefault(key[0], []).append(published - predicted)
    every = [g for gs in gaps.values() for g in gs]
    faster = sum(1 for g in every if g > 0)
    lines = [
        "### One layout at more devices",
        "",
        f"{len(found)} series of rows differ only in the data-parallel degree: the same source, model, part, "
        "precision and layout, the same batch per replica (`benchmarks/weak_scaling.py`). In "
        f"{faster} of them the published step grows faster with the device count than echosim's. Per doubling of "
        f"the device count, the median series grows {_points(statistics.median(every))} more than echosim's "
        f"({_points(min(every))} to {_points(max(every))}). A layout "
        "priced far above the scale its source was checked at comes out optimistic by about that much; "
        "`benchmarks/weak_scaling.md` tests stragglers as the cause (they are not) and leaves it unmodelled.",
        "",
        "| source | series | published minus echosim growth per doubling, points: median (min to max) |",
        "|---|---:|---|",
    ]
    for source, gs in sorted(gaps.items()):
        lines.append(f"| {source} | {len(gs)} | {100 * statistics.median(gs):+.1f} ({100 * min(gs):+.1f} to "
                     f"{100 * max(gs):+.1f}) |")  # fmt: skip
    return lines


def gpt3_reference() -> tuple[float, float]:
    """(published, predicted) step time of GPT-3 175B on 1,024 A100 (Narayanan et al. 2021, sec. 5.1).

    The paper gives 140 TFLOP/s per GPU at batch 1,536 (TP 8, PP 16, DP 8); Eq. 3 turns that
    into a step time (the run is not a row of cases.csv). echosim's prediction is the default
    ``echosim compile``, which is that run.
    """
    from echosim.compiler import compile as compile_model
    from echosim.plan import DEFAULT_CLUSTER, DEFAULT_MODEL, DEFAULT_PLAN

    b, s, layers, h, vocab = 1536, 2048, 96, 12288, 51200
    flops = 96.0 * b * s * layers * h * h * (1 + s / (6 * h) + vocab / (16 * layers * h))
    return flops / (140e12 * 1024), compile_model(DEFAULT_MODEL, DEFAULT_PLAN, DEFAULT_CLUSTER).step_time_s


def comparison_section(v: Validation) -> list[str]:
    megatron = [
        r
        for r in v.rows
        if r.error is not None
        and r.group["source_id"] in ("narayanan2021", "korthikanti2022")
        and "zero3" not in r.features
    ]
    meg = statistics.mean(abs(r.error) for r in megatron) if megatron else None  # type: ignore[arg-type]
    published, predicted = gpt3_reference()
    gpt3_text = f"{_pct(predicted / published - 1)} ({predicted:.1f} s vs {published:.1f} s from 140 TFLOP/s/GPU)"
    return [
        "## Compared with other simulators",
        "",
        "| simulator | runs checked | error |",
        "|---|---|---|",
        "| Echo (arXiv 2412.12487) | three Megatron-LM runs on 64-96 H800 GPUs (GPT-13B/70B/175B, fp32) | 7-9% |",
        "| Calculon (stock A100 system file) | GPT-3 175B on 1,024 A100 (Narayanan et al. 2021) | ~13% optimistic |",
        f"| echosim (`echosim compile`, uncalibrated) | the same GPT-3 175B / 1,024 A100 run | {gpt3_text} |",
        f"| echosim | {len(megatron)} Megatron-LM paper rows (3D parallel, no ZeRO-3) | MAPE {_pct(meg, False)} |",
        f"| echosim | all {sum(1 for r in v.rows if r.error is not None)} rows it compiles, "
        f"{len({r.group['source_id'] for r in v.rows if r.error is not None})} sources, GPUs and TPUs "
        f"| MAPE {_pct(v.groups()['overall']['mape'], False)} |",
        "",
        "Echo's and Calculon's figures are as their authors (or the issue) report them on their own runs; neither "
        "tool was re-run here. Echo's runs are fp32 only and stop at 96 GPUs.",
    ]


def sensitivity_section(table: dict[str, Any]) -> list[str]:
    if not table:
        return ["## Sensitivity", "", "Not computed yet: `python benchmarks/accuracy_page.py --sensitivity`."]
    step = table.get("step", 0.1)
    data, base = table["table"], table["baseline"]
    constants_path = DATA / "constant_sensitivity.json"  # module constants: benchmarks/constant_sensitivity.py
    constants = json.loads(constants_path.read_text())["table"] if constants_path.exists() else {}
    data = {**dict(sorted(data.items())), **constants}  # the stored file's order, however the table was made
    moves = {
        (name, sign): abs(v["overall"] - base["overall"]) for name, sides in data.items() for sign, v in sides.items()
    }
    (worst_name, _), worst = max(moves.items(), key=lambda kv: kv[1])
    lines = [
        "## Sensitivity",
        "",
        f"Each calibrated backend parameter moved by +-{step:.0%} on every backend that has it (fractions capped at "
        "1, HBM bandwidth at its peak), everything else unchanged: MAPE overall and of the target group. "
        f"The largest move of the overall MAPE is {100 * worst:.1f} points (`{worst_name}`). Where a move "
        "lowers the error (slower GEMMs, since echosim is optimistic on average) the constant still stays at its "
        "measured value: it is fitted to microbenchmarks, not to these rows.",
        "",
        "| parameter | overall -10% | overall +10% | target -10% | target +10% |",
        "|---|---:|---:|---:|---:|",
        f"| (as shipped) | {_pct(base['overall'], False)} | | {_pct(base['target'], False)} | |",
    ]
    for name, sides in data.items():
        minus, plus = sides.get(f"-{step:.0%}", {}), sides.get(f"+{step:.0%}", {})
        lines.append(
            f"| `{name}` | {_pct(minus.get('overall'), False)} | {_pct(plus.get('overall'), False)} | "
            f"{_pct(minus.get('target'), False)} | {_pct(plus.get('target'), False)} |"
        )
    if constants:
        lines += ["", "Module constants (`compute.*`, `collectives.*`) are moved one fresh process each by "
                  "`python benchmarks/constant_sensitivity.py` (shares of a rate capped at 1)."]  # fmt: skip
    return lines


def gpu_section() -> list[str]:
    import gpu_check

    rows = gpu_check.compare()
    summary = gpu_check.summary(rows)
    lines = [
        "## Real hardware: one H200 (`benchmarks/gpu_check.py`)",
        "",
        "Kernels and single-GPU training steps measured on an H200 (PyTorch 2.11, CUDA 13; "
        "`benchmarks/data/h200_microbench.csv`, written by `benchmarks/gpu_microbench.py`) against the uncalibrated "
        "`h200` backend. Negative: echosim is faster than the hardware.",
        "",
        "| group | rows | mean error | MAPE | range |",
        "|---|---:|---:|---:|---|",
    ]
    for g, s in summary.items():
        lines.append(
            f"| {g} | {s['rows']} | {_pct(s['mean_error'])} | {_pct(s['mape'], False)} | "
            f"{_pct(s['min'])} .. {_pct(s['max'])} |"
        )
    lines += [
        "",
        "* Large bf16 GEMMs run at 610-775 TFLOP/s; echosim is 9-16% optimistic on them; the 1024^3 GEMM is "
        "launch-bound in the harness (-80%).",
        "* PyTorch's SDPA runs FlashAttention-2 kernels on Hopper at about half the FA3 rate the model's H100 "
        "efficiency was measured with, so attention is ~45% optimistic for PyTorch-eager workloads.",
        "* PyTorch's LayerNorm, RMSNorm, softmax and cross-entropy kernels stay well below STREAM bandwidth "
        "(40-75% optimistic); simple copies and adds are within 8%.",
        "* One micro-batch forward+backward of three small zoo models: 10-15% optimistic, the sum of the above.",
    ]
    return lines


def _cpu_error(row: dict[str, Any]) -> float | None:
    """A CPU-reality row's error against the CPU time of its step (wall x the share the process ran).

    Only for one-thread ranks outside a pipeline: an all-cores process runs two threads (its CPU time is about
    twice the wall), and a pipeline stage waits for the other one (its bubble is part of the step). A DDP rank's
    CPU time leaves out its wait for the all-reduce as well, so its column reads a little under its error.
    """
    if "all cores" in row["layout"] or "pipeline" in row["layout"]:
        return None
    return float(row["predicted_step_s"] / (row["measured_step_s"] * row.get("cpu_share", 1.0)) - 1)


def _pct_or_na(x: float | None) -> str:
    return "n/a" if x is None else _pct(x)


def _abs_known(xs: list[float | None]) -> list[float]:
    return [abs(x) for x in xs if x is not None]


#: The latest quiet ``cpu_reality.py --order row`` run and its repeat (2026-12-04/05). The page quotes these, not
#: ``cpu_reality.json`` (the script's default output, an older run with one calibration for every row), so that it
#: says what the README says.
CPU_RUN = DATA / "cpu_reality_s13.json"
CPU_REPEAT = DATA / "cpu_reality_s13b.json"


def _shown(path: Path) -> str:
    """A data file's name as the page prints it: relative to the repository when inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def cpu_section(path: Path = CPU_RUN, repeat_path: Path = CPU_REPEAT) -> list[str]:
    if not path.exists():
        return [
            "## Real training on this CPU",
            "",
            f"Not measured yet: `python benchmarks/cpu_reality.py --order row --out {_shown(path)}`.",
        ]
    data = json.loads(path.read_text())
    rows = data["rows"]
    repeat = json.loads(repeat_path.read_text())["rows"] if repeat_path.exists() else []
    again = {(r["model"], r["layout"]): r for r in repeat}
    errors = [abs(r["error"]) for r in rows]
    cpu_errors = _abs_known([_cpu_error(r) for r in rows])
    per_row = data.get("order") == "row"
    calibrated = (
        "calibrated on this machine again just before each row, for that row's ranks only (`--order row`: "
        "`echosim calibrate`'s matmul, memory-bound, attention and gloo sweeps; each row's fitted parameters are "
        f"in `{_shown(path)}`)"
        if per_row
        else "calibrated on this machine just before (`echosim calibrate`: matmul, memory-bound, attention and gloo "
        "sweeps, once for one rank alone and once for two ranks at once; the fitted parameters are in "
        f"`{_shown(path)}`)"
    )
    lines = [
        "## Real training on this CPU (`benchmarks/cpu_reality.py`)",
        "",
        f"{data.get('machine', 'this machine')}. Small GPT and Llama models really trained with torch (fp32, fused "
        "AdamW); the step time is the median of 10 steps after 3 warm-up steps. echosim predicts the same model and "
        f"layout on the `cpu-x86` backend {calibrated}. Mean absolute error "
        f"**{100 * statistics.mean(errors):.1f}%**, worst {100 * max(errors):.1f}% over {len(rows)} runs, "
        f"{sum(e <= 0.10 for e in errors)} within 10%; against the "
        f"CPU time of a step (wall x the share of it the process ran, which leaves out the time the scheduler gave "
        f"to other processes; one-thread ranks outside a pipeline, {len(cpu_errors)} rows) "
        f"{100 * statistics.mean(cpu_errors):.1f}%, worst {100 * max(cpu_errors):.1f}%.",
        "",
        "| model | layout | measured s (steps min-max) | predicted s | error | vs CPU time | other load (cores) |"
        + (" repeat: measured s | repeat: error | repeat: vs CPU time |" if again else ""),
        "|---|---|---:|---:|---:|---:|---:|" + ("---:|---:|---:|" if again else ""),
    ]
    for r in rows:
        steps = r.get("steps_s") or [r["measured_step_s"]]
        line = (
            f"| {r['model']} | {r['layout']} | {r['measured_step_s']:.3f} ({min(steps):.2f}-{max(steps):.2f}) | "
            f"{r['predicted_step_s']:.3f} | {_pct(r['error'])} | {_pct_or_na(_cpu_error(r))} | "
            f"{r.get('other_cores', 0):.2f} |"
        )
        if again:
            twin = again.get((r["model"], r["layout"]))
            line += (
                f" {twin['measured_step_s']:.3f} | {_pct(twin['error'])} | {_pct_or_na(_cpu_error(twin))} |"
                if twin
                else " not measured | | |"
            )
        lines.append(line)
    if repeat:
        rep = [abs(r["error"]) for r in repeat]
        rep_cpu = _abs_known([_cpu_error(r) for r in repeat])
        both = sum(
            abs(r["error"]) <= 0.10
            and (r["model"], r["layout"]) in again
            and abs(again[r["model"], r["layout"]]["error"]) <= 0.10
            for r in rows
        )
        lines += [
            "",
            f"The repeat (`{_shown(repeat_path)}`, a second, independent calibration and measurement "
            f"right after): mean absolute error {100 * statistics.mean(rep):.1f}%, worst {100 * max(rep):.1f}% over "
            f"{len(repeat)} runs; against CPU time {100 * statistics.mean(rep_cpu):.1f}%, worst "
            f"{100 * max(rep_cpu):.1f}%. Within 10% in both runs: {both} of {len(rows)} rows. The spread of single "
            "steps and the difference between the two runs show the noise floor of this shared 2-core VM; where other "
            "processes took cores (`other load`), the wall clock counts their time and the CPU-time column is the "
            "comparison.",
        ]
    # The script's notes name its default output; this page quotes another run's file.
    default = "benchmarks/data/cpu_reality.json"
    lines += ["", *(n.replace(default, _shown(path)) for n in data.get("notes", []))]
    return lines


#: Published runs ``cases.csv`` does not hold, checked and not fitted (``benchmarks/*newer*.py``,
#: ``benchmarks/llmfoundry_other_rows.py``), with the command that prints echosim against each.
NEWER_RUNS = CHECKS  # the published runs the table lacks, checked (benchmarks/newer_rows.py)


def newer_runs_coverage(table: dict[str, Any]) -> list[str]:
    """How many of the published runs the table does not hold lie inside the band built from all of it."""
    parts, inside_all, total_all, errors = [], 0, 0, []
    for name, title in NEWER_RUNS.items():
        path = ROOT / "benchmarks" / "data" / name
        if not path.exists():
            continue
        runs = runs_from_cases(path)
        errors += [e for _, _, e in runs]
        inside, total = coverage_on(runs, table)
        parts.append(f"{title} {inside} of {total}")
        inside_all, total_all = inside_all + inside, total_all + total
    if not total_all:
        return []
    mape, bias = sum(abs(e) for e in errors) / len(errors), sum(errors) / len(errors)
    return [
        f"On published runs the table does not hold (newer releases, other rows of its sources), which the bands "
        f"were not built from and no constant was fitted to, echosim's error over all {len(errors)} is MAPE "
        f"{mape:.1%}, mean {bias:+.1%} ({sum(abs(e) <= 0.15 for e in errors)} within 15 %), and "
        f"{inside_all} of {total_all} ({inside_all / total_all:.0%}) lie inside the band a compile reports: "
        + "; ".join(parts)
        + ". Runs that get no band (fewer than the minimum of runs like them) are not counted."
    ]


def bands_section(v: Validation, cases: Path = CASES) -> list[str]:
    """The bands a compile reports (``echosim.bands``), as this run of the table gives them."""
    runs = runs_from_cases(cases, v.rows)
    table = summarise((t, e) for _, t, e in runs)
    inside, total = held_out_coverage(runs)
    low, high = table["percentiles"]
    lines = [
        "### How far to trust one prediction",
        "",
        "`echosim compile` reports, beside its step time, echosim's error on the published runs most like the one "
        f"compiled: the {low}th and {high}th percentile of the signed error (predicted / published - 1) over the "
        f"narrowest group below with at least {table['min_runs']} runs, and the range of published steps that band "
        'gives (`accuracy` in the JSON, "likely step" in the summary). The groups split the runs by model (dense '
        "or MoE), device or its generation, GEMM precision, and whether tensor, pipeline or context parallelism is "
        "used. The cost model was developed against these runs, so the bands are tighter here than on a new run. "
        f"Held out by source (each source's runs against the bands built from the others), {inside} of {total} runs "
        f"({inside / total:.0%}) lie inside their band, where {high - low} % would if the table told the whole "
        "truth. `python benchmarks/accuracy_bands.py` writes the bands to `echosim/data/accuracy_bands.json`.",
        "",
        "Held out by source, per model kind and device generation: "
        + "; ".join(f"{key} {i} of {n}" for key, (i, n) in held_out_by_generation(runs).items())
        + ".",
        "",
        *newer_runs_coverage(table),
        "",
        f"| group | runs | {low}th pct. | median | {high}th pct. |",
        "|---|---|---|---|---|",
    ]
    for key, row in table["groups"].items():
        if row["runs"] >= table["min_runs"]:
            lines.append(
                f"| {group_label(key)} | {row['runs']} | {row['low'] * 100:+.1f} % | {row['median'] * 100:+.1f} % "
                f"| {row['high'] * 100:+.1f} % |"
            )
    return lines


def build(
    cases: Path, sensitivity_table: dict[str, Any], v: Validation | None = None
) -> tuple[str, dict[str, Any], Validation]:
    v = v if v is not None else validate_cases(cases)
    cases_lines, summary = cases_section(v)
    page = [
        "# Accuracy",
        "",
        "<!-- generated by benchmarks/accuracy_page.py; edit that script, not this file -->",
        "",
        "How far echosim is from reality, measured in the open: published training runs "
        "(`../shared/validation/cases.csv`), kernels and training steps on a real H200, and small models really "
        "trained on this project's 2-core CPU. Regenerate with `python benchmarks/accuracy_page.py "
        "[--sensitivity]`; `tests/test_accuracy_page.py` regenerates the cases table and fails if any group's "
        "error grows by more than one point.",
        "",
        *cases_lines,
        "",
        *scale_section(v, cases),
        "",
        *bands_section(v, cases),
        "",
        *comparison_section(v),
        "",
        *sensitivity_section(sensitivity_table),
        "",
        *gpu_section(),
        "",
        *cpu_section(),
        "",
        f"<!-- accuracy-summary {json.dumps(summary, sort_keys=True)} -->",
        "",
    ]
    return "\n".join(page), summary, v


def read_summary(page: str) -> dict[str, Any]:
    m = SUMMARY.search(page)
    if not m:
        raise ValueError("docs/accuracy.md has no accuracy-summary comment")
    return json.loads(m.group(1))


def compute_sensitivity(cases: Path, v: Validation) -> dict[str, Any]:
    def say(text: str) -> None:
        print(f"  sensitivity: {text}", flush=True)

    raw = sensitivity(cases, v, progress=say)
    table = {
        name: {
            sign: {"overall": g["overall"]["mape"], "target": g.get(TARGET_GROUP, {}).get("mape")}
            for sign, g in sides.items()
        }
        for name, sides in raw.items()
    }
    groups = v.groups()
    baseline = {"overall": groups["overall"]["mape"], "target": groups.get(TARGET_GROUP, {}).get("mape")}
    return {"step": 0.1, "baseline": baseline, "table": table}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=Path, default=CASES)
    parser.add_argument("--sensitivity", action="store_true", help="Recompute the sensitivity table (slow).")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "accuracy.md")
    args = parser.parse_args()
    sens_path = DATA / "sensitivity.json"
    table = json.loads(sens_path.read_text()) if sens_path.exists() else {}
    page, summary, v = build(args.cases, table)
    if args.sensitivity:
        table = compute_sensitivity(args.cases, v)
        sens_path.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
        page, summary, v = build(args.cases, table, v)
    args.out.write_text(page)
    print(f"wrote {args.out}: {summary['compiled']} rows, overall MAPE {100 * summary['groups']['overall']:.1f}%")


if __name__ == "__main__":
    main()
