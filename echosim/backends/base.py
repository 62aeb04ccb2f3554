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

    ``compute_slowdown`` multiplies the duration of compute overlapped with
    communication (SMs and HBM bandwidth are shared with the NCCL kernels);
    ``comm_slowdown`` multiplies communication overlapped with compute.
    Named, calibratable parameters, not a fixed overlap ratio.
    """

    compute_slowdown: float = 1.0
    comm_slowdown: float = 1.0


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
