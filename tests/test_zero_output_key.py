"""ZeRO 1 and 2 build one graph (the same reduce-scatter buckets and step-end all-gather; ZeRO-2's gradient
sharding is memory only), so the pass cache and a search's stage caches give them one result."""

from __future__ import annotations

from echosim import memo
from echosim.ir import Graph
from echosim.passes.autodiff import Autodiff
from echosim.passes.base import output_key, run_passes
from echosim.passes.data_parallel import DataParallel


def test_zero_2_builds_zero_1s_graph_and_takes_its_cached_result(tiny_llama: Graph) -> None:
    g = run_passes(tiny_llama, [Autodiff()])
    one, two = (DataParallel(4, zero=z).run(g) for z in (1, 2))
    assert list(one) == list(two) and one.repeats == two.repeats
    assert any(n.name == "zero.param_all_gather" for n in two)
    memo.clear_all()
    reuse = {"data-parallel"}
    first = run_passes(g, [DataParallel(4, zero=1)], check=False, reuse=reuse)
    assert run_passes(g, [DataParallel(4, zero=2)], check=False, reuse=reuse) is first
    # what does change the graph keeps its own key: ZeRO 0 and 3, FSDP1's flat gradients
    for other in (DataParallel(4, zero=0), DataParallel(4, zero=3), DataParallel(4, zero=2, flat_grads=True)):
        assert output_key(other) != output_key(DataParallel(4, zero=1))
        assert run_passes(g, [other], check=False, reuse=reuse) is not first
