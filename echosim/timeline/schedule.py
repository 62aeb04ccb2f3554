"""Pipeline schedules: the order in which each pipeline rank runs micro-batch blocks.

A schedule gives, per rank, a list of ``(kind, vstage, microbatch)`` blocks: ``F``
forward, ``B`` backward (or, for zero-bubble schedules, the input-gradient half of it)
and ``W`` the weight-gradient half. ``vstage`` is the virtual stage (model chunk
``c`` of rank ``r`` is ``c * pp + r``; without interleaving it is the rank). The
composer times the blocks with cross-stage dependencies (a forward needs the previous
virtual stage's forward of the same micro-batch, a backward the next one's backward)
plus the point-to-point transfer on each edge.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

Block = tuple[str, int, int]  # (kind, virtual stage, micro-batch)


def one_f_one_b(pp: int, m: int, vpp: int = 1) -> list[list[Block]]:
    """PipeDream-flush 1F1B (Narayanan et al. 2021): warm-up forwards, then alternate."""
    orders = []
    for r in range(pp):
        warm = min(pp - r - 1, m)
        seq: list[Block] = [("F", r, j) for j in range(warm)]
        f, b = warm, 0
        while f < m:
            seq += [("F", r, f), ("B", r, b)]
            f, b = f + 1, b + 1
        seq += [("B", r, j) for j in range(b, m)]
        orders.append(seq)
    return orders


def gpipe(pp: int, m: int, vpp: int = 1) -> list[list[Block]]:
    """All forwards, then all backwards (Huang et al. 2019)."""
    return [[("F", r, j) for j in range(m)] + [("B", r, j) for j in range(m)] for r in range(pp)]


def interleaved(pp: int, m: int, vpp: int = 1) -> list[list[Block]]:
    """Megatron-LM's interleaved 1F1B (Narayanan et al. 2021, sec. 2.2): ``vpp`` chunks per rank.

    Micro-batches advance in groups of ``pp`` through the chunks; rank ``r`` warms up
    with ``2 (pp - r - 1) + (vpp - 1) pp`` forwards, then alternates, then drains.
    """
    if vpp == 1:
        return one_f_one_b(pp, m)
    total = m * vpp

    def fwd(k: int, r: int) -> Block:
        chunk = (k // pp) % vpp
        return ("F", chunk * pp + r, (k // (pp * vpp)) * pp + k % pp)

    def bwd(k: int, r: int) -> Block:
        chunk = vpp - 1 - (k // pp) % vpp
        return ("B", chunk * pp + r, (k // (pp * vpp)) * pp + k % pp)

    orders = []
    for r in range(pp):
        warm = min(2 * (pp - r - 1) + (vpp - 1) * pp, total)
        seq = [fwd(k, r) for k in range(warm)]
        f, b = warm, 0
        while f < total:
            seq += [fwd(f, r), bwd(b, r)]
            f, b = f + 1, b + 1
        seq += [bwd(k, r) for k in range(b, total)]
        orders.append(seq)
    return orders


def zero_bubble_h1(pp: int, m: int, vpp: int = 1) -> list[list[Block]]:
    """ZB-H1 (Qi et al. 2024): 1F1B's order; each backward's weight half is deferred.

    The composer runs a deferred ``W`` whenever the next block must wait, and keeps at
    most ``pp - 1`` of them pending (their inputs stay alive until they run).
    """
    return one_f_one_b(pp, m)


@dataclass(frozen=True)
class Schedule:
    """A pipeline schedule as the timeline uses it; built-ins and plugins register these.

    ``orders(pp, microbatches, vpp)`` gives each rank's blocks. ``interleaved``: it takes
    ``vpp > 1`` model chunks per rank. ``split_backward``: its ``B`` blocks are the
    input-gradient half and the composer defers the ``W`` halves (zero-bubble schedules).
    """

    name: str
    orders: Callable[[int, int, int], list[list[Block]]]
    interleaved: bool = False
    split_backward: bool = False
    description: str = ""


def _one_f_one_b_or_interleaved(pp: int, m: int, vpp: int = 1) -> list[list[Block]]:
    """1F1B; with ``vpp > 1`` model chunks per rank it is Megatron-LM's interleaved 1F1B."""
    return interleaved(pp, m, vpp) if vpp > 1 else one_f_one_b(pp, m)


