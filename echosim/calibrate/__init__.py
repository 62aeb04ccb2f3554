"""Calibration: measure the machine, fit a backend's efficiency parameters, and use them.

``echosim calibrate`` (:func:`~echosim.calibrate.run.run_calibration`) microbenchmarks matmuls over a
shape sweep, memory-bound kernels and collectives with torch on the machine it runs on
(:mod:`~echosim.calibrate.bench`), fits the backend's efficiency parameters to them
(:mod:`~echosim.calibrate.fit`) and stores both under a name with the machine's identity
(:mod:`~echosim.calibrate.store`); ``--from-profile`` imports a PyTorch profiler trace
(:mod:`~echosim.calibrate.profile`). ``echosim compile --calibration NAME`` (and
``Cluster(calibration=NAME)``) builds the backend with those parameters and answers the
measured kernels from the table.

Only the parameters a backend's spec dataclass names can be set (``gemm_eff_fp32``,
``hbm_stream_GBps``, ...), plus ``overlap.<field>`` for its :class:`OverlapModel`; the
spec's own validation rejects impossible values.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass, replace
from typing import Any

from echosim.backends.calibration import CalibratedBackend, CalibrationError
from echosim.calibrate.store import Calibration, load_calibration, measurement_key, resolve

#: The attribute under which each built-in backend class keeps its spec dataclass.
SPEC_ATTRIBUTES = ("device", "cpu", "chip")


def spec_of(backend: Any) -> Any:
    """The spec dataclass of a built-in-style backend (``.device``, ``.cpu`` or ``.chip``)."""
    for attr in SPEC_ATTRIBUTES:
        spec = getattr(backend, attr, None)
        if spec is not None and is_dataclass(spec):
            return spec
    return None


def with_parameters(backend: Any, params: dict[str, float], name: str = "") -> Any:
    """A new backend of the same class with spec fields (and ``overlap.*`` fields) replaced."""
    from echosim.backends.base import OverlapModel

    spec = spec_of(backend)
    who = f"backend {name or getattr(backend, 'name', '?')!r}"
    if spec is None:
        raise CalibrationError(f"{who} exposes no spec dataclass (.device, .cpu or .chip) to calibrate")
    spec_fields = {f.name: f for f in fields(spec)}
    overlap_fields = {f.name for f in fields(OverlapModel)}
    changes: dict[str, Any] = {}
    overlap_changes: dict[str, float] = {}
    for param, value in params.items():
        if param.startswith("overlap."):
            key = param.removeprefix("overlap.")
            if key not in overlap_fields:
                raise CalibrationError(f"{who}: unknown parameter {param!r}")
            overlap_changes[key] = value
            continue
        if param not in spec_fields or param in ("name", "source"):
            raise CalibrationError(f"{who}: unknown parameter {param!r} (not a field of {type(spec).__name__})")
        current = getattr(spec, param)
        changes[param] = round(value) if isinstance(current, int) and not isinstance(current, bool) else value
    try:
        new_spec = replace(spec, **changes) if changes else spec
        overlap = backend.overlap()
        if overlap_changes:
            overlap = replace(overlap, **overlap_changes)
        extra = {"allow_tf32": backend.allow_tf32} if hasattr(backend, "allow_tf32") else {}
        return type(backend)(new_spec, overlap, **extra)
    except (ValueError, TypeError) as exc:
        raise CalibrationError(f"{who}: calibrated parameters rejected: {exc}") from None


def covered_backends(ref: str) -> set[str]:
    """The backends calibration ``ref`` holds parameters for."""
    return set(load_calibration(ref).backends)


def apply_calibration(guarded: Any, ref: str) -> Any:
    """``guarded`` (a :class:`~echosim.backends.loading.GuardedBackend`) rebuilt with calibration ``ref``."""
    from echosim.backends.calibration import CalibrationDB
    from echosim.backends.loading import GuardedBackend

    cal = load_calibration(ref)
    backend_name = guarded.name
    if backend_name not in cal.parameters:
        raise CalibrationError(
            f"calibration {cal.name!r} was made for backend(s) {', '.join(cal.backends)}, not {backend_name!r}"
        )
    inner = guarded.inner
    env_wrapper = inner if isinstance(inner, CalibratedBackend) else None
    base = env_wrapper.inner if env_wrapper is not None else inner
    rebuilt = with_parameters(base, cal.parameters[backend_name], backend_name)
    if env_wrapper is not None:  # keep ECHOSIM_CALIBRATION's measured rows in front
        rebuilt = CalibratedBackend(rebuilt, env_wrapper.db, backend_name)
    if cal.measured.get(backend_name):
        key = measurement_key(cal.name, backend_name)
        rebuilt = CalibratedBackend(rebuilt, CalibrationDB(cal.path), key)
        rebuilt.name = backend_name
    return GuardedBackend(rebuilt, backend_name, guarded.owner)


__all__ = [
    "Calibration",
    "CalibrationError",
    "apply_calibration",
    "covered_backends",
    "load_calibration",
    "resolve",
    "spec_of",
    "with_parameters",
]
