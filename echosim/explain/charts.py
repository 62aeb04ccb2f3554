"""The report's charts, drawn with matplotlib from the costed graph and the report (nothing is recomputed).

* :func:`timeline_chart`: the step as a Gantt chart, one row per pipeline stage and stream
  (schedule blocks on compute, exposed reduction and step-end collectives on comm, sends
  between stages on p2p), the blocks on the critical path outlined;
* :func:`microbatch_chart`: one micro-batch of one stage op by op on its two streams;
* :func:`breakdown_chart`, :func:`memory_chart` (stacked parts per stage against capacity)
  and :func:`layer_kinds_chart` (time per module group and kind of work).

matplotlib is the optional extra ``echosim[report]``; without it the error names the extra.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from echosim.errors import EchosimError
from echosim.explain.critical import scope_group
from echosim.explain.diff import memory_parts
from echosim.timeline.costed import CostedGraph
from echosim.timeline.streams import COMM, COMPUTE

if TYPE_CHECKING:
    from matplotlib.figure import Figure

GiB = 2**30
MAX_STAGES_DRAWN = 24
COLOURS = {
    "F": "#7fb3e0",
    "B": "#2a6fb0",
    "W": "#5aa469",
    "compute.matmul": "#2a6fb0",
    "compute.attention": "#8e6bbf",
    "compute.memory_bound": "#7fc8c2",
    "compute.optimizer": "#888888",
    "optimizer": "#888888",
    "comm.tp": "#f28e2b",
    "comm.dp": "#d62728",
    "comm.dp_intra": "#ff7f0e",
    "comm.dp_cross": "#8c564b",
    "comm.edp": "#ff9896",
    "comm.fsdp": "#e6b800",
    "comm.pp": "#9c6b4e",
    "comm.cp": "#e377c2",
    "comm.cp_a2a": "#c5b0d5",
    "comm.cp_p2p": "#e377c2",
    "comm.ep": "#bcbd22",
    "comm.embed": "#c49c94",
    "bubble": "#dddddd",
    "idle": "#eeeeee",
}
MEMORY_COLOURS = {"params": "#2a6fb0", "grads": "#7fb3e0", "optimizer": "#5aa469", "activations": "#f28e2b",
                  "transient": "#ffbb78", "comm_buffers": "#9c6b4e", "fragmentation": "#bbbbbb"}  # fmt: skip


def colour(key: str) -> str:
    return COLOURS.get(key) or ("#f7b6d2" if key.startswith("comm.") else "#aec7e8")


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (files only, no display)."""
    try:
        import matplotlib
    except ImportError:
        raise EchosimError("--report needs matplotlib: pip install 'echosim[report]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png(fig: Figure) -> bytes:
    """The figure as PNG bytes without a timestamp or version in the metadata, so equal inputs give equal bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    pyplot().close(fig)
    return buf.getvalue()


def stages_drawn(pp: int, keep: tuple[int, ...] = ()) -> list[int]:
    """All stages up to :data:`MAX_STAGES_DRAWN`; beyond that, evenly spaced ones plus the first, last and ``keep``."""
    if pp <= MAX_STAGES_DRAWN:
        return list(range(pp))
    step = (pp - 1) / (MAX_STAGES_DRAWN - 1 - len(keep))
    picked = {round(i * step) for i in range(MAX_STAGES_DRAWN - len(keep))} | {0, pp - 1, *keep}
    return sorted(picked)


def _seconds_axis(ax: Any, end: float) -> None:
    ax.set_xlim(0, end * 1.005)
    ax.set_xlabel("seconds")
    ax.grid(axis="x", color="#eeeeee", linewidth=0.6)
    ax.set_axisbelow(True)


def timeline_chart(costed: CostedGraph, title: str, critical: tuple[str, ...] = ()) -> Figure:
    """Every stage's blocks and tails on its two streams, sends to the neighbouring stage on the comm row;
    a black strip under the blocks on the critical path."""
    plt = pyplot()
    from matplotlib.patches import Patch

    on_path = set(critical)
    path_stages = tuple(sorted({int(t.split("@v")[1]) % costed.pp for t in on_path if "@v" in t}))[:2]
    ranks = stages_drawn(costed.pp, path_stages)
    rows = [(r, s) for r in ranks for s in (COMPUTE, COMM)]
    height = max(2.4, 0.24 * len(rows) + 1.0)
    fig, ax = plt.subplots(figsize=(12, height))
    y_of = {row: len(rows) - 1 - i for i, row in enumerate(rows)}
    bars: dict[tuple[int, str], tuple[list[tuple[float, float]], list[str]]] = {}
    marks: list[tuple[int, float, float]] = []

    def bar(rank: int, stream: str, start: float, dur: float, face: str) -> None:
        if rank in ranks and dur > 0:
            spans, faces = bars.setdefault((rank, stream), ([], []))
            spans.append((start, dur))
            faces.append(face)

    for b in costed.blocks:
        bar(b.stage, COMPUTE, b.start, b.end - b.start, COLOURS[b.kind])
        if f"{b.kind}{b.microbatch}@v{b.vstage}" in on_path and b.stage in ranks:
            marks.append((b.stage, b.start, b.end - b.start))
        stage = costed.stages[b.vstage]
        lag = stage.p2p_fwd if b.kind == "F" else stage.p2p_bwd if b.kind == "B" else 0.0
        to = b.vstage + (1 if b.kind == "F" else -1)
        if lag > 0 and 0 <= to < len(costed.stages):
            bar(b.stage, COMM, b.end, lag, COLOURS["comm.pp"])
    for t in costed.tails:
        bar(t.rank, COMPUTE if t.stream == COMPUTE else COMM, t.start, t.duration, colour(t.category))
    for key, (spans, faces) in bars.items():  # a hairline edge keeps sub-pixel sends visible
        ax.broken_barh(spans, (y_of[key] - 0.38, 0.76), facecolors=faces, edgecolors=faces,
                       linewidth=0.4 if key[1] == COMM else 0.0)  # fmt: skip
    if marks:
        for rank in {m[0] for m in marks}:
            spans = [(start, dur) for r, start, dur in marks if r == rank]
            ax.broken_barh(spans, (y_of[(rank, COMPUTE)] - 0.5, 0.14), facecolors="black", edgecolors="none")
    ax.set_yticks([y_of[row] for row in rows])
    ax.set_yticklabels([f"stage {r} {s}" for r, s in rows], fontsize=7)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    _seconds_axis(ax, costed.step_time_s)
    shown = "" if len(ranks) == costed.pp else f" ({len(ranks)} of {costed.pp} stages shown)"
    ax.set_title(f"{title}{shown}", fontsize=10, loc="left")
    legend = [Patch(facecolor=COLOURS[k], label=label) for k, label in
              (("F", "forward"), ("B", "backward"), ("W", "weight gradient"), ("comm.dp", "exposed DP reduction"),
               ("comm.pp", "send to the next stage"), ("optimizer", "optimizer"))]  # fmt: skip
    legend.append(Patch(facecolor="black", label="critical path"))
    fig.legend(handles=legend, fontsize=7, ncol=7, loc="lower center", frameon=False)
    fig.subplots_adjust(bottom=0.55 / height + 0.04)
    return fig


def microbatch_chart(costed: CostedGraph, vstage: int, title: str) -> Figure:
    """One micro-batch of a virtual stage op by op: its forward, then its backward, on the two streams."""
    plt = pyplot()
    from matplotlib.patches import Patch

    from echosim.timeline.lower import repeated
    from echosim.timeline.trace import op_spans

    stage = costed.stages[vstage]
    fig, ax = plt.subplots(figsize=(12, 2.2))
    spans: dict[str, list[tuple[float, float]]] = {COMPUTE: [], COMM: []}
    faces: dict[str, list[str]] = {COMPUTE: [], COMM: []}
    t = 0.0
    seen: set[str] = set()
    for kind in ("F", "B", "W"):
        for _u, _r, e, start in op_spans(stage, kind, t):
            spans[e.stream].append((start, e.duration))
            faces[e.stream].append(colour(e.category))
            seen.add(e.category)
        t += sum(repeated(u, k) for u, k in stage.units(kind))
    for y, stream in ((1, COMPUTE), (0, COMM)):
        ax.broken_barh(spans[stream], (y - 0.4, 0.8), facecolors=faces[stream], edgecolors="none")
    ax.axvline(stage.fwd, color="black", linewidth=0.6, linestyle=":")
    ax.set_yticks([1, 0])
    ax.set_yticklabels(["compute", "comm"], fontsize=8)
    _seconds_axis(ax, max(t, 1e-9))
    ax.set_title(title, fontsize=10, loc="left")
    handles = [Patch(facecolor=colour(k), label=k) for k in sorted(seen)]
    ax.legend(handles=handles, fontsize=7, ncol=min(6, len(handles)) or 1, loc="upper center",
              bbox_to_anchor=(0.5, -0.45), frameon=False)  # fmt: skip
    return fig


def breakdown_chart(report: Any) -> Figure:
    """Seconds of the slowest stage by kind; they add up to the step time."""
    plt = pyplot()
    items = sorted(report.breakdown.items(), key=lambda kv: kv[1])
    fig, ax = plt.subplots(figsize=(5.2, 0.32 * len(items) + 0.9))
    ax.barh([k for k, _ in items], [v for _, v in items], color=[colour(k) for k, _ in items])
    for i, (_, v) in enumerate(items):
        ax.text(v, i, f" {v:.3g} s ({v / report.step_time_s * 100:.1f}%)", va="center", fontsize=7)
    ax.tick_params(axis="y", labelsize=8)
    _seconds_axis(ax, max(v for _, v in items) * 1.35)
    ax.set_title(f"where the time goes (stage {report.critical_stage})", fontsize=10, loc="left")
    return fig


def memory_chart(report: Any) -> Figure:
    """Each stage's memory as stacked parts against the device's capacity."""
    plt = pyplot()
    rows = report.memory
    fig, ax = plt.subplots(figsize=(4.6, 3.2))
    x = [m["stage"] for m in rows]
    bottom = [0.0] * len(rows)
    parts = memory_parts(rows)
    for part in parts:
        values = [m.get(part, 0) / GiB for m in rows]
        ax.bar(x, values, bottom=bottom, color=MEMORY_COLOURS.get(part, "#cccccc"), label=part, width=0.8)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    capacity = rows[0]["capacity"] / GiB
    ax.axhline(capacity, color="#d62728", linewidth=1.2, linestyle="--", label=f"capacity {capacity:.0f} GiB")
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("GiB per device")
    ax.set_ylim(0, max(capacity, max(bottom)) * 1.12)
    if len(x) <= 32:
        ax.set_xticks(x)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_title("memory per device, by stage", fontsize=10, loc="left")
    return fig


def layer_kinds(costed: CostedGraph, rank: int) -> dict[str, dict[str, float]]:
    """Seconds of a stage's ops over the step by module group and kind (busy time, hidden communication included)."""
    out: dict[str, dict[str, float]] = {}
    for stage in costed.chunks(rank):
        for unit, count in stage.fwd_units + stage.bwd_units:
            for e in unit.events:
                group = scope_group(stage.graph[e.node].scope) or "(top level)"
                kinds = out.setdefault(group, {})
                kinds[e.category] = kinds.get(e.category, 0.0) + e.duration * count * costed.runs(rank, stage.index)
    return out


def layer_kinds_chart(costed: CostedGraph, rank: int, top: int = 12) -> Figure:
    plt = pyplot()
    data = layer_kinds(costed, rank)
    groups = sorted(data, key=lambda g: (-sum(data[g].values()), g))[:top][::-1]
    categories = sorted({c for g in groups for c in data[g]}, key=lambda c: (c.startswith("comm."), c))
    fig, ax = plt.subplots(figsize=(7, 0.3 * len(groups) + 1.1))
    left = [0.0] * len(groups)
    for c in categories:
        values = [data[g].get(c, 0.0) for g in groups]
        ax.barh(groups, values, left=left, color=colour(c), label=c)
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.tick_params(axis="y", labelsize=7)
    _seconds_axis(ax, max(left) if left else 1.0)
    ax.legend(fontsize=7, loc="lower right", frameon=False)
    ax.set_title(f"time per layer kind over the step (stage {rank}, busy time)", fontsize=10, loc="left")
    return fig
