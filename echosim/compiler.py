"""The one pipeline, front to back: model -> IR -> passes -> lowering -> costed graph -> report.

:func:`lower` captures the model, checks the layout, runs the pass pipeline the plugins
registered (built-ins included), splits the pipeline stages and lowers them onto the
backend; :func:`compile` reads the report from what :func:`lower` returns.
"""

from __future__ import annotations

import operator
import os
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from echosim import plugins
from echosim.backends.loading import load_backend
from echosim.errors import EchosimError, limit_from_env, time_limit
from echosim.frameworks import get_framework
from echosim.frontend import CaptureSpec, capture_named, capture_object
from echosim.frontend.messages import split_notes
from echosim.ir.graph import Graph
from echosim.ir.verify import VerifyError
from echosim.layout import (
    ModelShape,
    check_fp8_attention,
    check_fused_mlp,
    check_model,
    check_offload,
    check_plan,
    check_precision,
    fp8_attention_notes,
    host_state,
    interleaved_names,
    resolve_cp_a2a,
)
from echosim.memo import Memo
from echosim.passes.base import LayoutError, run_passes
from echosim.passes.context_parallel import head_parallel_note
from echosim.passes.data_parallel import DataParallel
from echosim.passes.embedding_sharding import embedding_plan
from echosim.passes.memory import E5M6_BYTES, SavedPolicy, StatePolicy
from echosim.passes.pipeline import PipelineParallel, Stage
from echosim.passes.precision import FP8_TILE_BYTES
from echosim.passes.recompute import offloaded
from echosim.passes.tensor_parallel import whole_layers_warning
from echosim.plan import DEFAULT_MODEL, LOW_PRECISION, Cluster, Plan, PlanError
from echosim.plugins import Registry
from echosim.timeline.costed import CostedGraph
from echosim.timeline.lower import StepOptions, bandwidth_violations, lower_step
from echosim.timeline.placement import Degrees, axis_placements
from echosim.timeline.report import INVARIANT, Report, StepFacts, build_report
from echosim.timeline.schedule import on_stages


@dataclass
class Compiled:
    """Everything one compile produced: the costed graph, what the report needs, and the IR behind it."""

    costed: CostedGraph
    facts: StepFacts
    graph: Graph  # the whole model after the graph-level passes (before the pipeline split)
    stages: list[Stage] = field(default_factory=list)

    @cached_property
    def report(self) -> Report:
        return build_report(self.costed, self.facts)


#: Wall-clock guard on one model capture (a model file or a plugin's loader that never returns).
CAPTURE_TIMEOUT_ENV = "ECHOSIM_CAPTURE_TIMEOUT_S"
CAPTURE_TIMEOUT_S = 300.0
#: Wall-clock guard on lowering (a backend plugin whose cost model never returns).
LOWER_TIMEOUT_ENV = "ECHOSIM_LOWER_TIMEOUT_S"
LOWER_TIMEOUT_S = 300.0


def load_model(model: Any, plan: Plan) -> tuple[Graph, list[str], int]:
    """Capture a model given by name (resolved through the plugin registry) or as an object.

    The frontend is handed only what capture needs (micro-batch, sequence, dtype), never the plan.
    """
    spec = CaptureSpec(plan.micro_batch, plan.seq_len, plan.dtype)
    name = model if isinstance(model, str) else getattr(model, "arch", type(model).__name__)
    limit = limit_from_env(CAPTURE_TIMEOUT_ENV, CAPTURE_TIMEOUT_S)
    with time_limit(limit, f"capturing model {name!r}", CAPTURE_TIMEOUT_ENV):
        if isinstance(model, str):
            return capture_named(model, spec)
        return capture_object(model, spec, name)


def resolve_cluster(cluster: Cluster, registry: Registry | None = None, backend: Any = None) -> Cluster:
    """``cluster`` with its node size filled in: ``devices_per_node=0`` becomes the backend's node
    for this job (NVLink domain, NVL72 rack, TPU slice; :meth:`GuardedBackend.node_devices`)."""
    if cluster.devices_per_node or cluster.devices < 1:
        return cluster
    backend = backend or load_backend(cluster.backend, registry or plugins.get_registry())
    return replace(cluster, devices_per_node=backend.node_devices(cluster.devices))


