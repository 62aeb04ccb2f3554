"""The NCCL model against nccl-tests and NCCL measurements, plus tuner behaviour and invariants."""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from echosim.backends.base import Placement
from echosim.backends.collectives import (
    NcclConfig,
    best_choice,
    choices,
    collective_time_s,
    links_for,
    nvls_busiest_bytes,
    nvls_choice,
    nvls_graph,
    p2p_channels,
)
from echosim.backends.devices import DEVICES
from echosim.ir.ops import OpKind

MICROBENCH = Path(__file__).resolve().parents[2] / "shared" / "validation" / "microbench.csv"
A100, H100, H200 = DEVICES["a100-80gb"], DEVICES["h100-sxm"], DEVICES["h200"]
AR, AG, RS, A2A = OpKind.ALL_REDUCE, OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER, OpKind.ALL_TO_ALL
MB = 2**20


@pytest.fixture(scope="module")
def rows() -> list[dict[str, str]]:
    if not MICROBENCH.exists():
        pytest.skip(f"validation data not found at {MICROBENCH}")
    with MICROBENCH.open() as f:
        return list(csv.DictReader(f))


def measured_us(rows, device: str, op: str, ranks: int, nodes: int, kind: OpKind) -> dict[int, float]:
    """Size -> measured time (µs) of one sweep; busbw rows are turned back into times."""
    factor = 2 * (ranks - 1) / ranks if kind is AR else (ranks - 1) / ranks
    out: dict[int, float] = {}
    for r in rows:
        if (r["device"], r["op"], r["num_devices"], r["num_nodes"]) != (device, op, str(ranks), str(nodes)):
            continue
        if not r["size_bytes"]:
            continue
        size, value = int(r["size_bytes"]), float(r["value"])
        if r["metric"] == "time_us":
            out[size] = value
        elif r["metric"] == "busbw_GBps" and value > 0:
            out.setdefault(size, size * factor / (value * 1e3))
    return out


def errors(dev, kind, placement, sweep: dict[int, float], min_bytes: int = 0) -> list[float]:
    return [
        abs(collective_time_s(dev, kind, size, placement) * 1e6 - t) / t
        for size, t in sorted(sweep.items())
        if size >= min_bytes
    ]


def mape(errs: list[float]) -> float:
    return 100 * statistics.mean(errs)


ONE_NODE = Placement(8, 1, 8)


# Achieved: A100 8.7 %, H100 3.3 %, H200 2.6 % over the 9 sizes from 2 MB to 8 GB.
@pytest.mark.parametrize(
    ("dev", "device", "bound"),
    [(A100, "A100-SXM4-80GB", 10.0), (H100, "H100-SXM-80GB", 8.0), (H200, "H200-SXM-141GB", 8.0)],
)
def test_single_node_all_reduce_matches_nccl_tests_above_1mb(rows, dev, device, bound):
    """A100 misses the 8 % target: the Azure sweep runs 12-24 % below NCCL's own model
    between 4 MB and 128 MB (busbw 109 GB/s at 16 MB on a 240 GB/s node) while its
    1-8 GB plateau is within 2 %; no hardware constant reconciles both ends."""
    sweep = measured_us(rows, device, "all_reduce (nccl-tests)", 8, 1, AR)
    errs = errors(dev, AR, ONE_NODE, sweep, min_bytes=MB)
    assert len(errs) == 9
    assert mape(errs) <= bound, f"{device} all-reduce MAPE {mape(errs):.1f}%"


@pytest.mark.parametrize(("op", "kind"), [("all-gather", AG), ("reduce-scatter", RS)])
def test_h100_xla_table_all_gather_and_reduce_scatter_above_1mb(rows, op, kind):
    sweep = measured_us(rows, "H100-SXM (sm_90)", op, 8, 1, kind)
    errs = errors(H100, kind, ONE_NODE, sweep, min_bytes=MB)
    assert len(errs) == 12
    assert mape(errs) <= 10.0  # achieved 7.4 % (all-gather), 6.7 % (reduce-scatter)


@pytest.mark.parametrize(
    ("op", "kind", "bound"),
    [("all_reduce (NCCL)", AR, 8.0), ("all_gather (NCCL)", AG, 8.0), ("alltoall (NCCL)", A2A, 15.0)],
)
def test_two_a100_nodes_over_infiniband_at_1_and_4_gb(rows, op, kind, bound):
    """NDmv4: 2 nodes x 8 A100, 8 x HDR 200 Gb/s per node. Achieved 1.0 / 4.7 / 11 %."""
    sweep = measured_us(rows, "A100-SXM4-80GB", op, 16, 2, kind)
    errs = errors(A100, kind, Placement(16, 2, 8), sweep)
    assert len(errs) == 2
    assert mape(errs) <= bound


def test_one_gpu_per_node_pairs_reach_less_of_the_nic_than_modelled(rows):
    """NDmv4 with one A100 per node (2 ranks): measured 18.7 GB/s all-reduce and 15.8 GB/s
    all-gather busbw on a 25 GB/s NIC; the model gives 23.5 (the 94 % IB efficiency that
    8-NIC nodes reach). Achieved 18 / 29 / 31 % (AR / AG / A2A at 1 GB); asserted at that
    bound, not at 8 %."""
    errs = []
    for op, kind in [("all_reduce (NCCL)", AR), ("all_gather (NCCL)", AG), ("alltoall (NCCL)", A2A)]:
        sweep = measured_us(rows, "A100-SXM4-80GB", op, 2, 2, kind)
        errs += errors(A100, kind, Placement(2, 2, 1, 8), {s: t for s, t in sweep.items() if s >= MB})
    assert len(errs) == 3
    assert max(errs) <= 0.35


def test_small_message_latencies(rows):
    """1 KB collectives on NDmv4 (NCCL's LL latency model): achieved 20 % MAPE over 6 rows."""
    errs = []
    for ranks, nodes, per_node in [(8, 1, 8), (2, 2, 1)]:
        for op, kind in [("all_reduce (NCCL)", AR), ("all_gather (NCCL)", AG), ("alltoall (NCCL)", A2A)]:
            sweep = measured_us(rows, "A100-SXM4-80GB", op, ranks, nodes, kind)
            errs += errors(A100, kind, Placement(ranks, nodes, per_node), {1024: sweep[1024]})
    assert mape(errs) <= 25.0


