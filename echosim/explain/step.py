"""Explain one compiled step: its critical path, communication per axis, bubble, overlap slowdown,
and the neighbouring layouts that help most (each compiled for real)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from echosim.errors import EchosimError
from echosim.explain.critical import CriticalPath, critical_path
from echosim.explain.diff import GiB, peak_bytes
from echosim.explain.whatif import Outcome, suggest
from echosim.plan import Cluster, Plan, plan_flags


@dataclass(frozen=True)
class AxisComm:
    """One parallel axis's collectives on the critical rank over the step: how long they run, how much is exposed."""

    axis: str
    ops: tuple[str, ...]
    busy_s: float
    exposed_s: float

    @property
    def hidden_s(self) -> float:
        return max(0.0, self.busy_s - self.exposed_s)

    def as_dict(self) -> dict[str, Any]:
        return {"axis": self.axis, "ops": list(self.ops), "busy_s": self.busy_s, "exposed_s": self.exposed_s,
                "hidden_s": self.hidden_s}  # fmt: skip


@dataclass
class Explanation:
    model: str
    plan: Plan
    cluster: Cluster
    report: Any  # Report
    critical: CriticalPath
    communication: list[AxisComm]
    slowdown_s: dict[str, float]
    suggestions: list[Outcome] = field(default_factory=list)  # best first
    simulated: list[Outcome] = field(default_factory=list)  # every neighbour compiled

    @property
    def flags(self) -> str:
        try:
            return shlex.join(plan_flags(self.plan, self.cluster))
        except EchosimError:
            return ""

    @property
    def bubble_s(self) -> float:
        return self.report.breakdown.get("bubble", 0.0)

    def as_dict(self, top: int = 3) -> dict[str, Any]:
        r = self.report
        return {
            "model": self.model,
            "flags": self.flags,
            "step_time_s": r.step_time_s,
            "peak_gib": peak_bytes(r.to_dict()) / GiB,
            "fits": r.fits,
            "critical_stage": r.critical_stage,
            "critical_path": self.critical.as_dict(),
            "communication": [c.as_dict() for c in self.communication],
            "bubble_s": self.bubble_s,
            "bubble_fraction": r.bubble_fraction,
            "overlap_slowdown_s": self.slowdown_s,
            "suggestions": [o.as_dict() for o in self.suggestions[:top]],
            "simulated": len(self.simulated),
            "refused": [o.as_dict() for o in self.simulated if o.error],
            "warnings": list(r.warnings),
        }


def communication(compiled: Any) -> list[AxisComm]:
    """Per parallel axis on the critical rank: busy seconds (from the costed graph) and exposed ones (the breakdown)."""
    costed, report = compiled.costed, compiled.report
    rank = costed.critical_rank
    busy = costed.busy(rank)
    ops: dict[str, set[str]] = {}
    for stage in costed.chunks(rank):
        for n in stage.graph:
            if n.op.is_collective and getattr(n.attrs, "size", 1) > 1:
                ops.setdefault(f"comm.{n.attrs.axis.value}", set()).add(n.op.value)
    keys = sorted({k for k in busy if k.startswith("comm.")} | {k for k in report.breakdown if k.startswith("comm.")})
    return [
        AxisComm(k.removeprefix("comm."), tuple(sorted(ops.get(k, ()))), busy.get(k, 0.0), report.breakdown.get(k, 0.0))
        for k in keys
    ]


def explain(compiled: Any, model: Any, plan: Plan, cluster: Cluster, what_if: bool = True) -> Explanation:
    """Everything ``echosim explain`` says of a compiled step; ``what_if`` also compiles its neighbourhood."""
    report = compiled.report
    out = Explanation(
        model=report.model,
        plan=plan,
        cluster=cluster,
        report=report,
        critical=critical_path(compiled.costed),
        communication=communication(compiled),
        slowdown_s=compiled.costed.slowdown_s(compiled.costed.critical_rank),
    )
    if what_if:
        out.suggestions, out.simulated = suggest(model, plan, cluster, report)
    return out
