"""``echosim calibrate``: measure this machine, fit the backend, store the calibration.

Registered through ``register_commands`` (a built-in plugin module). The command parses,
calls :func:`echosim.calibrate.run.run_calibration` and prints what was fitted; every
user error is one line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from echosim.errors import one_line_errors
from echosim.plugins import hookimpl

_guarded = one_line_errors(ValueError)  # user errors and argument checks end as one line


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
@click.option(
    "--check",
    "check",
    metavar="NAME",
    help="Time the machine-speed probe now against the one calibration NAME stored, say how far the machine's "
    "speed has drifted since, and exit (predictions are never rescaled by it).",
)
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
    check: str | None,
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
    if check:
        _check(path, check, backend, as_json)
        return
    if no_bench and not profile:
        raise click.UsageError("--no-bench needs --from-profile TRACE")
    name = name or f"{platform.node() or 'machine'}-{backend}".lower().replace("#", "-").replace("@", "-")
    dtypes = dtypes or ("fp32",)
    from echosim.calibrate.run import backend_spec

    kind = "cpu" if hasattr(backend_spec(backend), "ddr_GBps") else "gpu"
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
    from echosim.calibrate.run import progress_total, run_calibration
    from echosim.terminal import console, progress

    err = console(stderr=True)
    echo = None if quiet else (lambda text: err.print(text))
    total = 0 if no_bench else progress_total(sweep, kind, ranks, dtypes)
    with progress("calibrating", total, quiet=quiet) as advance:

        def step(what: str) -> None:
            advance(description=what)

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


def _check(path: Path, name: str, backend: str, as_json: bool) -> None:
    from echosim.calibrate.probe import PARTS, check_calibration

    result = check_calibration(f"{path}#{name}", backend)
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    click.echo(f"machine-speed probe now against calibration {result['name']!r} ({backend}):")
    for part in PARTS:
        then, now = result["then"][part], result["now"][part]
        click.echo(f"  {part:<10}{then * 1e3:>9.2f} ms then {now * 1e3:>9.2f} ms now  {result['drift'][part]:+.1%}")
    if result["warning"]:
        click.echo(f"warning: {result['warning']}", err=True)


def _list(path: Path, as_json: bool) -> None:
    from echosim.calibrate.store import CalibrationStore

    if not path.exists():  # nothing calibrated yet: `calibrate` without --list creates the file
        if as_json:
            click.echo("[]")
        else:
            click.echo(f"{path}: no calibrations yet (`echosim calibrate` writes them here)")
        return
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
