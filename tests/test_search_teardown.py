"""The console script ends a finished local search without the interpreter's teardown of its caches."""

from __future__ import annotations

import json
import sys

import pytest

from echosim import cli
from echosim.commands import search as search_command


class _Exited(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


def _run_main(monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    def fake_exit(code: int) -> None:
        raise _Exited(code)

    monkeypatch.setattr(cli.os, "_exit", fake_exit)
    monkeypatch.setattr(sys, "argv", ["echosim", *args])
    try:
        cli.main()
    except _Exited as fast:
        return -1000 - fast.code  # exited without teardown, with this code
    except SystemExit as normal:
        return int(normal.code or 0)
    raise AssertionError("main() returned without exiting")


SEARCH = ("search", "gpt3-125m", "--backend", "h100-sxm", "--devices", "4", "--global-batch", "8",
          "--space", "tp=1,2", "--space", "pp=1")  # fmt: skip


def test_a_finished_local_search_exits_0_at_once_with_its_output_flushed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run_main(monkeypatch, *SEARCH, "--json") == -1000  # os._exit(0), not a normal exit
    data = json.loads(capsys.readouterr().out)
    assert data["counts"]["simulated"] >= 2


def test_a_failing_search_exits_normally_with_its_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    search_command.SKIP_TEARDOWN[0] = False
    code = _run_main(monkeypatch, "search", "gpt3-125m", "--backend", "h100-sxm", "--devices", "4",
                     "--global-batch", "8", "--space", "warp=2")  # fmt: skip
    assert code not in (0, -1000) and code > 0
    assert "unknown key" in capsys.readouterr().err


def test_other_commands_exit_normally(monkeypatch: pytest.MonkeyPatch) -> None:
    search_command.SKIP_TEARDOWN[0] = False
    assert _run_main(monkeypatch, "backends", "--json") == 0
