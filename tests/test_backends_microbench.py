"""`validate --microbench` on the shared data: which (device, op) groups meet the issue's targets."""

from __future__ import annotations

from pathlib import Path

import pytest

from echosim.backends.collectives import NcclConfig
from echosim.validation.microbench import (
    TARGETS,
    XLA_TABLE_MULTIHOST_NCCL,
    XLA_TABLE_NCCL,
    harness_nccl,
    nccl_version,
    probe,
    validate_microbench,
)

MICROBENCH = Path(__file__).resolve().parents[2] / "shared" / "validation" / "microbench.csv"


@pytest.fixture(scope="module")
def groups() -> dict[str, dict]:
    if not MICROBENCH.exists():
        pytest.skip(f"validation data not found at {MICROBENCH}")
    return validate_microbench(MICROBENCH).groups()


# Groups that meet their target, with the MAPE achieved when this test was written.
MEETS = {
    # Azure cuBLASLt sweep (a heuristic pick; 5.1 / 8.4 / 5.5 with HEURISTIC_GEMM_FRACTION 0.91, fitted while
    # the sweep's FP8 rows were priced promoted, though its harness sets fast accumulation). The last wave's
    # output store paid after its math (compute.exposed_epilogue_s) moved A100 5.9 -> 6.2, H100 fp8 6.1 -> 5.8,
    # H200 fp8 5.2 -> 5.6, H100 XLA bf16 7.1 -> 5.9, B200 XLA bf16 9.2 -> 5.0 and fp8 12.1 -> 7.1 (met).
    "A100-SXM4-80GB | matmul fp16": 6.2,
    "H100-SXM (sm_90) | matmul bf16": 5.9,  # XLA table, 292 shapes (autotuned)
    "B200 (sm_100) | matmul bf16": 5.0,  # XLA table; was 10.8 before tcgen05's 128-row MMA floor (MMA_FULL_ROWS)
    "B200 (sm_100) | matmul fp8": 7.1,  # XLA table; 14.3 before the floor, 12.1 before the exposed epilogue store
    # MAMF, the ceiling's own row: the model's best rate over mamf-finder's search (2.9 at the row's own shape)
    "A100 SXM | matmul bf16": 0.2,
    "H100-SXM-80GB | matmul fp8": 5.8,  # Azure cuBLASLt, fast accumulation
    "H200-SXM-141GB | matmul fp8": 5.6,
    "A100-SXM4-80GB | memory-bound": 3.1,
    "H100-SXM-80GB | memory-bound": 2.3,
    "H200-SXM-141GB | memory-bound": 2.9,
    "H100-SXM-80GB | all_reduce | intra-node | >=1MiB": 4.0,  # Azure nccl-tests, NVLS (3.5 before NCCL's NVLS graph)
    "H200-SXM-141GB | all_reduce | intra-node | >=1MiB": 4.0,  # 2.7 before NCCL's NVLS graph (8 x 40 GB/s, not 41.2)
    "GB200 | all_reduce | intra-node | >=1MiB": 4.3,  # Azure nccl-tests, 4 GPUs per host
    # NDmv4 2 nodes; 7.9 while 1-4 GiB trees kept NCCL's 0.9 correction, which its tuner applies only below 512 MiB:
    # the 2 x 8 rows (184-188 GB/s bus) sit 0.92 x 0.9 below NVLink's 240 in fact, A3 Mega's at 0.9 of its NICs
    "A100-SXM4-80GB | all_reduce | inter-node | >=1MiB": 12.5,
    "H100-SXM-80GB | all_reduce | inter-node | >=1MiB | tcpxo": 11.2,  # 14.4 with the 0.9 at 1-8 GiB (+17-19%)
    # Azure's harness (NCCL_ALGO=NVLS or Ring, one thread launching for every GPU of the node)
    # and the node's host launch time (nccl_launch_us) as their smallest messages read it
    "H200-SXM-141GB | all_reduce | intra-node | <1MiB": 1.4,
    "GB200 | all_reduce | intra-node | <1MiB": 5.2,
    "A100-SXM4-80GB | all_reduce | intra-node | <1MiB": 4.8,
    # NCCL 2.18.5's NVLS fills its first channels with fixed 16 KiB chunks (23.5 with NCCL 2.20's even split)
    "H100-SXM-80GB | all_reduce | intra-node | <1MiB": 4.7,
    # XLA's collective-permutes: NCCL's p2p channels per send, ring shifts sharing them both ways
    "H100-SXM (sm_90) | send/recv | intra-node | <1MiB | XLA table": 12.8,
    "H100-SXM (sm_90) | send/recv | intra-node | >=1MiB | XLA table": 9.2,
    # XLA's GB200 NVL72 run over 16-18 trays: NCCL's tuner with one node per 4-GPU tray, LL allowed
    "GB200 (sm_100, NVL72) | all_gather | intra-node | <1MiB | XLA table": 9.7,  # was 35.4 (10.1 w/o NVLink chunks)
    "GB200 (sm_100, NVL72) | reduce_scatter | intra-node | <1MiB | XLA table": 5.7,  # was 33.8 (5.5)
    "GB200 (sm_100, NVL72) | all_reduce | intra-node | >=1MiB | XLA table": 6.7,  # was 20.9; 11.7 before 32 NVLS heads
    # XLA's all-to-alls: the table's host timer sees the issue of 2n grouped send/recv calls
    "H100-SXM (sm_90) | all_to_all | intra-node | >=1MiB | XLA table": 10.2,  # was 21.8 (kernel time only)
    "B200 (sm_100) | all_to_all | intra-node | >=1MiB | XLA table": 10.2,  # was 33.8
    "GB200 (sm_100, NVL72) | all_to_all | intra-node | <1MiB | XLA table": 14.5,  # was 231.4
    # nccl-tests alltoall 1 KiB over 8 A100s: the launch floor of 16 grouped calls (was 22.9, the LL kernel)
    "A100-SXM4-80GB | all_to_all | intra-node | <1MiB": 3.3,
}


