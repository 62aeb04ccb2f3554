"""Megatron-Bridge rows whose published table prints a layout its release's recipe does not run."""

from __future__ import annotations

import pytest
from conftest import SHARED

from echosim.validation.cases import read_cases
from echosim.validation.rows import MEGATRON_BRIDGE_RECIPE_LAYOUT, recipe_layout, row_plan

CASES = SHARED / "validation" / "cases.csv"
pytestmark = pytest.mark.skipif(not CASES.exists(), reason="shared/validation not present")
GB300_26_02_01 = ("mbridge260201-llama3-70b-mxfp8-gb300-64", "mbridge260201-llama3-70b-nvfp4-gb300-64")


def test_the_26_02_01_gb300_llama3_70b_rows_run_the_r0_3_presets() -> None:
    """26.02.01 prints MXFP8 as MBS 2 / PP 4 / no VP and NVFP4 as MBS 2 / PP 1 (a whole 70B model on every GPU,
    FSDP 0); the r0.3.x presets of both are pp 4, vp 5, micro-batch 1, as the 26.02 and 26.04.01 tables print."""
    cases = {c.case_id: c for c in read_cases(CASES)}
    for case_id in GB300_26_02_01:
        c = cases[case_id]
        assert c.int("micro_batch") == 2 and not c["vpp"].strip()  # as the table prints it
        plan = row_plan(c)[0]
        assert (plan.tp, plan.pp, plan.vpp, plan.dp, plan.micro_batch) == (1, 4, 5, 16, 1)
        assert plan.schedule == "interleaved" and plan.global_batch == 256
    # the same runs in the next release, printed with the recipe's layout, are left as they are
    twin = cases["mbridge260401-llama3-70b-mxfp8-gb300-64"]
    assert recipe_layout(twin) == {}
    assert (lambda p: (p.pp, p.vpp, p.micro_batch))(row_plan(twin)[0]) == (4, 5, 1)


def test_every_recipe_layout_entry_names_exactly_one_row() -> None:
    found = [c.case_id for c in read_cases(CASES) if recipe_layout(c)]
    assert sorted(found) == sorted(GB300_26_02_01)
    assert len(found) == len(MEGATRON_BRIDGE_RECIPE_LAYOUT)


def test_the_printed_layouts_do_not_fit_and_the_recipes_do() -> None:
    """The evidence that the printed cells are not the run: neither fits in a GB300's memory as printed."""
    from dataclasses import replace

    from echosim.compiler import compile as compile_model
    from echosim.validation.rows import row_model

    cases = {c.case_id: c for c in read_cases(CASES)}
    c = cases["mbridge260201-llama3-70b-nvfp4-gb300-64"]
    plan, cluster = row_plan(c)
    printed = replace(plan, pp=1, vpp=1, dp=64, micro_batch=2, schedule="1f1b")
    assert not compile_model(row_model(c), printed, cluster).fits
    assert compile_model(row_model(c), plan, cluster).fits
