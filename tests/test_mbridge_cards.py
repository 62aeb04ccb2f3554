"""Megatron-Bridge's model verification cards (benchmarks/mbridge_cards.py): the rows run their perf recipes'
settings, the CSV is what the builder writes, and their error is what the notes quote."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from conftest import SHARED
from script_loader import check_mape, load_check, rebuilt

from echosim.validation.cases import read_cases
from echosim.validation.rows import mtp_layers, row_plan

ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT / "benchmarks" / "data" / "mbridge_cards.csv"
CASES = SHARED / "validation" / "cases.csv"


def _builder() -> ModuleType:
    return load_check("benchmarks/mbridge_cards.py")


def test_the_rows_run_their_recipes() -> None:
    rows = {c.case_id: c for c in read_cases(CSV)}
    qwen = row_plan(rows["mbridgecard-qwen3-30b-a3b-bf16-h100-sxm-16"])[0]
    assert (qwen.ep, qwen.dp, qwen.global_batch, qwen.recompute) == (16, 16, 1024, "none")
    assert qwen.moe_dispatcher == "hybridep" and qwen.moe_ep_overlap
    dsv3_case = rows["mbridgecard-deepseek-v3-bf16-h100-sxm-1024"]
    dsv3 = row_plan(dsv3_case)[0]
    assert (dsv3.tp, dsv3.pp, dsv3.vpp, dsv3.ep, dsv3.dp) == (2, 8, 4, 64, 64)
    assert dsv3.pp_balance == "layout:Et|(tt|)*30mL" and mtp_layers(dsv3_case) == 1
    assert dsv3.recompute == "selective:mla_up_proj,mlp" and not dsv3.overlap_dp and not dsv3.moe_ep_overlap
    oss = row_plan(rows["mbridgecard-gpt-oss-120b-bf16-gb200-64"])[0]
    assert (oss.ep, oss.micro_batch, oss.recompute) == (64, 4, "selective:layernorm,moe_act")
    assert oss.moe_dispatcher == "alltoall" and oss.moe_ep_overlap and not oss.fp8_attention


def test_a_card_whose_throughput_does_not_give_its_step_is_not_written() -> None:
    builder = _builder()
    card = list(builder.CARD_ROWS[0])
    card[15] = 2 * card[15]  # tokens/s per GPU doubled: the step it implies is half the recorded one
    builder.CARD_ROWS = [tuple(card)]
    with pytest.raises(SystemExit, match="does not give the step"):
        builder.build(CASES)


def test_the_csv_is_what_the_builder_writes(tmp_path: Path) -> None:
    assert rebuilt(_builder(), CASES, tmp_path) == CSV.read_text()


@pytest.mark.slow
def test_the_rows_are_as_close_as_the_notes_say() -> None:
    """3 rows: MAPE 16.8 % (H100 -12.4 and -4.6 %, GPT-OSS 120B on GB200 -33.6 %; benchmarks/mbridge_cards.md)."""
    check_mape(CSV, 3, 0.17)
