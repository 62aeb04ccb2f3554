"""White-box NCCL collective model: NCCL's own tuner on the group's real links.

For each collective NCCL predicts ``latency + bytes / algorithm_bandwidth`` for every
(algorithm, protocol) pair it may use and runs the cheapest. We do the same with the
constants of ``src/graph/tuning.cc`` (NCCL v2.30.7, transcribed in
``../shared/notes/collective-cost-models.md``). The link bandwidths are NCCL's too:
NVLink = links x NCCL's per-link figure (topo.h), network = the NICs a group may use
times the IB efficiency NCCL's maintainers quote. Protocol caps (LL, LL128), tree
correction factors and NVLS efficiency are NCCL's; nothing is fitted to a measured row.

Beyond NCCL's tuner, every protocol pays for chunked pipelining: data crosses each
connection in FIFO steps that the sender fills and flags and the receiver drains, so
with the best step size a transfer of ``B`` bytes at bandwidth ``W`` with a per-step
handshake ``h`` costs an extra ``2 * sqrt(B * h / W)`` (the classic optimal-segmentation
result for a two-stage pipeline). ``h`` is NCCL's per-hop latency for the protocol and
link. This is what makes measured bus bandwidth climb slowly from ~1 MB to ~1 GB.
NCCL does not see that cost when it chooses: its tuner ranks the candidates by
``latency + bytes / bandwidth`` alone (:meth:`Choice.tuner_us`), and the candidate it picks
is then costed with the pipeline included.

How a job issues its collectives changes the answer as much as the links do, so the
settings that steer NCCL's tuner are data too (:class:`NcclConfig`): an algorithm forced
with ``NCCL_ALGO``, protocols allowed, NVLink SHARP on or off, and how many GPUs one host
thread launches for. A collective never takes less than its launch: one kernel launch per
GPU the launching thread drives (``nccl_launch_us``, the node's host launch time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from echosim.backends.base import Placement
from echosim.backends.devices import DeviceSpec
from echosim.backends.networks import NETWORKS
from echosim.ir.ops import OpKind

PROTOCOLS = ("LL", "LL128", "Simple")
LL, LL128, SIMPLE = range(3)

# Source for every table below: NVIDIA/nccl src/graph/tuning.cc v2.30.7 (see module doc).
BASE_LATENCY_US = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "nvls": (0.0, 0.0, 0.0)}
NVLINK_HOP_US = {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "nvls": (0.0, 0.0, 25.0)}
NET_HOP_US = {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "nvls": (0.0, 0.0, 18.0)}
# Network post overhead (tuning.cc getNetOverhead): 1 µs on Intel hosts, 2 µs on AMD, 1 µs otherwise;
# x3 for Simple. It is the floor of an intra-node hop on multi-node rings.
NET_OVERHEAD_US = {"amd": 2.0}
NET_OVERHEAD_DEFAULT_US = 1.0
# llMaxBws, columns: 1 node, 2 nodes, >= 3 nodes. One node takes the GPU generation's row; on more nodes
# NCCL takes the row by host CPU vendor instead (tuning.cc: index1 = 1 for AMD hosts, else 0), so the
# multi-node columns come from LL_MAX_BW_MULTINODE, not from the GPU's row.
LL_MAX_BW = {"ampere": (87.7, 22.5, 19.0), "hopper": (141.0, 45.0, 35.0), "blackwell": (282.0, 90.0, 70.0)}
LL_MAX_BW_MULTINODE = {"amd": (87.7, 22.5, 19.0)}  # row 1 ("Ampere-N1/AMD-N2/AMD-N4")
LL_MAX_BW_MULTINODE_DEFAULT = (39.0, 39.0, 20.4)  # row 0 ("Volta-N1/Intel-N2/Intel-N4"): Intel, Arm
PER_CH_RING_LL128_BW = {"ampere": 20.0, "hopper": 36.7, "blackwell": 40.0}
PER_CH_TREE_BW = {"ampere": (24.0, 23.6, 17.8), "hopper": (38.7, 41.4, 36.0), "blackwell": (70.0, 42.8, 24.0)}
PER_CH_TREE_LL128_BW = {
    "ampere": (20.0, 20.0, 20.0),
    "hopper": (36.7, 36.7, 29.0),
    "blackwell": (55.6, 31.67, 20.0),
}
NVLS_EFFICIENCY = {"ampere": 0.0, "hopper": 0.85, "blackwell": 0.74}
# NVLS graph (src/graph/search.cc ncclTopoCompute and ncclTopoSearchTryNvls, v2.30.7; device.h NCCL_MAX_NVLS_ARITY):
# one NVLS channel per head GPU, at most NVLS_MAX_HEADS; on one node every GPU is a head (minChannels =
# maxChannels). The per-channel bandwidth is the first entry of the generation's intra-node speed array
# that fits: a GPU carries one channel speed on its NVSwitch links for every channel and two for the
# channel it heads. The search then raises bwInter up the same array to the first entry >= 2x that speed.
NVLS_MAX_HEADS = 32
NVLS_SPEEDS_GBPS = {
    "hopper": (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),  # sm90SpeedArrayIntra
    "blackwell": (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0),  # sm100SpeedArrayIntra
}
# treeCorrectionFactor[proto][log2(bytes/64)], 64 B .. 256 MB. ncclTopoGetAlgoTime applies it to Tree only while
# logSize < 23 (below 512 MiB); entry 23 serves NVLS Tree alone (tuning.cc v2.30.7), so a Tree from 512 MiB on
# runs uncorrected (TREE_UNCORRECTED_FROM).
TREE_UNCORRECTED_FROM = 23
TREE_CORRECTION = (
    (1, 1, 1, 1, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1, 1, 1, 1, 1),
    (1, 1, 1, 1, 1, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1, 1, 1),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
)  # fmt: skip
# the factors Tree runs with: entries from TREE_UNCORRECTED_FROM on are 1
TREE_CORRECTION_APPLIED = tuple((*row[:TREE_UNCORRECTED_FROM], 1.0) for row in TREE_CORRECTION)

# Achieved fraction of InfiniBand line rate: NDR 400 Gb/s reaches 46-48 of 50 GB/s per NIC
# (NCCL maintainer, nccl-tests#290), HDR reaches 96 of 100 GB/s per node (nccl-tests#119).
IB_EFFICIENCY = 0.94
# NCCL point-to-point over NVLink reaches ~65% of line rate: A100 sendrecv 195 of 300 GB/s
# (li-plus/playground nccl.md), H100 collective-permute 292 of 450 GB/s (XLA perf table);
# both rows are in microbench.csv.
P2P_NVLINK_EFFICIENCY = 0.65
# Point-to-point protocol (NCCL >= 2.14, enqueue.cc addP2pToPlan): a send or receive of at most
# NCCL_P2P_LL_THRESHOLD bytes runs LL when its connection has LL buffers, Simple otherwise.
# NVLink (P2P transport) connections always have them; network p2p connections only with
# NCCL_ALLOC_P2P_NET_LL_BUFFERS=1 (default 0), so across nodes small p2p stays Simple.
P2P_LL_THRESHOLD_BYTES = 16384
# How NCCL spreads one NVLink send (or receive) over channels (enqueue.cc scheduleP2pTasksToPlan and
# calcP2pChunkSize, NCCL >= 2.19): a communicator of R ranks has P p2p channels; one peer's transfer
# starts on P/R of them (halved until that many fit one per peer, at least 1), is cut into chunks of
# at least P2P_NVL_CHUNKSIZE/8 and at most 32 x P2P_NVL_CHUNKSIZE, and takes more channels (doubling,
# up to 4P/R) only when a chunk would pass that maximum. So a mid-size message runs on a few channels,
# each one CTA: P2P_NVL_CHUNK_BYTES is NCCL's default (init.cc, 512 KiB); P is the next power of two
# above the node's collective channels, capped at 32: "24 coll channels, 32 p2p channels" on an 8x H100
# node (p5.48xlarge log in an EKS nccl-tests README), "16 p2p channels" on H800's 8 NVLinks
# (NVIDIA/nccl#892); we take 2 per NVLink, rounded up to a power of two, at most 32.
P2P_NVL_CHUNK_BYTES = 1 << 19
P2P_MAX_CHANNELS = 32
# Host time NCCL takes to enqueue one ncclSend or ncclRecv inside a group (µs). Fitted: the slope per
# call of XLA's all-to-all floors (with validation.microbench.XLA_A2A_ISSUE_US, its fixed part).
NCCL_P2P_CALL_US = 0.23
# NCCL_BUFFSIZE's default (4 MiB, src/init.cc DEFAULT_BUFFSIZE) and the FIFO steps it is cut into
# (NCCL_STEPS, src/include/device.h): a Simple connection moves one step of buffsize / 8 at a time.
NCCL_BUFFSIZE_BYTES = 1 << 22
NCCL_STEPS = 8
# NVLS all-reduce before NCCL 2.20 (v2.18.5 and v2.19.4: enqueue.cc computeColl, and
# src/collectives/device/all_reduce.h RunWorkElement<ncclFuncAllReduce, ..., NCCL_ALGO_NVLS, ...>): it always runs
# on all NCCL_NVLS_NCHANNELS CTAs (16 by default, src/transport/nvls.cc), channel ``bid`` taking nHeads chunks per
# loop from offset ``bid x nHeads x chunk``; the chunk is NCCL_BUFFSIZE / NCCL_STEPS capped at 128 KiB and cut to
# 64, 32 and 16 KiB below 64, 8 and 2 x (channels x heads) chunks. A small message therefore fills the first
# channels with whole blocks while the rest idle. NCCL 2.20 spreads a collective's bytes evenly over its channels
# (enqueue.cc addCBDCollToPlan, maxBytesPerChannel), which is what nvls_choice costs by default.
NVLS_NCHANNELS = 16
NVLS_MAX_CHUNK_BYTES = 1 << 17
NVLS_CHUNK_CUTS = ((64, 1 << 16), (8, 1 << 15), (2, 1 << 14))


@dataclass(frozen=True, slots=True)
class NcclConfig:
    """How a job issues its collectives: the NCCL settings that change the tuner's choice.

    ``nvls``: NVLink SHARP allowed (``NCCL_NVLS_ENABLE``); ``nvls_gather``: all-gather and
    reduce-scatter may use it too (all-reduce only when False); ``algo``: an algorithm forced
    with ``NCCL_ALGO`` (``""``: the tuner's choice; one the hardware lacks leaves the choice
    to the tuner); ``protocols``: the protocols allowed (``NCCL_PROTO``);
    ``devices_per_thread``: GPUs whose kernels one host thread launches for each collective
    (``nccl-tests -g N`` drives N GPUs from one thread, a training job one GPU per process);
    ``nvls_chunk_hop``: each chunk an NVLS collective pipelines pays NVLS's own hop latency
    (25 µs in tuning.cc) instead of a ring Simple hop, so it reaches its bandwidth only at
    hundreds of MB (XLA's perf table; nccl-tests' NVLS rows climb with the ring hop).
    ``host_nodes``: NCCL counts each host of a multi-host NVLink domain (an NVL72 compute tray,
    ``DeviceSpec.gpus_per_host``) as a node of its own instead of fusing the domain into one
    (MNNVL topology fusion, NCCL >= 2.21): the tuner then prices the steps between trays with its
    network latencies and multi-node rules although the bytes still cross NVLink (:func:`tuner_placement`).
    ``a2a_issue_us`` and ``p2p_call_us``: host time an all-to-all spends before its kernel can run that
    the measurement does not hide (:func:`a2a_host_issue_us`): a fixed part and a part per ncclSend /
    ncclRecv call. Zero where launches pipeline behind earlier work (nccl-tests, a training step): there
    the calls only raise the launch floor (:func:`launch_floor_us`).
    ``buffsize_bytes``: ``NCCL_BUFFSIZE``, the Simple FIFO of a connection; a tree moves it in steps of
    ``buffsize_bytes / NCCL_STEPS`` per channel (:func:`_tree_chunk_fill_us`).
    ``nvls_even_split``: an NVLS all-reduce spreads its bytes evenly over its channels (NCCL >= 2.20);
    False: NCCL 2.18-2.19's fixed chunks fill the first channels and the busiest sets the time
    (:func:`nvls_busiest_bytes`).
    The defaults are NCCL's own.
    """

    nvls: bool = True
    nvls_gather: bool = True
    algo: str = ""
    protocols: tuple[str, ...] = PROTOCOLS
    devices_per_thread: int = 1
    nvls_chunk_hop: bool = False
    host_nodes: bool = False
    a2a_issue_us: float = 0.0
    p2p_call_us: float = 0.0
    buffsize_bytes: int = NCCL_BUFFSIZE_BYTES
    nvls_even_split: bool = True

    def __post_init__(self) -> None:
        if self.algo not in ("", "ring", "tree", "nvls"):
            raise ValueError(f"NCCL algorithm {self.algo!r} is not modelled (ring, tree, nvls)")
        unknown = [p for p in self.protocols if p not in PROTOCOLS]
        if unknown or not self.protocols:
            raise ValueError(f"NCCL protocols must be a non-empty subset of {PROTOCOLS}, got {self.protocols}")
        if self.devices_per_thread < 1:
            raise ValueError(f"devices_per_thread must be >= 1, got {self.devices_per_thread}")
        if self.a2a_issue_us < 0 or self.p2p_call_us < 0:
            raise ValueError(f"host issue times must be >= 0, got {self.a2a_issue_us}, {self.p2p_call_us}")


DEFAULT_NCCL = NcclConfig()


@dataclass(frozen=True, slots=True)
class Choice:
    """One (algorithm, protocol) candidate for a message of ``nbytes`` and its predicted time."""

    algo: str
    proto: str
    nbytes: int
    latency_us: float
    algbw_GBps: float
    pipeline_us: float

    @property
    def time_us(self) -> float:
        return self.latency_us + self.pipeline_us + self.nbytes / (self.algbw_GBps * 1e3)

    @property
    def tuner_us(self) -> float:
        """The time NCCL's tuner ranks this candidate by (enqueue.cc ``ncclTopoGetAlgoTime``:
        ``lat + nBytes / (1000 * bw)``): no pipelining cost, which NCCL does not model."""
        return self.latency_us + self.nbytes / (self.algbw_GBps * 1e3)


@dataclass(frozen=True, slots=True)
class Links:
    """Bandwidths (GB/s) one group sees on the topology it is placed on."""

    intra_GBps: float  # NVLink ring bus bandwidth (inf when one member per node)
    inter_GBps: float  # node NIC bandwidth available to this group (inf on one node)
    channels: int


def links_for(dev: DeviceSpec, p: Placement) -> Links:
    """NVLink and NIC bandwidth for a group, splitting the node's NICs among concurrent groups."""
    intra = dev.nvlink_busbw_GBps if p.per_node > 1 else math.inf
    if p.nodes == 1:
        return Links(intra, math.inf, dev.nvlink_links)
    # Each GPU has its own NIC; a group can use at most its members' NICs, and the node's
    # NICs are shared evenly among the groups communicating at the same time.
    nics = min(p.per_node, dev.devices_per_node / max(1, p.concurrent_per_node))
    inter = nics * dev.nic_GBps * IB_EFFICIENCY
    return Links(intra, inter, max(2, math.ceil(2 * nics)) if p.per_node == 1 else dev.nvlink_links)


