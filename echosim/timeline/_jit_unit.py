"""Compiled op-level simulation of one unit (numba, the ``echosim[fast]`` extra): :func:`simulate` mirrors
:func:`echosim.timeline.streams.simulate_unit` on per-node arrays (:class:`~echosim.timeline.streams.UnitArrays`).

A full-space search simulates ~10^4 distinct units of hundreds of ops each; the Python path's cost is its dict
look-ups and calls per op, not its arithmetic. This kernel runs the same two list-scheduling passes, the overlap
dilation, the timing reduction and the carried slowdown one op at a time, and every float it returns must equal the
Python path's to the last bit: each value sees the same IEEE operations in the same order (no ``fastmath``: no
reassociation or contraction), Python's ``max(a, b)`` is ``b if b > a else a``, ``min(a, b)`` is ``b if b < a else
a``, ``max(iterable)`` keeps its first item unless a later one is greater, and :class:`~echosim.timeline.streams._Spans`
bisects exactly as :mod:`bisect` does. ``streams`` keeps the Python path as the fallback (no numba, or
``ECHOSIM_JIT=0``) and the tests' oracle (``tests/test_jit_unit.py``).

Imported only when a unit is first simulated, so ``import echosim`` never imports numba. ``cache=True``: the machine
code is written beside this file (or under ``NUMBA_CACHE_DIR``), so only the first process after an install pays the
compilation.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True)
def _advance(
    dur: np.ndarray,
    comm_stream: np.ndarray,
    has_pipe: np.ndarray,
    in_ptr: np.ndarray,
    in_idx: np.ndarray,
    in_pipe: np.ndarray,
    starts: np.ndarray,
    secs: np.ndarray,
) -> None:
    """``streams._advance`` (and ``_advance_chunked``) over every op from an empty state: each op's (start, seconds)
    into ``starts`` and ``secs``. ``in_idx[in_ptr[k]:in_ptr[k + 1]]`` are the unit positions of op ``k``'s inputs
    scheduled before it, in input order; ``in_pipe`` flags those on a pipelined edge; ``has_pipe[k]``: any input
    edge of ``k`` is pipelined (the chunked path)."""
    n = dur.shape[0]
    begin = np.empty(n)
    end = np.empty(n)
    compute = 0.0
    comm = 0.0
    for k in range(n):
        lo, hi = in_ptr[k], in_ptr[k + 1]
        chunked = has_pipe[k]
        if chunked:
            # max(end of unchunked inputs, default=0.0): the first, then any greater one
            ready = 0.0
            first = True
            for q in range(lo, hi):
                if in_pipe[q]:
                    continue
                e = end[in_idx[q]]
                if first:
                    ready, first = e, False
                elif e > ready:
                    ready = e
            for q in range(lo, hi):  # max([ready] + [begin of chunked producers])
                if in_pipe[q]:
                    b = begin[in_idx[q]]
                    if b > ready:
                        ready = b
        else:
            ready = 0.0
            for q in range(lo, hi):
                e = end[in_idx[q]]
                if e > ready:
                    ready = e
        d = dur[k]
        if d <= 0:  # views and placeholders: free, no stream
            begin[k] = end[k] = ready
            starts[k], secs[k] = ready, 0.0
            continue
        free = comm if comm_stream[k] else compute
        start = free if free > ready else ready
        finish = start + d
        if chunked:  # max([start + d] + [end of chunked producers]): the last chunk follows the producer
            for q in range(lo, hi):
                if in_pipe[q]:
                    e = end[in_idx[q]]
                    if e > finish:
                        finish = e
        if comm_stream[k]:
            comm = finish
        else:
            compute = finish
        begin[k], end[k] = start, finish
        starts[k], secs[k] = start, finish - start


@numba.njit(cache=True)
def _bisect_right(a: np.ndarray, x: float, hi: int) -> int:
    lo = 0
    while lo < hi:
        mid = (lo + hi) // 2
        if x < a[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


@numba.njit(cache=True)
def _bisect_left(a: np.ndarray, x: float, hi: int) -> int:
    lo = 0
    while lo < hi:
        mid = (lo + hi) // 2
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@numba.njit(cache=True)
def _term(start: float, end: float, b: float, e: float) -> float:
    """``max(0.0, min(end, e) - max(start, b))``, as Python's ``min`` and ``max`` pick."""
    hi = e if e < end else end
    lo = b if b > start else start
    x = hi - lo
    return x if x > 0.0 else 0.0


