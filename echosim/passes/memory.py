"""Memory analysis of one pipeline stage on one rank.

Static state follows Megatron-LM mixed precision: a 16-bit weight (2 bytes), an
fp32 main gradient (4) and Adam's fp32 master weight, momentum and variance (12)
for each local parameter: 18 bytes; plain fp32 training keeps 4 + 4 + 8 = 16. ZeRO
divides the optimizer state (stage 1), then the gradients (2), then the weights (3)
by the data-parallel degree (Rajbhandari et al. 2020, sec. 5). Activations are the
forward values that the backward (or its recompute) reads, derived from the graph;
a stage holds the activations of every micro-batch whose backward has not run yet
(1F1B: up to ``pp - stage`` of them).
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

from echosim.ir.graph import SAME_NODES, Graph, Node, elementwise_fn, is_cast, twin_of
from echosim.ir.ops import AttentionAttrs, Axis, CollectiveAttrs, ElementwiseAttrs, OpKind, Phase, Role
from echosim.passes.recompute import expert_activation, forward_readers
from echosim.passes.saved import names_in_block

# PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, torch 2.x): every request is
# rounded up to kMinBlockSize (512 bytes); one above kMinLargeAlloc (10 MiB) that finds no cached block
# gets a segment of its own, rounded up to kRoundLarge (2 MiB); smaller ones share 2 MiB (kSmallBuffer)
# and 20 MiB (kLargeBuffer) segments. Before it reports out of memory, malloc releases every cached
# block no tensor holds and retries (release_cached_blocks), so what a run must fit is what it
# allocates plus this rounding: the cache the allocator keeps beyond that (``reserved``) is given
# back under pressure. See :data:`RESERVED_OVER_ALLOCATED` for the reserved peak.
MIN_BLOCK_BYTES = 512
MIN_LARGE_ALLOC_BYTES = 10 * 2**20
ROUND_LARGE_BYTES = 2 * 2**20
# Peak reserved over peak allocated memory measured on Megatron-Bridge runs, the median of the ten
# published pairs (1.024, 1.025, 1.026, 1.028, 1.031, 1.034, 1.045, 1.078, 1.109, 1.175) of
# peak_allocated_memory_gib / peak_reserved_memory_gib in examples/model_verification_cards/
# {gemma-4-26b-a4b-it, nemotron-3.5-lightning}/card.yaml and the 59.000 / 69.344 GiB of
# nemotron-3-super-120b-a12b/card.yaml (Megatron-Bridge commit 067f987). What the caching allocator
# holds when it has room; a ``reserved`` measurement is compared with the peak times this.
RESERVED_OVER_ALLOCATED = 1.0325
# NCCL keeps NCCL_BUFFSIZE (4 MiB default) per channel and peer; with up to 32 channels and
# two ring neighbours that is 256 MiB per communicator (NCCL environment-variable docs).
NCCL_BUFFERS_PER_GROUP = 2 * 32 * 4 * 2**20


#: The activations of a gated MLP (SwiGLU, GeGLU): fc1's gate half goes through one, times its up half.
GATED_ACTIVATIONS = ("silu", "gelu", "swish")
#: Bytes per element of DeepSeek-V3's E5M6 activation cache (1 sign, 5 exponent and 6 mantissa bits, sec. 3.3.3).
E5M6_BYTES = 12 / 8

#: Megatron's precision-aware optimizer (Transformer Engine's FusedAdam, ``--use-precision-aware-optimizer``): the
#: dtypes each state may take, its default first (``--main-grads-dtype``, ``--main-params-dtype``,
#: ``--exp-avg-dtype``, ``--exp-avg-sq-dtype``: megatron/training/arguments.py, Megatron-LM commit d98e8a6)
OPTIMIZER_DTYPES: dict[str, tuple[str, ...]] = {
    "main_grads": ("fp32", "bf16"),
    "main_params": ("fp32", "fp16"),
    "exp_avg": ("fp32", "fp16", "bf16", "fp8"),
    "exp_avg_sq": ("fp32", "fp16", "bf16", "fp8"),
}
_STATE_DTYPE_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0}


#: The states a framework without a master copy keeps besides its weights and gradients: Adam's moments (MaxText's
#: ``mu_dtype`` sets the first: optax's adamw, src/maxtext/optimizers/optimizers.py, commit e591f30)
MOMENTS = ("exp_avg", "exp_avg_sq")


def given_dtypes(spec: str) -> dict[str, str]:
    """The state dtypes ``KEY=DTYPE,...`` names, and only those; an unknown key or dtype raises ``ValueError`` with
    one line."""
    out: dict[str, str] = {}
    for item in filter(None, (i.strip() for i in spec.split(","))):
        key, _, value = item.partition("=")
        if value not in OPTIMIZER_DTYPES.get(key, ()):
            known = "; ".join(f"{k}={'|'.join(v)}" for k, v in OPTIMIZER_DTYPES.items())
            raise ValueError(f"--optimizer-dtypes {spec}: {item!r} is not one of {known}")
        out[key] = value
    return out


def optimizer_dtypes(spec: str) -> dict[str, str]:
    """The state dtypes ``KEY=DTYPE,...`` names, the keys it leaves out at Megatron's defaults ({} for ""; the
    precision-aware optimizer is then off)."""
    given = given_dtypes(spec)
    return {key: given.get(key, choices[0]) for key, choices in OPTIMIZER_DTYPES.items()} if spec else {}


class StateBytes(NamedTuple):
    """Bytes per parameter of the main gradient, the master weight and Adam's two moments; ``remainders``: the master
    is the low 16 bits of an fp32 one, rebuilt from the 16-bit weight at each step."""

    grad: float
    master: float
    moments: float
    remainders: bool


def optimizer_state_bytes(dtype: str, spec: str, fp32_grads: bool = True, te: bool = True) -> StateBytes:
    """The states' bytes per parameter in the dtypes ``spec`` names (:func:`optimizer_dtypes`).

    ``te``: Megatron-Core's precision-aware optimizer, Transformer Engine's FusedAdam. Where TE keeps the master
    weights (the master is not fp32, or no FP8 recipe other than delayed scaling quantises the weights:
    ``use_precision_aware_optimizer_no_fp8_or_ds_fp8``, optimizer_config.py) and the weights are bf16, it stores only
    the 16 bits of each fp32 master the bf16 weight lacks (``store_param_remainders``, True by default;
    distrib_optimizer.py allocates them as int16); otherwise Megatron-Core keeps an fp32 master. echosim's fp8, mxfp8
    and nvfp4 are current-scaling or block-scaled recipes, not delayed scaling. Without ``te`` (a framework that
    states its states' dtypes, as DeepSeek-V3's report does) the master takes ``main_params``'s dtype."""
    dtypes = optimizer_dtypes(spec)
    grad = _STATE_DTYPE_BYTES[dtypes["main_grads"]] if fp32_grads else 2.0
    moments = _STATE_DTYPE_BYTES[dtypes["exp_avg"]] + _STATE_DTYPE_BYTES[dtypes["exp_avg_sq"]]
    te_master = te and (dtypes["main_params"] != "fp32" or dtype in ("bf16", "fp16"))
    if te_master and dtype != "fp16":  # bf16 weights (under FP8 recipes too)
        return StateBytes(grad, 2.0, moments, True)
    if te and not te_master:
        return StateBytes(grad, 4.0, moments, False)
    return StateBytes(grad, _STATE_DTYPE_BYTES[dtypes["main_params"]], moments, False)