def check_placement(dev: DeviceSpec, p: Placement) -> None:
    if p.size < 1 or p.nodes < 1 or p.per_node < 1 or p.concurrent_per_node < 1:
        raise ValueError(f"placement fields must be >= 1, got {p}")
    if p.size != p.nodes * p.per_node:
        raise ValueError(f"placement size {p.size} != nodes {p.nodes} x per_node {p.per_node}")
    if p.per_node * p.concurrent_per_node > dev.devices_per_node:
        raise ValueError(
            f"placement puts {p.per_node} x {p.concurrent_per_node} ranks on a node of "
            f"{dev.devices_per_node} {dev.name} devices"
        )


def tuner_placement(dev: DeviceSpec, p: Placement, nccl: NcclConfig = DEFAULT_NCCL) -> Placement:
    """The nodes NCCL's tuner sees: ``p`` itself, or with ``nccl.host_nodes`` one node per host of an NVLink domain.

    NCCL numbers nodes by host (init.cc: one node per distinct ring head; without MNNVL's topology
    fusion every host's GPUs form their own graph). A group inside one NVL72 rack then spans
    ``per_node / gpus_per_host`` tuner nodes, and tuning.cc prices it as a multi-node communicator:
    ring steps between hosts take the network hop, trees take log2(nodes) network hops, LL's cap
    takes its multi-node column and NVLS adds its network hop. Bandwidth is unchanged (:func:`links_for`).
    """
    host = dev.gpus_per_host
    if not nccl.host_nodes or host is None or p.nodes != 1 or p.per_node <= host:
        return p
    hosts = math.ceil(p.per_node / host)
    per_host = math.ceil(p.per_node / hosts)
    return Placement(hosts * per_host, hosts, per_host, p.concurrent_per_node)


