"""The step time a row publishes, converted only when the row says how.

A source gives either the step time (``step_time_s``) or another metric
(``reported_metric``: tokens/s, TFLOP/s per device, MFU, ...). Converting such a metric
needs numbers the row may not state (the FLOP convention, the peak an MFU divides by);
when one is missing the row gets the reason instead of a guess.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from echosim.validation.cases import Case
from echosim.validation.rows import row_model

#: FLOP conventions a row's notes can name, so that a TFLOP/s or MFU figure converts to a step time.
#: Each maps (case) -> FLOPs of one step over the global batch.


def _eq3_flops(c: Case) -> float:
    """Narayanan et al. 2021, Eq. 3: hardware FLOPs with the recompute forward pass."""
    b, s, layers, h, v = (c.int(k) or 0 for k in ("global_batch", "seq_len", "layers", "hidden", "vocab"))
    return 96.0 * b * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))


def _six_nd_flops(c: Case) -> float:
    """6 x parameters x tokens (attention scores not counted), from the row's shape."""
    return 6.0 * _params(c) * (c.int("global_batch") or 0) * (c.int("seq_len") or 0)


def _params(c: Case) -> float:
    from echosim.frontend.zoo import ArchConfig

    cfg = row_model(c)
    assert isinstance(cfg, ArchConfig)
    return float(cfg.param_count())


FLOP_CONVENTIONS: dict[str, tuple[str, Callable[[Case], float]]] = {
    "narayanan-eq3": (r"Eq\.?\s*3\b", _eq3_flops),
    "6nd": (r"\b6\s*\*?\s*N\s*\*?\s*D\b|\b6ND\b", _six_nd_flops),
}
_TFLOPS_METRICS = ("tflops_per_gpu", "tflops_per_device")
_MFU_METRICS = {"mfu": 1.0, "mfu_pct": 0.01, "hfu": 1.0}


def flop_convention(notes: str) -> str | None:
    for name, (pattern, _) in FLOP_CONVENTIONS.items():
        if re.search(pattern, notes):
            return name
    return None


def published_step_time(c: Case) -> tuple[float | None, str]:
    """(step time, how it was obtained) or (None, why it cannot be obtained without guessing)."""
    if c.numbers["step_time_s"] is not None:
        return c.numbers["step_time_s"], c["step_time_basis"] or "step_time_s"
    metric, value = c["reported_metric"], c.numbers.get("reported_value")
    if not metric or value is None:
        return None, "no published step time"
    devices, batch, seq = c.int("devices"), c.int("global_batch"), c.int("seq_len")
    if metric in ("iteration_time_s", "step_time_s", "seconds"):
        return value, f"reported_metric {metric}"
    needs = [k for k, v in (("devices", devices), ("global_batch", batch), ("seq_len", seq)) if not v]
    if needs:
        return None, f"no published step time ({metric} given, but {', '.join(needs)} blank)"
    assert devices and batch and seq
    if metric == "tokens_per_s_per_gpu":
        return batch * seq / (value * devices), f"reported_metric {metric}"
    if metric in ("tokens_per_s", "tokens_per_s_total"):
        return batch * seq / value, f"reported_metric {metric}"
    if metric in _TFLOPS_METRICS or metric in _MFU_METRICS:
        convention = flop_convention(c["notes"])
        if convention is None:
            return None, f"no published step time ({metric} given, FLOP convention not stated)"
        if metric in _MFU_METRICS:
            peak = re.search(r"peak_tflops_ref=([0-9.]+)", c["notes"])
            if not peak:
                return None, f"no published step time ({metric} given, the peak it divides by not stated)"
            tflops = value * _MFU_METRICS[metric] * float(peak.group(1))
        else:
            tflops = value
        flops = FLOP_CONVENTIONS[convention][1](c)
        return flops / (tflops * 1e12 * devices), f"reported_metric {metric} ({convention} FLOPs)"
    return None, f"no published step time ({metric} cannot be converted)"
