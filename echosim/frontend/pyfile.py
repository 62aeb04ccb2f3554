"""``path/to/model.py:factory`` sources: any PyTorch module, built on ``meta``.

The file is executed as Python (as pytest executes a ``conftest.py``): only point
echosim at files you trust. ``factory()`` is called under ``torch.device("meta")``
and returns either

* an ``nn.Module``: it is called with one int64 ``(micro_batch, seq_len)`` tensor
  per required argument of ``forward`` (token ids, and labels if it takes them); or
* ``(module, inputs)`` where ``inputs`` is a tuple of example tensors (used as
  they are), a list of ``(shape, dtype)`` pairs whose shape may name ``"batch"``
  and ``"seq"`` (bound from ``--micro-batch`` and ``--seq-len``), or a callable
  ``inputs(batch, seq)`` returning the tensors.

Without ``--seq-len`` the sequence length is the module's ``seq_len`` attribute if
it has one, else 2048. Capture is ``torch.export`` (see ``aten.py``) with
``torch.fx.symbolic_trace`` as the fallback; a module neither can capture is
reported with the construct that stopped it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import re
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from echosim.errors import EchosimError

if TYPE_CHECKING:
    from torch import nn

    from echosim.frontend.spec import CaptureSpec
    from echosim.ir.graph import Graph

DEFAULT_SEQ = 2048
# "path/to/file.py:factory" (the factory may be dotted: "module_attr.build")
PY_SOURCE = re.compile(r"^(?P<path>.+\.py):(?P<factory>[A-Za-z_][\w.]*)$")


@dataclass
class PyModel:
    """A module built by a factory in a Python file, captured once the micro-batch and dtype are known."""

    source: str
    module: Any
    inputs: Any
    path: str

    def capture(self, spec: CaptureSpec) -> tuple[Graph, list[str], int]:
        return capture_torch_module(self.module, self.inputs, spec, self.source, where=self.path)


def _run_file(path: Path) -> Any:
    name = f"echosim_user_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise EchosimError(f"{path}: not a Python file echosim can load")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise EchosimError(f"{path}:{exc.lineno}: syntax error: {exc.msg}") from None
    except BaseException as exc:  # any exception a model file raises (SystemExit too), but Ctrl-C
        sys.modules.pop(name, None)
        if type(exc) is KeyboardInterrupt or isinstance(exc, EchosimError):
            raise
        raise EchosimError(f"{path} raised {_where(exc, path)}") from None
    return module


def _where(exc: BaseException, path: Path) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == path.resolve()]
    line = f" at line {frames[-1].lineno}" if frames else ""
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}{': ' + message if message else ''}{line}"


def load(source: str) -> PyModel:
    """The ``.py`` frontend loader: run the file, call the factory on ``meta``."""
    import torch

    match = PY_SOURCE.match(source)
    if match is None:
        raise EchosimError(f"{source}: name the factory as path.py:FUNCTION")
    path = Path(match.group("path")).expanduser()
    if not path.is_file():
        raise EchosimError(f"{source}: no such file {str(path)!r}")
    module = _run_file(path)
    factory: Any = module
    for part in match.group("factory").split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise EchosimError(f"{path} defines no {match.group('factory')!r}")
    if not callable(factory):
        raise EchosimError(f"{path}: {match.group('factory')} is a {type(factory).__name__}, not a callable")
    try:
        with torch.device("meta"):
            built = factory()
    except EchosimError:
        raise
    except BaseException as exc:  # any exception a model file raises (SystemExit too), but Ctrl-C
        if type(exc) is KeyboardInterrupt:
            raise
        raise EchosimError(f"{path}: {match.group('factory')}() raised {_where(exc, path)}") from None
    net, inputs = built if isinstance(built, tuple) and len(built) == 2 else (built, None)
    if not isinstance(net, torch.nn.Module):
        raise EchosimError(
            f"{path}: {match.group('factory')}() returned {type(built).__name__}, not an nn.Module "
            "(or a (module, inputs) pair)"
        )
    return PyModel(source, net, inputs, str(path))


def example_inputs(module: nn.Module, inputs: Any, batch: int, seq: int) -> tuple[Any, ...]:
    """Meta tensors to call ``module`` with, from the factory's input description."""
    import torch

    if inputs is None:
        params = inspect.signature(module.forward).parameters.values()
        required = [
            p for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        return tuple(torch.zeros(batch, seq, dtype=torch.long, device="meta") for _ in required or [None])
    if callable(inputs):
        got = inputs(batch, seq)
        return tuple(got) if isinstance(got, (list, tuple)) else (got,)
    out = []
    for item in inputs:
        if isinstance(item, torch.Tensor):
            out.append(item if item.device.type == "meta" else torch.empty_like(item, device="meta"))
            continue
        try:
            shape, dtype = item
            dims = tuple(batch if d == "batch" else seq if d == "seq" else int(d) for d in shape)
        except (TypeError, ValueError):
            raise EchosimError(
                f"input description {item!r} is not a tensor or a (shape, dtype) pair with 'batch'/'seq' dims"
            ) from None
        out.append(torch.zeros(dims, dtype=dtype, device="meta"))
    return tuple(out)


def fixed_batch(inputs: Any, args: tuple[Any, ...]) -> int:
    """Samples the inputs hold whatever ``--micro-batch`` says, or 0 where it binds them: example tensors (used as
    they are) and shapes that name no ``"batch"`` dimension fix the batch at their first input's leading
    dimension, as an ONNX file's fixed batch is its first input's first axis."""
    if inputs is None or callable(inputs):
        return 0
    if any(not hasattr(item, "shape") and "batch" in tuple(item[0]) for item in inputs):
        return 0
    first = args[0] if args else None
    return int(first.shape[0]) if first is not None and getattr(first, "dim", lambda: 0)() >= 1 else 1


@contextlib.contextmanager
def checkpoint_calls(root: nn.Module, seen: list[str]) -> Iterator[None]:
    """Record in ``seen`` the modules the model's forward hands to ``torch.utils.checkpoint`` (either variant), as
    patterns with list indices as ``*`` (``blocks.*``, a method as ``blocks.*.mlp``; ``<function>`` for a function
    no module owns). The call
    itself runs the function: capture traces the forward once either way. Patched at the two functions
    ``checkpoint`` calls at run time, since a model file binds ``checkpoint`` itself when it is imported."""
    import torch.utils.checkpoint as cp
    from torch.nn import Module

    names = {id(m): n for n, m in root.named_modules()}

    def record(fn: Any) -> None:
        owner = fn if isinstance(fn, Module) else getattr(fn, "__self__", None)
        name = names.get(id(owner)) if owner is not None else None
        method = getattr(fn, "__name__", "") if owner is not fn else ""
        if name is not None and method not in ("", "forward"):  # ``blocks.0.mlp``, or the model's own ``mlp``
            name = ".".join(part for part in (name, method) if part)
        seen.append(re.sub(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)", "*", name) if name else "<function>")

    generator, function = cp._checkpoint_without_reentrant_generator, cp.CheckpointFunction

    def without_reentrant(fn: Any, *args: Any, **kwargs: Any) -> Any:
        record(fn)
        return generator(fn, *args, **kwargs)

    class Reentrant:
        @staticmethod
        def apply(fn: Any, _preserve: bool, *args: Any) -> Any:
            record(fn)
            return fn(*args)

    cp._checkpoint_without_reentrant_generator, cp.CheckpointFunction = without_reentrant, Reentrant  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        cp._checkpoint_without_reentrant_generator, cp.CheckpointFunction = generator, function  # type: ignore[misc]


def _uses_seq(inputs: Any) -> bool:
    """Whether the inputs depend on the sequence length (token ids by default, or a 'seq' dim)."""
    if inputs is None or callable(inputs):
        return True
    return any(not hasattr(item, "shape") and "seq" in tuple(item[0]) for item in inputs)


def capture_torch_module(
    module: nn.Module, inputs: Any, spec: CaptureSpec, name: str, where: str = ""
) -> tuple[Graph, list[str], int]:
    """Capture with torch.export (torch.fx as the fallback); returns (graph, messages, params)."""
    from echosim.frontend.aten import capture_export, quiet
    from echosim.frontend.fx import capture_module
    from echosim.frontend.loss import ensure_loss
    from echosim.frontend.messages import Note
    from echosim.frontend.spec import CaptureError
    from echosim.ir.types import DType

    if any(p.device.type != "meta" for p in module.parameters()):
        module = module.to("meta")
    module.train()
    notes: list[str] = []
    seq = spec.seq_len or int(getattr(module, "seq_len", 0) or DEFAULT_SEQ)
    if not spec.seq_len and _uses_seq(inputs):
        notes.append(Note(f"sequence length {seq} (--seq-len overrides)"))
    args = example_inputs(module, inputs, spec.micro_batch, seq)
    dtype = DType.parse(spec.dtype)
    total = sum(p.numel() for p in module.parameters())
    messages: list[str] = []
    graph = None
    checkpointed: list[str] = []
    try:
        with checkpoint_calls(module, checkpointed):
            cap = capture_export(module, module, args, dtype=dtype, name=name, where=where)
        graph, messages = cap.graph, [*cap.warnings, *cap.notes]
    except CaptureError as export_error:
        failure = str(export_error)
    if graph is None:
        try:
            with quiet():
                fx_cap = capture_module(module, args, dtype=dtype, name=name)
        except CaptureError:
            raise EchosimError(f"{name}: {failure}") from None
        graph, messages = fx_cap.graph, [f"{failure}; captured with torch.fx instead", *fx_cap.warnings]
    try:
        ensure_loss(graph, notes)
    except ValueError as exc:
        raise EchosimError(f"{name}: {exc}") from None
    graph.samples = fixed_batch(inputs, args)
    graph.checkpointed = tuple(dict.fromkeys(checkpointed))
    if spec.micro_batch != 1 and graph.samples not in (0, spec.micro_batch):
        notes.append(
            Note(
                f"--micro-batch {spec.micro_batch} does not apply: the inputs fix the batch at {graph.samples} (the "
                "first input's leading dimension); a shape that names 'batch' lets --micro-batch bind it"
            )
        )
    return graph, [*messages, *(Note(n) if not isinstance(n, Note) else n for n in notes)], total
