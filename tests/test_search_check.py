"""Pre-commit budgets (``echosim check``); the layout search is tests/test_search.py."""

from __future__ import annotations

from click.testing import CliRunner

from echosim.cli import cli


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