@pytest.mark.parametrize("group", sorted(MEETS))
def test_groups_that_meet_their_target(groups, group):
    g = groups[group]
    assert g["meets"] is True and g["mape"] <= MEETS[group] / 100 + 0.005, (group, g)


def test_every_group_with_a_target_is_reported(groups):
    targeted = {name for name, g in groups.items() if g["target"] is not None}
    expected = {
        "B200 (sm_100) | matmul bf16",
        "GB200 (sm_100, NVL72) | all_reduce | intra-node | >=1MiB | XLA table",
        "H100-SXM (sm_90) | send/recv | intra-node | >=1MiB | XLA table",
        "H100-SXM (sm_90) | all_gather | intra-node | <1MiB | XLA table",
        "A100-SXM4-80GB | all_reduce | intra-node | <1MiB",
    }
    assert expected <= targeted
    assert all(g["rows"] >= 1 and g["mape"] >= 0 for g in groups.values())


ROW = dict.fromkeys(
    ("source", "device", "system", "op", "dtype", "shape", "size_bytes", "num_devices", "num_nodes", "metric"), ""
)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"device": "H100 SXM", "op": "matmul MAMF (best shape)", "dtype": "fp8 e4m3", "shape": "1024x9216x14336",
          "metric": "TFLOPS"}, "h100-sxm matmul fp8"),
        ({"device": "GB200 (sm_100, NVL72)", "op": "all-reduce", "shape": "[256] 1 group(s) of 64 devices (iota 64)",
          "size_bytes": "1024", "num_devices": "64", "metric": "time_us"}, "gb200 all_reduce intra-node"),
        ({"device": "H100-SXM (sm_90)", "op": "collective-permute", "size_bytes": "4194304", "num_devices": "8",
          "num_nodes": "1", "metric": "busbw_GBps"}, "h100-sxm send/recv intra-node"),
        ({"device": "A100-SXM4-80GB", "op": "all_gather (NCCL)", "size_bytes": "1073741824", "num_devices": "2",
          "num_nodes": "2", "metric": "busbw_GBps"}, "a100-80gb all_gather inter-node"),
        ({"device": "H100-SXM-80GB", "system": "GCP A3 Mega (GPUDirect-TCPXO)", "op": "all_reduce (nccl-tests)",
          "size_bytes": "8", "num_devices": "16", "num_nodes": "2", "metric": "time_us"},
         "h100-a3mega all_reduce inter-node"),
        ({"device": "A100-SXM4-80GB", "system": "2 VMs, GPUDirect-TCPXO", "op": "all_reduce (nccl-tests)",
          "size_bytes": "8", "num_devices": "16", "num_nodes": "2", "metric": "time_us"},
         "no backend for device 'A100-SXM4-80GB' on the tcpxo network"),
        ({"device": "H100-SXM-80GB", "op": "FlashAttention-2 (flash_attn_qkvpacked_func)", "dtype": "fp16",
          "shape": "batch=2 seq=8192 head_dim=128", "metric": "TFLOPS"}, "the model's FA2 rate itself"),
        ({"device": "Gaudi 3", "op": "matmul MAMF", "metric": "TFLOPS"}, "no backend for device 'Gaudi 3'"),
    ],
)  # fmt: skip
def test_rows_become_probes_or_reasons(fields, expected):
    row = {**ROW, "value": "1.0", "notes": "", **fields}
    result = probe(row)
    if isinstance(result, str):
        assert expected in result
    else:
        assert " ".join((result.backend, result.op, result.scope)).startswith(expected)


