"""Chrome / Perfetto trace export (opens in ui.perfetto.dev or chrome://tracing), read from the costed graph.

One process per pipeline stage with a compute and a communication track holding every
micro-batch's forward and backward block, the exposed gradient reduction, the step-end
collectives and the optimizer step; and one process per virtual stage with the op-level
detail of its first micro-batch (a repeated layer is drawn once per repetition).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from echosim.errors import EchosimError
from echosim.timeline.costed import CostedGraph
from echosim.timeline.streams import UnitTiming

_US = 1e6
_TRACKS = {0: "compute", 1: "communication"}


def _event(name: str, pid: int, tid: int, start_s: float, dur_s: float, cat: str, **args: Any) -> dict[str, Any]:
    return {
        "name": name,
        "ph": "X",
        "pid": pid,
        "tid": tid,
        "ts": round(start_s * _US, 3),
        "dur": round(dur_s * _US, 3),
        "cat": cat,
        "args": args,
    }


def _meta(pid: int, name: str, tids: dict[int, str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}]
    out += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": t, "args": {"name": n}} for t, n in tids.items()]
    return out


def _unit_events(pid: int, units: list[tuple[UnitTiming, int]], t0: float) -> tuple[list[dict[str, Any]], float]:
    events = []
    t = t0
    for unit, repeat in units:
        for r in range(repeat):
            for e in unit.events:
                tid = 0 if e.stream == "compute" else 1
                events.append(_event(e.name, pid, tid, t + e.start, e.duration, e.category, repeat=r))
            t += unit.duration
    return events, t


def chrome_trace(costed: CostedGraph, model: str = "") -> dict[str, Any]:
    """The trace-event JSON of a costed step."""
    events: list[dict[str, Any]] = []
    pp = costed.pp
    names = {"F": "forward", "B": "backward", "W": "weight-gradient"}
    for b in costed.blocks:
        events.append(
            _event(f"{b.kind}{b.microbatch}", b.stage, 0, b.start, b.end - b.start, names[b.kind],
                   microbatch=b.microbatch, chunk=b.vstage // pp)
        )  # fmt: skip
    for r in range(pp):
        events += _meta(r, f"stage {r} (schedule)", _TRACKS)
        for t in costed.rank_tail(r):
            if t.task == "dp" and not t.duration:
                continue
            args = {"busy_s": t.busy} if t.task == "dp" else {}
            events.append(_event(t.name, r, 0 if t.stream == "compute" else 1, t.start, t.duration, t.category, **args))
    stages = costed.stages
    for s in stages:
        pid = len(stages) + s.index
        events += _meta(pid, f"stage {s.index % pp} chunk {s.index // pp} ops (micro-batch 0)", _TRACKS)
        fwd, end = _unit_events(pid, s.fwd_units, 0.0)
        bwd, _ = _unit_events(pid, s.bwd_units, end)
        events += fwd + bwd
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"model": model}}


def write_trace(costed: CostedGraph, path: str | Path, model: str = "") -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(chrome_trace(costed, model), f, separators=(",", ":"), sort_keys=True)
    except OSError as exc:
        raise EchosimError(f"--trace {path}: cannot write ({exc.strerror or exc})") from None
