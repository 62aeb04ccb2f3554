"""Compiled level loops of :func:`~echosim.timeline.composer.time_schedule` (numba, the ``echosim[fast]`` extra).

A full-space search times ~10^5 levels of a few blocks each, so the numpy path's cost is its calls per level, not
its arithmetic. These kernels run the same recurrence one element at a time: blocks in level order (a block only
reads blocks of earlier levels, so that order is a valid one), layouts inside (``ends`` is ``(blocks + 1,
layouts)`` row-major, so the inner loop reads and writes contiguous memory).

Every result must equal the numpy path's to the last bit, so each element sees the same float operations in the
same order: an addition (IEEE, no ``fastmath``: no reassociation or contraction) and numpy's ``maximum``, which
is ``a if a >= b or a != a else b`` (its scalar loop; the NaN of either argument propagates). ``composer`` keeps
the numpy path as the fallback (no numba, or ``ECHOSIM_JIT=0``) and the tests' oracle.

Imported only by :func:`~echosim.timeline.composer.time_schedule`, so ``import echosim`` and ``echosim compile``
never import numba. ``cache=True``: the machine code is written beside this file (or under ``NUMBA_CACHE_DIR``),
so only the first process after an install pays the compilation.
"""

from __future__ import annotations

import numba
import numpy as np

F, B = 0, 1


@numba.njit(cache=True)
def _max(a: float, b: float) -> float:
    """``numpy.maximum`` of two floats (its scalar loop: ``a`` when ``a >= b`` or ``a`` is NaN)."""
    return a if a >= b or a != a else b


@numba.njit(cache=True)
def time_blocks(
    cross: np.ndarray,
    chain: np.ndarray,
    lag: np.ndarray,
    duration: np.ndarray,
    pair: np.ndarray,
    pair_lag: np.ndarray,
    durations: np.ndarray,
    lags: np.ndarray,
    ends: np.ndarray,
    starts: np.ndarray,
    fused: bool,
    keep: bool,
) -> None:
    """``ends[i] = max(ends[cross[i]] + lags[lag[i]], ends[chain[i]]) + durations[duration[i]]`` for every block
    ``i`` in level order; with fused pairs (``fused``) the first operand is first raised to the pair's input,
    ``max(that, ends[pair[i]] + lags[pair_lag[i]])``, as the numpy loop does. ``starts`` is written if ``keep``."""
    n, layouts = ends.shape[0] - 1, ends.shape[1]
    for i in range(n):
        c, h, g, d = cross[i], chain[i], lag[i], duration[i]
        for col in range(layouts):
            ready = ends[c, col] + lags[g, col]
            if fused:
                ready = _max(ready, ends[pair[i], col] + lags[pair_lag[i], col])
            ready = _max(ready, ends[h, col])
            if keep:
                starts[i, col] = ready
            ends[i, col] = ready + durations[d, col]


@numba.njit(cache=True)
def _write_run(
    record: np.ndarray,
    record_s: np.ndarray,
    count: int,
    level: int,
    step: int,
    row: int,
    col: int,
    rank: int,
    start: float,
    end: float,
) -> int:
    """Write W run ``count`` of :func:`time_deferred` (where the numpy path lists it, and when it runs); the
    next free slot."""
    record[count, 0], record[count, 1], record[count, 2] = level, step, row
    record[count, 3], record[count, 4] = col, rank
    record_s[count, 0], record_s[count, 1] = start, end
    return count + 1


