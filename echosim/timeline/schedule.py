"""Pipeline schedules: the order in which each pipeline rank runs micro-batch blocks.

A schedule gives, per rank, a list of ``(kind, vstage, microbatch)`` blocks: ``F``
forward, ``B`` backward (or, for zero-bubble schedules, the input-gradient half of it)
and ``W`` the weight-gradient half. ``vstage`` is the virtual stage (model chunk
``c`` of rank ``r`` is ``c * pp + r``; without interleaving it is the rank). The
composer times the blocks with cross-stage dependencies (a forward needs the previous
virtual stage's forward of the same micro-batch, a backward the next one's backward)
plus the point-to-point transfer on each edge (:mod:`echosim.timeline.composer`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

Block = tuple[str, int, int]  # (kind, virtual stage, micro-batch)


class ScheduleError(RuntimeError):
    """Orders that cannot run: a block waits on one that never runs, or two wait on each other."""


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
