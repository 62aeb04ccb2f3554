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
from dataclasses import dataclass, is_dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import numpy as np

Block = tuple[str, int, int]  # (kind, virtual stage, micro-batch)
# a schedule's orders as columns, rank-major and each rank's blocks in run order: kind (0 forward, 1 backward),
# virtual stage, micro-batch (int64 arrays), and the number of blocks of each rank
Columns = tuple["np.ndarray", "np.ndarray", "np.ndarray", list[int]]


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


def dualpipe(pp: int, m: int, vpp: int = 1) -> list[list[Block]]:
    """DualPipe (DeepSeek-V3, arXiv:2412.19437 sec. 3.2.1, Fig. 5): micro-batches enter from both ends.

    Half of the ``m`` micro-batches (ids ``0 .. m/2-1``) run the stages from rank 0 to rank ``pp-1``,
    the other half (ids ``m/2 ..``) from rank ``pp-1`` back to rank 0 through a second copy of the
    model, so rank ``r`` holds stage ``r`` and stage ``pp-1-r`` (two copies of the weights). For a
    rank at distance ``h = min(r, pp-1-r)`` from its nearer end, its "near" direction is the one where it
    is stage ``h``, its "far" one where it is stage ``pp-1-h``. In the figure's phases a rank runs:
    ``2(pp/2-h-1)`` near forwards; ``h+1`` near-far forward pairs; ``pp/2-h-1`` times a far backward
    and a far forward; in the steady state ``m/2-pp+h+1`` times (near forward with far backward, far
    forward with near backward) overlapped chunk pairs; ``pp/2-h-1`` times a far backward then a far
    forward with a near backward; ``h+1`` times a far and a near backward; the last ``pp/2-h-1`` near
    backwards. A pair runs as one unit (``fused_pairs``: its forward waits on both inputs). Each backward
    here is whole: the paper's zero-bubble split of weight gradients (``-3W`` in its bubble) is not taken,
    so the bubble is ``(pp/2-1)(F&B + B)`` (F&B: the pair, whose EP all-to-alls hide, ``paired``).
    """
    if problem := dualpipe_unfit(pp, m, vpp):
        raise ScheduleError(problem)
    return [_dualpipe_rank(pp, m, r) for r in range(pp)]


def _dualpipe_rank(pp: int, m: int, r: int) -> list[Block]:
    """One rank's DualPipe orders: the phases as (kind, side) steps, "n" near and "f" far."""
    half, per_side = pp // 2, m // 2
    h = min(r, pp - 1 - r)
    rest = half - h - 1
    steps = (
        ["Fn"] * (2 * rest)
        + ["Fn", "Ff"] * (h + 1)
        + ["Bf", "Ff"] * rest
        + ["Fn", "Bf", "Ff", "Bn"] * (per_side - pp + h + 1)
        + ["Bf", "Ff", "Bn"] * rest
        + ["Bf", "Bn"] * (h + 1)
        + ["Bn"] * rest
    )
    stage = {"n": h, "f": pp - 1 - h}  # the stage this rank runs in each direction
    first = {"n": 0, "f": per_side} if r < half else {"n": per_side, "f": 0}  # each direction's micro-batch ids
    done = dict.fromkeys(("Fn", "Ff", "Bn", "Bf"), 0)
    seq: list[Block] = []
    for step in steps:
        kind, side = step[0], step[1]
        seq.append((kind, stage[side], first[side] + done[step]))
        done[step] += 1
    return seq


def dualpipe_unfit(pp: int, m: int, vpp: int = 1) -> str:
    """Why DualPipe cannot run ``m`` micro-batches on ``pp`` ranks ('' when it can): it needs an even
    number of ranks (two directions meet in the middle), one chunk per rank and direction, and at
    least ``pp`` micro-batches from each end to reach its steady state."""
    if vpp != 1:
        return f"the dualpipe schedule runs one chunk per rank and direction, not vpp={vpp}"
    if pp < 2 or pp % 2:
        return f"the dualpipe schedule needs an even pp >= 2, got pp={pp}"
    if m % 2 or m < 2 * pp:
        return f"the dualpipe schedule needs an even number of micro-batches >= 2*pp = {2 * pp}, got {m}"
    return ""