def _node_col(nodes: int) -> int:
    return 0 if nodes == 1 else 1 if nodes == 2 else 2


def ll_max_bw(dev: DeviceSpec, nodes: int) -> float:
    """NCCL's LL bandwidth cap (llMaxBws): the GPU's row on one node, the host CPU's row across nodes."""
    col = _node_col(nodes)
    if col == 0:
        return LL_MAX_BW[dev.arch][0]
    return LL_MAX_BW_MULTINODE.get(dev.host_cpu_vendor, LL_MAX_BW_MULTINODE_DEFAULT)[col]


def net_overhead_us(dev: DeviceSpec) -> float:
    """NCCL's network post overhead for the node's host CPU (getNetOverhead), before the Simple x3."""
    return NET_OVERHEAD_US.get(dev.host_cpu_vendor, NET_OVERHEAD_DEFAULT_US)


def net_latency_us(dev: DeviceSpec, proto: int) -> float:
    """What NCCL's tuner adds to a network hop for the device's network plugin (``graph->latencyInter``):
    its reported latency, twice for Simple (tuning.cc: "the flush extra latency"). 0 for IB."""
    return NETWORKS[dev.network].latency_us * (2 if proto == SIMPLE else 1)


def on_network(dev: DeviceSpec, nccl: NcclConfig) -> NcclConfig:
    """``nccl`` within what the device's network runs under: its protocols only, NVLS only where it allows.

    A cloud network's deployment fixes NCCL settings for every communicator of the job
    (:data:`~echosim.backends.networks.NETWORKS`); a harness's own settings apply inside them.
    """
    net = NETWORKS[dev.network]
    protocols = tuple(p for p in nccl.protocols if p in net.protocols) or net.protocols
    buffsize = net.buffsize_bytes or nccl.buffsize_bytes
    if protocols == nccl.protocols and (net.nvls or not nccl.nvls) and buffsize == nccl.buffsize_bytes:
        return nccl
    return replace(nccl, protocols=protocols, nvls=nccl.nvls and net.nvls, buffsize_bytes=buffsize)