def test_h100_plateaus_quoted_by_nccl_maintainers():
    """nccl-tests#212/#290: ~370 GB/s ring busbw, ~480 GB/s with NVLS, on one H100 node."""
    size = 8 * 2**30
    ag = best_choice(H100, AG, size, ONE_NODE)
    ag_busbw = size * 7 / 8 / (collective_time_s(H100, AG, size, ONE_NODE) * 1e9)
    ar_busbw = size * 2 * 7 / 8 / (collective_time_s(H100, AR, size, ONE_NODE) * 1e9)
    assert ag.algo == "ring" and ag_busbw == pytest.approx(370, rel=0.05)
    assert best_choice(H100, AR, size, ONE_NODE).algo == "nvls" and ar_busbw == pytest.approx(480, rel=0.05)


def test_nvls_graph_is_nccls_search_one_head_per_gpu_at_a_speed_from_its_array():
    """search.cc: (heads + 1) x speed must fit a GPU's NVLink; bwInter climbs to the first entry >= 2x speed."""
    b200, gb200, h800 = DEVICES["b200"], DEVICES["gb200"], DEVICES["h800"]
    assert nvls_graph(H100, 8) == (8, 40.0, 60.0)  # 9 x 40 <= 18 x 20.6 = 370.8 < 9 x 50
    assert (nvls_graph(H100, 4), nvls_graph(H100, 2)) == ((4, 60.0, 60.0), (2, 60.0, 60.0))  # the array's top
    assert nvls_graph(b200, 8) == (8, 80.0, 90.0)  # 9 x 80 <= 18 x 40.1 = 721.8
    assert nvls_graph(gb200, 72) == (32, 20.0, 40.0)  # NCCL_MAX_NVLS_ARITY heads: 33 x 20 <= 721.8 < 33 x 24
    assert nvls_graph(h800, 8) == (8, 15.0, 30.0)  # 8 links: 9 x 15 <= 164.8 < 9 x 18.3


def test_nvls_bandwidth_is_nccls_tuner_on_its_graph():
    """tuning.cc: busBw = heads x min(2 x speed x eff x (heads-1)/heads, bwInter) for all-reduce,
    heads x speed x eff x (heads-1)/heads x (n-1)/n for gathers; algbw = busBw x n / nsteps."""
    size = 2**33
    nvls = NcclConfig(algo="nvls")
    ar8 = best_choice(H100, AR, size, ONE_NODE, nvls)
    assert ar8.algbw_GBps * 14 / 8 == pytest.approx(8 * min(2 * 40 * 0.85 * 7 / 8, 60))  # 476 GB/s bus
    four = Placement(4, 1, 4)
    ar4 = best_choice(H100, AR, size, four, nvls)
    assert ar4.algbw_GBps * 6 / 4 == pytest.approx(4 * min(2 * 60 * 0.85 * 3 / 4, 60))  # 240: capped by bwInter
    assert best_choice(H100, AR, size, four).algo == "ring"  # ring's 371 x 4/6 = 247 beats NVLS's 160
    ag8 = best_choice(H100, AG, size, ONE_NODE, nvls)
    assert ag8.algbw_GBps * 7 / 8 == pytest.approx(8 * 40 * 0.85 * 7 / 8 * 7 / 8)  # 208 GB/s: ring wins
    assert best_choice(H100, AG, size, ONE_NODE).algo == "ring"
    rack = Placement(72, 1, 72)
    gb = best_choice(DEVICES["gb200"], AR, size, rack, nvls)
    assert gb.algbw_GBps * 2 * 71 / 72 == pytest.approx(32 * min(2 * 20 * 0.74 * 31 / 32, 40))  # 917.6 GB/s


@pytest.mark.parametrize(
    ("nbytes", "busiest"),
    [
        (1024, 16 * 1024),  # one channel carries the whole message
        (64 * 1024, MB),  # 4 heads x 16 KiB on channel 0; NCCL 2.20 would give each of 16 channels 4 KiB
        (256 * 1024, 2 * MB),  # two channels of 8 heads x 16 KiB
        (2 * MB, 2 * MB),  # one full loop: 16 channels x 8 heads x 16 KiB
        (3 * MB, 4 * MB),  # a second loop's first block
        (16 * MB, 16 * MB),  # 32 KiB chunks below 64 MiB: 4 loops of 4 MiB
    ],
)
def test_nvls_before_nccl_2_20_fills_its_first_channels(nbytes: int, busiest: int) -> None:
    """enqueue.cc v2.18.5: 16 CTAs, chunk = 4 MiB / 8 steps capped at 128 KiB, cut to 16 KiB below
    2 x 16 x 8 chunks; channel bid starts at bid x 8 heads x chunk."""
    assert nvls_busiest_bytes(nbytes, 8) == busiest


def test_a_pre_2_20_nvls_all_reduce_costs_its_busiest_channel() -> None:
    """The H100 NCCL 2.18.5 rows: flat 42-45 µs from 64 KiB to 2 MiB, where H200's NCCL 2.20.5 rows
    stay at the 31 µs launch floor up to 512 KiB and reach 41 µs at 2 MiB."""
    old = NcclConfig(algo="nvls", nvls_even_split=False)
    new, small = nvls_choice(H100, AR, 2 * MB, ONE_NODE), 256 * 1024
    a, b = nvls_choice(H100, AR, small, ONE_NODE, old), nvls_choice(H100, AR, small, ONE_NODE)
    assert a is not None and b is not None and new is not None
    assert a.time_us == pytest.approx(new.time_us)  # 256 KiB as long as 2 MiB
    assert b.time_us < a.time_us - 8  # evenly split: 8+ µs less
    assert a.tuner_us == b.tuner_us  # NCCL's tuner still ranks by the message's bytes
    assert nvls_choice(H100, AG, small, ONE_NODE, old) == nvls_choice(H100, AG, small, ONE_NODE)  # all-reduce only
    big = 64 * MB
    assert nvls_choice(H100, AR, big, ONE_NODE, old) == nvls_choice(H100, AR, big, ONE_NODE)


