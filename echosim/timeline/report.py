"""The result of a compile: numbers a planner asks for, as data and as JSON, read from the costed graph."""

from __future__ import annotations

import json
import math
import operator
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from echosim.memo import Memo
from echosim.passes.flops import graph_flops
from echosim.passes.memory import (
    NCCL_BUFFERS_PER_GROUP,
    MemoryBreakdown,
    SavedPolicy,
    StatePolicy,
    activation_bytes,
    transient_bytes,
)
from echosim.timeline.costed import CostedGraph, StageCost, peak_held, rank_tail


def _round(x: Any) -> Any:
    """Round floats to 6 significant digits so JSON is stable across platforms; a NaN or an infinity
    (which the report's invariants flag) is written as null, never as non-standard JSON."""
    if isinstance(x, float):
        return float(f"{x:.6g}") if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_round(v) for v in x]
    return x


def stable_json(data: Any) -> str:
    """Figures as every ``--json`` writes them: floats to 6 significant digits, keys sorted (byte-stable)."""
    return json.dumps(_round(data), indent=2, sort_keys=True) + "\n"


def fmt_params(n: int) -> str:
    """A parameter count as its readers quote it: billions for language models, millions below (ResNet-50's
    25.6 M read "0.03 B")."""
    if n >= 1e9:
        return f"{n / 1e9:.2f} B"
    return f"{n / 1e6:.1f} M" if n >= 1e6 else f"{n:,}"


def fmt_throughput(report: Report) -> str:
    """Tokens/s for a model that reads token ids; images, queries or sequences a second for any other."""
    if report.tokens_per_s is not None:
        return f"{report.tokens_per_s:,.0f} tokens/s"
    from echosim.frontend.zoo_torch import sample_unit

    return f"{report.samples_per_s:,.1f} {sample_unit(report.model)}/s"


