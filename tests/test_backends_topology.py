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


# ---- the node a job gets when --devices-per-node is not given ---------------------------------------------


def test_fill_domains_spreads_a_partial_job_evenly():
    from echosim.backends.topology import fill_domains

    assert fill_domains(4, 8) == 8  # part of one HGX node
    assert fill_domains(1024, 8) == 8
    assert fill_domains(128, 72) == 64  # two NVL72 racks of 64
    assert fill_domains(144, 72) == 72
    assert fill_domains(100, 72) == 50
    assert fill_domains(97, 72) == 72  # no even split: left to the layout check to reject


@pytest.mark.parametrize(
    ("backend", "devices", "expected"),
    [("h100-sxm", 64, 8), ("gb200", 128, 64), ("gb200", 8, 72), ("tpu-v5p", 256, 256), ("tpu-v5e", 512, 256),
     ("cpu-x86", 2, 2), ("null", 4, 8)],
)  # fmt: skip
def test_compile_takes_the_node_from_the_backend(backend, devices, expected):
    from echosim import Cluster, Plan, compile

    report = compile("gpt3-125m", Plan(dp=devices, global_batch=devices, seq_len=128), Cluster(backend, devices))
    assert report.devices_per_node == expected
    given = compile("gpt3-125m", Plan(dp=devices, global_batch=devices, seq_len=128), Cluster(backend, devices, 1))
    assert given.devices_per_node == 1


def test_a_plugin_without_node_devices_gets_eight_and_a_bad_answer_is_one_line():
    from echosim.backends.gpu import NullBackend
    from echosim.backends.loading import BackendError, build_backend

    class Plain(NullBackend):
        node_devices = None  # type: ignore[assignment]

    assert build_backend("plain", Plain, "test").node_devices(64) == 8

    class Bad(NullBackend):
        def node_devices(self, devices: int) -> int:
            return 0

    with pytest.raises(BackendError, match="node_devices\\(\\) must return a positive int"):
        build_backend("bad", Bad, "test").node_devices(64)
