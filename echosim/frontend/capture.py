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

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from echosim.errors import EchosimError, PluginError
from echosim.frontend import cache
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
        with _one_line(model):
            return capture_object(registry.model(model)(), spec, model)
    entry = _frontend_for(model, registry)
    key = _file_key(model, entry, spec)
    cached = cache.lookup(key) if key else None
    if cached is not None:
        return cached
    before = set(sys.modules)
    with _one_line(model):
        graph, messages, params = capture_object(entry.value(model), spec, model)
    if key:
        cache.store(key, graph, messages, params, cache.imported_files(before))
    return graph, messages, params


@contextlib.contextmanager
def _one_line(model: str) -> Iterator[None]:
    """A model no rule foresaw (a torch size overflow, a model file raising any ``BaseException``
    but Ctrl-C) must still end in one line, not a traceback."""
    try:
        yield
    except EchosimError:
        raise
    except BaseException as exc:
        if type(exc) is KeyboardInterrupt or isinstance(exc, GeneratorExit):
            raise
        message = " ".join(str(exc).split())[:300]
        raise EchosimError(f"{model}: could not be converted ({type(exc).__name__}: {message})") from None


#: echosim's own file frontends: (the file that defines a source, the libraries its capture depends on)
_FILE_FRONTENDS: dict[str, tuple[Callable[[str], Path], tuple[str, ...]]] = {
    "hf:": (lambda source: _hf_config(source), ("torch", "transformers")),
    ".onnx": (lambda source: Path(source).expanduser(), ("onnx", "numpy")),
    ".py": (lambda source: _py_file(source), ("torch",)),
}


def _py_file(source: str) -> Path:
    """The file of ``path.py:factory``; a source without its factory names itself (the loader says what is wrong)."""
    match = PY_SOURCE.match(source)
    return Path(match.group("path") if match else source).expanduser()


def _hf_config(source: str) -> Path:
    from echosim.frontend.hf import config_path

    return config_path(source)


def _file_key(model: str, entry: Any, spec: CaptureSpec) -> str | None:
    """The cache key of a source read by one of echosim's file frontends; ``None`` for other frontends."""
    known = _FILE_FRONTENDS.get(entry.name)
    if known is None or not entry.owner.startswith("echosim."):
        return None
    defining, libraries = known
    path = defining(model)
    if not path.is_file():
        return None  # the loader says what is wrong
    try:
        digest = cache.file_digest(path)
    except OSError:
        return None
    return cache.key_of({"frontend": entry.name, "source": model, "sha256": digest}, spec, libraries)


def _frontend_for(model: str, registry: Any) -> Any:
    match = PY_SOURCE.match(model)
    key = match.group("path") if match else model
    try:
        return registry.frontend_entry(key)
    except PluginError:
        from echosim.plugins.manager import close_names

        frontends = ", ".join(sorted(registry.frontends)) or "none"
        close = close_names(model, registry.models)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise EchosimError(
            f"unknown model {model!r}: not a registered name{hint} (see `echosim models`) and no frontend "
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

    Passes never modify the graph they are given (they copy), so sharing it is safe. Across
    runs the capture cache serves it (:mod:`echosim.frontend.cache`).
    """
    key = cache.key_of({"zoo": asdict(cfg), "name": name}, spec, ("torch",))
    cached = cache.lookup(key)
    if cached is not None:
        graph, messages, params = cached
        return graph, tuple(messages), params
    graph, warnings, params = _capture_arch_now(cfg, spec, name)
    cache.store(key, graph, list(warnings), params)
    return graph, warnings, params


def _capture_arch_now(cfg: ArchConfig, spec: CaptureSpec, name: str) -> tuple[Graph, tuple[str, ...], int]:
    import torch

    from echosim.frontend.fx import capture_module
    from echosim.frontend.zoo_modules import build_module
    from echosim.ir.types import DType

    # Two layers are all the fold needs to prove the block repeats, and the zoo knows its depth:
    # building the rest only to cut it off again would cost more than the capture.
    # A moe model's dense first layers (DeepSeek) stay as they are: one more MoE layer than dense
    # ones makes the MoE layers the longest run, the one that folds to their count.
    # Interleaved MoE layers (Llama 4 Maverick) repeat as a block of moe_layer_step layers (dense ones,
    # then the MoE one): two blocks prove the repeat, as two layers do.
    # A model built whole (no more MoE layers than dense ones: then the dense run may be the longer, the
    # one the fold picks) folds its longest run to that run's own count.
    dense = cfg.dense_layers if cfg.arch == "moe" else 0
    step = cfg.layers_per_block
    built = min(cfg.layers, 2 * dense + 1 if dense else 2 * step)
    module = build_module(cfg.with_(layers=built))
    depth = (cfg.layers - dense) // step if built < cfg.layers else 0
    ids = torch.zeros(spec.micro_batch, cfg.seq_len, dtype=torch.long, device="meta")
    try:
        # fp8 / mxfp8 / nvfp4 / int8: 16-bit activations, the linear layers' GEMMs quantise their operands
        dtype = DType.BF16 if spec.dtype in ("fp8", "mxfp8", "nvfp4", "int8") else DType.parse(spec.dtype)
        cap = capture_module(module, (ids, ids), dtype=dtype, name=name, depth=depth)
    except CaptureError as exc:
        raise EchosimError(f"{name}: {exc}") from None
    return cap.graph, tuple(cap.warnings), cap.graph.param_count()


def _check_model(cfg: ArchConfig) -> None:
    """A zoo entry that cannot be built (layout rules live in :mod:`echosim.layout`)."""
    if cfg.arch == "moe" and not (getattr(cfg, "experts", 0) >= 1 and getattr(cfg, "top_k", 0) >= 1):
        raise EchosimError(f"a moe model needs routed experts and top_k >= 1 (got {cfg.experts} and {cfg.top_k})")
    step = cfg.moe_layer_step
    if step < 1:
        raise EchosimError(f"moe_layer_step must be >= 1 (got {step})")
    if cfg.arch == "moe" and step > 1 and (cfg.dense_layers or cfg.layers % step):
        raise EchosimError(
            f"interleaved MoE layers (moe_layer_step {step}) need layers divisible by the step and no "
            f"dense first layers (got {cfg.layers} layers, {cfg.dense_layers} dense)"
        )
    if cfg.sliding_window < 0 or cfg.global_layer_step < 0:
        raise EchosimError(
            f"sliding_window and global_layer_step must be >= 0 (got {cfg.sliding_window}, {cfg.global_layer_step})"
        )
    if cfg.sliding_window and (cfg.arch == "gpt" or cfg.mla):
        raise EchosimError("sliding-window attention is built for llama-style (GQA) attention only")
    block = cfg.layers_per_block
    if block > 1 and (cfg.layers % block or (cfg.arch == "moe" and cfg.dense_layers)):
        raise EchosimError(
            f"interleaved layers repeat as blocks of {block} (moe_layer_step {cfg.moe_layer_step}, "
            f"global_layer_step {cfg.global_layer_step}): layers must be divisible by it and no dense first "
            f"layers (got {cfg.layers} layers, {cfg.dense_layers} dense)"
        )
