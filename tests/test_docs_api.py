"""docs/api.md: the public names exist, import lazily, and every example runs with the figures shown."""

from __future__ import annotations

import doctest
import subprocess
import sys
from pathlib import Path

import echosim

DOC = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def test_the_examples_in_docs_api_run() -> None:
    result = doctest.testfile(str(DOC), module_relative=False, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 10 and result.failed == 0


def test_every_public_name_resolves_and_is_documented() -> None:
    assert set(echosim.__all__) == {*echosim._API, "__version__"}
    text = DOC.read_text()
    for name in echosim.__all__:
        if name.startswith("__"):
            continue
        assert getattr(echosim, name) is not None
        assert f"`{name}" in text, f"docs/api.md does not mention {name}"


def test_importing_echosim_imports_nothing_heavy() -> None:
    heavy = "('torch', 'networkx', 'onnx', 'echosim.compiler')"
    code = f"import sys, echosim; print(sorted(m for m in {heavy} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
