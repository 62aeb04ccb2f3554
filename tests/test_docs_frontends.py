"""docs/frontends.md covers every built-in frontend, shipped config and example it points to."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from echosim.frontend import hf
from echosim.plugins import load_registry

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "frontends.md").read_text()


def test_every_builtin_frontend_is_documented() -> None:
    keys = [k for k, e in load_registry(include_entrypoints=False).frontends.items() if e.owner.startswith("echosim")]
    assert sorted(keys) == [".onnx", ".py", "hf:"]
    for key in keys:
        assert f"`{key}" in DOC or f"{key}`" in DOC or f"`path/to/model{key}" in DOC, key


@pytest.mark.parametrize("name", hf.shipped())
def test_every_shipped_config_is_in_the_table(name: str) -> None:
    assert f"| `{name}` |" in DOC


def test_the_doc_says_python_files_are_executed() -> None:
    assert "**The file is executed**" in DOC


def test_linked_files_exist() -> None:
    for link in re.findall(r"\]\((\.\./[^)#]+)\)", DOC):
        assert (ROOT / "docs" / link).resolve().exists(), link