def _pipeline_us(nbytes_on_link: float, bw_GBps: float, handshake_us: float) -> float:
    """Extra time of an optimally chunked two-stage (fill, drain) pipeline over one link."""
    if not math.isfinite(bw_GBps) or nbytes_on_link <= 0:
        return 0.0
    return 2.0 * math.sqrt(nbytes_on_link * handshake_us / (bw_GBps * 1e3))


def _hop_latencies(dev: DeviceSpec, algo: str, proto: int, p: Placement) -> tuple[float, float]:
    intra = NVLINK_HOP_US[algo][proto]
    inter = (NET_HOP_US["tree"] if p.per_node == 1 else NET_HOP_US[algo])[proto]
    inter += net_latency_us(dev, proto)
    if p.nodes > 1 and algo == "ring":  # tuning.cc applies the overhead to ring latencies only
        intra = max(intra, net_overhead_us(dev) * (3 if proto == SIMPLE else 1))
    return intra, inter


def ring_choices(
    dev: DeviceSpec, kind: OpKind, nbytes: int, p: Placement, links: Links, tp: Placement | None = None
) -> list[Choice]:
    """Ring candidates; ``tp`` is the placement NCCL's tuner sees (:func:`tuner_placement`), ``p`` by default."""
    tp = tp or p
    n, nodes = p.size, tp.nodes
    if kind is OpKind.ALL_REDUCE:
        steps, inter_steps = 2 * (n - 1), 2 * (nodes - 1)
    elif kind in (OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER):
        steps, inter_steps = n - 1, nodes - 1
    else:  # broadcast: a pipelined chain
        steps, inter_steps = n, nodes - 1
    bus = min(links.intra_GBps, links.inter_GBps)
    ratio = n / steps
    out = []
    for proto in range(3):
        intra_hop, inter_hop = _hop_latencies(dev, "ring", proto, tp)
        lat = BASE_LATENCY_US["ring"][proto] + (steps - inter_steps) * intra_hop + inter_steps * inter_hop
        if proto == SIMPLE and kind is OpKind.ALL_REDUCE and nodes > 1 and nbytes / (links.channels * n) >= 64:
            lat *= 1.4  # NCCL's "plateau effect" for multi-node Simple rings on sm80+
        if proto == LL:
            bw = min(ll_max_bw(dev, p.nodes), bus * 0.5)
        elif proto == LL128:
            bw = min(bus * 0.92, links.channels * PER_CH_RING_LL128_BW[dev.arch])
        else:
            bw = bus
        # The chunks' handshake crosses the physical link: NVLink inside one NVLink domain even where
        # the tuner counts its hosts as nodes (tuner_placement), the network across real nodes.
        hop = inter_hop if p.nodes > 1 else NVLINK_HOP_US["ring"][proto]
        pipe = _pipeline_us(nbytes / ratio, bw, hop)
        out.append(Choice("ring", PROTOCOLS[proto], nbytes, lat, bw * ratio, pipe))
    return out


