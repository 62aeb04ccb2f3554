"""``compile()``: model + plan + cluster -> Report. The one pipeline, front to back."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from echosim.errors import EchosimError
from echosim.ir.graph import Graph
from echosim.ir.types import DType
from echosim.layout import ModelShape, check_model, check_plan
from echosim.passes.attention import AttentionKernel
from echosim.passes.autodiff import Autodiff
from echosim.passes.base import LayoutError, run_passes
from echosim.passes.context_parallel import ContextParallel, ContextParallelBackward
from echosim.passes.data_parallel import DataParallel, Optimizer
from echosim.passes.expert_parallel import ExpertParallel
from echosim.passes.flops import graph_flops, param_count
from echosim.passes.gradient_groups import GradientGroups
from echosim.passes.memory import NCCL_BUFFERS_PER_GROUP, MemoryBreakdown, StatePolicy, stage_memory
from echosim.passes.pipeline import PipelineParallel, Stage
from echosim.passes.precision import Fp8Linears
from echosim.passes.recompute import Recompute
from echosim.passes.tensor_parallel import TensorParallel
from echosim.plan import DEFAULT_MODEL, Cluster, Plan, PlanError
from echosim.timeline.engine import StageTiming, placements, run_schedule, time_stage
from echosim.timeline.report import Report
from echosim.timeline.schedule import SCHEDULES, BlockTime, in_flight, orders_for


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
    from echosim.backends.loading import load_backend
    from echosim.frontend.messages import split_notes
    from echosim.plugins import get_registry

    plan = plan or Plan()
    cluster = cluster or Cluster(devices=plan.world)
    check_plan(plan, cluster, SCHEDULES, interleaved=("1f1b", "interleaved"))
    backend = load_backend(cluster.backend, get_registry(), calibration=cluster.calibration)
    graph, messages, total_params = load_model(model, plan)
    warnings, notes = split_notes(messages + check_model(plan, ModelShape.of(graph)))
    try:
        joint = run_passes(
            graph,
            [
                AttentionKernel(plan.attention == "flash"),
                ContextParallel(plan.cp, plan.cp_comm, plan.cp_balance),
                TensorParallel(plan.tp, sequence_parallel=plan.sp),
                ExpertParallel(plan.ep, plan.moe_capacity_factor, plan.moe_imbalance),
                Autodiff(),
                ContextParallelBackward(),
                Recompute(plan.recompute),
                *([Fp8Linears()] if plan.dtype == "fp8" else []),
            ],
        )
        stages = PipelineParallel(plan.pp * plan.vpp, plan.pp_balance).split(joint)
        # Megatron reduces fp32 main grads; ZeRO-3 / FSDP reduces in the training dtype
        reduce_dtype = DType.FP32 if plan.zero < 3 else DType.parse(plan.dtype)
        shard = plan.dp * plan.cp if plan.zero >= 1 else 1  # ZeRO shards over every gradient replica
        data_parallel = DataParallel(plan.dp, reduce_dtype=reduce_dtype, zero=plan.zero)
        optimizer = Optimizer(shard=shard, mixed_precision=plan.dtype != "fp32")
        stages = [Stage(s.index, run_passes(s.graph, [data_parallel, optimizer]), s.layers) for s in stages]
    except LayoutError as exc:
        raise PlanError(str(exc)) from None
    where = placements(plan, cluster)
    groups = GradientGroups(plan.cp, plan.ep)  # gradients span dp x cp ranks; experts only dp x cp / ep
    stages = [Stage(s.index, run_passes(s.graph, [groups]), s.layers) for s in stages]
    timings = _time_stages(stages, backend, where, plan)
    blocks = run_schedule(plan, timings)
    name = model if isinstance(model, str) else graph.name
    report = _report(name, plan, cluster, backend, stages, timings, blocks, total_params, warnings, notes)
    return Compiled(report, joint, stages, timings, blocks)


def _time_stages(stages: list[Stage], backend: Any, where: Any, plan: Plan) -> list[StageTiming]:
    """Virtual stages with the same shape (all the middle ones) are timed once."""
    cache: dict[tuple[bool, bool, int], StageTiming] = {}
    out = []
    last = len(stages) - 1
    for s in stages:
        key = (s.index == 0, s.index == last, s.layers)
        if key not in cache:
            cache[key] = time_stage(s.index, s.layers, s.graph, backend, where, plan)
        out.append(replace(cache[key], index=s.index, layers=s.layers))
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
    m, pp = plan.microbatches, plan.pp
    chunks = {r: [t for t in timings if t.index % pp == r] for r in range(pp)}
    ends = dict.fromkeys(range(pp), 0.0)
    last_chunk = {}
    for b in blocks:
        if b.end >= ends[b.stage]:
            ends[b.stage], last_chunk[b.stage] = b.end, b.vstage
    tails = {}
    for r, ts in chunks.items():
        last = timings[last_chunk.get(r, r)]
        tails[r] = last.dp_exposed + sum(t.step_end + t.optimizer for t in ts)
    totals = [ends[r] + tails[r] for r in range(pp)]
    step = max(totals)
    crit = totals.index(step)
    ranks_per_stage = plan.tp * plan.dp * plan.cp
    model_flops = sum(graph_flops(s.graph).model for s in stages) * m * ranks_per_stage
    hw_flops = sum(graph_flops(s.graph).hardware for s in stages) * m * ranks_per_stage
    peak = backend.peak_flops("bf16" if plan.dtype == "fp8" else plan.dtype)  # fp8 MFU: the 16-bit peak
    tokens = plan.batch * _seq(stages) * plan.cp  # a context-parallel rank holds 1/cp of each sequence
    breakdown = _breakdown(chunks[crit], timings[last_chunk.get(crit, crit)], m, ends[crit])
    memory = _memory(plan, backend, stages, warnings)
    stage_rows = [
        {
            "stage": x.index % pp,
            "chunk": x.index // pp,
            "layers": x.layers,
            "fwd_s": x.fwd,
            "bwd_s": x.bwd + x.wgrad,
            "p2p_fwd_s": x.p2p_fwd,
            "p2p_bwd_s": x.p2p_bwd,
            "dp_exposed_s": x.dp_exposed,
            "optimizer_s": x.optimizer,
        }
        for x in timings
    ]
    busy = m * sum(t.fwd + t.bwd + t.wgrad for t in chunks[crit])
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
        bubble_fraction=max(0.0, ends[crit] - busy) / step,
        critical_stage=crit,
        breakdown=breakdown,
        memory=memory,
        stages=stage_rows,
        warnings=warnings,
        notes=notes or [],
    )


def _memory(plan: Plan, backend: Any, stages: list[Stage], warnings: list[str]) -> list[dict[str, Any]]:
    """Peak memory per pipeline rank; an interleaved rank holds several chunks."""
    pp = plan.pp
    orders = orders_for(plan.schedule, pp, plan.microbatches, plan.vpp)
    policy = StatePolicy.for_training(plan.dtype, plan.zero, plan.dp * plan.cp)
    groups = sum(1 for size in (plan.tp, plan.dp, plan.pp, plan.cp) if size > 1)
    rows = []
    for r in range(pp):
        mine = [s for s in stages if s.index % pp == r]
        live = in_flight(orders, r)
        parts = [stage_memory(s.graph, live.get(s.index, 0), 0, param_count(s.graph), policy, 0) for s in mine]
        mem = MemoryBreakdown(
            params=sum(p.params for p in parts),
            grads=sum(p.grads for p in parts),
            optimizer=sum(p.optimizer for p in parts),
            activations=sum(p.activations for p in parts),
            transient=max(p.transient for p in parts),
            comm_buffers=groups * NCCL_BUFFERS_PER_GROUP,
            fragmentation=sum(p.fragmentation for p in parts),
            capacity=backend.memory_bytes(),
        )
        rows.append({"stage": r, "layers": sum(s.layers for s in mine), **mem.as_dict()})
        if not mem.fits:
            top = ", ".join(f"{k} {v / 2**30:.1f} GiB" for k, v in mem.largest())
            warnings.append(
                f"stage {r} does not fit: needs {mem.peak / 2**30:.1f} GiB of "
                f"{mem.capacity / 2**30:.1f} GiB (largest: {top})"
            )
    return rows


def _seq(stages: list[Stage]) -> int:
    g = stages[0].graph
    ids = g[g.inputs[0]].out.shape if g.inputs else (1, 1)
    return ids[-1]


def _breakdown(chunks: list[StageTiming], last: StageTiming, m: int, end: float) -> dict[str, float]:
    """Seconds of the critical pipeline rank by kind; they add up to its step time.

    Communication counts only where it is exposed (compute waits on it); within a unit,
    exposed time is shared among the collectives' kinds in proportion to their load.
    """
    from echosim.timeline.engine import repeated

    out: dict[str, float] = {}

    def add(key: str, sec: float) -> None:
        out[key] = out.get(key, 0.0) + sec

    busy = 0.0
    for t in chunks:
        busy += m * (t.fwd + t.bwd + t.wgrad)
        for unit, k in t.fwd_units + t.bwd_units:
            if k <= 0:
                continue
            for cat, sec in unit.busy.items():
                if cat.startswith("compute."):
                    add(cat, sec * k * m)
            exposed = max(0.0, repeated(unit, k) - unit.compute_busy * k) * m
            comm = {c: v for c, v in unit.busy.items() if c.startswith("comm.")}
            total = sum(comm.values())
            for cat, sec in comm.items():
                add(cat, exposed * sec / total)
            if not total and exposed > 1e-9:
                add("idle", exposed)
        for axis, sec in t.step_end_comm.items():
            add(f"comm.{axis}", sec)
        add("optimizer", t.optimizer)
    add("comm.dp", last.dp_exposed)
    add("bubble", max(0.0, end - busy))
    return dict(sorted(out.items()))


__all__ = ["Compiled", "EchosimError", "compile", "compile_full"]