@dataclass(frozen=True)
class StatePolicy:
    """Bytes of weight, gradient and optimizer state per local parameter, and of a communication bucket
    that holds a second copy of its gradient (PyTorch DDP's reducer; 0 where the gradients are the buckets)."""

    weight_bytes: float
    grad_bytes: float
    optimizer_bytes: float
    bucket_bytes: float = 0.0
    # fp32 main gradients the optimizer step makes from 16-bit ones for an fp32 master (Megatron-Core's
    # _copy_model_grads_to_main_grads: ``main_param.grad = model_param.main_grad.float()``, the distributed
    # optimizer's shard of them; optimizer.py, Megatron-LM commit d98e8a6), once backward has freed the activations
    step_grad_bytes: float = 0.0

    @classmethod
    def for_training(
        cls,
        dtype: str,
        zero: int = 0,
        dp: int = 1,
        fp32_grads: bool = True,
        fp32_weights: bool = False,
        unsharded_between_microbatches: bool = False,
        weights_16bit: bool = False,
        ddp_bucket_buffers: bool = False,
        optimizer_dtypes: str = "",
        te_optimizer: bool = False,
        offload: bool = False,
        offload_params: bool = False,
    ) -> StatePolicy:
        """``fp32_grads``: Megatron accumulates into fp32 main grads; DeepSpeed (the ZeRO paper) keeps 16-bit.

        ``fp32_weights``: the weights themselves stay fp32 and are cast for compute (FSDP2 mixed
        precision, MaxText's ``weight_dtype``), so there is no separate master copy: 4 + 4 + 8 bytes.
        ``unsharded_between_microbatches``: FSDP under a pipeline keeps each stage's weights gathered
        from its first forward to its last backward and accumulates unsharded gradients in fp32 until
        the last micro-batch reduce-scatters them (torchtitan's default reshard policy with PP; the
        pipeline stage turns gradient sync off for all but the last backward).
        ``weights_16bit``: the weights themselves are 16-bit and so are their gradients and Adam's two
        moments, with no master copy: 2 + 2 + 4 (MaxText ``weight_dtype: bfloat16``).
        ``ddp_bucket_buffers``: ZeRO 0 through PyTorch DDP's reducer with its default
        ``gradient_as_bucket_view=False`` (:meth:`echosim.passes.data_parallel.DataParallel.bucket_buffers`):
        besides each ``.grad`` the rank keeps the reducer's flat buckets, one more copy of every gradient it
        reduces, in the gradient's dtype, for the whole run.
        ``optimizer_dtypes``: the optimizer's states in these dtypes (:func:`optimizer_dtypes`; "": fp32), over
        16-bit weights with a master copy; ``te_optimizer``: Megatron-Core's precision-aware optimizer keeps them
        (:func:`optimizer_state_bytes`). Without a master copy only the moments can be named (:data:`MOMENTS`); a
        moment not named keeps the weights' dtype.
        ``offload``: the master weights and moments live in host memory and the host makes the step's fp32
        gradients (:attr:`echosim.plan.Plan.offload_optimizer`): no optimizer state and no step copy on the device.
        The gradients the device accumulates and reduces stay (DeepSpeed's estimate for ZeRO-2 with CPU offload,
        ``estimate_zero2_model_states_mem_needs``, counts only the 16-bit weights; its gradient partitions leave
        for the host as each bucket is reduced, a bucket's worth at a time).
        ``offload_params``: under ZeRO-3 the rank's weight shard lives in host memory too (DeepSpeed's
        ``offload_param``); what the device holds of the weights is the layers it has gathered.
        """
        mixed = dtype != "fp32" and not fp32_weights
        weight, grad, opt = (2.0, 4.0 if fp32_grads else 2.0, 12.0) if mixed else (4.0, 4.0, 8.0)
        if weights_16bit and dtype != "fp32":
            weight, grad, opt = 2.0, 2.0, 4.0
        if optimizer_dtypes and (weights_16bit or not mixed):
            given = given_dtypes(optimizer_dtypes)
            opt = sum(_STATE_DTYPE_BYTES[given[k]] if k in given else weight for k in MOMENTS)
        elif optimizer_dtypes and mixed:
            states = optimizer_state_bytes(dtype, optimizer_dtypes, fp32_grads, te_optimizer)
            grad, opt = states.grad, states.master + states.moments
        if zero >= 1:
            opt /= dp
        if zero >= 2:
            grad /= dp
        if zero >= 3:
            weight = 0.0 if offload_params else weight / dp
            if unsharded_between_microbatches:  # 16-bit weights and gradients in the reduce dtype (fp32)
                weight += 2.0 if dtype != "fp32" else 4.0
                grad += 4.0
        # Reducer::initialize_buckets (torch/csrc/distributed/c10d/reducer.cpp) allocates each bucket's flat
        # ``gradients`` tensor, at::empty over the numel of its variables in their dtype, when DDP is built and
        # again when it rebuilds its buckets after the first step, and keeps it for the run; with
        # gradient_as_bucket_view=False each .grad stays a tensor of its own, so the buckets are a second copy
        # of the gradients. The DDP docs: gradient_as_bucket_view=True "can reduce peak memory usage, where the
        # saved memory size will be equal to the total gradients size" (https://pytorch.org/docs/stable/
        # generated/torch.nn.parallel.DistributedDataParallel.html; pytorch/pytorch PR 41954 measured it).
        # ZeRO 0 keeps every gradient, so the buckets hold ``grad`` bytes a parameter, in the dtype the
        # data-parallel pass reduces them in (the gradient's: passes/plugin.py _data_parallel)
        bucket = grad if ddp_bucket_buffers and zero == 0 else 0.0
        # 16-bit gradients under an fp32 master: the step's fp32 copy of this rank's share (Transformer Engine's
        # FusedAdam, the precision-aware optimizer, reads them as they are)
        copied = mixed and not weights_16bit and not fp32_grads and not optimizer_dtypes
        step = 4.0 / (dp if zero >= 1 else 1) if copied else 0.0
        if offload:
            opt = step = 0.0
        return cls(weight, grad, opt, bucket, step)


