"""The accuracy band a compile reports: its statistics, its fallback to wider groups, the CLI, and the stored table."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from echosim.bands import (
    MIN_RUNS,
    PERCENTILES,
    TABLE_FILE,
    Band,
    Traits,
    band_for,
    family_of,
    group_label,
    model_kind,
    no_band_reason,
    precision_of,
    stored_table,
    summarise,
    traits,
)
from echosim.cli import cli
from echosim.compiler import lower
from echosim.plan import Cluster, Plan
from echosim.validation.bands import coverage_on, held_out_by_generation, held_out_coverage, table_from_cases
from tests.conftest import SHARED

CASES = SHARED / "validation" / "cases.csv"
H100_DENSE = Traits("dense", "h100-sxm", "hopper", "8-bit", "model")


def test_percentiles_of_a_group_are_the_inclusive_ones() -> None:
    errors = [i / 100 for i in range(21)]  # 0.00 .. 0.20: every 5th percentile falls on a value
    table = summarise((H100_DENSE, e) for e in errors)
    row = table["groups"]["kind=dense device=h100-sxm precision=8-bit parallel=model"]
    assert PERCENTILES == (5, 95) and row == {"runs": 21, "median": 0.1, "low": 0.01, "high": 0.19}
    # every level gets the same runs; a run with no kind or family is in none
    assert len(table["groups"]) == 5
    assert summarise([(Traits("", "h100-sxm", "hopper", "8-bit", "model"), 0.1)])["groups"] == {}


def test_the_narrowest_group_with_enough_runs_speaks() -> None:
    runs = [(H100_DENSE, 0.0)] * 3 + [(Traits("dense", "h200", "hopper", "8-bit", "data"), -0.1)] * MIN_RUNS
    table = summarise(runs)
    band = band_for(H100_DENSE, table)
    assert band is not None
    # h100-sxm has 3 runs at every device level; the hopper 8-bit model-parallel group has 3 too; hopper 8-bit: 13
    assert band.group == "kind=dense family=hopper precision=8-bit" and band.runs == 3 + MIN_RUNS
    assert band_for(Traits("moe", "h100-sxm", "hopper", "8-bit", "model"), table) is None
    assert band_for(Traits("dense", "cpu-x86", "", "16-bit", "data"), table) is None


def test_an_error_band_becomes_a_range_of_published_steps() -> None:
    band = Band("g", 20, -0.05, -0.2, 0.25)  # echosim 20 % fast to 25 % slow
    assert band.step_range_s(10.0) == pytest.approx((8.0, 12.5))
    d = band.to_dict(10.0)
    assert d["step_time_s_range"] == [8.0, 12.5] and d["runs"] == 20 and d["percentiles"] == [5, 95]


def test_traits_of_a_layout() -> None:
    assert precision_of("mxfp8") == "8-bit" and precision_of("nvfp4") == "4-bit" and precision_of("bf16") == "16-bit"
    assert family_of("gb200") == "blackwell" and family_of("tpu-v5p") == "tpu" and family_of("a100-80gb") == "ampere"
    assert family_of("cpu-x86") == "" and family_of("mi300x") == ""
    assert traits("moe", "h100-sxm", "fp8", 1, 1, 2).parallel == "model"
    assert traits("dense", "h100-sxm", "bf16", 1, 1, 1) == Traits("dense", "h100-sxm", "hopper", "16-bit", "data")
    assert group_label("kind=dense device=h100-sxm precision=8-bit parallel=data") == (
        "dense, h100-sxm, 8-bit, data-parallel only"
    )


@pytest.mark.parametrize(
    ("model", "kind"),
    [("llama3-8b", "dense"), ("mixtral-8x7b", "moe"), ("bert-large", ""), ("resnet50", ""), ("lstm-lm", "")],
)
def test_model_kind_is_read_from_the_graph(model: str, kind: str) -> None:
    plan = Plan() if model == "resnet50" else Plan(seq_len=128)
    assert model_kind(lower(model, plan, Cluster(backend="h100-sxm", devices=1)).graph) == kind


def _compile(*args: str) -> dict:
    result = CliRunner().invoke(cli, ["compile", *args, "--json"])
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.output))


def test_compile_reports_the_band_and_the_step_range_it_gives() -> None:
    args = ("gpt3-1.3b", "--backend", "h100-sxm", "--tp", "2", "--dp", "4", "--global-batch", "16")
    r = _compile(*args)
    band = r["accuracy"]["band"]
    expected = band_for(Traits("dense", "h100-sxm", "hopper", "16-bit", "model"))
    assert expected is not None and band["group"] == expected.group and band["runs"] >= MIN_RUNS
    low, high = band["step_time_s_range"]
    assert low == pytest.approx(r["step_time_s"] / (1 + band["error_high"]), rel=1e-5)
    assert high == pytest.approx(r["step_time_s"] / (1 + band["error_low"]), rel=1e-5)
    assert _compile(*args) == r  # deterministic
    text = " ".join(CliRunner().invoke(cli, ["compile", *args]).output.split())  # the table wraps long cells
    assert "likely step" in text and f"{band['runs']} published runs like this one" in text


def test_compile_says_why_there_is_no_band() -> None:
    cpu = _compile("gpt3-125m", "--backend", "cpu-x86", "--seq-len", "64")
    assert cpu["accuracy"] == {"band": None, "reason": "the validation table has no published runs on cpu-x86"}
    vision = _compile("resnet50", "--backend", "h100-sxm")
    assert vision["accuracy"]["band"] is None and "kind of model" in vision["accuracy"]["reason"]


def test_stored_table_is_well_formed() -> None:
    table = stored_table()
    assert table["min_runs"] == MIN_RUNS and table["groups"]
    for key, row in table["groups"].items():
        assert key.startswith("kind=") and row["runs"] >= 1
        assert row["low"] <= row["median"] <= row["high"], key


@pytest.mark.slow
@pytest.mark.skipif(not CASES.exists(), reason="shared/validation not present")
def test_stored_table_is_what_the_cases_give_now() -> None:
    """Fails after a cost change until ``python benchmarks/accuracy_bands.py`` rewrites the table."""
    fresh = table_from_cases(CASES)
    assert fresh == stored_table(), f"echosim/data/{TABLE_FILE} is stale: run benchmarks/accuracy_bands.py"


def test_held_out_coverage_counts_runs_inside_the_band_built_without_their_source() -> None:
    near = [("a", H100_DENSE, 0.01 * i) for i in range(MIN_RUNS)]  # source a: 0.00 .. 0.19
    far = [("b", H100_DENSE, 0.5), ("b", H100_DENSE, 0.1)]  # source b: one outlier, one inside a's band
    # a's runs see b's two (fewer than MIN_RUNS: no band); b's runs see a's band, 0.0095 .. 0.1805
    assert held_out_coverage(near + far) == (1, 2)
    assert held_out_by_generation(near + far) == {"dense, hopper": (1, 2)}


def test_coverage_on_new_runs_counts_those_inside_their_band_and_skips_those_without_one() -> None:
    table = summarise((H100_DENSE, 0.01 * i) for i in range(MIN_RUNS))  # band 0.0095 .. 0.1805
    b200 = Traits("dense", "b200", "blackwell", "8-bit", "model")  # no run of its generation: no band
    new = [("n", H100_DENSE, 0.05), ("n", H100_DENSE, -0.2), ("n", b200, 0.0)]
    assert coverage_on(new, table) == (1, 2)


@pytest.mark.skipif(not CASES.exists(), reason="shared/validation not present")
def test_a_case_rows_kind_is_the_kind_its_compiled_graph_has() -> None:
    """The table groups rows by their ``arch`` column; a compile by its graph: the two must agree."""
    from echosim.validation.cases import read_cases
    from echosim.validation.rows import row_model, row_plan

    rows = read_cases(CASES)
    picks = {"moe": "mbridge2509-qwen3-30b-a3b-tokendrop-b200-8", "dense": "mbridge2509-llama3-8b-b200-8"}
    for kind, case_id in picks.items():
        case = next(c for c in rows if c.case_id == case_id)
        plan, cluster = row_plan(case)
        assert model_kind(lower(row_model(case), plan, cluster).graph) == kind, case_id


def test_explain_reports_the_same_band_as_compile() -> None:
    args = ["gpt3-1.3b", "--backend", "h100-sxm", "--tp", "2", "--dp", "4", "--global-batch", "16"]
    result = CliRunner().invoke(cli, ["explain", *args, "--no-what-if", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["accuracy"] == _compile(*args)["accuracy"]
    text = CliRunner().invoke(cli, ["explain", *args, "--no-what-if"]).output
    assert "likely step: " in text


def test_a_format_the_table_has_no_run_of_gets_no_band() -> None:
    """fp32 on Hopper: the generation's band would be made of bf16 and fp8 runs, so there is none."""
    runs = [(Traits("dense", "h100-sxm", "hopper", "16-bit", "data"), 0.0)] * MIN_RUNS
    table = summarise(runs)
    fp32 = Traits("dense", "h100-sxm", "hopper", "32-bit", "data")
    assert band_for(fp32, table) is None
    assert no_band_reason(fp32, table) == "the validation table has no published dense runs in 32-bit on hopper devices"
    few = Traits("dense", "h100-sxm", "hopper", "16-bit", "data")
    assert band_for(few, summarise(runs[:3])) is None
    assert no_band_reason(few, summarise(runs[:3])).startswith(f"the validation table has fewer than {MIN_RUNS}")
    # a vision, recommendation or recurrent model: no band, and where its published runs are compared
    other = no_band_reason(Traits("", "a100-80gb", "ampere", "16-bit", "data"), table)
    assert "language models only" in other and "docs/beyond-transformers.md" in other


