"""Build a registered backend so that a plugin that breaks is reported by name.

``registry.backend(name)`` returns the plugin's factory; :func:`load_backend` calls it,
checks that the object follows :class:`~echosim.backends.base.Backend`, and wraps it so
that an exception raised later inside one of its methods ends as one line naming the
backend and its plugin (:class:`BackendError`) instead of a traceback. Other backends
are untouched by one plugin's failure: nothing here is shared between loads.

Loading does nothing else: no environment variable is read and no calibration is
applied here. A caller that wants measured times or fitted parameters passes the
loaded backend to :func:`echosim.calibrate.apply_calibration` explicitly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from echosim.backends.base import DEFAULT_NODE_DEVICES, OverlapModel, Placement
from echosim.errors import EchosimError
from echosim.ir.graph import Node
from echosim.ir.ops import OpKind

METHODS = ("op_time_s", "collective_time_s", "overlap", "memory_bytes", "peak_flops")


class BackendError(EchosimError):
    """A backend that cannot be built, breaks its contract, or raises while costing."""


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class GuardedBackend:
    """Forwards to a plugin's backend; its exceptions become :class:`BackendError` naming the plugin."""

    def __init__(self, inner: Any, name: str, owner: str, warnings: tuple[str, ...] = ()) -> None:
        self.inner = inner
        self.name = name
        self.owner = owner
        self.warnings = warnings  # what building it found worth saying (a clamped calibrated parameter)

    def __repr__(self) -> str:
        return f"GuardedBackend({self.inner!r})"

    def _fail(self, method: str, exc: BaseException) -> BackendError:
        if type(exc) is KeyboardInterrupt or isinstance(exc, EchosimError):
            raise exc
        return BackendError(f"backend '{self.name}' (plugin '{self.owner}') failed in {method}: {_one_line(exc)}")

    def _optional(self, method: str, default: Any, convert: Callable[[Any], Any], *args: Any) -> Any:
        """``convert(inner.method(*args))`` for a method a plugin may leave out (``default`` then); any
        failure, in the call or the conversion, names the backend and its plugin."""
        call = getattr(self.inner, method, None)
        if not callable(call):
            return default
        try:
            return convert(call(*args))
        except BaseException as exc:  # a plugin may raise anything (SystemExit too)
            raise self._fail(method, exc) from None

    def _checked(self, method: str, value: Any, what: str, positive: bool = False) -> float:
        """A number a report can use: finite and >= 0 (> 0 for ``positive``), else one line naming the plugin."""
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            number = math.nan
        if not math.isfinite(number) or number < 0 or (positive and number == 0):
            raise BackendError(
                f"backend '{self.name}' (plugin '{self.owner}'): {method} returned {value!r} for {what}; "
                f"it must be a finite number {'> 0' if positive else '>= 0'}"
            )
        return number

    def op_time_s(self, node: Node, io_bytes: int) -> float:
        try:
            value = self.inner.op_time_s(node, io_bytes)
        except EchosimError:
            raise
        except BaseException as exc:  # a plugin may raise anything (SystemExit too)
            raise self._fail("op_time_s", exc) from None
        return self._checked("op_time_s", value, f"{node.op.value} {node.name!r}")

    def collective_time_s(self, kind: OpKind, nbytes: int, placement: Placement) -> float:
        try:
            value = self.inner.collective_time_s(kind, nbytes, placement)
        except EchosimError:
            raise
        except BaseException as exc:  # a plugin may raise anything (SystemExit too)
            raise self._fail("collective_time_s", exc) from None
        return self._checked("collective_time_s", value, f"{kind.value} of {nbytes} bytes")

    def for_program(self, graph: Any) -> GuardedBackend:
        """The wrapped backend's variant for one rank's program (:func:`~echosim.backends.base.for_program`),
        guarded the same way; this object when the variant is the wrapped backend itself."""
        inner = self._optional("for_program", self.inner, _same, graph)
        if inner is self.inner:
            return self
        known = self.__dict__.setdefault("_programs", {})
        if id(inner) not in known:
            guarded = GuardedBackend(inner, self.name, self.owner, self.warnings)
            known[id(inner)] = (inner, guarded)  # the variant kept alive with its key
        return known[id(inner)][1]

    def supports_dtype(self, dtype: str) -> bool:
        """Optional for a plugin: without ``supports_dtype`` every dtype is accepted."""
        return self._optional("supports_dtype", True, bool, dtype)

    def overlap(self) -> OverlapModel:
        try:
            model = self.inner.overlap()
        except BaseException as exc:  # a plugin may raise anything (SystemExit too)
            raise self._fail("overlap", exc) from None
        if not isinstance(model, OverlapModel):
            raise BackendError(
                f"backend '{self.name}' (plugin '{self.owner}'): overlap() must return an OverlapModel, "
                f"got {type(model).__name__}"
            )
        return model

    def memory_bytes(self) -> int:
        try:
            value = self.inner.memory_bytes()
        except BaseException as exc:  # a plugin may raise anything (SystemExit too)
            raise self._fail("memory_bytes", exc) from None
        return int(self._checked("memory_bytes", value, "the device", positive=True))

    def peak_flops(self, dtype: str) -> float:
        try:
            value = self.inner.peak_flops(dtype)
        except BaseException as exc:  # a plugin may raise anything (SystemExit too)
            raise self._fail("peak_flops", exc) from None
        return self._checked("peak_flops", value, dtype, positive=True)

    @property
    def static_buffers(self) -> bool:
        """Whether the device's compiler assigns every buffer ahead of time (XLA); optional for a plugin."""
        return getattr(self.inner, "static_buffers", False) is True

    @property
    def caching_allocator(self) -> bool:
        """Whether tensors take PyTorch's CUDA caching allocator's rounded blocks; optional (default: unless
        the buffers are static)."""
        return getattr(self.inner, "caching_allocator", not self.static_buffers) is True

    @property
    def fused_dropout(self) -> bool:
        """Whether dropout keeps a 1-byte mask (a fused kernel) rather than one in the input's dtype; optional."""
        return getattr(self.inner, "fused_dropout", True) is True

    def peak_bandwidth_Bps(self, path: str) -> float | None:
        """Datasheet bytes/s of ``memory`` or ``links`` per device; optional for a plugin (``None``:
        the bandwidth invariant is not checked for it)."""
        value = self._optional("peak_bandwidth_Bps", None, _same, path)
        return None if value is None else self._checked("peak_bandwidth_Bps", value, path, positive=True)

    def formats(self) -> tuple[str, ...]:
        """Block-scaled formats (mxfp8, nvfp4) the device runs; optional for a plugin (none without it)."""
        return self._optional("formats", (), lambda found: tuple(str(f) for f in found))

    def node_devices(self, devices: int) -> int:
        """Devices of one node (NVLink domain, rack, TPU slice) a job of ``devices`` gets by default.

        Optional for a plugin: without ``node_devices`` a node holds 8 devices (an HGX/DGX node).
        """
        value = self._optional("node_devices", DEFAULT_NODE_DEVICES, _same, devices)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BackendError(
                f"backend '{self.name}' (plugin '{self.owner}'): node_devices() must return a positive int, "
                f"got {value!r}"
            )
        return value

    def describe(self) -> dict[str, Any]:
        return self._optional("describe", {}, dict)