def check_node(cluster: Cluster, backend: Any) -> None:
    """A node of ``--devices-per-node`` devices must fit the backend's fast domain (NVLink domain, NVL72 rack,
    TPU slice, a machine's sockets): a larger one is the layout's error, not the backend's, which would refuse
    the first group placed on it. A plugin that does not say its node (no ``node_devices``) is not held to the
    default one."""
    if not hasattr(getattr(backend, "inner", backend), "node_devices"):
        return
    most = backend.node_devices(cluster.devices_per_node)
    if cluster.devices_per_node > most:
        raise PlanError(
            f"--devices-per-node {cluster.devices_per_node}: a {cluster.backend} node holds {most} devices (its "
            "fast domain: NVLink domain, NVL72 rack, TPU slice or a machine's sockets); give that many or fewer"
        )


# One backend object per (registry, name): the op-cost cache of lowering is keyed by it, so
# layouts compiled one after another price a GEMM of the same shape once.
_BACKENDS: Memo[Any] = Memo("backends", maxsize=64)


def compile(model: Any = DEFAULT_MODEL, plan: Plan | None = None, cluster: Cluster | None = None) -> Report:
    """Simulate one training step of ``model`` with ``plan`` on ``cluster``."""
    return lower(model, plan, cluster).report


def _per_call(plan: Plan, samples: int) -> Plan:
    """``plan`` for a model whose inputs fix its batch at ``samples`` (:attr:`Graph.samples`): a micro-batch is one
    call of forward on them, whatever ``--micro-batch`` said, and ``--global-batch`` counts samples, as for any
    model, so it must be a whole number of calls on every data-parallel rank."""
    if plan.global_batch and plan.global_batch % (samples * plan.dp):
        raise PlanError(
            f"global batch {plan.global_batch} is not a multiple of the model's {samples} samples a call of forward "
            f"(its inputs fix them) x dp = {plan.dp}"
        )
    return replace(plan, micro_batch=samples)


#: How the warning of :func:`own_checkpoints` begins (``echosim check`` adds it to a memory failure).
OWN_CHECKPOINTS = "the model's forward checkpoints"


def own_checkpoints(checkpointed: tuple[str, ...]) -> str:
    """What a layout without recompute leaves out of a model that checkpoints its own modules in code."""
    return (
        f"{OWN_CHECKPOINTS} {', '.join(checkpointed)} with torch.utils.checkpoint, which echosim "
        "does not read from code: this step keeps every activation and replays nothing (recompute none); "
        "--recompute full costs the model's own recompute (each layer's input kept, its forward replayed)"
    )


def _pairs(schedule: object) -> bool:
    """Whether a schedule runs overlapped forward-backward pairs of its own (``Schedule.paired``)."""
    return getattr(schedule, "paired", None) is not None


def lower(
    model: Any = DEFAULT_MODEL,
    plan: Plan | None = None,
    cluster: Cluster | None = None,
    registry: Registry | None = None,
) -> Compiled:
    """Capture, check, transform and lower one training step; the report and every export read the result."""
    step = prepare(model, plan, cluster, registry)
    with step.lowering():
        costed = lower_step(step.stages, step.backend, step.where, step.options)
        too_fast = bandwidth_violations(step.stages, step.backend, step.where)
    # checked here, not in a search's batched costing (which reads no warnings)
    found = []
    if too_fast:
        more = f" (and {len(too_fast) - 1} more op(s))" if len(too_fast) > 1 else ""
        found.append(f"{INVARIANT} (from {step.facts.culprit}): {too_fast[0]}{more}")
    if step.cluster.calibration:  # clamped parameters, and ops the costing took outside the measured sizes
        from echosim.calibrate import calibration_warnings

        found += calibration_warnings(step.backend)
    facts = replace(step.facts, warnings=(*step.facts.warnings, *found)) if found else step.facts
    return Compiled(costed, facts, step.graph, step.stages)


