"""MI300X cost model: roofline compute on 304 compute units and RCCL-style collectives.

Compute: a GEMM is tiled into 256 x 256 (or smaller) output tiles, one per compute unit,
and runs in waves over the 304 CUs at the measured large-GEMM efficiency; operand
traffic at achievable HBM bandwidth bounds it below. Memory-bound kernels move their
bytes at achievable bandwidth. Every kernel pays a launch overhead.

Collectives (RCCL): the eight GPUs of a node are fully connected by seven xGMI links
each, with no switch. RCCL runs ring channels over several Hamiltonian rings of that
mesh, so a ring collective reaches all seven links' bandwidth, but a single peer pair
only one link's. All-to-all sends to every peer at once over its own link. Across nodes
each GPU uses its own NIC; the intra-node mesh is never the bottleneck there. Latencies
use NCCL's tuner constants for PCIe-class hops, which RCCL inherits.
"""

from __future__ import annotations

import math
from dataclasses import asdict

from echosim.backends.base import OverlapModel, Placement
from echosim.ir.graph import Node
from echosim.ir.ops import AttentionAttrs, MatmulAttrs, OpKind, Phase
from echosim_mi300x.spec import MI300XSpec

TILES = ((256, 256), (256, 128), (128, 128), (128, 64), (64, 64))
RING_BASE_US = {"LL": 6.6, "Simple": 8.4}  # NCCL tuning.cc baseLatencies, Ring
XGMI_HOP_US = {"LL": 1.0, "Simple": 5.7}  # NCCL tuning.cc hwLatencies, PCI row, Ring
NET_HOP_US = {"LL": 2.7, "Simple": 14.0}  # NCCL tuning.cc hwLatencies, NET row, Ring
LL_SHARE = 0.5  # LL moves 8 bytes of flags per 8 of data: half the bus bandwidth
IB_EFFICIENCY = 0.94  # NDR reaches 46-48 of 50 GB/s per NIC (nccl-tests#290)

FREE_OPS = frozenset({OpKind.VIEW, OpKind.INPUT, OpKind.PARAMETER})


def _itemsize(dtype: str) -> int:
    return {"fp8": 1, "bf16": 2, "fp16": 2, "fp32": 4}.get(dtype, 2)


def matmul_time_s(dev: MI300XSpec, m: int, n: int, k: int, batch: int = 1, dtype: str = "bf16") -> float:
    if min(m, n, k, batch) <= 0:
        raise ValueError(f"matmul dims must be positive, got m={m} n={n} k={k} batch={batch}")
    per_cu = dev.peak_tflops(dtype) * 1e12 * dev.gemm_eff / dev.compute_units
    best = math.inf
    for tm, tn in TILES:
        tiles = batch * math.ceil(m / tm) * math.ceil(n / tn)
        waves = math.ceil(tiles / dev.compute_units)
        best = min(best, waves * 2 * tm * tn * k / per_cu)
    traffic = batch * (m * k + k * n + m * n) * _itemsize(dtype)
    memory = traffic / (dev.hbm_GBps * 1e9 * dev.hbm_stream_fraction)
    return max(best, memory) + dev.kernel_overhead_us * 1e-6


def memory_time_s(dev: MI300XSpec, nbytes: int) -> float:
    return nbytes / (dev.hbm_GBps * 1e9 * dev.hbm_stream_fraction) + dev.kernel_overhead_us * 1e-6


def attention_time_s(dev: MI300XSpec, a: AttentionAttrs, dtype: str, backward: bool) -> float:
    keep = 0.5 if a.causal and a.q_len == a.kv_len else 1.0
    flops = a.flops * keep * (2.5 if backward else 1.0)
    rate = dev.peak_tflops(dtype) * 1e12 * dev.gemm_eff * (dev.flash_eff if a.flash else 1.0)
    compute = flops / rate
    if not a.flash:  # scores written, soft-maxed (read + write) and read again
        scores = a.batch * a.heads * a.q_len * a.kv_len * _itemsize(dtype)
        compute += memory_time_s(dev, (4 if not backward else 6) * scores)
    return compute + dev.kernel_overhead_us * 1e-6


def _check(dev: MI300XSpec, p: Placement) -> None:
    if p.size != p.nodes * p.per_node or min(p.size, p.nodes, p.per_node, p.concurrent_per_node) < 1:
        raise ValueError(f"impossible placement {p}")
    if p.per_node * p.concurrent_per_node > dev.devices_per_node:
        raise ValueError(f"placement puts {p.per_node} x {p.concurrent_per_node} ranks on a node of 8 MI300X")