@numba.njit(cache=True)
def _spans(
    starts: np.ndarray, secs: np.ndarray, pick: np.ndarray, want: bool, events: bool
) -> tuple[np.ndarray, np.ndarray, bool]:
    """``_Spans`` of the ops with ``pick == want`` in order, their (begins, ends) and whether they are sorted and
    disjoint: the ops of positive seconds (``d > 0``), or with ``events`` those of the unit's events (``not d <=
    0``, as :func:`~echosim.timeline.streams._timing` keeps them: the same but for a NaN)."""
    n = starts.shape[0]
    begins = np.empty(n)
    ends = np.empty(n)
    m = 0
    for k in range(n):
        keep = not secs[k] <= 0 if events else secs[k] > 0
        if bool(pick[k]) == want and keep:
            begins[m], ends[m] = starts[k], starts[k] + secs[k]
            m += 1
    ordered = True
    for k in range(m - 1):
        if not ends[k] <= begins[k + 1]:
            ordered = False
            break
    return begins[:m], ends[:m], ordered


@numba.njit(cache=True)
def _overlap(begins: np.ndarray, ends: np.ndarray, ordered: bool, start: float, end: float) -> float:
    """``_Spans.overlap``: the seconds of the spans inside ``[start, end)``, summed in order from 0."""
    m = begins.shape[0]
    lo, hi = 0, m
    if ordered:
        lo, hi = _bisect_right(ends, start, m), _bisect_left(begins, end, m)
        if hi - lo <= 1:
            if hi <= lo:
                return 0.0
            return _term(start, end, begins[lo], ends[lo])
    total = 0.0
    for k in range(lo, hi):
        total += _term(start, end, begins[k], ends[k])
    return total


@numba.njit(cache=True)
def simulate(
    dur: np.ndarray,
    comm_stream: np.ndarray,
    coll: np.ndarray,
    side: np.ndarray,
    cat: np.ndarray,
    factor: np.ndarray,
    has_pipe: np.ndarray,
    in_ptr: np.ndarray,
    in_idx: np.ndarray,
    in_pipe: np.ndarray,
    slowed: bool,
    starts: np.ndarray,
    secs: np.ndarray,
    busy: np.ndarray,
    seen: np.ndarray,
) -> tuple[int, float, float, float]:
    """``streams.simulate_unit`` on arrays: each op's final (start, seconds) into ``starts`` and ``secs``, the busy
    seconds by category id into ``busy`` and the ids in the order they were first met into ``seen``; returns (how
    many categories were met, critical end, duration, carry). ``slowed``: the overlap model slows something (else one
    pass, and no carry)."""
    n = dur.shape[0]
    _advance(dur, comm_stream, has_pipe, in_ptr, in_idx, in_pipe, starts, secs)
    if slowed:
        # the dilation: an op's seconds grow by the share of them the other stream's ops (by the first pass) overlap
        cb, ce, cord = _spans(starts, secs, coll, False, False)  # compute spans, what a collective runs beside
        mb, me, mord = _spans(starts, secs, coll, True, False)
        dilated = np.empty(n)
        for k in range(n):
            s, d = starts[k], secs[k]
            if d <= 0:
                dilated[k] = d
                continue
            # a collective runs beside the compute spans, a compute op beside the collectives'
            shared = _overlap(cb, ce, cord, s, s + d) if coll[k] else _overlap(mb, me, mord, s, s + d)
            if shared != 0.0:
                q = shared / d
                m = 1.0 if q > 1.0 else q  # min(q, 1.0)
                dilated[k] = d * (1.0 + m * (factor[cat[k]] - 1.0))
            else:
                dilated[k] = d
        _advance(dilated, comm_stream, has_pipe, in_ptr, in_idx, in_pipe, starts, secs)
    # the timing reduction (streams._timing)
    critical_end = duration = 0.0
    met = 0
    for k in range(n):
        s, d = starts[k], secs[k]
        if d <= 0:
            continue
        e = s + d
        if not side[k] and e > critical_end:
            critical_end = e
        c = cat[k]
        known = False
        for j in range(met):
            if seen[j] == c:
                known = True
                break
        if not known:
            seen[met] = c
            met += 1
            busy[c] = 0.0
        busy[c] = busy[c] + d
        if e > duration:
            duration = e
    carry = 0.0
    if slowed:  # streams.carried_slowdown_s: the next repetition's compute beside this one's spilled collectives
        spill = duration - critical_end
        if spill > 0.0:
            ob, oe, oord = _spans(starts, secs, comm_stream, True, True)
            for k in range(n):
                s, d = starts[k], secs[k]
                if d <= 0 or comm_stream[k] or s >= spill:
                    continue
                e = s + d
                e = spill if spill < e else e
                beside = e - s - _overlap(ob, oe, oord, s, e)
                if beside > 0.0:
                    carry += beside * (factor[cat[k]] - 1.0)
    return met, critical_end, duration, carry
