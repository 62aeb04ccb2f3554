"""Timing a pipeline schedule: its structure once per shape, then any number of layouts at once.

Which blocks a schedule runs, in which order on each rank, and which block each one waits
on (a forward on the previous virtual stage's forward of the same micro-batch, a backward
on the next one's backward, each plus the point-to-point transfer between them) do not
depend on how long anything takes. :func:`schedule_plan` derives that structure once per
(schedule, pp, micro-batches, vpp) and sorts the blocks into *levels*: a block's level is
one past the levels of the block before it on its rank and of the block it waits on, so
all blocks of a level can be timed together from levels already timed.

:func:`time_schedule` times a batch of layouts (one column each) level by level with
numpy: a block starts when its rank is free and its input has arrived and ends its
duration later. That is the recurrence an event-by-event simulation evaluates, with the
same float operations in the same order, so a layout timed alone or in a batch of
thousands gets the same numbers to the last bit, and the work grows with the number of
levels (about ``2 * vpp * (microbatches + pp)``), not with blocks times layouts. With numba
(the ``echosim[fast]`` extra) the level loops run compiled (:mod:`echosim.timeline._jit`), one
element at a time with the same operations, so the numbers are the same to the last bit.

Schedules of fused pairs (``fused_pairs``, DualPipe) run a forward and the next backward of another stage
as one unit: the forward also waits on the backward's input.

Zero-bubble schedules (``split_backward``) defer each backward's weight half ``W``: a rank
runs its oldest deferred ``W`` whenever its next block would otherwise wait (a rank-local
rule: the next block's inputs arrive at a time known when its level is timed), keeps at
most ``pp - 1`` pending (each holds its inputs alive) and runs the rest at the end
(Qi et al. 2024, ZB-H1).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from operator import itemgetter
from types import ModuleType
from typing import Any

import numpy as np

from echosim.memo import Memo
from echosim.timeline import compiled
from echosim.timeline.schedule import Block, BlockTime, Columns, ScheduleError

F, B = 0, 1
_KINDS = {"F": F, "B": B}
_SIGNS = {"F": 1, "B": -1}  # a block's change to the micro-batches a rank holds (any other kind: 0)
_PLANS: Memo[SchedulePlan] = Memo("schedule plans", maxsize=256)


@dataclass(frozen=True, eq=False)
class SchedulePlan:
    """The time-free structure of a schedule's blocks, sorted into levels (block ``i`` below is level-sorted)."""

    pp: int
    vstages: int
    # each rank's blocks (``orders``), or how to build them when first read
    orders_source: tuple[tuple[Block, ...], ...] | Callable[[], tuple[tuple[Block, ...], ...]]
    split_backward: bool
    rank: np.ndarray  # rank of block i
    kind: np.ndarray  # F or B
    vstage: np.ndarray
    microbatch: np.ndarray
    chain: np.ndarray  # the block before i on its rank, or the sentinel ``n``
    cross: np.ndarray  # the block i waits on, or the sentinel
    lag: np.ndarray  # row of the transfer before i arrives: p2p_fwd[v-1], p2p_bwd[v+1], or the zero row
    duration: np.ndarray  # row of i's duration: kind * vstages + vstage
    levels: tuple[tuple[int, int], ...]  # [lo, hi) of each level
    last: tuple[int, ...]  # per rank: its last block, or -1 for a rank with none
    rank_vstage: tuple[int, ...]  # per rank: the chunk of its last block (the one whose gradients it reduces last)
    in_flight: tuple[dict[int, int], ...]  # per rank: peak micro-batches held per virtual stage
    # fused pairs (a forward directly followed by a backward of another stage run as one unit, DualPipe): the
    # forward also waits on its backward's input, ``pair_cross`` / ``pair_lag`` as ``cross`` / ``lag``; else None
    pair_cross: np.ndarray | None = None
    pair_lag: np.ndarray | None = None

    @property
    def blocks(self) -> int:
        return len(self.rank)

    @cached_property
    def orders(self) -> tuple[tuple[Block, ...], ...]:
        """Each rank's blocks as ``(kind, virtual stage, micro-batch)`` tuples, in run order."""
        source = self.orders_source
        return source if isinstance(source, tuple) else source()

    @cached_property
    def reads(self) -> np.ndarray:
        """The blocks each level waits on, in one array: level ``[lo, hi)`` holds ``cross[lo:hi]`` then
        ``chain[lo:hi]`` at ``[2 lo, 2 hi)``, so :func:`time_schedule` gathers both ends with one index."""
        n = self.blocks
        width = [hi - lo for lo, hi in self.levels]
        own = np.arange(n)
        out = np.empty(2 * n, np.int64)
        out[np.repeat([lo for lo, _ in self.levels], width) + own] = self.cross
        out[np.repeat([hi for _, hi in self.levels], width) + own] = self.chain
        return out

    @cached_property
    def bounds(self) -> np.ndarray:
        """Each level's ``lo``, then the number of blocks: the levels as one array for the compiled loops."""
        return np.array([lo for lo, _ in self.levels] + [self.blocks], np.int64)


