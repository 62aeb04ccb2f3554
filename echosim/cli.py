"""The ``echosim`` command line: a thin click layer over the library.

Every user error is an :class:`~echosim.errors.EchosimError` and ends as one line on
stderr with exit status 1; tracebacks are for bugs only.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from echosim.commands.options import (
    framework_option,
    from_options,
    layout_from_config,
    layout_from_options,
    layout_options,
)
from echosim.errors import EchosimError, one_line_errors

_guard = one_line_errors()  # user errors (EchosimError) end as one line and exit status 1
# Exit status (docs/cli.md): 0 done; 1 bad input or a failed run (one line); 2 command-line usage;
# NOT_MET: the run succeeded but what was required of it does not hold (--require-fit, check's budgets).
NOT_MET = 3


class _Commands(click.Group):
    """The core commands, and plugins' commands (``cost``, ``validate``, ...) loaded only when one is asked for.

    ``echosim compile`` never imports a command plugin; ``echosim --help`` and a plugin's
    command load them once (their other registrations wait for the full registry).
    """

    _plugins_added = False

    def _add_plugin_commands(self) -> None:
        if self._plugins_added:
            return
        self._plugins_added = True
        from echosim.plugins import get_command_registry

        registry = get_command_registry()
        registry.add_commands(self)
        _warn(registry.errors)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            self._add_plugin_commands()
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._add_plugin_commands()
        return super().list_commands(ctx)


def _no_plugins(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """Switch installed plugins off before any registry is built (child processes inherit it)."""
    if value:
        import os

        from echosim.plugins import get_registry
        from echosim.plugins.manager import DISABLE_ENV

        os.environ[DISABLE_ENV] = "1"
        get_registry.cache_clear()


@click.group(cls=_Commands)
@click.version_option(package_name="echosim")
@click.option(
    "--no-plugins",
    is_flag=True,
    is_eager=True,
    expose_value=False,
    callback=_no_plugins,
    help="Load no installed plugin, only echosim's own (also: ECHOSIM_DISABLE_PLUGINS=1; "
    "ECHOSIM_PLUGINS=a,b loads only those).",
)
def cli() -> None:
    """Simulate one distributed training step from the model itself."""


@cli.command("compile")
@click.argument("model", required=False)
@layout_options
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--out", type=click.Path(), metavar="FILE", help="Also write the JSON report to this file.")
@click.option("--trace", type=click.Path(), metavar="FILE", help="Write a Chrome/Perfetto trace to this file.")
@click.option(
    "--report",
    "report_path",
    type=click.Path(),
    metavar="FILE",
    help="Write a self-contained HTML report with charts (.html), or the step timeline chart alone (.png); "
    "needs matplotlib (echosim[report]).",
)
@click.option(
    "--graph",
    type=click.Path(),
    metavar="FILE",
    help="Write the costed execution graph (.graphml, or .json node-link); see docs/costed-graph.md.",
)
@from_options
@click.option(
    "--require-fit",
    is_flag=True,
    help=f"Exit with status {NOT_MET} (after the report) when a pipeline stage does not fit in device memory.",
)
@click.option(
    "--strict",
    is_flag=True,
    help="Fail (exit 1) on an impossible figure (MFU above 100%, a negative or non-finite time or memory part) "
    "or an op no rule costs, instead of warning.",
)
@_guard
def compile_cmd(
    model: str | None,
    require_fit: bool,
    as_json: bool,
    strict: bool,
    out: str | None,
    trace: str | None,
    report_path: str | None,
    graph: str | None,
    from_source: str | None,
    from_args: str | None,
    verbose: bool,
    **opts: Any,
) -> None:
    """Simulate one training step of MODEL (default: GPT-3 175B on 1,024 A100-80GB)."""
    from echosim.compiler import lower

    if graph:
        from echosim.timeline.costed import check_graph_path

        check_graph_path(graph)
    if report_path:
        from echosim.explain.html import check_report_path

        check_report_path(report_path)
    for path, option in ((out, "--out"), (trace, "--trace"), (graph, "--graph"), (report_path, "--report")):
        if path:
            _check_writable(path, option)
    typed = click.get_current_context().get_parameter_source("calibration") is ParameterSource.COMMANDLINE
    if from_source or from_args:
        name, plan, cluster = layout_from_config(model, from_source, from_args, opts, typed, verbose)
    else:
        name, plan, cluster = layout_from_options(model, opts, typed)
    compiled = lower(name, plan, cluster)
    report = compiled.report
    if strict:
        from echosim.compiler import strict_failures

        failures = strict_failures(report)
        if failures:
            more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
            raise EchosimError(f"--strict: {failures[0]}{more}")
    if out:
        _write(out, report.to_json(), "--out")
    if trace:
        from echosim.timeline.trace import write_trace

        write_trace(compiled.costed, trace, report.model)
    if graph:
        from echosim.timeline.costed import write_graph

        write_graph(compiled.costed, graph)
    if report_path:
        from echosim.explain.html import write_report

        write_report(compiled, report_path, name, plan, cluster)
    if as_json:
        click.echo(report.to_json(), nl=False)
    else:
        from echosim.summary import render

        render(report, trace)
        if not report.fits:
            _cheapest_fit(name, plan, cluster, report)
    if require_fit and not report.fits:
        from echosim.terminal import does_not_fit

        click.echo(f"Error: --require-fit: {does_not_fit(report)}", err=True)
        sys.exit(NOT_MET)


def _cheapest_fit(model: str, plan: Any, cluster: Any, report: Any) -> None:
    """Name the simulated layout change with the shortest step that makes a layout fit."""
    from echosim.explain.whatif import cheapest_fit

    best = cheapest_fit(model, plan, cluster, report)
    if best is None or best.step_time_s is None:
        click.echo("does not fit, and no single layout change nearby makes it fit (echosim explain lists them)")
        return
    click.echo(
        f"does not fit; the cheapest change that fits (simulated): {best.change}: step "
        f"{best.step_time_s:.4g} s, peak {best.peak_bytes / 2**30:.1f} GiB"
    )


def _check_writable(path: str, option: str) -> None:
    """Refuse an output path that cannot be written before the compile runs rather than after it."""
    target = Path(path)
    if target.is_dir():
        reason = errno.EISDIR
    elif not target.parent.is_dir():
        reason = errno.ENOENT
    elif not os.access(target if target.exists() else target.parent, os.W_OK):
        reason = errno.EACCES
    else:
        return
    raise EchosimError(f"{option} {path}: cannot write ({os.strerror(reason)})")


def _write(path: str, text: str, option: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise EchosimError(f"{option} {path}: cannot write ({exc.strerror or exc})") from None


@cli.command("search")
@click.argument("model")
@click.option("--backend", default="a100-80gb", show_default=True)
@click.option("--devices", type=int, required=True)
@click.option("--devices-per-node", type=int, help="[default: the backend's node for this job]")
@click.option("--global-batch", type=int, required=True, help="Sequences per optimizer step.")
@click.option("--seq-len", type=int, help="Tokens per sequence (default: the model's).")
@click.option(
    "--dtype", type=click.Choice(["fp32", "fp16", "bf16", "fp8", "mxfp8", "nvfp4"]), default="bf16", show_default=True
)
@click.option("--micro-batches", default="1,2,4", show_default=True, help="Micro-batch sizes to try.")
@click.option("--recompute", "recomputes", default="none,selective,full", show_default=True)
@click.option("--schedules", default="1f1b", show_default=True, help="e.g. 1f1b,zb-h1")
@click.option("--zero", "zeros", help="ZeRO stages to try, e.g. 0,1,3 (default: the framework's, 0 for eager)")
@framework_option
@click.option("--top", type=int, default=10, show_default=True)
@click.option("--workers", type=int, default=1, show_default=True, help="Local processes.")
@click.option("--json", "as_json", is_flag=True)
@_guard
def search_cmd(model: str, backend: str, devices: int, devices_per_node: int | None, global_batch: int,
               seq_len: int | None, dtype: str, micro_batches: str, recomputes: str, schedules: str,
               zeros: str | None, framework: str | None, top: int, workers: int, as_json: bool) -> None:  # fmt: skip
    """Rank the parallel layouts of MODEL on DEVICES by step time (those that fit first)."""
    from echosim.layout_search import search
    from echosim.plan import Cluster, Plan, plan_with_defaults
    from echosim.terminal import progress

    def ints(text: str, what: str) -> tuple[int, ...]:
        try:
            return tuple(int(x) for x in text.split(","))
        except ValueError:
            raise click.ClickException(f"--{what}: expected comma-separated integers, got {text!r}") from None

    base = plan_with_defaults(Plan(), {"global_batch": global_batch, "seq_len": seq_len or 0, "dtype": dtype,
                                       "framework": framework})  # fmt: skip
    cluster = Cluster(backend, devices, devices_per_node or 0)
    for option, value in (("devices", devices), ("global-batch", global_batch), ("top", top), ("workers", workers)):
        if value < 1:
            raise click.ClickException(f"--{option} must be at least 1, got {value}")
    if seq_len is not None and seq_len < 1:
        raise click.ClickException(f"--seq-len must be at least 1, got {seq_len} (leave it out for the model's own)")
    for value in ints(micro_batches, "micro-batches"):
        if value < 1:
            raise click.ClickException(f"--micro-batches: each size must be at least 1, got {value}")
    for value in ints(zeros, "zero") if zeros else ():
        if value not in (0, 1, 2, 3):
            raise click.ClickException(f"--zero: unknown ZeRO stage {value} (known: 0, 1, 2, 3)")
    space = {
        "micro_batches": ints(micro_batches, "micro-batches"),
        "recompute": tuple(recomputes.split(",")),
        "schedules": tuple(schedules.split(",")),
        "zero": ints(zeros, "zero") if zeros else (base.zero,),
    }
    with progress("compiling layouts", None, quiet=as_json) as advance:
        results = search(model, base, cluster, workers=workers, progress=lambda n, total: advance(n, total), **space)
    if results and all(c.step_time_s is None for c in results):
        raise EchosimError(f"none of the {len(results)} layouts compiled; the first: {results[0].error}")
    rows = [c.as_dict() for c in results[:top]]
    if as_json:
        click.echo(json.dumps({"candidates": len(results), "best": rows}, indent=2, sort_keys=True))
        return
    for r in rows:
        r["step_time_s"] = f"{r['step_time_s']:.3f}" if r["step_time_s"] is not None else "-"
        r["peak_GiB"] = f"{r['peak_bytes'] / 2**30:.1f}"
        r["mfu"] = f"{r['mfu'] * 100:.1f}%"
    _listing(rows, False, ["tp", "pp", "dp", "micro_batch", "recompute", "schedule", "zero", "step_time_s",
                           "mfu", "peak_GiB", "fits"])  # fmt: skip
    click.echo(f"{len(results)} layouts compiled; {sum(c.fits for c in results)} fit in memory")


class _CheckCommand(click.Command):
    """``check --help`` ends with the schema of ``[tool.echosim]``, read from the code that validates it."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from echosim.check import schema_text

        formatter.write_paragraph()
        with formatter.indentation():
            formatter.write_text("Keys (docs/check.md has examples and the pre-commit snippet):")
        for line in schema_text().splitlines():
            formatter.write(" " * (formatter.current_indent + 2) + line + "\n")


