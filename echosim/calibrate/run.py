"""What ``echosim calibrate`` does, callable from Python: benchmark, fit, store.

:func:`run_calibration` microbenchmarks this machine with torch (:mod:`~echosim.calibrate.bench`),
fits the backend's efficiency parameters to the samples (:mod:`~echosim.calibrate.fit`),
optionally imports a profiler trace (:mod:`~echosim.calibrate.profile`) and stores the
result under a name with the machine's identity (:mod:`~echosim.calibrate.store`). The
command (:mod:`echosim.commands.calibrate`) only parses options and prints.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def run_calibration(
    backend: str,
    name: str,
    db: Path,
    sweep: str = "standard",
    ranks: int = 1,
    threads: int = 1,
    dtypes: tuple[str, ...] = ("fp32",),
    profile: str | None = None,
    progress: Callable[[str], None] | None = None,
    echo: Callable[[str], None] | None = None,
    skip_benchmarks: bool = False,
) -> dict[str, Any]:
    """Benchmark, fit and store calibration ``name`` for ``backend``; returns what was stored."""
    from echosim.backends.device_names import backend_for_device
    from echosim.calibrate import bench, fit
    from echosim.calibrate.db import CalibrationError
    from echosim.calibrate.store import CalibrationStore, measurement_key

    say = echo or (lambda _: None)
    base = backend_spec(backend)
    if base is None:
        raise CalibrationError(f"backend {backend!r} has no spec to calibrate")
    kind = "cpu" if hasattr(base, "ddr_GBps") else "gpu" if hasattr(base, "hbm_stream_GBps") else ""
    if kind == "":
        raise CalibrationError(f"backend {backend!r} cannot be calibrated on this machine (cpu or gpu backends only)")
    samples: list[bench.Sample] = []
    measurements = []
    probe: dict[str, Any] | None = None
    if not skip_benchmarks:
        if kind == "cpu":
            from echosim.calibrate.probe import run_probe

            probe = run_probe(threads=threads)  # the speed as the benchmarks start and end, on their threads (--check)
            say(f"benchmarking this CPU ({sweep} sweep, {threads} thread(s) per rank)")
            if ranks > 1:
                say(f"  with {ranks} ranks computing at once (they share the machine's caches and memory)")
                samples += bench.bench_cpu_ranks(sweep, dtypes, threads, ranks, progress)
            else:
                samples += bench.bench_cpu(sweep, dtypes, threads, progress)
            if ranks > 1:
                say(f"benchmarking gloo collectives between {ranks} local processes")
                samples += bench.bench_collectives(sweep, ranks, "gloo", progress)
        else:
            import torch

            if not torch.cuda.is_available():
                raise CalibrationError(f"backend {backend!r} is a GPU and this machine has no CUDA device")
            found = backend_for_device(torch.cuda.get_device_name(0))
            if found != backend:
                raise CalibrationError(
                    f"this machine's GPU is {torch.cuda.get_device_name(0)!r} (backend {found!r}), not {backend!r}"
                )
            say(f"benchmarking {torch.cuda.get_device_name(0)} ({sweep} sweep)")
            samples += bench.bench_gpu(sweep, progress)
            if ranks > 1 and torch.cuda.device_count() >= ranks:
                samples += bench.bench_collectives(sweep, ranks, "nccl", progress)
    if probe is not None:
        from echosim.calibrate.probe import bracket, run_probe

        probe = bracket(probe, run_probe(threads=threads))
    derived: dict[str, tuple[float, str]] = {}
    fitted_spec = base
    knobs: list[fit.Knob] = []
    if samples:
        if kind == "cpu":
            fitted_spec, derived = fit.fit_cpu(base, samples, threads, ranks)
            knobs = fit.fitted_knobs(fit.CPU_KNOBS, samples)
            predict = fit.predict_cpu
        else:
            fitted_spec = fit.fit_gpu(base, samples)
            knobs = fit.fitted_knobs(fit.GPU_KNOBS, samples)
            predict = fit.predict_gpu
        quality = fit.quality(fitted_spec, samples, predict)
    else:
        quality = {}
    params: dict[str, tuple[float, str]] = {k.name: (getattr(fitted_spec, k.name), k.what) for k in knobs}
    for field_name, (value, note) in derived.items():
        params[field_name] = (value, f"derived, not fitted: {note}")
    if profile:
        from echosim.calibrate.profile import import_profile

        rows, counts = import_profile(profile, measurement_key(name, backend))
        measurements += rows
        say(
            f"imported {counts['kernels']} matmul shape(s) from {profile} ({counts['imported_ops']} ops; "
            f"{counts['skipped_ops']} other ops not imported)"
        )
    if not params and not measurements:
        raise CalibrationError("nothing to store: no benchmark ran and no profile was imported")
    machine = fit.machine_identity(threads, ranks)
    if probe is not None:
        machine["probe"] = probe
    source = f"echosim calibrate --sweep {sweep}" + (f" --from-profile {Path(profile).name}" if profile else "")
    store = CalibrationStore(db, create=True)
    try:
        store.save(name, backend, machine, params, source, measurements)
    finally:
        store.close()
    return {
        "name": name,
        "backend": backend,
        "database": str(db),
        "machine": machine,
        "fitted": {k.name: {"value": getattr(fitted_spec, k.name), "what": k.what} for k in knobs},
        "derived": {f: {"value": v, "note": n} for f, (v, n) in derived.items()},
        "fit_quality": quality,
        "samples": [s.as_dict() for s in samples],
        "measured_kernels": len(measurements),
    }


def backend_spec(backend: str) -> Any:
    """The spec dataclass of registered backend ``backend`` (``None`` if it exposes none)."""
    from echosim.backends.loading import load_backend
    from echosim.calibrate import spec_of

    return spec_of(load_backend(backend).inner)


def progress_total(sweep: str, kind: str, ranks: int, dtypes: tuple[str, ...]) -> int:
    """How many progress steps :func:`run_calibration` reports for this sweep (for a progress bar)."""
    from echosim.calibrate import bench

    total = len(bench.MATMUL_SWEEPS[sweep]) * (len(dtypes) if kind == "cpu" else 1)
    total += len(bench.MEMORY_SWEEPS[sweep]) * (8 if kind == "cpu" else 3) + 1
    cpu_only = bench.ATTENTION_SWEEPS, bench.FRESH_SWEEPS, bench.BAG_SWEEPS
    total += sum(len(sweeps[sweep]) for sweeps in cpu_only) + 1 if kind == "cpu" else 0  # + the autograd chain
    if kind == "cpu":  # bench_cpu runs its sweep in rounds
        total *= 1 if sweep == "tiny" else bench.ROUNDS
    if ranks > 1:
        total += len(bench.COLLECTIVE_SWEEPS[sweep]) * 3
    return total
