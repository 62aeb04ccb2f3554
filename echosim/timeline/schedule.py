"""Pipeline schedules: the order in which each stage runs micro-batch blocks.

A schedule is a list of ``("F" | "B", microbatch)`` per stage; the composer times
it with cross-stage dependencies (a forward needs the previous stage's forward of
the same micro-batch, a backward the next stage's backward) plus the
point-to-point transfer on each edge.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Block = tuple[str, int]


def one_f_one_b(pp: int, m: int) -> list[list[Block]]:
    """PipeDream-flush 1F1B (Narayanan et al. 2021): warm-up forwards, then alternate."""
    orders = []
    for stage in range(pp):
        warm = min(pp - stage - 1, m)
        seq: list[Block] = [("F", j) for j in range(warm)]
        f, b = warm, 0
        while f < m:
            seq.append(("F", f))
            seq.append(("B", b))
            f, b = f + 1, b + 1
        seq.extend(("B", j) for j in range(b, m))
        orders.append(seq)
    return orders


def gpipe(pp: int, m: int) -> list[list[Block]]:
    """All forwards, then all backwards (Huang et al. 2019)."""
    return [[("F", j) for j in range(m)] + [("B", j) for j in range(m)] for _ in range(pp)]


SCHEDULES = {"1f1b": one_f_one_b, "gpipe": gpipe}


def in_flight(schedule: str, pp: int, m: int, stage: int) -> int:
    """Micro-batches whose activations a stage holds at its peak."""
    if schedule == "gpipe":
        return m
    return min(pp - stage, m)


@dataclass(frozen=True)
class BlockTime:
    stage: int
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
) -> list[BlockTime]:
    """Time every block; ``p2p_*[i]`` is the transfer from stage i to its neighbour."""
    pp = len(orders)
    done: dict[tuple[str, int, int], float] = {}
    pos = [0] * pp
    free = [0.0] * pp
    out: list[BlockTime] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(pp):
            while pos[s] < len(orders[s]):
                kind, j = orders[s][pos[s]]
                if kind == "F":
                    dep = 0.0 if s == 0 else done.get(("F", s - 1, j))
                    dep = dep if s == 0 or dep is None else dep + p2p_fwd[s - 1]
                    own = None
                else:
                    dep = done.get(("F", s, j)) if s == pp - 1 else done.get(("B", s + 1, j))
                    if dep is not None and s != pp - 1:
                        dep += p2p_bwd[s + 1]
                    own = done.get(("F", s, j))
                    if own is None:
                        dep = None
                if dep is None:
                    break
                start = max(free[s], dep)
                end = start + (fwd[s] if kind == "F" else bwd[s])
                done[(kind, s, j)] = free[s] = end
                out.append(BlockTime(s, kind, j, start, end))
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline schedule deadlocked: a block waits on one that never runs")
    return out