# ---- tuner behaviour ------------------------------------------------------------------


def test_tuner_uses_low_latency_protocols_for_small_messages_and_simple_for_large():
    assert best_choice(A100, AR, 4096, ONE_NODE).proto == "LL"
    assert best_choice(A100, AR, 2**31, ONE_NODE).proto == "Simple"
    assert best_choice(A100, AR, 2**31, ONE_NODE).algo == "ring"  # no NVLink SHARP on Ampere
    assert best_choice(H100, AR, 2**28, ONE_NODE).algo == "nvls"


def test_groups_sharing_a_node_nics_split_its_bandwidth():
    """DP groups of a TP8 layout: 8 groups, one GPU per node each, on the same 8 NICs."""
    alone = collective_time_s(A100, AR, 2**30, Placement(8, 8, 1, concurrent_per_node=1))
    shared = collective_time_s(A100, AR, 2**30, Placement(8, 8, 1, concurrent_per_node=8))
    assert shared == pytest.approx(alone, rel=0.01)  # one NIC per GPU: no contention
    crowded = Placement(8, 4, 2, concurrent_per_node=4)  # 2 GPUs of 4 groups share 8 NICs: fine
    assert collective_time_s(A100, AR, 2**30, crowded) < shared
    intra = collective_time_s(A100, AR, 2**30, ONE_NODE)
    assert shared > 5 * intra  # a 25 GB/s NIC against 240 GB/s of NVLink


def test_send_recv_uses_nvlink_in_a_node_and_the_nic_across_nodes():
    size = 2**30
    nvlink = collective_time_s(A100, OpKind.SEND, size, Placement(2, 1, 2))
    network = collective_time_s(A100, OpKind.RECV, size, Placement(2, 2, 1, 8))
    assert size / nvlink / 1e9 == pytest.approx(195.1, rel=0.08)  # li-plus sendrecv 1 GB
    assert size / network / 1e9 == pytest.approx(25 * 0.94, rel=0.08)


def test_trivial_groups_and_empty_messages_are_free():
    assert collective_time_s(A100, AR, 2**30, Placement(1, 1, 1)) == 0.0
    assert collective_time_s(A100, AR, 0, ONE_NODE) == 0.0


@pytest.mark.parametrize(
    ("placement", "message"),
    [
        (Placement(8, 2, 8), "size 8 != nodes 2 x per_node 8"),
        (Placement(16, 1, 16), "16 x 1 ranks on a node of 8"),
        (Placement(8, 8, 1, concurrent_per_node=16), "1 x 16 ranks on a node of 8"),
    ],
)
def test_impossible_placements_are_rejected(placement, message):
    with pytest.raises(ValueError, match=message):
        collective_time_s(A100, AR, 2**20, placement)


def test_non_collective_kinds_are_rejected():
    with pytest.raises(ValueError, match="not a collective"):
        collective_time_s(A100, OpKind.MATMUL, 2**20, ONE_NODE)


# ---- invariants -----------------------------------------------------------------------

PLACEMENTS = [
    Placement(8, 1, 8),
    Placement(4, 1, 4, 2),
    Placement(2, 1, 2, 4),
    Placement(16, 2, 8),
    Placement(8, 8, 1, 8),
    Placement(64, 8, 8),
    Placement(16, 16, 1, 8),
    Placement(8, 4, 2, 4),
]
KINDS = [AR, AG, RS, A2A, OpKind.SEND, OpKind.BROADCAST]


@settings(max_examples=300, deadline=None)
@given(
    dev=st.sampled_from(sorted(DEVICES)),
    kind=st.sampled_from(KINDS),
    placement=st.sampled_from(PLACEMENTS),
    nbytes=st.integers(1, 2**34),
    more=st.integers(0, 2**32),
)
def test_collective_time_never_decreases_with_bytes(dev, kind, placement, nbytes, more):
    device = DEVICES[dev]
    if placement.nodes == 1 and kind in (A2A, OpKind.SEND):
        # NCCL gives a larger NVLink send more channels in steps (enqueue.cc addP2pToPlan: one more per
        # 64 KiB part, doubling past 32 x 512 KiB per channel), so one byte more can be faster: B200's
        # XLA permute moves 134 MiB in 863 us and 268 MiB in 915 us. Between steps time must still grow.
        peers = placement.size if kind is A2A else 1
        channels = [p2p_channels(device, b / peers, placement.size) for b in (nbytes, nbytes + more)]
        assume(channels[0] == channels[1])
    small = collective_time_s(device, kind, nbytes, placement)
    assert small > 0
    picks = [best_choice(device, kind, b, placement) for b in (nbytes, nbytes + more)]
    # NCCL's own ranking (lat + bytes / bw, the minimum of increasing lines) never decreases.
    assert picks[1].tuner_us >= picks[0].tuner_us
    # Where the tuner switches algorithm or protocol it switches by its own formula, not by the costed time
    # (which adds pipelining), so one byte more may cost a little less there; with one pick time must grow.
    assume((picks[0].algo, picks[0].proto) == (picks[1].algo, picks[1].proto))
    assert collective_time_s(device, kind, nbytes + more, placement) >= small


def test_an_nvlink_send_that_gets_more_channels_can_be_faster() -> None:
    """NCCL's channel step for one NVLink send: 64 MiB runs on 4 of an 8-rank H100 node's p2p channels,
    one byte more on 8 (enqueue.cc: the 16 MiB part limit doubles the channels), and takes less time."""
    h100, node = DEVICES["h100-sxm"], Placement(8, 1, 8)
    at, above = 64 * 2**20, 64 * 2**20 + 1
    assert (p2p_channels(h100, at, 8), p2p_channels(h100, above, 8)) == (4, 8)
    assert collective_time_s(h100, OpKind.SEND, above, node) < 0.6 * collective_time_s(h100, OpKind.SEND, at, node)


@settings(max_examples=100, deadline=None)
@given(kind=st.sampled_from([AR, AG, RS, A2A]), nbytes=st.integers(2**16, 2**33))
def test_spreading_a_group_over_nodes_never_helps(kind, nbytes):
    for dev in (A100, H100):
        one = collective_time_s(dev, kind, nbytes, Placement(8, 1, 8))
        assert collective_time_s(dev, kind, nbytes, Placement(8, 8, 1, 8)) >= one


