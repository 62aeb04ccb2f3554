"""The ``echosim`` command line: a thin click layer over the library.

Every user error is an :class:`~echosim.errors.EchosimError` and ends as one line on
stderr with exit status 1; tracebacks are for bugs only.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from click.core import ParameterSource

from echosim.commands.options import framework_option, layout_from_options, layout_options
from echosim.errors import EchosimError, one_line_errors

_guard = one_line_errors()  # user errors (EchosimError) end as one line and exit status 1


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


@click.group(cls=_Commands)
@click.version_option(package_name="echosim")
def cli() -> None:
    """Simulate one distributed training step from the model itself."""


@cli.command("compile")
@click.argument("model", required=False)
@layout_options
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--out", type=click.Path(dir_okay=False), help="Also write the JSON report to this file.")
@click.option("--trace", type=click.Path(dir_okay=False), help="Write a Chrome/Perfetto trace to this file.")
@click.option(
    "--report",
    "report_path",
    type=click.Path(dir_okay=False),
    help="Write a self-contained HTML report with charts (.html), or the step timeline chart alone (.png); "
    "needs matplotlib (echosim[report]).",
)
@click.option(
    "--graph",
    type=click.Path(dir_okay=False),
    help="Write the costed execution graph (.graphml, or .json node-link); see docs/costed-graph.md.",
)
@_guard
def compile_cmd(
    model: str | None,
    as_json: bool,
    out: str | None,
    trace: str | None,
    report_path: str | None,
    graph: str | None,
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
    typed = click.get_current_context().get_parameter_source("calibration") is ParameterSource.COMMANDLINE
    name, plan, cluster = layout_from_options(model, opts, typed)
    compiled = lower(name, plan, cluster)
    report = compiled.report
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


def _write(path: str, text: str, option: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise EchosimError(f"{option} {path}: cannot write ({exc.strerror or exc})") from None


@cli.command("search")
@click.argument("model")
@click.option("--backend", default="a100-80gb", show_default=True)
@click.option(
    "--devices",
    "devices_text",
    required=True,
    help="Devices, or a comma-separated list (256,512,1024) to compare cluster sizes.",
)
@click.option("--devices-per-node", type=int, help="[default: the backend's node for this job]")
@click.option("--global-batch", type=int, required=True, help="Sequences per optimizer step.")
@click.option("--seq-len", type=int, help="Tokens per sequence (default: the model's).")
@click.option("--dtype", type=click.Choice(["fp32", "fp16", "bf16", "fp8"]), default="bf16", show_default=True)
@click.option(
    "--space",
    "space_items",
    multiple=True,
    metavar="KEY=V1,V2",
    help="Values of one dimension (repeatable): tp, pp, dp, cp, ep, vpp, sp, zero, mb, recompute, schedule, "
    "tp_overlap. Unnamed dimensions take every value that applies (zero: the --framework's stage when one "
    "is named).",
)
@click.option("--micro-batches", help="Shorthand for --space mb=...")
@click.option("--recompute", "recomputes", help="Shorthand for --space recompute=...")
@click.option("--schedules", help="Shorthand for --space schedule=...")
@click.option("--zero", "zeros", help="Shorthand for --space zero=...")
@framework_option
@click.option(
    "--objective",
    type=click.Choice(["step-time", "tokens-per-s", "cost"]),
    default="step-time",
    show_default=True,
    help="What ranks layouts; cost: price per token (--price-per-device-hour).",
)
@click.option(
    "--max-memory-fraction",
    type=float,
    default=1.0,
    show_default=True,
    help="A layout fits when its peak memory is at most this share of the device's.",
)
@click.option("--top", type=int, default=10, show_default=True)
@click.option("--workers", type=int, default=1, show_default=True, help="Local processes.")
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="ray: spread layouts over a Ray cluster (pip install 'echosim[ray]').",
)
@click.option("--ray-address", help="A running Ray cluster (default: start a local one).")
@click.option("--tokens", type=float, help="Tokens to train on: time (and cost) to train per cluster size.")
@click.option("--price-per-device-hour", type=float, help="Price of one device for one hour (cost, --objective cost).")
@click.option("--plot", type=click.Path(dir_okay=False), help="Write a Pareto chart (step time vs memory), .png.")
@click.option("--json", "as_json", is_flag=True, help="Every evaluated layout, its figures and rejection reason.")
@_guard
def search_cmd(model: str, backend: str, devices_text: str, devices_per_node: int | None, global_batch: int,
               seq_len: int | None, dtype: str, space_items: tuple[str, ...], micro_batches: str | None,
               recomputes: str | None, schedules: str | None, zeros: str | None, framework: str | None,
               objective: str, max_memory_fraction: float, top: int, workers: int, executor: str,
               ray_address: str | None, tokens: float | None, price_per_device_hour: float | None,
               plot: str | None, as_json: bool) -> None:  # fmt: skip
    """Rank the parallel layouts of MODEL on DEVICES (every dimension; those that fit, best first)."""
    from echosim.commands.search import parse_devices, run
    from echosim.layout_search import parse_space
    from echosim.plan import Cluster, Plan, plan_with_defaults

    if global_batch < 1:
        raise click.ClickException(f"--global-batch must be at least 1, got {global_batch}")
    if top < 1 or workers < 1:
        raise click.ClickException(f"--{'top' if top < 1 else 'workers'} must be at least 1")
    shorthand = [f"{k}={v}" for k, v in (("mb", micro_batches), ("recompute", recomputes), ("schedule", schedules),
                                         ("zero", zeros)) if v]  # fmt: skip
    space = parse_space([*shorthand, *space_items])
    base = plan_with_defaults(Plan(), {"global_batch": global_batch, "seq_len": seq_len or 0, "dtype": dtype,
                                       "framework": framework})  # fmt: skip
    if framework and "zero" not in space:  # a named framework shards optimizer state its own way
        space["zero"] = (base.zero,)
    clusters = [Cluster(backend, n, devices_per_node or 0) for n in parse_devices(devices_text)]
    run(model, base, clusters, space=space, objective=objective, memory_fraction=max_memory_fraction,
        workers=workers, executor=executor, ray_address=ray_address, top=top, tokens=tokens,
        price=price_per_device_hour, plot=plot, as_json=as_json)  # fmt: skip


@cli.command("check")
@click.option("--config", type=click.Path(dir_okay=False), default="pyproject.toml", show_default=True)
@click.option("--json", "as_json", is_flag=True)
@_guard
def check_cmd(config: str, as_json: bool) -> None:
    """Check models against the budgets in [tool.echosim] (a pre-commit hook)."""
    from pathlib import Path

    from echosim.check import load_config, run_check

    defaults, entries = load_config(Path(config))
    outcomes = [run_check(e, defaults, i) for i, e in enumerate(entries)]
    if as_json:
        click.echo(json.dumps([o.__dict__ for o in outcomes], indent=2, sort_keys=True, default=list))
    else:
        for o in outcomes:
            status = "ok" if not o.failures else "FAIL: " + "; ".join(o.failures)
            click.echo(f"{o.model}: {o.step_time_s:.3f} s, {o.memory_gib:.1f} GiB, MFU {o.mfu * 100:.1f}% - {status}")
    if any(o.failures for o in outcomes):
        raise SystemExit(1)


def _listing(rows: list[dict[str, Any]], as_json: bool, columns: list[str]) -> None:
    if as_json:
        click.echo(json.dumps(rows, indent=2, sort_keys=True))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(*columns)
    for row in rows:
        table.add_row(*(str(row.get(c, "")) for c in columns))
    Console().print(table)


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
