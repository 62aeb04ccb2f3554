"""What the checks on published runs ``cases.csv`` lacks share (``mbridge_newer_releases.py``,
``mbridge_other_rows.py``, ``torchtitan_newer_runs.py``, ``dgxc_newer_releases.py``, ``llmfoundry_other_rows.py``,
``tpu_recipes_other_rows.py``, ``nemo_docs_other_rows.py``, ``maxtext_readme_other_rows.py``,
``mcore_dsv3_gb200.py``, ``mbridge_cards.py``): writing their rows in ``cases.csv``'s columns, printing echosim
against every row with the error of each group, and their command line."""

from __future__ import annotations

import argparse
import csv
import io
import statistics
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

#: The columns that say what model a row trained: copied from a ``cases.csv`` row of the same model.
MODEL_COLUMNS = ("arch", "layers", "hidden", "heads", "kv_heads", "head_dim", "ffn_hidden", "vocab", "experts", "top_k",
                 "moe_ffn_hidden", "shared_experts")  # fmt: skip


def model_row(template: dict[str, str]) -> dict[str, str]:
    """A row in ``template``'s columns, all blank but the model's (:data:`MODEL_COLUMNS`), copied from it."""
    row = dict.fromkeys(template, "")
    row.update({k: template[k] for k in MODEL_COLUMNS})
    return row


#: Every check: its CSV in benchmarks/data -> its title on the accuracy page (with the script that builds it).
CHECKS = {
    "mbridge_newer_releases.csv": "Megatron-Bridge 26.06-26.08 (`benchmarks/mbridge_newer_releases.py`)",
    "torchtitan_newer.csv": "torchtitan's June 2025 async-TP table (`benchmarks/torchtitan_newer_runs.py`)",
    "dgxc_newer_releases.csv": "DGX Cloud Benchmarking v25.05 (`benchmarks/dgxc_newer_releases.py`)",
    "llmfoundry_other_rows.csv": "llm-foundry's other README rows (`benchmarks/llmfoundry_other_rows.py`)",
    "tpu_recipes_other.csv": "tpu-recipes' other MaxText READMEs (`benchmarks/tpu_recipes_other_rows.py`)",
    "nemo_docs_other.csv": "NeMo 25.02 B200 / H100 and 25.07 GB200 tables (`benchmarks/nemo_docs_other_rows.py`)",
    "maxtext_readme_other.csv": "MaxText TPU tables' other cells (`benchmarks/maxtext_readme_other_rows.py`)",
    "mbridge_other_rows.csv": "Megatron-Bridge rows dropped as repeats (`benchmarks/mbridge_other_rows.py`)",
    "mcore_dsv3_gb200.csv": "Megatron-Core's DeepSeek-V3 GB200 guide, final stage (`benchmarks/mcore_dsv3_gb200.py`)",
    "mbridge_cards.csv": "Megatron-Bridge model verification cards (`benchmarks/mbridge_cards.py`)",
}


def write_rows(rows: list[dict[str, str]], out: Path, root: Path, left_out: Iterable[str]) -> None:
    """Write ``rows`` to ``out`` (the columns of the first row, in order) and say what was left out, and why."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    out.write_text(buf.getvalue())
    print(f"wrote {len(rows)} rows to {out.relative_to(root)}")
    for line in left_out:
        print(f"  left out: {line}")


def check(path: Path, groups: Callable[[str], Iterable[str]], width: int = 52) -> None:
    """Validate the rows of ``path`` and print each one, then MAPE and mean error per group (``groups`` names the
    groups a case id belongs to; every row is also in "all")."""
    from echosim.validation.run import validate_cases

    result = validate_cases(path)
    print(f"{'case':{width}s} {'published s':>11s} {'echosim s':>9s} {'error':>7s}")
    errors: dict[str, list[float]] = {}
    for r in result.rows:
        if r.error is None:
            print(f"{r.case_id:{width}s} skipped: {r.skipped}")
            continue
        print(
            f"{r.case_id:{width}s} {r.measured_step_time_s:11.3f} {r.predicted_step_time_s:9.3f} {r.error * 100:+6.1f}%"
        )
        for key in (*groups(r.case_id), "all"):
            errors.setdefault(key, []).append(r.error)
    for key, errs in errors.items():
        mape = statistics.mean(abs(e) for e in errs)
        print(f"{key:>17s}: {len(errs)} rows, MAPE {mape:.1%}, mean error {statistics.mean(errs):+.1%}")


def transcribed_main(
    doc: str,
    build: Callable[..., Any],
    out: Path,
    root: Path,
    left_out: Iterable[str],
    groups: Callable[[str], Iterable[str]],
    width: int = 52,
    inputs: tuple[str, ...] = (),
) -> None:
    """The command line of a check: ``--build`` writes ``out`` from ``build(*files, cases)`` (``cases.csv`` lends the
    model columns; ``inputs`` names the source files it reads, none where the rows are transcribed in the script), else
    the rows are checked. ``build`` returns the rows, or the rows and what it left out (else ``left_out``)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--cases", type=Path, default=root.parent / "shared" / "validation" / "cases.csv",
                    help="for the model columns (with --build)")  # fmt: skip
    if inputs:
        ap.add_argument("--build", nargs=len(inputs), type=Path, metavar=inputs, help="rewrite the CSV from the files")
    else:
        ap.add_argument("--build", action="store_true", help="rewrite the CSV from the transcribed tables")
    args = ap.parse_args()
    if args.build:
        missing = [str(f) for f in (*(args.build if inputs else ()), args.cases) if not f.is_file()]
        if missing:
            ap.error(f"no such file: {', '.join(missing)}")
        built = build(*(args.build if inputs else ()), args.cases)
        rows, left = built if isinstance(built, tuple) else (built, left_out)
        write_rows(rows, out, root, left)
        return
    check(out, groups, width=width)
