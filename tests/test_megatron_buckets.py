"""Megatron-Core's gradient buckets grow with the data-parallel group: max(40M, 1M x dp x cp) parameters."""

from __future__ import annotations

import re

import pytest

from echosim.compiler import lower
from echosim.frameworks import get_framework
from echosim.passes.data_parallel import MEGATRON_BUCKET_PARAMS, megatron_bucket_params
from echosim.plan import Cluster, Plan

_LAYER_BUCKET = re.compile(r"dp\.grad_reduce_scatter\.layers\.0\.\d+$")


def test_the_bucket_is_40m_parameters_up_to_40_ranks_then_1m_a_rank() -> None:
    assert MEGATRON_BUCKET_PARAMS == 40_000_000
    assert megatron_bucket_params(1) == megatron_bucket_params(40) == 40_000_000
    assert megatron_bucket_params(41) == 41_000_000
    assert megatron_bucket_params(1024) == 1_024_000_000


def test_megatron_core_frameworks_scale_their_buckets_and_2021_megatron_does_not() -> None:
    for name in ("megatron", "nemo", "nemo-ce-native", "megatron-bridge", "megatron-ce-te"):
        assert "0fda386" in get_framework(name).ddp_bucket_dp_scaled, name
    for name in ("megatron-2022", "eager", "maxtext", "deepspeed-2021"):
        assert not get_framework(name).ddp_bucket_dp_scaled, name


def _layer_buckets(framework: str, dp: int, cp: int = 1) -> int:
    """Reduce-scatter buckets of Llama 3 8B's first layer (218M parameters) under ZeRO-1 on H100s."""
    plan = Plan(dp=dp, cp=cp, zero=1, global_batch=dp, micro_batch=1, seq_len=2048, framework=framework)
    graph = lower("llama3-8b", plan, Cluster("h100-sxm", dp * cp)).stages[0].graph
    return sum(1 for n in graph.nodes.values() if _LAYER_BUCKET.search(n.name))


@pytest.mark.parametrize(
    ("framework", "dp", "cp", "buckets"),
    [
        ("nemo", 8, 1, 6),  # ceil(218M / 40M)
        ("nemo", 128, 1, 2),  # ceil(218M / 128M)
        ("nemo", 64, 4, 1),  # the dp x cp ranks that reduce together: 256M a bucket
        ("megatron-2022", 128, 1, 6),  # Megatron-LM before core_v0.7.0: 40M at any dp
    ],
)
def test_a_layer_is_reduced_in_as_many_buckets_as_its_framework_sizes(
    framework: str, dp: int, cp: int, buckets: int
) -> None:
    assert _layer_buckets(framework, dp, cp) == buckets
