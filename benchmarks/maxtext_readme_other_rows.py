"""echosim on the rows of MaxText's TPU performance tables that the validation table leaves out (issue 16): a
check, not a fit.

MaxText's ``src/maxtext/configs/tpu/{v4,v5e,v5p}/README.md`` (commit e591f30) tabulate TFLOP/s per chip for each
model config at one and more slices. ``cases.csv`` takes 30 of those cells (``maxtext_v4_readme``,
``maxtext_v5e_readme``, ``maxtext_v5p_readme``) and leaves 16 out: the 1x and 8x rows of every v5e model, v4's 22B
at 1x and 8x, and six v5p cells. Each left-out cell runs the same launch script as a ``cases.csv`` row of its model
(same per-chip batch, remat, mesh within a slice), so the row copies that one's columns and changes only the chips,
the slices and the batch. Its step time follows from the same FLOP count: a chip's FLOPs per step do not depend
on the number of chips, so step = the template's step x its TFLOP/s / this cell's. Written to
``benchmarks/data/maxtext_readme_other.csv``; nothing in echosim was fitted to them.

    PYTHONPATH=. python benchmarks/maxtext_readme_other_rows.py
    PYTHONPATH=. python benchmarks/maxtext_readme_other_rows.py --build  # rewrite the CSV
"""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from newer_rows import transcribed_main  # noqa: E402

OUT = ROOT / "benchmarks" / "data" / "maxtext_readme_other.csv"
PEAK_TFLOPS = {"tpu-v4": 275, "tpu-v5e": 197, "tpu-v5p": 459}  # the READMEs' MFU denominators
#: (the cases.csv row of the same model and launch script, the README's hardware cell, chips, slices, TFLOP/s/chip).
CELLS = [
    ("maxtext-v5e-16b-bf16-512-x2", "1x v5e-256", 256, 1, 120),
    ("maxtext-v5e-16b-bf16-512-x2", "8x v5e-256", 2048, 8, 115),
    ("maxtext-v5e-32b-bf16-512-x2", "1x v5e-256", 256, 1, 132),
    ("maxtext-v5e-32b-bf16-512-x2", "8x v5e-256", 2048, 8, 125),
    ("maxtext-v5e-64b-bf16-512-x2", "1x v5e-256", 256, 1, 118),
    ("maxtext-v5e-64b-bf16-512-x2", "8x v5e-256", 2048, 8, 108),
    ("maxtext-v5e-128b-bf16-512-x2", "1x v5e-256", 256, 1, 110),
    ("maxtext-v5e-128b-bf16-512-x2", "8x v5e-256", 2048, 8, 104),
    ("maxtext-v4-22b-bf16-128-x2", "1x v4-128", 64, 1, 156),
    ("maxtext-v4-22b-bf16-128-x2", "8x v4-128", 512, 8, 146),
    ("maxtext-v5p-32b-bf16-128-x2", "1x v5p-128", 64, 1, 328),
    ("maxtext-v5p-64b-bf16-64", "2x v5p-128", 128, 2, 309),
    ("maxtext-v5p-128b-bf16-128", "1x v5p-512", 256, 1, 316),
    ("maxtext-v5p-256b-bf16-512", "2x v5p-1024", 1024, 2, 289),
    ("maxtext-v5p-1024b-bf16-2048", "1x v5p-2048", 1024, 1, 254),
    ("maxtext-v5p-1024b-bf16-2048", "2x v5p-4096", 4096, 2, 279),
]
LEFT_OUT = ()
_TFLOPS = re.compile(r"model_tflops_per_s_per_device=([\d.]+)")


def build(cases: Path) -> list[dict[str, str]]:
    templates = {r["case_id"]: r for r in csv.DictReader(cases.open())}
    rows: list[dict[str, str]] = []
    for template_id, cell, chips, slices, tflops in CELLS:
        t = templates[template_id]
        found = _TFLOPS.search(t["notes"])
        tp, per_chip = int(t["tp"] or 1), int(t["micro_batch"])
        if found is None or int(t["global_batch"]) != per_chip * int(t["devices"]) or chips % (slices * tp):
            raise SystemExit(f"{template_id}: no TFLOP/s in its notes, a batch not per chip, or {chips} chips that "
                             f"do not split into {slices} slices of tp {tp}")  # fmt: skip
        step = float(t["step_time_s"]) * float(found.group(1)) / tflops
        mfu = tflops / PEAK_TFLOPS[t["device"]]
        size = template_id.split("-")[2]
        notes = []
        for part in t["notes"].split(" | "):
            if part.startswith("source mesh:"):
                mesh = f"fsdp={chips // slices // tp}" + (f", tp={tp}" if tp > 1 else "")
                part = f"source mesh: {mesh}, dp over DCN/slices={slices}"
            elif part.startswith("metrics:"):
                part = f"metrics: model_tflops_per_s_per_device={tflops}; mfu={mfu:.4f}"
            elif part.startswith("source notes:"):
                part = (f"source notes: the README's '{cell}' cell; the per-chip batch, remat and mesh within a slice "
                        f"of {template_id} (the same launch script); step = its step x {found.group(1)} / {tflops} "
                        "TFLOP/s (a chip's FLOPs per step do not change with the chips)")  # fmt: skip
            notes.append(part)
        row = dict(t)
        row.update(
            case_id=f"maxtext-{t['device'].removeprefix('tpu-')}-{size}-bf16-{chips}"
            + (f"-x{slices}" if slices > 1 else ""),
            source_id=t["source_id"] + "_other",
            devices=str(chips),
            slices=str(slices),
            dp=str(chips // tp),
            global_batch=str(per_chip * chips),
            step_time_s=f"{step:.6g}",
            reported_value=f"{mfu:.4f}",
            notes=" | ".join(notes),
        )
        rows.append(row)
    return rows


def main() -> None:
    transcribed_main(__doc__, build, OUT, ROOT, LEFT_OUT, lambda case_id: [case_id.split("-")[1]], 40)


if __name__ == "__main__":
    main()
