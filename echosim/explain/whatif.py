"""What if the layout changed a little? The neighbourhood of a plan, each neighbour really simulated.

:func:`neighbours` lists the one-step changes of a layout that keep its devices and global
batch: virtual pipeline stages, micro-batch size, recompute policy, sequence parallelism,
tp/pp/dp swaps by a factor of two, ZeRO stage, TP communication overlap and the zero-bubble
schedule. :func:`suggest` compiles every neighbour (nothing is estimated) and ranks them:
when the layout does not fit, the fastest of those that fit come first; otherwise those that
shorten the step, fastest first. :func:`cheapest_fit` is the one change that makes a layout
fit at the smallest cost in step time (two steps away when no single step fits).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields, replace
from typing import Any

from echosim.errors import EchosimError
from echosim.explain.diff import GiB, compare, peak_bytes, signed_s
from echosim.frameworks import get_framework, weights_16bit_dtype
from echosim.layout import HOST_OVERFLOW
from echosim.passes.embedding_sharding import SHARDING_TYPES
from echosim.passes.memory import given_dtypes
from echosim.plan import CP_COMMS, HEAD_PARALLEL_COMMS, Cluster, Plan, plan_flags, setting_flags

RECOMPUTE = ("none", "selective", "full")
_SWAPS = (("tp", "dp"), ("dp", "tp"), ("pp", "dp"), ("dp", "pp"), ("tp", "pp"), ("pp", "tp"))
Compile = Callable[[Any, Plan, Cluster], Any]  # (model, plan, cluster) -> Report


@dataclass(frozen=True)
class Outcome:
    """One neighbour simulated: the changed settings, its figures (or why the compiler refused it)."""

    change: str  # the settings that changed, as compile flags ("--vpp 2", "--tp 4 --dp 4")
    plan: Plan
    cluster: Cluster
    step_time_s: float | None = None
    peak_bytes: int = 0
    fits: bool = False
    why: str = ""
    error: str = ""
    report: Any = None  # the neighbour's Report (not serialised)
    host: str = ""  # why its hosts cannot hold its offloaded state (then it does not fit, whatever the device holds)

    @property
    def flags(self) -> str:
        """The compile flags of the changed layout (after the model name)."""
        return shlex.join(plan_flags(self.plan, self.cluster))

    def as_dict(self) -> dict[str, Any]:
        if self.error:
            return {"change": self.change, "flags": self.flags, "error": self.error}
        return {"change": self.change, "flags": self.flags, "step_time_s": self.step_time_s,
                "peak_gib": self.peak_bytes / GiB, "fits": self.fits, "why": self.why,
                **({"host": self.host} if self.host else {})}  # fmt: skip


def changed_flags(base: Plan, new: Plan) -> str:
    """The settings of ``new`` that differ from ``base``, written as compile flags. A global batch left to be
    derived (dp x micro-batch) is the batch it derives: a neighbour that pins it to keep it has not changed it."""
    out = []
    base = replace(base, global_batch=base.batch)
    for f in fields(Plan):
        if getattr(base, f.name) != getattr(new, f.name):
            out += setting_flags(f.name, getattr(new, f.name))
    return shlex.join(out)


def neighbours(plan: Plan, cluster: Cluster) -> list[Plan]:
    """One-step changes of ``plan`` on the same devices and global batch, each a valid-looking layout.

    The compiler has the last word: a neighbour it refuses (a degree that does not divide the
    heads, layers that do not split into the stages) is reported with its reason.
    """
    base = replace(plan, global_batch=plan.batch)  # a change of dp or micro-batch keeps the batch
    out: list[Plan] = []

    def add(**changes: Any) -> None:
        new = replace(base, **changes)
        if new.tp == 1:
            new = replace(new, sp=False, tp_overlap=False)
        if new.pp == 1:
            new = replace(new, vpp=1, schedule="1f1b" if new.schedule == "zb-h1" else new.schedule)
        if new.dp * new.cp == 1 and not (new.offload_optimizer or new.offload_params):
            new = replace(new, zero=0)  # one replica: ZeRO is moot, unless an offload runs inside it
        if new.zero != 3:  # the offloads need their ZeRO stage: a change of stage takes them off
            new = replace(new, offload_params=False)
        if new.zero == 0:
            new = replace(new, offload_optimizer=False)
        if new != base and new not in out and new.batch % (new.micro_batch * new.dp) == 0:
            out.append(new)

    if plan.pp > 1 and plan.schedule in ("1f1b", "interleaved"):
        add(vpp=plan.vpp * 2)
    if plan.vpp > 1:
        add(vpp=plan.vpp // 2)
    add(micro_batch=plan.micro_batch * 2)
    if plan.micro_batch > 1:
        add(micro_batch=plan.micro_batch // 2)
    for policy in RECOMPUTE:
        add(recompute=policy)
    if plan.tp > 1:
        add(sp=not plan.sp)
        add(tp_overlap=not plan.tp_overlap)
    for up, down in _SWAPS:
        if getattr(plan, down) % 2 == 0:
            add(**{up: getattr(plan, up) * 2, down: getattr(plan, down) // 2})
    if plan.dp * plan.cp > 1 and plan.zero < 3:
        add(zero=plan.zero + 1)
    if plan.zero > 0:
        add(zero=plan.zero - 1)
    if plan.pp > 1 and plan.vpp == 1:
        add(schedule="zb-h1" if plan.schedule == "1f1b" else "1f1b")
    if plan.zero > 0:  # the optimizer on the host, or back on the device
        add(offload_optimizer=not plan.offload_optimizer)
    if plan.zero == 3:  # ZeRO-3's weight shards in host memory, or back
        add(offload_params=not plan.offload_params)
    if plan.cp > 1:  # the other context-parallel schemes the framework runs (a2a+p2p: compile's default groups)
        torch = bool(get_framework(plan.framework).cp_torch)
        for comm in CP_COMMS:
            if comm != plan.cp_comm and not (torch and comm in HEAD_PARALLEL_COMMS):
                add(cp_comm=comm, cp_a2a=0)
    if plan.cp_comm == "a2a+p2p" and plan.cp_a2a:  # the hierarchy's groups halved or doubled
        for a2a in (plan.cp_a2a // 2, plan.cp_a2a * 2):
            if 1 < a2a < plan.cp and plan.cp % a2a == 0:
                add(cp_a2a=a2a)
    if plan.embedding_sharding != "none":  # the tables sharded another way (a type that does not fit says so)
        for kind in SHARDING_TYPES:
            if kind not in ("none", plan.embedding_sharding):
                add(embedding_sharding=kind)
    return out


def simulate(model: Any, base: Plan, cluster: Cluster, plans: Iterable[Plan], compile_fn: Compile,
             base_report: Any) -> list[Outcome]:  # fmt: skip
    """Compile every plan; a layout the compiler refuses keeps its one-line reason."""
    out = []
    for plan in plans:
        change = changed_flags(base, plan)
        try:
            report = compile_fn(model, plan, cluster)
        except EchosimError as exc:
            out.append(Outcome(change, plan, cluster, error=" ".join(str(exc).split())))
            continue
        data = report.to_dict()
        # a layout whose hosts cannot hold its offloaded state is no way out, however little the device keeps
        host = next((w for w in report.warnings if w.startswith(HOST_OVERFLOW)), "")
        out.append(Outcome(change, plan, cluster, report.step_time_s, peak_bytes(data), report.fits and not host,
                           why(base_report.to_dict(), data), report=report, host=host))  # fmt: skip
    return out


def why(a: dict[str, Any], b: dict[str, Any]) -> str:
    """The terms that moved most from ``a`` to ``b`` (two of time, then the peak memory), in numbers."""
    comparison = compare(a, b)
    moved = [t for t in comparison.moved() if t.unit == "s" and t.name != "step_time_s"][:2]
    parts = [f"{t.name} {signed_s(t.delta)}" for t in moved]
    peak = comparison.term("memory.peak")
    parts.append(f"peak {peak.a / GiB:.1f} -> {peak.b / GiB:.1f} GiB")
    return "; ".join(parts)


def rank(outcomes: list[Outcome], base_step: float, base_fits: bool) -> list[Outcome]:
    """The changes that help, best first.

    A layout that does not fit: those that make it fit, fastest first, then those that shrink
    the peak most. A layout that fits: those that fit and shorten the step, fastest first.
    """
    ran = _distinct_tables([o for o in outcomes if not o.error])
    fit = sorted((o for o in ran if o.fits), key=lambda o: (o.step_time_s, o.change))
    if base_fits:
        return [o for o in fit if o.step_time_s is not None and o.step_time_s < base_step]
    rest = sorted((o for o in ran if not o.fits), key=lambda o: (o.peak_bytes, o.step_time_s, o.change))
    return fit + rest


def _distinct_tables(outcomes: list[Outcome]) -> list[Outcome]:
    """One of the table shardings that give the same layout: column-wise of tables no wider than a column block is
    table-wise, table-wise-row-wise on one node is row-wise. They compile to the same figures, to the last bit, and
    only the first (in neighbourhood order) is offered."""
    seen: set[tuple[Any, ...]] = set()
    out = []
    for o in outcomes:
        key = (replace(o.plan, embedding_sharding=""), o.step_time_s, o.peak_bytes)
        if o.plan.embedding_sharding != "none" and key in seen:
            continue
        seen.add(key)
        out.append(o)
    return out


def suggest(model: Any, plan: Plan, cluster: Cluster, base_report: Any, compile_fn: Compile | None = None,
            beam: int = 4) -> tuple[list[Outcome], list[Outcome]]:  # fmt: skip
    """(the changes that help, best first; every neighbour simulated, in neighbourhood order).

    When the layout does not fit and no single change makes it fit, the ``beam`` neighbours
    with the smallest peak are taken one step further.
    """
    if compile_fn is None:
        from echosim.compiler import compile as compile_fn
    if plan.cp_comm == "a2a+p2p" and not plan.cp_a2a:  # the groups compile chose, so their neighbours can be tried
        plan = replace(plan, cp_a2a=int(base_report.plan.get("cp_a2a", 0)))
    outcomes = simulate(model, plan, cluster, neighbours(plan, cluster), compile_fn, base_report)
    # the bisection's other tries were compiled too (counted among the simulated), but only its answer is ranked
    tries = fewest_replayed_layers(model, plan, cluster, outcomes, compile_fn, base_report)
    fewest = [o for o in tries if o.fits][-1:]
    others = [o for o in tries if o not in fewest]
    outcomes += fewest
    outcomes += bf16_moments(model, plan, cluster, compile_fn, base_report)
    outcomes += sixteen_bit_gradients(model, plan, cluster, compile_fn, base_report)
    outcomes += whole_batch(model, plan, cluster, outcomes, compile_fn, base_report)
    outcomes += sharded_tables(model, plan, cluster, compile_fn, base_report)
    if not base_report.fits and not any(o.fits for o in outcomes):
        seen = {o.plan for o in outcomes} | {replace(plan, global_batch=plan.batch)}
        closest = sorted((o for o in outcomes if not o.error), key=lambda o: (o.peak_bytes, o.change))[:beam]
        further = [p for o in closest for p in neighbours(o.plan, cluster) if p not in seen]
        unique = list(dict.fromkeys(further))
        outcomes += simulate(model, plan, cluster, unique, compile_fn, base_report)
    return rank(outcomes, base_report.step_time_s, base_report.fits), outcomes + others


def fewest_replayed_layers(model: Any, plan: Plan, cluster: Cluster, outcomes: list[Outcome], compile_fn: Compile,
                           base_report: Any) -> list[Outcome]:  # fmt: skip
    """Where the layout does not fit and full recompute makes it fit: the layouts a bisection for the fewest layers
    per stage to recompute that still fit (``full:N``, Megatron's block method; saved bytes shrink as N grows)
    compiled, in order: the last that fits is the answer (none fits: only full recompute does). Its step lies
    between the layout's and full recompute's."""
    full = replace(plan, global_batch=plan.batch, recompute="full")
    if base_report.fits or plan.recompute.startswith("full") or not any(o.plan == full and o.fits for o in outcomes):
        return []
    from echosim.compiler import load_model
    from echosim.layout import fewest_replayed

    graph = load_model(model, full)[0]  # the capture compile kept: how many layers a repetition of the block holds
    per_block = max((graph.layers_per_block(p) for p in graph.repeats), default=1)
    stage = max((int(s["layers"]) for s in base_report.stages), default=1)  # repetitions on the largest stage

    def trial(mode: str) -> Outcome:
        return simulate(model, plan, cluster, [replace(full, recompute=mode)], compile_fn, base_report)[0]

    return fewest_replayed(stage, per_block, trial, lambda o: o.fits)


#: Adam's moments in bf16: DeepSeek-V3's choice (arXiv:2412.19437 sec. 3.3.3, "without incurring observable
#: performance degradation") and Megatron-Bridge's DeepSeek and Qwen3 MoE recipes'
BF16_MOMENTS = "exp_avg=bf16,exp_avg_sq=bf16"


def whole_batch(model: Any, plan: Plan, cluster: Cluster, outcomes: list[Outcome], compile_fn: Compile,
                base_report: Any) -> list[Outcome]:  # fmt: skip
    """A model without token sequences (a CNN, DLRM) that accumulates micro-batches: each device's whole batch at once,
    the way such models train, where doubling the micro-batch is a small step from one sample toward it."""
    if base_report.tokens_per_s or plan.microbatches <= 1:
        return []
    whole = replace(plan, global_batch=plan.batch, micro_batch=plan.batch // plan.dp)
    if any(o.plan == whole for o in outcomes):
        return []
    return simulate(model, plan, cluster, [whole], compile_fn, base_report)


def sharded_tables(model: Any, plan: Plan, cluster: Cluster, compile_fn: Compile, base_report: Any) -> list[Outcome]:
    """A model with pooled embedding tables left replicated: the tables sharded as TorchRec's planner picks
    (``--embedding-sharding auto``), where row-wise Adagrad keeps one accumulator per row instead of the dense
    optimizer's gradient and moments per element. On data-parallel layouts only, as the sharding runs."""
    if plan.embedding_sharding != "none" or max(plan.tp, plan.pp, plan.cp) > 1:
        return []
    from echosim.compiler import _load_model
    from echosim.passes.embedding_sharding import find_tables
    from echosim.plugins import get_registry

    # the capture the compile of this layout kept (a model registered by name is not captured again)
    if not find_tables(_load_model(model, plan, get_registry())[0]):
        return []
    sharded = replace(plan, global_batch=plan.batch, embedding_sharding="auto")
    return simulate(model, plan, cluster, [sharded], compile_fn, base_report)


def bf16_moments(model: Any, plan: Plan, cluster: Cluster, compile_fn: Compile, base_report: Any) -> list[Outcome]:
    """Where the layout does not fit under a framework with Megatron-Core's precision-aware optimizer: the same layout
    with Adam's moments in bf16 (``--optimizer-dtypes``, 4 bytes fewer per parameter of the rank's optimizer shard,
    and the master's 2 where Transformer Engine keeps it). A change of numerics, not of layout: offered only to
    make a layout fit."""
    framework = get_framework(plan.framework)
    if base_report.fits or plan.optimizer_dtypes or not framework.precision_aware_optimizer:
        return []
    if not framework.master_copy(plan.dtype):
        return []
    lowered = replace(plan, global_batch=plan.batch, optimizer_dtypes=BF16_MOMENTS)
    return simulate(model, plan, cluster, [lowered], compile_fn, base_report)


def sixteen_bit_gradients(model: Any, plan: Plan, cluster: Cluster, compile_fn: Compile,
                          base_report: Any) -> list[Outcome]:  # fmt: skip
    """Where the layout does not fit and keeps fp32 gradients over 16-bit weights with an fp32 master: the same layout
    with the gradient buffer in the weights' 16 bits (``--grad-dtype``: Megatron's ``--grad-reduce-in-bf16``, the
    NeMo and Megatron-Bridge performance scripts' ``grad_reduce_in_fp32 = False``, DeepSpeed's
    ``grad_accum_dtype``), 2 bytes fewer per parameter of the rank's gradient buffer. Without a sharded optimizer
    the step's fp32 copy can cost more than that saves; the compile says. A change of numerics: offered only to make
    a layout fit."""
    framework = get_framework(plan.framework)
    if base_report.fits or plan.grad_dtype or not framework.master_copy(plan.dtype):
        return []
    fp32 = framework.state(plan.pp, "", plan.zero, plan.dtype).get("fp32_grads", True)
    if not fp32 or given_dtypes(plan.optimizer_dtypes).get("main_grads", "fp32") != "fp32":
        return []
    lowered = replace(plan, global_batch=plan.batch, grad_dtype=weights_16bit_dtype(plan.dtype))
    return simulate(model, plan, cluster, [lowered], compile_fn, base_report)


def cheapest_fit(model: Any, plan: Plan, cluster: Cluster, base_report: Any,
                 compile_fn: Compile | None = None) -> Outcome | None:  # fmt: skip
    """The change that makes a layout fit with the shortest step (``None``: it fits, or nothing near does)."""
    if base_report.fits:
        return None
    ranked, _ = suggest(model, plan, cluster, base_report, compile_fn)
    return ranked[0] if ranked and ranked[0].fits else None