def test_targets_by_regime_and_harness(groups):
    assert groups["H100-SXM (sm_90) | all_gather | intra-node | >=1MiB | XLA table"]["target"] == TARGETS["xla"]
    assert groups["H100-SXM (sm_90) | all_gather | intra-node | <1MiB | XLA table"]["target"] == TARGETS["small"]
    assert groups["H100-SXM-80GB | all_reduce | intra-node | >=1MiB"]["target"] == TARGETS["intra-node"]
    # A3 Mega rows (GPUDirect-TCPXO) form groups of their own, costed on h100-a3mega
    assert groups["H100-SXM-80GB | all_reduce | inter-node | >=1MiB | tcpxo"]["target"] == TARGETS["inter-node"]
    assert groups["H100-SXM-80GB | all_reduce | inter-node | <1MiB | tcpxo"]["target"] == TARGETS["small"]
    # not met: 14.4% (53.1% before the Simple tree's fixed-step fill; 1-8 GiB stay 12-19% too slow)
    assert groups["H100-SXM-80GB | all_reduce | inter-node | >=1MiB | tcpxo"]["mape"] < 0.15


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"source": "https://github.com/Azure/AI-benchmarking-guide/blob/main/x.md", "num_devices": "8"},
         NcclConfig(algo="nvls", devices_per_thread=8)),
        ({"source": "https://github.com/Azure/AI-benchmarking-guide/blob/main/x.md", "num_devices": "4"},
         NcclConfig(algo="ring", devices_per_thread=4)),
        ({"op": "sendrecv (nccl-tests -g 8)", "num_devices": "8"}, NcclConfig(devices_per_thread=8)),
        ({"source": "https://github.com/openxla/xla/blob/x/table.txtpb", "num_devices": "8"}, XLA_TABLE_NCCL),
        ({"source": "https://github.com/openxla/xla/blob/x/table.txtpb", "device": "GB200 (sm_100, NVL72)",
          "num_devices": "64"}, XLA_TABLE_MULTIHOST_NCCL),
        ({"source": "https://github.com/openxla/xla/blob/x/table.txtpb", "device": "GB200 (sm_100, NVL72)",
          "num_devices": "4"}, XLA_TABLE_NCCL),
        ({"source": "https://github.com/microsoft/mscclpp/x.md", "num_devices": "8"}, NcclConfig()),
    ],
)  # fmt: skip
def test_each_harness_runs_nccl_as_its_code_does(fields, expected):
    assert harness_nccl({**ROW, "value": "1.0", "notes": "", **fields}) == expected


def test_a_ring_shift_permute_is_a_ring_exchange_and_a_swap_is_not():
    """A rank that sends to r+d and receives from r-d does both in one NCCL p2p round (echosim's RECV)."""
    from echosim.ir.ops import OpKind
    from echosim.validation.microbench import _shares_rounds

    ring = "[256] pattern pairs[target: 1;source: 1 target: 2;source: 2 target: 3;source: 3 target: 4;" + (
        "source: 4 target: 5;source: 5 target: 6;source: 6 target: 7;source: 7]"
    )
    swap = "[256] pattern pairs[target: 1;source: 1;source: 2 target: 3;source: 3 target: 2;" + (
        "source: 4 target: 5;source: 5 target: 4;source: 6 target: 7;source: 7 target: 6]"
    )
    half = "[256] pattern pairs[target: 4;source: 1 target: 5;source: 2 target: 6;source: 3 target: 7]"
    assert _shares_rounds(ring, 8) and not _shares_rounds(swap, 8) and not _shares_rounds(half, 8)
    assert not _shares_rounds("[256] 1 group(s) of 8 devices (iota 8)", 8)

    from echosim.backends.base import Placement
    from echosim.backends.collectives import best_choice
    from echosim.backends.devices import DEVICES

    h100, eight, xla = DEVICES["h100-sxm"], Placement(8, 1, 8), XLA_TABLE_NCCL
    one_way = best_choice(h100, OpKind.SEND, 16 * 2**20, eight, xla)
    both_ways = best_choice(h100, OpKind.RECV, 16 * 2**20, eight, xla)
    assert both_ways.algbw_GBps == pytest.approx(one_way.algbw_GBps / 2)


