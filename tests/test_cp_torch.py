"""Context parallelism as PyTorch's experimental ``context_parallel`` runs it (torchtitan 2024-2025)."""

from __future__ import annotations

import pytest
from conftest import TINY_LLAMA, capture

from echosim.backends.devices import DEVICES
from echosim.backends.gpu import GPUBackend
from echosim.frontend.zoo import ArchConfig
from echosim.ir import Graph, verify
from echosim.ir.ops import AttentionAttrs, Axis, CollectiveAttrs, OpKind, Phase
from echosim.ir.types import DType
from echosim.passes.autodiff import Autodiff
from echosim.passes.base import run_passes
from echosim.passes.context_parallel import ContextParallel, ContextParallelBackward
from echosim.passes.pipeline import Stage
from echosim.passes.plugin import _context, _context_backward
from echosim.plan import Plan, plan_with_defaults
from echosim.timeline.lower import StepOptions, lower_stage
from echosim.timeline.placement import Degrees, axis_placements
from echosim.timeline.schedule import BUILTIN_SCHEDULES


def _cp(g: Graph, phase: Phase) -> list:
    return [
        n
        for n in g
        if n.phase is phase and isinstance(n.attrs, CollectiveAttrs) and n.attrs.axis is Axis.CP and g.block_of(n)
    ]


def _torch(cp: int, comm: str = "all_gather", waited: bool = True, seq: int = 64) -> Graph:
    passes = [ContextParallel(cp, comm, torch=True, waited=waited), Autodiff(), ContextParallelBackward(torch=True)]
    return run_passes(capture(TINY_LLAMA.with_(seq_len=seq)), passes)


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_allgather_rotater_gathers_query_head_kv_once_and_rings_fp32_grads(cp: int) -> None:
    g = _torch(cp)
    verify(g)
    local = 64 // cp
    # repeat_kv: K and V reach SDPA with the query heads (4), not the kv heads (2); fp16
    chunk = 2 * TINY_LLAMA.heads * TINY_LLAMA.dim_head * local * 2
    (gather,) = _cp(g, Phase.FORWARD)
    assert gather.op is OpKind.ALL_GATHER and gather.attrs.bytes == cp * chunk and gather.attrs.blocking
    bwd = _cp(g, Phase.BACKWARD)
    assert sorted(n.op.value for n in bwd) == ["all_gather", "recv"]  # K/V gathered again; no reduce_scatter
    (grads,) = [n for n in bwd if n.op is OpKind.RECV]
    assert grads.attrs.pieces == (2 * chunk,) * cp  # one permute of the fp32 dK/dV accumulator per step
    attention = [n for n in g if n.phase is Phase.FORWARD and isinstance(n.attrs, AttentionAttrs)]
    assert len(attention) == cp


def test_alltoall_rotater_rings_query_head_kv_and_fp32_grads() -> None:
    cp = 4
    g = _torch(cp, "p2p")
    chunk = 2 * TINY_LLAMA.heads * TINY_LLAMA.dim_head * (64 // cp) * 2
    fwd, bwd = _cp(g, Phase.FORWARD), _cp(g, Phase.BACKWARD)
    assert [n.attrs.bytes for n in fwd] == [chunk] * (cp - 1)
    grads = sorted(n.attrs.bytes for n in bwd)
    assert grads == [chunk] * (cp - 1) + [2 * chunk] * (cp - 1)  # K/V again, then fp32 dK/dV


def test_transformer_engine_ring_is_unchanged() -> None:
    """Megatron's CP (TE) keeps the kv-head chunks, bf16 gradients and the comm stream."""
    g = run_passes(capture(TINY_LLAMA.with_(seq_len=64)), [ContextParallel(4), Autodiff(), ContextParallelBackward()])
    kv = 2 * TINY_LLAMA.n_kv_heads * TINY_LLAMA.dim_head * 16 * 2
    assert all(n.attrs.bytes == kv and not n.attrs.blocking for n in _cp(g, Phase.FORWARD) + _cp(g, Phase.BACKWARD))


def test_framework_selects_the_torch_ring() -> None:
    tt = plan_with_defaults(Plan(cp=4), {"framework": "torchtitan-2025-compile"})
    assert tt.cp_comm == "all_gather"  # torchtitan's default rotate method
    assert _context(tt) == ContextParallel(4, "all_gather", True, True, True)
    assert _context_backward(tt) == ContextParallelBackward(torch=True)
    eager = plan_with_defaults(Plan(cp=4), {"framework": "torchtitan-2025"})
    assert _context(eager) == ContextParallel(4, "all_gather", True, True, False)
    mcore = plan_with_defaults(Plan(cp=4), {"framework": "megatron"})
    assert _context(mcore) == ContextParallel(4, mcore.cp_comm, True, False, False)
    assert _context_backward(mcore) == ContextParallelBackward(torch=False)


def test_compiled_gather_runs_in_line_eager_hides_behind_the_diagonal_step() -> None:
    """Compiled, the gather is waited on where it is issued: its time adds to the attention's. Eager, it
    runs beside the diagonal step and only the later steps wait for it."""
    cfg = ArchConfig("llama", layers=2, hidden=4096, heads=32, kv_heads=8, vocab=32000, ffn=14336, seq_len=32768)
    backend = GPUBackend(DEVICES["h100-sxm"])
    exposed = {}
    for waited in (True, False):
        passes = [
            ContextParallel(4, "all_gather", torch=True, waited=waited),
            Autodiff(),
            ContextParallelBackward(True),
        ]
        g = run_passes(capture(cfg, dtype=DType.BF16), passes)
        t = lower_stage(
            Stage(0, g, 2), backend, axis_placements(Degrees(cp=4), 8), StepOptions(BUILTIN_SCHEDULES[0]), (0,)
        )
        unit = t.fwd_units[1][0]
        exposed[waited] = (unit.duration - unit.compute_busy, unit.busy["comm.cp"])
    in_line, comm = exposed[True]
    assert in_line == pytest.approx(comm, rel=1e-6) and comm > 0
    assert exposed[False][0] < 0.2 * comm  # the diagonal step slowed by the gather beside it
