"""The capture contract: what a frontend is given (:class:`CaptureSpec`), what capturing a torch
module gives back (:class:`Capture`) and how it fails (:class:`CaptureError`).

A frontend sees the spec and nothing else of the run: the parallel layout, the
schedule and the cluster are the compiler's business, so a frontend (a third
party's included) cannot come to depend on them. The compiler builds the spec from
the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from echosim.ir.graph import Graph


@dataclass(frozen=True)
class CaptureSpec:
    """One micro-batch as a frontend captures it.

    ``micro_batch``: samples per micro-batch; ``seq_len``: tokens per sample, ``0`` for
    the model's own (a config's or module's sequence length); ``dtype``: the training
    dtype (``fp32``, ``fp16``, ``bf16``; ``fp8``, ``mxfp8``, ``nvfp4`` keep 16-bit tensors) every
    float tensor is costed in.
    """

    micro_batch: int = 1
    seq_len: int = 0
    dtype: str = "bf16"


class CaptureError(ValueError):
    """A module torch.export or torch.fx could not turn into IR; the message names the construct."""


@dataclass
class Capture:
    """What capturing a torch module gives: the IR graph, warnings, and notes that only inform."""

    graph: Graph
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