def schedule_plan(
    orders_of: Callable[[int, int, int], list[list[Block]]],
    pp: int,
    microbatches: int,
    vpp: int,
    split_backward: bool,
    fused_pairs: bool = False,
    columns: Callable[[int, int, int], Columns] | None = None,
) -> SchedulePlan:
    """The plan of ``orders_of(pp, microbatches, vpp)``, built once per shape and kept.

    ``columns``: the same orders as arrays (:data:`~echosim.timeline.schedule.Columns`, the built-in schedules'),
    so the plan skips a Python tuple per block; its tuples are built only if :attr:`SchedulePlan.orders` is read.
    """
    key = (orders_of, pp, microbatches, vpp, split_backward, fused_pairs)

    def build() -> SchedulePlan:
        if columns is None:
            return _build(orders_of(pp, microbatches, vpp), split_backward, pp * vpp, fused_pairs)
        lazy = functools.partial(_orders_of, orders_of, pp, microbatches, vpp)
        return _from_columns(columns(pp, microbatches, vpp), lazy, split_backward, pp * vpp, fused_pairs)

    return _PLANS.get(key, build)


def plan_for(
    orders: Sequence[Sequence[Block]], split_backward: bool = False, vstages: int = 0, fused_pairs: bool = False
) -> SchedulePlan:
    """The plan of explicit orders (not kept)."""
    return _build(orders, split_backward, vstages, fused_pairs)


def _build(orders: Sequence[Sequence[Block]], split_backward: bool, vstages: int, fused: bool = False) -> SchedulePlan:
    """The plan of explicit orders: their blocks read into columns (the generic path, any schedule)."""
    frozen = tuple(tuple(seq) for seq in orders)
    sizes = [len(seq) for seq in frozen]
    n = sum(sizes)
    flat = [block for seq in frozen for block in seq]
    # each column read by a C-level map (a full-space search builds plans of millions of blocks)
    kinds = np.fromiter(map(_KINDS.__getitem__, map(itemgetter(0), flat)), np.int64, n)
    vs = np.fromiter(map(itemgetter(1), flat), np.int64, n)
    js = np.fromiter(map(itemgetter(2), flat), np.int64, n)
    return _from_columns((kinds, vs, js, sizes), frozen, split_backward, vstages, fused)


def _orders_of(
    orders_of: Callable[[int, int, int], list[list[Block]]], pp: int, microbatches: int, vpp: int
) -> tuple[tuple[Block, ...], ...]:
    return tuple(tuple(seq) for seq in orders_of(pp, microbatches, vpp))


