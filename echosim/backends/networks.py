"""Scale-out networks as data: what NCCL is told about a node's GPU NICs and the settings they run under.

A device's NIC rate per GPU is a device field (``DeviceSpec.nic_GBps``); its ``network`` names one
of :data:`NETWORKS`, which says what changes in NCCL's model beyond the rate:

* ``latency_us``: the latency the network's NCCL plugin reports (``ncclNetProperties_t.latency``).
  NCCL's topology search copies it into the graph (``graph->latencyInter``, src/graph/search.cc) and
  its tuner adds it to every network hop, twice for Simple (the flush) (src/graph/tuning.cc,
  v2.30.7). NCCL's own IB and socket transports report 0 (net_ib/init.cc, net_socket.cc).
* ``protocols`` and ``nvls``: the NCCL environment the provider's guides set for the network
  (``NCCL_PROTO``, ``NCCL_NVLS_ENABLE``). They are part of the network as deployed: every
  communicator of a job on those nodes runs under them, inside a node too.

Achieved bandwidth is NCCL's net bandwidth at the NIC's line rate times the measured fraction
(``collectives.IB_EFFICIENCY``), whatever the network.
"""

from __future__ import annotations

from dataclasses import dataclass

ALL_PROTOCOLS = ("LL", "LL128", "Simple")


@dataclass(frozen=True, slots=True)
class Network:
    """One scale-out network kind, as NCCL's tuner sees it (module doc)."""

    name: str
    latency_us: float  # plugin-reported latency NCCL adds per network hop (x2 for Simple)
    protocols: tuple[str, ...]  # NCCL protocols the deployment allows (NCCL_PROTO)
    nvls: bool  # NVLink SHARP allowed (NCCL_NVLS_ENABLE)
    nic_Gbps: float | None  # line rate of one GPU NIC where the network fixes it; None: the device's own
    source: str
    buffsize_bytes: int | None = None  # NCCL_BUFFSIZE the deployment sets; None: NCCL's default

    def __post_init__(self) -> None:
        if self.latency_us < 0:
            raise ValueError(f"network {self.name!r}: latency_us must be >= 0, got {self.latency_us}")
        if not self.protocols or any(p not in ALL_PROTOCOLS for p in self.protocols):
            raise ValueError(f"network {self.name!r}: protocols must be a non-empty subset of {ALL_PROTOCOLS}")
        if self.nic_Gbps is not None and self.nic_Gbps <= 0:
            raise ValueError(f"network {self.name!r}: nic_Gbps must be positive, got {self.nic_Gbps}")


INFINIBAND = Network(
    name="infiniband",
    latency_us=0.0,  # Source: NVIDIA/nccl src/transport/net_ib/init.cc, props->latency = 0
    protocols=ALL_PROTOCOLS,  # NCCL's defaults
    nvls=True,
    nic_Gbps=None,
    source="https://github.com/NVIDIA/nccl/blob/master/src/transport/net_ib/init.cc",
)

# Google Cloud A3 Mega (a3-megagpu-8g): 8 H100 GPUs, each with its own 200 Gb/s NIC for GPU traffic
# ("Secondary NICs (up to eight on A3 Mega machine types ...), each supporting up to 200 Gbps bandwidth
# for GPU data transfer", GKE "Maximize GPU network bandwidth in Autopilot mode clusters"; 1,800 Gbps per
# VM with the 200 Gbps host NIC, Compute Engine "Networking and GPU machines"). GPUDirect-TCPXO is TCP
# with the data path offloaded to Google's IPU NICs, GPU buffers registered by the Receive Datapath
# Manager; its NCCL plugin reports latency 0 (google/nccl-plugin-gpudirect-tcpxo, nccl_shim.cc
# GetProperties), so NCCL's tuner prices its hops as InfiniBand's. Google's A3 Mega NeMo container sets
# NCCL_PROTO=Simple, NCCL_ALGO=Ring,Tree and NCCL_NVLS_ENABLE=0 (cluster-toolkit
# examples/machine-learning/a3-megagpu-8g/nemo-framework/Dockerfile); apple/axlearn's A3 Mega settings
# say why: "TCPX only supports Simple protocol".
TCPXO = Network(
    name="tcpxo",
    latency_us=0.0,  # Source: nccl-plugin-gpudirect-tcpxo nccl_shim.cc, props.latency = 0
    protocols=("Simple",),  # Source: cluster-toolkit a3-megagpu-8g Dockerfile, NCCL_PROTO=Simple
    nvls=False,  # Source: same file, NCCL_NVLS_ENABLE=0
    nic_Gbps=200.0,  # Source: GKE GPUDirect-TCPXO page, 8 GPU NICs of up to 200 Gbps on A3 Mega
    buffsize_bytes=8 << 20,  # Source: cluster-toolkit a3-megagpu-8g Dockerfile, NCCL_BUFFSIZE=8388608
    source="https://cloud.google.com/kubernetes-engine/docs/how-to/gpu-bandwidth-gpudirect-tcpx-autopilot ; "
    "https://cloud.google.com/compute/docs/gpus/gpu-network-bandwidth ; "
    "https://github.com/google/nccl-plugin-gpudirect-tcpxo/blob/main/tcpdirect_plugin/fastrak_offload/nccl_shim.cc ; "
    "https://github.com/GoogleCloudPlatform/cluster-toolkit/blob/main/examples/machine-learning/a3-megagpu-8g/"
    "nemo-framework/Dockerfile",
)

NETWORKS: dict[str, Network] = {n.name: n for n in (INFINIBAND, TCPXO)}
