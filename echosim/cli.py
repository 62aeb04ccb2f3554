"""The ``echosim`` command line: a thin click layer over the library.

Every user error is an :class:`~echosim.errors.EchosimError` and ends as one line on
stderr with exit status 1; tracebacks are for bugs only.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from echosim.commands.options import (
    calibration_option,
    framework_option,
    from_options,
    layout_from_config,
    layout_from_options,
    layout_options,
)
from echosim.dynamics.options import dynamics_options
from echosim.errors import EchosimError, one_line_errors
from echosim.plan import CP_COMMS, MOE_DISPATCHERS

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
@dynamics_options
@click.option(
    "--require-fit",
    is_flag=True,
    help=f"Exit with status {NOT_MET} (after the report) when a pipeline stage does not fit in device memory.",
)
@click.option(
    "--strict",
    is_flag=True,
    help="Fail (exit 1) on an impossible figure (MFU above 100%, a negative or non-finite time or memory part, "
    "bytes moved faster than the device's bandwidth), an op no rule costs, or a calibration extrapolated past "
    "what it measured or fitted to a clamped parameter, instead of warning.",
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
    """Simulate one training step of MODEL (default: GPT-3 175B on 1,024 A100-80GB).

    Beside the step time, the report gives echosim's error on the published runs most like this one and the
    range of steps it implies ("likely step"; `accuracy` in the JSON; docs/accuracy.md).
    """
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
    from echosim.dynamics.options import pop_request, sections

    dynamics = pop_request(opts)  # failures, stragglers, DP strategy: checked before the compile
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
    extra = sections(dynamics, report) if dynamics.any else {}
    from echosim.bands import accuracy_line, accuracy_section
    from echosim.timeline.report import stable_json

    accuracy = accuracy_section(compiled)  # how far published runs like this one put the step
    # the report's JSON, with the accuracy band and the cluster-dynamics sections beside the step's figures
    report_json = stable_json({**report.to_dict(), **extra, "accuracy": accuracy})
    if out:
        _write(out, report_json, "--out")
    if trace:
        from echosim.timeline.trace import write_trace

        write_trace(compiled.costed, trace, report.model)
    if graph:
        from echosim.timeline.costed import write_graph

        write_graph(compiled.costed, graph)
    if report_path:
        from echosim.explain.html import write_report

        write_report(compiled, report_path, name, plan, cluster, accuracy_line(accuracy))
    if as_json:
        click.echo(report_json, nl=False)
    else:
        from echosim.summary import render

        render(report, trace, accuracy=accuracy_line(accuracy))
        if extra:
            from echosim.dynamics.options import render as dynamics_lines

            for line in dynamics_lines(extra):
                click.echo(line)
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
    step = f"{best.step_time_s:.4g} s" if best.step_time_s >= 0.1 else f"{best.step_time_s * 1e3:.3g} ms"
    click.echo(
        f"does not fit; the cheapest change that fits (simulated): {best.change}: step {step}, "
        f"peak {best.peak_bytes / 2**30:.1f} GiB"
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
@click.option(
    "--devices",
    "devices_text",
    required=True,
    help="Devices, or a comma-separated list (256,512,1024) to compare cluster sizes.",
)
@click.option("--devices-per-node", type=int, help="[default: the backend's node for this job]")
@click.option("--global-batch", type=int, required=True, help="Sequences per optimizer step.")
@click.option("--seq-len", type=int, help="Tokens per sequence (default: the model's).")
@click.option(
    "--dtype", type=click.Choice(["fp32", "fp16", "bf16", "fp8", "mxfp8", "nvfp4"]), default="bf16", show_default=True
)
@click.option(
    "--space",
    "space_items",
    multiple=True,
    metavar="KEY=V1,V2",
    help="Values of one dimension (repeatable): tp, pp, dp, cp, cp_comm, ep, vpp, sp, zero, offload_optimizer, mb, "
    "recompute, schedule, tp_overlap, embedding_sharding. Unnamed dimensions take every value that applies (zero: "
    "the --framework's stage when one is named; cp_comm: --cp-comm's scheme, else the framework's, a2a+p2p's groups "
    "as compile's default; offload_optimizer: --offload-optimizer's; embedding_sharding: --embedding-sharding's).",
)
@click.option("--micro-batches", help="Shorthand for --space mb=...")
@click.option("--recompute", "recomputes", help="Shorthand for --space recompute=...")
@click.option("--schedules", help="Shorthand for --space schedule=...")
@click.option("--zero", "zeros", help="Shorthand for --space zero=...")
@click.option(
    "--moe-dispatcher",
    type=click.Choice(MOE_DISPATCHERS),
    help="Expert dispatch of every layout (as compile's option).",
)
@click.option(
    "--moe-ep-overlap",
    is_flag=True,
    help="Combined 1F1B in every layout with ep > 1 (as compile's option; a layout it cannot run is rejected).",
)
@click.option("--moe-fused-mlp", is_flag=True, help="TE's fused grouped expert MLP in every layout (as compile's).")
@click.option("--fp8-attention", is_flag=True, help="FP8 attention in every layout (as compile's option).")
@click.option(
    "--cp-comm",
    type=click.Choice(CP_COMMS),
    help="Context-parallel scheme of every layout with cp > 1 (as compile's; a sliding window needs all_gather or "
    "a2a).",
)
@click.option(
    "--cp-a2a",
    type=int,
    help="a2a+p2p's all-to-all group size in every layout (as compile's; a layout whose cp it does not divide into "
    "two tiers is rejected) [default: compile's, per layout].",
)
@click.option(
    "--offload-optimizer",
    is_flag=True,
    help="The optimizer on the host CPU in every layout (as compile's option; layouts without ZeRO are rejected).",
)
@click.option(
    "--embedding-sharding",
    help="Embedding tables of every layout sharded as compile's option says (table, row, column, data, table_row, "
    "auto); layouts other than data-parallel are rejected.",
)
@click.option(
    "--offload-params",
    is_flag=True,
    help="ZeRO-3's weight shards in host memory in every layout (as compile's option; layouts without ZeRO-3 are "
    "rejected).",
)
@framework_option
@calibration_option(help="Use a calibration from `echosim calibrate` (NAME, FILE or FILE#NAME) for every layout.")
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
@click.option(
    "--workers",
    type=int,
    default=1,
    show_default=True,
    help="Processes: local ones, or Ray actors with --executor ray (1: one per CPU of the Ray cluster). Each holds "
    "whole groups of layouts (same tp, sp, cp, ep); the output is the same for any count.",
)
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
               recomputes: str | None, schedules: str | None, zeros: str | None, moe_dispatcher: str | None,
               moe_ep_overlap: bool, moe_fused_mlp: bool, fp8_attention: bool, cp_comm: str | None,
               cp_a2a: int | None, offload_optimizer: bool, embedding_sharding: str | None, offload_params: bool,
               framework: str | None, calibration: str | None, objective: str,
               max_memory_fraction: float, top: int, workers: int, executor: str, ray_address: str | None,
               tokens: float | None, price_per_device_hour: float | None, plot: str | None,
               as_json: bool) -> None:  # fmt: skip
    """Rank the parallel layouts of MODEL on DEVICES (every dimension; those that fit, best first).

    The best layout's likely step follows the table: the accuracy band `compile` reports (docs/accuracy.md).
    """
    from echosim.commands.search import parse_devices, run
    from echosim.frameworks import get_framework
    from echosim.layout import check_fp8_attention, check_fused_mlp
    from echosim.layout_search import parse_space
    from echosim.plan import Cluster, Plan, plan_with_defaults

    if global_batch < 1:
        raise click.ClickException(f"--global-batch must be at least 1, got {global_batch}")
    if top < 1 or workers < 1:
        raise click.ClickException(f"--{'top' if top < 1 else 'workers'} must be at least 1")
    shorthand = [f"{k}={v}" for k, v in (("mb", micro_batches), ("recompute", recomputes), ("schedule", schedules),
                                         ("zero", zeros)) if v]  # fmt: skip
    space = parse_space([*shorthand, *space_items])
    fixed = {"moe_dispatcher": moe_dispatcher, "moe_ep_overlap": moe_ep_overlap or None,
             "moe_fused_mlp": moe_fused_mlp or None, "fp8_attention": fp8_attention or None,
             "cp_comm": cp_comm, "cp_a2a": cp_a2a, "offload_optimizer": offload_optimizer or None,
             "offload_params": offload_params or None, "embedding_sharding": embedding_sharding}  # fmt: skip
    base = plan_with_defaults(Plan(), {"global_batch": global_batch, "seq_len": seq_len or 0, "dtype": dtype,
                                       "framework": framework, **fixed})  # fmt: skip
    if cp_comm is None:  # the framework's scheme for its layouts with cp > 1 (MaxText all-gathers K/V)
        scheme = get_framework(base.framework).defaults_for(set(), replace(base, cp=2)).get("cp_comm")
        base = replace(base, cp_comm=scheme or base.cp_comm)
    check_fp8_attention(base, backend)  # one line before any layout is enumerated, as compile refuses them
    check_fused_mlp(base, backend)
    if embedding_sharding is not None:
        from echosim.passes.embedding_sharding import EmbeddingSharding

        EmbeddingSharding(embedding_sharding, 1)  # an unknown type: one line naming the known ones
    if seq_len is not None and seq_len < 1:
        raise click.ClickException(f"--seq-len must be at least 1, got {seq_len} (leave it out for the model's own)")
    if cp_a2a is not None and cp_a2a < 2:
        raise click.ClickException(f"--cp-a2a must be at least 2 (a group of all-to-alls), got {cp_a2a}")
    if framework and "zero" not in space:  # a named framework shards optimizer state its own way
        space["zero"] = (base.zero,)
    if calibration:  # as compile: a typed calibration names its backend unless --backend does; checked once here
        from echosim.backends.loading import load_backend
        from echosim.calibrate import apply_calibration, load_calibration

        context = click.get_current_context()
        typed = context.get_parameter_source("calibration") is ParameterSource.COMMANDLINE
        if typed and context.get_parameter_source("backend") is ParameterSource.DEFAULT:
            made_for = load_calibration(calibration).backends
            backend = made_for[0] if len(made_for) == 1 else backend
        apply_calibration(load_backend(backend), calibration)
    clusters = [Cluster(backend, n, devices_per_node or 0, calibration=calibration or "")
                for n in parse_devices(devices_text)]  # fmt: skip
    run(model, base, clusters, space=space, objective=objective, memory_fraction=max_memory_fraction,
        workers=workers, executor=executor, ray_address=ray_address, top=top, tokens=tokens,
        price=price_per_device_hour, plot=plot, as_json=as_json)  # fmt: skip


@cli.command("cluster")
@click.argument("cluster_file", type=click.Path(dir_okay=False))
@click.argument("model")
@layout_options
@click.option(
    "--split",
    type=click.Choice(["data", "pipeline"]),
    default="data",
    show_default=True,
    help="data: each pool runs whole replicas and the batch is split; pipeline: --pp stages laid across the pools "
    "(dp from the devices) and the layers split.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the splits as JSON.")
@_guard
def cluster_cmd(cluster_file: str, model: str, split: str, as_json: bool, **opts: Any) -> None:
    """Simulate MODEL on a cluster of mixed device pools (CLUSTER_FILE, TOML): the naive equal split of the
    batch (or of the layers over pipeline stages) against the split balanced to each pool's speed
    (docs/cluster-dynamics.md)."""
    from echosim.dynamics.cluster import mixed_step, read_cluster, render
    from echosim.plugins import get_registry
    from echosim.timeline.report import stable_json

    for key in ("backend", "devices", "devices_per_node", "dp"):
        if opts.get(key) is not None:
            raise EchosimError(
                f"--{key.replace('_', '-')}: the cluster file gives the devices; each pool runs dp replicas"
            )
    if opts.get("embedding_sharding") not in (None, "none"):
        # TorchRec shards the tables over every rank of the job, across pools, and trains them with no dense
        # gradient; here each pool runs whole replicas and reduces a replica's dense gradients with the others
        raise EchosimError(
            "--embedding-sharding: a cluster of pools runs whole data-parallel replicas in each pool and reduces "
            "their dense gradients across pools; tables sharded over every rank of the job are not modelled here"
        )
    mixed = read_cluster(cluster_file, sorted(get_registry().backends))
    typed = click.get_current_context().get_parameter_source("calibration") is ParameterSource.COMMANDLINE
    if split == "pipeline":
        from echosim.dynamics.cluster import pipeline_step, render_pipeline

        opts = {**opts, "devices": mixed.devices}  # dp = devices / (tp*pp*cp)
        name, plan, _ = layout_from_options(model, opts, typed)
        result = pipeline_step(name, plan, mixed)
        lines = render_pipeline(result)
    else:
        name, plan, _ = layout_from_options(model, opts, typed)
        result = mixed_step(name, plan, mixed)
        lines = render(result)
    if as_json:
        click.echo(stable_json(result), nl=False)
        return
    for line in lines:
        click.echo(line)


@cli.command("replan")
@click.argument("model")
@click.option("--from", "from_flags", required=True, metavar="FLAGS", help='The running layout as compile flags: '
              '"--backend h100-sxm --tp 8 --pp 4 --dp 16 --global-batch 512".')  # fmt: skip
@click.option("--devices", type=int, required=True, help="Devices from now on.")
@click.option(
    "--space",
    "space_items",
    multiple=True,
    metavar="KEY=V1,V2",
    help="Widen the search (as `echosim search --space`); default: tp, pp and dp vary, the rest is kept.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@_guard
def replan_cmd(model: str, from_flags: str, devices: int, space_items: tuple[str, ...], as_json: bool) -> None:
    """The best layout of MODEL on a new device count, the cost of switching to it and when it pays back."""
    from echosim.commands.options import parse_layout_flags
    from echosim.dynamics.replan import render, replan
    from echosim.layout_search import parse_space
    from echosim.timeline.report import stable_json

    if devices < 1:
        raise EchosimError(f"--devices must be at least 1, got {devices}")
    space = parse_space(list(space_items))
    name, plan, cluster = parse_layout_flags(model, from_flags, "--from")
    result = replan(name, plan, cluster, devices, space)
    if as_json:
        click.echo(stable_json(result), nl=False)
        return
    for line in render(result):
        click.echo(line)


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
        # a derived figure (a power-capped peak) is shown as its datasheet peers are; --json keeps every digit
        table.add_row(*(f"{v:.1f}" if isinstance(v := row.get(c, ""), float) else str(v) for c in columns))
    console().print(table)


@cli.command("backends")
@click.option("--json", "as_json", is_flag=True)
@_guard
def backends_cmd(as_json: bool) -> None:
    """List hardware backends with their numbers and sources."""
    from echosim.plugins import get_registry

    reg = get_registry()
    rows = []
    broken: list[str] = []
    for name, entry in sorted(reg.backends.items()):
        info: dict[str, Any] = {"name": name, "plugin": entry.owner}
        try:
            backend = entry.value()
            describe = getattr(backend, "describe", None)
            info.update(describe() if callable(describe) else {})
        except Exception as exc:  # a third-party factory that raises must not take the listing down
            info["error"] = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            broken.append(f"backend {name!r} of plugin {entry.owner!r} could not be built ({info['error']})")
        rows.append(info)
    _listing(rows, as_json, ["name", "plugin", "peak_bf16_tflops", "hbm_GB", "hbm_GBps", "source"])
    _warn([*reg.errors, *broken])


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
    flag = _search_flag()
    if flag is not None:
        flag[0] = False  # a search run earlier in this process (a test's) does not speak for this command
    try:
        cli.main()
    except EchosimError as exc:  # a plugin's commands clashing, found while looking a command up
        click.echo(f"Error: {exc}", err=True)
        sys.exit(1)
    except SystemExit as done:
        flag = _search_flag()
        if flag is not None and flag[0] and done.code in (None, 0):
            _exit_without_teardown()
        raise


def _search_flag() -> list[bool] | None:
    """``SKIP_TEARDOWN`` of :mod:`echosim.commands.search` where the search command imported it (looked up, not
    imported: other commands do not pay for the search's imports)."""
    module = sys.modules.get("echosim.commands.search")
    flag: list[bool] | None = None if module is None else module.SKIP_TEARDOWN
    return flag


def _exit_without_teardown() -> None:
    """Exit 0 at once, output flushed, leaving the search's caches to the OS (see ``SKIP_TEARDOWN``)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