# ---- NCCL settings (NcclConfig) ----------------------------------------------------------


def test_a_forced_algorithm_runs_even_where_the_tuner_would_not_pick_it():
    """NCCL_ALGO=NVLS makes a 1 KB all-reduce pay NVLink SHARP's 25 µs instead of LL's ~15."""
    free = best_choice(H100, AR, 1024, ONE_NODE)
    forced = best_choice(H100, AR, 1024, ONE_NODE, NcclConfig(algo="nvls"))
    assert free.proto == "LL" and forced.algo == "nvls"
    assert forced.time_us > free.time_us + 5


def test_an_algorithm_the_hardware_lacks_leaves_the_choice_to_the_tuner():
    assert best_choice(A100, AR, 1024, ONE_NODE, NcclConfig(algo="nvls")) == best_choice(A100, AR, 1024, ONE_NODE)


def test_protocols_and_nvls_switches_narrow_the_candidates():
    no_ll = NcclConfig(protocols=("LL128", "Simple"))
    assert best_choice(H100, AG, 4096, ONE_NODE).proto == "LL"
    assert best_choice(H100, AG, 4096, ONE_NODE, no_ll).proto != "LL"
    assert best_choice(H100, AR, 2**30, ONE_NODE, NcclConfig(nvls=False)).algo == "ring"
    ring_gathers = NcclConfig(nvls_gather=False)
    assert best_choice(H100, AR, 2**30, ONE_NODE, ring_gathers).algo == "nvls"
    assert all(c.algo != "nvls" for c in choices(H100, AG, 2**30, ONE_NODE, ring_gathers))


def test_one_thread_launching_for_many_gpus_sets_a_floor():
    """nccl-tests -g 8: eight kernel launches per collective, 8 x ~5 µs, above LL's ~15 µs."""
    floor = collective_time_s(H100, AR, 1024, ONE_NODE, NcclConfig(devices_per_thread=8))
    assert floor == pytest.approx(8 * H100.nccl_launch_us * 1e-6)
    assert collective_time_s(H100, AR, 2**30, ONE_NODE, NcclConfig(devices_per_thread=8)) == collective_time_s(
        H100, AR, 2**30, ONE_NODE
    )


def test_the_launch_floor_is_the_hosts():
    """The EPYC-hosted A100 node launches slower than the Xeon-hosted H100 node: a higher -g 8 floor."""
    g8 = NcclConfig(devices_per_thread=8)
    a100, h100 = (collective_time_s(d, AR, 1024, ONE_NODE, g8) for d in (A100, H100))
    assert a100 == pytest.approx(8 * A100.nccl_launch_us * 1e-6) and a100 > 40e-6 > h100
    # one GPU per process: one launch, below any NCCL kernel, so training steps do not see it
    assert collective_time_s(A100, AR, 1024, ONE_NODE) > A100.nccl_launch_us * 1e-6


def test_nvls_chunks_paying_the_nvls_hop_ramp_up_later():
    """Same floor and plateau, a slower climb in between (XLA's table): the pipeline term alone grows."""
    nvls, chunk_hop = NcclConfig(algo="nvls"), NcclConfig(algo="nvls", nvls_chunk_hop=True)
    plain, slow = (best_choice(H100, AR, 2**23, ONE_NODE, c) for c in (nvls, chunk_hop))
    assert plain.algo == slow.algo == "nvls" and plain.latency_us == slow.latency_us
    assert slow.pipeline_us == pytest.approx(plain.pipeline_us * (25.0 / 3.4) ** 0.5)
    big = [collective_time_s(H100, AR, 2**33, ONE_NODE, c) for c in (nvls, chunk_hop)]
    assert big[1] / big[0] < 1.1
    rings = [NcclConfig(nvls_gather=False, nvls_chunk_hop=hop) for hop in (False, True)]
    ring_ag = [collective_time_s(H100, AG, 2**23, ONE_NODE, c) for c in rings]
    assert ring_ag[0] == ring_ag[1]


@pytest.mark.parametrize(
    "bad",
    [
        {"algo": "collnet"},
        {"protocols": ("LL64",)},
        {"protocols": ()},
        {"devices_per_thread": 0},
        {"a2a_issue_us": -1.0},
        {"p2p_call_us": -0.1},
    ],
)
def test_impossible_settings_are_refused(bad):
    with pytest.raises(ValueError):
        NcclConfig(**bad)


def test_small_nvlink_point_to_point_runs_ll_as_nccls_p2p_threshold_says():
    """NCCL (enqueue.cc addP2pToPlan): a send/recv of <= 16 KiB on an LL-capable connection runs LL."""
    from echosim.backends.collectives import P2P_LL_THRESHOLD_BYTES, p2p_uses_ll

    pair = Placement(2, 1, 2)
    ll = best_choice(H100, OpKind.SEND, 4096, pair)
    assert (ll.algo, ll.proto) == ("p2p", "LL")
    # one LL step: ring LL base 6.6 µs + NVLink LL hop 0.6 µs, then 4 KiB at half the p2p link rate
    bw = min(141.0, H100.nvlink_GBps * 0.65 * 0.5)
    assert ll.time_us == pytest.approx(6.6 + 0.6 + 4096 / (bw * 1e3))
    big = best_choice(H100, OpKind.SEND, P2P_LL_THRESHOLD_BYTES + 1, pair)
    assert big.proto == "Simple" and big.time_us > ll.time_us
    # all-to-all: the threshold is per peer (8 ranks x 16 KiB = 128 KiB buffer still LL), side by side
    a2a = best_choice(H100, A2A, 8 * P2P_LL_THRESHOLD_BYTES, Placement(8, 1, 8))
    assert a2a.proto == "LL" and a2a.latency_us == pytest.approx(7.2)
    assert best_choice(H100, A2A, 8 * P2P_LL_THRESHOLD_BYTES + 8, Placement(8, 1, 8)).proto == "Simple"
    # network p2p connections have no LL buffers by default (NCCL_ALLOC_P2P_NET_LL_BUFFERS=0)
    assert not p2p_uses_ll(1024, Placement(2, 2, 1))
    assert best_choice(H100, OpKind.SEND, 1024, Placement(2, 2, 1)).proto == "Simple"
    assert best_choice(H100, A2A, 1024, Placement(16, 2, 8)).proto == "Simple"
    # with LL switched off (NCCL_PROTO, the XLA table's harness) small p2p stays Simple
    simple_only = NcclConfig(protocols=("LL128", "Simple"))
    assert best_choice(H100, OpKind.SEND, 4096, pair, simple_only).proto == "Simple"
    assert best_choice(H100, A2A, 4096, Placement(8, 1, 8), simple_only).proto == "Simple"