@dataclass
class Prepared:
    """One layout up to its costing: the stage graphs after every pass, where each axis's groups sit,
    what the schedule needs, and what the report says besides time (:func:`prepare`)."""

    stages: list[Stage]
    backend: Any
    where: dict[Any, Any]
    options: StepOptions
    facts: StepFacts
    graph: Graph  # the whole model after the graph-level passes
    cluster: Cluster

    def lowering(self) -> Any:
        """The wall-clock guard every costing of this layout runs under (:data:`LOWER_TIMEOUT_S`)."""
        limit = limit_from_env(LOWER_TIMEOUT_ENV, LOWER_TIMEOUT_S)
        return time_limit(limit, f"costing on backend {self.cluster.backend!r}", LOWER_TIMEOUT_ENV)


def prepare(
    model: Any = DEFAULT_MODEL,
    plan: Plan | None = None,
    cluster: Cluster | None = None,
    registry: Registry | None = None,
    plan_checked: bool = False,
) -> Prepared:
    """Everything :func:`lower` does before costing: capture, checks, passes, the pipeline split, placements.

    :func:`lower` costs the result with :func:`~echosim.timeline.lower.lower_step`; a layout search
    costs the stages of many prepared layouts and times the schedules they share in one batch.
    ``plan_checked``: as :func:`prepare_joint`.
    """
    j = prepare_joint(model, plan, cluster, registry, plan_checked)
    try:
        stages = PipelineParallel(j.plan.pp * j.plan.vpp, j.plan.pp_balance).split(j.graph)
        staged: dict[int, Graph] = {}  # stages of one shape share their graph: its passes run once
        for s in stages:
            if id(s.graph) not in staged:
                staged[id(s.graph)] = run_passes(s.graph, j.stage_passes, check=j.checked, reuse=j.reuse)
        stages = [Stage(s.index, staged[id(s.graph)], s.layers, s.graph) for s in stages]
    except LayoutError as exc:
        raise PlanError(str(exc)) from None
    except VerifyError as exc:
        raise EchosimError(f"a pass broke the graph: {exc}") from None
    return Prepared(stages, j.backend, j.where, j.options, j.facts, j.graph, j.cluster)


@dataclass
class Joint:
    """One layout up to the pipeline split (:func:`prepare_joint`): the whole model after the graph-level
    passes, the stage-level passes still to run on each stage, and what costing and the report read."""

    plan: Plan
    graph: Graph
    stage_passes: list[Any]
    checked: bool | set[str]
    reuse: set[str]
    backend: Any
    where: dict[Any, Any]
    options: StepOptions
    facts: StepFacts
    cluster: Cluster
    own_passes_only: bool  # every pass that runs is echosim's own (pure functions of graph and options)
    # the stage-level passes hashed by what their graphs read (fast_eval.stages sets it on first use): a search's
    # copies of a joint for other schedules and TP overlap share its stage passes, so they take it with them
    stage_key: Any = None


