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


def load_check(relative: str) -> ModuleType:
    """A fresh copy of one of the checks on published runs ``cases.csv`` lacks (``benchmarks/*_rows.py``): they
    import ``newer_rows`` from ``benchmarks/``, put on the path here."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    path = Path(relative)
    return load_script(relative, f"{path.stem}_under_test")


def rebuilt(module: ModuleType, cases: Path, tmp_path: Path) -> str:
    """The CSV a check's builder writes now (its ``build(cases)``), to compare with the committed one."""
    from newer_rows import write_rows  # benchmarks/, on the path once load_check has run

    out = tmp_path / "rows.csv"
    write_rows(module.build(cases), out, tmp_path, ())
    return out.read_text()


def check_mape(path: Path, rows: int, limit: float) -> None:
    """Every row of a check's CSV compiles, and their MAPE stays under ``limit`` (what its notes quote, rounded up)."""
    import statistics

    from echosim.validation.run import validate_cases

    errors = [r.error for r in validate_cases(path).rows if r.error is not None]
    assert len(errors) == rows
    assert statistics.mean(abs(e) for e in errors) < limit