def test_nvlink_sends_run_on_the_channels_nccl_schedules_them_on():
    """NCCL (enqueue.cc calcP2pChunkSize): in an 8-rank communicator a send starts on 4 of the 32 p2p
    channels and doubles them (up to 16) only once a chunk would pass 32 x 512 KiB; chunks are at
    least 64 KiB. Each channel is one CTA moving NCCL's per-channel LL128 figure, and pipelines its
    chunk through its 512 KiB FIFO steps only when the chunk spans more than one."""
    from echosim.backends.collectives import PER_CH_RING_LL128_BW, p2p_channel_count, p2p_channels

    assert (p2p_channel_count(H100), p2p_channel_count(A100), p2p_channel_count(DEVICES["h800"])) == (32, 32, 16)
    sizes = (64 * 2**10, 128 * 2**10, 256 * 2**10, 16 * MB, 64 * MB, 128 * MB, 256 * MB, 2**30)
    assert [p2p_channels(H100, s, 8) for s in sizes] == [1, 2, 4, 4, 4, 8, 16, 16]
    assert p2p_channels(H100, 16 * MB, 2) == 16  # a pair: half the channels each way
    xla = NcclConfig(protocols=("LL128", "Simple"))
    mid = best_choice(H100, OpKind.SEND, 16 * MB, Placement(8, 1, 8), xla)
    assert mid.algbw_GBps == pytest.approx(4 * PER_CH_RING_LL128_BW["hopper"])
    hop = 3.4  # NVLink ring Simple hop: each channel's FIFO handshake
    assert mid.pipeline_us == pytest.approx(2 * (16 * MB * hop / (mid.algbw_GBps * 1e3)) ** 0.5)
    one_step = best_choice(H100, OpKind.SEND, 2 * MB, Placement(8, 1, 8), xla)  # 512 KiB per channel
    link = H100.nvlink_GBps * 0.65
    assert one_step.pipeline_us == pytest.approx(2 * (2 * MB * hop / (link * 1e3)) ** 0.5)
    # a pair's communicator, or a big enough message, reaches the link
    assert best_choice(H100, OpKind.SEND, 16 * MB, Placement(2, 1, 2), xla).algbw_GBps == pytest.approx(link)
    assert best_choice(H100, OpKind.SEND, 2**30, Placement(8, 1, 8), xla).algbw_GBps == pytest.approx(link)


def test_xla_table_permutes_plateau_where_few_channels_carry_them(rows):
    """XLA's collective-permute rows (8 ranks, each sending to one peer) run at ~70-130 GB/s from
    1 to 64 MiB on H100 and B200 alike, far under the link: 4 channels per send. Achieved MAPE of
    time over those 28 rows each: H100 14.5%, B200 19.5% (at the link's rate: 41% and 60%)."""
    from echosim.validation.microbench import harness_nccl

    for device, dev, bound in (("H100-SXM (sm_90)", H100, 16.0), ("B200 (sm_100)", DEVICES["b200"], 21.0)):
        errs = []
        for r in rows:
            if r["device"] != device or r["op"] != "collective-permute" or not r["size_bytes"]:
                continue
            size, value = int(r["size_bytes"]), float(r["value"])
            if not MB <= size <= 64 * MB:
                continue
            t = value if r["metric"] == "time_us" else size / (value * 1e3)
            model = collective_time_s(dev, OpKind.SEND, size, Placement(8, 1, 8), harness_nccl(r)) * 1e6
            errs.append(abs(model - t) / t)
        assert len(errs) == 28
        assert mape(errs) < bound


def test_all_to_all_shares_run_on_the_channels_a_send_of_their_size_gets():
    """An all-to-all is one send/recv per peer (XLA's and nccl-tests' grouped ncclSend/ncclRecv), each
    round a ring exchange (to rank+d, from rank-d on the same channels): 32 KiB shares get one
    channel each (7 CTAs for 7 peers, half their rate each way, under the link); MB shares fill
    H100's link and B200's 28 channels (560 GB/s of its 722)."""
    from echosim.backends.collectives import PER_CH_RING_LL128_BW

    xla, eight = NcclConfig(protocols=("LL128", "Simple")), Placement(8, 1, 8)
    small = best_choice(H100, A2A, 8 * 32 * 2**10, eight, xla)
    assert small.algbw_GBps == pytest.approx(8 / 7 * 7 * PER_CH_RING_LL128_BW["hopper"] / 2)
    big = best_choice(H100, A2A, 8 * 8 * MB, eight, xla)
    assert big.algbw_GBps == pytest.approx(8 / 7 * H100.nvlink_busbw_GBps)
    b200 = best_choice(DEVICES["b200"], A2A, 8 * 8 * MB, eight, xla)
    assert b200.algbw_GBps == pytest.approx(8 / 7 * 28 * PER_CH_RING_LL128_BW["blackwell"] / 2)


def _choice(dev, kind, nbytes, p, algo, proto):
    return next(c for c in choices(dev, kind, nbytes, p) if (c.algo, c.proto) == (algo, proto))