@dataclass(frozen=True)
class MemoryBreakdown:
    params: int
    grads: int
    optimizer: int
    activations: int
    transient: int
    comm_buffers: int
    fragmentation: int
    capacity: int
    # StatePolicy.step_grad_bytes of the rank's parameters: live at the optimizer step, when the activations and
    # their working set are gone, so ``transient`` covers what it exceeds them by (not a term of its own)
    step_grads: int = 0

    @property
    def peak(self) -> int:
        parts = (self.params, self.grads, self.optimizer, self.activations, self.transient, self.comm_buffers)
        return sum(parts) + self.fragmentation

    def largest(self, count: int = 2) -> list[tuple[str, int]]:
        parts = {k: v for k, v in self.as_dict().items() if k not in ("peak", "capacity", "fits")}
        return sorted(((k, int(v)) for k, v in parts.items()), key=lambda kv: -kv[1])[:count]

    @property
    def fits(self) -> bool:
        return self.peak <= self.capacity

    def as_dict(self) -> dict[str, int | bool]:
        return {
            "params": self.params,
            "grads": self.grads,
            "optimizer": self.optimizer,
            "activations": self.activations,
            "transient": self.transient,
            "comm_buffers": self.comm_buffers,
            "fragmentation": self.fragmentation,
            "peak": self.peak,
            "capacity": self.capacity,
            "fits": self.fits,
        }


def _base(graph: Graph, nid: int) -> int:
    """Follow views to the value that owns the storage."""
    # the node table read directly, each node once (a search asks ~2M times, mostly of a node that is no view)
    nodes = graph.nodes
    node = nodes[nid]
    while node.op is OpKind.VIEW and node.inputs:
        nid = node.inputs[0]
        node = nodes[nid]
    return nid


def _saved_bytes(node: Node, only_own_grad: bool, own_grad_reads: bool, mask_in_dtype: bool = False) -> int:
    """Bytes kept for backward; a dropout read only by its own gradient keeps just its mask.

    Attention keeps its softmax statistics (and, materialised, its score matrices) only
    for its own backward: when that backward reads a recomputed copy, only the output stays.
    ``mask_in_dtype``: dropout's mask is in the input's dtype, not 1 byte (no fused kernel).
    """
    mask = node.out.dtype.itemsize if mask_in_dtype else 1
    if isinstance(node.attrs, ElementwiseAttrs) and node.attrs.fn == "dropout" and only_own_grad:
        return node.out.numel * mask
    if isinstance(node.attrs, AttentionAttrs):
        a = node.attrs
        if not own_grad_reads:
            return node.out.nbytes
        lse = a.batch * a.heads * a.q_len * 4  # softmax statistics (fp32)
        if a.flash:
            return node.out.nbytes + lse
        scores = a.batch * a.heads * a.q_len * a.kv_len
        # softmax output, dropout mask (1 byte fused), dropout output: 5 bytes per score in 16-bit
        return node.out.nbytes + scores * (2 * node.out.dtype.itemsize + (mask if a.dropout else 1))
    return node.out.nbytes


