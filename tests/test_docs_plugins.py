"""docs/plugins.md documents every hook, and its examples are the real, working ones."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from echosim.plugins import hookspecs

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "plugins.md").read_text()
DEMO = ROOT / "examples" / "echosim-plugin-demo"


def hookspec_signatures() -> dict[str, str]:
    """``{hook: "hook(arg, ...)"}`` for every function marked ``@hookspec``."""
    marker = f"{hookspecs.PROJECT_NAME}_spec"
    return {
        name: f"{name}({', '.join(inspect.signature(fn).parameters)})"
        for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
        if hasattr(fn, marker)
    }


def section(heading: str) -> str:
    start = DOC.index(f"\n## {heading}\n")
    end = DOC.find("\n## ", start + 1)
    return DOC[start : end if end != -1 else len(DOC)]


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)


def test_hookspecs_are_found() -> None:
    assert len(hookspec_signatures()) >= 6


@pytest.mark.parametrize("hook", sorted(hookspec_signatures()))
def test_every_hook_has_a_section_with_its_signature(hook: str) -> None:
    signature = hookspec_signatures()[hook]
    assert f"\n## {signature}\n" in DOC, f"docs/plugins.md needs a '## {signature}' section"
    assert "Called once" in section(signature), f"say when {hook} is called"


@pytest.mark.parametrize("hook", sorted(hookspec_signatures()))
def test_every_hook_section_shows_the_register_callback_it_receives(hook: str) -> None:
    spec = getattr(hookspecs, hook)
    [param] = inspect.signature(spec).parameters.values()
    callback = getattr(hookspecs, param.annotation, None)  # a Register* protocol, or click.Group
    if callback is None:
        expected = hook, [param.name]
    else:
        expected = "register", list(inspect.signature(callback.__call__).parameters)[1:]
    shown = ast.parse(code_blocks(section(hookspec_signatures()[hook]), "python")[0]).body[0]
    assert isinstance(shown, ast.FunctionDef)
    assert (shown.name, [arg.arg for arg in shown.args.args + shown.args.kwonlyargs]) == expected


def test_every_documented_hook_exists() -> None:
    documented = re.findall(r"^## (register_\w+)", DOC, flags=re.MULTILINE)
    assert sorted(documented) == sorted(hookspec_signatures())


def test_every_python_example_parses() -> None:
    blocks = code_blocks(DOC, "python")
    assert blocks
    for block in blocks:
        ast.parse(block)


def test_the_example_plugin_module_is_shown_verbatim() -> None:
    assert (DEMO / "echosim_plugin_demo.py").read_text() in DOC


def test_the_entry_point_shown_is_the_example_packages() -> None:
    entry_point = '[project.entry-points.echosim]\ndemo = "echosim_plugin_demo"\n'
    assert entry_point in DOC
    assert entry_point in (DEMO / "pyproject.toml").read_text()


def test_the_testing_example_runs() -> None:
    [block] = code_blocks(section("Testing a plugin"), "python")
    exec(block, {"MyGpuBackend": object, "__name__": "docs_example"})