def _from_columns(
    columns: Columns,
    orders: tuple[tuple[Block, ...], ...] | Callable[[], tuple[tuple[Block, ...], ...]],
    split_backward: bool,
    vstages: int,
    fused: bool = False,
) -> SchedulePlan:
    """The plan of a schedule's columns (rank-major, each rank's blocks in run order); ``orders`` are its blocks
    as tuples, or how to build them when first read (a search reads them for a few layouts' reports only)."""
    kinds, vs, js, sizes = columns
    pp = len(sizes)
    n = sum(sizes)
    if n and (vs.min() < 0 or js.min() < 0):
        raise ScheduleError("pipeline schedule names a negative virtual stage or micro-batch")
    vstages = max(vstages, int(vs.max()) + 1 if n else 1)
    m = int(js.max()) + 1 if n else 1
    rank = np.repeat(np.arange(pp), sizes)
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    table = np.full((2, vstages, m), -1, np.int64)
    table[kinds, vs, js] = np.arange(n)
    if n and np.count_nonzero(table >= 0) != n:
        raise ScheduleError("pipeline schedule runs a block twice")
    # what each block waits on besides its rank: the forward before it, the backward after it
    fwd = kinds == F
    first_v, last_v = vs == 0, vs == vstages - 1
    need = np.where(fwd, ~first_v, True)
    dep_kind = np.where(fwd | last_v, F, B)
    dep_v = np.where(fwd, vs - 1, np.where(last_v, vs, vs + 1))
    cross = np.full(n, n, np.int64)
    cross[need] = table[dep_kind[need], np.clip(dep_v[need], 0, vstages - 1), js[need]]
    if np.any(cross < 0):
        raise ScheduleError("pipeline schedule deadlocked: a block waits on one that never runs")
    # a backward also needs its own forward: implied when that runs earlier on the same rank
    own = table[F, vs, js]
    back = np.flatnonzero(~fwd & ~last_v)
    pos = np.arange(n) - offsets[rank]
    mine = own[back]  # gathered once: a plan of a full-space search has up to 196,608 blocks
    if np.any(mine < 0) or np.any((rank[mine] != rank[back]) | (pos[mine] >= pos[back])):
        raise ScheduleError("pipeline schedule runs a backward before its own forward on the same rank")
    chain = np.where(pos > 0, np.arange(n) - 1, n)
    lag = np.where(fwd, np.where(first_v, 2 * vstages, vs - 1), np.where(last_v, 2 * vstages, vstages + vs + 1))
    pair = pair_lag = None
    if fused:  # a forward whose next block on the rank is a backward of another stage waits on that one's input
        head = np.zeros(n, bool)
        if n > 1:
            head[:-1] = fwd[:-1] & ~fwd[1:] & (rank[:-1] == rank[1:]) & (vs[:-1] != vs[1:])
        pair = np.full(n, n, np.int64)
        pair_lag = np.full(n, 2 * vstages, np.int64)
        pair[:-1][head[:-1]] = cross[1:][head[:-1]]
        pair_lag[:-1][head[:-1]] = lag[1:][head[:-1]]
    level = _levels(chain, cross, rank, offsets, n, pair)
    order = np.lexsort((rank, level))
    inverse = np.empty(n + 1, np.int64)
    inverse[order] = np.arange(n)
    inverse[n] = n
    cuts = np.flatnonzero(np.diff(level[order])) + 1
    bounds = np.concatenate(([0], cuts, [n])) if n else np.array([0, 0])
    levels = tuple(itertools.pairwise(bounds.tolist()))  # Python ints already
    last = tuple(int(inverse[offsets[r + 1] - 1]) if sizes[r] else -1 for r in range(pp))
    rank_vstage = tuple(int(vs[offsets[r + 1] - 1]) if sizes[r] else r for r in range(pp))
    if split_backward and n and np.any(vs != vs[offsets[rank]]):  # a rank's blocks: all of its first one's stage
        raise ScheduleError("a schedule that defers weight gradients must run one virtual stage per rank")
    return SchedulePlan(
        pp=pp,
        vstages=vstages,
        orders_source=orders,
        split_backward=split_backward,
        rank=rank[order],
        kind=kinds[order],
        vstage=vs[order],
        microbatch=js[order],
        chain=inverse[chain[order]],
        cross=inverse[cross[order]],
        lag=lag[order],
        duration=(kinds * vstages + vs)[order],
        levels=levels,
        last=last,
        rank_vstage=rank_vstage,
        in_flight=_in_flight_all(kinds, vs, rank, pp, vstages),
        pair_cross=None if pair is None else inverse[pair[order]],
        pair_lag=None if pair_lag is None else pair_lag[order],
    )