@numba.njit(cache=True)
def time_deferred(
    bounds: np.ndarray,
    rank: np.ndarray,
    kind: np.ndarray,
    cross: np.ndarray,
    lag: np.ndarray,
    duration: np.ndarray,
    durations: np.ndarray,
    lags: np.ndarray,
    weight: np.ndarray,
    ends: np.ndarray,
    starts: np.ndarray,
    free: np.ndarray,
    pending: np.ndarray,
    record: np.ndarray,
    record_s: np.ndarray,
    keep: bool,
) -> int:
    """The zero-bubble recurrence of ``composer._time_deferred``, one (block, layout) at a time.

    ``bounds``: the levels' ``[lo, hi)`` as ``lo`` of each level then ``n``. Per rank and layout, ``free`` is when
    the rank is free and ``pending`` its deferred W (both updated in place; ``free`` is the rank ends at return).
    Before a block whose inputs arrive after the rank is free, the rank runs its oldest W while any is pending; a
    backward adds one and past ``pp - 1`` pending the oldest runs right after it; the rest run at the end.

    With ``keep`` each W run is written to ``record`` (level, step, row, layout, rank) and ``record_s`` (start,
    end): ``step`` is the W's place in the level's waiting runs (``pp`` for one run right after its block) and
    ``row`` the block (the rank in the final drain, whose level is the number of levels), which is how the numpy
    path groups and orders its runs. Returns the number of runs written.
    """
    pp, layouts = free.shape[0], free.shape[1]
    cap = pp - 1
    count = 0
    levels = bounds.shape[0] - 1
    for lev in range(levels):
        for i in range(bounds[lev], bounds[lev + 1]):
            r, c, g, d = rank[i], cross[i], lag[i], duration[i]
            backward = kind[i] == B
            for col in range(layouts):
                ready = ends[c, col] + lags[g, col]
                f, p, w = free[r, col], pending[r, col], weight[r, col]
                step = 0
                while p > 0 and f < ready:  # the block would wait: the oldest deferred W runs first
                    after = f + w
                    if keep:
                        count = _write_run(record, record_s, count, lev, step, i, col, r, f, after)
                    f, p, step = after, p - 1, step + 1
                start = _max(ready, f)
                end = start + durations[d, col]
                if keep:
                    starts[i, col] = start
                ends[i, col] = end
                if backward:
                    p += 1
                after = end
                if p > cap:  # too many pending: the oldest runs right away
                    after = end + weight[r, col]
                    if keep:
                        count = _write_run(record, record_s, count, lev, pp, i, col, r, end, after)
                    p -= 1
                free[r, col], pending[r, col] = after, p
    for r in range(pp):  # the rest run when the rank has nothing else to do
        for col in range(layouts):
            f, p, w = free[r, col], pending[r, col], weight[r, col]
            step = 0
            while p > 0:
                after = f + w
                if keep:
                    count = _write_run(record, record_s, count, levels, step, r, col, r, f, after)
                f, p, step = after, p - 1, step + 1
            free[r, col], pending[r, col] = f, p
    return count


@numba.njit(cache=True)
def levels(
    cross: np.ndarray, pair: np.ndarray, offsets: np.ndarray, fused: bool, rounds: int, level: np.ndarray
) -> bool:
    """``composer._levels``'s sweeps one block at a time: each block's level is one past the larger of the level of
    the block it waits on (and, with ``fused``, of its pair's) and of the block before it on its rank.

    ``level`` (``n + 1`` zeros, the last one the sentinel's) is updated in place, ranks swept down then up until a
    round moves nothing (True). A block reads the levels as they are when it is reached, not as they were when its
    rank's sweep began (the numpy sweep's), so it may need fewer rounds, never a different answer: on an acyclic
    graph the levels that no sweep moves are the unique longest-path levels. False (a cycle, or ``rounds`` spent,
    or a level past ``n``): the caller falls back to Kahn's algorithm, as the numpy sweep does.
    """
    n = level.shape[0] - 1
    pp = offsets.shape[0] - 1
    for _ in range(rounds):
        moved = False
        top = 0
        for s in range(2 * pp):
            r = s if s < pp else 2 * pp - 1 - s
            before = -1  # the new level of the block before on the rank (none: a first block starts at its base)
            for k in range(offsets[r], offsets[r + 1]):
                d = cross[k]
                base = level[d] + 1 if d < n else 0
                if fused:
                    d = pair[k]
                    if d < n and level[d] + 1 > base:
                        base = level[d] + 1
                new = base if base > before + 1 else before + 1
                if new != level[k]:
                    level[k] = new
                    moved = True
                if new > top:
                    top = new
                before = new
        if not moved:
            return True
        if top > n:
            return False
    return False
