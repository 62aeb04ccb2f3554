"""DGX Cloud Benchmarking v25.05 rows (benchmarks/data/dgxc_newer_releases.csv): a row's stated expert tensor
parallelism is the one its plan runs, and the H100 rows, which share their recipes with the v25.04 rows of
``cases.csv``, stay as close as those."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from conftest import case_with

from echosim.validation.cases import Case, read_cases
from echosim.validation.rows import MEGATRON_BRIDGE_EXPERT_TP, expert_tp, row_plan

DGXC = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "dgxc_newer_releases.csv"


def _rows() -> dict[str, Case]:
    return {c.case_id: c for c in read_cases(DGXC)}


def test_the_readme_etp_column_sets_the_expert_tensor_parallelism() -> None:
    rows = _rows()
    h100 = rows["dgxc2505-grok-1-314b-bf16-h100-sxm-512"]  # TP 4, ETP 1
    gb200 = rows["dgxc2505-grok-1-314b-bf16-gb200-128"]  # TP 4, ETP 4
    assert (expert_tp(h100), expert_tp(gb200)) == (1, 4)
    assert row_plan(h100)[0].etp == 1 and row_plan(h100)[0].tp == 4


def test_without_a_stated_etp_only_megatron_bridge_rows_take_its_recipes_one() -> None:
    c = _rows()["dgxc2505-grok-1-314b-bf16-h100-sxm-512"]
    plain = case_with(c, notes="no ETP stated")
    assert expert_tp(plain) is None  # Megatron's default: the experts split like the dense layers (tp)
    bridge = case_with(plain, source_id="megatron_bridge_25.11")
    assert expert_tp(bridge) == MEGATRON_BRIDGE_EXPERT_TP
    dense = _rows()["dgxc2505-llama-3p1-405b-bf16-h100-sxm-512"]
    assert expert_tp(dense) is None


def test_deepseek_rows_take_the_recipe_the_launch_script_and_nemo_commit_state() -> None:
    """Notes-stated settings (rows.pp_layout, stated_recompute, token_drop_capacity, stated_tp_overlap,
    UNFUSED_ATTENTION_NOTE): the NeMo 25.04 DeepSeek-V3 recipe's stages, recompute, token drop, no TP overlap, and on
    GB200 its unfused MLA attention."""
    rows = _rows()
    h100 = row_plan(rows["dgxc2505-deepseek-v3-671b-bf16-h100-sxm-512"])[0]
    gb200 = row_plan(rows["dgxc2505-deepseek-v3-671b-bf16-gb200-128"])[0]
    assert h100.pp_balance == "layout:Et*7|(t*8|)*6t*6mL" and gb200.pp_balance == "layout:Et*15|(t*16|)*2t*14mL"
    assert (h100.recompute, gb200.recompute) == ("selective:mla_up_proj", "selective:core_attn")
    assert h100.moe_capacity_factor == gb200.moe_capacity_factor == 1.0 and h100.moe_pad_to_capacity
    assert not h100.tp_overlap and not gb200.tp_overlap
    assert (h100.attention, gb200.attention) == ("flash", "math")


@pytest.mark.slow
def test_the_h100_rows_are_as_close_as_the_v25_04_ones() -> None:
    """12 H100 rows (Llama 3.1 405B, Nemotron-4 15B / 340B, Grok-1, Llama 4 Maverick, DeepSeek-V3; BF16 and FP8):
    MAPE 7.6%, mean -1.1% (benchmarks/dgxc_newer_releases.md). The GB200 rows are reported there, not held here."""
    from echosim.validation.run import validate_cases

    errors = [r.error for r in validate_cases(DGXC).rows if r.error is not None and "-h100-sxm-" in r.case_id]
    assert len(errors) == 12
    assert statistics.mean(abs(e) for e in errors) < 0.085


def test_every_note_docs_validation_lists_is_one_rows_reads() -> None:
    """docs/validation.md's table of note-stated settings names what rows.py matches, word for word."""
    import re

    import echosim.validation.rows as rows

    doc = (Path(__file__).resolve().parents[1] / "docs" / "validation.md").read_text()
    table = doc.split("## Settings a row's notes can state", 1)[1]
    notes = re.findall(r"^\| `([^`]+)`", table, re.M)
    assert len(notes) == 7
    source = Path(rows.__file__).read_text().lower()
    for note in notes:
        fixed = re.split(r" (?:N|STRING|a,b|F, padded)$", note)[0].lower()  # the words before the value
        assert fixed.replace(" ", " ?") in source or fixed in source, note
