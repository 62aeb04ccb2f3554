"""TPU and CPU backends: chips as data checked against hw_specs.csv, closed-form collectives, invariants."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echosim.backends import cpu, tpu
from echosim.backends.base import Backend, Placement
from echosim.ir.graph import Node
from echosim.ir.ops import MatmulAttrs, OpKind
from echosim.ir.types import DType, TensorSpec

HW_SPECS = Path(__file__).resolve().parents[2] / "shared" / "validation" / "hw_specs.csv"
TPU_ROWS = {
    "tpu-v4": "Google TPU v4",
    "tpu-v5e": "Google TPU v5e",
    "tpu-v5p": "Google TPU v5p",
    "tpu-v6e": "Google TPU v6e (Trillium)",
}
CPU_ROWS = {
    "cpu-x86": "Intel Xeon Platinum 8480+ (Sapphire Rapids, 56C, per socket)",
    "epyc-9654": "AMD EPYC 9654 (Genoa, 96C Zen 4, per socket)",
}
AR, AG, A2A = OpKind.ALL_REDUCE, OpKind.ALL_GATHER, OpKind.ALL_TO_ALL
GiB = 2**30


def spec_rows() -> dict[str, dict[str, str]]:
    if not HW_SPECS.exists():
        pytest.skip(f"validation data not found at {HW_SPECS}")
    with HW_SPECS.open() as f:
        return {r["name"]: r for r in csv.DictReader(f)}


@pytest.mark.parametrize("name", sorted(tpu.TPUS))
def test_tpu_numbers_match_hw_specs(name):
    row, chip = spec_rows()[TPU_ROWS[name]], tpu.TPUS[name]
    assert chip.peak_bf16_tflops == float(row["peak_bf16_tflops"])
    assert chip.hbm_GB == float(row["hbm_gb"])
    assert chip.hbm_GBps == pytest.approx(1000 * float(row["hbm_tbps"]))
    assert chip.ici_chip_Gbps == float(row["intra_node_link_gbps_per_direction"])
    assert chip.dcn_GBps == pytest.approx(float(row["nic_gbps_per_device"]) / 8)
    # The scaling-book per-link figure times the links stays within the vendor's per-chip ICI figure.
    assert chip.ici_links * chip.ici_link_GBps * 8 <= chip.ici_chip_Gbps * 1.01
    assert row["source"].split(" ; ")[0] in chip.source
    # int8 MXU rate: the notes' "int8 N TOPS" (v5e's notes give "393-394": the docs' 393 is taken)
    assert f"int8 {chip.peak_int8_tops:g}" in row["notes"]


@pytest.mark.parametrize("name", sorted(cpu.CPUS))
def test_cpu_numbers_match_hw_specs(name):
    row, spec = spec_rows()[CPU_ROWS[name]], cpu.CPUS[name]
    assert spec.peak_bf16_tflops == float(row["peak_bf16_tflops"])
    assert spec.peak_fp32_tflops == float(row["peak_fp32_tflops"])
    assert spec.ddr_GBps == pytest.approx(1000 * float(row["hbm_tbps"]), rel=0.01)  # the CSV rounds to 3 digits
    assert row["source"].split(" ; ")[0] in spec.source


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hbm_GBps": 0.0}, "device 'tpu-v5e': field 'hbm_GBps' must be a positive number"),
        ({"gemm_eff": 1.5}, "field 'gemm_eff' is a fraction"),
        ({"torus_dims": 4, "ici_links": 8}, "field 'torus_dims' must be 2 or 3"),
        ({"ici_links": 6}, "field 'ici_links' must be 2 per torus axis"),
        ({"source": ""}, "field 'source' is missing"),
    ],
)
def test_invalid_tpu_specs_name_the_field(change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(tpu.TPU_V5E, **change)


def test_invalid_cpu_specs_name_the_field():
    with pytest.raises(ValueError, match="device 'cpu-x86': field 'stream_fraction' is a fraction"):
        dataclasses.replace(cpu.CPU_X86, stream_fraction=2.0)


def test_torus_blocks_are_cube_like():
    assert tpu.torus_block(tpu.TPU_V5P, 64) == (4, 4, 4)
    assert tpu.torus_block(tpu.TPU_V5P, 128) == (8, 4, 4)
    assert tpu.torus_block(tpu.TPU_V5E, 256) == (16, 16)
    assert tpu.torus_block(tpu.TPU_V5E, 32) == (8, 4)
    assert tpu.torus_block(tpu.TPU_V4, 12) == (3, 2, 2)


def test_all_gather_on_a_wrapped_cube_uses_both_directions_of_every_axis():
    """scaling-book: T = V / (2 x W_link x axes) on a torus with wraparound, plus ~1 µs per hop."""
    cost = tpu.ici_all_gather_us(tpu.TPU_V5P, GiB, 64)
    assert cost.axes == (4, 4, 4) and cost.wraps == (True, True, True)
    assert cost.bandwidth_GBps == 3 * 2 * 90.0
    expected = GiB * 63 / 64 / (540e3) + tpu.COLLECTIVE_START_US + 3 * 2 * tpu.ICI_HOP_US
    assert cost.time_us == pytest.approx(expected)


def test_axes_without_wraparound_get_half_the_bandwidth():
    wrapped = tpu.ici_all_gather_us(tpu.TPU_V5E, GiB, 256)  # 16 x 16: full axes wrap
    line = tpu.ici_all_gather_us(tpu.TPU_V5E, GiB, 64)  # 8 x 8 inside the pod: no wraparound
    assert wrapped.wraps == (True, True) and line.wraps == (False, False)
    assert wrapped.bandwidth_GBps == 2 * line.bandwidth_GBps


def test_all_reduce_is_two_passes_and_dcn_makes_multislice_slower():
    chip = tpu.TPU_V5E
    one_slice = tpu.collective_time_s(chip, AR, GiB, Placement(256, 1, 256))
    ag = tpu.collective_time_s(chip, AG, GiB, Placement(256, 1, 256))
    assert one_slice == pytest.approx(2 * ag, rel=0.01)
    two_slices = tpu.collective_time_s(chip, AR, GiB, Placement(512, 2, 256))
    assert two_slices > one_slice


def test_a_group_larger_than_a_slice_is_refused():
    with pytest.raises(ValueError, match="does not fit in one tpu-v5e slice"):
        tpu.collective_time_s(tpu.TPU_V5E, AR, GiB, Placement(512, 1, 512))


def test_tpu_matmuls_pad_to_the_systolic_array():
    chip = tpu.TPU_V6E  # 256 x 256 MXUs
    aligned = tpu.matmul_time_s(chip, 8192, 8192, 8192)
    assert 2 * 8192**3 / aligned / 1e12 == pytest.approx(918 * chip.gemm_eff, rel=0.02)
    # n = 1025 pads to 1280 on v6e: 1.25x the work of n = 1024 on a compute-bound product.
    ratio = tpu.matmul_time_s(chip, 16384, 1025, 16384) / tpu.matmul_time_s(chip, 16384, 1024, 16384)
    assert ratio == pytest.approx(1.25, rel=0.01)


def test_gloo_ring_closed_form():
    p = Placement(4, 2, 2)
    t = cpu.collective_time_s(cpu.CPU_X86, AR, GiB, p)
    bw = cpu.CPU_X86.nic_GBps / 2  # the node's NIC carries both sockets' rings
    assert t == pytest.approx(6 * (cpu.GLOO_NET_STEP_US * 1e-6 + GiB / 4 / (bw * 1e9)))
    with pytest.raises(ValueError, match="node of 2 cpu-x86 sockets"):
        cpu.collective_time_s(cpu.CPU_X86, AR, GiB, Placement(4, 1, 4))


@pytest.mark.parametrize("backend", [tpu.TPUBackend(tpu.TPU_V5P), cpu.CPUBackend(cpu.CPU_X86)])
def test_backends_follow_the_protocol_and_describe_themselves(backend):
    assert isinstance(backend, Backend)
    described = backend.describe()
    assert described["kind"] in ("tpu", "cpu") and "https://" in described["source"] and described["assumed"]
    node = Node(0, OpKind.MATMUL, (), TensorSpec((1,), DType.BF16), MatmulAttrs(4096, 4096, 4096))
    assert backend.op_time_s(node, 0) > 0
    assert backend.memory_bytes() > 10 * 2**30 and backend.peak_flops("bf16") > 1e13
    assert backend.overlap().slowdown("compute.memory_bound") >= 1.0


@settings(max_examples=150, deadline=None)
@given(
    name=st.sampled_from(sorted(tpu.TPUS)),
    kind=st.sampled_from([AR, AG, OpKind.REDUCE_SCATTER, A2A, OpKind.SEND, OpKind.BROADCAST]),
    layout=st.sampled_from([(8, 1, 8), (64, 1, 64), (256, 1, 256), (512, 2, 256), (16, 4, 4)]),
    nbytes=st.integers(1, 2**34),
    more=st.integers(0, 2**32),
)
def test_tpu_collective_time_never_decreases_with_bytes(name, kind, layout, nbytes, more):
    p = Placement(*layout)
    chip = tpu.TPUS[name]
    small = tpu.collective_time_s(chip, kind, nbytes, p)
    assert small > 0 and tpu.collective_time_s(chip, kind, nbytes + more, p) >= small


def test_a_tiny_model_compiles_on_tpu_and_cpu(tiny_gpt):
    from echosim.compiler import compile
    from echosim.frontend.zoo import ArchConfig
    from echosim.plan import Cluster, Plan

    cfg = ArchConfig("gpt", layers=2, hidden=64, heads=4, vocab=128, seq_len=16)
    plan = Plan(tp=2, dp=2, global_batch=4, seq_len=16)
    for backend, per_node in (("tpu-v5e", 256), ("cpu-x86", 2)):
        report = compile(cfg, plan, Cluster(backend, 4, per_node))
        assert report.step_time_s > 0 and report.backend == backend
