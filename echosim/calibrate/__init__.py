"""Calibration: measure the machine, fit a backend's efficiency parameters, and use them.

``echosim calibrate`` (:func:`~echosim.calibrate.run.run_calibration`) microbenchmarks
matmuls over a shape sweep, memory-bound kernels and collectives with torch on the
machine it runs on (:mod:`~echosim.calibrate.bench`), fits the backend's efficiency
parameters to them (:mod:`~echosim.calibrate.fit`) and stores both under a name with the
machine's identity (:mod:`~echosim.calibrate.store`, in the SQLite file of
:mod:`~echosim.calibrate.db`); ``--from-profile`` imports a PyTorch profiler trace
(:mod:`~echosim.calibrate.profile`).

Using a calibration is always an explicit call on a loaded backend, never a side effect
of loading it: :func:`apply_calibration` (what ``Cluster(calibration=...)``, ``echosim
compile --calibration`` and ``echosim cost --calibration`` do) and :func:`apply_measurements`
(a database's measured rows alone). Measured rows answer first; the analytic model, with any fitted
parameters, answers the rest.

Only the parameters a backend's spec dataclass names can be set (``gemm_eff_fp32``,
``hbm_stream_GBps``, ...), plus ``overlap.<field>`` for its :class:`OverlapModel`; the
spec's own validation rejects impossible values.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass, replace
from pathlib import Path
from typing import Any

from echosim.backends.loading import GuardedBackend
from echosim.calibrate.db import CLAMPED, CalibratedBackend, CalibrationDB, CalibrationError
from echosim.calibrate.store import Calibration, is_database, load_calibration, measurement_key, resolve

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
    """The backends calibration ``ref`` changes (see :func:`apply_calibration`)."""
    cal = load_calibration(ref)
    covered = set(cal.backends)
    if is_database(ref):  # and those with measured rows under their own name
        covered |= {key for key in _database_backends(cal.path) if "@" not in key}
    return covered


def _database_backends(path: Path) -> list[str]:
    db = CalibrationDB(path)
    try:
        return db.backends()
    finally:
        db.close()


def apply_calibration(guarded: GuardedBackend, ref: str) -> GuardedBackend:
    """``guarded`` (from :func:`~echosim.backends.loading.load_backend`) rebuilt with calibration ``ref``.

    * ``""``: the backend unchanged.
    * ``NAME`` (in the default database) or ``PATH#NAME``: that calibration's fitted
      parameters, its measured kernels answering first; an error if it was not made for
      this backend.
    * ``PATH``, a whole database file (``$ECHOSIM_CALIBRATION`` on the command line): the
      rows measured under the backend's own name answer first, then the file's most recent
      calibration if it was made for this backend. Calibrations of other backends in the
      same file do not apply, and are not an error.
    """
    if not ref:
        return guarded
    cal = load_calibration(ref)
    whole_database = is_database(ref)
    name = guarded.name
    backend = guarded.inner
    warnings: tuple[str, ...] = ()
    if name in cal.parameters:
        warnings = tuple(clamped_parameters(backend, cal.parameters[name], cal.name, name))
        backend = with_parameters(backend, cal.parameters[name], name)
        if cal.measured.get(name):
            backend = CalibratedBackend(backend, CalibrationDB(cal.path), measurement_key(cal.name, name))
            backend.name = name
    elif not whole_database:
        raise CalibrationError(
            f"calibration {cal.name!r} was made for backend(s) {', '.join(cal.backends)}, not {name!r}"
        )
    if whole_database:
        db = CalibrationDB(cal.path)
        if db.table(name):
            backend = CalibratedBackend(backend, db, name)
        else:
            db.close()
    return GuardedBackend(backend, name, guarded.owner, warnings)


def clamped_parameters(backend: Any, params: dict[str, float], calibration: str, name: str) -> list[str]:
    """A fitted parameter at the bound of its search (``echosim.calibrate.fit``'s knobs): the
    measurements asked for a value past it (a GEMM faster than the peak, a bandwidth above the
    datasheet), so the fit was clamped and the model no longer matches them."""
    from echosim.calibrate.fit import CPU_KNOBS, GPU_KNOBS

    spec = spec_of(backend)
    knobs = {k.name: (k.lo, k.hi) for k in (*CPU_KNOBS, *GPU_KNOBS)}
    if spec is not None and hasattr(spec, "hbm_GBps") and "hbm_stream_GBps" in knobs:
        knobs["hbm_stream_GBps"] = (knobs["hbm_stream_GBps"][0], spec.hbm_GBps)  # fit_gpu's bound
    out = []
    for param, value in sorted(params.items()):
        if param not in knobs or spec is None or not hasattr(spec, param):
            continue
        lo, hi = knobs[param]
        for bound, side in ((lo, "lower"), (hi, "upper")):
            if abs(value - bound) <= 1e-3 * (hi - lo):
                out.append(
                    f"{CLAMPED} for backend {name!r}: {calibration!r} fitted {param} = {value:.6g} at the "
                    f"{side} bound of its search ({lo:g}..{hi:g}); the measurements asked for a value past it"
                )
    return out


def calibration_warnings(guarded: Any) -> list[str]:
    """What applying a calibration found (clamped parameters) and what costing with it did
    (ops outside the measured sizes); ``--strict`` makes each an error."""
    inner = getattr(guarded, "inner", None)
    found = list(getattr(guarded, "warnings", ()))
    if isinstance(inner, CalibratedBackend):
        found += inner.extrapolations()
    return found


def apply_measurements(guarded: GuardedBackend, path: str | Path) -> GuardedBackend:
    """``guarded`` with the rows measured under its own name in database ``path`` answering first.

    Only measured times: fitted parameters stay as they are.
    """
    if not Path(path).is_file():
        raise CalibrationError(f"calibration database {path}: no such file")
    backend = CalibratedBackend(guarded.inner, CalibrationDB(path), guarded.name)
    return GuardedBackend(backend, guarded.name, guarded.owner)


__all__ = [
    "Calibration",
    "CalibrationError",
    "apply_calibration",
    "apply_measurements",
    "calibration_warnings",
    "clamped_parameters",
    "covered_backends",
    "load_calibration",
    "resolve",
    "spec_of",
    "with_parameters",
]
