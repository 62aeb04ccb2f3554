"""What to simulate: the parallel layout and training settings (``Plan``) and the machine (``Cluster``).

A leaf module: plain data and its defaults, importing nothing of echosim but its errors and
the frameworks' defaults (:mod:`echosim.frameworks`, a leaf below it). Whether a plan can run
a model on a cluster is :mod:`echosim.layout`'s one check.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from echosim.errors import EchosimError
from echosim.frameworks import DEFAULT_FRAMEWORK, get_framework

DTYPES = ("fp32", "fp16", "bf16", "fp8", "mxfp8", "nvfp4", "int8")
#: Low-precision GEMM formats: the linear layers' matmuls run in them, everything else in 16-bit (int8:
#: MaxText's ``quantization: int8``, AQT integer GEMMs, on TPUs).
LOW_PRECISION = ("fp8", "mxfp8", "nvfp4", "int8")
CP_COMMS = ("p2p", "all_gather", "a2a", "a2a+p2p")
#: The schemes whose all_to_alls split attention by heads (Transformer Engine's; PyTorch's context_parallel has none)
HEAD_PARALLEL_COMMS = ("a2a", "a2a+p2p")
FSDP_REDUCE_DTYPES = ("fp32", "bf16", "fp16")
#: dtypes of the gradient buffer (``Plan.grad_dtype``): fp32 main gradients, or the 16-bit weights' own dtype
GRAD_DTYPES = ("fp32", "bf16", "fp16")


# NCCL all_to_all; DeepEP: the network once per node, then NVLink; HybridEP: Megatron-Core's flex dispatcher
# with the hybridep backend (echosim.passes.expert_parallel.DISPATCHERS)
MOE_DISPATCHERS = ("alltoall", "deepep", "hybridep")


class PlanError(EchosimError):
    """An impossible layout or setting; the message names the broken constraint."""


@dataclass(frozen=True)
class Cluster:
    backend: str = "a100-80gb"
    devices: int = 1024
    devices_per_node: int = 0  # 0: the backend's node (NVLink domain, NVL72 rack, TPU slice) for this job
    calibration: str = ""  # a calibration (``echosim calibrate``) whose fitted parameters the backend uses

    @property
    def nodes(self) -> int:
        return max(1, self.devices // (self.devices_per_node or self.devices or 1))


@dataclass(frozen=True)
class Plan:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    micro_batch: int = 1
    global_batch: int = 0  # 0: one micro-batch per data-parallel rank
    seq_len: int = 0  # 0: the model's own sequence length
    dtype: str = "bf16"
    recompute: str = "none"
    schedule: str = "1f1b"
    attention: str = "flash"  # "flash" (fused kernel) or "math" (materialised scores)
    pp_balance: str = "uniform"
    overlap_dp: bool = True
    sp: bool = False  # Megatron sequence parallelism (needs tp > 1)
    cp: int = 1  # context-parallel degree
    ep: int = 1  # expert-parallel degree (carved out of dp)
    # expert tensor parallelism (Megatron --expert-tensor-parallel-size): tensor-parallel degree of the routed
    # experts; 0: the same as tp (Megatron's default). With etp < tp, expert parallelism folds over tp x cp x dp
    etp: int = 0
    zero: int = 0  # 0: replicated optimizer; 1/2/3: ZeRO stage (3 = FSDP)
    vpp: int = 1  # virtual pipeline stages per rank (interleaved 1F1B)
    tp_overlap: bool = False  # chunked GEMMs overlap their TP collectives (Megatron --tp-comm-overlap)
    offload_layers: int = 0  # layers per stage whose activations live in host memory (Megatron CPU offloading)
    # the optimizer's fp32 master weights and moments live in host memory and the host CPU steps them (DeepSpeed's
    # ZeRO-Offload offload_optimizer, Megatron-Core's --optimizer-cpu-offload): gradients go down and the updated
    # weights come back over the GPU's host link each step
    offload_optimizer: bool = False
    # the offloaded step's copies and host update pipelined over parameter groups, so the step takes the slowest of
    # the three (Megatron-Core's --overlap-cpu-optimizer-d2h-h2d)
    offload_overlap: bool = False
    # ZeRO-3 / FSDP's weight shards live in host memory, each all-gather first copying the rank's shard to the device
    # (DeepSpeed's offload_param)
    offload_params: bool = False
    # Megatron's precision-aware optimizer: its state dtypes, KEY=DTYPE,... over main_grads, main_params, exp_avg,
    # exp_avg_sq (echosim.passes.memory.optimizer_dtypes); "": off (fp32 master, moments and main gradients)
    optimizer_dtypes: str = ""
    # ZeRO-3 / FSDP's gradient reduce-scatter dtype: fp32, bf16 or fp16 (PyTorch FSDP2's MixedPrecisionPolicy
    # reduce_dtype, Megatron-FSDP's --megatron-fsdp-grad-comm-dtype); "": the framework's (Framework.fsdp_reduce_fp32)
    fsdp_reduce_dtype: str = ""
    # the dtype gradients are accumulated and kept in where 16-bit weights have an fp32 master: fp32 (Megatron's
    # --accumulate-allreduce-grads-in-fp32, Megatron-Core's grad_reduce_in_fp32) or the weights' bf16 / fp16
    # (--grad-reduce-in-bf16); "": the framework's (Framework.grads_16bit). Memory: the buffer's bytes
    grad_dtype: str = ""
    loss_chunks: int = 1  # output layer and loss over token chunks, logits recomputed in backward (MaxText)
    # context parallelism: "p2p" (ring attention), "all_gather" of K/V, "a2a" (heads) or "a2a+p2p" (hierarchical:
    # a2a inside groups of cp_a2a neighbouring CP ranks, the ring across them)
    cp_comm: str = "p2p"
    # a2a+p2p's all-to-all group size (Megatron's --hierarchical-context-parallel-sizes A P: A); 0: the largest
    # proper divisor of cp whose groups stay inside a node (echosim.layout.resolve_cp_a2a)
    cp_a2a: int = 0
    cp_balance: bool = True  # causal load balancing (2*cp chunks per sequence)
    moe_capacity_factor: float = 0.0  # expert capacity over the fair share; 0: dropless
    # Megatron-Core's --moe-pad-expert-input-to-capacity: every expert's rows padded to its capacity
    moe_pad_to_capacity: bool = False
    moe_imbalance: float = 1.0  # busiest expert-parallel rank's load over the mean; 1: balanced
    moe_dispatcher: str = "alltoall"  # expert dispatch: NCCL "alltoall", "deepep" (network once per node), "hybridep"
    # group-limited routing (DeepSeek-V3): experts in this many equal groups, a token's experts drawn from
    # moe_router_group_topk of them (Megatron's --moe-router-num-groups / --moe-router-group-topk); 0: none
    moe_router_groups: int = 0
    moe_router_group_topk: int = 0
    # Megatron-Core's combined 1F1B (--overlap-moe-expert-parallel-comm): the EP all-to-alls of one micro-batch
    # run beside the adjacent micro-batch's forward or backward compute
    moe_ep_overlap: bool = False
    # Transformer Engine's FP8 attention (fp8_dot_product_attention: cuDNN's FP8 fused kernel), under an FP8 recipe
    fp8_attention: bool = False
    # Transformer Engine's fused grouped expert MLP (CuTe DSL: the GLU and its quantisation in the GEMM epilogues)
    moe_fused_mlp: bool = False
    passes: tuple[str, ...] = ()  # optional registered passes to run (``--pass NAME``)
    # embedding tables (pooled lookups) over the data-parallel ranks: none, table, row, column, data, table_row, auto
    embedding_sharding: str = "none"
    framework: str = DEFAULT_FRAMEWORK  # whose defaults and memory behaviour apply (echosim.frameworks)
    # TPU splash attention's block sizes, MaxText's sa_block_q, sa_block_kv, sa_block_q_dkv, sa_block_kv_dkv,
    # sa_block_q_dq, sa_block_kv_dq (a recipe's settings; echosim.backends.tpu.splash_blocks); (): the defaults
    splash_blocks: tuple[int, ...] = ()

    @property
    def batch(self) -> int:
        return self.global_batch or self.micro_batch * self.dp

    @property
    def microbatches(self) -> int:
        return self.batch // (self.micro_batch * self.dp)

    @property
    def expert_tp(self) -> int:
        """Tensor-parallel degree of the routed experts: ``etp``, or ``tp`` when not set."""
        return self.etp or self.tp

    @property
    def expert_dp(self) -> int:
        """Ranks of a stage that hold the same routed experts (Megatron-Core's expert-data-parallel group):
        ``tp * cp * dp / (etp * ep)``, at least 1."""
        return max(1, self.tp * self.cp * self.dp // (self.expert_tp * self.ep))

    @property
    def world(self) -> int:
        """Devices the layout occupies: ``tp * pp * dp * cp`` (expert parallelism is carved out of dp)."""
        return self.tp * self.pp * self.dp * self.cp

    def as_dict(self) -> dict[str, object]:
        """Every field; ``embedding_sharding``, ``moe_dispatcher``, ``etp``, ``moe_ep_overlap``, ``fp8_attention``,
        ``moe_fused_mlp``, ``moe_pad_to_capacity``, the router groups, ``splash_blocks``, ``optimizer_dtypes``,
        ``fsdp_reduce_dtype``, ``grad_dtype`` and ``cp_a2a`` only where set (models without tables or experts, and
        runs on MaxText's default splash blocks, their framework's optimizer, gradients and reduction, or one CP
        scheme, never state them)."""
        d = {f.name: getattr(self, f.name) for f in _FIELDS}  # asdict's recursive copy, for flat fields
        for name in _STATED_WHERE_SET:
            if d[name] == _DEFAULTS[name]:
                del d[name]
        if not self.moe_router_groups:
            del d["moe_router_group_topk"]
        return d


#: Plan's fields, every one a scalar or a tuple of strings or ints (:meth:`Plan.as_dict` copies none of them).
_FIELDS = fields(Plan)
_DEFAULTS = {f.name: f.default for f in _FIELDS}
#: The fields :meth:`Plan.as_dict` leaves out while they hold their default.
_STATED_WHERE_SET = ("etp", "moe_ep_overlap", "fp8_attention", "moe_fused_mlp", "moe_pad_to_capacity",
                     "embedding_sharding", "moe_dispatcher", "moe_router_groups", "splash_blocks",
                     "optimizer_dtypes", "fsdp_reduce_dtype", "grad_dtype", "cp_a2a")  # fmt: skip

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
DEFAULT_CLUSTER = Cluster(backend="a100-80gb", devices=1024)  # 8 per node: the backend's HGX node

_CLUSTER_KEYS = {"backend", "devices", "devices_per_node", "calibration"}
#: Options that count something: a value a user gives must be at least 1 (leaving one out takes the default).
_COUNTS = (
    "tp", "pp", "dp", "cp", "ep", "etp", "vpp", "micro_batch", "global_batch", "seq_len", "devices", "devices_per_node",
    "loss_chunks", "cp_a2a",
)  # fmt: skip


def plan_with_defaults(base: Plan, given: dict[str, Any], arch: str = "") -> Plan:
    """``base`` with the ``given`` fields, and the named framework's defaults for the fields not given
    (those that depend on the model's family take ``arch``: gpt, llama, moe; '' = not known).

    A field where ``base`` differs from ``Plan()`` counts as given (the default run states its
    settings). An unknown framework is one line naming the known ones.
    """
    plain = Plan()
    stated = {f.name for f in fields(Plan) if getattr(base, f.name) != getattr(plain, f.name)}
    plan_keys = {f.name for f in fields(Plan)}
    given = {k: v for k, v in given.items() if k in plan_keys and v is not None}
    plan = replace(base, **given)
    framework = get_framework(plan.framework)
    return replace(plan, **framework.defaults_for(stated | set(given), plan, arch))


def plan_from_options(model: str | None, opts: dict[str, Any]) -> tuple[str, Plan, Cluster]:
    """No model and no options: the published GPT-3 175B run. Otherwise options, then their framework's defaults.

    Derived when left out: ``devices`` is ``tp*pp*dp*cp``; with ``devices`` given, ``dp`` is
    ``devices / (tp*pp*cp)``. A count given as 0 or less is refused here, naming the option
    (0 never means "the default" when typed).
    """
    given = {k: v for k, v in opts.items() if v is not None}
    for key in _COUNTS:
        if key in given and given[key] < 1:
            hint = " (leave it out for the model's own)" if key == "seq_len" else ""
            raise PlanError(f"--{key.replace('_', '-')} must be at least 1, got {given[key]}{hint}")
    if model is None:
        base_plan, base_cluster = DEFAULT_PLAN, DEFAULT_CLUSTER
    else:
        base_plan, base_cluster = Plan(), Cluster(devices=0)
    plan = plan_with_defaults(base_plan, given)
    cluster = replace(base_cluster, **{k: v for k, v in given.items() if k in _CLUSTER_KEYS})
    if "devices" not in given:
        if model is not None:
            cluster = replace(cluster, devices=plan.world)
    elif "dp" not in given:
        other = plan.tp * plan.pp * plan.cp
        if cluster.devices % other:
            factors = f"tp*pp{'*cp' if plan.cp > 1 else ''} = {plan.tp}*{plan.pp}" + (
                f"*{plan.cp}" if plan.cp > 1 else ""
            )
            raise PlanError(
                f"--devices {cluster.devices} is not a multiple of {factors} = {other} "
                "(data parallelism takes the rest: dp = devices / (tp*pp*cp))"
            )
        plan = replace(plan, dp=cluster.devices // other)
    return DEFAULT_MODEL if model is None else model, plan, cluster


def plan_flags(plan: Plan, cluster: Cluster) -> list[str]:
    """The ``compile`` flags that, after a model name, give exactly ``plan`` on ``cluster``.

    The inverse of :func:`plan_from_options` for a named model: only settings that differ
    from the defaults (or that the plan's framework would fill) are written, in
    :class:`Plan`'s field order, the cluster first.
    ``overlap_dp`` has no flag (the command line always overlaps the gradient reduction).
    """
    if not plan.overlap_dp:
        raise PlanError("overlap_dp=False has no compile flag")
    out: list[str] = []
    base_cluster = Cluster()
    for key in ("backend", "devices", "devices_per_node", "calibration"):
        value = getattr(cluster, key)
        if key == "devices" and value == plan.world:
            continue
        if key == "devices" or value != getattr(base_cluster, key):
            out += [f"--{key.replace('_', '-')}", str(value)]
    base = Plan()
    filled = {d.field for d in get_framework(plan.framework).defaults}  # written out: the framework would fill them
    if cluster.devices != plan.world:
        filled.add("dp")  # with --devices written, a --dp left out would be derived
    for f in fields(Plan):
        value = getattr(plan, f.name)
        if f.name != "overlap_dp" and (value != getattr(base, f.name) or f.name in filled):
            out += setting_flags(f.name, value)
    return out


def setting_flags(name: str, value: Any) -> list[str]:
    """One :class:`Plan` setting as ``compile`` flags: ``vpp=2`` -> ``--vpp 2``, ``sp=False`` -> ``--no-sp``."""
    flag = f"--{name.replace('_', '-')}"
    if name == "passes":
        return [x for pass_name in value for x in ("--pass", pass_name)]
    if name == "splash_blocks":
        return [flag, ",".join(str(b) for b in value)]
    if isinstance(value, bool):
        return [flag if value else f"--no-{name.replace('_', '-')}"]
    return [flag, repr(value) if isinstance(value, float) else str(value)]
