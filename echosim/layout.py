"""The one layout check: can this plan run this model on this cluster?

Two moments, one module. :func:`check_plan` needs only the plan, the cluster and the
registered schedules, and runs before anything is captured, so an impossible layout costs
nothing. :func:`check_model` reads what the layout depends on from the captured IR
(:class:`ModelShape`: attention heads, repeated layers, experts, sequence, the module
paths the tensor-parallel plan matches), so every frontend (zoo, ``hf:``, ONNX, ``.py``)
is held to the same rules with the same messages. Each message names the constraint the
way users think of it ("tp=3 does not divide attention heads (16)").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from echosim.frameworks import get_framework, weights_16bit_dtype
from echosim.frontend.messages import Note
from echosim.ir.graph import Graph
from echosim.ir.names import is_recurrent_step
from echosim.ir.ops import AttentionAttrs, ElementwiseAttrs, MatmulAttrs, OpKind, Phase
from echosim.ir.types import DType
from echosim.passes.base import LayoutError
from echosim.passes.context_parallel import (
    NO_TORCH_A2A,
    SEQUENCE_KERNELS,
    check_hierarchy,
    check_sequence,
    window_refusal,
)
from echosim.passes.memory import MOMENTS, given_dtypes
from echosim.passes.pipeline import LAYOUT_PREFIX, layout_counts
from echosim.passes.recompute import (
    RecomputeError,
    partial,
    policy_named,
    replay_every,
    replay_group,
    replay_layers,
)
from echosim.passes.tensor_parallel import DEFAULT_TP_PLAN, linear_styles
from echosim.plan import (
    CP_COMMS,
    DTYPES,
    FSDP_REDUCE_DTYPES,
    GRAD_DTYPES,
    HEAD_PARALLEL_COMMS,
    MOE_DISPATCHERS,
    Cluster,
    Plan,
    PlanError,
)
from echosim.timeline.placement import Degrees, axis_placements

ATTENTIONS = ("flash", "math")
#: Bounds that keep one compile finite in time and memory; each refusal names its limit.
#: Micro-batches per step: the schedule is composed block by block (~0.1 ms each), so 10^5
#: micro-batches take ~15 s; published runs use at most a few thousand (Megatron-LM's 1,536
#: sequences on 8 replicas: 192).
MAX_MICROBATCHES = 100_000
#: Devices: placement and lowering are closed-form in the device count, and 2^24 (16.8 M) is
#: far above any machine built.
MAX_DEVICES = 2**24
#: Tokens (or samples x sequence) of one micro-batch: the capture builds tensors of this many
#: rows times the hidden size on the meta device, whose sizes are 64-bit.
MAX_TOKENS_PER_MICROBATCH = 2**34
#: Any one degree, batch or sequence length.
MAX_COUNT = 2**40
PP_BALANCES = ("uniform", "cost")
ZERO_STAGES = (0, 1, 2, 3)


def check_pp_balance(plan: Plan) -> None:
    """``--pp-balance``: uniform, cost, or a Megatron-Core layout with one stage per virtual stage."""
    if plan.pp_balance in PP_BALANCES:
        return
    if not plan.pp_balance.startswith(LAYOUT_PREFIX):
        known = ", ".join((*PP_BALANCES, f"{LAYOUT_PREFIX}STRING"))
        raise PlanError(f"unknown --pp-balance {plan.pp_balance!r} (known: {known})")
    try:
        stages = len(layout_counts(plan.pp_balance.removeprefix(LAYOUT_PREFIX)))
    except LayoutError as exc:
        raise PlanError(str(exc)) from None
    if stages != plan.pp * plan.vpp:
        raise PlanError(f"--pp-balance layout has {stages} stages, not pp x vpp = {plan.pp}*{plan.vpp}")


def check_precision(plan: Plan, backend: Any) -> None:
    """A block-scaled format runs only where the device's tensor cores take it (``formats()`` of the
    backend; a backend without it takes none): nvfp4 on an H100 is refused, never costed at another rate."""
    refusal = format_refusal(plan.dtype, backend)
    if refusal:
        raise PlanError(refusal)


def check_offload(plan: Plan, backend: Any) -> None:
    """An offloaded optimizer or offloaded weights run only where the backend's device has host figures (a GPU's
    host link and host memory): a TPU, a CPU or a part without them is refused, never costed as if they stayed."""
    if not (plan.offload_optimizer or plan.offload_params):
        return
    from echosim.backends.base import unwrapped
    from echosim.backends.compute import offload_refusal

    device = getattr(unwrapped(backend), "device", None)
    why = offload_refusal(device) if device is not None and hasattr(device, "host_link_GBps") else "not a GPU backend"
    if why:
        flag = "--offload-optimizer" if plan.offload_optimizer else "--offload-params"
        raise PlanError(f"{flag}: backend {getattr(backend, 'name', backend)!r}: {why}")


#: Bytes a parameter an offloaded optimizer keeps in host memory: the fp32 master weight, Adam's two fp32 moments and
#: the fp32 gradient the step reads (DeepSpeed's single_partition_of_fp32_groups and their .grad; Megatron-Core's
#: hybrid device optimizer's fp32 copies of its shard and of main_grad).
HOST_STATE_BYTES_PER_PARAM = 16
#: How :func:`host_state`'s warning begins: a layout whose hosts cannot hold its offloaded state (search and explain
#: read it off a report's warnings)
HOST_OVERFLOW = "offload: each host needs"


def host_state(params: int, plan: Plan, backend: Any) -> tuple[str, str]:
    """How much host memory the offloads take on each host (a note), and a warning where that is more than the
    device's reference host holds (``DeviceSpec.host_memory_GB``): every parameter is stepped (and, under ZeRO-3,
    kept) by one rank, so the host of ``ranks`` of the job's ranks holds their share of the model's offloaded state:
    the optimizer's fp32 state and the 16-bit weight shards. The device memory's verdict does not change: a host
    with more memory runs the layout ("": within it, or no figure)."""
    from echosim.backends.base import unwrapped

    device = getattr(unwrapped(backend), "device", None)
    per_host = getattr(device, "gpus_per_host", None) or getattr(device, "devices_per_node", 1)
    ranks = min(plan.world, per_host)
    parts = {"optimizer state": HOST_STATE_BYTES_PER_PARAM if plan.offload_optimizer else 0,
             "weight shards": (4 if plan.dtype == "fp32" else 2) if plan.offload_params else 0}  # fmt: skip
    per_param = sum(parts.values())
    need = params * per_param * ranks / plan.world
    what = " and ".join(k for k, v in parts.items() if v)
    note = (f"offload: each host keeps about {need / 2**30:,.1f} GiB of {what} in its memory ({ranks} rank"
            f"{'s' if ranks > 1 else ''} x {per_param} B per parameter of its shard)")  # fmt: skip
    capacity = getattr(device, "host_memory_GB", None)
    if not capacity or need <= capacity * 1e9:
        return note, ""
    name = getattr(device, "name", "this")
    return note, (
        f"{HOST_OVERFLOW} about {need / 2**30:,.0f} GiB of {what}, more than the "
        f"{capacity * 1e9 / 2**30:,.0f} GiB ({capacity / 1000:.3g} TB) of system memory of the {name} backend's "
        "reference host: spread the state over more hosts, or run on hosts with more memory"
    )


def check_fp8_attention(plan: Plan, backend: str) -> None:
    """FP8 attention is Transformer Engine's ``fp8_dot_product_attention``: the fused kernel, inside an FP8
    recipe's autocast, priced only on the devices cuDNN's FP8 / BF16 benchmark measured
    (:mod:`echosim.backends.fp8_attention`)."""
    from echosim.backends.fp8_attention import refusal

    if not plan.fp8_attention:
        return
    if plan.dtype not in ("fp8", "mxfp8", "nvfp4"):
        raise PlanError(
            f"--fp8-attention needs an FP8 recipe (--dtype fp8, mxfp8 or nvfp4), got --dtype {plan.dtype}: "
            "Transformer Engine runs attention in FP8 only inside its FP8 autocast"
        )
    if plan.attention != "flash":
        raise PlanError("--fp8-attention needs the fused attention kernel (--attention flash)")
    if why := refusal(backend):
        raise PlanError(why)


def check_fused_mlp(plan: Plan, backend: str) -> None:
    """The fused grouped expert MLP is cuDNN's CuTe DSL block-scaled grouped GEMMs for sm_100
    (:mod:`echosim.passes.fused_mlp`): Blackwell GPUs under an MXFP8 or NVFP4 recipe."""
    from echosim.backends.devices import DEVICES

    if not plan.moe_fused_mlp:
        return
    if plan.dtype not in ("mxfp8", "nvfp4"):
        raise PlanError(
            f"--moe-fused-mlp needs a block-scaled recipe (--dtype mxfp8 or nvfp4), got --dtype {plan.dtype}: "
            "the fused grouped MLP is cuDNN's block-scaled grouped GEMM"
        )
    spec = DEVICES.get(backend)
    if spec is None or spec.arch != "blackwell":
        raise PlanError(f"--moe-fused-mlp runs on Blackwell GPUs (sm_100) only, not on backend {backend!r}")


def fp8_attention_notes(plan: Plan, backend: str, graph: Graph) -> list[str]:
    """What the report says about attention shapes whose FP8 speed-up was not measured (priced at BF16)."""
    from echosim.backends.fp8_attention import unmeasured

    if not plan.fp8_attention:
        return []

    def notes() -> list[str]:
        shapes = {n.attrs: None for n in graph if n.phase is Phase.FORWARD and isinstance(n.attrs, AttentionAttrs)}
        return [Note(line) for line in unmeasured(backend, list(shapes))]

    # once per captured graph and backend: a search prepares thousands of layouts of one graph
    return list(graph.derived(("fp8-attention-notes", backend), notes))


def format_refusal(dtype: str, backend: Any) -> str:
    """Why ``backend`` cannot run ``dtype``, a block-scaled format its tensor cores lack ("" where it can)."""
    if dtype not in ("mxfp8", "nvfp4"):
        return ""
    formats = backend.formats() if callable(getattr(backend, "formats", None)) else ()
    if dtype in formats:
        return ""
    has = f"it runs {', '.join(formats)}" if formats else "it has no block-scaled (MX/NV) tensor-core formats"
    return f"--dtype {dtype}: backend '{backend.name}' cannot run {dtype} ({has})"


def check_experts(plan: Plan) -> None:
    """Where the routed experts live: Megatron-Core's MoE parallel folding.

    Dense layers order a stage's ranks tp-cp-dp, expert layers etp-ep-edp ("the EPxTP group in MoE is
    a sub-group of DPxCPxTP in Attention", "MoE Parallel Folding", megatron/core/transformer/moe/
    README.md, Megatron-LM commit 022bcb5), so ``etp * ep`` must divide ``tp * cp * dp``; with
    ``etp = tp`` (Megatron's default for --expert-tensor-parallel-size) that is ep dividing cp * dp.
    echosim shards experts over the tensor-parallel ranks (etp = tp) or not at all (etp = 1, the
    Megatron-Bridge MoE recipes' setting). Experts without their own tensor parallelism dispatch each
    rank's own tokens, which needs sequence parallelism under tp > 1 (Megatron-Core refuses MoE with
    tensor parallelism without it: "When using MoE and tensor parallelism, sequence parallelism must
    be used", megatron/training/arguments.py).
    """
    etp = plan.expert_tp
    if etp not in (1, plan.tp):
        raise PlanError(
            f"--etp {etp}: echosim shards routed experts over all tensor-parallel ranks (etp = tp = {plan.tp}) "
            "or over none (etp = 1)"
        )
    stage = plan.tp * plan.cp * plan.dp
    if stage % (etp * plan.ep):
        fold = f"ep={plan.ep}" if etp == 1 else f"etp*ep = {etp}*{plan.ep} = {etp * plan.ep}"
        raise PlanError(
            f"{fold} does not divide tp*cp*dp = {stage} (expert layers lay etp x ep x "
            "expert-data-parallel over a stage's tp x cp x dp ranks)"
        )
    if etp != plan.tp and not plan.sp:
        raise PlanError(
            f"--etp {etp} with tp={plan.tp} needs sequence parallelism (--sp): each tensor-parallel rank "
            "dispatches its own tokens to the experts"
        )


def check_ep_overlap(plan: Plan) -> None:
    """``--moe-ep-overlap`` (Megatron's --overlap-moe-expert-parallel-comm) under its documented hard
    requirements: ep > 1, and virtual pipeline stages when pp > 1, on the 1F1B schedules it extends
    (docs/user-guide/features/moe_a2a_overlap.md, Megatron-LM commit fc81b20)."""
    if not plan.moe_ep_overlap:
        return
    if plan.ep == 1:
        raise PlanError("--moe-ep-overlap needs expert parallelism (ep > 1): it hides the EP all-to-alls")
    if plan.schedule == "dualpipe":  # its forward-backward pairs overlap the all-to-alls anyway
        return
    if plan.pp > 1 and plan.vpp == 1:
        raise PlanError(f"--moe-ep-overlap with pp={plan.pp} needs virtual pipeline stages (--vpp > 1)")
    if plan.schedule not in ("1f1b", "interleaved"):
        raise PlanError(f"--moe-ep-overlap runs on the 1f1b / interleaved schedules, not {plan.schedule!r}")


def interleaved_names(schedules: dict[str, Any]) -> list[str]:
    """The schedules (by name) that run several virtual stages per rank: :func:`check_plan`'s ``interleaved``."""
    return [name for name, s in schedules.items() if getattr(s, "interleaved", False)]


def resolve_cp_a2a(plan: Plan, devices_per_node: int) -> Plan:
    """``--cp-comm a2a+p2p`` without ``--cp-a2a``: all-to-all groups of the largest proper divisor of cp whose
    ``tp x cp_a2a`` neighbouring ranks stay inside a node, as NVIDIA's performance guide puts the all-to-alls on
    NVLink and the ring on the network (Megatron-Bridge docs, performance-guide, "a2a+p2p"); the smallest where
    none does. Megatron-LM itself asserts the sizes are given. Any other plan is returned as it is."""
    if plan.cp_comm != "a2a+p2p" or plan.cp_a2a:
        return plan
    a2a = default_cp_a2a(plan.cp, plan.tp, devices_per_node)
    return replace(plan, cp_a2a=a2a) if a2a else plan


def default_cp_a2a(cp: int, tp: int, devices_per_node: int) -> int:
    """:func:`resolve_cp_a2a`'s group size for ``cp`` ranks ``tp`` apart; 0 where cp has no proper divisor.
    Divisors come in pairs around the square root: found in sqrt(cp) steps, so an absurd cp ends in its error."""
    small = [a for a in range(2, math.isqrt(cp) + 1) if cp % a == 0]
    proper = sorted({*small, *(cp // a for a in small)})
    inside = [a for a in proper if devices_per_node % (tp * a) == 0]
    return max(inside) if inside else min(proper, default=0)


def check_plan(plan: Plan, cluster: Cluster, schedules: Iterable[str], interleaved: Iterable[str] = ()) -> None:
    """Rules of the plan and the cluster alone; ``interleaved`` names the schedules that take ``vpp > 1``."""
    for name in ("tp", "pp", "dp", "micro_batch", "cp", "ep", "vpp"):
        if getattr(plan, name) < 1:
            raise PlanError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(plan, name)}")
    for name in ("global_batch", "seq_len"):  # 0: derived (one micro-batch per rank; the model's sequence)
        if getattr(plan, name) < 0:
            raise PlanError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(plan, name)}")
    if plan.etp < 0:
        raise PlanError(f"--etp must be at least 1, got {plan.etp}")
    for name in ("tp", "pp", "dp", "micro_batch", "cp", "ep", "etp", "vpp", "global_batch", "seq_len"):
        if getattr(plan, name) > MAX_COUNT:
            raise PlanError(f"--{name.replace('_', '-')} {getattr(plan, name)} exceeds the limit of {MAX_COUNT} (2^40)")
    if plan.micro_batch * max(plan.seq_len, 1) > MAX_TOKENS_PER_MICROBATCH:
        raise PlanError(
            f"micro-batch {plan.micro_batch} x sequence {plan.seq_len} = {plan.micro_batch * plan.seq_len} tokens "
            f"exceeds the limit of {MAX_TOKENS_PER_MICROBATCH} (2^34) per micro-batch"
        )
    if cluster.devices > MAX_DEVICES:
        raise PlanError(f"--devices {cluster.devices} exceeds the limit of {MAX_DEVICES} (2^24)")
    get_framework(plan.framework)  # an unknown name is one line naming the known ones
    if cluster.devices < 1:
        raise PlanError(f"--devices must be positive, got {cluster.devices}")
    if cluster.devices_per_node < 1:
        raise PlanError(f"--devices-per-node must be positive, got {cluster.devices_per_node}")
    if cluster.devices > cluster.devices_per_node and cluster.devices % cluster.devices_per_node:
        raise PlanError(f"devices={cluster.devices} is not a whole number of nodes of {cluster.devices_per_node}")
    if plan.world != cluster.devices:
        shown = f"tp*pp*dp{'*cp' if plan.cp > 1 else ''}"
        factors = f"{plan.tp}*{plan.pp}*{plan.dp}" + (f"*{plan.cp}" if plan.cp > 1 else "")
        raise PlanError(f"{shown} = {factors} = {plan.world} does not equal devices={cluster.devices}")
    check_experts(plan)
    if plan.zero not in ZERO_STAGES:
        raise PlanError(f"unknown ZeRO stage {plan.zero} (known: 0, 1, 2, 3)")
    if plan.sp and plan.tp == 1:
        raise PlanError("sequence parallelism needs tp > 1")
    entry = schedules.get(plan.schedule) if isinstance(schedules, Mapping) else None
    names = sorted(schedules)
    if plan.schedule not in names:
        raise PlanError(f"unknown schedule {plan.schedule!r} (known: {', '.join(names)})")
    if plan.vpp > 1 and plan.pp == 1:
        raise PlanError(f"vpp={plan.vpp} needs pipeline parallelism (pp > 1): virtual stages interleave pipeline ranks")
    if plan.vpp > 1 and plan.schedule not in set(interleaved):
        raise PlanError(f"vpp={plan.vpp} needs the interleaved 1F1B schedule, not {plan.schedule!r}")
    unfit = getattr(entry, "unfit", None)  # a schedule's own shape rules (DualPipe: even pp, 2 pp micro-batches)
    if unfit is not None and (problem := unfit(plan.pp, plan.microbatches, plan.vpp)):
        raise PlanError(problem)
    if plan.vpp > 1 and plan.microbatches % plan.pp:
        raise PlanError(
            f"the interleaved schedule needs micro-batches ({plan.microbatches}) to be a multiple of pp={plan.pp}"
        )
    if plan.global_batch and plan.global_batch % (plan.micro_batch * plan.dp):
        raise PlanError(
            f"global batch {plan.global_batch} is not a multiple of micro-batch*dp = {plan.micro_batch}*{plan.dp}"
        )
    if plan.microbatches > MAX_MICROBATCHES:
        raise PlanError(
            f"{plan.microbatches} micro-batches per step (global batch {plan.batch} / (micro-batch "
            f"{plan.micro_batch} x dp {plan.dp})) exceeds the limit of {MAX_MICROBATCHES}: "
            "use a larger --micro-batch or more data parallelism"
        )
    for what, value, known in (
        ("dtype", plan.dtype, DTYPES),
        ("attention", plan.attention, ATTENTIONS),
        ("--cp-comm", plan.cp_comm, CP_COMMS),
        ("--moe-dispatcher", plan.moe_dispatcher, MOE_DISPATCHERS),
    ):
        if value not in known:
            raise PlanError(f"unknown {what} {value!r} (known: {', '.join(known)})")
    check_pp_balance(plan)
    try:
        policy_named(plan.recompute)
    except RecomputeError as exc:
        raise PlanError(str(exc)) from None
    _check_optimizer_dtypes(plan)
    _check_fsdp_reduce(plan)
    _check_grad_dtype(plan)
    if plan.offload_optimizer and plan.zero < 1:
        raise PlanError(
            "--offload-optimizer steps each rank's shard of a ZeRO / distributed optimizer on its host: give --zero 1 "
            "or higher (DeepSpeed's offload_optimizer is a zero_optimization setting; Megatron-Core's "
            "--optimizer-cpu-offload runs inside --use-distributed-optimizer)"
        )
    if plan.offload_overlap and not plan.offload_optimizer:
        raise PlanError(
            "--offload-overlap pipelines an offloaded optimizer's copies and step: give --offload-optimizer"
        )
    if plan.offload_params and plan.zero != 3:
        raise PlanError(
            "--offload-params keeps ZeRO-3 / FSDP's weight shards in host memory: give --zero 3 (DeepSpeed's "
            "offload_param is a stage-3 setting)"
        )
    if plan.offload_layers and (partial(plan.recompute) or replay_group(plan.recompute)):
        what = "checkpoints chunks of" if replay_group(plan.recompute) else "recomputes only some of"
        raise PlanError(
            f"--recompute {plan.recompute} with --offload-layers {plan.offload_layers}: offloading the activations "
            f"of a stage that {what} its layers is not modelled"
        )
    if plan.cp_a2a and plan.cp_comm != "a2a+p2p":
        raise PlanError(
            f"--cp-a2a {plan.cp_a2a} sizes hierarchical context parallelism's groups: give --cp-comm a2a+p2p"
        )
    if plan.cp > 1 and plan.cp_comm == "a2a+p2p":
        try:
            check_hierarchy(plan.cp, plan.cp_a2a)
        except LayoutError as exc:
            raise PlanError(str(exc)) from None
    try:  # every axis's groups must land on nodes the same way (Megatron rank order)
        degrees = Degrees(plan.tp, plan.pp, plan.dp, plan.cp, plan.ep, plan.etp, plan.cp_a2a)
        axis_placements(degrees, cluster.devices_per_node)
    except ValueError as exc:
        raise PlanError(
            f"{exc}: with tp={plan.tp}, pp={plan.pp}, dp={plan.dp} on nodes of {cluster.devices_per_node}, "
            "choose degrees whose groups fill whole nodes"
        ) from None
    if not math.isfinite(plan.moe_capacity_factor) or not math.isfinite(plan.moe_imbalance):
        raise PlanError("--moe-capacity-factor and --moe-imbalance must be finite numbers")
    if plan.splash_blocks and (len(plan.splash_blocks) != 6 or min(plan.splash_blocks) < 1):
        raise PlanError(
            f"--splash-blocks takes six sizes >= 1 (q, kv of the forward, dkv and dq kernels), got {plan.splash_blocks}"
        )
    if plan.moe_capacity_factor < 0:
        raise PlanError(f"--moe-capacity-factor must be >= 0 (0 = dropless), got {plan.moe_capacity_factor:g}")
    if plan.moe_pad_to_capacity and not plan.moe_capacity_factor:
        raise PlanError("padding experts to capacity needs --moe-capacity-factor > 0 (Megatron-Core's rule)")
    if plan.ep == 1 and plan.moe_imbalance != 1.0:
        raise PlanError(
            f"--moe-imbalance {plan.moe_imbalance:g} needs expert parallelism (ep > 1): it is the busiest "
            "expert-parallel rank's load over the mean"
        )
    if plan.ep > 1 and not 1.0 <= plan.moe_imbalance <= plan.ep:
        raise PlanError(
            f"--moe-imbalance {plan.moe_imbalance:g} must lie between 1 (balanced) and ep={plan.ep} "
            "(every token on one rank)"
        )
    check_ep_overlap(plan)
    groups, per_token = plan.moe_router_groups, plan.moe_router_group_topk
    if groups < 0 or per_token < 0 or bool(groups) != bool(per_token) or per_token > groups:
        raise PlanError(
            f"--moe-router-groups {groups} --moe-router-group-topk {per_token}: give both, with "
            "1 <= group-topk <= groups (DeepSeek-V3: 8 and 4)"
        )


@dataclass(frozen=True)
class ModelShape:
    """What a layout depends on, read from a captured (unsharded, forward) IR graph."""

    name: str
    heads: tuple[tuple[int, int], ...]  # distinct (query heads, key/value heads) of its attention ops
    layers: int | None  # repeats of the repeated block; None when no block repeats
    seq_len: int  # the first per-sample input's last dimension, or its first where the last is the batch
    tokens: bool  # that input is integer token ids: a sequence model (else images, features: samples)
    sequence_kernels: bool  # a layer runs a scan along the tokens (Mamba, RWKV, the gated delta rule)
    products: bool  # a product of two activations (attention written out: BLOOM, MiniMax's linear attention)
    routed_experts: tuple[int, ...]  # experts per MoE layer built from echosim's MoE ops (dispatch/combine)
    batched_experts: bool  # 3-D expert weights without a recognised dispatch (ONNX, unrecognised hf: layers)
    tp_targets: int  # matmuls and embeddings the tensor-parallel plan matches
    untargeted_experts: tuple[str, ...]  # scopes of batched expert matmuls no tensor-parallel rule matches
    # scopes of the linears no tensor-parallel rule matches and that do at least as many FLOPs as the smallest
    # column- or row-parallel one (not a router, a low-rank down-projection or a class-token head); all where none is
    untargeted_linears: tuple[str, ...] = ()
    untargeted_linear_count: int = 0  # the model's, counting every repetition of a folded block
    outside_layers: int = 0  # layers the fold left as they are (DeepSeek-V3's dense first ones)
    layers_per_block: int = 1  # layers one repetition of the block holds (Graph.block_layers: Gemma 3's six)
    windowed: str = ""  # the scope of its first sliding-window attention ("": none)
    recurrent: str = ""  # the scope of its first recurrent layer (LSTM, GRU: one time step after another; "": none)

    @property
    def mixes_tokens(self) -> bool:
        """Its tokens meet by attention (one op or written out) or a scan: what context parallelism splits."""
        return bool(self.heads or self.sequence_kernels or self.products)

    @classmethod
    def of(cls, graph: Graph, micro_batch: int = 0) -> ModelShape:
        """``micro_batch``: the batch the graph was captured with, to tell a time-major input's dimensions apart."""
        heads: dict[tuple[int, int], None] = {}
        routed = scans = products = False
        windowed = recurrent = ""
        experts: dict[int, None] = {}
        untargeted: dict[str, None] = {}
        targets = 0
        # linears but the vocabulary's: (a rule matches, FLOPs, copies in the model: a folded block's repeats)
        linears: dict[str, tuple[bool, int, int]] = {}
        styles = linear_styles(graph, DEFAULT_TP_PLAN)
        for n in graph:
            if n.phase is not Phase.FORWARD:
                continue
            if isinstance(n.attrs, AttentionAttrs):
                heads[(n.attrs.heads, n.attrs.kv_heads)] = None
                windowed = windowed or (n.scope if n.attrs.window else "")
            elif isinstance(n.attrs, ElementwiseAttrs) and n.attrs.fn == "moe_dispatch":
                routed = True
            elif isinstance(n.attrs, ElementwiseAttrs) and n.attrs.fn in SEQUENCE_KERNELS:
                scans = True
            recurrent = recurrent or (n.scope or n.name if is_recurrent_step(n.name) else "")
            if n.op not in (OpKind.MATMUL, OpKind.EMBEDDING):
                continue
            if n.op is OpKind.MATMUL and len(n.inputs) > 1:
                products |= all(graph[i].op not in (OpKind.PARAMETER, OpKind.INPUT) for i in n.inputs[:2])
            style = styles.get(n.id, "")
            targets += bool(style)
            if isinstance(n.attrs, MatmulAttrs) and len(n.inputs) > 1:
                w = graph[n.inputs[1]]
                if w.op is OpKind.PARAMETER and len(w.out.shape) == 3:
                    experts[w.out.shape[0]] = None
                    if n.attrs.batch > 1 and not style:
                        untargeted[n.scope] = None
                elif w.op is OpKind.PARAMETER and len(w.out.shape) == 2 and style != "vocab":
                    linears[n.scope or n.name] = (bool(style), n.attrs.flops, graph.multiplicity(n))
        # where no linear matches (a Mamba model: only its vocabulary is split), every one of them runs whole
        smallest = min((flops for split, flops, _ in linears.values() if split), default=0)
        whole = {scope: k for scope, (split, flops, k) in linears.items() if not split and flops >= smallest}
        first = graph[graph.inputs[0]].out if graph.inputs else None
        ids = first.shape if first is not None else (1,)
        seq = ids[-1] if ids else 1
        if len(ids) == 2 and micro_batch and ids[-1] == micro_batch != ids[0]:
            seq = ids[0]  # time-major ids, (sequence, batch): GNMT as DeepLearningExamples feeds it
        return cls(
            name=graph.name,
            heads=tuple(heads),
            layers=next(iter(graph.repeats.values()), None),
            seq_len=seq,
            tokens=first is not None and first.dtype in (DType.INT64, DType.INT32) and len(ids) == 2,
            sequence_kernels=scans,
            products=products,
            routed_experts=tuple(experts) if routed else (),
            batched_experts=bool(experts) and not routed,
            tp_targets=targets,
            untargeted_experts=tuple(sorted(untargeted)),
            untargeted_linears=tuple(whole),
            untargeted_linear_count=sum(whole.values()),
            outside_layers=graph.unfolded_layers(),
            layers_per_block=max((graph.layers_per_block(p) for p in graph.repeats), default=1),
            windowed=windowed,
            recurrent=recurrent,
        )


def check_model(plan: Plan, shape: ModelShape) -> list[str]:
    """Rules that need the model; returns what the report should say about the tensor-parallel plan."""
    for heads, kv_heads in shape.heads:
        if heads % plan.tp:
            raise PlanError(f"tp={plan.tp} does not divide attention heads ({heads})")
        if kv_heads % plan.tp:
            raise PlanError(f"tp={plan.tp} does not divide key/value heads ({kv_heads})")
    if shape.layers is not None:
        # a pipeline rank takes at least one repeated layer, a virtual stage one or the embedding or the loss;
        # the layers outside the block go where the split puts them (passes/pipeline.py decoder_counts)
        what = "repeated layers" if shape.outside_layers else "layers"
        outside = f", besides {shape.outside_layers} outside the repeated block" if shape.outside_layers else ""
        if plan.pp > shape.layers:
            raise PlanError(f"pp={plan.pp} exceeds the number of {what} ({shape.layers}{outside})")
        if plan.pp * plan.vpp > shape.layers + 2:
            raise PlanError(
                f"pp*vpp={plan.pp * plan.vpp} exceeds the number of {what} ({shape.layers}{outside}) plus the "
                "embedding and the loss stages (2)"
            )
    notes = _replay_notes(plan, shape)
    tp_messages = _tp_messages(plan, shape)  # a model no tensor-parallel rule matches is refused first
    seq = shape.seq_len
    if plan.cp > 1 and shape.recurrent:  # the reason even where nothing else could be split
        raise PlanError(
            f"cp={plan.cp}: context parallelism gives each rank a part of the sequence; {shape.name}'s recurrent "
            f"layer at {shape.recurrent} runs the sequence one time step after another, so no rank could start its "
            "part before the ranks ahead had finished theirs"
        )
    if plan.cp > 1 and not (shape.tokens and shape.mixes_tokens):
        what = (
            "none (no attention, written out or as one op, and no scan)"
            if not shape.mixes_tokens
            else f"{'a scan' if shape.sequence_kernels else 'attention'}, but its input is not a sequence of token ids"
        )
        raise PlanError(
            f"cp={plan.cp}: context parallelism splits scaled-dot-product attention or a scan (Mamba, the gated "
            f"delta rule) over a token sequence; {shape.name} has {what}"
        )
    if plan.cp > 1:
        try:
            check_sequence(plan.cp, seq, plan.cp_balance)
        except LayoutError as exc:
            raise PlanError(str(exc)) from None
        torch = bool(get_framework(plan.framework).cp_torch)
        if torch and plan.cp_comm in HEAD_PARALLEL_COMMS:
            raise PlanError(NO_TORCH_A2A)
        if shape.windowed and (refusal := window_refusal(plan.cp, plan.cp_comm, torch, shape.windowed)):
            raise PlanError(refusal)
        grouped = {"a2a": ("cp", plan.cp), "a2a+p2p": ("cp_a2a", plan.cp_a2a)}.get(plan.cp_comm)
        for heads, kv_heads in shape.heads if grouped else ():
            name, size = grouped  # type: ignore[misc]
            split = plan.tp * size
            if heads % split or kv_heads % split:
                raise PlanError(
                    f"--cp-comm {plan.cp_comm}: tp*{name}={split} does not divide the attention heads ({heads}) and "
                    f"key/value heads ({kv_heads}): each rank of an all-to-all group attends whole heads"
                )
    if plan.sp and (seq // plan.cp) % plan.tp:
        raise PlanError(f"sequence parallelism: tp={plan.tp} does not divide the {seq // plan.cp} tokens per rank")
    if plan.ep > 1 and not shape.routed_experts:
        if shape.batched_experts:
            raise PlanError(
                f"ep={plan.ep}: the experts of {shape.name} are batched matmuls without a recognised dispatch "
                "and combine (echosim.frontend.moe_routing), so expert parallelism cannot split them"
            )
        raise PlanError(f"ep={plan.ep} needs a mixture-of-experts model ({shape.name} has no routed experts)")
    if plan.moe_capacity_factor and not shape.routed_experts and not shape.batched_experts:
        raise PlanError(
            f"--moe-capacity-factor {plan.moe_capacity_factor:g} needs a mixture-of-experts model "
            f"({shape.name} has no routed experts)"
        )
    for experts in shape.routed_experts:
        if experts % plan.ep:
            raise PlanError(f"ep={plan.ep} does not divide experts {experts}")
    if not shape.tokens and plan.micro_batch == 1 and plan.microbatches > 1:
        # the default micro-batch of 1 is a language model's; a CNN's or DLRM's step at one sample a micro-batch
        # is thousands of tiny kernels, a throughput nobody runs (the search tries the whole share: full_space)
        notes.append(
            Note(
                f"micro-batch 1 with {plan.microbatches:,} accumulation steps: models without token sequences usually "
                f"run each device's whole batch at once (--micro-batch {plan.microbatches})"
            )
        )
    return notes + tp_messages


T = TypeVar("T")


def fewest_replayed(repetitions: int, per_block: int, trial: Callable[[str], T], fits: Callable[[T], bool]) -> list[T]:
    """A bisection for the fewest layers per stage to recompute (``full:N``, Megatron's block method) that keep a
    layout within memory: saved bytes shrink as N grows, so it takes log2(repetitions) trials. ``repetitions``:
    of the repeated block on the largest stage (full recompute, known to fit); N steps in whole repetitions of
    ``per_block`` layers. Every trial, in order: the last that fits is the answer (none fits: only full does)."""
    lo, hi = 1, repetitions
    tries: list[T] = []
    while lo < hi:
        mid = (lo + hi) // 2
        tried = trial(f"full:{mid * per_block}")
        tries.append(tried)
        if fits(tried):
            hi = mid
        else:  # (a refused N counts as not fitting)
            lo = mid + 1
    return tries


def _check_optimizer_dtypes(plan: Plan) -> None:
    """The optimizer's state dtypes: known ones; a master weight and main gradients only where the weights are 16-bit
    with an fp32 master copy (fp32 training, fp32 weights and MaxText's 16-bit weights keep only the moments)."""
    if not plan.optimizer_dtypes:
        return
    try:
        given = given_dtypes(plan.optimizer_dtypes)
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    if not get_framework(plan.framework).master_copy(plan.dtype) and (other := [k for k in given if k not in MOMENTS]):
        what = "fp32 training" if plan.dtype == "fp32" else f"framework {plan.framework!r}"
        raise PlanError(
            f"--optimizer-dtypes {plan.optimizer_dtypes}: {other[0]} is the dtype of a master copy of 16-bit "
            f"weights; {what} keeps none (only {' and '.join(MOMENTS)} can be set)"
        )


def _check_fsdp_reduce(plan: Plan) -> None:
    """``fsdp_reduce_dtype``: a known dtype, and only under ZeRO-3 (the reduction it names is FSDP's)."""
    if not plan.fsdp_reduce_dtype:
        return
    if plan.fsdp_reduce_dtype not in FSDP_REDUCE_DTYPES:
        raise PlanError(
            f"unknown --fsdp-reduce-dtype {plan.fsdp_reduce_dtype!r} (known: {', '.join(FSDP_REDUCE_DTYPES)})"
        )
    if plan.zero != 3:
        raise PlanError(
            f"--fsdp-reduce-dtype {plan.fsdp_reduce_dtype}: the dtype of ZeRO-3 / FSDP's gradient reduce-scatter; "
            f"--zero {plan.zero} reduces as its framework does"
        )


def _check_grad_dtype(plan: Plan) -> None:
    """``grad_dtype``: fp32 or the weights' own 16 bits, and only where 16-bit weights have an fp32 master (the
    gradients of fp32 weights, or of MaxText's 16-bit weights, take the weights' dtype); fp32 with bf16 main
    gradients named too is refused, as Megatron asserts ("--main-grads-dtype can only be fp32 when
    --accumulate-allreduce-grads-in-fp32 is set", arguments.py, commit d98e8a6)."""
    if not plan.grad_dtype:
        return
    if plan.grad_dtype not in GRAD_DTYPES:
        raise PlanError(f"unknown --grad-dtype {plan.grad_dtype!r} (known: {', '.join(GRAD_DTYPES)})")
    if not get_framework(plan.framework).master_copy(plan.dtype):
        what = "fp32 training" if plan.dtype == "fp32" else f"framework {plan.framework!r} with --dtype {plan.dtype}"
        raise PlanError(
            f"--grad-dtype {plan.grad_dtype}: the gradient buffer of 16-bit weights with an fp32 master; {what} "
            "keeps its gradients in the weights' dtype"
        )
    weights = weights_16bit_dtype(plan.dtype)
    if plan.grad_dtype not in ("fp32", weights):
        raise PlanError(f"--grad-dtype {plan.grad_dtype}: the weights are {weights} (--dtype {plan.dtype}); "
                        f"gradients are kept in fp32 or {weights}")  # fmt: skip
    if plan.grad_dtype == "fp32" and given_dtypes(plan.optimizer_dtypes).get("main_grads", "fp32") != "fp32":
        raise PlanError(
            "--grad-dtype fp32 with --optimizer-dtypes main_grads=bf16: main gradients are fp32 when gradients "
            "accumulate in fp32 (Megatron asserts the same)"
        )


def _replay_notes(plan: Plan, shape: ModelShape) -> list[str]:
    """``full:N`` (and ``full:every-N``, ``full:uniform-N``) on this model: refused where N layers are no whole
    repetitions of its block; a note where layers stand outside the block (they are all recomputed, and Megatron
    would count them among a stage's first N)."""
    if plan.recompute != "none" and shape.layers is None:
        # every policy checkpoints layers (Megatron's, MaxText's remat of its scanned layers, torchtitan's per
        # layer): a model whose layers did not fold into a repeated block (ResNet's stages differ) has none
        return [
            f"--recompute {plan.recompute}: {shape.name} has no repeated block of layers, and echosim checkpoints "
            "layers: nothing is recomputed"
        ]
    n = replay_layers(plan.recompute) or replay_every(plan.recompute) or replay_group(plan.recompute)
    if not n:
        return []
    if n % shape.layers_per_block:
        raise PlanError(
            f"--recompute {plan.recompute}: a repetition of {shape.name}'s repeated block holds "
            f"{shape.layers_per_block} layers, so N must be a multiple of {shape.layers_per_block}"
        )
    if not shape.outside_layers or replay_group(plan.recompute):  # outside layers: one checkpoint each, as full
        return []
    which = f"the first {n} layers" if replay_layers(plan.recompute) else f"every {n}-th layer"
    return [
        Note(
            f"--recompute {plan.recompute}: {which} of each stage are counted in the repeated block; "
            f"the {shape.outside_layers} layers outside it are recomputed whole on the stage that holds them"
        )
    ]


def _tp_messages(plan: Plan, shape: ModelShape) -> list[str]:
    """A model none of whose module paths the plan matches runs data parallel only (with ``--tp`` > 1: an error).

    Batched expert weights (3-D, one slice per expert) have no tensor-parallel rule: with
    ``--tp`` above 1 every rank computes every expert.
    """
    if not shape.tp_targets:
        if plan.tp > 1:
            raise PlanError(
                f"tp={plan.tp}: no module path of {shape.name!r} matches the tensor-parallel plan "
                "(*.q_proj, *.o_proj, *.gate_proj, *.down_proj, embed_tokens, lm_head, ...): use --tp 1"
            )
        return [Note("no tensor-parallel plan matches this model's module paths: it runs data parallel only")]
    if plan.tp == 1:
        return []
    out = []
    if linears := shape.untargeted_linears:
        count = max(shape.untargeted_linear_count, len(linears))
        out.append(
            f"{count} linear layer{'s' if count > 1 else ''} "
            f"({', '.join(linears[:2])}{', ...' if count > 2 else ''}) run whole on all {plan.tp} "
            "tensor-parallel ranks: no rule of the tensor-parallel plan splits them (no rule matches their module "
            "paths, or a row-parallel one does but no column-parallel layer splits its input; "
            "echosim.passes.tensor_parallel.DEFAULT_TP_PLAN)"
        )
    if experts := shape.untargeted_experts:
        which = f"experts ({', '.join(experts[:2])}{', ...' if len(experts) > 2 else ''})"
        if plan.sp:  # Megatron's --expert-tensor-parallel-size 1: a layout, not a waste
            out.append(
                Note(
                    f"{which} are whole on all {plan.tp} tensor-parallel ranks, each running its own "
                    "sequence-parallel tokens through them (expert tensor parallelism 1)"
                )
            )
        else:
            out.append(
                f"{which} are replicated on all {plan.tp} tensor-parallel ranks: tensor parallelism splits only the "
                "zoo's experts (use --ep, or --sp to split their tokens)"
            )
    return out
