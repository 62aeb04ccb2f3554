"""``echosim calibrate``: measure this machine, fit the backend, store the calibration.

Registered through ``register_commands`` (a built-in plugin module). The command parses,
calls :func:`run_calibration` and prints what was fitted; every user error is one line.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from echosim.errors import one_line_errors
from echosim.plugins import hookimpl

_guarded = one_line_errors(ValueError)  # user errors and argument checks end as one line


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
    from echosim.backends.calibration import CalibrationError
    from echosim.backends.device_names import backend_for_device
    from echosim.calibrate import bench, fit
    from echosim.calibrate.store import CalibrationStore, measurement_key

    say = echo or (lambda _: None)
    base = _spec(backend)
    if base is None:
        raise CalibrationError(f"backend {backend!r} has no spec to calibrate")
    kind = "cpu" if hasattr(base, "ddr_GBps") else "gpu" if hasattr(base, "hbm_stream_GBps") else ""
    if kind == "":
        raise CalibrationError(f"backend {backend!r} cannot be calibrated on this machine (cpu or gpu backends only)")
    samples: list[bench.Sample] = []
    measurements = []
    if not skip_benchmarks:
        if kind == "cpu":
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


def _spec(backend: str) -> Any:
    from echosim.backends.loading import load_backend
    from echosim.calibrate import spec_of

    inner = load_backend(backend).inner
    return spec_of(getattr(inner, "inner", inner))


def _progress_total(sweep: str, kind: str, ranks: int, dtypes: tuple[str, ...]) -> int:
    from echosim.calibrate import bench

    total = len(bench.MATMUL_SWEEPS[sweep]) * (len(dtypes) if kind == "cpu" else 1)
    total += len(bench.MEMORY_SWEEPS[sweep]) * (7 if kind == "cpu" else 3) + 1
    total += len(bench.ATTENTION_SWEEPS[sweep]) if kind == "cpu" else 0
    if ranks > 1:
        total += len(bench.COLLECTIVE_SWEEPS[sweep]) * 3
    return total


@click.command("calibrate")
@click.option("--backend", default="cpu-x86", show_default=True, help="Backend whose parameters to fit.")
@click.option("--name", help="Calibration name (default: HOSTNAME-BACKEND).")
@click.option(
    "--db",
    type=click.Path(dir_okay=False),
    help="Database file (default: $ECHOSIM_CALIBRATION or ~/.local/share/echosim/calibration.sqlite).",
)
@click.option("--sweep", type=click.Choice(["tiny", "quick", "standard"]), default="standard", show_default=True)
@click.option(
    "--threads", type=click.IntRange(1, 1024), default=1, show_default=True, help="Intra-op threads per rank (CPU)."
)
@click.option(
    "--ranks",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Ranks that will share this machine: compute is measured with that many processes at once, "
    "collectives between them.",
)
@click.option(
    "--dtype", "dtypes", multiple=True, type=click.Choice(["fp32", "bf16"]), help="Matmul dtypes (CPU; default fp32)."
)
@click.option(
    "--from-profile", "profile", type=click.Path(dir_okay=False), help="Import kernel times from a Kineto trace."
)
@click.option("--no-bench", is_flag=True, help="Only import --from-profile; run no microbenchmark.")
@click.option("--list", "list_", is_flag=True, help="List the calibrations in the database and exit.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@_guarded
def calibrate(
    backend: str,
    name: str | None,
    db: str | None,
    sweep: str,
    threads: int,
    ranks: int,
    dtypes: tuple[str, ...],
    profile: str | None,
    no_bench: bool,
    list_: bool,
    as_json: bool,
) -> None:
    """Measure this machine with torch, fit BACKEND's efficiency parameters and store them.

    Use the result with `echosim compile MODEL --calibration NAME`.
    """
    import platform

    from echosim.calibrate.store import default_path

    path = Path(db) if db else default_path()
    if list_:
        _list(path, as_json)
        return
    if no_bench and not profile:
        raise click.UsageError("--no-bench needs --from-profile TRACE")
    name = name or f"{platform.node() or 'machine'}-{backend}".lower().replace("#", "-").replace("@", "-")
    dtypes = dtypes or ("fp32",)
    kind = "cpu" if hasattr(_spec(backend), "ddr_GBps") else "gpu"
    result = _run_with_progress(backend, name, path, sweep, ranks, threads, dtypes, profile, no_bench, kind, as_json)
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    _print_result(result)


def _run_with_progress(
    backend: str,
    name: str,
    path: Path,
    sweep: str,
    ranks: int,
    threads: int,
    dtypes: tuple[str, ...],
    profile: str | None,
    no_bench: bool,
    kind: str,
    quiet: bool,
) -> dict[str, Any]:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    echo = None if quiet else (lambda text: console.print(text))
    total = 0 if no_bench else _progress_total(sweep, kind, ranks, dtypes)
    with Progress(
        TextColumn("{task.description:<34}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal or quiet,
    ) as bar:
        task = bar.add_task("calibrating", total=total)

        def step(what: str) -> None:
            bar.update(task, advance=1, description=what[:34])

        return run_calibration(backend, name, path, sweep, ranks, threads, dtypes, profile, step, echo, no_bench)


def _print_result(r: dict[str, Any]) -> None:
    click.echo(f"calibration {r['name']!r} for backend {r['backend']} written to {r['database']}")
    m = r["machine"]
    click.echo(f"machine: {m['cpu_model']}, {m['usable_cores']} core(s), torch {m['torch']}, {m['hostname']}")
    click.echo(f"{len(r['fitted'])} fitted constant(s):")
    for key, v in r["fitted"].items():
        click.echo(f"  {key:<30}{v['value']:>12.5g}  {v['what']}")
    if r["derived"]:
        click.echo(f"{len(r['derived'])} derived from the machine (not fitted):")
        for key, v in r["derived"].items():
            click.echo(f"  {key:<30}{v['value']:>12.5g}  {v['note']}")
    from echosim.calibrate.fit import FITTED_COLLECTIVES

    for kind, q in r["fit_quality"].items():
        used = not kind.startswith("collective") or kind.split()[-1] in FITTED_COLLECTIVES
        kind = kind if used else f"{kind} (not used in the fit)"
        click.echo(
            f"fit on {q['samples']:3d} {kind} sample(s): mean error {100 * q['mape']:.1f}%, worst {100 * q['max']:.1f}%"
        )
    if r["measured_kernels"]:
        click.echo(f"{r['measured_kernels']} measured kernel(s) stored; they take precedence for their exact shapes")
    click.echo(f"use it: echosim compile MODEL --backend {r['backend']} --calibration {r['name']}")


def _list(path: Path, as_json: bool) -> None:
    from echosim.calibrate.store import CalibrationStore

    store = CalibrationStore(path)
    try:
        cals = [store.load(n) for n in store.names()]
    finally:
        store.close()
    if as_json:
        click.echo(json.dumps([c.as_dict() for c in cals], indent=2, sort_keys=True))
        return
    if not cals:
        click.echo(f"{path}: no calibrations")
    for c in cals:
        for b in c.backends:
            m = c.machine[b]
            where = f"[{m.get('cpu_model', '?')}, {m.get('hostname', '?')}]"
            click.echo(
                f"{c.name:<28} {b:<12} {c.created[b]}  {len(c.parameters[b])} parameter(s), "
                f"{c.measured.get(b, 0)} kernel(s)  {where}"
            )


@hookimpl
def register_commands(cli: click.Group) -> None:
    cli.add_command(calibrate)
