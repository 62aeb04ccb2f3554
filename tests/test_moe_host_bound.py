"""benchmarks/moe_host_bound.py: the host-bound MoE rule it tests, and the kernels it counts per layer."""

from __future__ import annotations

from pathlib import Path

import pytest
from script_loader import load_script

ROOT = Path(__file__).resolve().parents[1]


def _module():
    return load_script("benchmarks/moe_host_bound.py")


def test_rule_adds_only_where_the_host_is_slower_than_the_gpu():
    m = _module()
    # 100 kernels at 10 µs = 1 ms of host time: forward GPU 0.4 ms -> +0.6 ms; backward GPU 2 ms -> nothing
    assert m.host_bound_extra_s(10e-6, 0.4e-3, 100, 2e-3, 100) == pytest.approx(0.6e-3)
    assert m.host_bound_extra_s(3.85e-6, 0.833e-3, 113, 1.676e-3, 192) == 0.0  # qwen3-30b B200 at nccl_launch_us
    # measured 9.18 ms, predicted 3.70 ms of which 3.58 ms GPU, 305 kernels: 30 µs each
    assert m.needed_host_s(9.18e-3, 3.70e-3, 3.58e-3, 305) == pytest.approx(29.7e-6, rel=1e-2)


def test_grouped_gemms_and_their_casts_count_one_launch_per_local_expert():
    m = _module()
    nodes = [
        {"kind": "op", "op": "matmul", "name": "grouped_mm", "scope": "l.moe.experts.up", "unit": "forward.block"},
        {"kind": "op", "op": "elementwise", "name": "x.mxfp8", "scope": "l.moe.experts.up", "unit": "forward.block"},
        {"kind": "op", "op": "elementwise", "name": "y.mxfp8", "scope": "l.attn.q", "unit": "forward.block"},
        {"kind": "collective", "op": "all_to_all", "name": "a2a", "scope": "l.moe", "unit": "forward.block"},
        {"kind": "op", "op": "matmul", "name": "grouped_mm_1", "scope": "l.moe.experts.up", "unit": "backward.block"},
        {"kind": "op", "op": "norm", "name": "n", "scope": "final", "unit": "forward.post"},
    ]
    for i, a in enumerate(nodes):
        a.update(start_s=i * 1e-3, duration_s=1e-3)

    class Dag:
        def nodes(self, data: bool):
            return [(i, a) for i, a in enumerate(nodes)]

    class Costed:
        def dag(self):
            return Dag()

    class Comp:
        costed = Costed()

    prof = m.layer_profile(Comp(), 16)
    assert prof["forward"] == (pytest.approx(4e-3), 16 + 16 + 1 + 1)
    assert prof["backward"] == (pytest.approx(5e-3), 16)
