"""benchmarks/moe_te_streams.py: grouped GEMMs costed as Transformer Engine's per-expert GEMMs while asked."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from script_loader import load_script

from echosim.backends import compute
from echosim.backends.devices import DEVICES
from echosim.backends.gpu import GPUBackend
from echosim.ir.ops import MatmulAttrs

ROOT = Path(__file__).resolve().parents[1]


def _module() -> ModuleType:
    return load_script("benchmarks/moe_te_streams.py")


def test_grouped_gemms_cost_per_expert_inside_and_as_before_after() -> None:
    m = _module()
    dev = DEVICES["b200"]
    backend = GPUBackend(dev)
    grouped = MatmulAttrs(m=2048, n=768, k=2048, batch=16, grouped=True)
    dense = MatmulAttrs(m=2048, n=768, k=2048)
    before = backend.matmul_cost_s(grouped, "bf16"), backend.matmul_cost_s(dense, "bf16")
    with m.te_expert_gemms(4):
        inside = backend.matmul_cost_s(grouped, "bf16")
        assert backend.matmul_cost_s(dense, "bf16") == before[1]  # a plain GEMM is untouched
    assert inside == pytest.approx(compute.expert_gemms_time_s(dev, 2048, 768, 2048, 16, "bf16", streams=4))
    assert inside != pytest.approx(before[0])
    assert backend.matmul_cost_s(grouped, "bf16") == before[0]  # restored
    with m.te_expert_gemms(0):  # 0: echosim's grouped kernel
        assert backend.matmul_cost_s(grouped, "bf16") == before[0]


def test_te_frameworks_are_megatron_core_ones() -> None:
    assert set(_module().TE_GROUPED_FRAMEWORKS) == {"megatron", "nemo"}
