"""Which layout is best? Enumerate every parallel layout of a model, simulate those that can run, rank them.

The space is every combination of tp, pp, dp, cp (and its scheme), ep, vpp, sp, ZeRO stage (and the
optimizer offloaded to the host or not), micro-batch, recompute, pipeline schedule and tp-overlap
(:data:`SPACE_KEYS`). Before anything is simulated, three filters run in closed form:

* **not applicable**: combinations that are not a layout (sp or tp-overlap without tp,
  vpp without pp or without an interleaved schedule, ep on a dense model, tp on a model that no
  tensor-parallel rule splits) are not listed;
* **equivalent**: a layout whose every input to the compile equals another's is the same
  layout and is listed once (:func:`canonical`; each rule is proven by equal compiles in the
  tests);
* **pruned**: the layout rules (:func:`echosim.layout.check_plan`, :func:`~echosim.layout.check_model`)
  and a memory lower bound (weights, gradients and optimizer state alone, spread as thinly as
  the layout allows) reject a layout with the message that names the constraint.

Every layout left is simulated by the steps of :func:`echosim.compiler.lower`, the function
``echosim compile`` runs, so the figures reported are those of a full compile (tested layout by
layout, exactly, in tests/test_search_compose.py). Work is shared through the caches that compile
keeps by what a value depends on (:mod:`echosim.memo`, ``Graph.derived``): op costs by op, shape,
dtype, backend and group placement; pass results by input graph and options; a unit's timing by its
ops (not their node ids: every pipeline split and stage position of a layer shares it); a micro-batch's
units, saved activations and working set on the stage graph before the stage-level passes (data
parallelism, ZeRO and the optimizer add only the step tail: ZeRO 0/1/2 share them); stage lowering
and stage memory by stage graph, placements and schedule options. In a batch, the schedules of one
layout share its preparation and stage costs (:func:`_prepare`), and the layouts whose schedules have
one shape (schedule, pp, micro-batches, vpp) are timed in one numpy call (:func:`_evaluate_batch`).
Layouts run in this process, in local processes (``workers``) or on a Ray cluster (``executor="ray"``); each worker
holds whole groups of layouts for the whole search (:func:`_shards`), so no two do a group's cold work.

A search (``fast=True``, the default) costs stages with :mod:`echosim.fast_eval` rather than a pipeline split
per layout: each stage shape (first, last, layer count) derived from stage graphs of depth 1 to 3, with the
same figures to the last bit (tests/test_fast_eval.py); a layout it does not cover takes the path above
(:data:`echosim.fast_eval.FALLBACKS` counts them), and the top :data:`RECHECK_TOP` layouts are evaluated again
by that path before they are reported.
"""

from __future__ import annotations

import gc
import heapq
import itertools
import math
import operator
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from typing import Any, NamedTuple, TypeVar

from echosim.errors import EchosimError
from echosim.layout import ModelShape, default_cp_a2a, fewest_replayed, interleaved_names
from echosim.memo import Memo
from echosim.passes.embedding_sharding import SHARDING_TYPES
from echosim.plan import CP_COMMS, Cluster, Plan, PlanError
from echosim.timeline.schedule import on_stages

#: The dimensions of the space, as ``--space KEY=V1,V2`` names them, and how a value is read.
SPACE_KEYS: dict[str, type] = {
    "tp": int,
    "pp": int,
    "dp": int,
    "cp": int,
    "cp_comm": str,
    "ep": int,
    "vpp": int,
    "sp": bool,
    "zero": int,
    "offload_optimizer": bool,
    "mb": int,
    "recompute": str,
    "schedule": str,
    "tp_overlap": bool,
    "embedding_sharding": str,
}
T = TypeVar("T")

OBJECTIVES = ("step-time", "tokens-per-s", "cost")
DEFAULT_MICRO_BATCHES = (1, 2, 4, 8)
DEFAULT_CP = (1, 2, 4, 8)
DEFAULT_VPP = (1, 2, 4)
DEFAULT_MEMORY_FRACTION = 1.0
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class SearchError(EchosimError):
    """A search that cannot run as asked; the message names the option or the constraint."""


def parse_space(items: Iterable[str]) -> dict[str, tuple[Any, ...]]:
    """``["tp=1,2,4", "sp=true,false"]`` -> ``{"tp": (1, 2, 4), "sp": (True, False)}``; bad input is one line."""
    space: dict[str, tuple[Any, ...]] = {}
    for item in items:
        for part in item.split():
            key, sep, text = part.partition("=")
            key = key.strip().replace("-", "_")
            if key in ("micro_batch", "micro_batches"):
                key = "mb"
            if key not in SPACE_KEYS:
                raise SearchError(f"--space: unknown key {key!r} (known: {', '.join(SPACE_KEYS)})")
            if not sep or not text:
                raise SearchError(f"--space {key}: expected {key}=V1,V2,..., got {part!r}")
            space[key] = tuple(_parse_value(key, v.strip()) for v in text.split(","))
    return space


def _parse_value(key: str, text: str) -> Any:
    kind = SPACE_KEYS[key]
    if kind is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise SearchError(f"--space {key}: expected true or false, got {text!r}")
    if kind is int:
        try:
            value = int(text)
        except ValueError:
            raise SearchError(f"--space {key}: expected integers, got {text!r}") from None
        if value < (0 if key == "zero" else 1):
            raise SearchError(f"--space {key}: {value} is out of range")
        return value
    return text


# -- what a search knows of the model before simulating it ------------------------------------------


