"""docs/accuracy.md is generated, and accuracy must not regress: each group within one point of the page."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import SHARED
from script_loader import load_script

ROOT = Path(__file__).resolve().parents[1]
CASES = SHARED / "validation" / "cases.csv"
PAGE = ROOT / "docs" / "accuracy.md"


def _page_module():
    return load_script("benchmarks/accuracy_page.py")


def test_page_has_every_section_and_a_summary():
    page = PAGE.read_text()
    headings = [
        "## Published training runs",
        "### Error by group",
        "### Worst rows and why",
        "### Rows not compiled",
        "### Constants fitted to measurements",
        "### One layout at more devices",
        "### How far to trust one prediction",
        "## Compared with other simulators",
        "## Sensitivity",
        "## Real hardware: one H200",
        "## Real training on this CPU",
    ]
    for heading in headings:
        assert heading in page, heading
    summary = _page_module().read_summary(page)
    assert summary["compiled"] > 100 and "overall" in summary["groups"]


def test_the_sensitivity_section_is_the_stored_tables():
    """The page's sensitivity table is what the two stored files give: a page built before
    benchmarks/constant_sensitivity.py rewrote its file would quote the old module-constant rows."""
    module = _page_module()
    table = json.loads((ROOT / "benchmarks" / "data" / "sensitivity.json").read_text())
    assert "\n".join(module.sensitivity_section(table)) in PAGE.read_text()


def test_why_names_the_known_misses():
    why = _page_module().why
    assert "ZeRO-3" in why("narayanan2021-t2-gpt-174p6b-zero3-fp16-a100-80gb-1536")
    assert "llm-foundry" in why("llmfoundry-mpt-13b-bf16-h100-sxm-64")
    assert why("some-new-row") == "not explained yet"


@pytest.mark.slow
@pytest.mark.skipif(not CASES.exists(), reason="shared/validation not present")
def test_regenerated_accuracy_does_not_regress(tmp_path):
    """Regenerate the page's cases table and compare with the committed one, group by group."""
    module = _page_module()
    committed = module.read_summary(PAGE.read_text())
    page, fresh, _ = module.build(CASES, {})
    assert fresh["compiled"] >= committed["compiled"], "rows that compiled before are skipped now"
    worse = {
        group: (old, fresh["groups"].get(group))
        for group, old in committed["groups"].items()
        if fresh["groups"].get(group) is not None and fresh["groups"][group] > old + 0.01
    }
    assert not worse, f"accuracy regressed by more than a point: {worse}"
    (tmp_path / "accuracy.md").write_text(page)
    assert module.read_summary(page) == fresh


@pytest.mark.skipif(not CASES.exists(), reason="shared/validation not present")
def test_scale_section_gives_the_growth_per_doubling_beyond_echosims():
    """Two rows of one DGX Cloud series, 128 and 256 GPUs: published +4 %, echosim +1 %, one doubling: +3 points."""
    rows = [
        SimpleNamespace(case_id=f"dgxc2504-gpt-3-175b-fp8-h100-sxm-{n}", error=0.0, measured_step_time_s=m,
                        predicted_step_time_s=p)
        for n, m, p in ((128, 10.0, 10.0), (256, 10.4, 10.1))
    ]  # fmt: skip
    text = "\n".join(_page_module().scale_section(SimpleNamespace(rows=rows), CASES))
    assert "1 series of rows differ only in the data-parallel degree" in text
    assert "In 1 of them" in text and "the median series grows +3.0 points more than echosim's" in text
    assert "| dgxc_benchmarking_v25.04 | 1 | +3.0 (+3.0 to +3.0) |" in text
    assert _page_module().scale_section(SimpleNamespace(rows=rows[:1]), CASES) == []  # one row is no series


def _cpu_row(model: str, layout: str, measured: float, predicted: float, share: float = 1.0) -> dict:
    return {
        "model": model,
        "layout": layout,
        "measured_step_s": measured,
        "predicted_step_s": predicted,
        "error": predicted / measured - 1,
        "cpu_share": share,
        "steps_s": [measured],
        "other_cores": 0.0,
    }


def test_cpu_section_quotes_the_row_ordered_run_and_its_repeat(tmp_path):
    """The CPU table: both runs side by side, rows within 10% in both counted, CPU time only where it means one."""
    module = _page_module()
    run, again = tmp_path / "run.json", tmp_path / "repeat.json"
    rows = [
        _cpu_row("m", "1 process", 1.0, 0.95),
        _cpu_row("m", "1 process (all cores)", 0.5, 0.52, share=1.9),  # two threads: CPU time ~2x wall
        _cpu_row("m", "pipeline x2 (gloo)", 2.0, 1.7, share=0.8),  # -15%
    ]
    repeat = [_cpu_row("m", "1 process", 1.0, 1.02), _cpu_row("m", "1 process (all cores)", 0.5, 0.47)]
    notes = ["* every attempt is in `benchmarks/data/cpu_reality.json`"]
    run.write_text(json.dumps({"machine": "Test CPU", "order": "row", "rows": rows, "notes": notes}))
    again.write_text(json.dumps({"rows": repeat}))
    text = "\n".join(module.cpu_section(run, again))
    assert "just before each row" in text and f"{run}" in text
    assert "2 within 10%" in text and "Within 10% in both runs: 2 of 3 rows" in text
    assert "| m | 1 process (all cores) | 0.500 (0.50-0.50) | 0.520 | +4.0% | n/a |" in text
    assert "| -15.0% | n/a | 0.00 | not measured | | |" in text  # the pipeline row: no CPU-time error, no repeat
    assert "one-thread ranks outside a pipeline, 1 rows) 5.0%" in text
    assert f"`{run}`" in text.split("every attempt is in")[1]


def test_bands_section_lists_the_groups_a_compile_can_report():
    """Only groups with enough runs to be reported appear, each with its percentiles in order."""
    from echosim.bands import MIN_RUNS, group_label, stored_table

    page = PAGE.read_text()
    table = stored_table()
    section = page.split("### How far to trust one prediction", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| group")]
    expected = [k for k, row in table["groups"].items() if row["runs"] >= MIN_RUNS]
    assert [r.split(" | ")[0][2:] for r in rows] == [group_label(k) for k in expected]
