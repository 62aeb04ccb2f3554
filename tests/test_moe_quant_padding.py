"""Megatron-Core's fp8 alignment copies around the grouped expert GEMMs (TE's Fp8Padding / Fp8Unpadding),
and the HybridEP dispatcher that pads inside its dispatch instead (echosim.passes.expert_parallel)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import capture

from echosim.explain.diff import compare
from echosim.frontend.zoo import ArchConfig
from echosim.ir import Graph, verify
from echosim.ir.ops import ElementwiseAttrs, MatmulAttrs, Phase
from echosim.layout import check_plan
from echosim.passes.autodiff import Autodiff
from echosim.passes.base import run_passes
from echosim.passes.expert_parallel import ExpertParallel
from echosim.passes.flops import graph_flops, io_bytes
from echosim.passes.plugin import _expert
from echosim.plan import Cluster, Plan, PlanError

TINY_MOE = ArchConfig(
    "moe", layers=2, hidden=64, heads=4, kv_heads=2, vocab=128, seq_len=16, experts=4, top_k=2, moe_ffn=32,
)  # fmt: skip


@pytest.fixture(scope="module")
def tiny_moe() -> Graph:
    return capture(TINY_MOE)


def _copies(g: Graph, stem: str) -> list:
    return [n for n in g if isinstance(n.attrs, ElementwiseAttrs) and n.attrs.fn.startswith(stem)]


@pytest.mark.parametrize("ep", [1, 2])
def test_quant_pad_is_four_passes_over_the_routed_rows(tiny_moe: Graph, ep: int) -> None:
    """Per MoE layer: a pad before fc1 and an unpad after fc2 in forward, their gradients in backward; each
    reads and writes the rank's routed rows once (rows x hidden x 2 bytes each way), and none counts as
    model FLOPs. Without the option (or with ep = 1 and no option) there is none."""
    plain = run_passes(tiny_moe, [ExpertParallel(ep), Autodiff()])
    g = run_passes(tiny_moe, [ExpertParallel(ep, quant_pad=16), Autodiff()])
    verify(g)
    assert not _copies(plain, "moe_quant")
    layers = len([n for n in tiny_moe if isinstance(n.attrs, ElementwiseAttrs) and n.attrs.fn == "moe_dispatch"])
    fwd = [n for n in _copies(g, "moe_quant") if n.phase is Phase.FORWARD]
    bwd = [n for n in _copies(g, "moe_quant") if n.phase is Phase.BACKWARD]
    assert sorted(n.attrs.fn for n in fwd) == ["moe_quant_pad"] * layers + ["moe_quant_unpad"] * layers
    assert sorted(n.attrs.fn for n in bwd) == ["moe_quant_pad_grad"] * layers + ["moe_quant_unpad_grad"] * layers
    grouped = [n for n in g if n.phase is Phase.FORWARD and isinstance(n.attrs, MatmulAttrs) and n.attrs.batch > 1]
    rows = grouped[0].out.shape[0]
    hidden = TINY_MOE.hidden
    for n in fwd + bwd:
        assert n.out.shape == (rows, hidden)
        assert io_bytes(g, n) == 2 * rows * hidden * n.out.dtype.itemsize  # one read, one write
    assert graph_flops(g) == graph_flops(plain)
    # the pad feeds the grouped GEMMs (after the chunk sort when there is one), the unpad reads their output
    pads = [n for n in fwd if n.attrs.fn == "moe_quant_pad"]
    assert all(any(n.id in m.inputs for m in grouped) for n in pads)
    if ep > 1:
        assert all(g[n.inputs[0]].attrs.fn == "moe_sort_chunks" for n in pads)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("dtype", "framework", "dispatcher", "want"),
    [
        ("fp8", "megatron", "deepep", 16),  # Fp8Padding's alignment: 16 rows, 32 for MXFP8, 128 for NVFP4
        ("mxfp8", "nemo", "alltoall", 32),
        ("nvfp4", "nemo", "alltoall", 128),
        ("mxfp8", "nemo", "hybridep", 0),  # HybridEP's dispatch pads the rows itself
        ("bf16", "nemo", "alltoall", 0),  # no quantised GEMM, no alignment
        ("fp8", "torchtitan", "alltoall", 0),  # not Megatron-Core's TEGroupedMLP
    ],
)
def test_quant_pad_follows_recipe_framework_and_dispatcher(
    dtype: str, framework: str, dispatcher: str, want: int
) -> None:
    plan = Plan(dp=2, ep=2, dtype=dtype, framework=framework, moe_dispatcher=dispatcher, global_batch=2)
    assert _expert(plan).quant_pad == want  # type: ignore[attr-defined]


def test_padding_to_an_aligned_capacity_needs_no_copies(tiny_moe: Graph) -> None:
    """Megatron-Core's drop-and-pad gives each local expert ep x capacity rows, capacity = ceil(T k / E x cf):
    here 32 routed rows over 4 experts at cf 1 = 8, times ep 2 = 16 rows, aligned for fp8 (16) so Fp8Padding
    returns its input; not for MXFP8 (32), nor at cf 1.25 (capacity 10, 20 rows), nor dropless."""
    rows = [n for n in tiny_moe if isinstance(n.attrs, ElementwiseAttrs) and n.attrs.fn == "moe_dispatch"]
    assert rows[0].out.shape[0] == 32

    def copies(**opts: object) -> int:
        return len(_copies(run_passes(tiny_moe, [ExpertParallel(2, **opts)]), "moe_quant"))  # type: ignore[arg-type]

    assert copies(capacity_factor=1.0, quant_pad=16, pad_to_capacity=True) == 0
    assert copies(capacity_factor=1.0, quant_pad=32, pad_to_capacity=True) > 0
    assert copies(capacity_factor=1.25, quant_pad=16, pad_to_capacity=True) > 0
    assert copies(capacity_factor=1.0, quant_pad=16) > 0  # dropping without padding: uneven segments
    with pytest.raises(PlanError, match="needs --moe-capacity-factor"):
        check_plan(Plan(dp=2, ep=2, global_batch=2, moe_pad_to_capacity=True), Cluster("b200", 2, 8), ["1f1b"])


def test_fp8_moe_step_pays_the_copies_at_memory_bandwidth() -> None:
    """The same MXFP8 run on 8 B200s: alltoall pays the copies, HybridEP does not; bf16 pays none either way."""
    from echosim.compiler import compile

    cfg = ArchConfig(
        "moe", layers=2, hidden=2048, heads=16, kv_heads=4, vocab=32000, seq_len=4096, experts=16, top_k=2,
        moe_ffn=2048,
    )  # fmt: skip
    cluster = Cluster("b200", 8, 8)
    base = Plan(dp=8, ep=8, global_batch=8, seq_len=4096, dtype="mxfp8", framework="nemo")
    padded_report = compile(cfg, base, cluster)
    hybrid_report = compile(cfg, replace(base, moe_dispatcher="hybridep"), cluster)
    padded, hybrid = padded_report.step_time_s, hybrid_report.step_time_s
    assert padded > hybrid
    # explain diff names the dispatcher behind the compute that moved
    moved = [t for t in compare(padded_report.to_dict(), hybrid_report.to_dict()).terms
             if t.name.startswith("compute") and t.delta]  # fmt: skip
    assert moved and all("moe_dispatcher" in " ".join(t.why) for t in moved)
    bf16 = replace(base, dtype="bf16")
    assert compile(cfg, bf16, cluster).step_time_s == pytest.approx(
        compile(cfg, replace(bf16, moe_dispatcher="hybridep"), cluster).step_time_s, rel=1e-9
    )