@dataclass(frozen=True)
class ModelFacts:
    """What enumeration and pruning read from the captured model (one capture per search)."""

    params: int
    shape: ModelShape  # heads, repeated layers, experts, sequence: what the layout rules read
    selective_replays: bool  # selective recompute replays some op of this model (else it equals none)
    # ZeRO on one replica shards nothing, so it is ZeRO 0, unless the framework keeps other state under ZeRO
    # (DeepSpeed: 16-bit gradients with ZeRO, fp32 without it under bf16, Framework.grads_16bit_under_zero)
    zero_moot_alone: bool = True
    # the model's pooled embedding tables: their (parameters, bytes of their rows and of their row-wise Adagrad
    # state), which the memory bound spreads over the data-parallel ranks where the plan shards them
    tables: tuple[int, int] = (0, 0)
    # samples one call of forward runs where the model's inputs fix them (Graph.samples); 0: the micro-batch's
    samples: int = 0

    @classmethod
    def of(cls, model: Any, base: Plan) -> ModelFacts:
        from echosim.compiler import load_model
        from echosim.frameworks import get_framework
        from echosim.passes.embedding_sharding import find_tables
        from echosim.passes.recompute import selective_replays

        graph, _messages, params = load_model(model, replace(base, micro_batch=1))
        shape = ModelShape.of(graph, 1)
        # with flash attention (fused kernel) and no softmax of scores, Megatron's selective adds nothing: the graph
        # of none. A framework whose "selective" is a policy of its own (torchtitan's per-op policy) replays ops
        framework = get_framework(base.framework)
        own = framework.recompute_policy("selective") != "selective"
        replays = own or base.attention != "flash" or selective_replays(graph)
        moot = framework.state(base.pp, base.grad_dtype, 0, base.dtype) == framework.state(
            base.pp, base.grad_dtype, 1, base.dtype
        )
        found = find_tables(graph)
        tables = (sum(t.rows * t.dim for t in found), sum(t.held_bytes for t in found))
        return cls(params=params, shape=shape, selective_replays=replays, zero_moot_alone=moot, tables=tables,
                   samples=graph.samples)  # fmt: skip

    @property
    def layers(self) -> int:
        return self.shape.layers or 1

    @property
    def experts(self) -> tuple[int, ...]:
        return self.shape.routed_experts


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def batch_shares(batch: int, devices: int) -> tuple[int, ...]:
    """Each data-parallel degree's whole share of the global batch: the micro-batches of a model trained without
    accumulation (DLRM, ResNet), smallest first."""
    return tuple(sorted({batch // d for d in _divisors(devices) if batch % d == 0}))


@dataclass(frozen=True)
class SpaceSpec:
    """The values of every dimension for one model on one cluster (defaults filled in)."""

    values: dict[str, tuple[Any, ...]]
    # micro-batches added as a data-parallel degree's whole share of the batch (a model without token sequences):
    # with another degree they are no layout of it, so they are not listed
    shares: tuple[int, ...] = ()

    def size(self) -> int:
        """Combinations of the dimensions (dp is what the others leave of the devices, so it is not a factor)."""
        return math.prod(len(v) for k, v in self.values.items() if k != "dp")

    def as_dict(self) -> dict[str, list[Any]]:
        return {k: list(v) for k, v in self.values.items()}


def full_space(
    facts: ModelFacts, base: Plan, cluster: Cluster, schedules: dict[str, Any], given: dict[str, tuple[Any, ...]]
) -> SpaceSpec:
    """Every dimension's values: the user's where given, else all that can apply to this model and cluster.

    Recompute: none, selective and full, and the base plan's policy where it is another (any that
    :func:`echosim.passes.recompute.policy_named` knows may be asked for with ``--space``). Micro-batches: 1-8,
    and for a model whose samples are no token sequences (DLRM, ResNet: thousands a device) each data-parallel
    degree's whole share of the global batch too, the way such models train (no accumulation).
    """
    from echosim.passes.recompute import RecomputeError, policy_named

    devices, node = cluster.devices, cluster.devices_per_node
    pows = [d for d in _divisors(devices)]
    shares: tuple[int, ...] = ()
    if not facts.shape.tokens:
        shares = tuple(m for m in batch_shares(base.global_batch, devices) if m not in DEFAULT_MICRO_BATCHES)
    defaults: dict[str, tuple[Any, ...]] = {
        # TP crosses no node boundary unless asked; a model no tensor-parallel rule matches (ResNet, DLRM) has none
        "tp": tuple(d for d in pows if d <= node) if facts.shape.tp_targets else (1,),
        "pp": tuple(d for d in pows if d <= facts.layers),
        "dp": tuple(pows),
        "cp": tuple(c for c in DEFAULT_CP if devices % c == 0 and _splits_sequence(facts, c)) or (1,),
        # the base plan's scheme (--cp-comm, else the framework's); --space cp_comm=p2p,all_gather,a2a compares them
        "cp_comm": (base.cp_comm,),
        "ep": tuple(e for e in pows if facts.experts and all(x % e == 0 for x in facts.experts)) or (1,),
        "vpp": DEFAULT_VPP,
        "sp": (False, True),
        "zero": (0, 1, 2, 3),
        "offload_optimizer": (base.offload_optimizer,),  # --space offload_optimizer=false,true compares them
        "mb": DEFAULT_MICRO_BATCHES + shares,
        # the base plan's own policy too (a framework's, e.g. MaxText's remat policies): a search holds the layout asked
        "recompute": tuple(dict.fromkeys(("none", "selective", "full", base.recompute))),
        "schedule": distinct_schedules(schedules),
        "tp_overlap": (False, True),
        # the base plan's (--embedding-sharding); --space embedding_sharding=table,row,table_row,auto compares them
        "embedding_sharding": (base.embedding_sharding,),
    }
    values = {k: tuple(dict.fromkeys(given.get(k, defaults[k]))) for k in SPACE_KEYS}
    for name in values["schedule"]:
        if name not in schedules:
            raise SearchError(f"--space schedule: unknown schedule {name!r} (known: {', '.join(sorted(schedules))})")
    for mode in values["recompute"]:
        try:
            policy_named(mode)
        except RecomputeError as exc:
            raise SearchError(f"--space recompute: {exc}") from None
    for stage in values["zero"]:
        if stage not in (0, 1, 2, 3):
            raise SearchError(f"--space zero: unknown ZeRO stage {stage} (known: 0, 1, 2, 3)")
    for comm in values["cp_comm"]:
        if comm not in CP_COMMS:
            raise SearchError(f"--space cp_comm: unknown scheme {comm!r} (known: {', '.join(CP_COMMS)})")
    for kind in values["embedding_sharding"]:
        if kind not in SHARDING_TYPES:
            raise SearchError(f"--space embedding_sharding: unknown type {kind!r} (known: {', '.join(SHARDING_TYPES)})")
    return SpaceSpec(values, shares if "mb" not in given else ())


def _splits_sequence(facts: ModelFacts, cp: int) -> bool:
    """Context parallelism with causal load balancing cuts a token sequence into 2*cp chunks, for a model that mixes
    its tokens by attention or a scan, never by a recurrence (``layout.check_model`` refuses the rest)."""
    shape = facts.shape
    return shape.tokens and shape.mixes_tokens and not shape.recurrent and shape.seq_len % (2 * cp) == 0


def canonical(plan: Plan, facts: ModelFacts, same_schedule: SameSchedule | None = None) -> Plan:
    """The one layout ``plan`` is the same as: every input of its compile equal, so every figure equal.

    * ZeRO shards over dp x cp replicas: with one replica every stage is stage 0 (unless the framework keeps
      other state under ZeRO: ``ModelFacts.zero_moot_alone``), or stage 1 where the optimizer is offloaded (it
      needs one);
    * tp-overlap chunks GEMMs around TP collectives: without TP there are none;
    * selective recompute with flash attention replays nothing (``ModelFacts.selective_replays``), and no
      policy replays anything in a model with no repeated block of layers (DLRM, ResNet: ``ModelShape.layers``);
    * two schedules that give the same block orders and split the backward alike for this
      (pp, micro-batches, vpp) are one schedule (``same_schedule``: 1F1B, GPipe and 2F2B with one
      micro-batch; "interleaved", registered apart from "1f1b", always).
    """
    m = plan.microbatches if plan.batch % (plan.micro_batch * plan.dp) == 0 else 0
    values = _canon(plan.tp, plan.pp, plan.dp, plan.cp, plan.vpp, plan.zero, plan.tp_overlap, plan.recompute,
                    plan.schedule, m, facts, same_schedule, plan.offload_optimizer)  # fmt: skip
    old = (plan.zero, plan.tp_overlap, plan.recompute, plan.schedule)
    if values == old:
        return plan
    zero, ovl, rc, sched = values
    return replace(plan, zero=zero, tp_overlap=ovl, recompute=rc, schedule=sched)


def _canon(
    tp: int, pp: int, dp: int, cp: int, vpp: int, zero: int, ovl: bool, rc: str, sched: str, m: int,
    facts: ModelFacts, same_schedule: SameSchedule | None, offload: bool = False,
) -> tuple[int, bool, str, str]:  # fmt: skip
    """:func:`canonical` on plain values (the enumeration builds a plan only for distinct layouts)."""
    if zero and dp * cp == 1 and facts.zero_moot_alone:  # an offloaded optimizer needs a ZeRO stage: the first
        zero = 1 if offload else 0
    if ovl and tp == 1:
        ovl = False
    if rc == "selective" and not facts.selective_replays:
        rc = "none"
    if rc != "none" and facts.shape.layers is None:  # no repeated block: echosim checkpoints layers, so none is
        rc = "none"
    if same_schedule is not None and m:
        sched = same_schedule(sched, pp, m, vpp)
    return zero, ovl, rc, sched


SameSchedule = Callable[[str, int, int, int], str]


#: Orders longer than this are not compared (building them costs more than the rare duplicate they find).
_MAX_COMPARED_BLOCKS = 4096


def distinct_schedules(schedules: dict[str, Any]) -> tuple[str, ...]:
    """Registered schedules less those that order blocks like an earlier one on every probed shape
    (``interleaved`` is ``1f1b``'s orders under a second name): the default space lists one of each."""
    out: dict[tuple[Any, ...], str] = {}
    for name in sorted(schedules):
        s = schedules[name]
        if not getattr(s, "searched", True):  # opt-in (--space schedule=...): DualPipe's second copy of the weights
            continue
        probes = []
        for pp, m, vpp in ((2, 4, 1), (4, 8, 1), (4, 8, 2), (8, 16, 2)):
            if vpp > 1 and not getattr(s, "interleaved", False):
                probes.append(None)
                continue
            probes.append(tuple(tuple(o) for o in s.orders(pp, m, vpp)))
        out.setdefault((tuple(probes), bool(getattr(s, "split_backward", False))), name)
    return tuple(sorted(out.values()))


def schedule_canon(schedules: dict[str, Any], names: Sequence[str]) -> SameSchedule:
    """``(schedule, pp, micro-batches, vpp)`` -> the first of ``names`` whose schedule orders blocks exactly alike."""
    seen: dict[tuple[Any, ...], str] = {}
    memo: dict[tuple[str, int, int, int], str] = {}

    def canon(schedule: str, pp: int, m: int, vpp: int) -> str:
        key = (schedule, pp, m, vpp)
        if pp * m * vpp > _MAX_COMPARED_BLOCKS:
            return schedule
        if key not in memo:
            memo[key] = schedule
            for name in (*names, schedule):
                s = schedules[name]
                if vpp > 1 and not getattr(s, "interleaved", False):
                    continue
                unfit = getattr(s, "unfit", None)
                if unfit is not None and unfit(pp, m, vpp):  # refused by the plan's checks, not compared
                    continue
                orders = tuple(tuple(o) for o in s.orders(pp, m, vpp))
                split = bool(getattr(on_stages(s, pp), "split_backward", False))  # one stage: whole (on_stages)
                first = seen.setdefault((orders, split, pp, m, vpp), name)
                if name == schedule:
                    memo[key] = first
                    break
        return memo[key]

    return canon


# -- enumeration and pruning --------------------------------------------------------------------------


@dataclass
class Evaluated:
    """One layout of the search: its figures when simulated, else why it was rejected."""

    plan: Plan
    devices: int
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    samples_per_s: float | None = None
    mfu: float = 0.0
    peak_bytes: int = 0
    capacity_bytes: int = 0
    bubble_fraction: float = 0.0
    exposed_comm_s: float = 0.0
    fits: bool = False
    simulated: bool = False
    reason: str = ""  # empty for a layout that runs and fits
    breakdown: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.simulated and self.fits and self.step_time_s is not None

    def degrees(self) -> dict[str, Any]:
        """The layout's searched settings (``cp_a2a`` only for hierarchical CP, which derives it)."""
        p = self.plan
        return {
            "tp": p.tp, "pp": p.pp, "dp": p.dp, "cp": p.cp, "cp_comm": p.cp_comm,
            **({"cp_a2a": p.cp_a2a} if p.cp_a2a else {}), "ep": p.ep, "vpp": p.vpp, "sp": p.sp,
            "zero": p.zero, "offload_optimizer": p.offload_optimizer,
            "micro_batch": p.micro_batch, "recompute": p.recompute, "schedule": p.schedule,
            "tp_overlap": p.tp_overlap,
            **({"embedding_sharding": p.embedding_sharding} if p.embedding_sharding != "none" else {}),
        }  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.degrees(),
            "devices": self.devices,
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "samples_per_s": self.samples_per_s,
            "mfu": self.mfu,
            "peak_bytes": self.peak_bytes,
            "capacity_bytes": self.capacity_bytes,
            "bubble_fraction": self.bubble_fraction,
            "exposed_comm_s": self.exposed_comm_s,
            "fits": self.fits,
            "simulated": self.simulated,
            "reason": self.reason,
        }


@dataclass
class Enumeration:
    """The layouts to simulate, those rejected before simulation, and the counts of each filter."""

    space: SpaceSpec
    to_simulate: list[Plan]
    rejected: list[Evaluated]
    combinations: int  # the product of the dimensions' sizes
    not_applicable: int
    duplicates: int
    removed_by: Counter[str]  # constraint -> layouts it removed


def memory_lower_bound(plan: Plan, params: int, fp32_grads: bool = False, tables: tuple[int, int] = (0, 0)) -> int:
    """Bytes per device that no layout of these degrees can go under: its share of weights, gradients and
    optimizer state (activations, buffers and replicated parameters only add to it).

    Parameters are spread over tp x pp (and ep for experts: a weaker bound for the rest), state over
    the dp x cp replicas as ZeRO allows, in the bytes the plan's framework keeps
    (:meth:`echosim.frameworks.Framework.state`: MaxText's 16-bit weights keep 8 bytes a parameter, not
    16); gradients counted at 16 bits unless ``fp32_grads``. PyTorch DDP's gradient buckets
    (``StatePolicy.bucket_bytes``) are left out like the other buffers: they only add to the peak, and the
    rejection message names the three parts it counts. Embedding tables the plan shards (``tables``: their
    parameters and the bytes of their rows with row-wise Adagrad's state) are spread over the data-parallel
    ranks as thinly as a sharding can (a replicated table keeps more).
    """
    from echosim.frameworks import get_framework
    from echosim.passes.memory import StatePolicy

    kept = {**get_framework(plan.framework).state(plan.pp), "fp32_grads": fp32_grads,
            "optimizer_dtypes": plan.optimizer_dtypes, "offload": plan.offload_optimizer,
            "offload_params": plan.offload_params}  # fmt: skip
    policy = StatePolicy.for_training(plan.dtype, plan.zero, plan.dp * plan.cp, **kept)
    sharded = plan.embedding_sharding != "none"
    table_params, table_bytes = tables if sharded else (0, 0)
    per_device = (params - table_params) / (plan.tp * plan.pp * plan.ep)
    dense = per_device * (policy.weight_bytes + policy.grad_bytes + policy.optimizer_bytes)
    return int(dense + table_bytes / (plan.dp * plan.cp))


def _bound_key(plan: Plan) -> tuple[Any, ...]:
    """All that :func:`memory_lower_bound` reads of a plan (framework, dtype, optimizer dtypes, offload, pp, ZeRO stage,
    dp x cp, tp x pp x ep): an enumeration's 10^4-10^5 layouts have a few hundred distinct bounds. Change it with
    that function."""
    return (plan.framework, plan.dtype, plan.optimizer_dtypes, plan.offload_optimizer, plan.offload_params, plan.pp,
            plan.zero, plan.dp * plan.cp, plan.tp * plan.pp * plan.ep, plan.embedding_sharding != "none")  # fmt: skip


def enumerate_layouts(
    facts: ModelFacts,
    base: Plan,
    cluster: Cluster,
    space: SpaceSpec,
    schedules: dict[str, Any],
    capacity_bytes: int,
    memory_fraction: float = DEFAULT_MEMORY_FRACTION,
    over_host: dict[bool, str] | None = None,
) -> Enumeration:
    """Every applicable, distinct layout of ``space``: those to simulate, and those rejected with a reason.

    ``over_host``: why the hosts cannot hold the offloaded state of a layout with (True) and without (False) the
    optimizer offloaded (:func:`echosim.layout.host_state`; "": they can); such a layout is rejected with it."""
    over_host = over_host or {}
    v = space.values
    interleaved = interleaved_names(schedules)
    devices = cluster.devices
    batch = base.global_batch
    budget = capacity_bytes * memory_fraction
    same_schedule = schedule_canon(schedules, v["schedule"])
    seen: set[tuple[Any, ...]] = set()
    to_simulate: list[Plan] = []
    rejected: list[Evaluated] = []
    removed: Counter[str] = Counter()
    duplicates = 0
    bounds: dict[tuple[Any, ...], int] = {}  # memory lower bounds by what they read (_rule)
    # _rule's outcome by the layout less its TP overlap, which no rule reads (tests/test_search.py): a layout and
    # its TP-overlap twin are checked once (GPT-3 175B's full space: 63,488 checks -> 34,304)
    rules: dict[tuple[Any, ...], tuple[str, str]] = {}
    fixed = {f.name: getattr(base, f.name) for f in fields(Plan)}  # every field, as _new_plan needs
    for tp, cp, comm, pp in itertools.product(v["tp"], v["cp"], v["cp_comm"], v["pp"]):
        dp = devices // (tp * cp * pp)
        if devices % (tp * cp * pp) or dp not in v["dp"]:
            continue
        if cp == 1:  # no scheme without context parallelism: the base plan's, listed once
            if comm != v["cp_comm"][0]:
                continue
            comm = base.cp_comm
        # hierarchical CP's groups: the base plan's size, else compile's default for this tp x cp (a function of
        # the key's degrees, so no key of its own); none under another scheme
        a2a = (base.cp_a2a or default_cp_a2a(cp, tp, cluster.devices_per_node)) if comm == "a2a+p2p" else 0
        for es, ep, vpp, sp, zero, off, mb, rc, sched, ovl in itertools.product(
            v["embedding_sharding"],
            v["ep"],
            v["vpp"],
            v["sp"],
            v["zero"],
            v["offload_optimizer"],
            v["mb"],
            v["recompute"],
            v["schedule"],
            v["tp_overlap"],
        ):
            if (sp and tp == 1) or (vpp > 1 and (pp == 1 or sched not in interleaved)) or (ep > 1 and dp % ep):
                continue  # not a layout: sp without tp, vpp without an interleaved pipeline, ep outside dp
            if off and zero == 0 and not base.offload_optimizer:
                continue  # nor an offloaded optimizer without ZeRO, unless asked for (the rule then says why)
            gb = batch or mb * dp
            if gb % (mb * dp) and mb in space.shares:
                continue  # another degree's share of the batch: not a micro-batch of this one
            m = gb // (mb * dp) if gb % (mb * dp) == 0 else 0
            zero, ovl, rc, sched = _canon(tp, pp, dp, cp, vpp, zero, ovl, rc, sched, m, facts, same_schedule, off)
            if not facts.tables[0]:  # no pooled tables: every type shards nothing, so all are the base plan's
                es = base.embedding_sharding
            key = (es, tp, pp, dp, cp, comm, ep, vpp, sp, zero, off, mb, rc, sched, ovl)
            if key in seen:
                duplicates += 1
                continue
            seen.add(key)
            plan = _new_plan(fixed, tp=tp, pp=pp, dp=dp, cp=cp, cp_comm=comm, cp_a2a=a2a, ep=ep, vpp=vpp, sp=sp,
                             zero=zero, offload_optimizer=off, micro_batch=mb, recompute=rc, schedule=sched,
                             tp_overlap=ovl, global_batch=gb, embedding_sharding=es)  # fmt: skip
            outcome = rules.get(key[:-1])  # the key less ovl; the global batch follows from mb and dp
            if outcome is None:
                outcome = _rule(plan, cluster, schedules, interleaved, facts, budget, bounds)
                if not outcome[0] and over_host.get(off):  # it runs, but not on these hosts
                    outcome = (over_host[off], "host memory")
                rules[key[:-1]] = outcome
            reason, constraint = outcome
            if reason:
                removed[constraint] += 1
                rejected.append(Evaluated(plan, devices, reason=reason, capacity_bytes=capacity_bytes))
            else:
                to_simulate.append(plan)
    listed = len(to_simulate) + len(rejected) + duplicates
    return Enumeration(space, to_simulate, rejected, space.size(), space.size() - listed, duplicates, removed)


def _new_plan(fixed: dict[str, Any], **changes: Any) -> Plan:
    """``Plan(**{**fixed, **changes})`` without the frozen dataclass's ``__init__``, which sets each of its 34 fields
    through ``object.__setattr__`` (an enumeration builds 10^4-10^5 plans). The same object: ``Plan`` has no
    ``__post_init__``, ``init=False`` field or slots, and ``fixed`` holds every field (tests/test_search.py)."""
    plan = object.__new__(Plan)
    plan.__dict__.update(fixed, **changes)  # fixed's order (the fields'), changed values in place
    return plan


def _rule(
    plan: Plan,
    cluster: Cluster,
    schedules: dict[str, Any],
    interleaved: list[str],
    facts: ModelFacts,
    budget: float,
    bounds: dict[tuple[Any, ...], int] | None = None,
) -> tuple[str, str]:
    """(message, constraint) of the first rule ``plan`` breaks before simulation; empty when none.

    ``bounds``: an enumeration's memory lower bounds, kept by :func:`_bound_key`."""
    from echosim.layout import check_model, check_plan

    if plan.global_batch % (plan.micro_batch * plan.dp):
        return (
            f"global batch {plan.global_batch} is not a multiple of micro-batch*dp = {plan.micro_batch}*{plan.dp}",
            "global batch divisibility",
        )
    if plan.pp * plan.vpp > facts.layers + 2:  # as the pipeline split: the embedding and the loss may take a stage
        return (
            f"pp*vpp = {plan.pp * plan.vpp} exceeds the layers ({facts.layers}) plus the embedding and loss stages",
            "layers per stage",
        )
    try:
        check_plan(plan, cluster, schedules, interleaved)
        check_model(plan, facts.shape)
    except PlanError as exc:
        return str(exc), _constraint(str(exc))
    key = _bound_key(plan)
    bound = None if bounds is None else bounds.get(key)
    if bound is None:
        bound = memory_lower_bound(plan, facts.params, False, facts.tables)
        if bounds is not None:
            bounds[key] = bound
    if bound > budget:
        return (
            f"memory lower bound {bound / 2**30:.1f} GiB (weights, grads, optimizer state) > "
            f"{budget / 2**30:.1f} GiB allowed",
            "memory lower bound",
        )
    return "", ""


def _constraint(message: str) -> str:
    """A short name for the rule a layout message states (for the counts of what removed what)."""
    for needle, name in (
        ("sliding-window", "a sliding window under the ring (--cp-comm p2p; all_gather, a2a run one)"),
        ("heads", "attention heads divisibility"),
        ("interleaved", "interleaved schedule micro-batches"),
        ("experts", "experts divisibility"),
        ("seq", "sequence divisibility"),
        ("layers", "layers per stage"),
    ):
        if needle in message:
            return name
    return message.split(":")[0][:60]


# -- simulation -----------------------------------------------------------------------------------------


def evaluate(model: Any, plan: Plan, cluster: Cluster, memory_fraction: float = DEFAULT_MEMORY_FRACTION) -> Evaluated:
    """Compile ``plan`` exactly as ``echosim compile`` does and keep the figures a search ranks by."""
    from echosim.compiler import lower

    try:
        report = lower(model, plan, cluster).report
    except EchosimError as exc:
        return Evaluated(plan, cluster.devices, simulated=True, reason=str(exc))
    return _figures(plan, cluster.devices, report, memory_fraction)


def _figures(plan: Plan, devices: int, report: Any, memory_fraction: float) -> Evaluated:
    """What a search keeps of one layout's report."""
    peak = max(int(m["peak"]) for m in report.memory)
    capacity = max(int(m["capacity"]) for m in report.memory)
    exposed = sum(v for k, v in report.breakdown.items() if k.startswith("comm."))
    e = _brief(plan, devices, report, peak, capacity, exposed, memory_fraction)
    e.breakdown = dict(report.breakdown)
    return e


def _brief(
    plan: Plan, devices: int, f: Any, peak: int, capacity: int, exposed: float, memory_fraction: float
) -> Evaluated:
    """The figures a search ranks and shows (``f``: a report or :class:`~echosim.timeline.report.BriefFigures`);
    no breakdown (a search re-evaluates its top layouts in full before it explains them)."""
    fits = peak <= capacity * memory_fraction
    reason = "" if fits else f"needs {peak / 2**30:.1f} GiB > {capacity * memory_fraction / 2**30:.1f} GiB allowed"
    return Evaluated(
        plan,
        devices,
        step_time_s=f.step_time_s,
        tokens_per_s=f.tokens_per_s,
        samples_per_s=f.samples_per_s,
        mfu=f.mfu,
        peak_bytes=peak,
        capacity_bytes=capacity,
        bubble_fraction=f.bubble_fraction,
        exposed_comm_s=exposed,
        fits=fits,
        simulated=True,
        reason=reason,
    )


def _evaluate_batch(
    model: Any,
    plans: list[Plan],
    cluster: Cluster,
    fraction: float,
    fast: bool = False,
    brief: bool = False,
    checked: bool = False,
) -> list[Evaluated]:
    """:func:`evaluate` of every plan, sharing what compiles of neighbouring layouts share.

    Each layout is prepared and its stages costed as :func:`echosim.compiler.lower` does (stage
    costs kept by stage graph and placements; the schedules of one layout share both, :func:`_prepare`);
    then the layouts whose schedules have the same shape
    (schedule, pp, micro-batches, vpp) are timed together, one numpy column each
    (:func:`~echosim.timeline.composer.time_schedule` gives a column the same numbers to the last bit
    as a layout timed alone), and each report is read from its column: the figures of ``compile``.

    ``fast``: stages are costed by :mod:`echosim.fast_eval` (no pipeline split per layout: each stage shape
    derived from stage graphs of depth 1-3), falling back to the above where it does not apply.
    ``brief``: a layout the fast path costed has its figures read from its stage costs and schedule column
    (:func:`~echosim.timeline.report.brief_figures`, equal to the report's) with no costed graph, report or
    breakdown; a search's batches (it re-evaluates its top layouts in full before it reports them).
    ``checked``: every plan passed :func:`echosim.layout.check_plan` on ``cluster`` and the registry's schedules (a
    search's enumeration, :func:`_rule`), so :func:`_prepare` does not check the layouts it copies again.
    """
    with _fewer_collections():
        return _evaluate(model, plans, cluster, fraction, fast, brief, checked)


_BATCH_GC_THRESHOLD = 500_000


@contextmanager
def _fewer_collections() -> Iterator[None]:
    """The cyclic garbage collector less often while a batch runs: a search allocates millions of small
    objects that live as long as its caches, and the default threshold (700) scans them over and over.

    A youngest-generation collection once 500,000 more container objects are alive than at the last one
    (``gc.set_threshold``): a full-space GPT-3 175B / 1,024 A100 search's whole run has 78 collections taking
    0.07 CPU-s, where a 50,000 threshold gave 302 taking 2.2 CPU-s. What a batch drops is freed by reference
    counting meanwhile; only cyclic garbage waits (and, as before, what of it is left when the batch ends is
    frozen with the survivors until the search ends)."""
    before = gc.get_threshold()
    gc.set_threshold(_BATCH_GC_THRESHOLD, 20, 20)
    try:
        yield
    finally:
        if _FREEZING[0]:
            gc.freeze()  # before the default threshold returns: no collection scans the batch's survivors again
        gc.set_threshold(*before)


@contextmanager
def _survivors_frozen() -> Iterator[None]:
    """Between the batches of a search, what survived a batch (mostly the caches: graphs, nodes, timings)
    is moved out of the cyclic collector's generations (``gc.freeze``, at the end of
    :func:`_fewer_collections`), so that the collections of later batches scan only what those allocate;
    they are handed back (``gc.unfreeze``) when the search ends.

    The caches grow to millions of objects: collections that scanned them took a third of a full-space
    search's CPU time. Objects are still freed by reference counting meanwhile; only cyclic garbage waits.
    """
    own = gc.get_freeze_count() == 0  # a process that froze objects itself keeps them frozen
    _FREEZING[0] += 1
    try:
        yield
    finally:
        _FREEZING[0] -= 1
        if own and not _FREEZING[0]:
            gc.unfreeze()


#: Searches running :func:`_survivors_frozen` in this process (a batch's end freezes its survivors while > 0).
_FREEZING = [0]


def _evaluate(
    model: Any,
    plans: list[Plan],
    cluster: Cluster,
    fraction: float,
    fast: bool = False,
    brief: bool = False,
    checked: bool = False,
) -> list[Evaluated]:
    from echosim import fast_eval
    from echosim.compiler import prepare_joint
    from echosim.timeline.lower import assemble, lower_stages, schedule_inputs, step_plan
    from echosim.timeline.report import brief_figures, build_report

    out: list[Evaluated | None] = [None] * len(plans)
    shared: dict[Any, list[tuple[int, Any, Any]]] = {}
    steps: dict[tuple[Any, ...], Any] = {}  # prepared layouts by all but their schedule
    joints = _joints(model, cluster)  # ... up to the pipeline split (fast path), kept across batches
    registered = _Registered.now()  # what _prepare reads of the plugin registry, once for the batch
    lowered: dict[tuple[Any, ...], Any] = {}  # their stage costs by stage graphs and backward split
    alive: list[Any] = []
    # schedule plans by what step_plan reads (the schedule object, pp, micro-batches, vpp; the schedules are the
    # registry's objects, kept alive by ``alive``): its own cache hashes the schedule's orders function per layout
    plans_of: dict[tuple[int, int, int, int], Any] = {}
    for i, plan in enumerate(plans):
        if fast:
            try:
                joint = _prepare(model, plan, cluster, joints, prepare_joint, checked, registered)
                costs, figures = fast_eval.stages(joint)
                alive.append(joint)
                o = joint.options
                at = (id(o.schedule), o.pp, o.microbatches, o.vpp)
                shape = plans_of.get(at)
                if shape is None:
                    shape = plans_of[at] = step_plan(o)
                shared.setdefault(shape, []).append((i, joint, (costs, figures)))
                continue
            except EchosimError as exc:
                out[i] = Evaluated(plan, cluster.devices, simulated=True, reason=str(exc))
                continue
            except fast_eval.Fallback as exc:
                fast_eval.FALLBACKS[str(exc)] += 1
        try:
            step = _prepare(model, plan, cluster, steps, checked=checked, registered=registered)
            alive.append(step)  # the ids below stay theirs for the batch
            # the stages are shared by _prepare across schedules and TP overlap; lowering reads both
            key = (id(step.stages), step.options.schedule.split_backward, step.options.tp_overlap)
            if key not in lowered:
                with step.lowering():
                    lowered[key] = lower_stages(step.stages, step.backend, step.where, step.options)
            costs = lowered[key]
            shape = step_plan(step.options)
        except EchosimError as exc:
            out[i] = Evaluated(plan, cluster.devices, simulated=True, reason=str(exc))
            continue
        shared.setdefault(shape, []).append((i, step, costs))
    from echosim.timeline.composer import time_schedule

    for shape, members in shared.items():
        inputs = [schedule_inputs(_costs_of(costs), step.options) for _, step, costs in members]
        columns, column_of = _distinct_columns(inputs, shape.split_backward)
        timed = time_schedule(shape, *columns)
        ends = timed.rank_ends.T.tolist() if brief else []
        for (i, step, costs), col in zip(members, column_of, strict=True):
            fast_costs = isinstance(costs, tuple)  # (costs, figures) in virtual-stage order (fast_eval.stages)
            if brief and fast_costs:
                f = brief_figures(costs[0], ends[col], shape, step.options.microbatches, step.facts, costs[1])
                out[i] = _brief(plans[i], cluster.devices, f, f.peak_bytes, f.capacity_bytes, f.exposed_comm_s,
                                fraction)  # fmt: skip
                continue
            known = None
            if fast_costs:  # told their virtual stages for the costed graph and its report
                costs = (fast_eval.indexed(costs[0]), costs[1])
                known = _known(costs)
            costed = assemble(_costs_of(costs), timed.layout(col), step.options)
            report = build_report(costed, step.facts, brief=True, known=known)
            out[i] = _figures(plans[i], cluster.devices, report, fraction)
    return [e for e in out if e is not None]


def _distinct_columns(inputs: list[tuple[list[float], ...]], split_backward: bool) -> tuple[list[Any], list[int]]:
    """The schedule inputs of a batch's layouts of one shape (:func:`~echosim.timeline.lower.schedule_inputs`) as
    :func:`~echosim.timeline.composer.time_schedule`'s arguments, one column per distinct layout, and each layout's
    column.

    Layouts whose stages take the same seconds (ZeRO 1 and 2 build one stage graph; a ZeRO stage or a
    recompute policy that changes only memory or the step tail) have the same schedule: a column is timed
    from its own inputs alone (each is one column of the composer's arrays), so equal inputs give equal ends,
    and they are timed once. Equal means the same bytes (``-0.0`` is not ``0.0`` here). GPT-3 175B's full
    space: 25,219 distinct columns of 39,992 layouts, the composer's block-columns 536M -> 275M.
    """
    import numpy as np

    k = 5 if split_backward else 4
    rows = np.array([[v for part in x[:k] for v in part] for x in inputs], np.float64)  # (layouts, k * vstages)
    first: dict[bytes, int] = {}  # a distinct row's bytes -> its column (numbered as met)
    picks: list[int] = []  # the first layout of each column
    column_of: list[int] = []
    for i, row in enumerate(rows):
        col = first.setdefault(row.tobytes(), len(picks))
        if col == len(picks):
            picks.append(i)
        column_of.append(col)
    if len(picks) < len(rows):
        rows = rows[picks]
    parts = np.split(rows.T, k)  # (vstages, distinct) each: fwd, bwd, p2p_fwd, p2p_bwd[, wgrad]
    return [*parts[:4], parts[4] if split_backward else None], column_of


_JOINTS: Memo[tuple[Any, dict[tuple[Any, ...], Any]]] = Memo("search: layouts up to the pipeline split", maxsize=16)


def _joints(model: Any, cluster: Cluster) -> dict[tuple[Any, ...], Any]:
    """The layouts of ``model`` on ``cluster`` prepared up to the pipeline split (``prepare_joint``) by all but
    their schedule, kept for the batches of a search (the registry in the key: tests swap it)."""
    from echosim import plugins

    registry = plugins.get_registry()
    try:
        key = (model, cluster, id(registry))
        hash(key)
    except TypeError:  # a model object that cannot be a key: kept for one batch
        return {}
    kept = _JOINTS.lookup(key)
    if kept is None or kept[0] is not registry:
        kept = (registry, {})
        _JOINTS.put(key, kept)
    return kept[1]


def _known(costs: tuple[list[Any], list[Any]]) -> Callable[[Any], Any]:
    """For a layout the fast path costed (its indexed costs and their figures, aligned), its stages' graph figures
    by stage object for the report."""
    figures = {id(c): f for c, f in zip(*costs, strict=True)}
    return lambda stage: figures[id(stage)]


def _costs_of(costs: Any) -> Any:
    """The stage costs of a layout costed in full (a list) or by the fast path (costs, figures)."""
    return costs[0] if isinstance(costs, tuple) else costs


#: Plan fields no pass, pipeline split or placement reads (echosim's own passes): only the step options and the
#: plan the facts tell. Layouts that differ in these alone share one preparation (:func:`_prepare`).
_TIMING_ONLY = ("schedule", "tp_overlap")
_COSTING_FIELDS = tuple(f.name for f in fields(Plan) if f.name not in _TIMING_ONLY)
_COSTING_VALUES = operator.attrgetter(*_COSTING_FIELDS)  # a tuple of them, read in C (once per layout)


def _costing_key(plan: Plan) -> tuple[Any, ...]:
    """Every field of ``plan`` but its schedule and TP overlap: what the passes, the pipeline split and the
    placements read."""
    return _COSTING_VALUES(plan)  # type: ignore[no-any-return]


class _Registered(NamedTuple):
    """What :func:`_prepare` reads of the plugin registry, read once per batch rather than per layout (the registry
    does not change within a batch)."""

    registry: Any
    schedules: dict[str, Any]  # by name
    interleaved: list[str]  # the schedules that take vpp > 1
    foreign: tuple[tuple[str, bool], ...]  # the passes plugins registered (not echosim's own): (name, optional)

    @classmethod
    def now(cls) -> _Registered:
        from echosim import plugins

        registry = plugins.get_registry()
        schedules = {name: entry.value for name, entry in registry.schedules.items()}
        interleaved = interleaved_names(schedules)
        foreign = tuple(
            (name, bool(e.value.optional)) for name, e in registry.passes.items() if not e.owner.startswith("echosim.")
        )
        return cls(registry, schedules, interleaved, foreign)

    def runs_foreign_pass(self, plan: Plan) -> bool:
        """Whether a plugin's pass runs on ``plan``: a mandatory one, or an optional one the plan names."""
        return any(not optional or name in plan.passes for name, optional in self.foreign)


def _prepare(
    model: Any,
    plan: Plan,
    cluster: Cluster,
    kept: dict[tuple[Any, ...], Any],
    how: Callable[..., Any] | None = None,
    checked: bool = False,
    registered: _Registered | None = None,
) -> Any:
    """:func:`echosim.compiler.prepare` of ``plan``; a layout that differs from one prepared before in its
    schedule or TP overlap alone takes that one's stage graphs, placements and facts with its own schedule
    and TP overlap (step options and the facts' plan).

    The passes read neither (echosim's own: where a plugin's pass runs every layout is prepared
    alone); the schedule's own rules (:func:`echosim.layout.check_plan`) are checked for each layout, unless
    ``checked`` says the search's enumeration checked it already (the same function on the same cluster and
    schedules). ``how``: :func:`~echosim.compiler.prepare` (default) or :func:`~echosim.compiler.prepare_joint`.
    ``registered``: the registry as :meth:`_Registered.now` reads it (a batch reads it once for all its layouts).
    """
    from echosim.compiler import Joint

    reg = registered or _Registered.now()
    key = _costing_key(plan)
    first = kept.get(key)
    if first is None or reg.runs_foreign_pass(plan):
        if how is None:
            from echosim.compiler import prepare

            how = prepare
        step = how(model, plan, cluster, reg.registry, checked)  # the enumeration checked the plan (``checked``)
        kept[key] = step
        return step
    if first.facts.plan["schedule"] == plan.schedule and first.options.tp_overlap == plan.tp_overlap:
        return first
    schedules = reg.schedules
    if not checked:
        from echosim.layout import check_plan

        check_plan(plan, first.cluster, schedules, reg.interleaved)
    extra = {"plan": plan} if isinstance(first, Joint) else {}  # a Joint carries its plan; Prepared does not
    return _replaced(
        first,
        options=_replaced(
            first.options, schedule=on_stages(schedules[plan.schedule], plan.pp), tp_overlap=plan.tp_overlap
        ),
        facts=_replaced(
            first.facts, plan={**first.facts.plan, "schedule": plan.schedule, "tp_overlap": plan.tp_overlap}
        ),
        **extra,
    )


def _replaced(obj: T, **changes: Any) -> T:
    """``dataclasses.replace(obj, **changes)`` for the dataclasses :func:`_prepare` copies, which have no
    ``__post_init__``, ``init=False`` field or slots (tests/test_search.py): their fields copied into a new
    object, without ``replace``'s keyword ``__init__`` (a frozen one sets each field through ``object.__setattr__``;
    a search copies three per layout)."""
    cls = type(obj)
    new = object.__new__(cls)
    fields_of = cls.__dataclass_fields__  # type: ignore[attr-defined]
    new.__dict__.update({k: v for k, v in obj.__dict__.items() if k in fields_of}, **changes)
    return new  # type: ignore[no-any-return]


#: Layouts evaluated together in one process (progress and Ctrl-C act between batches).
BATCH = 192


def _batches(plans: list[Plan], size: int) -> list[list[Plan]]:
    """``plans`` in batches of at most ``size``, those whose schedules have one shape (pp, vpp, schedule,
    micro-batches) next to each other: a batch times each shape it holds in one numpy call (:func:`_evaluate`), so
    a batch of one shape costs one call where one of the enumeration's order (tp, cp, pp outermost) holds dozens
    of shapes. A shape is cut into the fewest batches it needs (``ceil(n / size)`` equal parts) and never across
    a batch boundary otherwise: cutting every ``size`` layouts split most shapes in two (GPT-3 175B's full space:
    483 schedule timings of its 281 shapes, 364 so). Shapes that fit together share a batch. The order is stable
    (the enumeration's within a shape); rankings do not read it, nor does a layout's timing read its neighbours'
    (each is one column of the schedule's arrays)."""
    out: list[list[Plan]] = []
    for _, group in itertools.groupby(sorted(plans, key=_schedule_shape), key=_schedule_shape):
        members = list(group)
        step = math.ceil(len(members) / math.ceil(len(members) / size))
        for i in range(0, len(members), step):
            part = members[i : i + step]
            if out and len(out[-1]) + len(part) <= size:
                out[-1].extend(part)
            else:
                out.append(part)
    return out


def _schedule_shape(p: Plan) -> tuple[int, int, str, int]:
    return (p.pp, p.vpp, p.schedule, p.microbatches)


def _run_local(
    model: Any,
    plans: list[Plan],
    cluster: Cluster,
    fraction: float,
    workers: int,
    fast: bool = False,
    recheck: _Recheck | None = None,
    exiting: list[threading.Thread] | None = None,
) -> Iterator[list[Evaluated]]:
    """The batches of ``plans`` evaluated in this process (``workers`` <= 1) or in ``workers`` local processes.

    Neighbouring layouts share stage graphs and op costs: a batch stays in one process's caches, and the more of
    them a batch holds, the more share a schedule shape. With several processes each has its own shard
    (:func:`_shards`: whole groups of the layouts that share a layer's op shapes and collectives) and its own
    executor, so each group's cold work (its stage graphs, lowering, unit timings, op costs) is done in one
    process only; handing batches to whichever process was free did every group's cold work in each of them
    (GPT-3 175B's full space, main 8558869: 80-89 CPU-s with two processes against 36-40 with one). The processes
    are forked where the platform can (the parent's imports and caches inherited, not rebuilt). Batches come back
    as they finish: rankings sort by objective and plan, never by arrival (:func:`rank`).

    ``recheck``: each worker, after its last batch, evaluates its own shard's top layouts by the full path
    (:func:`_worker_recheck`, on its warm caches, while the other workers still run) into ``recheck.known``, which
    :func:`_recheck_top` then reads instead of evaluating them again in this process on cold caches.

    ``exiting``: a worker whose calls have all returned is let go at once (its process exits while the others
    run); the threads that wait for the processes to exit are added to this list, for the caller to join when it
    has done what it could meanwhile (a process holding a shard's caches takes 0.1 s to exit). None: waited for here.
    """
    if workers <= 1:
        with _survivors_frozen():
            for batch in _batches(plans, BATCH):
                yield _evaluate_batch(model, batch, cluster, fraction, fast, fast, True)
        return
    import multiprocessing

    fork = "fork" in multiprocessing.get_all_start_methods()
    # this process's objects (the model, the enumeration's layouts, the imports) frozen before the workers fork and
    # while their results come in, as with one process: its collections scan what came in since, not all of them
    with _survivors_frozen():
        with _fewer_collections():  # then frozen (a batch imports them so with one process)
            if fork:
                _evaluation_imported()
        threads: list[threading.Thread] = [] if exiting is None else exiting
        yield from _from_workers(model, plans, cluster, fraction, workers, fast, recheck, fork, threads)
        if exiting is None:
            for t in threads:
                t.join()


def _from_workers(
    model: Any,
    plans: list[Plan],
    cluster: Cluster,
    fraction: float,
    workers: int,
    fast: bool,
    recheck: _Recheck | None,
    fork: bool,
    exiting: list[threading.Thread],
) -> Iterator[list[Evaluated]]:
    """:func:`_run_local`'s batches from ``workers`` processes, each with its shard (and its part of ``recheck``);
    each pool is shut down by a thread in ``exiting`` once its calls have all returned."""
    import multiprocessing
    from concurrent.futures import as_completed

    context = multiprocessing.get_context("fork" if fork else None)
    shards = [s for s in _shards(plans, workers) if s]
    pools = [ProcessPoolExecutor(1, mp_context=context, initializer=_worker_started) for _ in shards]
    pool_of: dict[Any, int] = {}  # each call's pool
    batch_of: dict[Any, list[Plan]] = {}  # each batch call's plans
    rechecks = set()
    left: Counter[int] = Counter()  # calls not returned, by pool
    try:
        for w, (pool, shard) in enumerate(zip(pools, shards, strict=True)):
            for b in _batches(shard, BATCH):
                f = pool.submit(_worker_batch, model, b, cluster, fraction, fast)
                pool_of[f], batch_of[f] = w, b
                left[w] += 1
            if recheck is not None:  # after its batches (one process runs its pool's calls in order)
                f = pool.submit(_worker_recheck, model, cluster, fraction, recheck.objective, recheck.price)
                pool_of[f] = w
                left[w] += 1
                rechecks.add(f)
        with _fewer_collections():  # the workers forked at their first submit: this process's threshold only
            for f in as_completed(pool_of):
                w = pool_of[f]
                result = f.result()
                left[w] -= 1
                if not left[w]:  # let go: its process exits while the others run
                    exiting.append(threading.Thread(target=pools[w].shutdown, name=f"echosim-worker-{w}-exit"))
                    exiting[-1].start()
                if f in rechecks:
                    recheck.known.update(result)  # type: ignore[union-attr]
                else:
                    yield _received(result, batch_of[f])
    finally:
        for w, pool in enumerate(pools):  # interrupted: what has not started is dropped, nothing waited for
            if left[w]:
                pool.shutdown(wait=False, cancel_futures=True)


def _evaluation_imported() -> None:
    """The modules a batch's evaluation imports (:func:`_evaluate`), numba's compiled level loops among them, imported
    in this process before it forks its workers: they inherit them rather than each import them (0.4 CPU-s a
    process: 0.2 the evaluation's modules, 0.2 numba and the loops' module), and this process imports them anyway
    to re-check the top layouts (:func:`_recheck_top`)."""
    import importlib

    for name in ("echosim.compiler", "echosim.fast_eval", "echosim.timeline.lower", "echosim.timeline.report"):
        importlib.import_module(name)
    from echosim.timeline import composer

    composer._compiled()  # numba and the loops' module where installed (None otherwise, or with ECHOSIM_JIT=0)


#: The plan fields whose layouts a search's worker keeps together (:func:`_shards`): those that set a layer's
#: per-rank op shapes and its tensor-, sequence-, context- and expert-parallel collectives (tp, sp, cp, ep and the
#: model's own fields), every field of :func:`_costing_key` but the pipeline split (pp, vpp), data parallelism,
#: ZeRO, micro-batch and recompute. A group's layouts share op costs and unit timings (a unit's timing is kept by
#: its ops: every pipeline split, stage position and recompute policy of a layer shares it) as well as their stage
#: graphs. Measured on GPT-3 175B's full space (1,024 A100, each of two shards evaluated alone, one after the other):
#: one process 37.4 CPU-s; shards of these groups (28) 37.8; of groups also split by micro-batch and recompute
#: (224) 38.9; also by pipeline split (2,864) 39.2.
_SHARD_EXCLUDED = ("pp", "vpp", "dp", "zero", "micro_batch", "recompute", *_TIMING_ONLY)
_SHARD_FIELDS = tuple(f for f in _COSTING_FIELDS if f not in _SHARD_EXCLUDED)
_SHARD_VALUES = operator.attrgetter(*_SHARD_FIELDS)


def _shard_key(plan: Plan) -> tuple[Any, ...]:
    """The group of layouts ``plan`` shares its op shapes and collectives with (:data:`_SHARD_FIELDS`)."""
    return _SHARD_VALUES(plan)  # type: ignore[no-any-return]


#: What one stage family (a model graph and pipeline split: its stage graphs built, lowered and analysed once)
#: costs, in layouts' own work (preparation, schedule inputs, brief figures, paid by every layout). GPT-3 175B's
#: full space on 1,024 A100 (benchmarks/search_speed_s17.md's profile, main 8558869): the cold search's stage work
#: 27.7 CPU-s over its 2,864 families, 9.7 ms each; a warm rerun 9.7 CPU-s over 39,972 layouts, 0.24 ms each.
_FAMILY_COST = 40


def _group_cost(members: list[Plan]) -> int:
    """An estimate of a group's evaluation cost, in layouts' own work: each layout plus :data:`_FAMILY_COST` for
    each stage family it builds (each distinct pipeline split, micro-batch and recompute policy). Measured per group
    of GPT-3 175B's full space (28 groups evaluated in turn in one process, 0.8-2.0 CPU-s each): this estimate's
    correlation with a group's CPU time is 0.72, the layout count's 0.53."""
    families = {(p.pp, p.vpp, p.micro_batch, p.recompute) for p in members}
    return len(members) + _FAMILY_COST * len(families)


def _shards(plans: list[Plan], workers: int) -> list[list[Plan]]:
    """``plans`` cut into ``workers`` shards of whole groups (:func:`_shard_key`), balanced by longest processing
    time first: groups by decreasing :func:`_group_cost`, each to the shard with the least cost so far (ties: the
    group met first in ``plans``, the lower-numbered shard; the cut is deterministic). Graham's bound: no shard
    costs more than the mean plus the largest group. Each shard keeps the order of ``plans`` (its batches are cut
    by :func:`_batches`)."""
    groups: dict[tuple[Any, ...], list[Plan]] = {}
    for p in plans:
        groups.setdefault(_shard_key(p), []).append(p)
    load = [0] * max(1, workers)
    shard_of: dict[tuple[Any, ...], int] = {}
    costs = {k: _group_cost(m) for k, m in groups.items()}
    for key in sorted(groups, key=lambda k: -costs[k]):  # stable: equal costs in the order of ``plans``
        w = min(range(len(load)), key=lambda j: (load[j], j))
        shard_of[key] = w
        load[w] += costs[key]
    out: list[list[Plan]] = [[] for _ in load]
    for p in plans:
        out[shard_of[_shard_key(p)]].append(p)
    return out


def _worker_started() -> None:
    """A search's worker process, at its start: what it inherited from the parent (a fork) and what each batch
    leaves in its caches are kept out of the cyclic collector's scans for the process's life, which is the
    search's (:func:`_survivors_frozen`)."""
    gc.freeze()
    _FREEZING[0] = 1
    _SHARD_RESULTS.clear()


#: A worker's results so far in this search (:func:`_worker_batch`), for its re-check (:func:`_worker_recheck`).
_SHARD_RESULTS: list[Evaluated] = []


def _worker_batch(
    model: Any, plans: list[Plan], cluster: Cluster, fraction: float, fast: bool
) -> tuple[list[tuple[Any, ...]], Counter[str]]:
    """One batch of a search in a worker process: its evaluation, as :func:`_row` of each plan (the parent holds
    the plans), and the fast path's fallbacks it counted (:data:`echosim.fast_eval.FALLBACKS`, counted again in
    the parent)."""
    from echosim import fast_eval

    before = Counter(fast_eval.FALLBACKS)
    out = _evaluate_batch(model, plans, cluster, fraction, fast, fast, True)
    _SHARD_RESULTS.extend(out)
    return [_row(e, p) for e, p in zip(out, plans, strict=True)], fast_eval.FALLBACKS - before


#: The fields of an :class:`Evaluated` after its plan and devices (:func:`_row` sends the devices first and the plan
#: only where it is not the parent's).
_ROW_FIELDS = tuple(f.name for f in fields(Evaluated) if f.name not in ("plan", "devices"))
_ROW_VALUES = operator.attrgetter(*_ROW_FIELDS)


def _row(e: Evaluated, plan: Plan) -> tuple[Any, ...]:
    """``e``'s figures without its plan, which is ``plan`` (sent back only if it is not: never, as evaluation
    keeps the plans it is given). Unpickling a layout's plan (34 fields) cost the parent more than its figures:
    GPT-3 175B's full space sends 40k of them while the workers run."""
    return (None if e.plan is plan else e.plan, e.devices, *_ROW_VALUES(e))


def _evaluated(row: tuple[Any, ...], plan: Plan) -> Evaluated:
    """:func:`_row` back to an :class:`Evaluated`, with the parent's ``plan``."""
    sent, devices, *values = row
    return Evaluated(plan if sent is None else sent, devices, *values)


def _worker_recheck(
    model: Any, cluster: Cluster, fraction: float, objective: str, price: float
) -> dict[Plan, Evaluated]:
    """A worker's part of the search's re-check (:func:`_recheck_top`), after its last batch: its own shard's top
    layouts evaluated by the full path, on the caches its batches warmed, while the other workers still run.

    They hold the search's top: a layout among the search's first :data:`RECHECK_TOP` by a ranking has fewer than
    that many above it in its own shard too (the same objective and tie-break), so each round of the search's
    re-check asks for layouts its shard's own re-check asked for, unless a re-evaluated layout moved a shard's
    ranking differently (then the parent evaluates what it still lacks: the outcome is the same either way, only
    where the work is done changes)."""
    known: dict[Plan, Evaluated] = {}
    with _fewer_collections():
        _recheck_top(model, list(_SHARD_RESULTS), cluster, fraction, objective, price, known)
    return known


def _received(batch: tuple[list[tuple[Any, ...]], Counter[str]], plans: list[Plan]) -> list[Evaluated]:
    """A worker's batch of ``plans`` in the parent: its fallbacks added to this process's count, its layouts."""
    from echosim import fast_eval

    fast_eval.FALLBACKS.update(batch[1])
    return [_evaluated(row, p) for row, p in zip(batch[0], plans, strict=True)]


class _ShardWorker:
    """A Ray actor holding one shard of a search (:func:`_shards`): its batches run in the order they are sent,
    in one process, so its groups' cold work is done once (Ray runs one caller's calls of an actor in order)."""

    def __init__(self) -> None:
        _worker_started()

    def evaluate(
        self, model: Any, plans: list[Plan], cluster: Cluster, fraction: float, fast: bool
    ) -> tuple[list[tuple[Any, ...]], Counter[str]]:
        return _worker_batch(model, plans, cluster, fraction, fast)

    def recheck(
        self, model: Any, cluster: Cluster, fraction: float, objective: str, price: float
    ) -> dict[Plan, Evaluated]:
        return _worker_recheck(model, cluster, fraction, objective, price)


def _run_ray(
    model: Any,
    plans: list[Plan],
    cluster: Cluster,
    fraction: float,
    address: str | None,
    fast: bool = False,
    workers: int = 1,
    recheck: _Recheck | None = None,
) -> Iterator[list[Evaluated]]:
    """The batches of ``plans`` evaluated by Ray actors, one per shard (:func:`_shards`): ``workers`` of them, or,
    with ``workers`` 1, one per CPU of the Ray cluster (never more: each takes one CPU). ``recheck``: as
    :func:`_run_local`'s, each actor's after its batches."""
    try:
        import ray
    except ImportError:
        raise SearchError("--executor ray needs Ray: pip install 'echosim[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=address or None, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    # an actor holds its CPU until the search ends: more actors than CPUs would wait for ever
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    count = min(workers, cpus) if workers > 1 else cpus
    shards = [s for s in _shards(plans, count) if s]
    actor = ray.remote(num_cpus=1)(_ShardWorker)
    actors = [actor.remote() for _ in shards]
    batch_of = {
        a.evaluate.remote(model, b, cluster, fraction, fast): b
        for a, shard in zip(actors, shards, strict=True)
        for b in _batches(shard, BATCH)
    }
    refs = list(batch_of)
    rechecks = set()
    if recheck is not None:  # an actor runs one caller's calls in order: after its batches
        rechecks = {a.recheck.remote(model, cluster, fraction, recheck.objective, recheck.price) for a in actors}
        refs += rechecks
    try:
        while refs:
            ready, refs = ray.wait(refs, num_returns=1)
            if ready[0] in rechecks:
                recheck.known.update(ray.get(ready[0]))  # type: ignore[union-attr]
            else:
                yield _received(ray.get(ready[0]), batch_of[ready[0]])
    finally:
        for ref in refs:
            ray.cancel(ref)
        for a in actors:
            ray.kill(a)


# -- the search ------------------------------------------------------------------------------------------


@dataclass
class SearchResult:
    """Every layout of one search, best first, and the counts of each filter."""

    model: str
    cluster: Cluster
    objective: str
    enumeration: Enumeration
    ranked: list[Evaluated]  # simulated layouts that fit, best first
    others: list[Evaluated]  # simulated that do not fit or fail, then rejected before simulation
    simulated: int
    interrupted: bool = False
    price_per_device_hour: float = 1.0
    hint: str = ""  # where no layout fits: the option that would make some fit ("" when none is known)

    @property
    def evaluated(self) -> list[Evaluated]:
        return self.ranked + self.others

    @property
    def best(self) -> Evaluated | None:
        return self.ranked[0] if self.ranked else None

    def counts(self) -> dict[str, Any]:
        e = self.enumeration
        return {
            "combinations": e.combinations,
            "not_applicable": e.not_applicable,
            "duplicates": e.duplicates,
            "pruned": len(e.rejected),
            "pruned_by": dict(sorted(e.removed_by.items())),
            "simulated": self.simulated,
            "fit": len(self.ranked),
            "evaluated": len(self.evaluated),
        }


def objective_key(objective: str, price_per_device_hour: float = 1.0) -> Callable[[Evaluated], float]:
    """Smaller is better: step time, the inverse of throughput, or the price of one sample (or token)."""
    if objective not in OBJECTIVES:
        raise SearchError(f"--objective: unknown {objective!r} (known: {', '.join(OBJECTIVES)})")

    def value(c: Evaluated) -> float:
        step = c.step_time_s or math.inf
        if objective == "step-time":
            return step
        rate = c.tokens_per_s or c.samples_per_s or 0.0
        if objective == "tokens-per-s":
            return -rate
        return c.devices * price_per_device_hour / 3600.0 / rate if rate else math.inf

    def key(c: Evaluated) -> float:
        return _settled(value(c))

    return key


def _settled(x: float) -> float:
    """``x`` to 12 significant digits: two layouts whose steps differ by the rounding of sums taken in another
    order (GPipe and 1F1B on one stage: 1 ulp) tie, and the tie goes to the smaller peak (:func:`_order`)."""
    return float(f"{x:.12g}") if math.isfinite(x) else x


def _order(key: Callable[[Evaluated], float]) -> Callable[[Evaluated], tuple[Any, ...]]:
    """The ranking of fitting layouts: the objective, then the smaller peak memory, then the plan's degrees."""
    return lambda c: (key(c), c.peak_bytes, _plan_key(c.plan))


_DEGREES = ("tp", "pp", "dp", "cp", "cp_comm", "ep", "vpp", "sp", "zero", "offload_optimizer", "micro_batch",
            "recompute", "schedule", "tp_overlap", "embedding_sharding")  # fmt: skip


def _plan_key(p: Plan) -> tuple[Any, ...]:
    return (p.tp, p.pp, p.dp, p.cp, p.cp_comm, p.ep, p.vpp, p.sp, p.zero, p.offload_optimizer, p.micro_batch,
            p.recompute, p.schedule, p.tp_overlap, p.embedding_sharding)  # fmt: skip


def rank(results: Iterable[Evaluated], objective: str, price: float = 1.0) -> tuple[list[Evaluated], list[Evaluated]]:
    """(fitting layouts best first, the rest: not fitting by peak memory, then failed, then rejected)."""
    key = objective_key(objective, price)
    items = list(results)
    ok = sorted((c for c in items if c.ok), key=_order(key))
    rest = [c for c in items if not c.ok]

    def order(c: Evaluated) -> tuple[Any, ...]:
        kind = 0 if c.simulated and c.step_time_s is not None else (1 if c.simulated else 2)
        return (kind, c.peak_bytes if kind == 0 else 0, _plan_key(c.plan))

    return ok, sorted(rest, key=order)


def search(
    model: Any,
    base: Plan,
    cluster: Cluster,
    *,
    space: dict[str, tuple[Any, ...]] | None = None,
    objective: str = "step-time",
    memory_fraction: float = DEFAULT_MEMORY_FRACTION,
    workers: int = 1,
    executor: str = "local",
    ray_address: str | None = None,
    price_per_device_hour: float = 1.0,
    progress: Callable[[int, int], None] | None = None,
    sample: slice | None = None,
    fast: bool = True,
) -> SearchResult:
    """Every layout of ``space`` for ``model`` on ``cluster``, the fitting ones ranked by ``objective``.

    A ``KeyboardInterrupt`` during simulation ends the search early with what was simulated
    (``interrupted=True``). ``sample`` simulates only that slice of the layouts (benchmarks).
    """
    from echosim import plugins
    from echosim.compiler import _backend, resolve_cluster
    from echosim.layout import check_offload, check_precision, host_state

    if not 0 < memory_fraction <= 1:
        raise SearchError(f"--max-memory-fraction must lie in (0, 1], got {memory_fraction:g}")
    if executor not in ("local", "ray"):
        raise SearchError(f"--executor: unknown {executor!r} (known: local, ray)")
    objective_key(objective)  # an unknown objective fails before any work
    registry = plugins.get_registry()
    backend = _backend(cluster.backend, registry)
    cluster = resolve_cluster(cluster, registry, backend)
    check_precision(base, backend)  # a precision the device cannot run fails every layout alike: one error
    offloads = base.offload_optimizer or True in (space or {}).get("offload_optimizer", ())
    check_offload(replace(base, offload_optimizer=offloads), backend)  # so does an offload without a host
    schedules = {name: entry.value for name, entry in registry.schedules.items()}
    facts = ModelFacts.of(model, base)
    base, space = _fixed_batch(facts, base, space or {})
    spec = full_space(facts, base, cluster, schedules, space)
    capacity = backend.memory_bytes()
    # the host memory an offload takes per host depends on the device count and what is offloaded alone, not on the
    # layout: checked once with the optimizer offloaded and once without, each line rejecting the layouts it names
    on_devices = replace(base, tp=1, pp=1, cp=1, dp=cluster.devices)  # world: the devices
    over_host = {off: host_state(facts.params, replace(on_devices, offload_optimizer=off), backend)[1]
                 for off in (False, True) if off or base.offload_params}  # fmt: skip
    with _fewer_collections():
        enum = enumerate_layouts(facts, base, cluster, spec, schedules, capacity, memory_fraction, over_host)
    _check_not_empty(enum, base, cluster, facts)
    plans = enum.to_simulate[sample] if sample is not None else enum.to_simulate  # sample: benchmarks only
    results: list[Evaluated] = []
    interrupted = False
    recheck = _Recheck(objective, price_per_device_hour) if fast else None
    exiting: list[threading.Thread] = []  # workers' processes exiting while this one re-checks and ranks
    runner = (
        _run_ray(model, plans, cluster, memory_fraction, ray_address, fast, workers, recheck)
        if executor == "ray"
        else _run_local(model, plans, cluster, memory_fraction, workers, fast, recheck, exiting)
    )
    try:
        for batch in runner:
            results.extend(batch)
            if progress:
                progress(len(results), len(plans))
    except KeyboardInterrupt:
        interrupted = True
    finally:
        close = getattr(runner, "close", None)
        if close:
            close()
    with _fewer_collections():
        if recheck is not None:
            results = _recheck_top(model, results, cluster, memory_fraction, objective, price_per_device_hour,
                                   recheck.known)  # fmt: skip
        if "recompute" not in (space or {}) and sample is None and not interrupted:
            results += partial_recompute(model, facts, results, cluster, memory_fraction, objective,
                                         price_per_device_hour)  # fmt: skip
        ranked, others = rank(results + enum.rejected, objective, price_per_device_hour)
    for t in exiting:  # the workers have exited when the search returns
        t.join()
    name = model if isinstance(model, str) else getattr(model, "arch", type(model).__name__)
    hint = "" if ranked else _replicated_tables(facts, base)
    return SearchResult(name, cluster, objective, enum, ranked, others, len(results), interrupted,
                        price_per_device_hour, hint)  # fmt: skip


def _fixed_batch(
    facts: ModelFacts, base: Plan, space: dict[str, tuple[Any, ...]]
) -> tuple[Plan, dict[str, tuple[Any, ...]]]:
    """A model whose inputs fix its batch (``Graph.samples``) runs that many samples per call of forward: its one
    micro-batch (as compile takes it), ``--global-batch`` a whole number of calls on every data-parallel rank."""
    if not facts.samples:
        return base, space
    if "mb" in space:
        raise SearchError(
            f"--space mb: the model's inputs fix its batch at {facts.samples} samples a call of forward; "
            "a micro-batch is one call (name a 'batch' dimension for --micro-batch to bind it)"
        )
    if base.global_batch % facts.samples:
        raise SearchError(
            f"--global-batch {base.global_batch} is not a multiple of the {facts.samples} samples the model's "
            "inputs fix for one call of forward"
        )
    return replace(base, micro_batch=facts.samples), {**space, "mb": (facts.samples,)}


#: Top layouts of a search re-evaluated in full (every stage graph built) before they are reported.
RECHECK_TOP = 20

#: Best fitting full-recompute layouts a search tries again recomputing only some layers (:func:`partial_recompute`).
PARTIAL_RECOMPUTE_TOP = 10


def partial_recompute(
    model: Any,
    facts: ModelFacts,
    results: list[Evaluated],
    cluster: Cluster,
    fraction: float,
    objective: str,
    price: float,
) -> list[Evaluated]:
    """The best fitting layouts that fit only by recomputing every layer (neither without recompute nor with selective),
    each with the fewest layers per stage to recompute that still fit (``full:N``, Megatron's block method),
    evaluated by the full path; those that fit.

    A layout's step grows and its saved activations shrink with N (each replayed layer adds one layer's replay and
    drops one layer's activations: tests/test_partial_recompute.py), so the smallest N that fits is that layout's
    best and bisection finds it in log2(layers per stage) compiles. The space's own values stay none, selective and
    full: N is no free dimension, and a search given ``--space recompute=...`` keeps to it."""
    key = objective_key(objective, price)
    seen = {e.plan for e in results}
    fitting = {e.plan for e in results if e.ok}
    per_block = facts.shape.layers_per_block

    def needs_recompute(plan: Plan) -> bool:  # it fits with full recompute, not without it (nor with selective's)
        lighter = (replace(plan, recompute=r) for r in ("none", "selective"))
        return plan.recompute == "full" and not any(p in fitting for p in lighter)

    out = []
    for e in _first([e for e in results if e.ok and needs_recompute(e.plan)], key, PARTIAL_RECOMPUTE_TOP):
        stage = -(-facts.layers // (e.plan.pp * e.plan.vpp))  # repetitions of the block on a stage, at most

        def trial(mode: str, plan: Plan = e.plan) -> Evaluated:
            return _evaluate(model, [replace(plan, recompute=mode)], cluster, fraction, checked=True)[0]

        for best in [t for t in fewest_replayed(stage, per_block, trial, lambda t: t.ok) if t.ok][-1:]:
            if best.plan not in seen:
                seen.add(best.plan)
                out.append(best)
    return out


@dataclass
class _Recheck:
    """What a search's workers need for their part of the re-check (:func:`_worker_recheck`), and the full path's
    evaluations they send back, by plan."""

    objective: str
    price: float
    known: dict[Plan, Evaluated] = field(default_factory=dict)


def _recheck_top(
    model: Any,
    results: list[Evaluated],
    cluster: Cluster,
    fraction: float,
    objective: str,
    price: float,
    known: dict[Plan, Evaluated] | None = None,
) -> list[Evaluated]:
    """The fast path's best layouts evaluated again by the full path, whose figures are reported: a ranking
    whose top changes (never seen; tests/test_fast_eval.py) is re-checked until its top is the full path's.

    ``known``: full-path evaluations already done (by the workers, :func:`_worker_recheck`), read instead of
    evaluated again; what is evaluated here is added to it. A layout's evaluation reads no other layout of its
    batch, so the outcome does not depend on which were known."""
    known = {} if known is None else known
    checked: set[int] = set()
    at = {id(e): i for i, e in enumerate(results)}
    key = objective_key(objective, price)
    for _ in range(4):
        ok = [e for e in results if e.ok]
        top = [e for e in _first(ok, key, RECHECK_TOP) if id(e) not in checked]
        if not top:
            break
        missing = [e.plan for e in top if e.plan not in known]
        if missing:
            known.update(zip(missing, _evaluate(model, missing, cluster, fraction, checked=True), strict=True))
        for old in top:
            new = known[old.plan]
            results[at.pop(id(old))] = new
            checked.add(id(new))
        at = {id(e): i for i, e in enumerate(results)}
    return results


def _first(items: list[Evaluated], key: Callable[[Evaluated], float], n: int) -> list[Evaluated]:
    """``sorted(items, key=_order(key))[:n]``, sorting only the layouts whose objective is
    at most the ``n``-th smallest (the first ``n`` are among them; so are all tied with the ``n``-th): a search's
    re-check reads the first 20 of some 30,000 fitting layouts, once a round."""
    keys = [key(c) for c in items]
    if len(items) > n and not any(k != k for k in keys):  # NaN: no order to cut at, the full sort as before
        cut = heapq.nsmallest(n, keys)[-1]
        items = [c for c, k in zip(items, keys, strict=True) if k <= cut]
    return sorted(items, key=_order(key))[:n]


def _check_not_empty(enum: Enumeration, base: Plan, cluster: Cluster, facts: ModelFacts | None = None) -> None:
    """No layout left to simulate is one line naming the constraint that removed them (and, where memory removed
    layouts of a model whose embedding tables stay replicated, the option that shards them)."""
    if enum.to_simulate:
        return
    if not enum.removed_by:
        raise SearchError(
            f"no layout of the space applies to {cluster.devices} devices (space: {enum.space.as_dict()})"
        )
    batch_only = set(enum.removed_by) == {"global batch divisibility"}
    if batch_only:
        dps = sorted({c.plan.dp for c in enum.rejected})
        mbs = sorted({c.plan.micro_batch for c in enum.rejected})
        raise SearchError(
            f"no layout of {cluster.devices} devices divides the global batch {base.global_batch}: "
            f"micro-batch*dp must divide it (dp in {dps}, micro-batch in {mbs})"
        )
    parts = ", ".join(f"{n} by {what}" for what, n in enum.removed_by.most_common())
    top = enum.removed_by.most_common(1)[0][0]
    example = next(c.reason for c in enum.rejected if _constraint_of(c, top))
    hint = ""
    if facts is not None and "memory lower bound" in parts and (tables := _replicated_tables(facts, base)):
        hint = f"; {tables}"
    raise SearchError(f"every layout was removed before simulation ({parts}); e.g. {example}{hint}")


def _replicated_tables(facts: ModelFacts, base: Plan) -> str:
    """Where memory rules layouts out: the pooled embedding tables the plan leaves replicated, and the option
    that shards them ("" when there are none, or they are sharded)."""
    if not facts.tables[0] or base.embedding_sharding != "none":
        return ""
    return f"its {facts.tables[0]:,} embedding-table parameters are replicated: --embedding-sharding auto shards them"


def _constraint_of(c: Evaluated, constraint: str) -> bool:
    if constraint == "memory lower bound":
        return c.reason.startswith("memory lower bound")
    if constraint == "global batch divisibility":
        return c.reason.startswith("global batch")
    if constraint == "host memory":
        from echosim.layout import HOST_OVERFLOW

        return c.reason.startswith(HOST_OVERFLOW)
    return _constraint(c.reason) == constraint


def why_better(best: Evaluated, runner_up: Evaluated) -> str:
    """One line: the step-time terms where the best layout gains most over the runner-up."""
    diffs = {
        k: runner_up.breakdown.get(k, 0.0) - best.breakdown.get(k, 0.0)
        for k in set(best.breakdown) | set(runner_up.breakdown)
    }
    gains = sorted(((d, k) for k, d in diffs.items() if abs(d) > 1e-9), key=lambda dk: (-abs(dk[0]), dk[1]))[:3]
    changed = [
        f"{k} {getattr(best.plan, k)} vs {getattr(runner_up.plan, k)}"
        for k in _DEGREES
        if getattr(best.plan, k) != getattr(runner_up.plan, k)
    ]
    delta = (runner_up.step_time_s or 0.0) - (best.step_time_s or 0.0)
    terms = ", ".join(f"{k} {'-' if d > 0 else '+'}{_ms(abs(d))}" for d, k in gains) or "no single term"
    return f"best is {_ms(delta)} faster per step than the runner-up ({'; '.join(changed)}): {terms}"


def _ms(seconds: float) -> str:
    """Milliseconds to one decimal, or to two significant digits below 1 ms (a small model's gap is not '0.0 ms')."""
    ms = seconds * 1e3
    return f"{ms:.1f} ms" if ms >= 1 or ms == 0 else f"{ms:.2g} ms"


__all__ = [
    "OBJECTIVES",
    "SPACE_KEYS",
    "Evaluated",
    "ModelFacts",
    "SearchError",
    "SearchResult",
    "canonical",
    "enumerate_layouts",
    "evaluate",
    "memory_lower_bound",
    "parse_space",
    "rank",
    "search",
    "why_better",
]