@cli.command("check", cls=_CheckCommand)
@click.argument("files", nargs=-1, type=click.Path())
@click.option("--config", type=click.Path(dir_okay=False), default="pyproject.toml", show_default=True)
@click.option(
    "--changed-only",
    is_flag=True,
    help="Run only the entries that read one of FILES (pre-commit passes the changed files); "
    "a changed config runs them all.",
)
@click.option("--update-baseline", is_flag=True, help="Write every result to the baseline file (commit it).")
@click.option("--no-cache", is_flag=True, help="Compile every entry even when a cached result matches.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcomes as JSON.")
@_guard
def check_cmd(
    files: tuple[str, ...], config: str, changed_only: bool, update_baseline: bool, no_cache: bool, as_json: bool
) -> None:
    """Check models against the budgets in [tool.echosim] of pyproject.toml (a pre-commit hook).

    Prints one line per entry, even when another errors. Exit status: 0 all within budget,
    3 a budget broken (or worse than the baseline by more than its tolerance), 1 an entry or
    the config in error.
    """
    from dataclasses import asdict
    from pathlib import Path

    from echosim.check import against_baseline, load_config, read_baseline, run_all, write_baseline

    if files and not changed_only:
        raise click.UsageError("FILES are read only with --changed-only")
    cfg = load_config(Path(config))
    baseline = read_baseline(cfg.baseline)
    outcomes = run_all(cfg, list(files) if changed_only and not update_baseline else None, not no_cache)
    if update_baseline:
        write_baseline(cfg.baseline, outcomes, baseline)
    else:
        outcomes = [against_baseline(o, baseline, cfg.tolerance) for o in outcomes]
    if as_json:
        click.echo(json.dumps([asdict(o) for o in outcomes], indent=2, sort_keys=True, default=list))
    else:
        for o in outcomes:
            click.echo(o.line())
        if update_baseline:
            click.echo(f"baseline written to {cfg.baseline}")
    if any(o.error for o in outcomes):
        raise SystemExit(1)
    if any(o.failures for o in outcomes):
        raise SystemExit(NOT_MET)


