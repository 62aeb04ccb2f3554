"""``echosim validate``: predictions against published measurements (microbenchmarks, training steps).

Registered through ``register_commands`` like any plugin's commands. The command parses,
runs :mod:`echosim.validation` and prints its tables or JSON; every user error ends as
one line and exit status 1.
"""

from __future__ import annotations

import json
from typing import Any

import click

from echosim.errors import one_line_errors
from echosim.plugins import hookimpl

_guarded = one_line_errors(ValueError)  # user errors and argument checks end as one line


@click.command("validate")
@click.option("--microbench", type=click.Path(dir_okay=False), help="A file shaped like microbench.csv.")
@click.option("--cases", type=click.Path(dir_okay=False), help="A file shaped like cases.csv.")
@click.option(
    "--memory",
    type=click.Path(dir_okay=False),
    help="Published measured peak memory per device: cases.csv's columns plus measured_gib and measured_kind "
    "(benchmarks/data/memory_cases.csv).",
)
@click.option(
    "--filter",
    "filters",
    multiple=True,
    help="--cases rows to keep: COLUMN=VALUE or COLUMN!=VALUE, shell wildcards allowed, any column or 'feature' "
    "(repeatable: the same column twice means either value, different columns must all match).",
)
@click.option("--calibration", help="--cases: use this calibration (echosim calibrate) on the backends it covers.")
@click.option("--rows", "show_rows", is_flag=True, help="Also print every row (by default only the per-group errors).")
@click.option("--groups-only", is_flag=True, hidden=True)  # the default since --rows; kept so old scripts run
@click.option("--json", "as_json", is_flag=True, help="Print rows and groups as JSON.")
@_guarded
def validate(
    microbench: str | None,
    cases: str | None,
    memory: str | None,
    filters: tuple[str, ...],
    calibration: str | None,
    show_rows: bool,
    groups_only: bool,
    as_json: bool,
) -> None:
    """Compare predictions with published measurements: microbenchmarks and/or training steps.

    Prints the error per group, the targets and why rows were skipped; --rows adds every row,
    --json writes all of it. Progress goes to stderr.
    """
    groups_only = not show_rows
    if not microbench and not cases and not memory:
        raise click.UsageError("give --microbench FILE, --cases FILE and/or --memory FILE")
    out: dict[str, Any] = {}
    if microbench:
        from echosim.validation.microbench import validate_microbench

        out["microbench"] = validate_microbench(microbench).as_dict()
    if cases:
        out["cases"] = _validate_cases(cases, filters, calibration or "", quiet=as_json)
    if memory:
        from echosim.validation.memory import validate_memory

        out["memory"] = validate_memory(memory)
    if as_json:
        click.echo(json.dumps(out if len(out) > 1 else next(iter(out.values())), indent=2, sort_keys=True))
        return
    from echosim.validation.tables import print_cases, print_microbench

    if "microbench" in out:
        print_microbench(out["microbench"], groups_only)
    if "cases" in out:
        print_cases(out["cases"], groups_only)
    if "memory" in out:
        from echosim.validation.memory import print_memory

        print_memory(out["memory"])


def _validate_cases(path: str, filters: tuple[str, ...], calibration: str, quiet: bool) -> dict[str, Any]:
    """Compile the selected rows, showing progress on stderr."""
    from echosim.terminal import progress
    from echosim.validation.run import selected_count, validate_cases

    with progress("compiling cases", selected_count(path, filters), quiet=quiet) as advance:
        result = validate_cases(path, filters, progress=advance, calibration=calibration)
    return result.as_dict()


@hookimpl
def register_commands(cli: click.Group) -> None:
    cli.add_command(validate)