def _tree_chunk_fill_us(nbytes: int, links: Links, ppn: int, nodes: int, buffsize: int) -> float:
    """Fill time of a Simple tree's fixed-size chunks: each hop forwards one step (buffsize / NCCL_STEPS)
    per channel after receiving it whole, so the first chunk crosses every hop of the chain up and
    back down before the pipeline runs at its slowest hop's rate (counted in the bandwidth term)."""
    per_channel = nbytes / links.channels
    chunk = min(buffsize / NCCL_STEPS, per_channel)
    r_intra = links.intra_GBps / links.channels * 1e3
    r_net = links.inter_GBps / links.channels * 1e3
    hops = 2 * (ppn - 1) * chunk / r_intra + 2 * math.log2(nodes) * chunk / r_net
    return max(0.0, hops - chunk / min(r_intra, r_net))


def tree_choices(
    dev: DeviceSpec,
    nbytes: int,
    p: Placement,
    links: Links,
    tp: Placement | None = None,
    buffsize: int = NCCL_BUFFSIZE_BYTES,
) -> list[Choice]:
    """Double binary tree across nodes, chain inside a node (all-reduce only); ``tp`` as for :func:`ring_choices`."""
    tp = tp or p
    nodes, ppn = tp.nodes, tp.per_node
    col = _node_col(nodes)
    # NCCL takes the intra-node bandwidth on <= 2 nodes (the 2-node tree halves network
    # traffic per node) and the network bandwidth beyond.
    bus = min(links.intra_GBps, 2 * links.inter_GBps) if nodes <= 2 else min(links.intra_GBps, links.inter_GBps)
    bus = min(bus * 0.92, links.channels * PER_CH_TREE_BW[dev.arch][col])
    # Interpolate the correction table in log2(bytes) so time stays monotone in size.
    x = min(23.0, max(0.0, math.log2(max(nbytes, 64) / 64)))
    lo = int(x)
    hi, frac = min(23, lo + 1), x - lo
    out = []
    for proto in range(3):
        intra_hop, inter_hop = _hop_latencies(dev, "tree", proto, tp)
        lat = BASE_LATENCY_US["tree"][proto] + 2 * ((ppn - 1) * intra_hop + math.log2(nodes) * inter_hop)
        if proto == LL:
            bw = min(bus / 3.8, ll_max_bw(dev, nodes))
        elif proto == LL128:
            bw = min(
                bus * (7 / 9 if nodes == 1 else 120 / 128),
                links.channels * PER_CH_TREE_LL128_BW[dev.arch][col],
            )
        else:
            bw = bus
        table = TREE_CORRECTION_APPLIED[proto]
        bw *= table[lo] + (table[hi] - table[lo]) * frac
        pipe = _pipeline_us(nbytes, bw, inter_hop if p.nodes > 1 else NVLINK_HOP_US["tree"][proto])
        if proto == SIMPLE and p.nodes > 1:
            pipe = _tree_chunk_fill_us(nbytes, links, ppn, nodes, buffsize)
        out.append(Choice("tree", PROTOCOLS[proto], nbytes, lat, bw * 0.5, pipe))
    return out


def nvls_graph(dev: DeviceSpec, n: int) -> tuple[int, float, float]:
    """NCCL's NVLS graph on one node of ``n`` GPUs: (channels, bwIntra, bwInter) per channel in GB/s.

    The arrays start at 60 GB/s (Hopper) and 90 GB/s (Blackwell), so small groups get few channels
    at a capped speed: 8 H100s get 8 x 40, 4 get 4 x 60 and 2 get 2 x 60 (the bus cannot be filled).
    """
    speeds = NVLS_SPEEDS_GBPS[dev.arch]
    heads = min(NVLS_MAX_HEADS, n)
    fits = [i for i, s in enumerate(speeds) if (heads + 1) * s <= dev.nvlink_busbw_GBps]
    i = fits[0] if fits else len(speeds) - 1
    j = i
    while j > 0 and speeds[j] < 2 * speeds[i]:
        j -= 1
    return heads, speeds[i], speeds[j]


