"""ZeRO-3 as DeepSpeed ran it in 2021 (framework ``deepspeed-2021``): per-parameter collectives, each one
behind a device-wide synchronize, through PyTorch's list collectives (one copy kernel per rank)."""

from __future__ import annotations

import pytest

from echosim.backends.devices import A100_80GB
from echosim.backends.gpu import GPUBackend
from echosim.frameworks import get_framework
from echosim.ir import Graph
from echosim.ir.ops import CollectiveAttrs, OpKind, Phase
from echosim.passes.autodiff import Autodiff
from echosim.passes.base import run_passes
from echosim.passes.data_parallel import DEEPSPEED_MAX_REUSE_DISTANCE, DataParallel
from echosim.plan import Plan
from echosim.timeline.lower import Coster
from echosim.timeline.placement import Degrees, axis_placements
from echosim.timeline.streams import simulate_unit


def _fsdp(g: Graph) -> list:
    return [n for n in g if n.name.startswith("fsdp.")]


def test_per_parameter_collectives_are_blocking_list_collectives(tiny_llama: Graph) -> None:
    """One all_gather per parameter in forward and in backward, one reduce_scatter per gradient: the same
    bytes as the per-layer form, split by tensor."""
    layer = run_passes(tiny_llama, [Autodiff(), DataParallel(4, zero=3)])
    param = run_passes(tiny_llama, [Autodiff(), DataParallel(4, zero=3, per_param=True)])
    gathers = [n for n in _fsdp(param) if n.op is OpKind.ALL_GATHER]
    scatters = [n for n in _fsdp(param) if n.op is OpKind.REDUCE_SCATTER]
    assert len(scatters) == len(run_passes(tiny_llama, [Autodiff()]).grads) and len(gathers) == 2 * len(scatters)
    for kind in (OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER):
        assert sum(n.attrs.bytes for n in _fsdp(param) if n.op is kind) == sum(
            n.attrs.bytes for n in _fsdp(layer) if n.op is kind
        )
    assert all(n.attrs.blocking and n.attrs.rank_copies for n in _fsdp(param))
    assert not any(n.attrs.blocking or n.attrs.rank_copies for n in _fsdp(layer))


def test_recompute_regathers_what_the_reuse_distance_releases(tiny_llama: Graph) -> None:
    """Parameters are released after the recompute forward unless the sub-modules run before their backward
    (each twice: recompute and backward) hold fewer parameters than stage3_max_reuse_distance."""
    base = run_passes(tiny_llama, [Autodiff()])
    order = [base[p] for p in base.grads]  # backward order, as the pass walks a layer
    layer = next(n.scope.rsplit(".", 2)[0] for n in order if n.scope.startswith("layers."))
    mine = [n for n in order if n.scope.startswith(layer + ".")]
    first, second = mine[0].scope, next(n.scope for n in mine if n.scope != mine[0].scope)
    before_second = 2 * sum(n.out.numel for n in mine if n.scope == first)
    kept = run_passes(tiny_llama, [Autodiff(), DataParallel(4, zero=3, per_param=True, reuse_distance=10**12)])
    assert not [n for n in _fsdp(kept) if n.phase is Phase.RECOMPUTE]
    tight = DataParallel(4, zero=3, per_param=True, reuse_distance=before_second)
    again = [n for n in _fsdp(run_passes(tiny_llama, [Autodiff(), tight])) if n.phase is Phase.RECOMPUTE]
    # per layer: every parameter but those of the sub-module recomputed last (it stays gathered)
    assert len([n for n in again if n.scope == layer]) == len(mine) - len([n for n in mine if n.scope == first])
    assert second != first and all(n.scope.startswith("layers.") for n in again)  # not the embeddings
    assert DEEPSPEED_MAX_REUSE_DISTANCE == 1_000_000_000


def test_a_blocking_collective_runs_in_line_with_compute(tiny_llama: Graph) -> None:
    """The per-layer gathers hide under compute; the same bytes behind a synchronize add to the unit."""
    backend = GPUBackend(A100_80GB)

    def unit(per_param: bool) -> tuple[float, float, float]:
        g = run_passes(tiny_llama, [Autodiff(), DataParallel(16, zero=3, per_param=per_param)])
        cost = Coster(g, backend, axis_placements(Degrees(dp=16), 8))
        nodes = [n for n in g if n.phase is Phase.FORWARD]
        t = simulate_unit(g, nodes, cost, backend.overlap())
        comm = sum(cost(n) for n in nodes if n.op.is_collective)
        comp = sum(cost(n) for n in nodes if not n.op.is_collective)
        return t.critical_end, comm, comp

    end, comm, comp = unit(True)
    assert end == pytest.approx(comm + comp, rel=1e-9)
    layer_end, layer_comm, layer_comp = unit(False)
    assert layer_comp == pytest.approx(comp) and layer_end < layer_comm + layer_comp


def test_list_collectives_pay_one_copy_kernel_per_rank(tiny_llama: Graph) -> None:
    """ProcessGroupNCCL's list all_gather copies each rank's slice out of the flat buffer: n kernels."""
    backend = GPUBackend(A100_80GB)
    g = run_passes(tiny_llama, [Autodiff(), DataParallel(64, zero=3, per_param=True)])
    cost = Coster(g, backend, axis_placements(Degrees(dp=64), 8))
    node = max((n for n in _fsdp(g) if n.op is OpKind.ALL_GATHER), key=lambda n: n.attrs.bytes)
    a = node.attrs
    assert isinstance(a, CollectiveAttrs)
    nccl = backend.collective_time_s(OpKind.ALL_GATHER, a.bytes, axis_placements(Degrees(dp=64), 8)[a.axis])
    copies = cost(node) - nccl
    assert copies == pytest.approx(cost.rank_copies(node)) and copies > 64 * A100_80GB.kernel_overhead_us * 1e-6


def test_framework_entry_and_row_selection() -> None:
    from echosim.passes.plugin import _data_parallel
    from echosim.validation.cases import read_cases
    from echosim.validation.rows import row_framework

    ds = get_framework("deepspeed-2021")
    assert "torch.cuda.synchronize()" in ds.zero3_per_param and "#1188" in ds.zero3_per_param
    assert ds.defaults == get_framework("megatron-2022").defaults  # the Megatron-LM (2021) model code
    dp = _data_parallel(Plan(dp=8, zero=3, framework="deepspeed-2021", recompute="full"))
    assert dp.per_param and dp.reuse_distance == DEEPSPEED_MAX_REUSE_DISTANCE
    assert _data_parallel(Plan(dp=8, zero=3, framework="deepspeed-2021")).reuse_distance == 0
    assert not _data_parallel(Plan(dp=8, zero=3, framework="megatron-2022")).per_param
    from conftest import SHARED

    path = SHARED / "validation" / "cases.csv"
    if not path.exists():
        pytest.skip("shared/validation not present")
    rows = [c for c in read_cases(path) if c["source_id"] == "narayanan2021"]
    chosen = {row_framework(c) for c in rows if c.int("zero") == 3}
    assert chosen == {"deepspeed-2021"}
    assert {row_framework(c) for c in rows if c.int("zero") != 3} == {"megatron-2022"}
