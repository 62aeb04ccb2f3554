"""Load one of the repository's scripts (``benchmarks/*.py``, ``scripts/*.py``) as a module, so that tests can
call its functions: the scripts are not a package and are run as files."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative: str, name: str | None = None) -> ModuleType:
    """The script at ``ROOT / relative``, executed once per call, registered in ``sys.modules`` under ``name``
    (default: the file's stem) unless a module of that name is there already: dataclasses and pickling look
    their module up by name."""
    path = ROOT / relative
    name = name or path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, f"cannot load {path}"
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module
