"""echosim: simulate one distributed training step from the model itself.

The public API (docs/api.md)::

    from echosim import Cluster, Plan, compile, lower, load_model, search

Importing the package is cheap: each name is imported on first use, and torch, onnx and
plugins load only when a model is captured or a registry is built.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: public name -> the module that defines it
_API = {
    "compile": "echosim.compiler",
    "lower": "echosim.compiler",
    "load_model": "echosim.compiler",
    "Compiled": "echosim.compiler",
    "search": "echosim.layout_search",
    "Plan": "echosim.plan",
    "Cluster": "echosim.plan",
    "Report": "echosim.timeline.report",
    "CostedGraph": "echosim.timeline.costed",
    "EchosimError": "echosim.errors",
    "hookimpl": "echosim.plugins",
}

__all__ = [
    "Cluster",
    "Compiled",
    "CostedGraph",
    "EchosimError",
    "Plan",
    "Report",
    "__version__",
    "compile",
    "hookimpl",
    "load_model",
    "lower",
    "search",
]

if TYPE_CHECKING:
    from echosim.compiler import Compiled, compile, load_model, lower
    from echosim.errors import EchosimError
    from echosim.layout_search import search
    from echosim.plan import Cluster, Plan
    from echosim.plugins import hookimpl
    from echosim.timeline.costed import CostedGraph
    from echosim.timeline.report import Report


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'echosim' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