def _check(tmp_path, body: str) -> tuple[int, str]:
    config = tmp_path / "pyproject.toml"
    config.write_text(body, encoding="utf-8")
    result = CliRunner().invoke(cli, ["check", "--config", str(config), "--no-cache"])
    return result.exit_code, result.output


def test_check_holds_the_long_end_of_the_likely_step_to_its_budget(tmp_path) -> None:
    args = ("gpt3-1.3b", "--backend", "h100-sxm", "--tp", "2", "--dp", "4", "--global-batch", "16")
    report = _compile(*args)
    high = report["accuracy"]["band"]["step_time_s_range"][1]
    assert report["step_time_s"] < high * 0.99  # so the second budget fails on the band alone
    entry = (
        '[[tool.echosim.check]]\nmodel = "gpt3-1.3b"\nbackend = "h100-sxm"\ntp = 2\ndp = 4\nglobal_batch = 16\n'
        "max_likely_step_time_s = {}\n"
    )
    code, out = _check(tmp_path, entry.format(round(high * 1.01, 4)))
    assert code == 0 and out.endswith(" - ok\n"), out
    code, out = _check(tmp_path, entry.format(round(high * 0.99, 4)))  # above the step time, below the long end
    assert code == 3 and "likely step up to" in out and "published runs like this one" in out, out
    cpu = '[[tool.echosim.check]]\nmodel = "gpt3-125m"\nbackend = "cpu-x86"\nseq_len = 64\nmax_likely_step_time_s = 9\n'
    code, out = _check(tmp_path, cpu)
    assert code == 1 and "max_likely_step_time_s needs an accuracy band" in out and "cpu-x86" in out, out


def test_search_reports_the_band_of_its_best_layout() -> None:
    args = ["search", "gpt3-1.3b", "--backend", "h100-sxm", "--devices", "8", "--global-batch", "16",
            "--space", "pp=1", "--space", "cp=1", "--space", "recompute=none"]  # fmt: skip
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    best, band = data["best"][0], data["accuracy"]["band"]
    parallel = "model" if best["tp"] > 1 else "data"
    expected = band_for(Traits("dense", "h100-sxm", "hopper", "16-bit", parallel))
    assert expected is not None and band["group"] == expected.group
    assert band["step_time_s_range"][1] == pytest.approx(best["step_time_s"] / (1 + band["error_low"]), rel=1e-5)
    text = " ".join(CliRunner().invoke(cli, args).output.split())
    assert "likely step of #1: " in text
