"""``echosim explain``: where the step's time goes along its critical path, and the changes that help most.

Registered through ``register_commands`` like any plugin's commands. It takes ``compile``'s
layout flags, calls :mod:`echosim.explain` and formats; every user error ends as one line
and exit status 1.
"""

from __future__ import annotations

from typing import Any

import click
from click.core import ParameterSource

from echosim.commands.options import layout_from_options, layout_options
from echosim.errors import one_line_errors
from echosim.plugins import hookimpl

_guarded = one_line_errors(ValueError)
GiB = 2**30


@click.command("explain")
@click.argument("model", required=False)
@layout_options
@click.option("--top", type=click.IntRange(0, 50), default=3, show_default=True, help="Suggestions to show.")
@click.option("--what-if/--no-what-if", default=True, help="Compile the neighbouring layouts and suggest changes.")
@click.option("--json", "as_json", is_flag=True, help="Print the explanation as JSON.")
@_guarded
def explain(model: str | None, top: int, what_if: bool, as_json: bool, **opts: Any) -> None:
    """Explain one training step of MODEL: critical path, exposed communication, bubble, and what would help.

    Each suggestion is a neighbouring layout (vpp, micro-batch, recompute, sp, tp/pp/dp swaps,
    zero, tp-overlap, schedule) compiled for real; when the layout does not fit, the fastest
    changes that make it fit come first.
    """
    from echosim.compiler import lower
    from echosim.explain.step import explain as explain_step

    typed = click.get_current_context().get_parameter_source("calibration") is ParameterSource.COMMANDLINE
    name, plan, cluster = layout_from_options(model, opts, typed)
    compiled = lower(name, plan, cluster)
    result = explain_step(compiled, name, plan, cluster, what_if=what_if)
    from echosim.bands import accuracy_line, accuracy_section

    accuracy = accuracy_section(compiled)  # how far published runs like this one put the step
    if as_json:
        from echosim.timeline.report import stable_json

        click.echo(stable_json({**result.as_dict(top), "accuracy": accuracy}), nl=False)
        return
    render(result, top, accuracy=accuracy_line(accuracy))


def _s(x: float) -> str:
    return f"{x:.3f} s" if abs(x) >= 0.1 else f"{x * 1e3:.2f} ms"


def render(result: Any, top: int = 3, lines: int = 8, accuracy: str | None = None) -> None:
    """The explanation as text: one screen, numbers first; ``accuracy``: the step's band line, if any."""
    r = result.report
    echo = click.echo
    memory = max(r.memory, key=lambda m: m["peak"])
    verdict = "fits" if r.fits else f"does not fit: stage {memory['stage']} needs {memory['peak'] / GiB:.1f} GiB"
    echo(f"{r.model} on {r.devices} x {r.backend}: {result.flags or '(a layout with no compile flags)'}")
    echo(f"step {_s(r.step_time_s)}; peak {memory['peak'] / GiB:.1f} GiB of {memory['capacity'] / GiB:.1f} GiB "
         f"per device ({verdict})")  # fmt: skip
    if accuracy:
        echo(f"likely step: {accuracy}")
    cp = result.critical
    stage, on_stage = max(cp.seconds_by_stage.items(), key=lambda kv: (kv[1], -kv[0]))
    echo("")
    echo(f"critical path: {_s(cp.step_time_s)}, {_s(on_stage)} of it on stage {stage}")
    for s in cp.shares[:lines]:
        echo(f"  {s.seconds / cp.step_time_s * 100:5.1f}%  {_s(s.seconds):>10}  {s.label}")
    rest = cp.step_time_s - sum(s.seconds for s in cp.shares[:lines])
    if len(cp.shares) > lines:
        echo(f"  {rest / cp.step_time_s * 100:5.1f}%  {_s(rest):>10}  {len(cp.shares) - lines} more")
    echo(f"communication on stage {r.critical_stage} (the last to finish), over the step:")
    for c in result.communication:
        hidden = f"hidden except {_s(c.exposed_s)}" if c.hidden_s > 0 else f"all exposed ({_s(c.exposed_s)})"
        echo(f"  {c.axis:<6} {'/'.join(c.ops) or '-':<28} {_s(c.busy_s):>10} busy, {hidden}")
    echo(f"bubble {_s(result.bubble_s)} ({r.bubble_fraction * 100:.1f}% of the step)")
    slow = result.slowdown_s
    echo(f"overlap slowdown: compute +{_s(slow['compute'])}, communication +{_s(slow['comm'])}")
    for w in r.warnings:  # what compile warns of holds for the explanation too
        echo(f"warning: {w}")
    if not result.simulated:
        return
    refused = sum(1 for o in result.simulated if o.error)
    echo("")
    heading = "what helps most" if r.fits else "changes that make it fit, cheapest first, then the largest peak cuts"
    echo(f"{heading} ({len(result.simulated)} neighbouring layouts compiled, {refused} refused by the compiler):")
    if not result.suggestions:
        echo("  nothing in the neighbourhood " + ("is faster" if r.fits else "shrinks the peak"))
    for i, o in enumerate(result.suggestions[:top], 1):
        change = (o.step_time_s - r.step_time_s) / r.step_time_s * 100
        fits = "fits" if o.fits else "does not fit the hosts' memory" if o.host else "does not fit"
        echo(f"  {i}. {o.change}: {_s(o.step_time_s)} ({change:+.1f}%), peak {o.peak_bytes / GiB:.1f} GiB, {fits}")
        echo(f"     {o.why}")
        echo(f"     echosim compile {r.model} {o.flags}")


@hookimpl
def register_commands(cli: click.Group) -> None:
    cli.add_command(explain)
