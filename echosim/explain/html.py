"""``compile --report step.html``: one self-contained page (charts embedded as PNG, no script, no server).

The step timeline (Gantt per stage and stream, the critical path outlined), one micro-batch op
by op, where the time goes, memory per stage against capacity, time per layer kind, the
critical path, communication per axis and the plan. ``--report step.png`` writes the timeline
chart alone. Everything is read from the compile's costed graph and report.
"""

from __future__ import annotations

import base64
import html
import shlex
from pathlib import Path
from typing import Any

from echosim.errors import EchosimError
from echosim.explain import charts
from echosim.explain.step import Explanation, explain
from echosim.timeline.report import fmt_params, fmt_throughput

REPORT_FORMATS = (".html", ".htm", ".png")
GiB = 2**30

_STYLE = """
body{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:24px auto;max-width:1320px;color:#222;
font-size:14px;line-height:1.4}
h1{font-size:22px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid #ddd}
code{background:#f5f5f5;padding:2px 4px;border-radius:3px;font-size:12px;word-break:break-all}
table{border-collapse:collapse;font-size:13px}td,th{padding:3px 10px;border-bottom:1px solid #eee;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}.head td{font-size:15px}.bad{color:#c00;font-weight:600}
.row{display:flex;gap:24px;flex-wrap:wrap;align-items:flex-start}img{max-width:100%}figure{margin:0}
.muted{color:#777;font-size:12px}
"""


def check_report_path(path: str | Path) -> None:
    """Refuse an unknown format before the compile runs, so the mistake costs nothing."""
    suffix = Path(path).suffix.lower()
    if suffix not in REPORT_FORMATS:
        known = ", ".join(REPORT_FORMATS)
        raise EchosimError(f"--report {path}: unknown format {suffix or '(no suffix)'!r} (known: {known})")


def write_report(
    compiled: Any, path: str | Path, model: Any, plan: Any, cluster: Any, accuracy: str | None = None
) -> None:
    """Write the HTML report (``.html``) or the timeline chart alone (``.png``); ``accuracy``: the line saying how far
    published runs like this one put the step (``echosim.bands.accuracy_line``)."""
    check_report_path(path)
    charts.pyplot()  # the missing extra is one line before any work
    result = explain(compiled, model, plan, cluster, what_if=False)
    path = Path(path)
    if path.suffix.lower() == ".png":
        data = charts.png(_timeline(result, compiled))
        _write(path, data)
        return
    _write(path, render_html(result, compiled, accuracy).encode("utf-8"))


def _write(path: Path, data: bytes) -> None:
    try:
        path.write_bytes(data)
    except OSError as exc:
        raise EchosimError(f"--report {path}: cannot write ({exc.strerror or exc})") from None


def _timeline(result: Explanation, compiled: Any) -> Any:
    r = result.report
    title = f"{r.model} on {r.devices} x {r.backend}: step {r.step_time_s:.3f} s"
    return charts.timeline_chart(compiled.costed, title, result.critical.tasks)


def _img(data: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(data).decode("ascii")}">'


def _rows(rows: list[tuple[str, ...]], numeric: tuple[int, ...] = ()) -> str:
    out = []
    for row in rows:
        cells = "".join(
            f'<td class="n">{html.escape(c)}</td>' if i in numeric else f"<td>{html.escape(c)}</td>"
            for i, c in enumerate(row)
        )
        out.append(f"<tr>{cells}</tr>")
    return "".join(out)


def _s(x: float) -> str:
    return f"{x:.3f} s" if abs(x) >= 0.1 else f"{x * 1e3:.2f} ms"