def test_multi_node_ring_hops_pay_the_hosts_network_post_overhead():
    """tuning.cc getNetOverhead: 2 µs a post on AMD hosts, 1 µs on Intel (x3 for Simple), the floor of every
    intra-node hop of a multi-node ring; tree latencies never take it."""
    assert (A100.host_cpu_vendor, H100.host_cpu_vendor, DEVICES["gb200"].host_cpu_vendor) == ("amd", "intel", "arm")
    two_nodes = Placement(16, 2, 8)
    # all-gather over 16 ranks: 15 steps, one across the network (ring NET LL hop 2.7 µs)
    assert _choice(A100, AG, 4096, two_nodes, "ring", "LL").latency_us == pytest.approx(6.6 + 14 * 2.0 + 2.7)
    assert _choice(H100, AG, 4096, two_nodes, "ring", "LL").latency_us == pytest.approx(6.6 + 14 * 1.0 + 2.7)
    assert _choice(A100, AG, 4096, two_nodes, "ring", "Simple").latency_us == pytest.approx(8.4 + 14 * 6.0 + 14.0)
    assert _choice(H100, AG, 4096, two_nodes, "ring", "Simple").latency_us == pytest.approx(8.4 + 14 * 3.4 + 14.0)
    # tree all-reduce: 2 x ((ppn - 1) NVLink hops + log2(nodes) network hops), NVLink LL hop 0.6 µs on any host
    tree = _choice(A100, AR, 4096, two_nodes, "tree", "LL").latency_us
    assert tree == pytest.approx(6.8 + 2 * (7 * 0.6 + 1 * 5.0))
    # one node: no network, no overhead
    assert _choice(A100, AG, 4096, Placement(8, 1, 8), "ring", "LL").latency_us == pytest.approx(6.6 + 7 * 0.6)


@pytest.mark.parametrize(
    ("dev", "nodes", "cap"),
    [
        (A100, 1, 87.7),  # one node: the GPU generation's row
        (H100, 1, 141.0),
        (DEVICES["b200"], 1, 282.0),
        (A100, 2, 22.5),  # across nodes: the host's row (AMD: row 1)
        (A100, 4, 19.0),
        (H100, 2, 39.0),  # Intel: row 0, whatever the GPU
        (H100, 4, 20.4),
        (DEVICES["b200"], 2, 39.0),
    ],
)
def test_ll_bandwidth_cap_follows_the_gpu_on_one_node_and_the_host_cpu_across_nodes(dev, nodes, cap):
    """tuning.cc llMaxBws: one node indexes the row by GPU generation, more nodes by CPU vendor."""
    from echosim.backends.collectives import ll_max_bw

    assert ll_max_bw(dev, nodes) == cap
    p = Placement(2 * nodes, nodes, 2) if nodes > 1 else Placement(8, 1, 8)
    ring_ll = _choice(dev, AG, 4096, p, "ring", "LL")
    nic = p.per_node * dev.nic_GBps * 0.94 if nodes > 1 else float("inf")  # IB_EFFICIENCY
    bus = min(dev.nvlink_busbw_GBps, nic)
    steps = p.size - 1
    assert ring_ll.algbw_GBps == pytest.approx(min(cap, bus * 0.5) * p.size / steps)


def test_an_unknown_host_cpu_vendor_is_refused():
    import dataclasses

    with pytest.raises(ValueError, match="host_cpu_vendor"):
        dataclasses.replace(A100, host_cpu_vendor="power9")


def test_the_tuner_ranks_candidates_without_the_pipelining_cost():
    """enqueue.cc getAlgoInfo ranks (algorithm, protocol) by ncclTopoGetAlgoTime, lat + bytes / bw: on 8 A100s
    ring LL128 (14 + 14 x 1.9 µs, 0.92 of the bus) and ring Simple (8.4 + 14 x 3.4 µs, the bus) cross where
    15.4 µs = S (1/0.92 - 1) / (240 GB/s x 8/14), S = 24.3 MB, though the pipelining cost alone would keep
    LL128 (its 1.9 µs handshake) ahead to ~100 MB."""
    node = Placement(8, 1, 8)
    bus = 12 * 20.0  # A100: 12 NVLinks x NCCL's 20 GB/s
    crossing = (8.4 + 14 * 3.4 - (14.0 + 14 * 1.9)) / (1 / 0.92 - 1) * bus * 8 / 14 * 1e3
    assert crossing == pytest.approx(24.29e6, rel=1e-3)
    below, above = best_choice(A100, AR, int(crossing * 0.95), node), best_choice(A100, AR, int(crossing * 1.05), node)
    assert (below.algo, below.proto, above.algo, above.proto) == ("ring", "LL128", "ring", "Simple")
    # the pick is costed with its pipeline, and it is the candidate NCCL ranks first, not the fastest costed one
    big = 32 * MB
    cands = choices(A100, AR, big, node)
    pick = best_choice(A100, AR, big, node)
    assert pick.tuner_us == min(c.tuner_us for c in cands)
    assert collective_time_s(A100, AR, big, node) == pytest.approx(max(pick.time_us, A100.nccl_launch_us) * 1e-6)
    ll128 = next(c for c in cands if (c.algo, c.proto) == ("ring", "LL128"))
    assert ll128.time_us < pick.time_us  # echosim's own costing would have kept LL128


GB200 = DEVICES["gb200"]
TRAYS = NcclConfig(host_nodes=True)


def test_an_nvl72_group_counts_one_tuner_node_per_compute_tray_only_when_asked():
    """NCCL numbers nodes by host: 64 GPUs of one NVL72 rack are 16 trays of 4 when the domain is not fused."""
    from echosim.backends.collectives import tuner_placement

    rack = Placement(64, 1, 64)
    assert tuner_placement(GB200, rack, TRAYS) == Placement(64, 16, 4)
    assert tuner_placement(GB200, Placement(72, 1, 72), TRAYS) == Placement(72, 18, 4)
    assert tuner_placement(GB200, rack) == rack  # NCCL's default: MNNVL fuses the rack into one node
    assert tuner_placement(GB200, Placement(4, 1, 4), TRAYS) == Placement(4, 1, 4)  # one tray
    assert tuner_placement(H100, Placement(8, 1, 8), TRAYS) == Placement(8, 1, 8)  # one host per node