def _same(value: Any) -> Any:
    return value


def build_backend(name: str, factory: Any, owner: str) -> GuardedBackend:
    """Call ``factory`` and check the result; any failure names the backend and its plugin."""
    try:
        backend = factory()
    except EchosimError as exc:
        raise BackendError(f"backend '{name}' (plugin '{owner}') could not be built: {exc}") from None
    except Exception as exc:
        raise BackendError(f"backend '{name}' (plugin '{owner}') could not be built: {_one_line(exc)}") from None
    missing = [m for m in METHODS if not callable(getattr(backend, m, None))]
    if missing:
        raise BackendError(
            f"backend '{name}' (plugin '{owner}') is missing method(s) {', '.join(missing)} "
            "(see echosim.backends.base.Backend)"
        )
    return GuardedBackend(backend, name, owner)


def load_backend(name: str, registry: Any = None) -> GuardedBackend:
    """The backend registered as ``name`` (in ``registry``, default: the loaded plugins), built and guarded.

    Unknown names raise :class:`~echosim.errors.PluginError` listing the known ones.
    """
    if registry is None:
        from echosim.plugins import get_registry

        registry = get_registry()
    entry = registry.backends.get(name)
    if entry is None:
        registry.backend(name)  # raises PluginError listing the known backends
    return build_backend(name, entry.value, entry.owner)