def _levels(
    chain: np.ndarray, cross: np.ndarray, rank: np.ndarray, offsets: np.ndarray, n: int, pair: np.ndarray | None = None
) -> np.ndarray:
    """Longest chain of waits ending at each block: sweeps over the ranks until nothing moves.

    Along a rank a level is a running maximum (``level[p] - p`` never falls), so each
    rank is one ``maximum.accumulate`` given the levels of the blocks it waits on; sweeping
    down then up the ranks follows forwards down and backwards up the pipeline. With numba
    (:func:`_compiled`) the same sweeps run one block at a time (the same levels: they are
    the unique longest-path levels, whichever way the sweeps get there).
    """
    level = np.zeros(n + 1, np.int64)
    pp = len(offsets) - 1
    jit = _compiled()
    if jit is not None:
        fused = pair is not None
        if jit.levels(cross, pair if fused else np.empty(0, np.int64), offsets, fused, 4 * pp + 8, level):
            return level[:n]
        return _levels_by_topology(chain, cross, n, pair)
    sweep = [*range(pp), *reversed(range(pp))]
    for _ in range(4 * pp + 8):
        moved = False
        for r in sweep:
            lo, hi = int(offsets[r]), int(offsets[r + 1])
            if lo == hi:
                continue
            dep = cross[lo:hi]
            base = np.where(dep < n, level[dep] + 1, 0)
            if pair is not None:
                dep = pair[lo:hi]
                base = np.maximum(base, np.where(dep < n, level[dep] + 1, 0))
            steps = np.arange(hi - lo)
            new = np.maximum.accumulate(base - steps) + steps
            if not np.array_equal(new, level[lo:hi]):
                level[lo:hi] = new
                moved = True
        if not moved:
            return level[:n]
        if level.max() > n:
            break
    return _levels_by_topology(chain, cross, n, pair)


def _levels_by_topology(chain: np.ndarray, cross: np.ndarray, n: int, pair: np.ndarray | None = None) -> np.ndarray:
    """Kahn's algorithm: exact levels for any orders, or the deadlock they contain."""
    readers: list[list[int]] = [[] for _ in range(n)]
    waiting = [0] * n
    for i in range(n):
        for d in (int(chain[i]), int(cross[i])) + (() if pair is None else (int(pair[i]),)):
            if d < n:
                readers[d].append(i)
                waiting[i] += 1
    level = [0] * n
    ready = [i for i in range(n) if not waiting[i]]
    done = 0
    while ready:
        nxt = []
        for i in ready:
            done += 1
            for u in readers[i]:
                level[u] = max(level[u], level[i] + 1)
                waiting[u] -= 1
                if not waiting[u]:
                    nxt.append(u)
        ready = nxt
    if done < n:
        raise ScheduleError("pipeline schedule deadlocked: a block waits on one that never runs")
    return np.array(level, np.int64)