def test_xla_all_to_all_pays_its_host_issue_and_nccl_tests_does_not():
    """XLA's table times one op from the host: a fixed issue cost plus one per ncclSend/ncclRecv call (2n)."""
    from echosim.backends.base import Placement
    from echosim.backends.collectives import NCCL_P2P_CALL_US, a2a_host_issue_us, collective_time_s
    from echosim.backends.devices import DEVICES
    from echosim.ir.ops import OpKind
    from echosim.validation.microbench import XLA_A2A_ISSUE_US

    assert (XLA_A2A_ISSUE_US, NCCL_P2P_CALL_US) == (17.0, 0.23)
    assert a2a_host_issue_us(8, XLA_TABLE_NCCL) == pytest.approx(17.0 + 16 * 0.23)  # 20.68 µs
    assert a2a_host_issue_us(72, XLA_TABLE_MULTIHOST_NCCL) == pytest.approx(17.0 + 144 * 0.23)  # 50.12 µs
    assert a2a_host_issue_us(8) == 0.0  # nccl-tests and training: launches pipeline behind earlier work
    h100, eight = DEVICES["h100-sxm"], Placement(8, 1, 8)
    # 4 KiB over 8 H100s: NCCL's p2p kernel (ring Simple base 8.4 + NVLink hop 3.4) plus the issue
    plain = collective_time_s(h100, OpKind.ALL_TO_ALL, 4096, eight, NcclConfig(protocols=("LL128", "Simple")))
    xla = collective_time_s(h100, OpKind.ALL_TO_ALL, 4096, eight, XLA_TABLE_NCCL)
    assert (xla - plain) * 1e6 == pytest.approx(20.68)
    # collectives other than all-to-all are one NCCL call: unchanged
    ag = NcclConfig(nvls_gather=False, protocols=("LL128", "Simple"), nvls_chunk_hop=True)
    assert collective_time_s(h100, OpKind.ALL_GATHER, 4096, eight, XLA_TABLE_NCCL) == collective_time_s(
        h100, OpKind.ALL_GATHER, 4096, eight, ag
    )


def test_an_all_to_alls_launch_floor_counts_its_grouped_calls():
    """Pipelined launches (nccl-tests): an all-to-all costs at least its launch plus 2n ncclSend/ncclRecv enqueues."""
    from echosim.backends.base import Placement
    from echosim.backends.collectives import collective_time_s, launch_floor_us
    from echosim.backends.devices import DEVICES
    from echosim.ir.ops import OpKind

    a100, eight = DEVICES["a100-80gb"], Placement(8, 1, 8)
    assert launch_floor_us(a100, NcclConfig(), OpKind.ALL_TO_ALL, 8) == pytest.approx(5.35 + 16 * 0.23)  # 9.03
    assert launch_floor_us(a100, NcclConfig(), OpKind.ALL_GATHER, 8) == 5.35
    # 1 KiB: NCCL's LL p2p kernel takes 6.6 + 0.6 = 7.2 µs, under the 9.03 µs host floor (measured 9.34)
    assert collective_time_s(a100, OpKind.ALL_TO_ALL, 1024, eight) * 1e6 == pytest.approx(9.03)


def test_azure_rows_run_the_nccl_their_system_names() -> None:
    """NVLS split evenly over its channels from NCCL 2.20 (H200's 2.20.5, GB200's 2.25.1), not under H100's 2.18.5."""
    azure = "https://github.com/Azure/AI-benchmarking-guide/blob/main/Azure_Results/ND_H100_v5_results.md"
    row = {"source": azure, "op": "all_reduce_perf", "num_devices": "8"}
    h100 = harness_nccl({**row, "system": "Azure ND H100 v5 (Xeon 8480C, CUDA 12.6, NCCL 2.18.5)"})
    h200 = harness_nccl({**row, "system": "Azure ND H200 v5 (Xeon 8480C, CUDA 12.6, NCCL 2.20.5)"})
    assert (h100.algo, h100.nvls_even_split, h200.nvls_even_split) == ("nvls", False, True)
    assert harness_nccl({**row, "system": "Azure ND H100 v5"}).nvls_even_split  # no version named: NCCL's today
    assert nccl_version("Grace Neoverse-V2, CUDA 12.8, NCCL 2.25.1") == (2, 25) and nccl_version("x") is None