@dataclass(frozen=True)
class SavedPolicy:
    """What a framework's kernels keep for backward beyond eager autograd's rules.

    ``fused_gated``: the gated MLP's activation and product run as one kernel that saves only
    its input and recomputes the activation in backward, so the activation's output is not
    kept (Megatron-Core ``SwiGLUFunction`` saves its input alone,
    megatron/core/fusions/fused_bias_swiglu.py; ``--bias-swiglu-fusion`` is on unless
    ``--no-bias-swiglu-fusion``, megatron/training/arguments.py, commit d98e8a6).
    ``offload``: tensor names (:mod:`echosim.passes.saved`) the recompute policy moves to host
    memory; they take no device memory.
    ``ce_saved`` / ``ce_working``: the loss over the vocabulary as the framework computes it, in
    bytes per logit (fp32 copies: see :mod:`echosim.frameworks`).
    ``probs_in_experts``: the router's weights are applied inside the experts (Megatron-Core's
    weighted SwiGLU between fc1 and fc2), so the combine is a plain scatter-sum whose backward is a
    gather, and the expert outputs it sums are not kept for the weights' gradient.
    ``gated_inputs_bytes``: bytes per element the SwiGLU inputs of the MoE layers (fc1's outputs, which the fused
    activation's backward reads; routed and shared experts) are cached in, scales included (0: their dtype's).
    ``attention_out_bytes``: the attention output kept once, in this many bytes per element, for its own backward
    and for the output projection's weight gradient, whose FP8 copy is then not kept (0: each kept as the IR's ops
    keep it).
    DeepSeek-V3's FP8 framework does both (:mod:`echosim.frameworks`, ``hai-llm``).
    ``offload_layers``: Megatron-Core's CPU activation offloading (``cpu_offloading_num_layers``):
    that many transformer layers of the stage keep their saved activations in host memory; at
    least one layer (the one running) stays on the device (megatron/core/extensions/
    transformer_engine.py get_cpu_offload_context, which asserts ``num_layers < config.num_layers``;
    Megatron-LM commit d98e8a6).
    """

    fused_gated: bool = False
    offload: frozenset[str] = frozenset()
    offload_layers: int = 0
    probs_in_experts: bool = False  # router weights scale the expert activation: the combine keeps no rows
    gated_inputs_bytes: float = 0.0  # the MoE layers' SwiGLU inputs cached at this many bytes an element
    attention_out_bytes: float = 0.0  # the attention output kept once at this many bytes an element
    loss_chunks: int = 1  # the loss runs over this many token chunks: one chunk's logits exist at a time
    ce_saved: float = 0.0  # bytes per logit the loss keeps for backward (0: what the IR's op reads)
    ce_working: float = 0.0  # bytes per logit the loss's backward allocates (0: its output)
    mask_in_dtype: bool = False  # dropout keeps its mask in the input's dtype (no fused kernel: CPU)
    # False: the next layer's gathered weights (ZeRO-3 / FSDP prefetch) are not part of what must fit, as
    # under XLA, whose latency-hiding scheduler overlaps collectives only within a memory limit
    # (SchedulerConfig::memory_limit, xla/service/latency_hiding_scheduler.h) that the compiler sets from
    # the device's memory for the scheduler and HLO rematerialization (GetSchedulerMemoryLimit,
    # xla/service/gpu/gpu_hlo_schedule.h: "the device memory limit to be used by passes like scheduler
    # and HLO rematerialization")
    prefetch_held: bool = True
    # True: each weight's gradient is reduce-scattered (or all-reduced) by itself as the dot that
    # produces it ends, so a layer's gradient reduction holds one weight's unsharded gradient at a
    # time, not the whole layer's. XLA's SPMD partitioner places the collective on each weight
    # gradient whose sharding (the parameter's) differs from the dot's result; MaxText's FSDP
    # gradients are "synchronized in the backward pass ... with a reduce scatter ... only certain
    # sizes of weight matrices allow for this efficient reduce scatter" (docs/guides/optimization/
    # sharding.md line 223, MaxText commit e591f30), a rule per weight matrix. PyTorch FSDP2 instead
    # copies the layer's gradients into one flat reduce-scatter input (``foreach_reduce``).
    grad_reduce_per_weight: bool = False

    def __hash__(self) -> int:
        """The dataclass's hash (of the compared fields, in order), kept once computed: the analyses a search keeps
        on each stage graph are keyed by the policy (300k lookups in GPT-3 175B's full space), and a dataclass
        hashes its thirteen fields on every one. Equal policies hash alike, as before."""
        known: int | None = self.__dict__.get("_hash")
        if known is None:
            known = hash(tuple(getattr(self, f.name) for f in fields(self) if f.compare))
            object.__setattr__(self, "_hash", known)
        return known

    def __getstate__(self) -> dict[str, Any]:
        """Its fields without the kept hash (another process hashes strings with another seed)."""
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}