def prepare_joint(
    model: Any = DEFAULT_MODEL,
    plan: Plan | None = None,
    cluster: Cluster | None = None,
    registry: Registry | None = None,
    plan_checked: bool = False,
) -> Joint:
    """:func:`prepare` up to the pipeline split: capture, checks, graph-level passes, placements, facts.

    ``plan_checked``: ``plan`` passed :func:`~echosim.layout.check_plan` on this cluster (its node size resolved)
    and the registry's schedules already (a search's enumeration), so it is not checked again: the function reads
    nothing else, and a search prepares thousands of layouts it enumerated."""
    registry = registry or plugins.get_registry()  # looked up on each call: tests swap the registry
    plan = plan or Plan()
    cluster = cluster or Cluster(devices=plan.world)
    schedules = {name: entry.value for name, entry in registry.schedules.items()}
    loaded = _backend(cluster.backend, registry)
    cluster = resolve_cluster(cluster, registry, loaded)
    check_node(cluster, loaded)
    plan = resolve_cp_a2a(plan, cluster.devices_per_node)
    check_precision(plan, loaded)
    check_offload(plan, loaded)
    check_fp8_attention(plan, cluster.backend)
    check_fused_mlp(plan, cluster.backend)
    if not plan_checked:
        check_plan(plan, cluster, schedules, interleaved_names(schedules))
    if not loaded.supports_dtype(plan.dtype):
        raise PlanError(f"--dtype {plan.dtype}: backend {cluster.backend!r} has no {plan.dtype} support")
    _check_requested(registry, plan)
    backend = loaded
    if cluster.calibration:  # calibration (and sqlite3) imported only when one is asked for
        from echosim.calibrate import apply_calibration

        backend = apply_calibration(loaded, cluster.calibration)
    graph, messages, total_params = _load_model(model, plan, registry)
    plan = _per_call(plan, graph.samples) if graph.samples else plan
    graph.derived("sizes-checked", lambda: _check_sizes(graph, model))  # once per captured graph (it passed)
    shape = graph.derived("model_shape", lambda: ModelShape.of(graph, plan.micro_batch))  # once per captured graph
    notes_fp8 = fp8_attention_notes(plan, cluster.backend, graph)
    warnings, notes = split_notes(messages + check_model(plan, shape) + notes_fp8)
    if graph.checkpointed and plan.recompute == "none":
        warnings = [*warnings, own_checkpoints(graph.checkpointed)]
    checked = _verified(registry)
    level = _graph_level(graph, plan, registry, backend, cluster, checked)
    graph_passes = level.passes
    stage_passes = [_sized(p, backend, cluster) for p in _configured(registry, "stage", plan)]
    reuse = _own_passes(registry)
    try:
        joint = level.joint if level.joint is not None else run_passes(graph, graph_passes, check=checked, reuse=reuse)
        level.joint = joint
    except LayoutError as exc:
        raise PlanError(str(exc)) from None
    except VerifyError as exc:
        raise EchosimError(f"a pass broke the graph: {exc}") from None
    # layers the passes split another way, found only while splitting: read off the split graph once per graph
    if plan.cp > 1:
        notes = [*notes, *joint.derived(("head-parallel", plan.cp), lambda: head_parallel_note(joint, plan.cp))]
    if plan.tp > 1 and plan.sp:
        warnings = [*warnings, *joint.derived(("whole", plan.tp), lambda: whole_layers_warning(joint, plan.tp))]
    if plan.embedding_sharding != "none":
        sharding, tables = joint.derived(("embedding-plan",), lambda: embedding_plan(graph, graph_passes))
        notes = [*notes, *sharding]
    else:
        tables = {}
    if plan.offload_optimizer or plan.offload_params:
        # sharded embedding tables step on the device inside backward (row-wise Adagrad): none of them is offloaded
        note, over = host_state(total_params - tables.get("params", 0), plan, loaded)
        notes, warnings = [*notes, note], [*warnings, *([over] if over else [])]
    degrees = Degrees(plan.tp, plan.pp, plan.dp, plan.cp, plan.ep, plan.etp, plan.cp_a2a)
    where = axis_placements(degrees, cluster.devices_per_node)
    schedule = on_stages(schedules[plan.schedule], plan.pp)
    if schedule is not schedules[plan.schedule]:
        notes = [*notes, f"schedule {plan.schedule} with one pipeline stage: no bubble for deferred weight "
                 "gradients to fill, so each backward runs whole (as 1f1b)"]  # fmt: skip
    options = StepOptions(
        schedule=schedule,
        pp=plan.pp,
        vpp=plan.vpp,
        microbatches=plan.microbatches,
        tp=plan.tp,
        sp=plan.sp,
        tp_overlap=plan.tp_overlap,
        overlap_dp=plan.overlap_dp,
        # a schedule of overlapped forward-backward pairs (DualPipe) hides the EP all-to-alls by itself
        ep_overlap=plan.moe_ep_overlap or (plan.ep > 1 and _pairs(schedules[plan.schedule])),
    )
    framework = get_framework(plan.framework)
    # PyTorch DDP's reducer keeps its gradient buckets as well as the gradients (DataParallel.bucket_buffers): read
    # off the data-parallel pass as configured for this backend (none on XLA's static buffers: _sized)
    buckets = any(isinstance(p, DataParallel) and p.bucket_buffers() for p in stage_passes)
    kept = framework.state(plan.pp, plan.grad_dtype, plan.zero, plan.dtype)
    state = {**kept, "optimizer_dtypes": plan.optimizer_dtypes, "offload": plan.offload_optimizer,
             "offload_params": plan.offload_params}  # fmt: skip
    static = bool(getattr(loaded, "static_buffers", False))
    caching = bool(getattr(loaded, "caching_allocator", not static))
    facts = StepFacts(
        model=model if isinstance(model, str) else graph.name,
        backend=cluster.backend,
        devices=cluster.devices,
        devices_per_node=cluster.devices_per_node,
        plan={**plan.as_dict(), "seq_len": shape.seq_len if shape.tokens else 0},  # the sequence simulated
        params=total_params,
        # fp8 / mxfp8 / nvfp4 MFU: the 16-bit peak, as NVIDIA's recipe tables divide by
        peak_flops=backend.peak_flops("bf16" if plan.dtype in LOW_PRECISION else plan.dtype),
        capacity_bytes=backend.memory_bytes(),
        ranks_per_stage=plan.tp * plan.dp * plan.cp,
        sequences=plan.batch,
        tokens_per_sample=shape.seq_len if shape.tokens else 0,
        cp=plan.cp,
        state=StatePolicy.for_training(plan.dtype, plan.zero, plan.dp * plan.cp, ddp_bucket_buffers=buckets, **state),
        expert_state=(
            StatePolicy.for_training(plan.dtype, plan.zero, plan.expert_dp, ddp_bucket_buffers=buckets, **state)
            if plan.ep > 1 or plan.expert_tp != plan.tp
            else None
        ),  # an expert's state is sharded over its expert-data-parallel ranks only: tp * cp * dp / (etp * ep)
        saved=SavedPolicy(
            fused_gated=bool(framework.fused_gated),
            offload=offloaded(framework.recompute_policy(plan.recompute)),
            offload_layers=plan.offload_layers,
            probs_in_experts=bool(framework.probs_in_experts),
            gated_inputs_bytes=FP8_TILE_BYTES if framework.fp8_gated_inputs and plan.dtype == "fp8" else 0.0,
            attention_out_bytes=E5M6_BYTES if framework.attention_out_12bit and plan.dtype == "fp8" else 0.0,
            loss_chunks=plan.loss_chunks,
            ce_saved=framework.ce_saved,
            ce_working=framework.loss_working(plan.tp),
            mask_in_dtype=not getattr(loaded, "fused_dropout", True),
            prefetch_held=not static,  # XLA schedules the prefetch within the device's memory
            grad_reduce_per_weight=static,  # XLA reduces each weight's gradient by itself
        ),
        # XLA's static buffer assignment (TPU backends): no caching allocator's blocks, no NCCL buffers.
        # Gradients go over the dp x cp group (passes/plugin.py), so that communicator exists whenever dp*cp > 1
        comm_groups=0 if static else sum(1 for size in (plan.tp, plan.dp * plan.cp, plan.pp, plan.cp) if size > 1),
        caching_allocator=caching,
        warnings=tuple(warnings),
        notes=tuple(notes),
        culprit=f"backend {cluster.backend!r} (plugin {loaded.owner!r})",
        embedding_tables=tables,
    )
    own = all(getattr(p, "name", None) in reuse for p in (*graph_passes, *stage_passes))
    return Joint(plan, joint, stage_passes, checked, reuse, backend, where, options, facts, cluster, own)


