"""``echosim check``: the documented schema, one-line config errors with their line, every result printed,
results cached by content, ``--changed-only``, the baseline and its tolerance, and the pre-commit hook."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import echosim.check as check_module
from echosim.check import key_types
from echosim.cli import cli

ROOT = Path(__file__).resolve().parents[1]
TINY = 'model = "gpt3-125m"\nseq_len = 128\n'
# A .py model whose width is a constant: the pre-commit test widens it past its budget.
MLP = """
import torch
import torch.nn.functional as F
from torch import nn

WIDTH = {width}


class MLP(nn.Module):
    seq_len = 64

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(1000, WIDTH)
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, 1000)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        h = h + self.down(F.gelu(self.up(h)))
        return F.cross_entropy(self.head(h).flatten(0, 1), targets.flatten())


def model() -> nn.Module:
    return MLP()
"""


def _write(tmp_path: Path, body: str, head: str = 'backend = "h100-sxm"\n') -> str:
    path = tmp_path / "pyproject.toml"
    path.write_text(f"[tool.echosim]\n{head}\n{body}", encoding="utf-8")
    return str(path)


def _run(*args: str) -> tuple[int, str]:
    out = CliRunner().invoke(cli, ["check", *args])
    return out.exit_code, out.output


def _toml_in(text: str) -> str:
    """The first TOML block of a docstring (indented) or of markdown (fenced)."""
    fenced = re.search(r"```toml\n(.*?)```", text, re.S)
    if fenced:
        return fenced.group(1)
    block = re.search(r"::\n\n((?:    .*\n|\n)+)", text)
    assert block
    return "\n".join(line[4:] for line in block.group(1).splitlines()) + "\n"


def test_the_docstring_example_is_the_documented_one_and_passes(tmp_path: Path) -> None:
    example = _toml_in(check_module.__doc__ or "")
    assert example.strip() == _toml_in((ROOT / "docs" / "check.md").read_text(encoding="utf-8")).strip()
    (tmp_path / "pyproject.toml").write_text(example, encoding="utf-8")
    code, out = _run("--config", str(tmp_path / "pyproject.toml"), "--no-cache")
    assert code == 0, out
    assert re.fullmatch(r"llama3-8b: [\d.]+ s, [\d.]+ GiB, MFU [\d.]+% - ok\n", out)


def test_every_key_is_documented_in_the_docs_and_in_help() -> None:
    doc = (ROOT / "docs" / "check.md").read_text(encoding="utf-8")
    code, help_text = _run("--help")
    assert code == 0
    for key in [*key_types(), "baseline", "tolerance"]:
        assert f"`{key}`" in doc, key
        assert re.search(rf"\b{key}\b", help_text), key
    assert "additional_dependencies" in doc and "transformers" in doc


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('[[tool.echosim.check]]\nmodel = "gpt3-125m"\nmax_step_time = 3\n',
         "pyproject.toml:6: [[tool.echosim.check]] #1: unknown key 'max_step_time' (did you mean 'max_step_time_s'?)"),
        ('[[tool.echosim.check]]\nmodel = "gpt3-125m"\n\n[[tool.echosim.check]]\nmodel = "gpt3-125m"\nname = "b"\n'
         'tp = "2"\n', "pyproject.toml:10: [[tool.echosim.check]] #2 tp: expected an integer, got '2'"),
        ('[[tool.echosim.check]]\ntp = 2\n', "pyproject.toml:4: [[tool.echosim.check]] #1: "
         "'model' (or 'from', a framework config) is required"),
        ('[[tool.echosim.check]]\nmodel = "gpt3-125m"\nsp = 1\n',
         "pyproject.toml:6: [[tool.echosim.check]] #1 sp: expected true or false, got 1"),
        ('[[tool.echosim.check]]\nmodel = "gpt3-125m"\n\n[[tool.echosim.check]]\nmodel = "gpt3-125m"\n',
         "pyproject.toml:8: [[tool.echosim.check]] #2: a second entry named 'gpt3-125m'"),
    ],
)  # fmt: skip
def test_a_bad_key_is_one_line_naming_the_key_and_its_line(tmp_path: Path, body: str, message: str) -> None:
    code, out = _run("--config", _write(tmp_path, body))
    assert code == 1
    assert len(out.strip().splitlines()) == 1 and message in out, out


def test_a_bad_section_key_names_its_line(tmp_path: Path) -> None:
    entry = f"[[tool.echosim.check]]\n{TINY}"
    code, out = _run("--config", _write(tmp_path, entry, head='backend = "h100-sxm"\nbakend = 1\n'))
    assert code == 1 and "pyproject.toml:3: [tool.echosim]: unknown key 'bakend'" in out
    code, out = _run("--config", _write(tmp_path, f"[[tool.echosim.check]]\n{TINY}", head="tolerance = -1\n"))
    assert code == 1 and "pyproject.toml:2: [tool.echosim] tolerance: must be 0 or more" in out


def test_every_result_is_printed_when_one_entry_errors(tmp_path: Path) -> None:
    body = (f'[[tool.echosim.check]]\nname = "a"\n{TINY}max_step_time_s = 100\n\n'
            '[[tool.echosim.check]]\nmodel = "no-such-model"\n\n'
            f'[[tool.echosim.check]]\nname = "c"\n{TINY}max_step_time_s = 0.000001\n')  # fmt: skip
    code, out = _run("--config", _write(tmp_path, body), "--no-cache")
    lines = out.strip().splitlines()
    assert code == 1 and len(lines) == 3, out  # an error outranks a broken budget
    assert lines[0].startswith("a: ") and lines[0].endswith("- ok")
    assert lines[1].startswith("no-such-model: ERROR: unknown model 'no-such-model'")
    assert lines[2].startswith("c: ") and "FAIL: step time" in lines[2]


def test_results_are_cached_by_the_content_of_their_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ECHOSIM_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "model.py").write_text(MLP.format(width=64), encoding="utf-8")
    config = _write(tmp_path, '[[tool.echosim.check]]\nmodel = "model.py:model"\ndevices = 1\n')
    code, first = _run("--config", config)
    assert code == 0 and "(cached)" not in first, first

    def no_compile(*args: object) -> None:
        raise AssertionError("a cached result compiled again")

    monkeypatch.setattr(check_module, "run_check", no_compile)
    code, again = _run("--config", config)
    assert code == 0 and again == first.replace(" - ok", " (cached) - ok")
    monkeypatch.undo()
    monkeypatch.setenv("ECHOSIM_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "model.py").write_text(MLP.format(width=128), encoding="utf-8")
    code, changed = _run("--config", config)
    assert code == 0 and "(cached)" not in changed and changed != first


def test_changed_only_runs_the_entries_whose_files_changed(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text(MLP.format(width=64), encoding="utf-8")
    (tmp_path / "layers.py").write_text("", encoding="utf-8")
    body = ('[[tool.echosim.check]]\nname = "mlp"\nmodel = "model.py:model"\ndevices = 1\nfiles = ["layers.py"]\n\n'
            f'[[tool.echosim.check]]\nname = "zoo"\n{TINY}')  # fmt: skip
    config = _write(tmp_path, body)
    for changed, ran in (
        ([str(tmp_path / "model.py")], {"mlp"}),
        (["layers.py"], {"mlp"}),  # a relative path, as pre-commit passes them, matching a `files` glob
        ([str(tmp_path / "README.md")], set()),
        ([config], {"mlp", "zoo"}),
    ):
        cwd = os.getcwd()
        os.chdir(tmp_path)
        try:
            code, out = _run("--config", config, "--changed-only", *changed)
        finally:
            os.chdir(cwd)
        assert code == 0, out
        skipped = {line.split(":")[0] for line in out.splitlines() if "not run (none of its files changed)" in line}
        assert {"mlp", "zoo"} - skipped == ran, out
    code, out = _run("--config", config, "model.py")
    assert code == 2 and "FILES are read only with --changed-only" in out


def test_a_baseline_fails_a_regression_beyond_its_tolerance(tmp_path: Path) -> None:
    config = _write(tmp_path, f"[[tool.echosim.check]]\n{TINY}", head='backend = "h100-sxm"\ntolerance = 0.1\n')
    code, out = _run("--config", config, "--update-baseline")
    assert code == 0 and out.strip().endswith(f"baseline written to {tmp_path / 'echosim-baseline.json'}")
    path = tmp_path / "echosim-baseline.json"
    written = json.loads(path.read_text(encoding="utf-8"))
    figures = written["entries"]["gpt3-125m"]
    assert set(figures) == {"model", "step_time_s", "memory_gib", "mfu"}
    assert _run("--config", config)[0] == 0  # the same figures: no regression

    figures["step_time_s"] *= 1 / 1.05  # now 5% slower than the baseline: within 10%
    path.write_text(json.dumps(written), encoding="utf-8")
    assert _run("--config", config)[0] == 0
    figures["step_time_s"] *= 1.05 / 1.25  # now 25% slower
    figures["mfu"] *= 1.5  # and MFU a third under the baseline
    path.write_text(json.dumps(written), encoding="utf-8")
    code, out = _run("--config", config)
    assert code == 3, out
    assert re.search(r"step time [\d.]+ m?s is 25\.0% over the baseline [\d.]+ m?s \(tolerance 10%\)", out)
    assert re.search(r"MFU [\d.]+ is 33\.3% under the baseline", out)
    path.write_text("{not json", encoding="utf-8")
    code, out = _run("--config", config)
    assert code == 1 and "not an echosim baseline" in out and "--update-baseline" in out


def test_a_missing_library_under_pre_commit_names_additional_dependencies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from echosim.errors import EchosimError

    def missing(*args: object) -> None:
        raise EchosimError("the hf: frontend needs transformers, which is not installed: pip install 'echosim[hf]'")

    monkeypatch.setattr(check_module, "run_check", missing)
    monkeypatch.setenv("PRE_COMMIT", "1")
    code, out = _run("--config", _write(tmp_path, '[[tool.echosim.check]]\nmodel = "hf:config.json"\n'), "--no-cache")
    assert code == 1 and "additional_dependencies" in out


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_pre_commit_try_repo(tmp_path: Path) -> None:
    """The hook of .pre-commit-hooks.yaml, run by pre-commit itself: passes, fails when the model is widened past
    its budget (naming the budget), passes again when narrowed.

    The hook's environment is pre-commit's own virtualenv with this checkout installed into it; pip installs no
    dependency (PIP_NO_DEPS) and finds torch and the rest through PYTHONPATH, so nothing is downloaded.
    """
    pytest.importorskip("pre_commit")
    import site

    repo = tmp_path / "project"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    (repo / "model.py").write_text(MLP.format(width=64), encoding="utf-8")
    (repo / "pyproject.toml").write_text(
        '[tool.echosim]\nbackend = "h100-sxm"\n\n[[tool.echosim.check]]\nname = "mlp"\nmodel = "model.py:model"\n'
        "devices = 1\nmax_step_time_s = 0.0005\n",
        encoding="utf-8",
    )
    subprocess.run([*git, "add", "."], cwd=repo, check=True)
    source = tmp_path / "echosim-src"  # the checkout as it is now, committed (try-repo reads a git repository)
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", ".venv*", "__pycache__", "*.egg-info", "build"))
    subprocess.run([*git, "init", "-q"], cwd=source, check=True)
    subprocess.run([*git, "add", "-A"], cwd=source, check=True)
    subprocess.run([*git, "commit", "-qm", "snapshot"], cwd=source, check=True)
    paths = [*site.getsitepackages(), str(ROOT)]
    env = {
        **os.environ,
        "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"),
        "PIP_NO_DEPS": "1",
        "PIP_NO_BUILD_ISOLATION": "0",  # pip reads this one inverted: 0 turns build isolation off
        "PIP_NO_INDEX": "1",
        "PYTHONPATH": os.pathsep.join(p for p in paths if p != str(ROOT)),
        "ECHOSIM_CACHE_DIR": str(tmp_path / "cache"),
    }

    def try_repo() -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "pre_commit", "try-repo", str(source), "echosim-check", "--all-files"]
        command.append("--verbose")  # the hook's output even when it passes
        return subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=900)

    def hook_output(run: subprocess.CompletedProcess[str]) -> str:
        text = run.stdout[run.stdout.index("echosim budgets") :]  # after try-repo's config and install lines
        print(f"--- exit {run.returncode}\n{text}")  # shown by pytest -s (the closing note quotes it)
        return text

    first = try_repo()
    assert first.returncode == 0, first.stdout + first.stderr
    hook_output(first)
    assert re.search(r"mlp: [\d.]+ ms|mlp: [\d.]+ s", first.stdout) and "- ok" in first.stdout
    (repo / "model.py").write_text(MLP.format(width=2048), encoding="utf-8")
    wide = try_repo()
    assert wide.returncode != 0, wide.stdout
    failed = hook_output(wide)
    assert "Failed" in failed and "exit code: 3" in failed
    assert "FAIL: step time" in failed and "> max_step_time_s = 0.0005" in failed
    (repo / "model.py").write_text(MLP.format(width=64), encoding="utf-8")
    again = try_repo()
    assert again.returncode == 0, again.stdout + again.stderr
    hook_output(again)


def test_an_offload_the_hosts_cannot_hold_fails(tmp_path: Path) -> None:
    """A layout that fits the device but whose hosts cannot hold its offloaded state does not run: it fails the
    check with the host's line, as one that does not fit the device does."""
    from echosim.cli import NOT_MET

    body = ('[[tool.echosim.check]]\nmodel = "llama3-70b"\ndevices = 8\nzero = 3\noffload_optimizer = true\n'
            'offload_params = true\nglobal_batch = 8\nseq_len = 4096\nrecompute = "full"\n'
            'grad_dtype = "bf16"\n')  # fmt: skip
    code, out = _run("--config", _write(tmp_path, body, 'backend = "a100-40gb"\n'), "--no-cache")
    assert code == NOT_MET and "FAIL: offload: each host needs about 1,183 GiB" in out, out
    assert "does not fit" not in out  # the device holds it (31.7 GiB of 40)


def test_a_memory_failure_of_a_model_that_checkpoints_its_own_blocks_says_so(tmp_path: Path) -> None:
    """The check costs every activation kept unless the entry asks for recompute; a model whose forward
    checkpoints its blocks in code does not keep them, so its memory failure names the recompute to set."""
    (tmp_path / "net.py").write_text(
        MLP.format(width=256)
        .replace("from torch import nn", "from torch import nn\nfrom torch.utils.checkpoint import checkpoint")
        .replace("h = h + self.down(F.gelu(self.up(h)))", "h = h + checkpoint(self.mlp, h, use_reentrant=False)")
        .replace(
            "    def forward(",
            "    def mlp(self, h):\n        return self.down(F.gelu(self.up(h)))\n\n    def forward(",
        )
    )
    entry = '[[tool.echosim.check]]\nmodel = "net.py:model"\nmax_memory_gib = 0.0001\n'
    code, out = _run("--config", _write(tmp_path, entry))
    assert code != 0 and 'checkpoints its own blocks with torch.utils.checkpoint: recompute = "full"' in out, out
    code, out = _run("--config", _write(tmp_path, entry + 'recompute = "full"\n'))
    assert code != 0 and "FAIL: memory" in out and "checkpoints its own blocks" not in out, out
