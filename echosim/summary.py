"""A readable terminal summary of a :class:`~echosim.timeline.report.Report`."""

from __future__ import annotations

from typing import Any

from echosim.timeline.report import fmt_params, fmt_throughput

GiB = 2**30


def _fmt_s(x: float) -> str:
    return f"{x:.3f} s" if x >= 0.1 else f"{x * 1e3:.2f} ms"


def render(report: Any, trace: str | None = None, console: Any = None, accuracy: str | None = None) -> None:
    """Print the report; ``accuracy``: the line saying how far published runs like this one put the step."""
    from rich.table import Table

    from echosim.terminal import console as terminal_console

    console = console or terminal_console()
    p = report.plan
    # hierarchical CP: the all-to-all groups, then the ring across them
    tiers = f" (a2a {p['cp_a2a']} x ring {p['cp'] // p['cp_a2a']})" if p.get("cp_a2a") else ""
    extra = "".join(
        f" {label} {p[key]}{tiers if key == 'cp' else ''}"
        for key, label in (("cp", "CP"), ("ep", "EP"))
        if p.get(key, 1) not in (1, None)
    ) + (" +SP" if p.get("sp") else "")
    seq = f"seq {p['seq_len']}, " if p.get("seq_len") else ""  # none for images and feature rows
    console.print(
        f"[bold]{report.model}[/] on {report.devices} x {report.backend} ({report.devices_per_node} per node): "
        f"TP {p['tp']} PP {p['pp']} DP {p['dp']}{extra}, micro-batch {p['micro_batch']}, global batch "
        f"{p['global_batch'] or p['micro_batch'] * p['dp']}, {seq}{p['dtype']}, "
        f"recompute {p['recompute']}, {p['schedule']}"
    )
    head = Table(show_header=False, box=None)
    head.add_row("step time", f"[bold]{_fmt_s(report.step_time_s)}[/]")
    head.add_row("throughput", fmt_throughput(report))  # images, queries: what those models' users count
    head.add_row("MFU / HFU", f"{report.mfu * 100:.1f}% / {report.hfu * 100:.1f}%")
    head.add_row("TFLOP/s per device", f"{report.tflops_per_device:.1f} (hardware FLOPs, recompute included)")
    head.add_row("parameters", fmt_params(report.params))
    head.add_row("pipeline bubble", f"{report.bubble_fraction * 100:.1f}% of the step")
    if accuracy:
        head.add_row("likely step", accuracy)
    console.print(head)

    where = Table(title=f"where the time goes (stage {report.critical_stage}, the slowest)")
    where.add_column("kind")
    where.add_column("seconds", justify="right")
    where.add_column("share", justify="right")
    for kind, sec in sorted(report.breakdown.items(), key=lambda kv: -kv[1]):
        where.add_row(kind, _fmt_s(sec), f"{sec / report.step_time_s * 100:.1f}%")
    console.print(where)

    mem = Table(title="memory per device (GiB)")
    for col in ("stage", "params", "grads", "optimizer", "activations", "peak", "fits"):
        mem.add_column(col, justify="right")
    rows = report.memory if len(report.memory) <= 4 else [report.memory[0], report.memory[-1]]
    for m in rows:
        mem.add_row(
            str(m["stage"]),
            *(f"{m[k] / GiB:.1f}" for k in ("params", "grads", "optimizer", "activations", "peak")),
            "yes" if m["fits"] else f"[red]no[/] ({m['capacity'] / GiB:.0f})",
        )
    console.print(mem)
    for w in report.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    for note in report.notes:
        console.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
    if trace:
        console.print(f"trace written to {trace} (open it in ui.perfetto.dev)")