#: Parameters of one model: 10^15 is a hundred times the largest model trained (and still costs
#: in closed form); beyond it a byte count nears 2^63.
MAX_PARAMS = 10**15


def _check_sizes(graph: Graph, model: Any) -> None:
    """A tensor with a 0 (or negative) dimension, or a model past :data:`MAX_PARAMS`, is refused here,
    by the model's name, rather than failing later inside a backend's cost model."""
    name = model if isinstance(model, str) else graph.name
    for node in graph:
        if any(d <= 0 for d in node.out.shape):
            where = f" in {node.scope}" if node.scope else ""
            raise EchosimError(
                f"{name}: {node.op.value} {node.name!r}{where} has shape {list(node.out.shape)}: "
                "every dimension must be at least 1"
            )
    params = graph.param_count()
    if params > MAX_PARAMS:
        raise EchosimError(f"{name}: {params:.3g} parameters exceeds the limit of {MAX_PARAMS:.0e}")


def strict_failures(report: Report) -> list[str]:
    """The warnings ``--strict`` turns into errors: a broken physical invariant, an op costed by no rule,
    a calibration used outside what it measured or with a fitted parameter clamped at its bound."""
    from echosim.calibrate.db import CLAMPED, EXTRAPOLATED

    return [w for w in report.warnings if w.startswith((INVARIANT, "no rule for", EXTRAPOLATED, CLAMPED))]


