"""``echosim diff``: two layouts (or two saved reports) term by term, and why each term moved.

Registered through ``register_commands`` like any plugin's commands. ``echosim diff A.json
B.json`` reads two saved reports; ``echosim diff MODEL --a "--tp 8 --pp 4" --b "--tp 4 --pp 8"``
compiles two layouts written as ``compile`` flags. Every user error ends as one line and exit
status 1.
"""

from __future__ import annotations

import shlex
from typing import Any

import click

from echosim.errors import EchosimError, one_line_errors
from echosim.plugins import hookimpl

_guarded = one_line_errors(ValueError)
GiB = 2**30


@click.command("diff")
@click.argument("targets", nargs=-1)
@click.option("--a", "flags_a", help='Layout A as compile flags, e.g. "--tp 8 --pp 4" (with MODEL).')
@click.option("--b", "flags_b", help="Layout B as compile flags.")
@click.option("--all", "show_all", is_flag=True, help="Show every term, also those that did not move.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@_guarded
def diff(targets: tuple[str, ...], flags_a: str | None, flags_b: str | None, show_all: bool, as_json: bool) -> None:
    """Compare two steps term by term: A.json B.json (saved reports), or MODEL --a FLAGS --b FLAGS.

    Terms: step time, each kind of compute, each communication axis (exposed), bubble,
    optimizer, and the memory parts of the stage with the largest peak. Each term that moved
    names the settings it depends on that changed.
    """
    from echosim.explain.diff import compare

    a, b, sources = _reports(targets, flags_a, flags_b)
    comparison = compare(a, b)
    if as_json:
        from echosim.timeline.report import stable_json

        out = comparison.as_dict()
        out["a"]["source"], out["b"]["source"] = sources
        click.echo(stable_json(out), nl=False)
        return
    render(comparison, sources, show_all)


def _reports(targets: tuple[str, ...], flags_a: str | None, flags_b: str | None) -> tuple[Any, Any, tuple[str, str]]:
    if flags_a is not None or flags_b is not None:
        if len(targets) > 1:
            raise EchosimError("diff: with --a/--b give at most one MODEL (and no report files)")
        from echosim.commands.options import parse_layout_flags
        from echosim.compiler import compile as compile_model

        model = targets[0] if targets else None
        reports = []
        for option, text in (("--a", flags_a or ""), ("--b", flags_b or "")):
            name, plan, cluster = parse_layout_flags(model, text, option)
            reports.append(compile_model(name, plan, cluster).to_dict())
        return reports[0], reports[1], (f"--a {shlex.quote(flags_a or '')}", f"--b {shlex.quote(flags_b or '')}")
    if len(targets) != 2:
        raise EchosimError("diff: give two saved reports (A.json B.json), or MODEL --a FLAGS --b FLAGS")
    from echosim.explain.diff import load_report

    return load_report(targets[0]), load_report(targets[1]), (targets[0], targets[1])


def _value(x: float, unit: str) -> str:
    if unit == "bytes":
        return f"{x / GiB:.2f} GiB"
    return f"{x:.3f} s" if abs(x) >= 0.1 or x == 0 else f"{x * 1e3:.2f} ms"


def _head(label: str, source: str, r: dict[str, Any]) -> str:
    from echosim.explain.diff import binding_stage

    stage = binding_stage(r)
    fits = "fits" if r.get("fits", True) else "does not fit"
    step = _value(r["step_time_s"], "s")
    return (f"{label}: {source}: {r['model']} on {r.get('devices')} x {r.get('backend')}, {step}, "
            f"peak {stage['peak'] / GiB:.1f} GiB on stage {stage['stage']} ({fits})")  # fmt: skip


def render(comparison: Any, sources: tuple[str, str], show_all: bool) -> None:
    from echosim.explain.diff import binding_stage

    echo = click.echo
    a, b = comparison.a, comparison.b
    echo(_head("A", sources[0], a))
    echo(_head("B", sources[1], b))
    for note in comparison.notes:
        echo(f"note: {note}")
    if comparison.changes:
        echo("changed: " + ", ".join(f"{k} {_fmt(x)} -> {_fmt(y)}" for k, x, y in comparison.changes))
    else:
        echo("changed: nothing in the layout")
    moved = {t.name for t in comparison.moved()}
    rows = [t for t in comparison.terms if show_all or t.name in moved or t.name == "step_time_s"]
    width = max(len(t.name) for t in rows)
    echo(f"{'term':<{width}}  {'A':>12}  {'B':>12}  {'change':>12}  why")
    memory_header = False
    for t in rows:
        if t.unit == "bytes" and not memory_header:
            echo(f"memory of the stage with the largest peak (A: stage {binding_stage(a)['stage']}, "
                 f"B: stage {binding_stage(b)['stage']}):")  # fmt: skip
            memory_header = True
        sign = "+" if t.delta > 0 else ""
        change = sign + _value(t.delta, t.unit)
        if t.name == "step_time_s" and t.a:
            change += f" ({t.delta / t.a * 100:+.1f}%)"
        why = ", ".join(t.why) if t.name != "step_time_s" else ""
        echo(f"{t.name:<{width}}  {_value(t.a, t.unit):>12}  {_value(t.b, t.unit):>12}  {change:>12}  {why}".rstrip())
    if not show_all:
        echo(f"({len(comparison.terms) - len(rows)} terms that moved less than 0.5% not shown; --all shows them)")


def _fmt(value: Any) -> str:
    from echosim.explain.diff import _fmt as fmt

    return fmt(value)


@hookimpl
def register_commands(cli: click.Group) -> None:
    cli.add_command(diff)
