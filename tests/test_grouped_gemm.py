"""MoE expert kernels: grouped GEMMs priced from the H200 measurement, the permute's row reads."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import capture

from echosim.backends import compute
from echosim.backends.devices import DEVICES
from echosim.backends.gpu import GPUBackend
from echosim.frontend.zoo import ArchConfig
from echosim.ir.graph import Graph
from echosim.ir.ops import ElementwiseAttrs, MatmulAttrs, Phase
from echosim.passes.autodiff import Autodiff
from echosim.passes.base import run_passes
from echosim.passes.flops import io_bytes

ROOT = Path(__file__).resolve().parents[1]
# benchmarks/moe_kernels_gpu.py SHAPES: (label, local experts, rows per expert, hidden, expert ffn)
SHAPES = [
    (16, 2048, 2048, 768),
    (128, 256, 2048, 768),
    (16, 4096, 2880, 2880),
    (4, 2048, 6144, 8192),
    (1, 8192, 4096, 14336),
]
TINY_MOE = ArchConfig(
    "moe", layers=2, hidden=64, heads=4, kv_heads=2, vocab=128, seq_len=16, experts=4, top_k=2, moe_ffn=32,
    shared_experts=1,
)  # fmt: skip


def test_grouped_fraction_is_the_h200_measurement() -> None:
    """The constant is the geometric mean of modelled / measured over the 30 grouped kernels measured."""
    data = json.loads((ROOT / "benchmarks/moe_kernels_h200.json").read_text())
    gemms = [row for row in data if row[1] in ("up", "down")]
    assert len(gemms) == 2 * len(SHAPES)
    dev = DEVICES["h200"]
    logs = []
    for (_, proj, measured, _), (groups, m, h, f) in zip(gemms, [s for s in SHAPES for _ in (0, 1)], strict=True):
        k, n = (h, f) if proj == "up" else (f, h)
        modelled = (
            compute.matmul_time_s(dev, m, n, k, groups),  # forward
            compute.matmul_time_s(dev, m, k, n, groups),  # dgrad
            compute.matmul_time_s(dev, k, n, m, groups),  # wgrad
        )
        logs += [math.log(p / t) for p, t in zip(modelled, measured[:3], strict=True)]
    measured_fraction = math.exp(sum(logs) / len(logs))
    assert abs(compute.GROUPED_GEMM_FRACTION - measured_fraction) < 0.005


def test_grouped_gemm_costs_more_than_the_same_dense_products() -> None:
    dev = DEVICES["h100-sxm"]
    dense = compute.matmul_time_s(dev, 2048, 768, 2048, 16)
    assert compute.matmul_time_s(dev, 2048, 768, 2048, 16, grouped=True) == pytest.approx(
        dense / compute.GROUPED_GEMM_FRACTION
    )
    backend = GPUBackend(dev)
    a = MatmulAttrs(2048, 768, 2048, batch=16)
    assert backend.matmul_cost_s(a, "bf16") == pytest.approx(dense)
    assert backend.matmul_cost_s(MatmulAttrs(2048, 768, 2048, batch=16, grouped=True), "bf16") > dense


@pytest.fixture(scope="module")
def trained() -> Graph:
    return run_passes(capture(TINY_MOE), [Autodiff()])


def test_expert_gemms_and_their_gradients_are_grouped(trained: Graph) -> None:
    """Forward, dgrad and wgrad of the experts are grouped kernels; the dense linears are not."""
    mm = [n for n in trained if isinstance(n.attrs, MatmulAttrs)]
    grouped = [n for n in mm if n.attrs.grouped]
    by_phase = {(n.phase, n.attrs.grad_of) for n in grouped}
    assert {(Phase.FORWARD, ""), (Phase.BACKWARD, "dgrad"), (Phase.BACKWARD, "wgrad")} <= by_phase
    assert all(n.attrs.batch == TINY_MOE.experts for n in grouped)
    assert any(not n.attrs.grouped for n in mm)  # attention projections, shared expert, head


def test_permute_reads_each_token_once_per_choice(trained: Graph) -> None:
    """The dispatch's bytes: its index inputs plus every routed row read and written once."""
    dispatch = [n for n in trained if isinstance(n.attrs, ElementwiseAttrs) and n.attrs.fn == "moe_dispatch"]
    assert dispatch
    for n in dispatch:
        tokens = trained[n.inputs[0]].out.nbytes
        ids = sum(trained[i].out.nbytes for i in n.inputs[1:])
        assert n.out.nbytes == TINY_MOE.top_k * tokens
        assert io_bytes(trained, n) == ids + 2 * n.out.nbytes
