"""What a newcomer meets first: every --help works and reads as plain text, piped tables keep their full
width, long commands show progress on stderr, validate summarises by default, --require-fit's exit status."""

from __future__ import annotations

import re

import click
import pytest
from click.testing import CliRunner

import echosim.terminal as terminal
from echosim.cli import NOT_MET, cli

MICROBENCH = (
    "source,device,system,op,dtype,shape,size_bytes,num_devices,num_nodes,metric,value,notes\n"
    "x,A100-SXM4-80GB,Azure,GEMM (cuBLASLt),fp16,m=8192 n=8192 k=8192,,1,1,TFLOPS,253.7,\n"
    "x,H100-SXM-80GB,Azure,all_reduce (nccl-tests),float32,1G,1073741824,8,1,busbw_GBps,466.35,\n"
)


def _every_command(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    ctx = click.Context(group)
    out = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        out.append((*prefix, name))
        if isinstance(command, click.Group):
            out += _every_command(command, (*prefix, name))
    return out


def test_every_help_works_without_other_options_and_shows_no_markup() -> None:
    commands = _every_command(cli)
    assert ("cost", "matmul") in commands and ("check",) in commands
    for path in [(), *commands]:
        result = CliRunner().invoke(cli, [*path, "--help"], terminal_width=100)
        assert result.exit_code == 0, (path, result.output)
        assert "``" not in result.output, (path, result.output)


def test_cost_takes_the_backend_before_or_after_the_op() -> None:
    shape = ["--m", "1024", "--n", "1024", "--k", "1024", "--json"]
    before = CliRunner().invoke(cli, ["cost", "--backend", "h100-sxm", "matmul", *shape])
    after = CliRunner().invoke(cli, ["cost", "matmul", "--backend", "h100-sxm", *shape])
    assert before.exit_code == after.exit_code == 0 and before.output == after.output
    missing = CliRunner().invoke(cli, ["cost", "matmul", *shape])
    assert missing.exit_code == 2 and "Error: --backend is required" in missing.output


def test_piped_tables_are_not_cut_to_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    out = CliRunner().invoke(cli, ["backends"]).output
    assert "…" not in out
    assert "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/" in out
    assert max(len(line) for line in out.splitlines()) > 200
    search = CliRunner().invoke(
        cli, ["search", "gpt3-125m", "--devices", "2", "--global-batch", "4", "--seq-len", "128",
              "--micro-batches", "1", "--recompute", "none"],
    )  # fmt: skip
    assert search.exit_code == 0 and "exp. comm s" in search.stdout and "…" not in search.stdout
    monkeypatch.setenv("COLUMNS", "60")  # a width the user asks for still wins
    assert max(len(line) for line in CliRunner().invoke(cli, ["backends"]).output.splitlines()) <= 60


def test_progress_goes_to_stderr_as_lines_when_not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(terminal, "PROGRESS_LINE_INTERVAL_S", 0.0)
    args = ["search", "gpt3-125m", "--devices", "2", "--global-batch", "4", "--seq-len", "128", "--micro-batches",
            "1", "--recompute", "none"]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0
    lines = result.stderr.splitlines()
    first, last = (re.match(r"compiling layouts: (\d+)/(\d+), ", line) for line in (lines[0], lines[-1]))
    assert first and last and int(first[1]) >= 1 and last[1] == last[2] == first[2]  # lines as batches end
    assert "compiling layouts" not in result.stdout
    quiet = CliRunner().invoke(cli, [*args, "--json"])
    assert quiet.stderr == ""


def test_validate_prints_the_groups_and_rows_only_when_asked(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "mb.csv"
    path.write_text(MICROBENCH)
    default = CliRunner().invoke(cli, ["validate", "--microbench", str(path)])
    assert default.exit_code == 0 and "per group" in default.output and "microbench rows" not in default.output
    rows = CliRunner().invoke(cli, ["validate", "--microbench", str(path), "--rows"])
    assert rows.exit_code == 0 and "microbench rows" in rows.output and "per group" in rows.output


def test_require_fit_exits_3_naming_the_stage_and_its_parts() -> None:
    args = ["compile", "llama3-70b", "--backend", "h100-sxm", "--tp", "8", "--seq-len", "2048", "--require-fit"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == NOT_MET == 3
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("Error: --require-fit: stage 0 does not fit: needs ")
    assert "(optimizer " in line
    assert "step time" in result.stdout  # the report is still printed
    fits = CliRunner().invoke(cli, ["compile", "gpt3-125m", "--seq-len", "128", "--require-fit", "--json"])
    assert fits.exit_code == 0 and fits.stderr == ""


def test_does_not_fit_names_the_largest_parts_without_a_warning() -> None:
    from types import SimpleNamespace

    gib = 2**30
    stage = {"params": 1 * gib, "grads": 2 * gib, "optimizer": 8 * gib, "activations": 4 * gib, "transient": 0}
    memory = [
        {"stage": 0, "fits": True, "peak": 10 * gib, "capacity": 16 * gib, **stage},
        {"stage": 1, "fits": False, "peak": 20 * gib, "capacity": 16 * gib, **stage},
        {"stage": 2, "fits": False, "peak": 20 * gib, "capacity": 16 * gib, **stage},
    ]
    line = terminal.does_not_fit(SimpleNamespace(memory=memory, warnings=[]))
    assert line == (
        "stage 1 does not fit: needs 20.0 GiB of 16.0 GiB (largest: optimizer 8.0 GiB, activations 4.0 GiB, "
        "grads 2.0 GiB); 1 more stage(s) do not fit"
    )


def test_a_py_model_without_its_factory_is_one_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "model.py").write_text("def model(): ...\n")
    for source in (str(tmp_path / "model.py"), str(tmp_path / "missing.py")):
        result = CliRunner().invoke(cli, ["compile", source])
        assert result.exit_code == 1
        assert result.output.strip() == f"Error: {source}: name the factory as path.py:FUNCTION"


def test_python_dash_m_runs_the_cli() -> None:
    """`python -m echosim` is the same CLI as the `echosim` script (venvs without bin/ on PATH)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "echosim", "--help"], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert "Usage:" in out.stdout and "compile" in out.stdout
