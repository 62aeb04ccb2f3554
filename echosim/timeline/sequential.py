"""One layout's pipeline schedule timed block by block in plain Python: what a single compile needs.

:mod:`echosim.timeline.composer` times a batch of layouts at once with numpy (a layout search
times thousands). A compile times one layout, and importing numpy and starting its BLAS threads
costs a process more than the timing does (~0.15 s of CPU against ~10 ms for GPT-3 175B's 6,144
blocks), so :func:`~echosim.timeline.lower.lower_step` times its one layout here instead.

The structure is the composer's: a block waits on the block before it on its rank and on one
block of the neighbouring virtual stage (a forward on the previous stage's forward, a backward
on the next stage's backward, the last stage's backward on its own forward), plus the
point-to-point transfer between them (a fused pair's forward also on its backward's input); the
same orders are refused with the same :class:`ScheduleError`. Blocks are visited in an order where
both are done (any such order gives the same times) and timed with the composer's float operations, in its order:
``start = max(arrival + transfer, rank free)``, ``end = start + duration``, and for zero-bubble
schedules the same rank-local rule for deferred ``W`` halves. So every block, every rank's end
and every in-flight count equal the composer's to the last bit; tests/test_sequential.py checks it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

from echosim.memo import Memo
from echosim.timeline.schedule import Block, BlockTime, ScheduleError

F, B = 0, 1
_KINDS = {"F": F, "B": B}
_PLANS: Memo[OrderPlan] = Memo("sequential schedule plans", maxsize=256)


@dataclass(frozen=True, eq=False)
class OrderPlan:
    """The time-free structure of one schedule's blocks (block ``i``: the ``i``-th of the ranks' orders end to end)."""

    pp: int
    vstages: int
    orders: tuple[tuple[Block, ...], ...]
    split_backward: bool
    rank: tuple[int, ...]  # rank of block i
    kind: tuple[int, ...]  # F or B
    chain: tuple[int, ...]  # the block before i on its rank, or the sentinel ``n`` (always done, ends at 0)
    cross: tuple[int, ...]  # the block i waits on, or the sentinel
    lag: tuple[int, ...]  # index of the transfer before i arrives: p2p_fwd[v-1], p2p_bwd[v+1], or the zero
    duration: tuple[int, ...]  # index of i's duration: kind * vstages + vstage
    sequence: tuple[int, ...]  # every block after the two it waits on
    last: tuple[int, ...]  # per rank: its last block, or -1 for a rank with none
    rank_vstage: tuple[int, ...]  # per rank: the chunk of its last block (the one whose gradients it reduces last)
    in_flight: tuple[dict[int, int], ...]  # per rank: peak micro-batches held per virtual stage
    # fused pairs (the composer's ``pair_cross`` / ``pair_lag``): () when the schedule runs none
    pair_cross: tuple[int, ...] = ()
    pair_lag: tuple[int, ...] = ()

    @property
    def blocks(self) -> int:
        return len(self.rank)

    def peak_held(self, rank: int, per_microbatch: dict[int, int]) -> int:
        """The highest running sum of held activations along ``rank``'s orders (0 before any block): a
        forward adds its chunk's bytes, a backward frees them (integers: exact)."""
        held = peak = 0
        for kind, v, _ in self.orders[rank]:
            sign = 1 if kind == "F" else -1 if kind == "B" else 0
            held += sign * per_microbatch.get(v, 0)
            peak = max(peak, held)
        return peak


def order_plan(
    orders_of: Callable[[int, int, int], list[list[Block]]],
    pp: int,
    microbatches: int,
    vpp: int,
    split_backward: bool,
    fused_pairs: bool = False,
) -> OrderPlan:
    """The plan of ``orders_of(pp, microbatches, vpp)``, built once per shape and kept."""
    key = (orders_of, pp, microbatches, vpp, split_backward, fused_pairs)
    return _PLANS.get(key, lambda: plan_orders(orders_of(pp, microbatches, vpp), split_backward, pp * vpp, fused_pairs))