def _in_flight_all(
    kinds: np.ndarray, vs: np.ndarray, rank: np.ndarray, pp: int, vstages: int
) -> tuple[dict[int, int], ...]:
    """:func:`_in_flight` of every rank from the plan's columns (rank-major, each rank's blocks in run order) in a
    few array operations, not a dozen per rank: a full-space search builds plans of thousands of ranks.

    Each (rank, virtual stage)'s blocks, in run order, are one segment of a stable sort by that pair; its peak is
    the most of its running count (+1 a forward, -1 a backward) and its place in the rank's dict that of its first
    forward (a stage the rank only runs backwards of is not listed), as :func:`_in_flight` orders them.
    """
    n = len(kinds)
    out: list[dict[int, int]] = [{} for _ in range(pp)]
    if not n:
        return tuple(out)
    key = rank * vstages + vs
    order = np.argsort(key, kind="stable")
    held = np.cumsum(np.where(kinds == F, 1, -1)[order])
    cut = key[order]
    starts = np.flatnonzero(np.concatenate(([True], cut[1:] != cut[:-1])))
    peaks = np.maximum.reduceat(held, starts) - np.concatenate(([0], held[starts[1:] - 1]))
    first = np.minimum.reduceat(np.where(kinds[order] == F, order, n), starts)  # a segment's first forward
    ranks, stages = cut[starts] // vstages, cut[starts] % vstages
    for i in np.lexsort((first, ranks)).tolist():
        if first[i] < n:
            out[int(ranks[i])][int(stages[i])] = int(peaks[i])
    return tuple(out)


def _in_flight(seq: Sequence[Block]) -> dict[int, int]:
    """Per virtual stage (in the order the rank first runs its forward): the most micro-batches whose
    forward has run and backward has not, along the rank's orders."""
    if not seq:
        return {}
    sign = np.fromiter(map(_SIGNS.get, map(itemgetter(0), seq), itertools.repeat(0)), np.int64, len(seq))
    chunk = np.fromiter(map(itemgetter(1), seq), np.int64, len(seq))
    forwards = chunk[sign == 1]
    first = np.unique(forwards, return_index=True)[1]
    peak: dict[int, int] = {}
    for v in forwards[np.sort(first)].tolist():
        peak[v] = int(np.cumsum(sign[chunk == v]).max())
    return peak


@dataclass(eq=False)
class BatchTiming:
    """A batch of layouts timed on one plan: ``ends[i, l]`` is when block ``i`` of layout ``l`` ends."""

    plan: SchedulePlan
    ends: np.ndarray
    starts: np.ndarray | None  # kept for a single layout (its blocks are listed)
    rank_ends: np.ndarray  # (pp, layouts): when each rank's last block (or deferred W) ends
    weights: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]  # W runs: rank, column, start, end

    def layout(self, column: int) -> ScheduleTiming:
        return ScheduleTiming(self, column)


@dataclass(eq=False)
class ScheduleTiming:
    """One layout's timed schedule (a column of a :class:`BatchTiming`)."""

    batch: BatchTiming
    column: int

    @property
    def plan(self) -> SchedulePlan:
        return self.batch.plan

    @cached_property
    def rank_ends(self) -> tuple[float, ...]:
        return tuple(float(x) for x in self.batch.rank_ends[:, self.column])

    @cached_property
    def blocks(self) -> list[BlockTime]:
        """Every block with its start and end, rank by rank in the order each rank runs them."""
        plan, col = self.plan, self.column
        ends = self.batch.ends[:, col]
        starts = self.batch.starts
        if starts is None:
            raise ValueError("blocks are listed only for a schedule timed alone (keep_blocks=True)")
        begin = starts[:, col]
        by_rank: list[list[BlockTime]] = [[] for _ in range(plan.pp)]
        position = np.argsort(plan.rank, kind="stable")  # level order within a rank is its run order
        for i in position.tolist():
            by_rank[int(plan.rank[i])].append(
                BlockTime(int(plan.rank[i]), int(plan.vstage[i]), "FB"[int(plan.kind[i])], int(plan.microbatch[i]),
                          float(begin[i]), float(ends[i]))
            )  # fmt: skip
        if plan.split_backward:
            by_rank = [self._with_weights(r, blocks) for r, blocks in enumerate(by_rank)]
        return [b for blocks in by_rank for b in blocks]

    def _with_weights(self, rank: int, blocks: list[BlockTime]) -> list[BlockTime]:
        """Merge a rank's deferred W runs into its blocks; the k-th W is the k-th backward's weight half."""
        runs = [
            (float(s), float(e))
            for ranks, cols, starts, ends in self.batch.weights
            for r, c, s, e in zip(ranks.tolist(), cols.tolist(), starts.tolist(), ends.tolist(), strict=True)
            if r == rank and c == self.column
        ]
        backward = [b for b in blocks if b.kind == "B"]
        weights = [BlockTime(rank, b.vstage, "W", b.microbatch, s, e) for b, (s, e) in zip(backward, runs, strict=True)]
        return sorted(blocks + weights, key=lambda b: b.start)