def allocator_block(nbytes: int) -> int:
    """Device bytes the caching allocator holds for one tensor of ``nbytes`` (see :data:`MIN_BLOCK_BYTES`)."""
    rounded = -(-max(nbytes, 1) // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES
    if rounded > MIN_LARGE_ALLOC_BYTES:
        return -(-rounded // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES
    return rounded


def activation_bytes(
    graph: Graph, saved: SavedPolicy | None = None, base: Graph | None = None, blocks: bool = False
) -> int:
    """Bytes saved by one micro-batch's forward for its backward, on this rank.

    A value read inside a repeated block is saved once per repetition, even when it
    is produced outside it: in the unfolded model each layer reads its own input.
    ``base``: a graph ``graph`` extends (:func:`added_nodes`); when what it added reads no forward
    value (gradient reductions, the optimizer step), the bytes are ``base``'s, kept on it.
    ``blocks``: each saved tensor as the caching allocator holds it (:func:`allocator_block`).
    """
    saved = saved or SavedPolicy()
    added = added_nodes(graph, base)
    if base is not None and added is not None and not _added_reads_forward(graph, base, added):
        key = "activation-blocks" if blocks else "activation-bytes"
        return base.derived((key, saved), lambda: activation_bytes(base, saved, blocks=blocks))
    each, mult = graph.derived(("saved-values", saved), lambda: _saved_values(graph, saved))  # read, not changed
    if blocks:
        each = {nid: allocator_block(b) for nid, b in each.items()}
    total = sum(each[nid] * k for nid, k in mult.items())
    blocks = max(mult.values(), default=1)
    per_block = max((graph.layers_per_block(p) for p, k in graph.repeats.items() if k == blocks), default=1)
    layers = blocks * per_block
    if saved.offload_layers and layers > 1:
        # one layer's share: what every repetition of the block keeps (its inputs included), per layer of it
        per_layer = sum(each[nid] for nid, k in mult.items() if k == blocks) // per_block
        total -= min(saved.offload_layers, layers - 1) * per_layer
    return total


def _saved_values(graph: Graph, saved: SavedPolicy) -> tuple[dict[int, int], dict[int, int]]:
    """Each forward value backward reads: its bytes as kept, and the repetitions it is kept for."""
    mult: dict[int, int] = {}
    own_only: dict[int, bool] = {}
    own_reads: dict[int, bool] = {}
    replayed_reads: dict[int, str | None] = {}  # read by a layer's replay: the layer's checkpointed input (its block)
    logits: set[int] = set()  # the loss's input, kept as the framework's loss keeps it
    for n in graph:
        if n.phase not in (Phase.BACKWARD, Phase.RECOMPUTE):
            continue
        for i in n.inputs:
            src = graph[_base(graph, i)]
            if src.phase is not Phase.FORWARD or src.op in (OpKind.PARAMETER, OpKind.INPUT):
                continue
            if not src.inputs and src.op is not OpKind.RECV:
                continue
            if saved.fused_gated and _fused_activation(graph, src, n):
                continue
            if saved.probs_in_experts and _combine_rows(graph, src, n):
                continue
            # each layer's copy of a value is read by that layer's backward: one copy per repetition of
            # the reader (a layer's output read after the layers is the last layer's alone)
            mult[src.id] = max(mult.get(src.id, 0), graph.multiplicity(n))
            own_only[src.id] = own_only.get(src.id, True) and n.origin == src.id
            own_reads[src.id] = own_reads.get(src.id, False) or (n.origin == src.id and i == src.id)
            if n.phase is Phase.RECOMPUTE and graph.checkpoint_layer(src) != graph.checkpoint_layer(n):
                replayed_reads[src.id] = graph.block_of(n)
            if saved.ce_saved and n.origin is not None and graph[n.origin].op is OpKind.CROSS_ENTROPY:
                logits.add(src.id)
    if graph.partial_replay():
        _kept_unreplayed(graph, saved, mult, own_only, own_reads)
    if graph.replay_group:
        _chunk_checkpoints(graph, replayed_reads, mult)
    if saved.offload:
        names = names_in_block(graph)
        gone = {nid for nid in mult if names.get(nid, "") in saved.offload}
        if "decoder_layer_input" in saved.offload:
            gone |= set(replayed_reads)
        mult = {nid: k for nid, k in mult.items() if nid not in gone}
    each = {
        nid: int(graph[nid].out.numel * saved.ce_saved)
        if nid in logits
        else _saved_bytes(graph[nid], own_only[nid], own_reads[nid], saved.mask_in_dtype)
        for nid in mult
    }
    if saved.gated_inputs_bytes or saved.attention_out_bytes:
        _low_precision_caches(graph, saved, each, mult)
    return each, mult


def _low_precision_caches(graph: Graph, saved: SavedPolicy, each: dict[int, int], mult: dict[int, int]) -> None:
    """Re-price, in place, the values a framework caches in fewer bytes (:class:`SavedPolicy`'s
    ``gated_inputs_bytes`` and ``attention_out_bytes``)."""
    kept_attention = {nid for nid in mult if isinstance(graph[nid].attrs, AttentionAttrs)}
    # "the SwiGLU operator in MoE": the routed experts' and, in the same layers, the shared experts'
    moe_layers = {graph.checkpoint_layer(n) for n in graph if elementwise_fn(n) == "moe_dispatch"} - {None}
    for nid in list(mult):
        node = graph[nid]
        if saved.gated_inputs_bytes and node.op is OpKind.MATMUL:
            readers = forward_readers(graph, nid)
            shared = graph.checkpoint_layer(node) in moe_layers and any(_gated(graph, r) for r in readers)
            if shared or any(expert_activation(graph, r) for r in readers):
                each[nid] = math.ceil(node.out.numel * saved.gated_inputs_bytes)
        elif saved.attention_out_bytes and nid in kept_attention:
            each[nid] += math.ceil(node.out.numel * saved.attention_out_bytes) - node.out.nbytes
        elif saved.attention_out_bytes and is_cast(node) and _base(graph, node.inputs[0]) in kept_attention:
            del mult[nid], each[nid]  # the output projection's weight gradient reads the attention's 12-bit copy


def _gated(graph: Graph, node: Node) -> bool:
    """A gated MLP's activation whose output is multiplied, or that product (the two readers of SwiGLU's inputs);
    not a plain MLP's GeLU."""
    if elementwise_fn(node) in GATED_ACTIVATIONS:
        return any(elementwise_fn(r) == "mul" for r in forward_readers(graph, node.id))
    return elementwise_fn(node) == "mul" and any(
        elementwise_fn(graph[_base(graph, i)]) in GATED_ACTIVATIONS for i in node.inputs
    )


def _chunk_checkpoints(graph: Graph, checkpoints: dict[int, str | None], mult: dict[int, int]) -> None:
    """Under ``full:uniform-N`` one input is kept per chunk of N layers (Megatron-Core's ``checkpointed_forward``
    walks a stage's layers N at a time): a block's input is kept once per chunk of its repetitions, and an input
    between two layers of one repetition (a block of several layers) is replayed with its chunk, not kept."""
    for nid, prefix in checkpoints.items():
        if prefix is None or nid not in mult:
            continue
        if graph.block_of(graph[nid]) == prefix:
            del mult[nid]
        else:
            mult[nid] = -(-mult[nid] // graph.replay_chunk(prefix))


def _kept_unreplayed(
    graph: Graph, saved: SavedPolicy, mult: dict[int, int], own_only: dict[int, bool], own_reads: dict[int, bool]
) -> None:
    """Under ``full:N`` or ``full:every-N`` the block's repetitions that do not replay keep what their backward reads:
    each replayed value a backward node reads stands for its forward twin, kept by those repetitions (added to
    ``mult``)."""
    twins: dict[int, int | None] = {}
    for n in graph:
        if n.phase is not Phase.BACKWARD or (prefix := graph.block_of(n)) is None:
            continue
        plain = graph.repeats[prefix] - graph.replayed(prefix)
        for i in n.inputs:
            copy = graph[_base(graph, i)]
            if copy.phase is not Phase.RECOMPUTE or graph.block_of(copy) is None:
                continue
            if copy.id not in twins:
                twins[copy.id] = _forward_twin(graph, copy)
            twin = twins[copy.id]
            if twin is None:
                continue
            src = graph[twin]
            if saved.fused_gated and _fused_activation(graph, src, n):
                continue
            if saved.probs_in_experts and _combine_rows(graph, src, n):
                continue
            mult[src.id] = max(mult.get(src.id, 0), plain)
            own_only[src.id] = own_only.get(src.id, True) and n.origin == src.id
            own_reads[src.id] = own_reads.get(src.id, False) or (n.origin == src.id and i == copy.id)


def _forward_twin(graph: Graph, copy: Node) -> int | None:
    """The forward node a replayed one copies: its origin, or for a pass's own cast of a replayed value (an fp8
    quantisation, origin None) the forward's cast of the same kind of that value's twin."""
    if copy.origin is not None:
        return copy.origin
    if not isinstance(copy.attrs, ElementwiseAttrs) or len(copy.inputs) != 1:
        return None
    source = graph[copy.inputs[0]]
    if source.phase is not Phase.RECOMPUTE or source.origin is None:
        return None
    for u in graph.users(source.origin):
        user = graph[u]
        if user.phase is Phase.FORWARD and user.op is copy.op and user.attrs == copy.attrs:
            return u
    return None


def _combine_rows(graph: Graph, src: Node, reader: Node) -> bool:
    """The expert outputs a MoE combine sums, read by the router weights' gradient."""
    origin = graph[reader.origin] if reader.origin is not None else None
    return (
        origin is not None
        and isinstance(origin.attrs, ElementwiseAttrs)
        and origin.attrs.fn == "moe_combine"
        and bool(origin.inputs)
        and _base(graph, origin.inputs[0]) == src.id
    )


def _fused_activation(graph: Graph, src: Node, reader: Node) -> bool:
    """A gated MLP's activation output read by the product's backward: the fused kernel recomputes it."""
    if not (isinstance(src.attrs, ElementwiseAttrs) and src.attrs.fn in GATED_ACTIVATIONS):
        return False
    origin = graph[reader.origin] if reader.origin is not None else None
    return (
        origin is not None
        and isinstance(origin.attrs, ElementwiseAttrs)
        and origin.attrs.fn == "mul"
        and (src.id in origin.inputs or src.origin in origin.inputs)  # the forward value or its replay
    )


def transient_bytes(graph: Graph, saved: SavedPolicy | None = None, base: Graph | None = None) -> int:
    """Working set on top of saved activations, at the moment it peaks.

    Inside a layer's backward that is the largest op's output with the gradients it reads, plus
    the layer's replayed values that backward reads (what the replayed forward saves; the rest
    is freed as the replay runs). Outside the layers (the loss, the output layer) it is the
    largest op's working set alone: no layer is being replayed then.

    ``base``: a graph ``graph`` extends (:func:`added_nodes`): its terms are kept on it and only
    the added nodes (gradient buckets, ZeRO gathers) are walked, unless they read a replayed value.
    """
    saved = saved or SavedPolicy()
    added = added_nodes(graph, base)
    if base is None or added is None:
        return _working_terms(graph, list(graph), saved).bytes(saved.prefetch_held)
    # the base's terms read no repeat count: a base that holds another's nodes under other repeat counts (a
    # search's stage shape at depths 1-3, :data:`~echosim.ir.graph.SAME_NODES`) takes that one's
    ref = base.derived(SAME_NODES, lambda: base)
    # so the bytes are a function of ref's nodes, the added nodes and ``saved``, kept on ref by the added nodes.
    # An optimizer-phase node is read for its id and inputs only (it has no working set, replays and gathers
    # nothing unless it is an FSDP gather): the optimizer step and ZeRO's parameter gather, whose sizes grow
    # with the depth, do not keep depths 2 and 3 of a stage apart
    key = _added_key(added)
    known = ref.derived(("transient-by-added", saved), dict)
    hit = known.get(key)
    if hit is None:
        hit = known[key] = _extended_transient(graph, base, added, saved, ref)
    return hit


def _added_key(added: list[Node]) -> tuple[Any, ...]:
    """:func:`transient_bytes`' key of the appended nodes: each node, an optimizer-phase one (no FSDP gather) as its
    id and inputs. A node that repeats the one before but for its id and name (:func:`~echosim.ir.graph.twin_of`: a
    scope's gradient buckets) is its id, phase, scope, name and origin after a marker, without its op, attributes,
    output and inputs, which are the one before's: equal keys still mean nodes equal in every field read, and the
    buckets' attributes and outputs are not hashed and compared once per bucket."""
    out: list[Any] = []
    prev = None
    for n in added:
        if n.phase is Phase.OPTIMIZER and not _fsdp_gather(n):
            out.append((n.id, n.inputs))
            prev = None  # its op, attributes and output are not in the key: no twin of it is told by it
        elif twin_of(prev, n):
            out.append((_TWIN, n.id, n.phase, n.scope, n.name, n.origin))
        else:
            out.append(n)
            prev = n
    return tuple(out)


#: :func:`_added_key`'s marker of a node that repeats the one before it.
_TWIN = "same op, attributes, output and inputs as the node before"


def _extended_transient(graph: Graph, base: Graph, added: list[Node], saved: SavedPolicy, ref: Graph) -> int:
    """:func:`transient_bytes` of ``graph``: the nodes of ``ref`` (under its own repeat counts) and ``added``
    (the nodes ``graph`` appends to ``base``)."""
    # what backward has freed before an appended node: all that the base's last readers free, when the
    # appended nodes read no forward value (then they are no value's last reader, and come after every one)
    freed = None
    if not _added_reads_forward(graph, base, added):
        ends = ref.derived(("freed-schedule", saved), lambda: _freed_schedule(ref, saved))[2]
        freed = ends[-1] if ends else 0
    extra = _working_terms(graph, added, saved, freed)
    if extra.reads_replay:
        return _working_terms(graph, list(graph), saved).bytes(saved.prefetch_held)
    core = ref.derived(("working-terms", saved), lambda: _working_terms(ref, list(ref), saved))
    return core.merged(extra).bytes(saved.prefetch_held)


@dataclass(frozen=True)
class _WorkingTerms:
    """What the working set's peak is built from, over some of a graph's nodes (maxima and a sum)."""

    inside: int  # the largest backward working set inside the layers
    outside: int  # ... outside them
    replay: int  # replayed values backward reads
    layer: int  # the largest FSDP all-gather inside the layers
    rest: int  # ... outside them
    reads_replay: bool = False  # a backward node of these reads a replayed value
    outside_replay: int = 0  # replayed values outside the layers (the output layer's logits, one chunk each)

    def merged(self, other: _WorkingTerms) -> _WorkingTerms:
        return _WorkingTerms(max(self.inside, other.inside), max(self.outside, other.outside),
                             self.replay + other.replay, max(self.layer, other.layer), max(self.rest, other.rest),
                             self.reads_replay or other.reads_replay,
                             self.outside_replay + other.outside_replay)  # fmt: skip

    def bytes(self, prefetch: bool = True) -> int:
        # ZeRO-3 / FSDP: a layer's backward holds its gathered weights and the next layer's (prefetched);
        # the loss and output layer hold their own gathered weights and the last layer's, prefetched.
        # ``prefetch`` False: the next layer's gather is an overlap the schedule drops under memory pressure
        ahead = self.layer if prefetch else 0
        outside = self.outside + self.outside_replay
        return max(self.inside + self.replay + self.layer + ahead, outside + self.rest + ahead)


def _freed_schedule(graph: Graph, saved: SavedPolicy) -> tuple[dict[int, int], list[int], list[int]]:
    """When backward frees the values kept once outside the layers (the loss's logits, the final norm's
    input): node positions, and the positions of their last readers with the bytes freed up to each.

    Autograd drops a node's saved tensors once that node's backward has run (retain_graph=False), and
    XLA's buffer assignment ends a buffer's live range at its last use, so by the time the output
    layer's and the layers' backward run the loss's saved logits are gone.
    """
    pos = {nid: i for i, nid in enumerate(graph.nodes)}
    each, mult = graph.derived(("saved-values", saved), lambda: _saved_values(graph, saved))  # read, not changed
    last: dict[int, int] = {}
    layers_read: set[int] = set()  # read by the layers (a stage's input): kept by each repetition, not once
    for n in graph:
        if n.phase in (Phase.BACKWARD, Phase.RECOMPUTE):
            for i in n.inputs:
                b = _base(graph, i)
                if graph.block_of(n) is not None:
                    layers_read.add(b)
                if b in each and mult[b] == 1 and graph.block_of(graph[b]) is None:
                    last[b] = pos[n.id]
    last = {b: p for b, p in last.items() if b not in layers_read}
    ends = sorted((p, each[b]) for b, p in last.items())
    cumulative, total = [], 0
    for _, nbytes in ends:
        total += nbytes
        cumulative.append(total)
    return pos, [p for p, _ in ends], cumulative


def _freed_before(schedule: tuple[dict[int, int], list[int], list[int]], nid: int) -> int:
    """Bytes of once-kept values whose last reader ran before node ``nid`` (0 for a node not in the graph)."""
    pos, ends, cumulative = schedule
    at = pos.get(nid)
    if at is None:
        return 0
    k = bisect.bisect_left(ends, at)
    return cumulative[k - 1] if k else 0


def _working_terms(graph: Graph, nodes: list[Node], saved: SavedPolicy, freed: int | None = None) -> _WorkingTerms:
    """``freed``: bytes freed before each of ``nodes`` when it is the same for all (else from the graph's schedule)."""
    logits = _logit_numel(graph) if saved.loss_chunks > 1 else 0
    schedule = (
        graph.derived(("freed-schedule", saved), lambda: _freed_schedule(graph, saved)) if freed is None else None
    )
    inside = outside = 0
    read: set[int] = set()  # replayed values backward reads (a fused gated activation is recomputed inside)
    # the gradient buckets of one scope read the same gradients: a node's working set and what it reads are
    # functions of its op, output, attributes and inputs (and, for the reads, of the node behind it: kept
    # apart where a fused gated activation is looked for), computed once per distinct tuple of them
    sets: dict[tuple[Any, ...], int] = {}
    reads: set[tuple[int, ...]] = set()
    # a scope's buckets come one after another with one output and one attributes object (passes.data_parallel):
    # a node like the backward node before it has its working set and reads, found without hashing its inputs
    prev: Node | None = None
    own = 0
    for n in nodes:
        if n.phase is Phase.BACKWARD:
            same = twin_of(prev, n)
            prev = n
            # what it allocates, less what backward has freed of the values kept once by then; a ZeRO-3 /
            # FSDP weight gather's output is the gathered-weights term (``layer`` / ``rest``), not an op's
            gone = freed if schedule is None else _freed_before(schedule, n.id)
            if _fsdp_gather(n):
                w = 0
            else:
                if not same:  # (the one before, of the same op and attributes, was no gather either)
                    key = (n.op, n.out, n.attrs, n.inputs)
                    known = sets.get(key)
                    if known is None:
                        known = sets[key] = _working_set(graph, n, saved, logits)
                    own = known
                w = max(0, own - gone)
            if graph.block_of(n) is None:
                outside = max(outside, w)
            else:
                inside = max(inside, w)
            # the same inputs as the node before: already in ``reads``
            if saved.fused_gated or (not same and n.inputs not in reads):
                reads.add(n.inputs)
                bases = (graph[_base(graph, i)] for i in n.inputs)
                read |= {b.id for b in bases if not (saved.fused_gated and _fused_activation(graph, b, n))}
    ours = {n.id for n in nodes}
    replayed = [n for n in nodes if n.phase is Phase.RECOMPUTE and n.op is not OpKind.VIEW and n.id in read]
    if graph.partial_replay():  # full:every-N on a stage of fewer than N layers replays nothing
        replayed = [n for n in replayed if graph.multiplicity(n)]
    # one layer is replayed at a time: a block of several layers checkpoints each (passes/recompute.py)
    per_layer: dict[str, int] = {}
    for n in replayed:
        if (layer := graph.checkpoint_layer(n)) is not None:
            per_layer[layer] = per_layer.get(layer, 0) + n.out.nbytes
    replay = max(per_layer.values(), default=0)
    if graph.replay_group:
        replay = max(replay, _chunk_replay(graph, replayed))
    # the output layer's replayed logits (vocabulary tiling): one chunk at a time
    outer = [n for n in replayed if graph.checkpoint_layer(n) is None]
    logit_replay = sum(_chunked(n.out.nbytes, n.out.numel, saved, logits) for n in outer)
    elsewhere = any(graph[i].phase is Phase.RECOMPUTE and i not in ours for i in read)
    layer, rest = _gathers(graph, nodes)
    return _WorkingTerms(inside, outside, replay, layer, rest, elsewhere, logit_replay)


def _chunk_replay(graph: Graph, replayed: list[Node]) -> int:
    """Replayed bytes live at once under ``full:uniform-N``: a chunk's layers all replay before its backward, each
    keeping what its backward reads, and the inputs between them (the block's repetitions a chunk covers)."""
    per_block: dict[str, int] = {}
    hidden: dict[str, int] = {}  # a layer's checkpointed input: replayed inside a chunk but for its first layer
    for n in replayed:
        if (prefix := graph.block_of(n)) is None:
            continue
        per_block[prefix] = per_block.get(prefix, 0) + n.out.nbytes
        layer = graph.checkpoint_layer(n)
        for i in n.inputs:
            src = graph[_base(graph, i)]
            if src.phase is Phase.FORWARD and src.inputs and graph.checkpoint_layer(src) != layer:
                hidden[prefix] = max(hidden.get(prefix, 0), src.out.nbytes)
    best = 0
    for prefix, each in per_block.items():
        chunk = graph.replay_chunk(prefix)
        best = max(best, chunk * each + (chunk * graph.layers_per_block(prefix) - 1) * hidden.get(prefix, 0))
    return best


def added_nodes(graph: Graph, base: Graph | None) -> list[Node] | None:
    """The nodes ``graph`` holds after those of ``base``, when it begins with every node of ``base`` as it
    was and in its order (the stage-level passes append gradient reductions, ZeRO gathers and the
    optimizer step to a copy); else None. Kept on ``graph``."""
    if base is None:
        return None
    return graph.derived(("added-nodes", base), lambda: _added(graph, base))


def _added(graph: Graph, base: Graph) -> list[Node] | None:
    # compared as whole lists (ids by value, nodes by identity) in C rather than pair by pair in Python: a search
    # asks once per new stage graph, of a few thousand nodes
    ours, theirs = graph.nodes, base.nodes
    size = len(theirs)
    if len(ours) < size:
        return None
    if list(itertools.islice(ours, size)) != list(theirs):
        return None
    nodes = list(ours.values())
    if not all(map(operator.is_, nodes[:size], theirs.values())):
        return None
    return nodes[size:]


def _added_reads_forward(graph: Graph, base: Graph, added: list[Node]) -> bool:
    """:func:`_reads_forward` of the nodes ``graph`` appends to ``base`` (``added``), kept on ``graph``: its
    activation bytes, their allocator blocks and its working set each ask (a search: once per stage graph)."""
    return graph.derived(("added-reads-forward", base), lambda: _reads_forward(graph, added))


def _reads_forward(graph: Graph, nodes: list[Node]) -> bool:
    """Whether any of ``nodes`` reads a forward value (then what the forward saves, or its names, may change)."""
    # gradient buckets read the same gradients over and over: each distinct input once, a node whose inputs are the
    # node before's (a scope's buckets share one tuple) not read again
    ids: set[int] = set()
    prev: tuple[int, ...] | None = None
    for n in nodes:
        if n.inputs is not prev:
            ids.update(n.inputs)
            prev = n.inputs
    return any(graph[_base(graph, i)].phase is Phase.FORWARD for i in ids)


def _logit_numel(graph: Graph) -> int:
    """Elements of the loss's input (the logits), 0 without a loss."""
    return max((graph[n.inputs[0]].out.numel for n in graph if n.op is OpKind.CROSS_ENTROPY and n.inputs), default=0)


def _chunked(nbytes: int, numel: int, saved: SavedPolicy | None, logits: int) -> int:
    """A logits-sized tensor under vocabulary tiling holds one chunk at a time."""
    if saved is not None and saved.loss_chunks > 1 and logits and numel == logits:
        return nbytes // saved.loss_chunks
    return nbytes


def _working_set(graph: Graph, n: Node, saved: SavedPolicy | None = None, logits: int = 0) -> int:
    """One backward op's output and the gradients flowing into it (its saved inputs are counted already).

    A view allocates nothing: its output is its input's storage. ``logits``: the loss input's size
    under vocabulary tiling (tensors of that size exist one chunk at a time).
    """
    if n.op is OpKind.VIEW:
        return 0
    if isinstance(n.attrs, CollectiveAttrs) and n.attrs.ready >= 0:
        # a PyTorch DDP bucket: its flat buffer is allocated once, when DDP builds (or rebuilds) its buckets
        # (reducer.cpp Reducer::initialize_buckets), and reduced in place each step: no working set of the step
        return 0
    # each input followed to its storage once (a gradient bucket reads hundreds of gradients)
    table = graph.nodes
    grads = {b for b in map(_base, itertools.repeat(graph), n.inputs) if table[b].phase is Phase.BACKWARD}
    out = _chunked(n.out.nbytes, n.out.numel, saved, logits)
    if n.op is OpKind.REDUCE_SCATTER and isinstance(n.attrs, CollectiveAttrs) and n.attrs.size > 1:
        if saved is not None and saved.grad_reduce_per_weight and _grad_reduce(n.attrs):
            # one weight's gradient and its shard at a time (SavedPolicy.grad_reduce_per_weight)
            return max((graph[i].out.nbytes * (1 + n.attrs.size) // n.attrs.size for i in grads), default=0)
        out //= n.attrs.size  # a reduce-scatter hands back one shard of its input
    if n.op is OpKind.CROSS_ENTROPY:
        # eager F.cross_entropy: nll_loss's backward writes a dense gradient over the logits, then
        # log_softmax's backward writes another; a fused or in-place loss says its own bytes per logit
        out = int(n.out.numel * saved.ce_working) if saved is not None and saved.ce_working else 2 * n.out.nbytes
        out = _chunked(out, n.out.numel, saved, logits)
    return out + sum(_chunked(graph[i].out.nbytes, graph[i].out.numel, saved, logits) for i in grads)


def _grad_reduce(attrs: CollectiveAttrs) -> bool:
    """A data-parallel gradient reduction: ZeRO-3 / FSDP's per-layer one or a ZeRO-1/2 bucket."""
    return attrs.axis is Axis.FSDP or attrs.role is Role.GRAD_SYNC


def stage_memory(
    graph: Graph,
    in_flight: int,
    capacity: int,
    local_params: int,
    policy: StatePolicy | None = None,
    comm_groups: int = 0,
    saved: SavedPolicy | None = None,
) -> MemoryBreakdown:
    """Peak memory of one rank of a stage; ``comm_groups`` counts its NCCL communicators.

    ``comm_buffers``: their NCCL buffers and PyTorch DDP's gradient buckets (``StatePolicy.bucket_bytes``)."""
    policy = policy or StatePolicy.for_training("bf16")
    act = activation_bytes(graph, saved) * in_flight
    frag = activation_bytes(graph, saved, blocks=True) * in_flight - act
    step = int(local_params * policy.step_grad_bytes)
    transient = max(transient_bytes(graph, saved), step - act - frag)
    return MemoryBreakdown(
        params=int(local_params * policy.weight_bytes),
        grads=int(local_params * policy.grad_bytes),
        optimizer=int(local_params * policy.optimizer_bytes),
        activations=act,
        transient=transient,
        comm_buffers=comm_groups * NCCL_BUFFERS_PER_GROUP + int(local_params * policy.bucket_bytes),
        fragmentation=frag,
        capacity=capacity,
        step_grads=step,
    )


def _fsdp_gather(n: Node) -> bool:
    return n.op is OpKind.ALL_GATHER and isinstance(n.attrs, CollectiveAttrs) and n.attrs.axis is Axis.FSDP


def _gathers(graph: Graph, nodes: list[Node]) -> tuple[int, int]:
    """The largest ZeRO-3 / FSDP all-gather of ``nodes`` inside the layers and outside them (bytes gathered)."""
    layer = rest = 0
    for n in nodes:
        if _fsdp_gather(n):
            assert isinstance(n.attrs, CollectiveAttrs)
            if graph.block_of(n) is None:
                rest = max(rest, n.attrs.bytes)
            else:
                layer = max(layer, n.attrs.bytes)
    return layer, rest
