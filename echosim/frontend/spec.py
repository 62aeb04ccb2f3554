"""What a frontend needs to capture a model: the shape of one micro-batch and the dtype it is costed in.

A frontend sees this and nothing else of the run: the parallel layout, the schedule
and the cluster are the compiler's business, so a frontend (a third party's
included) cannot come to depend on them. The compiler builds it from the plan.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CaptureSpec:
    """One micro-batch as a frontend captures it.

    ``micro_batch``: samples per micro-batch; ``seq_len``: tokens per sample, ``0`` for
    the model's own (a config's or module's sequence length); ``dtype``: the training
    dtype (``fp32``, ``fp16``, ``bf16``, ``fp8``) every float tensor is costed in.
    """

    micro_batch: int = 1
    seq_len: int = 0
    dtype: str = "bf16"
