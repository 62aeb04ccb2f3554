"""Which layout is best? Enumerate parallel layouts of a model and rank them by step time.

Candidates are every (tp, pp, dp, micro-batch, recompute, schedule) that divides the
cluster and the model; each is compiled (symmetry keeps that at tens of milliseconds)
and those that fit in memory are ranked by step time. Layouts compile in local
processes when ``workers > 1``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from echosim.errors import EchosimError
from echosim.plan import Cluster, Plan


@dataclass(frozen=True)
class Candidate:
    plan: Plan
    step_time_s: float | None
    peak_bytes: int
    fits: bool
    mfu: float
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        p = self.plan
        return {
            "tp": p.tp, "pp": p.pp, "dp": p.dp, "micro_batch": p.micro_batch, "recompute": p.recompute,
            "schedule": p.schedule, "vpp": p.vpp, "zero": p.zero, "step_time_s": self.step_time_s,
            "peak_bytes": self.peak_bytes, "fits": self.fits, "mfu": self.mfu, "error": self.error,
        }  # fmt: skip


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(
    base: Plan,
    cluster: Cluster,
    *,
    micro_batches: tuple[int, ...] = (1, 2, 4),
    recompute: tuple[str, ...] = ("none", "selective", "full"),
    schedules: tuple[str, ...] = ("1f1b",),
    zero: tuple[int, ...] = (0,),
    max_tp: int = 0,
) -> Iterator[Plan]:
    """Plans whose degrees multiply to the device count; TP stays inside a node unless ``max_tp`` says otherwise."""
    from echosim.compiler import resolve_cluster

    devices = cluster.devices
    max_tp = max_tp or min(resolve_cluster(cluster).devices_per_node, devices)
    batch = base.global_batch
    for tp in _divisors(devices):
        if tp > max_tp:
            continue
        for pp in _divisors(devices // tp):
            dp = devices // (tp * pp)
            for mb in micro_batches:
                if batch and batch % (mb * dp):
                    continue
                for rc in recompute:
                    for sched in schedules:
                        for z in sorted({0 if dp == 1 else z for z in zero}):  # ZeRO is moot on one replica
                            yield replace(base, tp=tp, pp=pp, dp=dp, micro_batch=mb, recompute=rc, schedule=sched,
                                          zero=z, global_batch=batch or mb * dp)  # fmt: skip


def evaluate(model: Any, plan: Plan, cluster: Cluster) -> Candidate:
    from echosim.compiler import compile as compile_model

    try:
        r = compile_model(model, plan, cluster)
    except EchosimError as exc:
        return Candidate(plan, None, 0, False, 0.0, str(exc))
    peak = max(int(m["peak"]) for m in r.memory)
    return Candidate(plan, r.step_time_s, peak, r.fits, r.mfu)


def _evaluate_args(args: tuple[Any, Plan, Cluster]) -> Candidate:
    return evaluate(*args)


def search(
    model: Any,
    base: Plan,
    cluster: Cluster,
    *,
    workers: int = 1,
    progress: Callable[[int, int], None] | None = None,
    **space: Any,
) -> list[Candidate]:
    """Every candidate, best first: those that fit by step time, then those that do not, then errors.

    A precision the device cannot run fails every layout alike: it is one error, before any compile."""
    from echosim.backends.loading import load_backend
    from echosim.layout import check_precision

    check_precision(base, load_backend(cluster.backend))
    plans = list(candidates(base, cluster, **space))
    if not plans:
        raise EchosimError(f"no layout of {cluster.devices} devices divides the global batch {base.global_batch}")
    results: list[Candidate] = []
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            for i, c in enumerate(pool.map(_evaluate_args, [(model, p, cluster) for p in plans], chunksize=4)):
                results.append(c)
                if progress:
                    progress(i + 1, len(plans))
    else:
        for i, p in enumerate(plans):
            results.append(evaluate(model, p, cluster))
            if progress:
                progress(i + 1, len(plans))

    def key(c: Candidate) -> tuple[int, float, str]:
        rank = 0 if c.fits and c.step_time_s is not None else (1 if c.step_time_s is not None else 2)
        return (rank, c.step_time_s or 0.0, repr(c.plan))

    return sorted(results, key=key)
