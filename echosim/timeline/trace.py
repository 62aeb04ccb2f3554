"""Chrome / Perfetto trace export (opens in ui.perfetto.dev or chrome://tracing), read from the costed graph.

One process per pipeline stage, one thread per stream: ``compute`` holds every schedule
block (``F3``, ``B3``, ``W3``) with the compute ops of the blocks shown in detail nested
inside, and the optimizer step; ``comm`` holds the collectives of those blocks, the exposed
gradient reduction and the step-end collectives; ``p2p`` the activations and gradients sent
to the neighbouring stages. Ops carry their IR op, module scope, FLOPs, bytes and overlap
slowdown in ``args``. A slice that would overlap the one before it on a stream (a prefetch of
the next layer still running) goes to a second lane of that stream, so every thread nests.

Size is bounded: op-level detail is given to whole blocks, micro-batch by micro-batch (the
first, the middle, the last, then the others), until ``max_op_events`` ops are drawn; the
other blocks are one slice each. The largest zoo model on 16,384 devices stays under 50 MB.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from echosim.errors import EchosimError
from echosim.timeline.costed import CostedGraph, StageCost, op_attributes
from echosim.timeline.schedule import BlockTime
from echosim.timeline.streams import COMM, COMPUTE, OpEvent, UnitTiming

MAX_OP_EVENTS = 100_000
_US = 1e6
_KINDS = {"F": "forward", "B": "backward", "W": "weight-gradient"}
_BASE_TID = {COMPUTE: 0, COMM: 10, "p2p": 20}  # a stream's lanes: base, base + 1, ...


def _us(t: float) -> float:
    return round(t * _US, 3)


class _Writer:
    """Trace events with slice ends rounded once, so a child never ends after its parent.

    Compute slices nest (ops inside their block); on the other streams a slice that starts
    before the previous one ended takes the next free lane of that stream.
    """

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.lane_ends: dict[tuple[int, str], list[float]] = {}
        self.threads: dict[int, dict[int, str]] = {}

    def span(self, name: str, pid: int, stream: str, start: float, end: float, cat: str, args: dict[str, Any]) -> None:
        ts, te = _us(start), _us(end)
        lane = 0
        if stream != COMPUTE:
            ends = self.lane_ends.setdefault((pid, stream), [])
            lane = next((i for i, e in enumerate(ends) if e <= ts), len(ends))
            if lane == len(ends):
                ends.append(te)
            ends[lane] = te
        tid = _BASE_TID[stream] + lane
        self.threads.setdefault(pid, {})[tid] = stream if lane == 0 else f"{stream} (lane {lane + 1})"
        self.events.append({"name": name, "ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": round(te - ts, 3),
                            "cat": cat, "args": args})  # fmt: skip

    def metadata(self, names: dict[int, str]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for pid, name in names.items():
            out.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}})
            out.append({"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}})
            for tid, thread in sorted(self.threads.get(pid, {}).items()):
                out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": thread}})
                out.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                            "args": {"sort_index": tid}})  # fmt: skip
        return out


def _op_count(stage: StageCost, kind: str) -> int:
    return sum(len(u.events) * k for u, k in stage.units(kind))


def _microbatch_order(m: int) -> list[int]:
    """The first, middle and last micro-batch (warm-up, steady state, drain), then the rest in order."""
    first = list(dict.fromkeys([0, m // 2, m - 1]))
    return first + [j for j in range(m) if j not in first]


def detailed_blocks(costed: CostedGraph, max_op_events: int = MAX_OP_EVENTS) -> set[tuple[str, int, int]]:
    """The ``(kind, vstage, microbatch)`` blocks drawn op by op: whole micro-batches while the budget lasts."""
    by_mb: dict[int, list[BlockTime]] = {}
    for b in costed.blocks:
        by_mb.setdefault(b.microbatch, []).append(b)
    chosen: set[tuple[str, int, int]] = set()
    used = 0
    for j in _microbatch_order(costed.microbatches):
        blocks = by_mb.get(j, [])
        cost = sum(_op_count(costed.stages[b.vstage], b.kind) for b in blocks)
        if used + cost > max_op_events:
            break
        used += cost
        chosen.update((b.kind, b.vstage, b.microbatch) for b in blocks)
    return chosen


def op_spans(stage: StageCost, kind: str, t0: float) -> Iterator[tuple[UnitTiming, int, OpEvent, float]]:
    """(unit, repetition, op event, absolute start) of one block starting at ``t0``: a repeated layer every period."""
    t = t0
    for unit, runs in stage.units(kind):
        for r in range(runs):
            for e in unit.events:
                yield unit, r, e, t + r * unit.period + e.start
        if runs > 0:
            t += (runs - 1) * unit.period + unit.duration


def chrome_trace(costed: CostedGraph, model: str = "", max_op_events: int = MAX_OP_EVENTS) -> dict[str, Any]:
    """The trace-event JSON of a costed step (see the module docstring)."""
    pp = costed.pp
    w = _Writer()
    detail = detailed_blocks(costed, max_op_events)
    attrs: dict[tuple[int, int], dict[str, Any]] = {}

    def args_of(stage: StageCost, e: Any, layer: int, microbatch: int) -> dict[str, Any]:
        key = (id(stage.graph), e.node)
        if key not in attrs:
            a = op_attributes(stage.graph, e)
            attrs[key] = {k: a[k] for k in ("op", "scope", "phase", "flops", "bytes", "axis", "group") if k in a}
            attrs[key]["base_us"] = _us(e.base)
            attrs[key]["slowdown"] = round(a["slowdown"], 4)
        return {**attrs[key], "layer": layer, "microbatch": microbatch}

    for b in sorted(costed.blocks, key=lambda b: (b.stage, b.start, b.kind)):
        stage = costed.stages[b.vstage]
        args = {"microbatch": b.microbatch, "chunk": b.vstage // pp, "vstage": b.vstage}
        w.span(f"{b.kind}{b.microbatch}", b.stage, COMPUTE, b.start, b.end, _KINDS[b.kind], args)
        if (b.kind, b.vstage, b.microbatch) in detail:
            for _unit, r, e, start in op_spans(stage, b.kind, b.start):
                w.span(e.name, b.stage, e.stream, start, start + e.duration, e.category,
                       args_of(stage, e, r, b.microbatch))  # fmt: skip
        lag, to = (stage.p2p_fwd, b.vstage + 1) if b.kind == "F" else (stage.p2p_bwd, b.vstage - 1)
        if b.kind != "W" and lag > 0 and 0 <= to < len(costed.stages):
            what = "activations" if b.kind == "F" else "gradients"
            w.span(f"send {what} {b.microbatch}", b.stage, "p2p", b.end, b.end + lag, "comm.pp",
                   {"microbatch": b.microbatch, "to_stage": to % pp})  # fmt: skip
    for r in range(pp):
        for t in costed.rank_tail(r):
            if t.duration <= 0:
                continue
            args = {"busy_s": t.busy} if t.task == "dp" else {}
            w.span(t.name, r, t.stream, t.start, t.end, t.category, args)
    names = {r: f"stage {r}" for r in range(pp)}
    detailed_mbs = sorted({j for _, _, j in detail})
    other = {
        "model": model,
        "step_time_s": costed.step_time_s,
        "op_detail": f"ops drawn for micro-batches {_ranges(detailed_mbs) or 'none'} of {costed.microbatches} "
        f"(at most {max_op_events:,} op events); the other blocks are one slice each",
    }
    return {"traceEvents": w.metadata(names) + w.events, "displayTimeUnit": "ms", "otherData": other}


def _ranges(values: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    runs: list[list[int]] = []
    for v in values:
        if runs and runs[-1][-1] == v - 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def write_trace(costed: CostedGraph, path: str | Path, model: str = "", max_op_events: int = MAX_OP_EVENTS) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(chrome_trace(costed, model, max_op_events), f, separators=(",", ":"), sort_keys=True)
    except OSError as exc:
        raise EchosimError(f"--trace {path}: cannot write ({exc.strerror or exc})") from None
