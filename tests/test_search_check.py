"""Layout search and pre-commit budgets."""

from __future__ import annotations

import json

from click.testing import CliRunner

from echosim.cli import cli
from echosim.frontend.zoo import ArchConfig
from echosim.layout_search import candidates, search
from echosim.plan import Cluster, Plan

TINY = ArchConfig("gpt", layers=4, hidden=256, heads=4, vocab=1024, seq_len=256, dropout=0.1, tied_embeddings=True)


def test_candidates_cover_every_factorisation() -> None:
    plans = list(candidates(Plan(global_batch=16), Cluster("a100-80gb", 8), micro_batches=(1,), recompute=("none",)))
    assert {(p.tp, p.pp, p.dp) for p in plans} == {
        (tp, pp, 8 // (tp * pp)) for tp in (1, 2, 4, 8) for pp in (1, 2, 4, 8) if 8 % (tp * pp) == 0
    }
    assert all(p.tp * p.pp * p.dp == 8 and 16 % (p.micro_batch * p.dp) == 0 for p in plans)


def test_search_ranks_fitting_layouts_by_step_time() -> None:
    results = search(TINY, Plan(global_batch=16), Cluster("a100-80gb", 4), micro_batches=(1, 2), recompute=("none",))
    times = [c.step_time_s for c in results if c.fits]
    assert times == sorted(times) and len(times) == len(results)
    # the best layout is never beaten by any other candidate that fits
    assert results[0].step_time_s == min(times)


def test_search_cli_json() -> None:
    out = CliRunner().invoke(
        cli,
        ["search", "gpt3-125m", "--devices", "4", "--global-batch", "8", "--micro-batches", "1",
         "--recompute", "none", "--top", "3", "--json"],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["candidates"] >= 3 and len(data["best"]) == 3
    assert data["best"][0]["step_time_s"] <= data["best"][1]["step_time_s"]


def _project(tmp_path, budgets: str) -> str:  # type: ignore[no-untyped-def]
    path = tmp_path / "pyproject.toml"
    path.write_text(
        '[tool.echosim]\nbackend = "h100-sxm"\n\n[[tool.echosim.check]]\nmodel = "gpt3-125m"\n'
        f"devices = 2\ndp = 2\nglobal_batch = 8\n{budgets}\n"
    )
    return str(path)


def test_check_passes_within_budget(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = CliRunner().invoke(
        cli, ["check", "--config", _project(tmp_path, "max_step_time_s = 100\nmax_memory_gib = 80")]
    )
    assert out.exit_code == 0, out.output
    assert "gpt3-125m" in out.output and "ok" in out.output


def test_check_fails_and_names_the_budget(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = CliRunner().invoke(cli, ["check", "--config", _project(tmp_path, "max_step_time_s = 0.001\nmin_mfu = 0.99")])
    assert out.exit_code == 3  # a budget broken: the run itself succeeded
    assert "step time" in out.output and "> max_step_time_s = 0.001" in out.output and "MFU" in out.output


def test_check_bad_config_is_one_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = CliRunner().invoke(cli, ["check", "--config", _project(tmp_path, "max_speed = 3")])
    assert out.exit_code == 1 and "unknown key 'max_speed'" in out.output
    missing = CliRunner().invoke(cli, ["check", "--config", str(tmp_path / "nope.toml")])
    assert missing.exit_code == 1 and "cannot read" in missing.output
