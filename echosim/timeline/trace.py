"""Chrome / Perfetto trace export (opens in ui.perfetto.dev or chrome://tracing).

One process per pipeline stage with a compute and a communication track holding
every micro-batch's forward and backward block, the data-parallel gradient
reduction and the optimizer step; and one process per stage with the op-level
detail of its first micro-batch (a repeated layer is drawn once per repetition).
"""

from __future__ import annotations

import json
from typing import Any

from echosim.timeline.streams import UnitTiming

_US = 1e6


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


def chrome_trace(compiled: Any) -> dict[str, Any]:
    """Build the trace for a :class:`~echosim.compiler.Compiled` result."""
    events: list[dict[str, Any]] = []
    timings = compiled.timings
    pp = int(compiled.report.plan["pp"])
    ends = dict.fromkeys(range(pp), 0.0)
    names = {"F": "forward", "B": "backward", "W": "weight-gradient"}
    for b in compiled.blocks:
        events.append(
            _event(f"{b.kind}{b.microbatch}", b.stage, 0, b.start, b.end - b.start, names[b.kind],
                   microbatch=b.microbatch, chunk=b.vstage // pp)
        )  # fmt: skip
        ends[b.stage] = max(ends[b.stage], b.end)
    for r in range(pp):
        events += _meta(r, f"stage {r} (schedule)", {0: "compute", 1: "communication"})
        start = ends[r]
        mine = [t for t in timings if t.index % pp == r]
        exposed = mine[0].dp_exposed
        if exposed:
            busy = sum(t.dp_busy for t in mine)
            events.append(_event("dp grad reduction (exposed)", r, 1, start, exposed, "comm.dp", busy_s=busy))
        start += exposed
        for t in mine:
            for axis, sec in sorted(t.step_end_comm.items()):
                events.append(_event(f"{axis} step-end collectives", r, 1, start, sec, f"comm.{axis}"))
                start += sec
        optimizer = sum(t.optimizer for t in mine)
        events.append(_event("optimizer step", r, 0, start, optimizer, "optimizer"))
    for t in timings:
        pid = len(timings) + t.index
        events += _meta(pid, f"stage {t.index % pp} chunk {t.index // pp} ops (micro-batch 0)",
                        {0: "compute", 1: "communication"})  # fmt: skip
        fwd, end = _unit_events(pid, t.fwd_units, 0.0)
        bwd, _ = _unit_events(pid, t.bwd_units, end)
        events += fwd + bwd
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"model": compiled.report.model}}


def write_trace(compiled: Any, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(chrome_trace(compiled), f, separators=(",", ":"), sort_keys=True)
