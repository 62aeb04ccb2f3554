"""The result of a compile: numbers a planner asks for, as data and as JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


def _round(x: Any) -> Any:
    """Round floats to 6 significant digits so JSON is stable across platforms."""
    if isinstance(x, float):
        return float(f"{x:.6g}")
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_round(v) for v in x]
    return x


@dataclass
class Report:
    model: str
    backend: str
    devices: int
    devices_per_node: int
    plan: dict[str, Any]
    step_time_s: float
    tokens_per_s: float
    mfu: float
    hfu: float
    tflops_per_device: float
    model_flops_per_step: float
    hardware_flops_per_step: float
    params: int
    bubble_fraction: float
    critical_stage: int
    breakdown: dict[str, float]
    memory: list[dict[str, Any]]
    stages: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return all(bool(m["fits"]) for m in self.memory)

    def to_dict(self) -> dict[str, Any]:
        d = {
            "model": self.model,
            "backend": self.backend,
            "devices": self.devices,
            "devices_per_node": self.devices_per_node,
            "plan": self.plan,
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "tflops_per_device": self.tflops_per_device,
            "model_flops_per_step": self.model_flops_per_step,
            "hardware_flops_per_step": self.hardware_flops_per_step,
            "params": self.params,
            "bubble_fraction": self.bubble_fraction,
            "critical_stage": self.critical_stage,
            "breakdown": self.breakdown,
            "memory": self.memory,
            "fits": self.fits,
            "stages": self.stages,
            "warnings": self.warnings,
            "notes": self.notes,
        }
        return _round(d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
