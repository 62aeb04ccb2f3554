"""Megatron rank order on 8-GPU nodes: which groups share nodes and NICs."""

from __future__ import annotations

import pytest

from echosim.backends.base import Placement
from echosim.backends.topology import megatron_placement

GPT3 = {"tp": 8, "dp": 8, "pp": 16}  # the 1,024-GPU GPT-3 175B run, Megatron order


def test_tensor_parallel_group_fills_one_node():
    assert megatron_placement("tp", GPT3, 8) == Placement(size=8, nodes=1, per_node=8, concurrent_per_node=1)


def test_data_parallel_groups_take_one_gpu_per_node_and_share_each_node():
    assert megatron_placement("dp", GPT3, 8) == Placement(size=8, nodes=8, per_node=1, concurrent_per_node=8)


def test_pipeline_stages_are_one_node_apart():
    expected = Placement(size=16, nodes=16, per_node=1, concurrent_per_node=8)
    assert megatron_placement("pp", GPT3, 8) == expected


def test_small_tensor_parallel_packs_several_groups_per_node():
    sizes = {"tp": 2, "cp": 2, "dp": 8}
    assert megatron_placement("tp", sizes, 8) == Placement(2, 1, 2, 4)
    assert megatron_placement("cp", sizes, 8) == Placement(2, 1, 2, 4)  # ranks 0 and 2
    assert megatron_placement("dp", sizes, 8) == Placement(8, 4, 2, 4)  # ranks 0, 4, 8, ...


def test_axis_order_follows_the_dict():
    assert megatron_placement("dp", {"dp": 8, "tp": 8}, 8) == Placement(8, 1, 8, 1)
    assert megatron_placement("tp", {"dp": 8, "tp": 8}, 8) == Placement(8, 8, 1, 8)


def test_a_single_partial_node_is_allowed():
    assert megatron_placement("tp", {"tp": 4}, 8) == Placement(4, 1, 4, 1)
    assert megatron_placement("dp", {"tp": 2, "dp": 2}, 8) == Placement(2, 1, 2, 2)


def test_world_size_must_divide_into_nodes():
    with pytest.raises(ValueError, match=r"world size 12 \(tp6 x dp2\) does not divide into nodes of 8"):
        megatron_placement("tp", {"tp": 6, "dp": 2}, 8)


def test_groups_that_straddle_node_boundaries_unevenly_are_rejected():
    with pytest.raises(ValueError, match=r"tp groups .* straddle nodes of 8 devices unevenly"):
        megatron_placement("tp", {"tp": 3, "dp": 8}, 8)


@pytest.mark.parametrize(
    ("axis", "sizes", "message"),
    [
        ("ep", GPT3, "axis 'ep' is not one of"),
        ("tp", {"tp": 0, "dp": 8}, "tp=0 must be a positive integer"),
    ],
)
def test_bad_arguments_are_named(axis, sizes, message):
    with pytest.raises(ValueError, match=message):
        megatron_placement(axis, sizes, 8)