def collective_time_s(dev: MI300XSpec, kind: OpKind, nbytes: int, p: Placement) -> float:
    """The faster of RCCL's LL and Simple protocols for a ring (or direct) schedule."""
    if nbytes < 0:
        raise ValueError(f"byte count must be non-negative, got {nbytes}")
    _check(dev, p)
    n = p.size
    if n == 1 or nbytes == 0:
        return 0.0
    # Links a group member can drive inside the node: one per other member of its group.
    mesh_GBps = (p.per_node - 1) * dev.xgmi_link_GBps * dev.xgmi_efficiency if p.per_node > 1 else math.inf
    nics = min(p.per_node, dev.devices_per_node / p.concurrent_per_node)
    net_GBps = nics * dev.nic_GBps * IB_EFFICIENCY if p.nodes > 1 else math.inf
    if kind in (OpKind.SEND, OpKind.RECV):
        bw = dev.xgmi_link_GBps * dev.xgmi_efficiency if p.nodes == 1 else dev.nic_GBps * IB_EFFICIENCY
        hop = XGMI_HOP_US["Simple"] if p.nodes == 1 else NET_HOP_US["Simple"]
        return (RING_BASE_US["Simple"] + hop) * 1e-6 + nbytes / (bw * 1e9)
    if kind is OpKind.ALL_TO_ALL:  # direct: every peer over its own link, node traffic over the NICs
        intra = nbytes * (p.per_node - 1) / n / (mesh_GBps * 1e9) if p.per_node > 1 else 0.0
        inter = p.per_node * nbytes * (n - p.per_node) / n / (net_GBps * 1e9) if p.nodes > 1 else 0.0
        hop = NET_HOP_US["Simple"] if p.nodes > 1 else XGMI_HOP_US["Simple"]
        return (RING_BASE_US["Simple"] + hop) * 1e-6 + max(intra, inter)
    if kind is OpKind.ALL_REDUCE:
        steps, inter_steps = 2 * (n - 1), 2 * (p.nodes - 1)
    elif kind in (OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER):
        steps, inter_steps = n - 1, p.nodes - 1
    elif kind is OpKind.BROADCAST:
        steps, inter_steps = n, p.nodes - 1
    else:
        raise ValueError(f"{kind.value} is not a collective")
    bus = min(mesh_GBps, net_GBps)
    best = math.inf
    for proto in ("LL", "Simple"):
        latency = RING_BASE_US[proto] + (steps - inter_steps) * XGMI_HOP_US[proto] + inter_steps * NET_HOP_US[proto]
        bw = bus * (LL_SHARE if proto == "LL" else 1.0)
        best = min(best, latency * 1e-6 + nbytes * steps / n / (bw * 1e9))
    return best


class MI300XBackend:
    """One MI300X in an 8-GPU xGMI node with a 400 Gb/s NIC per GPU."""

    def __init__(self, spec: MI300XSpec) -> None:
        self.spec = spec
        self.name = spec.name
        # RCCL kernels hold one CU per channel (one channel per xGMI link): 7 of 304.
        share = spec.xgmi_links / spec.compute_units
        self._overlap = OverlapModel(compute_slowdown=1 / (1 - share), comm_slowdown=1.0)

    def op_time_s(self, node: Node, io_bytes: int) -> float:
        dtype = node.out.dtype.value if node.out.dtype.value in ("bf16", "fp16", "fp8", "fp32") else "bf16"
        if node.op in FREE_OPS:
            return 0.0
        if isinstance(node.attrs, MatmulAttrs):
            a = node.attrs
            return matmul_time_s(self.spec, a.m, a.n, a.k, a.batch, dtype)
        if isinstance(node.attrs, AttentionAttrs):
            return attention_time_s(self.spec, node.attrs, dtype, node.phase is Phase.BACKWARD)
        if node.op.is_collective:
            raise ValueError(f"{node.op.value} is a collective: use collective_time_s")
        return memory_time_s(self.spec, io_bytes)

    def collective_time_s(self, kind: OpKind, nbytes: int, placement: Placement) -> float:
        return collective_time_s(self.spec, kind, nbytes, placement)

    def overlap(self) -> OverlapModel:
        return self._overlap

    def memory_bytes(self) -> int:
        return int(self.spec.hbm_GB * 1e9)  # AMD quotes decimal GB

    def peak_flops(self, dtype: str) -> float:
        return self.spec.peak_tflops(dtype) * 1e12

    def describe(self) -> dict[str, object]:
        d: dict[str, object] = {"kind": "gpu", **asdict(self.spec), "overlap": asdict(self._overlap)}
        d["assumed"] = "hbm_stream_fraction, flash_eff, xgmi_efficiency, kernel_overhead_us (no MI300X measurement)"
        return d
