"""``compile()``: model + plan + cluster -> Report. The one pipeline, front to back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from echosim.errors import EchosimError
from echosim.ir.graph import Graph
from echosim.ir.types import DType
from echosim.passes.attention import AttentionKernel
from echosim.passes.autodiff import Autodiff
from echosim.passes.base import LayoutError, run_passes
from echosim.passes.data_parallel import DataParallel, Optimizer
from echosim.passes.flops import graph_flops, param_count
from echosim.passes.memory import stage_memory
from echosim.passes.pipeline import PipelineParallel, Stage
from echosim.passes.recompute import Recompute
from echosim.passes.tensor_parallel import TensorParallel
from echosim.plan import Cluster, Plan, PlanError
from echosim.timeline.engine import StageTiming, placements, run_schedule, time_stage
from echosim.timeline.report import Report
from echosim.timeline.schedule import BlockTime, in_flight

DEFAULT_MODEL = "gpt3-175b"
# The published Megatron-LM reference run (Narayanan et al. 2021, Table 1 / sec. 5.1). Megatron-LM in
# 2021 had no fused flash attention: scores were materialised (baddbmm, fused softmax, bmm).
DEFAULT_PLAN = Plan(
    tp=8,
    pp=16,
    dp=8,
    micro_batch=1,
    global_batch=1536,
    seq_len=2048,
    dtype="fp16",
    recompute="full",
    attention="math",
)
DEFAULT_CLUSTER = Cluster(backend="a100-80gb", devices=1024, devices_per_node=8)


@dataclass
class Compiled:
    """Everything a compile produced, for the trace exporter and for tests."""

    report: Report
    graph: Graph
    stages: list[Stage]
    timings: list[StageTiming]
    blocks: list[BlockTime]


def load_model(model: Any, plan: Plan) -> tuple[Graph, list[str], int]:
    """Capture a model given by name (resolved through the plugin registry) or as an object."""
    from echosim.frontend import capture_named, capture_object

    if isinstance(model, str):
        return capture_named(model, plan)
    return capture_object(model, plan, getattr(model, "arch", type(model).__name__))


def compile(model: Any = DEFAULT_MODEL, plan: Plan | None = None, cluster: Cluster | None = None) -> Report:
    return compile_full(model, plan, cluster).report


def compile_full(model: Any = DEFAULT_MODEL, plan: Plan | None = None, cluster: Cluster | None = None) -> Compiled:
    from echosim.frontend import plan_messages, split_notes
    from echosim.plugins import get_registry

    plan = plan or Plan()
    cluster = cluster or Cluster(devices=plan.tp * plan.pp * plan.dp)
    cluster.validate()
    plan.validate(cluster)
    registry = get_registry()
    backend = registry.backend(cluster.backend)()
    graph, messages, total_params = load_model(model, plan)
    warnings, notes = split_notes(messages + plan_messages(graph, plan))
    try:
        joint = run_passes(
            graph,
            [
                AttentionKernel(plan.attention == "flash"),
                TensorParallel(plan.tp),
                Autodiff(),
                Recompute(plan.recompute),
            ],
        )
        stages = PipelineParallel(plan.pp, plan.pp_balance).split(joint)
        reduce_dtype = DType.FP32
        stages = [
            Stage(
                s.index, run_passes(s.graph, [DataParallel(plan.dp, reduce_dtype=reduce_dtype), Optimizer()]), s.layers
            )
            for s in stages
        ]
    except LayoutError as exc:
        raise PlanError(str(exc)) from None
    where = placements(plan, cluster)
    timings = _time_stages(stages, backend, where, plan)
    blocks = run_schedule(plan, timings)
    report = _report(
        model if isinstance(model, str) else graph.name,
        plan,
        cluster,
        backend,
        stages,
        timings,
        blocks,
        total_params,
        warnings,
        notes,
    )
    return Compiled(report, joint, stages, timings, blocks)


def _time_stages(stages: list[Stage], backend: Any, where: Any, plan: Plan) -> list[StageTiming]:
    """Stages with the same shape (all the middle ones) are timed once."""
    cache: dict[tuple[bool, bool, int], StageTiming] = {}
    out = []
    last = len(stages) - 1
    for s in stages:
        key = (s.index == 0, s.index == last, s.layers)
        if key not in cache:
            cache[key] = time_stage(s.index, s.layers, s.graph, backend, where, plan)
        t = cache[key]
        out.append(
            StageTiming(
                s.index,
                s.layers,
                t.fwd,
                t.bwd,
                t.fwd_units,
                t.bwd_units,
                t.p2p_fwd,
                t.p2p_bwd,
                t.dp_exposed,
                t.dp_busy,
                t.embed_sync,
                t.optimizer,
            )
        )
    return out


def _report(
    model: str,
    plan: Plan,
    cluster: Cluster,
    backend: Any,
    stages: list[Stage],
    timings: list[StageTiming],
    blocks: list[BlockTime],
    total_params: int,
    warnings: list[str],
    notes: list[str] | None = None,
) -> Report:
    m = plan.microbatches
    ends = {t.index: 0.0 for t in timings}
    for b in blocks:
        ends[b.stage] = max(ends[b.stage], b.end)
    totals = [ends[t.index] + t.dp_exposed + t.embed_sync + t.optimizer for t in timings]
    step = max(totals)
    crit = totals.index(step)
    ranks_per_stage = plan.tp * plan.dp
    model_flops = sum(graph_flops(s.graph).model for s in stages) * m * ranks_per_stage
    hw_flops = sum(graph_flops(s.graph).hardware for s in stages) * m * ranks_per_stage
    peak = backend.peak_flops(plan.dtype)
    tokens = plan.batch * _seq(stages)
    t = timings[crit]
    breakdown = _breakdown(t, m, ends[crit])
    memory = []
    for s in stages:
        mem = stage_memory(
            s.graph, in_flight(plan.schedule, plan.pp, m, s.index), backend.memory_bytes(), param_count(s.graph)
        )
        memory.append({"stage": s.index, "layers": s.layers, **mem.as_dict()})
        if not mem.fits:
            warnings.append(
                f"stage {s.index} does not fit: needs {mem.peak / 2**30:.1f} GiB of {mem.capacity / 2**30:.1f} GiB"
            )
    stage_rows = [
        {
            "stage": x.index,
            "layers": x.layers,
            "fwd_s": x.fwd,
            "bwd_s": x.bwd,
            "p2p_fwd_s": x.p2p_fwd,
            "p2p_bwd_s": x.p2p_bwd,
            "dp_exposed_s": x.dp_exposed,
            "optimizer_s": x.optimizer,
            "end_s": totals[x.index],
        }
        for x in timings
    ]
    busy = m * (t.fwd + t.bwd)
    return Report(
        model=model,
        backend=cluster.backend,
        devices=cluster.devices,
        devices_per_node=cluster.devices_per_node,
        plan=plan.as_dict(),
        step_time_s=step,
        tokens_per_s=tokens / step,
        mfu=model_flops / (step * cluster.devices * peak),
        hfu=hw_flops / (step * cluster.devices * peak),
        tflops_per_device=hw_flops / (step * cluster.devices) / 1e12,
        model_flops_per_step=float(model_flops),
        hardware_flops_per_step=float(hw_flops),
        params=total_params,
        bubble_fraction=(ends[crit] - busy) / step,
        critical_stage=crit,
        breakdown=breakdown,
        memory=memory,
        stages=stage_rows,
        warnings=warnings,
        notes=notes or [],
    )


def _seq(stages: list[Stage]) -> int:
    g = stages[0].graph
    ids = g[g.inputs[0]].out.shape if g.inputs else (1, 1)
    return ids[-1]


def _breakdown(t: StageTiming, m: int, end: float) -> dict[str, float]:
    """Seconds of the critical stage by kind; they add up to its step time."""
    out: dict[str, float] = {}
    for units in (t.fwd_units, t.bwd_units):
        for unit, k in units:
            exposed_comm = unit.duration - unit.compute_busy
            for cat, sec in unit.busy.items():
                if cat.startswith("compute."):
                    out[cat] = out.get(cat, 0.0) + sec * k * m
            out["comm.tp"] = out.get("comm.tp", 0.0) + max(0.0, exposed_comm) * k * m
    out["comm.dp"] = t.dp_exposed
    out["comm.embed"] = t.embed_sync
    out["optimizer"] = t.optimizer
    out["bubble"] = max(0.0, end - m * (t.fwd + t.bwd))
    return {k: v for k, v in sorted(out.items())}


__all__ = ["DEFAULT_CLUSTER", "DEFAULT_MODEL", "DEFAULT_PLAN", "Compiled", "EchosimError", "compile", "compile_full"]
