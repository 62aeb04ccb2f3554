"""NeMo performance-summary rows cases.csv lacks (benchmarks/data/nemo_docs_other.csv): the builder writes only rows
whose batch arithmetic holds, and the rows run NeMo's recipe defaults."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from conftest import SHARED
from script_loader import check_mape, load_check, rebuilt

from echosim.validation.cases import Case, read_cases
from echosim.validation.rows import row_framework, row_plan

ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT / "benchmarks" / "data" / "nemo_docs_other.csv"
CASES = SHARED / "validation" / "cases.csv"


def _rows() -> dict[str, Case]:
    return {c.case_id: c for c in read_cases(CSV)}


def _builder() -> ModuleType:
    return load_check("benchmarks/nemo_docs_other_rows.py")


def test_the_rows_run_nemos_recipe_defaults() -> None:
    rows = _rows()
    llama70 = row_plan(rows["nemo2502-llama3-70b-fp8-b200-64"])[0]
    assert (llama70.tp, llama70.pp, llama70.cp, llama70.dp, llama70.vpp) == (2, 4, 2, 4, 5)
    assert llama70.zero == 1 and llama70.sp and llama70.tp_overlap  # distributed optimizer, SP and TP overlap
    assert row_plan(rows["nemo2507-llama3-70b-fp8-gb200-64"])[0].zero == 3  # the table's FSDP 1
    assert row_framework(rows["nemo2502-llama3-8b-fp8-b200-8"]) == "nemo-ce-native"
    mixtral = row_plan(rows["nemo2502-mixtral-8x22b-fp8-b200-256"])[0]
    assert (mixtral.global_batch, mixtral.micro_batch, mixtral.ep) == (64, 1, 8)


def test_a_row_whose_batch_does_not_add_up_is_not_written() -> None:
    builder = _builder()
    run = list(builder.TABLES[7])  # 25.02 Mixtral-8x22B, as the page prints it: GBS 1, MBS 64
    run[5], run[6] = 1, 64
    builder.TABLES = [tuple(run)]
    with pytest.raises(SystemExit, match="GBS 1 != MBS 64"):
        builder.build(CASES)


def test_the_csv_is_what_the_builder_writes(tmp_path: Path) -> None:
    assert rebuilt(_builder(), CASES, tmp_path) == CSV.read_text()


@pytest.mark.slow
def test_the_rows_are_as_close_as_the_nemo_rows_of_cases_csv() -> None:
    """13 rows: MAPE 9.4 %, mean -3.5 % (benchmarks/nemo_docs_other_rows.md)."""
    check_mape(CSV, 13, 0.10)