def plan_orders(
    orders: Sequence[Sequence[Block]], split_backward: bool = False, vstages: int = 0, fused_pairs: bool = False
) -> OrderPlan:
    """The plan of explicit orders (not kept); refuses what the composer's plan refuses, with its message.
    ``fused_pairs``: a forward directly followed on its rank by a backward of another stage runs with it as
    one unit (DualPipe's overlapped pairs), so it also waits on that backward's input."""
    pp = len(orders)
    frozen = tuple(tuple(seq) for seq in orders)
    sizes = [len(seq) for seq in frozen]
    flat = [block for seq in frozen for block in seq]
    n = len(flat)
    kinds = [_KINDS[b[0]] for b in flat]
    vs = [b[1] for b in flat]
    js = [b[2] for b in flat]
    if n and (min(vs) < 0 or min(js) < 0):
        raise ScheduleError("pipeline schedule names a negative virtual stage or micro-batch")
    vstages = max(vstages, max(vs) + 1 if n else 1)
    rank = [r for r, size in enumerate(sizes) for _ in range(size)]
    pos = [p for size in sizes for p in range(size)]
    table = {key: i for i, key in enumerate(zip(kinds, vs, js, strict=True))}
    if len(table) != n:
        raise ScheduleError("pipeline schedule runs a block twice")
    last_v = vstages - 1
    # what each block waits on besides its rank: the forward before it, the backward after it
    get = table.get
    cross = [n] * n
    lag = [2 * vstages] * n
    misordered = False
    for i, (k, v, j) in enumerate(zip(kinds, vs, js, strict=True)):
        if k == F:
            if v:
                cross[i] = get((F, v - 1, j), -1)
                lag[i] = v - 1
        elif v == last_v:
            cross[i] = get((F, v, j), -1)
        else:
            cross[i] = get((B, v + 1, j), -1)
            lag[i] = vstages + v + 1
            # a backward also needs its own forward: implied when that runs earlier on the same rank
            own = get((F, v, j), -1)
            misordered = misordered or own < 0 or rank[own] != rank[i] or pos[own] >= pos[i]
    if -1 in cross:
        raise ScheduleError("pipeline schedule deadlocked: a block waits on one that never runs")
    if misordered:
        raise ScheduleError("pipeline schedule runs a backward before its own forward on the same rank")
    chain = [i - 1 if pos[i] else n for i in range(n)]
    offsets = [0]
    for size in sizes:
        offsets.append(offsets[-1] + size)
    pair: list[int] = []
    pair_lag: list[int] = []
    if fused_pairs:
        head = [
            i + 1 < n and kinds[i] == F and kinds[i + 1] == B and rank[i] == rank[i + 1] and vs[i] != vs[i + 1]
            for i in range(n)
        ]
        pair = [cross[i + 1] if head[i] else n for i in range(n)]
        pair_lag = [lag[i + 1] if head[i] else 2 * vstages for i in range(n)]
    sequence = _sequence(cross, offsets, n, pair)
    if split_backward and any(len({b[1] for b in seq}) > 1 for seq in frozen):
        raise ScheduleError("a schedule that defers weight gradients must run one virtual stage per rank")
    return OrderPlan(
        pp=pp,
        vstages=vstages,
        orders=frozen,
        split_backward=split_backward,
        rank=tuple(rank),
        kind=tuple(kinds),
        chain=tuple(chain),
        cross=tuple(cross),
        lag=tuple(lag),
        duration=tuple(k * vstages + v for k, v in zip(kinds, vs, strict=True)),
        sequence=sequence,
        last=tuple(offsets[r + 1] - 1 if sizes[r] else -1 for r in range(pp)),
        rank_vstage=tuple(vs[offsets[r + 1] - 1] if sizes[r] else r for r in range(pp)),
        in_flight=tuple(_in_flight(seq) for seq in frozen),
        pair_cross=tuple(pair),
        pair_lag=tuple(pair_lag),
    )


def _sequence(cross: list[int], offsets: list[int], n: int, pair: list[int] | None = None) -> tuple[int, ...]:
    """Sweep the ranks, each running its blocks until one waits on a block not yet run; a sweep
    that runs nothing is a cycle of waits."""
    done = bytearray(n + 1)
    done[n] = 1
    at = offsets[:-1]
    out: list[int] = []
    while len(out) < n:
        before = len(out)
        for r in range(len(at)):
            i, end = at[r], offsets[r + 1]
            while i < end and done[cross[i]] and (not pair or done[pair[i]]):
                done[i] = 1
                out.append(i)
                i += 1
            at[r] = i
        if len(out) == before:
            raise ScheduleError("pipeline schedule deadlocked: a block waits on one that never runs")
    return tuple(out)


def _in_flight(seq: Sequence[Block]) -> dict[int, int]:
    """Per virtual stage (in the order the rank first runs its forward): the highest running count of
    its forwards less its backwards along the rank's orders."""
    held: dict[int, int] = {}
    best: dict[int, int] = {}
    first: dict[int, None] = {}
    for kind, v, _ in seq:
        if kind == "F":
            now = held.get(v, 0) + 1
            first.setdefault(v, None)
        else:
            now = held.get(v, 0) - (kind == "B")
        held[v] = now
        top = best.get(v)
        if top is None or now > top:
            best[v] = now
    return {v: best[v] for v in first}


