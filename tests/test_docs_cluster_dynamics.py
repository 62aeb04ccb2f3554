"""docs/cluster-dynamics.md: every command followed by its output block prints those lines today."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from echosim.cli import cli

DOC = Path(__file__).resolve().parents[1] / "docs" / "cluster-dynamics.md"
_BLOCK = r"((?:(?!```).)*)```"  # a fenced block's body: no fence inside
PAIRS = re.findall(r"```bash\n" + _BLOCK + r"\n```\n" + _BLOCK, DOC.read_text(encoding="utf-8"), re.S)


def test_the_page_has_examples() -> None:
    assert len(PAIRS) >= 4


@pytest.mark.slow
@pytest.mark.parametrize(("command", "shown"), PAIRS, ids=[c.split()[1] + str(i) for i, (c, _) in enumerate(PAIRS)])
def test_example_output_is_current(command: str, shown: str) -> None:
    args = shlex.split(command.replace("\\\n", " "))
    assert args[0] == "echosim"
    result = CliRunner().invoke(cli, args[1:])
    assert result.exit_code == 0, result.output
    printed = [" ".join(line.split()) for line in result.output.splitlines()]
    for line in shown.strip().splitlines():
        assert " ".join(line.split()) in printed, f"{line!r} is no longer printed by: {command}"


def _json(*args: str) -> dict:
    import json

    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.mark.slow
def test_diloco_table_is_current() -> None:
    base = ["compile", "llama3-8b", "--backend", "h100-sxm", "--tp", "8", "--dp", "16", "--global-batch", "256"]
    slow = ["--slow-link-gbps", "1.25", "--slow-link-latency-ms", "50"]
    # tp 8 eager stands for Megatron-Core's DDP: no PyTorch DDP bucket copies in the step (echosim/passes/plugin.py)
    table = {"sync": (7.53e9, 3.119, 52.71), "diloco": (15.06e6, 3.016, 3.115),
             "streaming-diloco": (15.06e6, 3.016, 3.100), "gossip": (4.016e9, 3.105, 28.82)}  # fmt: skip
    for strategy, (wire, fast_step, slow_step) in table.items():
        fast = _json(*base, "--dp-strategy", strategy)["dp_strategy"]
        over = _json(*base, "--dp-strategy", strategy, *slow)["dp_strategy"]
        assert fast["wire_bytes_per_step"] == pytest.approx(wire, rel=2e-3)
        assert fast["step_s"] == pytest.approx(fast_step, rel=2e-3)
        assert over["step_s"] == pytest.approx(slow_step, rel=2e-3)


@pytest.mark.slow
def test_goodput_and_straggler_tables_are_current() -> None:
    base = ["compile", "llama3-405b", "--backend", "h100-sxm", "--tp", "8", "--pp", "16", "--dp", "128",
            "--global-batch", "2048", "--seq-len", "8192", "--framework", "megatron", "--zero", "1",
            "--recompute", "full"]  # fmt: skip
    for minutes, shown in ((0, 0.978), (5, 0.951), (10, 0.924), (15, 0.898), (20, 0.871), (30, 0.818)):
        g = _json(*base, "--mtbf-hours", "50677", "--restart-minutes", str(minutes))["goodput"]
        assert g["goodput"] == pytest.approx(shown, abs=6e-4)
    growth = _json(*base, "--straggler-cv", "0.05")["stragglers"]["growth"]
    shown = {"8": 1.071, "64": 1.117, "512": 1.152, "1024": 1.162, "4096": 1.181, "16384": 1.199}
    assert {k: round(v, 3) for k, v in growth.items()} == shown
