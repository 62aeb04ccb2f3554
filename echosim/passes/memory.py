"""Memory analysis of one pipeline stage on one rank.

Static state follows Megatron-LM mixed precision: a 16-bit weight (2 bytes), an
fp32 main gradient (4) and Adam's fp32 master weight, momentum and variance (12)
for each local parameter: 18 bytes; plain fp32 training keeps 4 + 4 + 8 = 16. ZeRO
divides the optimizer state (stage 1), then the gradients (2), then the weights (3)
by the data-parallel degree (Rajbhandari et al. 2020, sec. 5). Activations are the
forward values that the backward (or its recompute) reads, derived from the graph;
a stage holds the activations of every micro-batch whose backward has not run yet
(1F1B: up to ``pp - stage`` of them).
"""

from __future__ import annotations

from dataclasses import dataclass

from echosim.ir.graph import Graph, Node
from echosim.ir.ops import AttentionAttrs, Axis, CollectiveAttrs, ElementwiseAttrs, OpKind, Phase

# PyTorch's caching allocator never returns all it reserves; a typical share is 5-10%.
FRAGMENTATION = 0.07
# NCCL keeps NCCL_BUFFSIZE (4 MiB default) per channel and peer; with up to 32 channels and
# two ring neighbours that is 256 MiB per communicator (NCCL environment-variable docs).
NCCL_BUFFERS_PER_GROUP = 2 * 32 * 4 * 2**20


@dataclass(frozen=True)
class StatePolicy:
    """Bytes of weight, gradient and optimizer state per local parameter."""

    weight_bytes: float
    grad_bytes: float
    optimizer_bytes: float

    @classmethod
    def for_training(cls, dtype: str, zero: int = 0, dp: int = 1, fp32_grads: bool = True) -> StatePolicy:
        """``fp32_grads``: Megatron accumulates into fp32 main grads; DeepSpeed (the ZeRO paper) keeps 16-bit."""
        mixed = dtype != "fp32"
        weight, grad, opt = (2.0, 4.0 if fp32_grads else 2.0, 12.0) if mixed else (4.0, 4.0, 8.0)
        if zero >= 1:
            opt /= dp
        if zero >= 2:
            grad /= dp
        if zero >= 3:
            weight /= dp
        return cls(weight, grad, opt)


@dataclass(frozen=True)
class MemoryBreakdown:
    params: int
    grads: int
    optimizer: int
    activations: int
    transient: int
    comm_buffers: int
    fragmentation: int
    capacity: int

    @property
    def peak(self) -> int:
        parts = (self.params, self.grads, self.optimizer, self.activations, self.transient, self.comm_buffers)
        return sum(parts) + self.fragmentation

    def largest(self, count: int = 2) -> list[tuple[str, int]]:
        parts = {k: v for k, v in self.as_dict().items() if k not in ("peak", "capacity", "fits")}
        return sorted(((k, int(v)) for k, v in parts.items()), key=lambda kv: -kv[1])[:count]

    @property
    def fits(self) -> bool:
        return self.peak <= self.capacity

    def as_dict(self) -> dict[str, int | bool]:
        return {
            "params": self.params,
            "grads": self.grads,
            "optimizer": self.optimizer,
            "activations": self.activations,
            "transient": self.transient,
            "comm_buffers": self.comm_buffers,
            "fragmentation": self.fragmentation,
            "peak": self.peak,
            "capacity": self.capacity,
            "fits": self.fits,
        }


def _base(graph: Graph, nid: int) -> int:
    """Follow views to the value that owns the storage."""
    while graph[nid].op is OpKind.VIEW and graph[nid].inputs:
        nid = graph[nid].inputs[0]
    return nid


def _saved_bytes(node: Node, only_own_grad: bool, own_grad_reads: bool) -> int:
    """Bytes kept for backward; a dropout read only by its own gradient keeps just its mask.

    Attention keeps its softmax statistics (and, materialised, its score matrices) only
    for its own backward: when that backward reads a recomputed copy, only the output stays.
    """
    if isinstance(node.attrs, ElementwiseAttrs) and node.attrs.fn == "dropout" and only_own_grad:
        return node.out.numel  # a 1-byte mask
    if isinstance(node.attrs, AttentionAttrs):
        a = node.attrs
        if not own_grad_reads:
            return node.out.nbytes
        lse = a.batch * a.heads * a.q_len * 4  # softmax statistics (fp32)
        if a.flash:
            return node.out.nbytes + lse
        scores = a.batch * a.heads * a.q_len * a.kv_len
        # softmax output, dropout mask (1 byte), dropout output: 5 bytes per score in 16-bit
        return node.out.nbytes + scores * (2 * node.out.dtype.itemsize + 1)
    return node.out.nbytes


def activation_bytes(graph: Graph) -> int:
    """Bytes saved by one micro-batch's forward for its backward, on this rank.

    A value read inside a repeated block is saved once per repetition, even when it
    is produced outside it: in the unfolded model each layer reads its own input.
    """
    mult: dict[int, int] = {}
    own_only: dict[int, bool] = {}
    own_reads: dict[int, bool] = {}
    for n in graph:
        if n.phase not in (Phase.BACKWARD, Phase.RECOMPUTE):
            continue
        for i in n.inputs:
            src = graph[_base(graph, i)]
            if src.phase is not Phase.FORWARD or src.op in (OpKind.PARAMETER, OpKind.INPUT):
                continue
            if not src.inputs and src.op is not OpKind.RECV:
                continue
            mult[src.id] = max(mult.get(src.id, 0), graph.multiplicity(n), graph.multiplicity(src))
            own_only[src.id] = own_only.get(src.id, True) and n.origin == src.id
            own_reads[src.id] = own_reads.get(src.id, False) or (n.origin == src.id and i == src.id)
    return sum(_saved_bytes(graph[nid], own_only[nid], own_reads[nid]) * k for nid, k in mult.items())


def transient_bytes(graph: Graph) -> int:
    """Working set on top of saved activations: the largest single value produced in backward.

    With full recompute this also holds one layer's replayed activations.
    """
    largest = max((n.out.nbytes for n in graph if n.phase is Phase.BACKWARD), default=0)
    replay = sum(n.out.nbytes for n in graph if n.phase is Phase.RECOMPUTE and n.op is not OpKind.VIEW)
    return largest * 2 + replay


def stage_memory(
    graph: Graph,
    in_flight: int,
    capacity: int,
    local_params: int,
    policy: StatePolicy | None = None,
    comm_groups: int = 0,
) -> MemoryBreakdown:
    """Peak memory of one rank of a stage; ``comm_groups`` counts its NCCL communicators."""
    policy = policy or StatePolicy.for_training("bf16")
    act = activation_bytes(graph) * in_flight
    transient = transient_bytes(graph) + _gathered_weights(graph)
    frag = int(FRAGMENTATION * (act + transient))
    return MemoryBreakdown(
        params=int(local_params * policy.weight_bytes),
        grads=int(local_params * policy.grad_bytes),
        optimizer=int(local_params * policy.optimizer_bytes),
        activations=act,
        transient=transient,
        comm_buffers=comm_groups * NCCL_BUFFERS_PER_GROUP,
        fragmentation=frag,
        capacity=capacity,
    )


def _gathered_weights(graph: Graph) -> int:
    """ZeRO-3 / FSDP: the gathered weights of the current layer and the prefetched next one."""
    gathers = [
        n.attrs.bytes
        for n in graph
        if n.op is OpKind.ALL_GATHER and isinstance(n.attrs, CollectiveAttrs) and n.attrs.axis is Axis.FSDP
    ]
    return 2 * max(gathers, default=0)