@dataclass
class Report:
    model: str
    backend: str
    devices: int
    devices_per_node: int
    plan: dict[str, Any]
    step_time_s: float
    tokens_per_s: float | None  # None for a model that reads no token ids (images, features)
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
    samples_per_s: float = 0.0  # sequences (images, examples) per second
    # sharded embedding tables' totals (embedding_sharding.embedding_plan); empty without
    embedding_tables: dict[str, int] = field(default_factory=dict)

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
            "samples_per_s": self.samples_per_s,
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
        if self.embedding_tables:
            d["embedding_tables"] = self.embedding_tables
        return _round(d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"


@dataclass(frozen=True)
class StepFacts:
    """What a report says besides time: the run it describes and the device's peak and capacity."""

    model: str
    backend: str
    devices: int
    devices_per_node: int
    plan: dict[str, Any]
    params: int  # total model parameters
    peak_flops: float  # the MFU denominator per device (fp8 runs: the 16-bit peak)
    capacity_bytes: int
    ranks_per_stage: int  # every TP x DP x CP peer of a stage runs the same program
    sequences: int  # sequences per optimizer step (the global batch)
    tokens_per_sample: int = -1  # 0: the model reads no token ids; -1: the stage graphs' input length
    cp: int = 1  # a context-parallel rank holds 1/cp of each sequence
    state: StatePolicy = field(default_factory=lambda: StatePolicy.for_training("bf16"))
    comm_groups: int = 0  # communicators per rank (one NCCL buffer set each)
    caching_allocator: bool = True  # saved tensors take the caching allocator's blocks (False: XLA's static buffers)
    saved: SavedPolicy = field(default_factory=SavedPolicy)  # the framework's kernels and offloads
    expert_state: StatePolicy | None = None  # expert parameters' state (sharded over expert-data-parallel ranks)
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    culprit: str = ""  # who a broken invariant is blamed on: "backend 'x' (plugin 'y')"
    embedding_tables: dict[str, int] = field(default_factory=dict)  # embedding_sharding.embedding_plan


#: Start of every warning that says a report broke a physical invariant (``--strict`` makes it an error).
INVARIANT = "impossible figure"


def invariant_violations(report: Report, culprit: str = "") -> list[str]:
    """What no real step can show: MFU or HFU above 1 or below 0 against the device's peak for the dtype,
    a duration that is not finite or negative, a memory part below 0. Each names ``culprit``."""
    who = f" (from {culprit})" if culprit else ""
    out: list[str] = []

    def bad(what: str) -> None:
        out.append(f"{INVARIANT}{who}: {what}")

    for name in ("mfu", "hfu"):
        value = getattr(report, name)
        if not (0.0 <= value <= 1.0 + 1e-9):
            bad(f"{name.upper()} {value!r} is outside [0, 1] of the device's peak")
    if not (0.0 < report.step_time_s < math.inf):
        bad(f"step time {report.step_time_s!r} s is not a positive finite number")
    durations = [(f"breakdown {k}", v) for k, v in report.breakdown.items()]
    durations += [(f"stage {row['stage']} {k}", v) for row in report.stages for k, v in row.items() if k.endswith("_s")]
    for what, value in durations:
        if not (0.0 <= value < math.inf):
            bad(f"{what} = {value!r} s is not a finite duration >= 0")
    for row in report.memory:
        for key, value in row.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not (0 <= value < math.inf):
                bad(f"memory of stage {row['stage']}: {key} = {value!r}")
    return out


#: What the report reads of a stage's graph: its FLOPs, its static memory (weights, gradients, optimizer
#: state, working set), and the activation bytes one micro-batch keeps (as tensors, and as allocator blocks).
StageFigures = tuple[Any, MemoryBreakdown, int, "int | None"]


def build_report(
    costed: CostedGraph,
    facts: StepFacts,
    brief: bool = False,
    known: Callable[[StageCost], StageFigures] | None = None,
) -> Report:
    """Every figure of the report, read from the costed graph (nothing here composes time).

    ``brief``: the figures only, as a layout search ranks by them; the per-stage rows and the
    invariant checks (which read those figures and add warnings) are left out.
    ``known``: each stage's graph figures given rather than read from its graph (a search's fast
    evaluator derives them for any depth from a few stage graphs; one object per distinct stage).
    """
    m, pp = costed.microbatches, costed.pp
    step = costed.step_time_s
    crit = costed.critical_rank
    chunks = costed.chunks(crit)
    end = costed.block_ends[crit]
    stages = costed.stages
    if known is not None:
        flops = [known(s)[0] for s in stages]
    else:
        flops = [s.graph.derived("flops", lambda g=s.graph: graph_flops(g)) for s in stages]  # once per stage graph
    model_flops = sum(f.model for f in flops) * m * facts.ranks_per_stage
    hw_flops = sum(f.hardware for f in flops) * m * facts.ranks_per_stage
    per_sample = _seq(stages) * facts.cp if facts.tokens_per_sample < 0 else facts.tokens_per_sample
    warnings = list(facts.warnings)
    memory = _memory(costed, facts, warnings, brief, known)
    stage_rows = (
        []
        if brief
        else [
            {
                "stage": x.index % pp,
                "chunk": x.index // pp,
                "layers": x.model_layers,
                "fwd_s": x.fwd,
                "bwd_s": x.bwd + x.wgrad,
                "p2p_fwd_s": x.p2p_fwd,
                "p2p_bwd_s": x.p2p_bwd,
                "dp_exposed_s": x.dp_exposed,
                "optimizer_s": x.optimizer,
            }
            for x in stages
        ]
    )
    busy = sum(costed.runs(crit, t.index) * (t.fwd + t.bwd + t.wgrad) for t in chunks)
    devices, peak = facts.devices, facts.peak_flops
    report = Report(
        model=facts.model,
        backend=facts.backend,
        devices=devices,
        devices_per_node=facts.devices_per_node,
        plan=facts.plan,
        step_time_s=step,
        tokens_per_s=facts.sequences * per_sample / step if per_sample else None,
        samples_per_s=facts.sequences / step,
        mfu=model_flops / (step * devices * peak),
        hfu=hw_flops / (step * devices * peak),
        tflops_per_device=hw_flops / (step * devices) / 1e12,
        model_flops_per_step=float(model_flops),
        hardware_flops_per_step=float(hw_flops),
        params=facts.params,
        bubble_fraction=max(0.0, end - busy) / step,
        critical_stage=crit,
        breakdown=breakdown(costed, crit),
        memory=memory,
        stages=stage_rows,
        warnings=warnings,
        notes=list(facts.notes),
        embedding_tables=dict(facts.embedding_tables),
    )
    if not brief:
        report.warnings += invariant_violations(report, facts.culprit)
    return report


def _memory(
    costed: CostedGraph,
    facts: StepFacts,
    warnings: list[str],
    brief: bool = False,
    known: Callable[[StageCost], StageFigures] | None = None,
) -> list[dict[str, Any]]:
    """Peak memory per pipeline rank; an interleaved rank holds several chunks.

    ``brief`` (a search's figures): the rows alone, without the warning that names a rank's largest parts.
    """
    rows = []
    # Per stage graph and memory policy, computed once: a search meets the same stage graphs again
    # under other schedules, ZeRO stages and placements; the ranks of one layout share them too.
    state_key = ("static-memory", facts.state, facts.expert_state, facts.saved)
    act_key = ("activation-bytes", facts.saved)
    block_key = ("activation-blocks", facts.saved)
    static: dict[int, tuple[MemoryBreakdown, int, int | None]] = {}
    # ranks that hold the same chunks and the same peaks of activations have the same row
    same: dict[tuple[Any, ...], tuple[MemoryBreakdown, dict[str, Any]]] = {}
    nccl = facts.comm_groups * NCCL_BUFFERS_PER_GROUP
    for r in range(costed.pp):
        mine = costed.chunks(r)
        if known is not None:
            figures = [known(s) for s in mine]
            ident = [id(f) for f in figures]
            for i, f in zip(ident, figures, strict=True):
                static[i] = (f[1], f[2], f[3])
        else:
            ident = [id(s.graph) for s in mine]
        for s in mine if known is None else ():
            if id(s.graph) not in static:
                g = s.graph
                static[id(g)] = (
                    g.derived(state_key, lambda s=s: _static(s.graph, facts, s.base)),
                    g.derived(act_key, lambda s=s: activation_bytes(s.graph, facts.saved, s.base)),
                    # each saved tensor as the caching allocator holds it (rounded up)
                    g.derived(block_key, lambda s=s: activation_bytes(s.graph, facts.saved, s.base, blocks=True))
                    if facts.caching_allocator
                    else None,
                )
        parts = [static[i][0] for i in ident]
        act = costed.peak_held(r, {s.index: static[i][1] for s, i in zip(mine, ident, strict=True)})
        blocks = act
        if facts.caching_allocator:
            blocks = costed.peak_held(r, {s.index: static[i][2] or 0 for s, i in zip(mine, ident, strict=True)})
        key = (*ident, act, blocks)
        if key not in same:
            # the optimizer step's fp32 copy of 16-bit gradients lives once the activations are freed
            step = sum(p.step_grads for p in parts)
            transient = max(max(p.transient for p in parts), step - blocks)
            mem = MemoryBreakdown(
                params=sum(p.params for p in parts),
                grads=sum(p.grads for p in parts),
                optimizer=sum(p.optimizer for p in parts),
                activations=act,
                transient=transient,
                # NCCL's buffers and each chunk's PyTorch DDP gradient buckets (StatePolicy.bucket_bytes)
                comm_buffers=nccl + sum(p.comm_buffers for p in parts),
                fragmentation=blocks - act,
                capacity=facts.capacity_bytes,
                step_grads=step,
            )
            same[key] = (mem, mem.as_dict())
        mem, row = same[key]
        if not row["fits"] and not brief:
            top = ", ".join(f"{k} {v / 2**30:.1f} GiB" for k, v in mem.largest(7) if v >= 0.05 * mem.peak)
            warnings.append(
                f"stage {r} does not fit: needs {mem.peak / 2**30:.1f} GiB of {mem.capacity / 2**30:.1f} GiB ({top})"
            )
        rows.append({"stage": r, "layers": sum(s.model_layers for s in mine), **row})
    return rows


def _static(graph: Any, facts: StepFacts, base: Any = None) -> MemoryBreakdown:
    """Weights, gradients, optimizer state and working set of one chunk; experts' state by its own sharding.

    The working set depends on the graph and the framework's kernels only, so it is kept apart from the
    state policy (a search's ZeRO stages share it); :func:`stage_memory` with no micro-batch in flight.
    """
    transient = graph.derived(("transient-bytes", facts.saved), lambda: transient_bytes(graph, facts.saved, base))
    experts = _expert_params(graph) if facts.expert_state is not None else 0
    return static_memory(graph.param_count(), experts, _sparse_tables(graph), transient, facts)


def static_memory(
    params: int, experts: int, sparse: tuple[int, tuple[int, int]], transient: int, facts: StepFacts
) -> MemoryBreakdown:
    """:func:`_static` from a chunk's parameter elements (all, experts', sparse tables' with their bytes)."""
    tables, table_bytes = sparse
    dense = _state(params - experts - tables, facts.state, transient)
    if tables:  # sharded embedding tables: the rows in their own dtype plus row-wise Adagrad state, no gradient
        dense = replace(dense, params=dense.params + table_bytes[0], optimizer=dense.optimizer + table_bytes[1])
    if not experts:
        return dense
    assert facts.expert_state is not None
    e = _state(experts, facts.expert_state, transient)
    return MemoryBreakdown(
        dense.params + e.params, dense.grads + e.grads, dense.optimizer + e.optimizer, 0, dense.transient,
        dense.comm_buffers + e.comm_buffers, 0, 0, dense.step_grads + e.step_grads,
    )  # fmt: skip


def _sparse_tables(graph: Any) -> tuple[int, tuple[int, int]]:
    """Elements of this rank's sparse embedding shards, and their (weight, optimizer-state) bytes."""
    from echosim.passes.embedding_sharding import table_state_bytes

    return table_state_bytes(graph)


def _state(local_params: int, policy: StatePolicy, transient: int) -> MemoryBreakdown:
    """:func:`stage_memory`'s figures for no micro-batch in flight, the working set given; ``comm_buffers`` holds
    the chunk's PyTorch DDP gradient buckets alone (the rank's NCCL buffers are added once per rank)."""
    return MemoryBreakdown(
        params=int(local_params * policy.weight_bytes),
        grads=int(local_params * policy.grad_bytes),
        optimizer=int(local_params * policy.optimizer_bytes),
        activations=0,
        transient=transient,
        comm_buffers=int(local_params * policy.bucket_bytes),
        fragmentation=0,
        capacity=0,
        step_grads=int(local_params * policy.step_grad_bytes),
    )


def _expert_params(graph: Any) -> int:
    from echosim.ir.ops import ParamAttrs

    experts = (n for n in graph.params() if isinstance(n.attrs, ParamAttrs) and n.attrs.expert)
    return sum(n.out.numel * graph.multiplicity(n) for n in experts)


def _seq(stages: list[StageCost]) -> int:
    g = stages[0].graph
    ids = g[g.inputs[0]].out.shape if g.inputs else (1, 1)
    return ids[-1]


def breakdown(costed: CostedGraph, rank: int) -> dict[str, float]:
    """Seconds of a pipeline rank by kind; they add up to its step time.

    Communication counts only where it is exposed (compute waits on it); within a unit,
    exposed time is shared among the collectives' kinds in proportion to their load.
    """
    from echosim.timeline.lower import repeated

    out: dict[str, float] = {}

    def add(key: str, sec: float) -> None:
        out[key] = out.get(key, 0.0) + sec

    busy = 0.0
    for t in costed.chunks(rank):
        m = costed.runs(rank, t.index)
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
        if t.ep_hidden:  # combined 1F1B: this much of the exposed EP all-to-all ran beside the other micro-batch
            add("comm.ep", -t.ep_hidden * m)
    for task in costed.rank_tail(rank):
        add(task.category, task.duration)
    add("bubble", max(0.0, costed.block_ends[rank] - busy))
    return dict(sorted(out.items()))


class BriefFigures(NamedTuple):
    """What a layout search ranks and shows of a step: :class:`Report`'s figures, without the report."""

    step_time_s: float
    tokens_per_s: float | None
    samples_per_s: float
    mfu: float
    peak_bytes: int  # the highest rank's peak memory
    capacity_bytes: int
    bubble_fraction: float
    exposed_comm_s: float  # the breakdown's ``comm.*`` seconds of the critical rank


def brief_figures(
    costs: list[StageCost],
    block_ends: list[float],
    plan: Any,
    microbatches: int,
    facts: StepFacts,
    figures: list[StageFigures],
) -> BriefFigures:
    """:func:`build_report`'s ranking figures of one layout, read from its stage costs and timed schedule alone.

    ``costs[i]`` is virtual stage ``i``, ``block_ends[r]`` when rank ``r``'s last block ends (a column of
    :class:`~echosim.timeline.composer.BatchTiming`), ``plan`` its :class:`~echosim.timeline.composer.SchedulePlan`
    and ``figures[i]`` virtual stage ``i``'s graph figures (a search's fast evaluator: one object per distinct
    stage, first, last and depth, shared by the layouts that share that stage). Every figure is computed with the
    same operations in the same order as :func:`~echosim.timeline.lower.assemble` (the step tail),
    :func:`build_report`, :func:`_memory` and :func:`breakdown`, so it equals theirs to the last bit
    (tests/test_search_brief.py), without the costed graph, its tail tasks and the per-rank memory rows: what
    ranks sharing the same chunks share is computed once.
    """
    pp, m = plan.pp, microbatches
    # per rank (chunks and the chunk whose reduction ends the backward) its step tail's durations in order
    tails: dict[tuple[int, ...], tuple[list[float], list[tuple[str, float]]]] = {}
    statics: dict[tuple[int, ...], tuple[int, list[tuple[int, int | None]], int]] = {}
    rank_ends: list[float] = []
    held_peak = 0
    comm_buffers = facts.comm_groups * NCCL_BUFFERS_PER_GROUP
    known_all = figures
    ids = [id(f) for f in known_all]
    last_of = plan.rank_vstage
    # per rank the identities of its chunks and its tail's key (a few distinct ones: first, middle, last stages);
    # each distinct tail built once, from the first rank that has it
    if len(costs) == pp:
        idents = [(i,) for i in ids]
        keys = [(i, ids[v]) for i, v in zip(ids, last_of, strict=True)]
    else:
        idents = [tuple(ids[r::pp]) for r in range(pp)]
        keys = [(*ident, ids[v]) for ident, v in zip(idents, last_of, strict=True)]
    for r, key in enumerate(keys):
        if key not in tails:
            hit = _TAILS.lookup(key)
            if hit is None:
                steps = rank_tail(costs[r::pp], costs[last_of[r]])
                terms = ([x[4] for x in steps], [(x[3], x[4]) for x in steps if x[2] == "comm"])
                hit = (tuple(known_all[r::pp]), known_all[last_of[r]], terms)
                _TAILS.put(key, hit)
            tails[key] = hit[2]
    for b, key in zip(block_ends, keys, strict=True):
        end = t = b
        for sec in tails[key][0]:
            t += sec
            if t > end:  # max(end, t): the later of equals is not taken
                end = t
        rank_ends.append(end)
    # one chunk per rank, every chunk's bytes integers: ranks of one chunk differ in the micro-batches they hold
    # alone, and their peak (the chunk's fixed bytes plus its activation or block bytes times that count) grows
    # with it, so the rank holding the most of each chunk has that chunk's largest peak (the same maximum)
    distinct = {i: f for i, f in zip(ids, known_all, strict=True)}  # a few: first, middle, last stages
    if len(costs) == pp and all(_whole_bytes(f) for f in distinct.values()):
        most: dict[int, int] = {}  # per distinct chunk, the most micro-batches a rank of it holds (first seen first)
        for i, held in zip(ids, _own_held(plan), strict=True):
            if held > most.get(i, -1):
                most[i] = held
        caching = facts.caching_allocator
        for i, held in most.items():
            peak = _chunk_peak(distinct[i], held, caching)
            if peak > held_peak:
                held_peak = peak
    else:
        grouped = _grouped_peak(plan, idents, known_all, facts.caching_allocator) if len(costs) > pp else None
        if grouped is not None:
            held_peak = grouped
        else:
            for r in range(pp):
                peak = _rank_peak(r, costs[r::pp], known_all[r::pp], idents[r], plan, statics, facts)
                if peak > held_peak:
                    held_peak = peak
    step = max(rank_ends)
    crit = rank_ends.index(step)
    chunks = costs[crit::pp]
    # each distinct FLOPs object and how many stages have it, in the order first met: the stages of each distinct
    # figures object counted in C, then added up by their FLOPs objects (figures met first, FLOPs met first)
    stages_of = Counter(ids)
    counts: dict[int, list[Any]] = {}
    for i, fig in distinct.items():
        f = fig[0]
        entry = counts.get(id(f))
        if entry is None:
            counts[id(f)] = [f, stages_of[i]]
        else:
            entry[1] += stages_of[i]
    model_flops = sum(f.model * n for f, n in counts.values()) * m * facts.ranks_per_stage
    per_sample = _seq(costs) * facts.cp if facts.tokens_per_sample < 0 else facts.tokens_per_sample
    busy = m * sum(t.fwd + t.bwd + t.wgrad for t in chunks)
    crit_tail = tails[keys[crit]][1]
    return BriefFigures(
        step_time_s=step,
        tokens_per_s=facts.sequences * per_sample / step if per_sample else None,
        samples_per_s=facts.sequences / step,
        mfu=model_flops / (step * facts.devices * facts.peak_flops),
        peak_bytes=held_peak + comm_buffers,
        capacity_bytes=facts.capacity_bytes,
        bubble_fraction=max(0.0, block_ends[crit] - busy) / step,
        exposed_comm_s=sum(v for _, v in sorted(exposed_comm(chunks, m, crit_tail).items())),
    )


#: A rank's step tail as :func:`brief_figures` reads it (durations in order, and its communication terms), by the
#: ids of the figures objects of the rank's chunks and of the chunk it reduces last. ``figures`` holds one
#: object per stage cost, shared by the layouts that share that stage (fast_eval: each derived stage's own tuple,
#: beside its cost), so equal ids mean equal costs; the entry holds those objects, so no other object takes their
#: ids while it is kept. Layouts of one backward split share stages across schedules.
_TAILS: Memo[tuple[tuple[Any, ...], Any, tuple[list[float], list[tuple[str, float]]]]] = Memo(
    "brief: rank tails", maxsize=1 << 16
)


def _own_held(plan: Any) -> tuple[int, ...]:
    """Per rank of a pipeline of one chunk per rank (rank ``r`` runs virtual stage ``r``), the most micro-batches of
    it the rank holds at once (``plan.in_flight``), kept per plan."""
    return _OWN_HELD.get(plan, lambda: tuple(plan.in_flight[r].get(r, 0) for r in range(plan.pp)))


_OWN_HELD: Memo[tuple[int, ...]] = Memo("brief: micro-batches held per rank", maxsize=1 << 12)


def _whole_bytes(figures: StageFigures) -> bool:
    """Whether a stage's activation and block bytes per micro-batch are non-negative integers (a rank's peak is
    then non-decreasing in the micro-batches it holds, :func:`_rank_peak`)."""
    act, blocks = figures[2], figures[3]
    return type(act) is int and act >= 0 and (blocks is None or (type(blocks) is int and blocks >= 0))


def _chunk_peak(figures: StageFigures, held: int, caching_allocator: bool) -> int:
    """:func:`_rank_peak` of a rank that runs one chunk and holds ``held`` of its micro-batches at most, with the
    same operations in the same order (its one chunk's state summed without the sums over chunks)."""
    part, act, blocks = figures[1], figures[2], figures[3]
    fixed = part.params + part.grads + part.optimizer + part.transient + part.comm_buffers
    held = max(0, held)
    act_held = act * held
    blocks_held = (blocks or 0) * held if caching_allocator else act_held
    # the optimizer step's fp32 copy of 16-bit gradients, once the activations are freed (as _memory)
    at_step = fixed - part.transient + part.step_grads
    return max(fixed + act_held + (blocks_held - act_held), at_step)  # type: ignore[no-any-return]


def _grouped_peak(plan: Any, idents: list[tuple[int, ...]], figures: list[StageFigures], caching: bool) -> int | None:
    """The highest of :func:`_rank_peak` over the ranks of an interleaved pipeline (several chunks a rank), computed
    once per group of ranks holding the same chunks; None where its conditions fail (the caller takes each rank).

    For integer bytes every rank's peak is ``fixed + held``: ``fixed + act + (blocks - act)`` is
    ``fixed + blocks`` exactly (``blocks`` the allocator's bytes, or the tensors' without a caching allocator).
    ``held`` is the largest prefix sum of the rank's orders (:func:`~echosim.timeline.costed.peak_held`), each
    prefix the dot product of its held counts with the chunks' bytes per micro-batch; with non-negative bytes the
    largest is reached at a count vector no other of the group exceeds in every chunk (:func:`_held_points`), so
    the group's highest peak is ``fixed`` plus the largest dot product over those few vectors: the same integer.
    """
    pp = plan.pp
    groups: dict[tuple[int, ...], list[int]] = {}
    for r, ident in enumerate(idents):
        groups.setdefault(ident, []).append(r)
    best = 0
    for ranks in groups.values():
        mine = figures[ranks[0] :: pp]
        if not all(_whole_bytes(f) for f in mine):
            return None
        parts = [f[1] for f in mine]
        state = sum(p.params for p in parts) + sum(p.grads for p in parts) + sum(p.optimizer for p in parts)
        fixed = state + max(p.transient for p in parts) + sum(p.comm_buffers for p in parts)  # as _rank_peak
        if type(fixed) is not int:  # a float would round fixed + act + (blocks - act) its own way
            return None
        at_step = state + sum(p.comm_buffers for p in parts) + sum(p.step_grads for p in parts)
        best = max(best, at_step)
        sizes = [f[3] or 0 for f in mine] if caching else [f[2] for f in mine]
        key = (plan, tuple(ranks))
        points = _HELD_POINTS.get(key, lambda ranks=ranks: _held_points(plan, ranks))
        held = max((sum(map(operator.mul, c, sizes)) for c in points), default=0)
        if fixed + held > best:
            best = fixed + held
    return best


#: Per schedule plan and group of ranks, the count vectors of :func:`_held_points` (a few hundred plans a search).
_HELD_POINTS: Memo[tuple[tuple[int, ...], ...]] = Memo("brief: held micro-batch counts", maxsize=1 << 14)


def _held_points(plan: Any, ranks: list[int]) -> tuple[tuple[int, ...], ...]:
    """Micro-batches held of each chunk (the ``j``-th entry: virtual stage ``r + j * pp``) where one of ``ranks``
    may peak: after each run of forwards along its orders (a forward only adds, so the end of a run bounds the
    rest of it), without the vectors another one is at least as large as in every chunk."""
    pp = plan.pp
    found: set[tuple[int, ...]] = set()
    for r in ranks:
        held = [0] * (plan.vstages // pp)
        forward = False  # the order before was a forward: a run of them ends at the next other order or the end
        for kind, v, _ in plan.orders[r]:
            if kind == "F":
                held[v // pp] += 1
                forward = True
                continue
            if forward:
                found.add(tuple(held))
                forward = False
            if kind == "B":
                held[v // pp] -= 1
        if forward:
            found.add(tuple(held))
    kept: list[tuple[int, ...]] = []
    for c in sorted(found, key=sum, reverse=True):  # a vector bounding c has a sum at least c's: kept before it
        if not any(all(x >= y for x, y in zip(k, c, strict=True)) for k in kept):
            kept.append(c)
    return tuple(kept)


def _rank_peak(
    rank: int,
    mine: list[StageCost],
    figures: list[StageFigures],
    key: tuple[int, ...],
    plan: Any,
    statics: dict[tuple[int, ...], tuple[int, list[tuple[int, int | None]], int]],
    facts: StepFacts,
) -> int:
    """:func:`_memory`'s peak of one rank less its NCCL buffers (the same for every rank).

    ``mine`` are the rank's chunks in order, virtual stages ``rank``, ``rank + pp``, ...: their indices are read
    from that order, not from the costs (a search's brief costs are shared by the virtual stages of one shape and
    not told theirs: fast_eval.stages)."""
    hit = statics.get(key)
    if hit is None:
        parts = [f[1] for f in figures]
        state = sum(p.params for p in parts) + sum(p.grads for p in parts) + sum(p.optimizer for p in parts)
        fixed = state + max(p.transient for p in parts) + sum(p.comm_buffers for p in parts)  # + DDP's buckets
        at_step = state + sum(p.comm_buffers for p in parts) + sum(p.step_grads for p in parts)
        hit = statics[key] = (fixed, [(f[2], f[3]) for f in figures], at_step)
    fixed, sizes, at_step = hit
    if len(mine) == 1:  # one chunk: its bytes times the most micro-batches the rank holds (as _peak_held)
        (act, blocks), held = sizes[0], max(0, plan.in_flight[rank].get(rank, 0))
        act_held = act * held
        blocks_held = (blocks or 0) * held if facts.caching_allocator else act_held
    else:
        pp = plan.pp
        act_held = peak_held(plan, rank, {rank + j * pp: a for j, (a, _) in enumerate(sizes)})
        blocks_held = (
            peak_held(plan, rank, {rank + j * pp: b or 0 for j, (_, b) in enumerate(sizes)})
            if facts.caching_allocator
            else act_held
        )
    return max(fixed + act_held + (blocks_held - act_held), at_step)


def exposed_comm(chunks: list[StageCost], microbatches: int, tail: list[tuple[str, float]]) -> dict[str, float]:
    """:func:`breakdown`'s ``comm.*`` entries of a rank (its chunks and its tail's communication), summed alike."""
    out: dict[str, float] = {}
    for t in chunks:
        for cat, sec in _exposed_terms(t, microbatches):
            out[cat] = out.get(cat, 0.0) + sec
    for cat, sec in tail:
        out[cat] = out.get(cat, 0.0) + sec
    return out


#: :func:`_exposed_terms` by a chunk's unit lists and micro-batches. A search's copies of one stage's cost share its
#: unit lists (fast_eval), and so do the layouts that share that stage (other schedules of one backward split).
_EXPOSED: Memo[tuple[Any, Any, tuple[tuple[str, float], ...]]] = Memo("brief: exposed comm terms", maxsize=1 << 16)


def _exposed_terms(chunk: StageCost, microbatches: int) -> tuple[tuple[str, float], ...]:
    """The (category, seconds) terms :func:`exposed_comm` adds for one chunk's units, in order: each depends on the
    units and the micro-batches alone. Kept by the unit lists' identities; the entry holds the lists, so no other
    list takes their ids while it is kept."""
    from echosim.timeline.lower import repeated

    fwd, bwd = chunk.fwd_units, chunk.bwd_units
    key = (id(fwd), id(bwd), microbatches)
    hit = _EXPOSED.lookup(key)
    if hit is not None:
        return hit[2]
    m = microbatches
    terms = []
    for unit, k in fwd + bwd:
        if k <= 0:
            continue
        comm, total, compute = unit.comm_split  # as breakdown() sums them, kept on the unit
        if not comm:
            continue
        exposed = max(0.0, repeated(unit, k) - compute * k) * m
        for cat, sec in comm:
            terms.append((cat, exposed * sec / total))
    out = tuple(terms)
    _EXPOSED.put(key, (fwd, bwd, out))
    return out