def _max(a: float, b: float) -> float:
    """``numpy.maximum`` of two floats: ``a`` on a tie, NaN when either is NaN."""
    return b if b > a or b != b else a


@dataclass(eq=False)
class SequentialTiming:
    """One layout's timed schedule, with what :class:`~echosim.timeline.composer.ScheduleTiming` offers."""

    plan: OrderPlan
    starts: list[float]
    ends: list[float]
    rank_ends: tuple[float, ...]
    weights: list[list[tuple[float, float]]]  # per rank: its deferred W runs (start, end) in run order

    @cached_property
    def blocks(self) -> list[BlockTime]:
        """Every block with its start and end, rank by rank in the order each rank runs them."""
        plan = self.plan
        out: list[BlockTime] = []
        for r, seq in enumerate(plan.orders):
            base = plan.last[r] - len(seq) + 1
            mine = [
                BlockTime(r, v, kind, j, self.starts[base + p], self.ends[base + p])
                for p, (kind, v, j) in enumerate(seq)
            ]
            if plan.split_backward:
                backward = [b for b in mine if b.kind == "B"]
                runs = self.weights[r]
                weights = [
                    BlockTime(r, b.vstage, "W", b.microbatch, s, e) for b, (s, e) in zip(backward, runs, strict=True)
                ]
                mine = sorted(mine + weights, key=lambda b: b.start)
            out += mine
        return out


def time_orders(
    plan: OrderPlan,
    fwd: Sequence[float],
    bwd: Sequence[float],
    p2p_fwd: Sequence[float],
    p2p_bwd: Sequence[float],
    wgrad: Sequence[float] | None = None,
) -> SequentialTiming:
    """Time ``plan`` for one layout (each argument per virtual stage, seconds); ``wgrad`` is each stage's
    weight half for zero-bubble schedules (their ``bwd`` is the input half)."""
    durations = [float(x) for x in (*fwd, *bwd)]
    lags = [float(x) for x in (*p2p_fwd, *p2p_bwd)] + [0.0]
    n = plan.blocks
    ends = [0.0] * (n + 1)
    starts = [0.0] * n
    cross, chain, lag, duration = plan.cross, plan.chain, plan.lag, plan.duration
    if plan.split_backward:
        if wgrad is None:
            raise ValueError("a schedule that defers weight gradients needs their durations (wgrad)")
        return _time_deferred(plan, durations, lags, [float(x) for x in wgrad], ends, starts)
    pair, pair_lag = plan.pair_cross, plan.pair_lag
    for i in plan.sequence:
        ready = ends[cross[i]] + lags[lag[i]]
        if pair:  # a fused pair starts when both its inputs are there (the composer's np.maximum)
            ready = _max(ready, ends[pair[i]] + lags[pair_lag[i]])
        start = _max(ready, ends[chain[i]])
        starts[i] = start
        ends[i] = start + durations[duration[i]]
    rank_ends = tuple(ends[i] if i >= 0 else 0.0 for i in plan.last)
    return SequentialTiming(plan, starts, ends, rank_ends, [])


def _time_deferred(
    plan: OrderPlan,
    durations: list[float],
    lags: list[float],
    wgrad: list[float],
    ends: list[float],
    starts: list[float],
) -> SequentialTiming:
    """Zero-bubble timing: a rank runs its oldest deferred W whenever its next block would wait, keeps at
    most ``pp - 1`` pending and runs the rest at the end (the composer's rule, rank by rank)."""
    pp = plan.pp
    free = [0.0] * pp
    pending = [0] * pp
    weight = [wgrad[v] for v in plan.rank_vstage]  # each rank's W (one virtual stage per rank)
    cap = pp - 1
    runs: list[list[tuple[float, float]]] = [[] for _ in range(pp)]
    for i in plan.sequence:
        r = plan.rank[i]
        ready = ends[plan.cross[i]] + lags[plan.lag[i]]
        f, p, w = free[r], pending[r], weight[r]
        while p > 0 and f < ready:  # the next block would wait: run the oldest deferred W first
            after = f + w
            runs[r].append((f, after))
            f, p = after, p - 1
        start = _max(ready, f)
        end = start + durations[plan.duration[i]]
        starts[i] = start
        ends[i] = end
        p += plan.kind[i] == B
        if p > cap:  # too many pending: the oldest W runs right away
            after = end + w
            runs[r].append((end, after))
            p -= 1
        else:
            after = end
        free[r], pending[r] = after, p
    for r in range(pp):  # the rest run when the rank has nothing else to do
        while pending[r] > 0:
            after = free[r] + weight[r]
            runs[r].append((free[r], after))
            free[r], pending[r] = after, pending[r] - 1
    return SequentialTiming(plan, starts, ends, tuple(free), runs)