def _backend(name: str, registry: Registry) -> Any:
    """The backend ``name`` builds, one object per factory (see ``_BACKENDS``); unknown names raise as before."""
    entry = registry.backends.get(name)
    if entry is None:
        return load_backend(name, registry)
    return _BACKENDS.get((name, entry.value, entry.owner), lambda: load_backend(name, registry))


def _check_requested(registry: Registry, plan: Plan) -> None:
    optional = sorted(name for name, e in registry.passes.items() if e.value.optional)
    for name in plan.passes:
        entry = registry.passes.get(name)
        if entry is None or not entry.value.optional:
            what = "unknown pass" if entry is None else "pass"
            why = "" if entry is None else " always runs when it applies;"
            known = ", ".join(optional) or "none installed"
            raise PlanError(f"--pass {name}: {what}{why} optional passes: {known}")


def _own_passes(registry: Registry) -> set[str]:
    """echosim's own passes: pure functions of their input graph and options, so their results are reused."""
    return {name for name, e in registry.passes.items() if e.owner.startswith("echosim.")}


def _verified(registry: Registry) -> bool | set[str]:
    """Passes whose output is verified: third parties' always, echosim's own in debug mode (and in its tests)."""
    if os.environ.get("ECHOSIM_VERIFY"):
        return True
    return {name for name, e in registry.passes.items() if not e.owner.startswith("echosim.")}


def _sized(instance: Any, backend: Any, cluster: Cluster) -> Any:
    """What a pass needs of the backend that the plan does not say: the embedding-sharding pass places
    tables within the device's memory and node; on an XLA backend (static buffers) the gradient
    all-reduce is compiled into the step, with no PyTorch DDP reducer to copy gradients into buckets
    or to bucket them its way."""
    from echosim.passes.embedding_sharding import EmbeddingSharding

    ddp = isinstance(instance, DataParallel) and (instance.bucket_copies or instance.torch_ddp)
    if ddp and getattr(backend, "static_buffers", False):
        return replace(instance, bucket_copies=False, torch_ddp=False)
    if not isinstance(instance, EmbeddingSharding):
        return instance
    return replace(instance, capacity_bytes=backend.memory_bytes(), local_world=cluster.devices_per_node or 8)


def _load_model(model: Any, plan: Plan, registry: Registry) -> tuple[Graph, list[str], int]:
    """:func:`load_model`, kept for a model registered by name (one capture per model factory and capture
    spec, as ``_BACKENDS`` keeps one backend per factory): a search prepares thousands of layouts of one
    model, and each call would otherwise build its config, hash it and arm the capture's time limit again."""
    entry = registry.models.get(model) if isinstance(model, str) else None
    if entry is None:  # a file or an object: captured each time (a file may change between compiles)
        return load_model(model, plan)
    key = (model, entry.value, entry.owner, plan.micro_batch, plan.seq_len, plan.dtype)  # what load_model reads
    graph, messages, params = _CAPTURES.get(key, lambda: _captured(model, plan))
    return graph, list(messages), params


def _captured(model: Any, plan: Plan) -> tuple[Graph, tuple[str, ...], int]:
    graph, messages, params = load_model(model, plan)
    return graph, tuple(messages), params


_CAPTURES: Memo[tuple[Graph, tuple[str, ...], int]] = Memo("captured models", maxsize=64)


@dataclass
class _GraphLevel:
    """A captured graph's graph-level passes as configured for a plan, and their result once run."""

    registry: Registry
    backend: Any
    passes: list[Any]
    joint: Graph | None = None