def _listing(rows: list[dict[str, Any]], as_json: bool, columns: list[str]) -> None:
    if as_json:
        click.echo(json.dumps(rows, indent=2, sort_keys=True))
        return
    from rich.table import Table

    from echosim.terminal import console

    table = Table(*columns)
    for row in rows:
        table.add_row(*(str(row.get(c, "")) for c in columns))
    console().print(table)


@cli.command("backends")
@click.option("--json", "as_json", is_flag=True)
@_guard
def backends_cmd(as_json: bool) -> None:
    """List hardware backends with their numbers and sources."""
    from echosim.plugins import get_registry

    reg = get_registry()
    rows = []
    for name, entry in sorted(reg.backends.items()):
        info: dict[str, Any] = {"name": name, "plugin": entry.owner}
        try:
            backend = entry.value()
            describe = getattr(backend, "describe", None)
            info.update(describe() if callable(describe) else {})
        except Exception as exc:  # a third-party factory that raises must not take the listing down
            info["error"] = f"{type(exc).__name__}: {exc}"
        rows.append(info)
    _listing(rows, as_json, ["name", "plugin", "peak_bf16_tflops", "hbm_GB", "hbm_GBps", "source"])
    _warn(reg.errors)


@cli.command("models")
@click.option("--json", "as_json", is_flag=True)
@_guard
def models_cmd(as_json: bool) -> None:
    """List the named models (the zoo and plugins)."""
    from echosim.plugins import get_registry

    reg = get_registry()
    rows = [{"name": n, "plugin": e.owner, "description": e.description} for n, e in sorted(reg.models.items())]
    _listing(rows, as_json, ["name", "plugin", "description"])
    _warn(reg.errors)


@cli.command("plugins")
@click.option("--json", "as_json", is_flag=True)
@_guard
def plugins_cmd(as_json: bool) -> None:
    """List loaded plugins and the hooks they implement."""
    from echosim.plugins import get_registry

    reg = get_registry()
    rows = [
        {"name": p.name, "version": p.version, "hooks": ", ".join(p.hooks), "distribution": p.distribution}
        for p in reg.plugins()
    ]
    if as_json:
        click.echo(json.dumps({"plugins": rows, "errors": reg.errors}, indent=2, sort_keys=True))
        return
    _listing(rows, False, ["name", "version", "hooks", "distribution"])
    _warn(reg.errors)


def _warn(errors: list[str]) -> None:
    for e in errors:
        click.echo(f"warning: {e}", err=True)


def main() -> None:
    try:
        cli.main()
    except EchosimError as exc:  # a plugin's commands clashing, found while looking a command up
        click.echo(f"Error: {exc}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
