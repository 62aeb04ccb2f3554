"""MODEL string -> loader -> IR graph: how a model given by name, source or object is captured.

Resolution order: a registered model name; then a registered frontend by scheme
(``hf:``) or file suffix (``.onnx``, and ``.py`` for ``path.py:factory``). A
loader returns something :func:`capture_object` can capture for a
:class:`~echosim.frontend.spec.CaptureSpec` (micro-batch, sequence, dtype):

* an object with ``capture(spec) -> (graph, messages, params)`` (what echosim's own
  ``hf:``, ``.onnx`` and ``.py`` loaders return),
* an ``nn.Module`` (captured with torch.export, falling back to torch.fx),
* an :class:`~echosim.frontend.zoo.ArchConfig`, or an IR ``Graph``.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from echosim.errors import EchosimError, PluginError
from echosim.frontend.pyfile import PY_SOURCE
from echosim.frontend.spec import CaptureError, CaptureSpec

if TYPE_CHECKING:
    from echosim.frontend.zoo import ArchConfig
    from echosim.ir.graph import Graph


def capture_named(model: str, spec: CaptureSpec) -> tuple[Graph, list[str], int]:
    """Capture a registered model or a frontend source for one micro-batch: (graph, messages, total params)."""
    from echosim.plugins import get_registry

    registry = get_registry()
    if model in registry.models:
        return capture_object(registry.model(model)(), spec, model)
    loader = _frontend_for(model, registry)
    try:
        return capture_object(loader(model), spec, model)
    except EchosimError:
        raise
    except Exception as exc:  # a model no rule foresaw must still end in one line, not a traceback
        message = " ".join(str(exc).split())[:300]
        raise EchosimError(f"{model}: could not be converted ({type(exc).__name__}: {message})") from None


def _frontend_for(model: str, registry: Any) -> Any:
    match = PY_SOURCE.match(model)
    key = match.group("path") if match else model
    try:
        return registry.frontend(key)
    except PluginError:
        frontends = ", ".join(sorted(registry.frontends)) or "none"
        raise EchosimError(
            f"unknown model {model!r}: not a registered name (see `echosim models`) and no frontend "
            f"({frontends}) takes it; use NAME, path.py:factory, hf:config.json or model.onnx"
        ) from None


def capture_object(obj: Any, spec: CaptureSpec, name: str) -> tuple[Graph, list[str], int]:
    """Capture what a loader (or a caller of ``compile``) handed over: (graph, messages, total params)."""
    from echosim.frontend.zoo import ArchConfig
    from echosim.ir.graph import Graph

    capture = getattr(obj, "capture", None)
    if callable(capture) and not isinstance(obj, type):
        return capture(spec)
    if isinstance(obj, Graph):
        return obj, [], obj.param_count()
    if isinstance(obj, ArchConfig):
        return _capture_arch(obj, spec, name)
    import torch

    if isinstance(obj, torch.nn.Module):
        from echosim.frontend.pyfile import capture_torch_module

        return capture_torch_module(obj, None, spec, name)
    raise EchosimError(f"model {name!r}: got {type(obj).__name__}, not an ArchConfig, nn.Module or IR graph")


def _capture_arch(cfg: ArchConfig, spec: CaptureSpec, name: str) -> tuple[Graph, list[str], int]:
    cfg = cfg.with_(seq_len=spec.seq_len or cfg.seq_len)
    _check_model(cfg)
    graph, warnings, params = _capture_arch_cached(cfg, replace(spec, seq_len=cfg.seq_len), name)
    return graph, list(warnings), params


@functools.lru_cache(maxsize=16)
def _capture_arch_cached(cfg: ArchConfig, spec: CaptureSpec, name: str) -> tuple[Graph, tuple[str, ...], int]:
    """One capture per (architecture, micro-batch, dtype): ``search`` compiles many layouts of one model.

    Passes never modify the graph they are given (they copy), so sharing it is safe.
    """
    import torch

    from echosim.frontend.fx import capture_module
    from echosim.frontend.zoo_modules import build_module
    from echosim.ir.types import DType

    # Two layers are all the fold needs to prove the block repeats, and the zoo knows its depth:
    # building the rest only to cut it off again would cost more than the capture.
    module = build_module(cfg.with_(layers=min(cfg.layers, 2)))
    ids = torch.zeros(spec.micro_batch, cfg.seq_len, dtype=torch.long, device="meta")
    try:
        dtype = DType.BF16 if spec.dtype == "fp8" else DType.parse(spec.dtype)  # fp8: 16-bit activations
        cap = capture_module(module, (ids, ids), dtype=dtype, name=name, depth=cfg.layers)
    except CaptureError as exc:
        raise EchosimError(f"{name}: {exc}") from None
    return cap.graph, tuple(cap.warnings), cap.graph.param_count()


def _check_model(cfg: ArchConfig) -> None:
    """A zoo entry that cannot be built (layout rules live in :mod:`echosim.layout`)."""
    if cfg.arch == "moe" and not (getattr(cfg, "experts", 0) >= 1 and getattr(cfg, "top_k", 0) >= 1):
        raise EchosimError(f"a moe model needs routed experts and top_k >= 1 (got {cfg.experts} and {cfg.top_k})")