#: The plan fields the built-in graph-level passes' configure functions read (echosim/passes/plugin.py:
#: ``_attention``, ``_context``, ``_tensor`` (``expert_tp`` is ``etp or tp``), ``_expert``, ``_embedding_sharding``,
#: ``_autocast``, ``_autodiff``, ``_context_backward``, ``_recompute``, ``_fp8``) and :func:`_configured` itself
#: (``passes``). Layouts that differ only in other fields (ZeRO stage, virtual stages, micro-batch count, overlap
#: flags, offload) configure the same graph-level passes: a full-space GPT-3 search prepares 8,556 layouts with
#: 1,404 distinct values of these. tests/test_compiler_memo.py checks the list against what each function reads.
GRAPH_PASS_FIELDS = (
    "framework", "attention", "splash_blocks", "fp8_attention", "moe_fused_mlp", "cp", "cp_comm", "cp_a2a",
    "cp_balance", "tp",
    "sp", "etp", "moe_router_groups", "moe_router_group_topk", "moe_capacity_factor", "moe_dispatcher", "dtype", "ep",
    "moe_imbalance", "seq_len", "moe_pad_to_capacity", "embedding_sharding", "dp", "pp", "recompute", "loss_chunks",
    "passes",
)  # fmt: skip
_GRAPH_PASS_VALUES = operator.attrgetter(*GRAPH_PASS_FIELDS)
_GRAPH_LEVELS: Memo[_GraphLevel] = Memo("graph-level passes by plan", maxsize=4096)


def _graph_level(
    graph: Graph, plan: Plan, registry: Registry, backend: Any, cluster: Cluster, checked: bool | set[str]
) -> _GraphLevel:
    """The graph-level passes of ``plan`` (configured and sized), with the graph they give once run, kept by the
    plan fields they read where every graph-level pass is a built-in one (whose configure reads only
    :data:`GRAPH_PASS_FIELDS` and the plan's framework); with a plugin's graph-level pass, built for each call."""
    # _sized reads the backend's memory and the node size; the verified set decides whether run_passes checks
    key = (
        id(registry),
        id(backend),
        cluster.devices_per_node,
        graph,
        get_framework(plan.framework),  # check_plan refused an unknown name already
        checked if isinstance(checked, bool) else frozenset(checked),
        _GRAPH_PASS_VALUES(plan),
    )
    kept = _GRAPH_LEVELS.lookup(key)
    if kept is not None and kept.registry is registry and kept.backend is backend:  # ids of live objects only
        return kept  # kept only where every pass was a built-in one: the same registry and plan passes still are
    passes = [_sized(p, backend, cluster) for p in _configured(registry, "graph", plan)]
    kept = _GraphLevel(registry, backend, passes)
    # a plugin's graph-level pass (or its configure) may read anything, and its result is not reused; an optional
    # one the plan does not name is never built (the plan's ``passes`` are in the key). A registry's passes do not
    # change once loaded (``Registry.pass_pipeline`` keeps its order)
    if all(
        (e.value.configure in _BUILTIN_GRAPH_CONFIGURES and e.owner.startswith("echosim."))
        or (e.value.optional and e.name not in plan.passes)
        for e in registry.pass_pipeline("graph")
    ):
        _GRAPH_LEVELS.put(key, kept)
    return kept


def _builtin_graph_configures() -> frozenset[Any]:
    from echosim.passes.plugin import BUILTIN_PASSES

    return frozenset(configure for _, configure, level in BUILTIN_PASSES if level == "graph")


_BUILTIN_GRAPH_CONFIGURES = _builtin_graph_configures()


def _configured(registry: Registry, level: str, plan: Plan) -> list[Any]:
    """The registered passes of ``level`` in order, each configured for ``plan`` (those that apply)."""
    out = []
    for entry in registry.pass_pipeline(level):
        if entry.value.optional and entry.name not in plan.passes:
            continue
        try:
            instance = entry.value.build(plan)
        except (EchosimError, LayoutError):
            raise
        except Exception as exc:
            raise EchosimError(
                f"pass '{entry.name}' (plugin '{entry.owner}') could not be configured: {type(exc).__name__}: {exc}"
            ) from None
        if instance is not None:
            out.append(instance)
    return out


__all__ = [
    "Compiled",
    "EchosimError",
    "Joint",
    "Prepared",
    "compile",
    "load_model",
    "lower",
    "prepare",
    "prepare_joint",
]
