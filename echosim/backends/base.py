"""The contract between the timeline and a hardware backend.

A backend answers two questions for one representative rank: how long does this
compute node take, and how long does this collective take on a group placed like
this. Everything else (schedules, overlap, memory) is the timeline's business.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from echosim.ir.graph import Node
from echosim.ir.ops import OpKind


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the members of one communication group sit.

    ``size`` ranks spread over ``nodes`` nodes with ``per_node`` members on each
    (``size == nodes * per_node``). ``concurrent_per_node`` is how many such groups
    share one node's NICs at the same time (e.g. eight DP groups when TP fills a node).
    """

    size: int
    nodes: int
    per_node: int
    concurrent_per_node: int = 1

    @property
    def intra_node(self) -> bool:
        return self.nodes == 1


@dataclass(frozen=True, slots=True)
class OverlapModel:
    """Mutual slowdown when compute and communication kernels run at the same time.

    Each field is a named, calibratable parameter of one backend, not a fixed ratio:
    ``compute_slowdown`` multiplies the duration of tensor-core work (matmuls, attention)
    overlapped with communication (the collective kernels hold SMs);
    ``memory_bound_slowdown`` multiplies memory-bound kernels overlapped with
    communication (they lose the same SMs and also share HBM bandwidth with the
    collective's copies; ``None`` means the same as ``compute_slowdown``);
    ``comm_slowdown`` multiplies communication overlapped with compute.
    """

    compute_slowdown: float = 1.0
    comm_slowdown: float = 1.0
    memory_bound_slowdown: float | None = None

    def __post_init__(self) -> None:
        for name in ("compute_slowdown", "comm_slowdown", "memory_bound_slowdown"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int | float) and 1.0 <= value < 10.0):
                raise ValueError(f"overlap model: field {name!r} must be a factor in [1, 10), got {value!r}")

    def slowdown(self, category: str) -> float:
        """Factor for a kernel of timeline ``category`` (``compute.matmul``, ``compute.memory_bound``, ``comm.*``)."""
        if category.startswith("comm"):
            return self.comm_slowdown
        if category == "compute.memory_bound" and self.memory_bound_slowdown is not None:
            return self.memory_bound_slowdown
        return self.compute_slowdown


@runtime_checkable
class Backend(Protocol):
    name: str

    def op_time_s(self, node: Node, io_bytes: int) -> float:
        """Seconds for one compute node whose inputs plus output move ``io_bytes``."""
        ...

    def collective_time_s(self, kind: OpKind, nbytes: int, placement: Placement) -> float:
        """Seconds for one collective of ``nbytes`` (nccl-tests buffer convention)."""
        ...

    def overlap(self) -> OverlapModel: ...

    def memory_bytes(self) -> int:
        """Usable device memory for the fits / does-not-fit verdict."""
        ...

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype`` (the MFU denominator)."""
        ...