def time_schedule(
    plan: SchedulePlan,
    fwd: Any,
    bwd: Any,
    p2p_fwd: Any,
    p2p_bwd: Any,
    wgrad: Any = None,
    *,
    keep_blocks: bool = False,
) -> BatchTiming:
    """Time ``plan`` for a batch of layouts: each argument is ``(vstages,)`` or ``(vstages, layouts)`` seconds.

    ``p2p_fwd[v]`` is the transfer leaving virtual stage ``v`` forwards, ``p2p_bwd[v]`` backwards;
    ``wgrad`` is each stage's weight half for zero-bubble schedules (their ``bwd`` is the input half).
    """
    fwd, bwd, p2p_fwd, p2p_bwd = (np.asarray(x, np.float64) for x in (fwd, bwd, p2p_fwd, p2p_bwd))
    fwd, bwd, p2p_fwd, p2p_bwd = (x.reshape(x.shape[0], -1) for x in (fwd, bwd, p2p_fwd, p2p_bwd))
    layouts = fwd.shape[1]
    durations = np.concatenate([fwd, bwd])
    lags = np.concatenate([p2p_fwd, p2p_bwd, np.zeros((1, layouts))])
    n = plan.blocks
    ends = np.zeros((n + 1, layouts))
    starts = np.zeros((n, layouts)) if keep_blocks else None
    # the compiled loops index without bounds checks: only for inputs of the plan's shape (any other gets the
    # numpy path, and its error or result, as before)
    jit = _compiled() if len(fwd) == plan.vstages and durations.shape == (2 * len(fwd), layouts) else None
    if jit is not None and lags.shape != (2 * len(fwd) + 1, layouts):
        jit = None
    if plan.split_backward:
        if wgrad is None:
            raise ValueError("a schedule that defers weight gradients needs their durations (wgrad)")
        w = np.asarray(wgrad, np.float64).reshape(len(fwd), -1)
        if jit is not None and w.shape[1] in (1, layouts):
            return _time_deferred_jit(jit, plan, durations, lags, w, ends, starts)
        return _time_deferred(plan, durations, lags, w, ends, starts)
    pair, pair_lag = plan.pair_cross, plan.pair_lag
    cross, lag, chain, duration = plan.cross, plan.lag, plan.chain, plan.duration
    maximum, add = np.maximum, np.add
    if jit is not None:
        fused = pair is not None and pair_lag is not None
        none = np.empty(0, np.int64)
        kept = ends[:0] if starts is None else starts  # (0, layouts): not written without keep_blocks
        jit.time_blocks(cross, chain, lag, duration, pair if fused else none, pair_lag if fused else none,
                        durations, lags, ends, kept, fused, starts is not None)  # fmt: skip
    elif pair is None:
        _time_levels(plan, durations, lags, ends, starts)
    else:
        # fused pairs (DualPipe): each level's rows gathered into one buffer and combined in place (the same
        # additions and maxima, element by element, as ``ends[cross] + lags[lag]`` ...)
        for lo, hi in plan.levels:
            ready = ends[cross[lo:hi]]
            ready += lags[lag[lo:hi]]
            if pair_lag is not None:  # a fused pair starts when both its inputs are there
                fused = ends[pair[lo:hi]]
                fused += lags[pair_lag[lo:hi]]
                maximum(ready, fused, out=ready)
            maximum(ready, ends[chain[lo:hi]], out=ready)
            if starts is not None:
                starts[lo:hi] = ready
            add(ready, durations[duration[lo:hi]], out=ends[lo:hi])
    rank_ends = np.zeros((plan.pp, layouts))
    for r, i in enumerate(plan.last):
        if i >= 0:
            rank_ends[r] = ends[i]
    return BatchTiming(plan, ends, starts, rank_ends, [])