BUILTIN_SCHEDULES = (
    Schedule("1f1b", _one_f_one_b_or_interleaved, interleaved=True,
             description="PipeDream-flush 1F1B; interleaved with --vpp > 1"),
    Schedule("gpipe", gpipe, description="all forwards, then all backwards (GPipe)"),
    Schedule("interleaved", interleaved, interleaved=True, description="Megatron-LM interleaved 1F1B"),
    Schedule("zb-h1", zero_bubble_h1, split_backward=True,
             description="zero-bubble ZB-H1: weight gradients deferred into the bubble"),
)  # fmt: skip


def in_flight(orders: Sequence[Sequence[Block]], rank: int) -> dict[int, int]:
    """Peak number of micro-batches per virtual stage whose activations rank ``rank`` holds."""
    live: dict[int, int] = {}
    peak: dict[int, int] = {}
    for kind, v, _ in orders[rank]:
        if kind == "F":
            live[v] = live.get(v, 0) + 1
            peak[v] = max(peak.get(v, 0), live[v])
        elif kind == "B":
            live[v] -= 1
    return peak


class BlockTime(NamedTuple):
    stage: int  # pipeline rank
    vstage: int
    kind: str
    microbatch: int
    start: float
    end: float


def compose(
    orders: Sequence[Sequence[Block]],
    fwd: Sequence[float],
    bwd: Sequence[float],
    p2p_fwd: Sequence[float],
    p2p_bwd: Sequence[float],
    wgrad: Sequence[float] | None = None,
) -> list[BlockTime]:
    """Time every block. ``*[v]`` are per virtual stage; ``p2p_*[v]`` leaves stage ``v``.

    With ``wgrad`` (zero-bubble), a ``B`` block is the input-gradient half and each
    rank runs its deferred weight halves in what would otherwise be idle time.
    """
    pp = len(orders)
    vstages = len(fwd)
    done: dict[tuple[str, int, int], float] = {}
    pos = [0] * pp
    free = [0.0] * pp
    pending: list[list[int]] = [[] for _ in range(pp)]  # deferred W: (vstage, mb) flattened
    cap = [pp - 1] * pp  # deferred W per rank; pp - 1 reproduces ZB-H1's closed form
    out: list[BlockTime] = []

    def ready(block: Block) -> float | None:
        kind, v, j = block
        if kind == "F":
            if v == 0:
                return 0.0
            t = done.get(("F", v - 1, j))
            return None if t is None else t + p2p_fwd[v - 1]
        own = done.get(("F", v, j))
        if own is None:
            return None
        if v == vstages - 1:
            return own
        t = done.get(("B", v + 1, j))
        return None if t is None else max(own, t + p2p_bwd[v + 1])

    durations = {"F": fwd, "B": bwd, "W": wgrad or bwd}

    def run(r: int, kind: str, v: int, j: int, start: float) -> None:
        end = start + durations[kind][v]
        done[(kind, v, j)] = free[r] = end
        out.append(BlockTime(r, v, kind, j, start, end))

    remaining = sum(len(o) for o in orders)
    if wgrad is None:  # fixed orders: sweep the ranks, each runs until it must wait
        while remaining:
            progressed = False
            for r in range(pp):
                while pos[r] < len(orders[r]):
                    t = ready(orders[r][pos[r]])
                    if t is None:
                        break
                    run(r, *orders[r][pos[r]], max(t, free[r]))
                    pos[r] += 1
                    remaining -= 1
                    progressed = True
            if not progressed:
                raise RuntimeError("pipeline schedule deadlocked: a block waits on one that never runs")
        return out
    while remaining or any(pending):  # zero-bubble: event order, deferred W fill the gaps
        best: tuple[float, int, str] | None = None
        for r in range(pp):
            if pos[r] < len(orders[r]):
                t = ready(orders[r][pos[r]])
                if t is not None and (best is None or max(t, free[r]) < best[0]):
                    best = (max(t, free[r]), r, "next")
                must_wait = t is None or t > free[r]
                if pending[r] and must_wait and (best is None or free[r] < best[0]):
                    best = (free[r], r, "w")
            elif pending[r] and (best is None or free[r] < best[0]):
                best = (free[r], r, "w")
        if best is None:
            raise RuntimeError("pipeline schedule deadlocked: a block waits on one that never runs")
        start, r, what = best
        if what == "w":
            v, j = pending[r].pop(0), pending[r].pop(0)
            run(r, "W", v, j, start)
            continue
        kind, v, j = orders[r][pos[r]]
        run(r, kind, v, j, start)
        pos[r] += 1
        remaining -= 1
        if kind == "B" and wgrad is not None:
            pending[r] += [v, j]
            if len(pending[r]) > 2 * cap[r]:  # over the memory cap: do the oldest W now
                v0, j0 = pending[r].pop(0), pending[r].pop(0)
                run(r, "W", v0, j0, free[r])
    return out
