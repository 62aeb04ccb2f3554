"""The README's set-up is two commands, .ci/run runs the second exactly, and its figures come from the program."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _bash_blocks(section: str) -> list[str]:
    body = README.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", body, re.S)]


def test_the_set_up_is_two_commands_and_ci_runs_the_second_exactly() -> None:
    install, test = _bash_blocks("Install and run")
    assert "\n" not in install and "pip install -e ." in install and install.endswith("echosim compile")
    assert _bash_blocks("Test") == [test] and "\n" not in test
    assert test == "pip install -r requirements-test.txt && python -m pytest -n 2"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert test in ci and "python3 -m venv .venv-ci" in ci
    assert {"ruff check .", "ruff format --check .", "lint-imports"} <= set(ci)


def test_the_test_requirements_hold_every_example_plugin() -> None:
    lines = (ROOT / "requirements-test.txt").read_text(encoding="utf-8").splitlines()
    examples = {f"-e ./{p.parent.relative_to(ROOT)}" for p in (ROOT / "examples").glob("*/pyproject.toml")}
    assert examples and examples <= set(lines)
    assert "-e .[test,hf,onnx-export,ray,fast]" in lines


def test_the_readme_shows_what_echosim_compile_prints() -> None:
    spec = importlib.util.spec_from_file_location("gen_readme_outputs", ROOT / "scripts" / "gen_readme_outputs.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.render(README) == README, "README.md is out of date: run python scripts/gen_readme_outputs.py"
    assert "memory per device (GiB)" in README.split(module.BEGIN, 1)[1].split(module.END, 1)[0]