def test_tray_nodes_price_small_nvl72_collectives_with_nccls_multi_node_latencies():
    """tuning.cc with 16 (18) nodes of 4: ring LL 6.6 + 48 (54) x max(0.6, 1.0 net overhead) + 15 (17) x 2.7,
    tree LL 6.8 + 2 x (3 x 0.6 + log2(16) x 5.0), NVLS 25 + 18; the XLA table measures 94 / 107 µs
    (all-gather medians under 64 KiB) and 51 / 55 µs (all-reduce)."""
    cfg = NcclConfig(nvls_gather=False, host_nodes=True)
    ring = {c.proto: c for c in choices(GB200, AG, 1024, Placement(64, 1, 64), cfg) if c.algo == "ring"}
    assert ring["LL"].latency_us == pytest.approx(6.6 + 48 * 1.0 + 15 * 2.7)
    assert best_choice(GB200, AG, 1024, Placement(72, 1, 72), cfg).latency_us == pytest.approx(6.6 + 54 + 17 * 2.7)
    ar = {(c.algo, c.proto): c for c in choices(GB200, AR, 1024, Placement(64, 1, 64), cfg)}
    assert ar[("tree", "LL")].latency_us == pytest.approx(6.8 + 2 * (3 * 0.6 + 4 * 5.0))
    assert ar[("nvls", "Simple")].latency_us == pytest.approx(25 + 18)
    assert collective_time_s(GB200, AG, 1024, Placement(64, 1, 64), cfg) * 1e6 == pytest.approx(94, rel=0.05)


def test_tray_nodes_leave_nvlink_bandwidth_alone():
    """Only the steps' latencies move: a 32 GiB all-gather over 64 GPUs still
    crosses NVLink at ring speed, 2% slower (XLA's table: 48.9 ms, 47.9 fused, 48.9 with trays)."""
    big, rack = 32 * 2**30, Placement(64, 1, 64)
    fused = collective_time_s(GB200, AG, big, rack, NcclConfig(nvls_gather=False))
    trays = collective_time_s(GB200, AG, big, rack, NcclConfig(nvls_gather=False, host_nodes=True))
    assert fused < trays < fused * 1.03
    assert choices(GB200, AG, big, rack, TRAYS)[0].algbw_GBps == choices(GB200, AG, big, rack)[0].algbw_GBps


def test_p2p_between_tray_nodes_gets_no_ll_buffers():
    """NCCL gives network p2p connections LL buffers only on request: tray nodes send small p2p in Simple."""
    rack = Placement(64, 1, 64)
    assert best_choice(GB200, A2A, 64 * 1024, rack).proto == "LL"
    assert best_choice(GB200, A2A, 64 * 1024, rack, TRAYS).proto == "Simple"


def test_tray_nodes_pipeline_their_chunks_with_nvlinks_handshake():
    """Tray nodes change what NCCL's tuner sees, not the link under the chunks: an NVL72 ring's pipeline hands
    chunks over NVLink (LL128 1.9 µs, Simple 3.4 µs), not with the network hop (4.0, 14 µs) of a real node boundary.
    256 MiB all-gather over 64 GPUs, LL128: 2 sqrt(264 MB x 1.9 µs / 664 GB/s) = 55 µs, not 80 µs."""
    rack, size = Placement(64, 1, 64), 256 * 2**20
    trays = {c.proto: c for c in choices(GB200, AG, size, rack, TRAYS) if c.algo == "ring"}
    fused = {c.proto: c for c in choices(GB200, AG, size, rack) if c.algo == "ring"}
    for proto in ("LL", "LL128", "Simple"):
        assert trays[proto].pipeline_us == pytest.approx(fused[proto].pipeline_us)
        assert trays[proto].latency_us > fused[proto].latency_us  # the tuner's steps between trays still cost
    link_bytes = size * 63 / 64
    assert trays["LL128"].pipeline_us == pytest.approx(2 * math.sqrt(link_bytes * 1.9 / (664.0 * 1e3)), rel=0.01)
    # across real nodes the handshake is the network's
    two_nodes = {c.proto: c for c in choices(H100, AG, size, Placement(16, 2, 8)) if c.algo == "ring"}
    one_node = {c.proto: c for c in choices(H100, AG, size, Placement(8, 1, 8)) if c.algo == "ring"}
    assert two_nodes["Simple"].pipeline_us > one_node["Simple"].pipeline_us


def test_a3_mega_is_the_h100_on_gpudirect_tcpxo():
    """GCP A3 Mega: the H100 SXM with one 200 Gb/s NIC per GPU on GPUDirect-TCPXO; nothing else changes."""
    import dataclasses

    from echosim.backends.networks import NETWORKS, TCPXO

    h100, mega = DEVICES["h100-sxm"], DEVICES["h100-a3mega"]
    assert (mega.network, h100.network) == ("tcpxo", "infiniband") and NETWORKS["tcpxo"] is TCPXO
    assert mega.nic_GBps * 8 == TCPXO.nic_Gbps == 200.0 and h100.nic_GBps * 8 == 400.0
    own = ("name", "nic_GBps", "network", "source", "host_memory_GB")  # the VM's own memory: 1,872 GB
    same = [f.name for f in dataclasses.fields(h100) if f.name not in own]
    assert all(getattr(h100, f) == getattr(mega, f) for f in same)
    assert mega.host_memory_GB == 1872.0 and "accelerator-optimized-machines" in mega.source
    # Google's A3 Mega settings: Simple only, no NVLink SHARP; the plugin reports no latency of its own
    assert (TCPXO.protocols, TCPXO.nvls, TCPXO.latency_us) == (("Simple",), False, 0.0)
    assert "cloud.google.com" in mega.source and "nccl-plugin-gpudirect-tcpxo" in mega.source


