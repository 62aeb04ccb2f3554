"""The contract between the timeline and a hardware backend.

A backend answers two questions for one representative rank: how long does this
compute node take, and how long does this collective take on a group placed like
this. Everything else (schedules, overlap, memory) is the timeline's business.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

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


def for_program(backend: Any, graph: Any) -> Any:
    """``backend`` for costing the ops of one rank's program ``graph``.

    Optional for a backend: one whose op costs depend on the whole program it runs (a CPU rank's malloc
    heap, shaped by what the program frees before its first optimizer step) returns a variant from
    ``for_program(graph)``; any other is returned unchanged.
    """
    method = getattr(backend, "for_program", None)
    return method(graph) if callable(method) else backend


def unwrapped(backend: Any) -> Any:
    """The backend under its wrappers (``.inner``: guarded, calibrated): what holds the device and its hooks."""
    while "inner" in getattr(backend, "__dict__", {}):
        backend = backend.inner
    return backend


def program_dependent(backend: Any) -> bool:
    """Whether the backend under its wrappers prices ops by the whole program (:func:`for_program`)."""
    return callable(getattr(unwrapped(backend), "for_program", None))


#: Devices per node a backend without ``node_devices`` gets (an HGX/DGX node).
DEFAULT_NODE_DEVICES = 8


class KernelBackend:
    """Shared dispatch for analytic backends: one cost hook per kind of kernel.

    Views and placeholders are free; collectives must go through ``collective_time_s``
    (they need a placement); matmuls and attention are costed in the precision they run
    in (``precision`` of an fp8 GEMM, else the output dtype, narrowed by ``DTYPES``);
    everything else is memory-bound. Subclasses implement the three ``*_cost_s`` hooks.
    """

    name: str
    DTYPES: tuple[str, ...] = ("bf16", "fp16", "fp8", "mxfp8", "nvfp4", "fp32")
    FALLBACK_DTYPE = "bf16"
    _overlap: OverlapModel

    def supports_dtype(self, dtype: str) -> bool:
        """Whether the hardware trains in ``dtype`` at all (``--dtype fp8`` on a part without fp8 is refused)."""
        return dtype in self.DTYPES

    def compute_dtype(self, node: Node) -> str:
        dtype = getattr(node.attrs, "precision", "") or node.out.dtype.value
        return dtype if dtype in self.DTYPES else self.FALLBACK_DTYPE

    def op_time_s(self, node: Node, io_bytes: int) -> float:
        from echosim.ir.ops import AttentionAttrs, MatmulAttrs, Phase

        op = node.op
        if op in (OpKind.VIEW, OpKind.INPUT, OpKind.PARAMETER):
            return 0.0
        if op.is_collective:
            raise ValueError(
                f"node {node.id} ({node.name}) is a {op.value}: cost it with collective_time_s and a Placement"
            )
        if op is OpKind.MATMUL:
            if not isinstance(node.attrs, MatmulAttrs):
                raise TypeError(f"matmul node {node.id} ({node.name}) carries {type(node.attrs).__name__}")
            return self.matmul_cost_s(node.attrs, self.compute_dtype(node))
        if op is OpKind.ATTENTION:
            if not isinstance(node.attrs, AttentionAttrs):
                raise TypeError(f"attention node {node.id} ({node.name}) carries {type(node.attrs).__name__}")
            return self.attention_cost_s(node.attrs, self.compute_dtype(node), node.phase is Phase.BACKWARD)
        return self.memory_cost_s(node, io_bytes)

    def matmul_cost_s(self, attrs: Any, dtype: str) -> float:
        raise NotImplementedError

    def attention_cost_s(self, attrs: Any, dtype: str, backward: bool) -> float:
        raise NotImplementedError

    def memory_cost_s(self, node: Node, io_bytes: int) -> float:
        raise NotImplementedError

    def overlap(self) -> OverlapModel:
        return self._overlap
