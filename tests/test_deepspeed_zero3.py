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
    """The per-layer all_gathers and reduce_scatter stay (the memory model reads them), each now one
    collective per parameter tensor (``pieces``): the same bytes, split by tensor, blocking, list form."""
    layer = run_passes(tiny_llama, [Autodiff(), DataParallel(4, zero=3)])
    param = run_passes(tiny_llama, [Autodiff(), DataParallel(4, zero=3, per_param=True)])
    assert [(n.name, n.attrs.bytes) for n in _fsdp(param)] == [(n.name, n.attrs.bytes) for n in _fsdp(layer)]
    grads = run_passes(tiny_llama, [Autodiff()]).grads
    assert sum(len(n.attrs.pieces) for n in _fsdp(param) if n.op is OpKind.REDUCE_SCATTER) == len(grads)
    for n in _fsdp(param):
        assert n.attrs.blocking and n.attrs.rank_copies and sum(n.attrs.pieces) == n.attrs.bytes
    assert not any(n.attrs.blocking or n.attrs.rank_copies or n.attrs.pieces for n in _fsdp(layer))
    assert "pieces=" in str(_fsdp(param)[0].attrs) and "blocking rank_copies" in str(_fsdp(param)[0].attrs)


def test_recompute_regathers_what_the_reuse_distance_releases(tiny_llama: Graph) -> None:
    """Parameters are released after the recompute forward unless the sub-modules run before their backward
    (each twice: recompute and backward) hold fewer parameters than stage3_max_reuse_distance."""
    base = run_passes(tiny_llama, [Autodiff()])
    order = [base[p] for p in base.grads]  # backward order, as the pass walks a layer
    layer = next(n.scope.rsplit(".", 2)[0] for n in order if n.scope.startswith("layers."))
    mine = [n for n in order if n.scope.startswith(layer + ".")]
    first = mine[0].scope
    kept_first = [n for n in mine if n.scope == first]
    kept = run_passes(tiny_llama, [Autodiff(), DataParallel(4, zero=3, per_param=True, reuse_distance=10**12)])
    assert not [n for n in _fsdp(kept) if n.phase is Phase.RECOMPUTE]
    tight = DataParallel(4, zero=3, per_param=True, reuse_distance=2 * sum(n.out.numel for n in kept_first))
    again = [n for n in _fsdp(run_passes(tiny_llama, [Autodiff(), tight])) if n.phase is Phase.RECOMPUTE]
    # per layer: every parameter but those of the sub-module recomputed last (it stays gathered); not the embeddings
    mine_again = [n for n in again if n.scope == layer]
    assert len(mine_again) == 1 and len(mine_again[0].attrs.pieces) == len(mine) - len(kept_first)
    assert mine_again[0].attrs.bytes == sum(n.out.nbytes for n in mine[len(kept_first) :])
    assert all(n.scope.startswith("layers.") for n in again)
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
    """Each tensor's collective is priced alone, plus ProcessGroupNCCL's n copy kernels of its list form."""
    backend = GPUBackend(A100_80GB)
    g = run_passes(tiny_llama, [Autodiff(), DataParallel(64, zero=3, per_param=True)])
    where = axis_placements(Degrees(dp=64), 8)
    cost = Coster(g, backend, where)
    node = next(n for n in _fsdp(g) if n.op is OpKind.ALL_GATHER and n.scope.startswith("layers."))
    a = node.attrs
    assert isinstance(a, CollectiveAttrs) and len(a.pieces) > 1
    nccl = sum(backend.collective_time_s(OpKind.ALL_GATHER, b, where[a.axis]) for b in a.pieces)
    copies = cost(node) - nccl
    assert copies > len(a.pieces) * 64 * A100_80GB.kernel_overhead_us * 1e-6
    whole = backend.collective_time_s(OpKind.ALL_GATHER, a.bytes, where[a.axis])
    assert cost(node) > whole  # one collective per tensor pays each one's latency


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


def test_per_tensor_sizes_survive_the_graph_format(tiny_llama: Graph) -> None:
    """``pieces`` is a list of integers in the JSON form and a tuple again when read back."""
    import json

    from echosim.ir import print_graph
    from echosim.ir.serialize import GraphDataError, graph_from_data, graph_to_data

    g = run_passes(tiny_llama, [Autodiff(), DataParallel(4, zero=3, per_param=True)])
    data = json.loads(json.dumps(graph_to_data(g)))
    back = graph_from_data(data)
    assert print_graph(back) == print_graph(g)
    assert [n.attrs.pieces for n in _fsdp(back)] == [n.attrs.pieces for n in _fsdp(g)]
    node = next(row for row in data["nodes"] if row[6].get("pieces"))
    node[6]["pieces"] = "12"
    with pytest.raises(GraphDataError, match="list of integers"):
        graph_from_data(data)