def test_tcpxo_runs_every_collective_under_simple_without_nvls():
    """NCCL_PROTO=Simple and NCCL_NVLS_ENABLE=0 apply to every communicator of the job, inside a node too."""
    h100, mega = DEVICES["h100-sxm"], DEVICES["h100-a3mega"]
    one_node, two_nodes = Placement(8, 1, 8), Placement(16, 2, 8)
    assert {(c.algo, c.proto) for c in choices(mega, OpKind.ALL_REDUCE, 2**30, one_node)} == {
        ("ring", "Simple"),
        ("tree", "Simple"),
    }
    assert best_choice(h100, OpKind.ALL_REDUCE, 2**30, one_node).algo == "nvls"
    # 8 bytes over 2 x 8: tree Simple, 8.4 + 2 x (7 NVLink hops x 4.0 + 1 network hop x 14) = 92.4 µs
    small = best_choice(mega, OpKind.ALL_REDUCE, 8, two_nodes)
    assert (small.algo, small.proto) == ("tree", "Simple") and small.latency_us == pytest.approx(92.4)
    assert best_choice(h100, OpKind.ALL_REDUCE, 8, two_nodes).proto == "LL"  # InfiniBand keeps NCCL's defaults
    # a harness that asks for LL only still gets what the network runs
    only_ll = NcclConfig(protocols=("LL",))
    assert {c.proto for c in choices(mega, OpKind.ALL_GATHER, 4096, one_node, only_ll)} == {"Simple"}
    # the network leg: 8 NICs x 25 GB/s x IB_EFFICIENCY, half of the H100's 400 Gb/s NICs
    assert links_for(mega, two_nodes).inter_GBps == pytest.approx(links_for(h100, two_nodes).inter_GBps / 2)
    assert links_for(mega, two_nodes).inter_GBps == pytest.approx(8 * 25.0 * 0.94)


def test_a_network_plugins_reported_latency_is_added_per_network_hop(monkeypatch):
    """tuning.cc adds graph->latencyInter (the plugin's props.latency) to each network hop, twice for Simple."""
    import dataclasses

    from echosim.backends import networks

    slow = dataclasses.replace(networks.INFINIBAND, name="slow", latency_us=10.0)
    monkeypatch.setitem(networks.NETWORKS, "slow", slow)
    h100 = DEVICES["h100-sxm"]
    dev = dataclasses.replace(h100, network="slow")
    two_nodes = Placement(16, 2, 8)
    base = {(c.algo, c.proto): c.latency_us for c in choices(h100, OpKind.ALL_REDUCE, 8, two_nodes)}
    more = {(c.algo, c.proto): c.latency_us for c in choices(dev, OpKind.ALL_REDUCE, 8, two_nodes)}
    # tree: 2 x log2(2 nodes) network hops; ring all-reduce: 2 x (2 - 1) network steps
    for proto, per_hop in (("LL", 10.0), ("LL128", 10.0), ("Simple", 20.0)):
        assert more["tree", proto] - base["tree", proto] == pytest.approx(2 * per_hop)
    assert more["ring", "LL"] - base["ring", "LL"] == pytest.approx(2 * 10.0)
    one_node = Placement(8, 1, 8)  # no network hop, nothing added
    assert choices(dev, OpKind.ALL_REDUCE, 8, one_node) == choices(h100, OpKind.ALL_REDUCE, 8, one_node)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"network": "ethernet"}, "field 'network' is 'ethernet', expected one of infiniband, tcpxo"),
        ({"network": "tcpxo"}, "'nic_GBps' 50.0 is not the tcpxo NIC's 200 Gb/s"),
    ],
)
def test_a_device_names_a_known_network_at_its_nic_rate(change, message):
    import dataclasses

    with pytest.raises(ValueError, match=message):
        dataclasses.replace(DEVICES["h100-sxm"], **change)


def test_a_multi_node_simple_tree_fills_its_hops_one_fixed_step_at_a_time():
    """enqueue.cc: a tree's Simple chunk is one FIFO step (NCCL_BUFFSIZE / 8), not cut for mid-size messages, and
    each hop forwards a step once it has it whole, so the first step crosses all 2 x (7 NVLink + 1 network) hops."""
    from echosim.backends.collectives import NCCL_BUFFSIZE_BYTES, NCCL_STEPS, on_network

    mega, two_nodes = DEVICES["h100-a3mega"], Placement(16, 2, 8)
    assert NCCL_BUFFSIZE_BYTES == 4 << 20 and NCCL_STEPS == 8
    assert on_network(mega, NcclConfig()).buffsize_bytes == 8 << 20  # Google's NCCL_BUFFSIZE=8388608
    assert on_network(DEVICES["h100-sxm"], NcclConfig()) == NcclConfig()
    links = links_for(mega, two_nodes)  # 18 channels: 371 GB/s NVLink, 8 x 25 x 0.94 = 188 GB/s network

    def tree_simple(nbytes: int) -> object:
        return next(c for c in choices(mega, OpKind.ALL_REDUCE, nbytes, two_nodes) if c.algo == "tree")

    # 16 MiB: 932 KiB per channel, under one 1 MiB step: 14 NVLink hops at 371/18 GB/s and 2 network hops at
    # 188/18 GB/s, less the one the bandwidth term already counts
    per_channel = 16 * 2**20 / 18
    intra, net = per_channel / (links.intra_GBps / 18 * 1e3), per_channel / (links.inter_GBps / 18 * 1e3)
    assert tree_simple(16 * 2**20).pipeline_us == pytest.approx(14 * intra + 2 * net - net)
    assert tree_simple(16 * 2**20).pipeline_us == pytest.approx(722.8, abs=0.5)
    # from 18 MiB on the step is whole (1 MiB): the fill stops growing
    assert tree_simple(2**30).pipeline_us == pytest.approx(tree_simple(18 * 2**20).pipeline_us)
    assert tree_simple(18 * 2**20).pipeline_us == pytest.approx(722.8 * 18 / 16, rel=1e-3)


def test_a_tree_from_512_mib_runs_without_nccls_correction_factor() -> None:
    """tuning.cc (v2.30.7) ncclTopoGetAlgoTime corrects Tree bandwidth only while log2(bytes / 64) < 23; the table's
    24th entry serves NVLS Tree. A3 Mega 2 x 8 tree Simple: 0.9 at 256 MiB, none from 512 MiB (measured algbw at
    1-8 GiB: 159-181 GB/s, 90% of the 200 GB/s of NICs per node; 154 with the 0.9)."""
    mega, two_nodes = DEVICES["h100-a3mega"], Placement(16, 2, 8)

    def tree_simple(nbytes: int) -> float:
        c = [c for c in choices(mega, AR, nbytes, two_nodes) if (c.algo, c.proto) == ("tree", "Simple")]
        return c[0].algbw_GBps

    assert tree_simple(2**30) / tree_simple(2**28) == pytest.approx(1 / 0.9)
    assert tree_simple(2**29) == tree_simple(2**33)
    assert tree_simple(2**30) == pytest.approx(170.6, abs=0.1)