def nvls_busiest_bytes(
    nbytes: int, heads: int, channels: int = NVLS_NCHANNELS, buffsize: int = NCCL_BUFFSIZE_BYTES
) -> int:
    """Bytes that would take an evenly split NVLS all-reduce as long as NCCL 2.18-2.19 takes for ``nbytes``:
    ``channels`` x what its busiest channel moves (see :data:`NVLS_NCHANNELS`). From 2 MiB (16 channels of
    8 heads x 16 KiB) up it is ``nbytes`` rounded up to whole loops; below, one channel's block of
    ``min(nbytes, heads x chunk)`` bytes, which the other channels would have shared since NCCL 2.20."""
    if nbytes <= 0:
        return nbytes
    chunk = min(buffsize // NCCL_STEPS, NVLS_MAX_CHUNK_BYTES)
    for factor, cut in NVLS_CHUNK_CUTS:
        if nbytes < factor * channels * heads * chunk and chunk > cut:
            chunk = cut
    block = heads * chunk
    loop = channels * block
    loops = math.ceil(nbytes / loop)
    return channels * ((loops - 1) * block + min(block, nbytes - (loops - 1) * loop))


def nvls_choice(
    dev: DeviceSpec, kind: OpKind, nbytes: int, p: Placement, nccl: NcclConfig = DEFAULT_NCCL
) -> Choice | None:
    """NVLink SHARP: the switch reduces (multimem.ld_reduce) and multicasts (multimem.st).

    Bandwidth is NCCL's (tuning.cc v2.30.7) on its NVLS graph (:func:`nvls_graph`): per channel
    ``bwIntra * nvlsEfficiency * (channels-1)/channels``, doubled for all-reduce (two operations
    pipelined) and capped by bwInter, times ``(n-1)/n`` for all-gather and reduce-scatter; bus
    bandwidth = channels x that, converted to algorithm bandwidth with the ring's ``n / nsteps``.
    Per GPU an all-reduce moves ``S (1 + 1/n)`` each way and all-gather / reduce-scatter ``S``, which
    sets the bytes its chunks pipeline.
    """
    efficiency = NVLS_EFFICIENCY[dev.arch]
    if efficiency <= 0 or p.nodes != 1 or p.size < 2:
        return None
    n = p.size
    heads, bw_intra, bw_inter = nvls_graph(dev, n)
    per_channel = bw_intra * efficiency * (heads - 1) / heads
    if kind is OpKind.ALL_REDUCE:
        traffic, algbw = 1 + 1 / n, heads * min(2 * per_channel, bw_inter) * n / (2 * (n - 1))
    elif kind in (OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER):
        traffic, algbw = 1.0, heads * min(per_channel * (n - 1) / n, bw_inter) * n / (n - 1)
    else:
        return None
    lat = NVLINK_HOP_US["nvls"][SIMPLE]
    if tuner_placement(dev, p, nccl).nodes > 1:  # tuning.cc: NVLS over several nodes adds its network hop
        lat += NET_HOP_US["nvls"][SIMPLE]
    handshake = NVLINK_HOP_US["nvls" if nccl.nvls_chunk_hop else "ring"][SIMPLE]
    pipe = _pipeline_us(nbytes * traffic, algbw * traffic, handshake)
    if kind is OpKind.ALL_REDUCE and not nccl.nvls_even_split:
        # the busiest channel's bytes set the time; NCCL's tuner still ranks by nbytes
        busiest = nvls_busiest_bytes(nbytes, heads, buffsize=nccl.buffsize_bytes)
        pipe = _pipeline_us(busiest * traffic, algbw * traffic, handshake) + (busiest - nbytes) / (algbw * 1e3)
    return Choice("nvls", "Simple", nbytes, lat, algbw, pipe)


def p2p_uses_ll(peer_bytes: float, p: Placement, nccl: NcclConfig = DEFAULT_NCCL) -> bool:
    """Whether NCCL sends one peer's ``peer_bytes`` with LL: small, on one node's NVLink, LL allowed.

    ``p`` is the placement NCCL sees (:func:`tuner_placement`): peers on other nodes get no LL buffers.
    """
    return p.nodes == 1 and peer_bytes <= P2P_LL_THRESHOLD_BYTES and "LL" in nccl.protocols


def _ll_p2p_choice(dev: DeviceSpec, nbytes: int, peer_bytes: float, link_GBps: float) -> Choice:
    """Small NVLink send/recv in LL: one LL step (ring LL base + NVLink LL hop), half the link's rate.

    ``nbytes`` is the op's buffer and ``peer_bytes`` what crosses one connection; the peers'
    connections run side by side, so the op's time is one connection's.
    """
    bw = min(LL_MAX_BW[dev.arch][0], link_GBps * 0.5)
    lat = BASE_LATENCY_US["ring"][LL] + NVLINK_HOP_US["ring"][LL]
    return Choice("p2p", "LL", nbytes, lat, bw * nbytes / peer_bytes if peer_bytes > 0 else math.inf, 0.0)


def all_to_all_choice(
    dev: DeviceSpec, nbytes: int, p: Placement, links: Links, nccl: NcclConfig = DEFAULT_NCCL
) -> Choice:
    """Grouped send/recv to every peer: NVLink and NIC traffic proceed side by side.

    Each NVLink peer's share runs on the channels :func:`p2p_channels` gives it (the node's p2p
    channels at most), as a single send would, so small shares in a large group use few CTAs.
    """
    n = p.size
    peer_bytes = nbytes / n
    if p.per_node > 1 and p2p_uses_ll(peer_bytes, tuner_placement(dev, p, nccl), nccl):
        ll = _ll_p2p_choice(dev, nbytes, peer_bytes, links.intra_GBps)
        return replace(ll, latency_us=ll.latency_us + a2a_host_issue_us(n, nccl))
    intra_bytes = nbytes * (p.per_node - 1) / n  # per rank, to peers in its node
    node_net_bytes = p.per_node * nbytes * (n - p.per_node) / n  # per node, leaving it
    lat = BASE_LATENCY_US["ring"][SIMPLE]
    busy_us, pipe = 0.0, 0.0
    if p.per_node > 1:
        per_peer = p2p_channels(dev, peer_bytes, n)
        channels = min(p2p_channel_count(dev), (p.per_node - 1) * per_peer)
        # round d sends to rank+d and receives from rank-d on the same channels (a ring exchange)
        rate = min(links.intra_GBps, channels * PER_CH_RING_LL128_BW[dev.arch] / 2)
        busy_us = intra_bytes / (rate * 1e3)
        hop = NVLINK_HOP_US["ring"][SIMPLE]
        steps = peer_bytes / per_peer > P2P_NVL_CHUNK_BYTES
        pipe = _pipeline_us(intra_bytes, rate if steps else links.intra_GBps, hop)
    if p.nodes > 1:
        hop = NET_HOP_US["ring"][SIMPLE]
        net_us = node_net_bytes / (links.inter_GBps * 1e3)
        if net_us >= busy_us:
            busy_us, pipe = net_us, _pipeline_us(node_net_bytes, links.inter_GBps, hop)
    lat += NET_HOP_US["ring"][SIMPLE] if p.nodes > 1 else NVLINK_HOP_US["ring"][SIMPLE]
    lat += a2a_host_issue_us(n, nccl)
    bw = nbytes / (busy_us * 1e3) if busy_us > 0 else math.inf
    return Choice("p2p", "Simple", nbytes, lat, bw, pipe)


def a2a_host_issue_us(n: int, nccl: NcclConfig = DEFAULT_NCCL) -> float:
    """Host time before an all-to-all of ``n`` ranks can start that a harness timing one op from the host sees.

    An all-to-all is one NCCL group of ``2n`` calls, a send to and a receive from every rank, itself
    included (XLA's ``NcclCommunicator::LaunchAllToAll``; PyTorch's ``all_to_all_single`` the same); the
    kernel starts at ``ncclGroupEnd``, after all of them. XLA's collective perf table times a single-op
    executable from the host, thunks issued to stream done (``gpu_executable.cc``: ``compute_time_ns``
    = ``NowNanos`` before the thunks to after ``BlockHostUntilDone``), so this issue time adds to the
    kernel's instead of hiding behind the previous iteration as in nccl-tests.
    """
    return nccl.a2a_issue_us + 2 * n * nccl.p2p_call_us


def p2p_channel_count(dev: DeviceSpec) -> int:
    """NCCL's p2p channels on one node (``P`` above): two per NVLink, a power of two, at most 32."""
    return min(P2P_MAX_CHANNELS, 2 ** math.ceil(math.log2(2 * max(1, dev.nvlink_links))))


def p2p_channels(dev: DeviceSpec, nbytes: float, ranks: int) -> int:
    """Channels NCCL runs one NVLink send of ``nbytes`` on, in a communicator of ``ranks`` ranks."""
    total = p2p_channel_count(dev)
    lo = hi = total  # p2pnChannelsPerPeer
    while lo * ranks > total and lo > 1:
        lo //= 2
    while hi * ranks > total * 4 and hi > 1:
        hi //= 2
    min_chunk, max_chunk = P2P_NVL_CHUNK_BYTES // 8, P2P_NVL_CHUNK_BYTES * 32
    chunk, used = max(min_chunk, math.ceil(nbytes / lo)), lo
    while chunk > max_chunk and used <= hi // 2:
        used *= 2
        chunk = math.ceil(nbytes / used)
    chunk = math.ceil(chunk / min_chunk) * min_chunk
    return max(1, min(used, math.ceil(nbytes / chunk)))


def p2p_choice(
    dev: DeviceSpec, nbytes: int, p: Placement, nccl: NcclConfig = DEFAULT_NCCL, exchange: bool = False
) -> Choice:
    """One send/recv: NVLink peer copy on a node, the GPU's own NIC across nodes.

    ``exchange``: a ring exchange (each rank sends to the next and receives from the previous in
    one group, echosim's RECV): NCCL schedules a send to rank+d and a receive from rank-d in the
    same round on the same channels, so each channel's CTA splits its warps between the two and
    moves half its rate each way. A send whose receive pairs with another round (the neighbouring
    pipeline stage sending back, a swap) keeps whole channels.

    ``p`` is the communicator the send belongs to (``p.size`` ranks; a pair is ``Placement(2, ...)``).
    On NVLink a send runs on :func:`p2p_channels` channels, each one CTA that moves what NCCL lets
    one ring LL128 channel move (``PER_CH_RING_LL128_BW``, its per-channel figure for the GPU
    generation): below tens of MB a send in an 8-rank communicator gets 4 channels, well under
    the link. A channel whose chunk spans more than one FIFO step (``P2P_NVL_CHUNK_BYTES``)
    pipelines it at its own rate; a one-step chunk has no pipeline of its own.
    """
    if p2p_uses_ll(nbytes, tuner_placement(dev, p, nccl), nccl):
        return _ll_p2p_choice(dev, nbytes, nbytes, dev.nvlink_GBps * P2P_NVLINK_EFFICIENCY)
    if p.nodes == 1:
        link = dev.nvlink_GBps * P2P_NVLINK_EFFICIENCY
        channels = p2p_channels(dev, nbytes, p.size)
        bw = min(link, channels * PER_CH_RING_LL128_BW[dev.arch] / (2 if exchange else 1))
        hop = NVLINK_HOP_US["ring"][SIMPLE]
        steps = nbytes / channels > P2P_NVL_CHUNK_BYTES
        pipe = _pipeline_us(nbytes, bw if steps else link, hop)
    else:
        share = min(1.0, dev.devices_per_node / (p.per_node * p.concurrent_per_node))
        bw, hop = dev.nic_GBps * IB_EFFICIENCY * share, NET_HOP_US["ring"][SIMPLE]
        pipe = _pipeline_us(nbytes, bw, hop)
    return Choice("p2p", "Simple", nbytes, BASE_LATENCY_US["ring"][SIMPLE] + hop, bw, pipe)


def choices(dev: DeviceSpec, kind: OpKind, nbytes: int, p: Placement, nccl: NcclConfig = DEFAULT_NCCL) -> list[Choice]:
    """Every candidate NCCL would consider for this collective under ``nccl``'s settings (on the device's network)."""
    check_placement(dev, p)
    nccl = on_network(dev, nccl)
    links = links_for(dev, p)
    if kind in (OpKind.SEND, OpKind.RECV):
        return [p2p_choice(dev, nbytes, p, nccl, exchange=kind is OpKind.RECV)]
    if kind is OpKind.ALL_TO_ALL:
        return [all_to_all_choice(dev, nbytes, p, links, nccl)]
    if kind not in (OpKind.ALL_REDUCE, OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER, OpKind.BROADCAST):
        raise ValueError(f"{kind.value} is not a collective")
    tp = tuner_placement(dev, p, nccl)
    out = ring_choices(dev, kind, nbytes, p, links, tp)
    if kind is OpKind.ALL_REDUCE:
        out += tree_choices(dev, nbytes, p, links, tp, nccl.buffsize_bytes)
    use_nvls = nccl.nvls and (kind is OpKind.ALL_REDUCE or nccl.nvls_gather)
    nvls = nvls_choice(dev, kind, nbytes, p, nccl) if use_nvls else None
    if nvls is not None:
        out.append(nvls)
    allowed = [c for c in out if c.proto in nccl.protocols] or out
    forced = [c for c in allowed if c.algo == nccl.algo]
    return forced or allowed  # a forced algorithm the hardware lacks: the tuner chooses


def best_choice(dev: DeviceSpec, kind: OpKind, nbytes: int, p: Placement, nccl: NcclConfig = DEFAULT_NCCL) -> Choice:
    """The candidate NCCL's tuner would pick: the lowest time by NCCL's own formula (:attr:`Choice.tuner_us`).

    The pipelining cost this model adds is left out of the ranking, as NCCL's getAlgoInfo ranks
    candidates without it; the pick is costed with it (:attr:`Choice.time_us`).
    """
    return min(choices(dev, kind, nbytes, p, nccl), key=lambda c: c.tuner_us)


def launch_floor_us(dev: DeviceSpec, nccl: NcclConfig, kind: OpKind | None = None, ranks: int = 1) -> float:
    """Host time to launch one collective: one kernel per GPU the launching thread drives.

    Back-to-back collectives pipeline their launches, so a collective costs at least the
    time its thread needs to launch the next one (``nccl-tests -g 8``: eight launches).
    The launch is NCCL's host-side enqueue plus ``cudaLaunchKernel``: a host property
    (``nccl_launch_us``), measured per node type, not the GPU's in-stream kernel gap.
    An all-to-all of ``ranks`` ranks is one group of ``2 x ranks`` ncclSend / ncclRecv calls
    (nccl-tests' ``alltoall_perf``, PyTorch's ``all_to_all_single``), each enqueued on the host
    (``NCCL_P2P_CALL_US``) before the group's kernel launches.
    """
    calls = 2 * ranks * NCCL_P2P_CALL_US if kind is OpKind.ALL_TO_ALL else 0.0
    return nccl.devices_per_thread * (dev.nccl_launch_us + calls)


def collective_time_s(
    dev: DeviceSpec, kind: OpKind, nbytes: int, p: Placement, nccl: NcclConfig = DEFAULT_NCCL
) -> float:
    """Seconds for one collective of ``nbytes`` (nccl-tests buffer convention)."""
    if nbytes < 0:
        raise ValueError(f"byte count must be non-negative, got {nbytes}")
    if p.size == 1 or nbytes == 0:
        check_placement(dev, p)
        return 0.0
    gpu_us = best_choice(dev, kind, nbytes, p, nccl).time_us
    return max(gpu_us, launch_floor_us(dev, nccl, kind, p.size)) * 1e-6
