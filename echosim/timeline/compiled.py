"""The compiled loops of the ``echosim[fast]`` extra (numba): whether they are wanted, and loading one of their modules.

Each compiled module (:mod:`echosim.timeline._jit`, the schedule timer's; :mod:`echosim.timeline._jit_unit`, the unit
simulation's) has an uncompiled path with the same numbers to the bit, so a module that cannot load leaves that path,
never an error. Imported by ``import echosim``; numba itself only by :func:`load`.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def wanted() -> bool:
    """False where ``ECHOSIM_JIT=0`` asks for the uncompiled paths (the tests' oracle: the same numbers, slower)."""
    return os.environ.get("ECHOSIM_JIT", "") != "0"


def load(module: str) -> ModuleType | None:
    """``module`` imported, or None: numba is not installed (ImportError), or it found no writable cache directory
    for ``cache=True`` (RuntimeError at decoration, numba/core/caching.py). Callers keep what it returns
    (``functools.cache``): numba's import is paid once a process."""
    try:
        return importlib.import_module(module)
    except (ImportError, RuntimeError):
        return None