def dualpipe_paired(rank: int, pp: int, vpp: int, m: int) -> float:
    """Share of a rank's backwards that DualPipe runs as an overlapped forward-and-backward chunk pair
    (:func:`dualpipe`): two per steady-state round, one per round of its cool-down's first phase."""
    h = min(rank, pp - 1 - rank)
    pairs = 2 * (m // 2 - pp + h + 1) + (pp // 2 - h - 1)
    return max(0, pairs) / m if m else 0.0


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
    # why the schedule cannot run (pp, micro-batches, vpp) ('' when it can; None: any shape)
    unfit: Callable[[int, int, int], str] | None = None
    # share of a rank's backwards run as an overlapped forward-and-backward pair of two micro-batches, by
    # (rank, pp, vpp, micro-batches): the EP all-to-alls hide under the other's compute (None: no pairs)
    paired: Callable[[int, int, int, int], float] | None = None
    searched: bool = True  # part of a layout search's default space
    # a forward directly followed by a backward of another stage runs with it as one unit (DualPipe's pairs)
    fused_pairs: bool = False
    # ``orders`` as :data:`Columns`, the same blocks in the same order (None: the plan reads them from ``orders``)
    columns: Callable[[int, int, int], Columns] | None = None


#: :func:`on_stages`' one-stage copies by the identity of the registered schedule (kept with it: ids stay unique)
_WHOLE_BACKWARD: dict[int, tuple[Schedule, Schedule]] = {}


def on_stages(schedule: Schedule, pp: int) -> Schedule:
    """``schedule`` as it runs on ``pp`` pipeline stages.

    With one stage there is no bubble for a zero-bubble schedule's deferred weight gradients to fill, and
    frameworks run no pipeline at all (Megatron-LM's ``forward_backward_no_pipelining``): the backward stays
    whole, as in 1F1B. Splitting it there would only delay the gradients' data-parallel reduction.
    """
    # a plugin's schedule object may predate the field, or be no dataclass: it runs as it is
    if pp > 1 or not getattr(schedule, "split_backward", False) or not is_dataclass(schedule):
        return schedule
    kept = _WHOLE_BACKWARD.get(id(schedule))
    if kept is None or kept[0] is not schedule:
        kept = _WHOLE_BACKWARD[id(schedule)] = (schedule, replace(schedule, split_backward=False))
    return kept[1]


def _alternating(pp: int, total: int, warm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's kind and block number ``k`` (``(pp, 2 total)`` arrays) of a warm-up / alternate / drain order:
    rank ``r`` runs ``warm[r]`` forwards, then a forward and a backward in turn, then the remaining backwards.

    That is the loop of :func:`one_f_one_b` and :func:`interleaved` written per position ``p`` of a rank's
    ``2 total`` blocks: the forward numbered ``p`` in the warm-up, ``warm + q/2`` (``q = p - warm`` even) or the
    backward ``q/2`` (odd) in the steady state, and the backward ``p - total`` in the drain.
    """
    import numpy as np

    p = np.arange(2 * total, dtype=np.int64)[None, :]
    w = warm[:, None]
    q = p - w
    steady = (p >= w) & (p < 2 * total - w)
    kind = np.where(steady, q & 1, (p >= w).astype(np.int64))
    k = np.where(p < w, p, np.where(steady, np.where(q & 1, q >> 1, w + (q >> 1)), p - total))
    return kind, k


def _columns_of(kind: np.ndarray, vstage: np.ndarray, micro: np.ndarray) -> Columns:
    pp, width = kind.shape
    return kind.ravel(), vstage.ravel(), micro.ravel(), [width] * pp


def one_f_one_b_columns(pp: int, m: int, vpp: int = 1) -> Columns:
    """:func:`one_f_one_b`'s orders as columns, without a Python tuple per block (a full-space search plans
    millions of blocks)."""
    import numpy as np

    ranks = np.arange(pp, dtype=np.int64)
    kind, j = _alternating(pp, m, np.minimum(pp - ranks - 1, m))
    return _columns_of(kind, np.broadcast_to(ranks[:, None], kind.shape), j)


def gpipe_columns(pp: int, m: int, vpp: int = 1) -> Columns:
    """:func:`gpipe`'s orders as columns."""
    import numpy as np

    kind, j = _alternating(pp, m, np.full(pp, m, np.int64))  # all warm-up then all drain: GPipe
    return _columns_of(kind, np.broadcast_to(np.arange(pp, dtype=np.int64)[:, None], kind.shape), j)


def interleaved_columns(pp: int, m: int, vpp: int = 1) -> Columns:
    """:func:`interleaved`'s orders as columns: block ``k`` of a kind maps to its chunk and micro-batch as there."""
    import numpy as np

    if vpp == 1:
        return one_f_one_b_columns(pp, m)
    total = m * vpp
    ranks = np.arange(pp, dtype=np.int64)
    kind, k = _alternating(pp, total, np.minimum(2 * (pp - ranks - 1) + (vpp - 1) * pp, total))
    chunk = (k // pp) % vpp
    chunk = np.where(kind == 1, vpp - 1 - chunk, chunk)
    return _columns_of(kind, chunk * pp + ranks[:, None], (k // (pp * vpp)) * pp + k % pp)


def _one_f_one_b_or_interleaved(pp: int, m: int, vpp: int = 1) -> list[list[Block]]:
    """1F1B; with ``vpp > 1`` model chunks per rank it is Megatron-LM's interleaved 1F1B."""
    return interleaved(pp, m, vpp) if vpp > 1 else one_f_one_b(pp, m)


BUILTIN_SCHEDULES = (
    Schedule("1f1b", _one_f_one_b_or_interleaved, interleaved=True,
             description="PipeDream-flush 1F1B; interleaved with --vpp > 1", columns=interleaved_columns),
    Schedule("gpipe", gpipe, description="all forwards, then all backwards (GPipe)", columns=gpipe_columns),
    Schedule("interleaved", interleaved, interleaved=True, description="Megatron-LM interleaved 1F1B",
             columns=interleaved_columns),
    Schedule("zb-h1", zero_bubble_h1, split_backward=True,
             description="zero-bubble ZB-H1: weight gradients deferred into the bubble", columns=one_f_one_b_columns),
    # opt-in for a search: two copies of the weights per rank, and the pairs' overlap is its own model
    Schedule("dualpipe", dualpipe, unfit=dualpipe_unfit, paired=dualpipe_paired, searched=False, fused_pairs=True,
             description="DeepSeek-V3 DualPipe: both directions, overlapped forward-backward pairs"),
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
