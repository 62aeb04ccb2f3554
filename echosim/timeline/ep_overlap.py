"""Megatron-Core's combined 1F1B (``--overlap-moe-expert-parallel-comm``): one micro-batch's
expert-parallel all-to-alls run beside the adjacent micro-batch's computation.

The documented schedule (docs/user-guide/features/moe_a2a_overlap.md, Megatron-LM commit fc81b20,
"Combined 1F1B: Expert-Parallel All-to-All Overlap") pairs the forward of micro-batch ``i+1`` with
the backward of micro-batch ``i``, layer by layer, on a compute and a communication stream. For one
paired MoE layer it issues, each node waiting only on its own micro-batch's previous node::

    F.attn     | B.combine        (compute | communication)
    B.expert   | F.dispatch
    F.expert   | B.dispatch
    B.attn     | F.combine

So each all-to-all hides under the other micro-batch's compute of the same row, and the pair takes
``max(fa, bc) + max(be, fd) + max(fe, bd) + max(ba, fc)`` where ``fe`` / ``be`` are the routed-expert
compute between a layer's two all-to-alls and ``fa`` / ``ba`` the rest of its compute. While a row's
compute ``x`` and all-to-all ``y`` overlap (for ``min(x, y)``), both slow by the backend's
:class:`~echosim.backends.base.OverlapModel` (compute by ``compute_slowdown``: the SMs NCCL holds), so a
row takes ``max(x + min(x, y)(s_compute - 1), y + min(x, y)(s_comm - 1))`` instead of ``x + y``. The pair
never saves more than the all-to-all time the units leave exposed.

Only steady-state pairs overlap: the schedule moves one more forward into warm-up, so a pipeline
rank runs ``(pp - rank - 1) * 2 + (vpp - 1) * pp + 1`` forwards alone
(Megatron's interleaved warm-up, megatron/core/pipeline_parallel/schedules.py, plus that one; one
with pp = 1) and as many backwards alone at the end. Megatron requires ep > 1, the alltoall or flex
dispatcher, and virtual pipeline stages when pp > 1 (the page's hard requirements).

Not modelled: ``--delay-wgrad-compute`` (the recipes set it with the overlap; it moves expert weight
gradients later, which lengthens ``be``'s cover only when ``fd`` exceeds it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from echosim.backends.base import OverlapModel
from echosim.timeline.streams import COMPUTE, UnitTiming

EP_CATEGORY = "comm.ep"


def windows(unit: UnitTiming) -> tuple[float, float, float, float]:
    """(first all-to-alls, second all-to-alls, compute outside them, compute between them) of one unit.

    A MoE layer's forward runs dispatch then combine, its backward the combine's gradient then the
    dispatch's; the expert compute lies between each pair. Several MoE layers in one unit pair up in order.
    """
    ep = sorted((e for e in unit.events if e.category == EP_CATEGORY), key=lambda e: e.start)
    comp = [e for e in unit.events if e.stream == COMPUTE and e.duration > 0]
    first, second = ep[0::2], ep[1::2]
    inner = 0.0
    for a, b in zip(first, second, strict=False):
        lo, hi = a.start + a.duration, b.start
        inner += sum(max(0.0, min(hi, e.start + e.duration) - max(lo, e.start)) for e in comp)
    total = sum(e.duration for e in comp)
    return sum(e.duration for e in first), sum(e.duration for e in second), total - inner, inner


def exposed_ep(unit: UnitTiming, times: int) -> float:
    """Seconds of EP all-to-all that ``times`` back-to-back runs of the unit leave exposed (the report's
    breakdown shares exposed time among collective kinds in proportion to their load)."""
    if times <= 0:
        return 0.0
    comm = {k: v for k, v in unit.busy.items() if k.startswith("comm.")}
    total = sum(comm.values())
    if not total or not comm.get(EP_CATEGORY):
        return 0.0
    run = (times - 1) * unit.period + unit.duration
    return max(0.0, run - unit.compute_busy * times) * comm[EP_CATEGORY] / total


def row_saving(compute: float, comm: float, overlap: OverlapModel) -> float:
    """Seconds saved by running ``compute`` and an all-to-all of ``comm`` seconds side by side, not in turn."""
    both = min(compute, comm)
    side = max(compute + both * (overlap.compute_slowdown - 1.0), comm + both * (overlap.comm_slowdown - 1.0))
    return max(0.0, compute + comm - side)


def hidden_per_pair(
    fwd_layer: tuple[UnitTiming, int], bwd_layer: tuple[UnitTiming, int], overlap: OverlapModel
) -> float:
    """Seconds one steady-state (forward i+1, backward i) pair of a chunk saves: the repeated layer's
    all-to-alls beside the other micro-batch's compute (closed form above), capped by what is exposed."""
    (f, k), (b, kb) = fwd_layer, bwd_layer
    if k <= 0 or k != kb:
        return 0.0
    fd, fc, fa, fe = windows(f)
    bc, bd, ba, be = windows(b)
    rows = ((fa, bc), (be, fd), (fe, bd), (ba, fc))
    pair = sum(row_saving(x, y, overlap) for x, y in rows)
    return min(pair * k, exposed_ep(f, k) + exposed_ep(b, k))


def paired_fraction(rank: int, pp: int, vpp: int, microbatches: int) -> float:
    """Share of a pipeline rank's backward blocks that run paired with an independent forward."""
    blocks = microbatches * vpp
    if blocks <= 0:
        return 0.0
    alone = 1 if pp == 1 else (pp - rank - 1) * 2 + (vpp - 1) * pp + 1
    return max(0, blocks - alone) / blocks


def stage_hidden(
    fwd_units: Sequence[tuple[UnitTiming, int]],
    bwd_units: Sequence[tuple[UnitTiming, int]],
    overlap: OverlapModel,
    rank: int,
    pp: int,
    vpp: int,
    microbatches: int,
    paired: Callable[[int, int, int, int], float] | None = None,
) -> float:
    """Seconds per micro-batch, on average over the step, that the overlap takes off a chunk's backward;
    ``paired`` is the schedule's own share of paired backwards (default: Megatron's combined 1F1B).
    ``bwd_units``: the backward's before / block / after units (:meth:`StageCost.units` ``"B"``)."""
    if len(fwd_units) < 2 or len(bwd_units) < 2:
        return 0.0
    share = (paired or paired_fraction)(rank, pp, vpp, microbatches)
    (f, k), blocks = fwd_units[1], bwd_units[1:-1]
    if len(blocks) == 1:
        return hidden_per_pair((f, k), blocks[0], overlap) * share
    # under full:N the backward's layers run as two units (those that keep their activations, then those that
    # replay): each pairs with as many of the other micro-batch's forward layers
    return sum(hidden_per_pair((f, kb), (b, kb), overlap) for b, kb in blocks) * share