def render_html(result: Explanation, compiled: Any, accuracy: str | None = None) -> str:
    r = result.report
    costed = compiled.costed
    cp = result.critical
    path_stage = max(cp.seconds_by_stage, key=lambda k: (cp.seconds_by_stage[k], -k))
    binding = max(r.memory, key=lambda m: m["peak"])
    fits = "fits" if r.fits else "does not fit"
    command = f"echosim compile {shlex.quote(r.model)} {result.flags}".strip()
    head = [
        ("step time", _s(r.step_time_s)),
        ("throughput", fmt_throughput(r)),
        ("MFU / HFU", f"{r.mfu * 100:.1f}% / {r.hfu * 100:.1f}%"),
        ("TFLOP/s per device", f"{r.tflops_per_device:.1f}"),
        ("parameters", fmt_params(r.params)),
        ("pipeline bubble", f"{r.bubble_fraction * 100:.1f}% of the step"),
        ("peak memory", f"{binding['peak'] / GiB:.1f} GiB of {binding['capacity'] / GiB:.0f} GiB "
                        f"(stage {binding['stage']}, {fits})"),
    ]  # fmt: skip
    if accuracy:
        head.insert(1, ("likely step", accuracy))
    micro_title = f"micro-batch {costed.microbatches // 2}: forward, then backward (dotted line)"
    micro = _img(charts.png(charts.microbatch_chart(costed, path_stage, micro_title)), "one micro-batch")
    shares = [(f"{s.seconds / cp.step_time_s * 100:.1f}%", _s(s.seconds), s.label) for s in cp.shares[:15]]
    comm = [(c.axis, "/".join(c.ops), _s(c.busy_s), _s(c.exposed_s), _s(c.hidden_s)) for c in result.communication]
    plan = [(k, str(v)) for k, v in r.plan.items()]
    plan += [("devices", str(r.devices)), ("devices per node", str(r.devices_per_node)), ("backend", r.backend)]
    slow = result.slowdown_s
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>echosim: {html.escape(r.model)} on {r.devices} x {html.escape(r.backend)}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(r.model)} on {r.devices:,} × {html.escape(r.backend)}</h1>",
        f"<p><code>{html.escape(command)}</code></p>",
        f'<table class="head">{_rows(head, (1,))}</table>',
        "<h2>The step, stage by stage and stream by stream</h2>",
        _img(charts.png(_timeline(result, compiled)), "step timeline"),
        f'<p class="muted">The critical path ({_s(cp.step_time_s)}) spends {_s(cp.seconds_by_stage[path_stage])} '
        f"on stage {path_stage}; its blocks carry a black strip.</p>",
        f"<h2>One micro-batch of stage {path_stage}, op by op</h2>",
        micro,
        '<div class="row">',
        f"<figure>{_img(charts.png(charts.breakdown_chart(r)), 'time breakdown')}</figure>",
        f"<figure>{_img(charts.png(charts.memory_chart(r)), 'memory per stage')}</figure>",
        "</div>",
        "<h2>Time per layer kind</h2>",
        _img(charts.png(charts.layer_kinds_chart(costed, path_stage)), "time per layer kind"),
        "<h2>Critical path</h2>",
        f"<table><tr><th>share</th><th>seconds</th><th>what</th></tr>{_rows(shares, (0, 1))}</table>",
        f"<h2>Communication on stage {r.critical_stage} (the last to finish)</h2>",
        "<table><tr><th>axis</th><th>collectives</th><th>busy</th><th>exposed</th><th>hidden</th></tr>",
        f"{_rows(comm, (2, 3, 4))}</table>",
        f"<p>Overlap slowdown: compute +{_s(slow['compute'])}, communication +{_s(slow['comm'])}.</p>",
        f"<h2>Plan</h2><table>{_rows(plan)}</table>",
    ]
    if r.warnings or r.notes:
        parts.append("<h2>Warnings and notes</h2><ul>")
        parts += [f'<li class="bad">{html.escape(w)}</li>' for w in r.warnings]
        parts += [f"<li>{html.escape(n)}</li>" for n in r.notes]
        parts.append("</ul>")
    parts.append(
        '<p class="muted">Written by echosim from the costed execution graph of this compile; '
        "<code>echosim explain</code> suggests changes, each compiled.</p></body></html>"
    )
    return "\n".join(parts) + "\n"