def _compiled() -> ModuleType | None:
    """The compiled level loops (:mod:`echosim.timeline._jit`), or None: numba is not installed (the
    ``echosim[fast]`` extra) or ``ECHOSIM_JIT=0`` asks for the numpy loops (the same numbers, slower)."""
    return _load_compiled() if compiled.wanted() else None


@functools.cache
def _load_compiled() -> ModuleType | None:
    # numba and llvmlite: imported by the first plan or batch a process times, never by ``import echosim``
    return compiled.load("echosim.timeline._jit")


#: Rows x layouts of transfer and duration seconds :func:`_time_levels` gathers at a time (8 MiB each).
_GATHERED = 1 << 20


def _time_levels(
    plan: SchedulePlan, durations: np.ndarray, lags: np.ndarray, ends: np.ndarray, starts: np.ndarray | None
) -> None:
    """:func:`time_schedule`'s recurrence without fused pairs, level by level: ``ends[i] = max(ends[cross[i]] +
    lags[lag[i]], ends[chain[i]]) + durations[duration[i]]``, the same operations element by element.

    A search times ~10^5 levels of a few rows each, so the numpy calls per level are the cost: the rows' transfer
    and duration seconds are gathered for many levels at once (they read no end), and a level's two reads of
    earlier ends are one gather (:attr:`SchedulePlan.reads`): one gather and three in-place operations a level.
    """
    maximum, add = np.maximum, np.add
    reads, lag, duration = plan.reads, plan.lag, plan.duration
    rows = max(1, _GATHERED // max(1, ends.shape[1]))
    base = top = 0
    lag_s = dur_s = ends[:0]
    for lo, hi in plan.levels:
        if hi > top:  # the next rows' seconds, from this level on
            base, top = lo, max(hi, lo + rows)
            lag_s, dur_s = lags[lag[base:top]], durations[duration[base:top]]
        got = ends[reads[2 * lo : 2 * hi]]
        ready = got[: hi - lo]
        ready += lag_s[lo - base : hi - base]
        maximum(ready, got[hi - lo :], out=ready)
        if starts is not None:
            starts[lo:hi] = ready
        add(ready, dur_s[lo - base : hi - base], out=ends[lo:hi])


def _time_deferred(
    plan: SchedulePlan,
    durations: np.ndarray,
    lags: np.ndarray,
    wgrad: np.ndarray,
    ends: np.ndarray,
    starts: np.ndarray | None,
) -> BatchTiming:
    """Zero-bubble timing: per rank its free time and its count of deferred W, decided level by level."""
    pp, layouts = plan.pp, durations.shape[1]
    free = np.zeros((pp, layouts))
    pending = np.zeros((pp, layouts), np.int64)
    weight = wgrad[np.array(plan.rank_vstage)]  # (pp, layouts): each rank's W (one virtual stage per rank)
    cap = pp - 1
    columns = np.arange(layouts)
    runs: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    keep = starts is not None

    def record(ranks: np.ndarray, mask: np.ndarray, begin: np.ndarray, end: np.ndarray) -> None:
        rows, cols = np.nonzero(mask)
        runs.append((ranks[rows], columns[cols], begin[rows, cols], end[rows, cols]))

    for lo, hi in plan.levels:
        ranks = plan.rank[lo:hi]
        ready = ends[plan.cross[lo:hi]] + lags[plan.lag[lo:hi]]
        f, p, w = free[ranks], pending[ranks], weight[ranks]
        while True:  # the next block would wait: run the oldest deferred W first
            run = (p > 0) & (f < ready)
            if not run.any():
                break
            after = np.where(run, f + w, f)
            if keep:
                record(ranks, run, f, after)
            f, p = after, p - run
        start = np.maximum(ready, f)
        end = start + durations[plan.duration[lo:hi]]
        if starts is not None:
            starts[lo:hi] = start
        ends[lo:hi] = end
        p = p + (plan.kind[lo:hi] == B)[:, None]
        over = p > cap  # too many pending: the oldest W runs right away
        after = np.where(over, end + w, end)
        if keep and over.any():
            record(ranks, over, end, after)
        free[ranks], pending[ranks] = after, p - over
    while pending.any():  # the rest run when the rank has nothing else to do
        run = pending > 0
        after = np.where(run, free + weight, free)
        if keep:
            record(np.arange(pp), run, free, after)
        free, pending = after, pending - run
    return BatchTiming(plan, ends, starts, free, runs)


def _time_deferred_jit(
    jit: ModuleType,
    plan: SchedulePlan,
    durations: np.ndarray,
    lags: np.ndarray,
    wgrad: np.ndarray,
    ends: np.ndarray,
    starts: np.ndarray | None,
) -> BatchTiming:
    """:func:`_time_deferred` by the compiled loop: the same ``ends``, ``starts``, rank ends and W runs.

    The loop visits each (block, layout) once and writes its W runs there; the numpy loop lists them level by
    level, one array per round of waiting runs (then the runs right after a block, then the drain's rounds), each
    in (block, layout) order. Sorting the written runs by (level, round, block, layout) and cutting them where the
    (level, round) changes gives those arrays.
    """
    pp, layouts = plan.pp, durations.shape[1]
    free = np.zeros((pp, layouts))
    pending = np.zeros((pp, layouts), np.int64)
    # (pp, layouts): each rank's W (one virtual stage per rank); a wgrad of one column serves every layout
    weight = np.ascontiguousarray(np.broadcast_to(wgrad[np.array(plan.rank_vstage)], (pp, layouts)))
    keep = starts is not None
    size = int(np.count_nonzero(plan.kind == B)) * layouts if keep else 0  # each backward's W runs once
    record = np.empty((size, 5), np.int64)  # level, round, block (or rank), layout, rank
    seconds = np.empty((size, 2))  # start, end
    count = jit.time_deferred(plan.bounds, plan.rank, plan.kind, plan.cross, plan.lag, plan.duration, durations,
                              lags, weight, ends, ends[:0] if starts is None else starts, free, pending, record,
                              seconds, keep)  # fmt: skip
    runs: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    if count:
        record, seconds = record[:count], seconds[:count]
        order = np.lexsort((record[:, 3], record[:, 2], record[:, 1], record[:, 0]))
        record, seconds = record[order], seconds[order]
        cuts = np.flatnonzero(np.any(record[1:, :2] != record[:-1, :2], axis=1)) + 1
        for rec, sec in zip(np.split(record, cuts), np.split(seconds, cuts), strict=True):
            runs.append((rec[:, 4].copy(), rec[:, 3].copy(), sec[:, 0].copy(), sec[:, 1].copy()))
    return BatchTiming(plan, ends, starts, free, runs)


def compose(
    orders: Sequence[Sequence[Block]],
    fwd: Sequence[float],
    bwd: Sequence[float],
    p2p_fwd: Sequence[float],
    p2p_bwd: Sequence[float],
    wgrad: Sequence[float] | None = None,
) -> list[BlockTime]:
    """Time every block of explicit orders for one layout (``*[v]`` per virtual stage); see :func:`time_schedule`."""
    plan = plan_for(orders, split_backward=wgrad is not None, vstages=len(fwd))
    return time_schedule(plan, fwd, bwd, p2p_fwd, p2p_bwd, wgrad, keep_blocks=True).layout(0).blocks
