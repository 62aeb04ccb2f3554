"""Megatron-Bridge rows cases.csv drops as repeats (benchmarks/data/mbridge_other_rows.csv): the builder keeps only
the rows cases.csv lacks, and reads the tables' FSDP column."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path
from types import ModuleType

import pytest
from conftest import SHARED
from script_loader import load_check

ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT / "benchmarks" / "data" / "mbridge_other_rows.csv"
CASES = SHARED / "validation" / "cases.csv"
HEAD = (
    "| System | #-GPUs | Precision | GBS | MBS | Sequence Length | FSDP | TP | PP | CP | VP | EP "
    "| Tokens / sec / GPU | Model TFLOP / sec / GPU |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
)
#: An archive page of one release with two Llama 3 70B rows: cases.csv holds the GB200 FP8 one
#: (mbridge260401-llama3-70b-fp8-gb200-64), not the B200 one (made up for this test).
ARCHIVE = (
    "## 26.04.01 NeMo Container\n\n### Pre-Training Performance\n\n#### Model: LLAMA3_70B\n\n" + HEAD
    + "| DGX-GB200 | 64 | FP8 | 256 | 2 | 8192 | 64 | 1 | 1 | 1 | n/a | n/a | 4224 | 1892 |\n"
    + "| DGX-B200 | 64 | FP8 | 256 | 1 | 8192 | 0 | 4 | 8 | 1 | 5 | n/a | 3000 | 1350 |\n\n"
)  # fmt: skip


def _builder() -> ModuleType:
    return load_check("benchmarks/mbridge_other_rows.py")


def test_only_the_rows_cases_csv_lacks_are_kept(tmp_path: Path) -> None:
    archive = tmp_path / "archive.md"
    archive.write_text(ARCHIVE)
    builder = _builder()
    builder.RELEASES = {"26.04.01": builder.ARCHIVE}  # the page above holds this release only
    rows, left = builder.other_rows(archive, archive, CASES)
    assert [r["case_id"] for r in rows] == ["mbridge260401-llama3-70b-fp8-b200-64"]
    assert rows[0]["zero"] == "" and rows[0]["vpp"] == "5" and "1 rows cases.csv holds" in left


def test_the_fsdp_column_makes_a_row_fsdp(tmp_path: Path) -> None:
    builder = _builder()
    builder.RELEASES = {"26.04.01": builder.ARCHIVE}
    archive = tmp_path / "archive.md"
    archive.write_text(ARCHIVE.replace("| 64 | FP8 | 256 | 1 | 8192 | 0 |", "| 64 | FP8 | 256 | 1 | 8192 | 64 |"))
    (row,), _ = builder.other_rows(archive, archive, CASES)
    assert row["zero"] == "3" and "optimizer sharding not stated" not in row["notes"]


def test_the_csv_holds_no_row_of_cases_csv() -> None:
    held = {r["case_id"] for r in csv.DictReader(CASES.open())}
    ids = [r["case_id"] for r in csv.DictReader(CSV.open())]
    assert len(ids) == len(set(ids)) == 97 and not held & set(ids)


@pytest.mark.slow
def test_the_dense_rows_are_as_close_as_cases_csvs_dense_rows() -> None:
    """43 dense rows (Llama 3 70B, Llama 3.1 405B): MAPE 5.2 %, mean -1.2 % (benchmarks/mbridge_other_rows.md)."""
    from echosim.validation.run import validate_cases

    moe = ("deepseek", "qwen3", "gpt-oss")
    rows = validate_cases(CSV).rows
    dense = [r.error for r in rows if r.error is not None and not any(m in r.case_id for m in moe)]
    assert len(dense) == 43
    assert statistics.mean(abs(e) for e in dense) < 0.06
