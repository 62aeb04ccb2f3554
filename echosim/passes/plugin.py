"""The built-in passes register through the same hook a plugin's pass uses, in pipeline order.

This is the one place that reads a plan into pass options. Graph-level passes rewrite the
whole model before the pipeline split; stage-level passes run on each pipeline stage after
it. Each registration names the pass it follows, so a plugin can slot its own in between
(``after="autodiff", before="recompute"``).
"""

from __future__ import annotations

from typing import Any

from echosim.plugins import hookimpl
from echosim.plugins.hookspecs import RegisterPass


def _attention(plan: Any) -> object:
    from echosim.frameworks import get_framework
    from echosim.passes.attention import AttentionKernel

    framework = get_framework(plan.framework)
    reference = framework.norm_kernels == "reference"
    padded = bool(framework.attention_unpad)
    loss = framework.loss_kernel
    repeat_kv = bool(framework.attention_repeat_kv)
    return AttentionKernel(
        plan.attention == "flash",
        framework.attention_kernel,
        reference,
        padded,
        loss,
        repeat_kv,
        plan.splash_blocks,
        plan.fp8_attention,
    )


def _context(plan: Any) -> object:
    from echosim.frameworks import get_framework
    from echosim.passes.context_parallel import ContextParallel

    framework = get_framework(plan.framework)
    torch, waited = bool(framework.cp_torch), bool(framework.compiled_collectives)
    return ContextParallel(plan.cp, plan.cp_comm, plan.cp_balance, torch, torch and waited, tp=plan.tp, a2a=plan.cp_a2a)


def _context_backward(plan: Any) -> object:
    from echosim.frameworks import get_framework
    from echosim.passes.context_parallel import ContextParallelBackward

    return ContextParallelBackward(bool(get_framework(plan.framework).cp_torch))


def _tensor(plan: Any) -> object:
    from echosim.passes.tensor_parallel import TensorParallel

    return TensorParallel(plan.tp, sequence_parallel=plan.sp, expert_tp=plan.expert_tp)


#: The rows a Transformer Engine recipe aligns each grouped-GEMM segment to, by plan dtype (echosim.passes.
#: expert_parallel, ``quant_pad``): "32 for MXFP8, 128 for NVFP4, 16 for other built-in recipes" (Fp8Padding's
#: docstring, transformer_engine/pytorch/module/fp8_padding.py; Megatron-Core's get_fp8_align_size: 32 for the
#: mxfp8 recipe, else 16, megatron/core/fp8_utils.py core_v0.15.0).
QUANT_ALIGN_ROWS = {"fp8": 16, "mxfp8": 32, "nvfp4": 128}


def _expert(plan: Any) -> object:
    from echosim.frameworks import get_framework
    from echosim.passes.expert_parallel import ExpertParallel

    framework = get_framework(plan.framework)
    groups = (plan.moe_router_groups, plan.moe_router_group_topk)
    padded = bool(framework.moe_capacity_padding) and plan.moe_capacity_factor > 0
    # TEGroupedMLP's Fp8Padding / Fp8Unpadding copies, unless HybridEP's dispatch aligns the rows itself
    copies = bool(framework.moe_quant_padding) and plan.moe_dispatcher != "hybridep"
    quant_pad = QUANT_ALIGN_ROWS.get(plan.dtype, 0) if copies else 0
    return ExpertParallel(
        plan.ep, plan.moe_capacity_factor, plan.moe_imbalance, plan.moe_dispatcher, groups, padded, plan.seq_len,
        quant_pad, plan.moe_pad_to_capacity,
    )  # fmt: skip


def _embedding_sharding(plan: Any) -> object | None:
    from echosim.passes.embedding_sharding import EmbeddingSharding, ShardingError

    if plan.embedding_sharding == "none":
        EmbeddingSharding(plan.embedding_sharding, plan.dp)  # an unknown type is refused even so
        return None
    if plan.tp * plan.pp * plan.cp > 1:
        raise ShardingError("--embedding-sharding shards tables over data-parallel ranks only (tp = pp = cp = 1)")
    return EmbeddingSharding(plan.embedding_sharding, plan.dp)


def _autocast(plan: Any) -> object | None:
    from echosim.frameworks import get_framework
    from echosim.ir.types import DType
    from echosim.passes.autocast import Autocast

    if not get_framework(plan.framework).autocast or plan.dtype not in ("bf16", "fp16"):
        return None
    return Autocast(DType.parse(plan.dtype))


def _autodiff(plan: Any) -> object:
    from echosim.frameworks import get_framework
    from echosim.passes.autodiff import Autodiff

    # autocast's graphs mix dtypes: the autograd engine casts each gradient to its input's dtype
    framework = get_framework(plan.framework)
    return Autodiff(cast_grads=bool(framework.autocast), layout_copies=bool(framework.layout_copies))


def _recompute(plan: Any) -> object:
    from echosim.frameworks import get_framework
    from echosim.passes.recompute import Recompute

    return Recompute(get_framework(plan.framework).recompute_policy(plan.recompute), plan.loss_chunks)


def _fp8(plan: Any) -> object | None:
    from echosim.frameworks import get_framework
    from echosim.passes.precision import Fp8Linears

    if plan.dtype not in ("fp8", "mxfp8", "nvfp4", "int8"):
        return None
    dispatch = plan.dtype == "fp8" and bool(get_framework(plan.framework).fp8_dispatch)
    return Fp8Linears(plan.dtype, dispatch=dispatch)


def _fused_mlp(plan: Any) -> object | None:
    from echosim.passes.fused_mlp import FusedExpertMlp

    return FusedExpertMlp() if plan.moe_fused_mlp else None


def _data_parallel(plan: Any) -> object:
    from echosim.frameworks import get_framework, weights_16bit_dtype
    from echosim.ir.types import DType
    from echosim.passes.data_parallel import (
        DEEPSPEED_MAX_REUSE_DISTANCE,
        MEGATRON_BUCKET_PARAMS,
        DataParallel,
        megatron_bucket_params,
    )
    from echosim.passes.memory import StatePolicy

    # Megatron reduces fp32 main grads in its buckets (ZeRO 0-2: DataParallel.reduce_dtype's default). ZeRO-3 /
    # FSDP (DataParallel._fsdp) reduces in the parameters' dtype unless the framework's mixed precision casts the
    # gradients to fp32 first (Framework.fsdp_reduce_fp32), and gathers the compute dtype's weights: 16-bit under an
    # FP8 / MXFP8 / NVFP4 recipe, which quantises only the GEMMs' operands. MaxText too, though it stores
    # weight_dtype float32: XLA converts the sharded parameter before the all-gather (MaxText's compiled reference,
    # tests/utils/reference_hlo_llama3_8b.txt at commit e591f30: every layer weight is a bf16 all-gather of a
    # dynamic-slice_convert_fusion of the bf16 sharded stack; tests/test_maxtext_fsdp_dtype.py)
    framework = get_framework(plan.framework)
    # ZeRO 0-2 reduce the gradient buffer in the dtype it is kept in, the one the memory model counts
    # (StatePolicy.for_training): fp32 main grads by default (Megatron's for bf16: "bfloat16 requires gradient
    # accumulation and all-reduce to be done in fp32", megatron/training/arguments.py, commit d98e8a6), the weights'
    # 16 bits where the framework or the run keeps them so (NeMo's and Megatron-Bridge's performance scripts:
    # grad_reduce_in_fp32=False; DeepSpeed's grad_accum_dtype; --grad-dtype; --optimizer-dtypes main_grads=bf16).
    # Megatron-Core's DDP builds its buffer and its buckets' collectives in that one dtype (``grad_dtype =
    # torch.float if ddp_config.grad_reduce_in_fp32 else param.dtype``, distributed_data_parallel.py).
    kept = StatePolicy.for_training(
        plan.dtype, **framework.state(plan.pp, plan.grad_dtype, plan.zero, plan.dtype),
        optimizer_dtypes=plan.optimizer_dtypes,
    )  # fmt: skip
    reduce = DType.FP32 if kept.grad_bytes >= 4 else DType(weights_16bit_dtype(plan.dtype))
    # An eager framework's DDP wrapper (PyTorch DDP's reducer; apex's for apex-ddp) reduces whole model replicas:
    # plain PyTorch has no tensor, pipeline, context or expert parallelism of its own, so a layout that splits
    # the model stands for a framework that does (Megatron-Core's DDP, per-layer buckets as before). The
    # reducer's buckets (DataParallel.torch_ddp) and its copies both follow from this one predicate.
    split = max(plan.tp, plan.pp, plan.cp, plan.ep) > 1
    reducer = plan.zero == 0 and not split
    torch_ddp = reducer and bool(framework.ddp_buckets)
    # The reducer copies gradients into its buckets (gradient_as_bucket_view=False). TorchRec wraps the dense part
    # of a sharded model in DDP with gradient_as_bucket_view=True (DefaultDataParallelWrapper._ddp_wrap,
    # torchrec/distributed/model_parallel.py), so its gradients are bucket views and nothing is copied. Nor does
    # Megatron-Core's DDP copy: param.main_grad is a view into its contiguous gradient buffer, which the backward
    # hook accumulates into and the bucket's collective reduces in place (_ParamAndGradBuffer.__init__,
    # "param.main_grad = self._get(..., buffer_type=BufferType.GRAD)", and
    # DistributedDataParallel._make_backward_post_hook, megatron/core/distributed/param_and_grad_buffer.py and
    # distributed_data_parallel.py, Megatron-LM commit d98e8a6; a copy only for the parameters named in
    # param_name_patterns_for_fp32_local_accumulation, empty by default: distributed_data_parallel_config.py)
    torchrec = plan.embedding_sharding != "none"
    copies = reducer and not torchrec and bool(framework.ddp_bucket_copies)
    fsdp_reduce = DType.FP32 if framework.fsdp_reduce_fp32 else None
    if plan.fsdp_reduce_dtype:  # the run's own choice (FSDP2's reduce_dtype, Megatron-FSDP's grad comm dtype)
        fsdp_reduce = DType(plan.fsdp_reduce_dtype)
    per_param = bool(framework.zero3_per_param)
    # DeepSpeed's activation checkpointing replays each sub-module's forward, whose hooks gather again
    reuse = DEEPSPEED_MAX_REUSE_DISTANCE if per_param and plan.recompute == "full" else 0
    # FSDP1's FlatParameter: SHARD_GRAD_OP (ZeRO-2) and FULL_SHARD (ZeRO-3) share its gradient path
    flat = plan.zero in (2, 3) and bool(framework.fsdp_flat_grads)
    # FSDP2 under a pipeline keeps its parameters and gradients unsharded between micro-batches
    # (Framework.pp_unsharded): it gathers and reduces once a step, not once a micro-batch, so no copies here
    fsdp2 = plan.zero == 3 and bool(framework.fsdp2_copies) and not (plan.pp > 1 and framework.pp_unsharded)
    # gradients are reduced over the dp x cp ranks of a stage: every CP rank computes partial weight gradients of
    # the same weights from its part of the sequence. Megatron-Core's DDP and distributed optimizer take the
    # data-parallel group "with context parallel" (ProcessGroupCollection.setup_process_groups_for_ddp,
    # megatron/core/process_groups_config.py: dp_cp_group = get_data_parallel_group(with_context_parallel=True);
    # DistributedDataParallel builds its gradient buffers on intra_dp_cp_group, distributed_data_parallel.py);
    # torchtitan's FSDP shards over the "fsdp" mesh of dp_shard x cp ranks, on whenever cp > 1
    # (ParallelDims.fsdp_enabled, torchtitan/distributed/parallel_dims.py). So with dp = 1 and cp > 1 too.
    # (Megatron-LM commit d98e8a6, torchtitan commit b5bcd76.)
    replicas = plan.dp * plan.cp
    buckets = megatron_bucket_params(replicas) if framework.ddp_bucket_dp_scaled else MEGATRON_BUCKET_PARAMS
    return DataParallel(
        replicas, bucket_params=buckets, zero=plan.zero, reduce_dtype=reduce, fsdp_reduce_dtype=fsdp_reduce,
        bucket_copies=copies, per_param=per_param, reuse_distance=reuse, flat_grads=flat, fsdp2_copies=fsdp2,
        torch_ddp=torch_ddp, offload_params=plan.offload_params,
    )  # fmt: skip


def _optimizer(plan: Any) -> object:
    from echosim.frameworks import get_framework
    from echosim.passes.data_parallel import Optimizer, optimizer_step_bytes

    # ZeRO shards over every gradient replica, dp x cp: Megatron-Core's distributed optimizer is built on
    # intra_dp_cp_group (get_megatron_optimizer, megatron/core/optimizer/__init__.py), FSDP on dp_shard x cp
    shard = plan.dp * plan.cp if plan.zero >= 1 else 1
    # a routed expert's replicas are its expert-data-parallel ranks, tp*cp*dp/(etp*ep) (Megatron-Core's distributed
    # optimizer keeps expert parameters in their own buffers over that group; the memory model shards them so too)
    experts = plan.expert_dp if plan.zero >= 1 else 1
    framework = get_framework(plan.framework)
    # under autocast the optimizer steps the fp32 parameters themselves: no master copy, no 16-bit copy to write
    mixed = plan.dtype != "fp32" and not framework.autocast
    per_param = framework.optimizer_bytes
    # (main gradients in main_grads's dtype, as the constant; without a master copy the moments' dtypes move memory
    # only: the step's traffic stays the constant's)
    if not per_param and mixed and framework.master_copy(plan.dtype) and plan.optimizer_dtypes:
        per_param = optimizer_step_bytes(plan.dtype, plan.optimizer_dtypes, bool(framework.precision_aware_optimizer))
    return Optimizer(shard=shard, mixed_precision=mixed, expert_shard=experts, bytes_per_param=per_param,
                     host_ranks=plan.world if plan.offload_optimizer else 0,
                     overlapped=plan.offload_optimizer and plan.offload_overlap)  # fmt: skip


def _gradient_groups(plan: Any) -> object:
    from echosim.passes.gradient_groups import GradientGroups

    # the data-parallel pass reduces over dp x cp ranks; routed experts' share over tp x dp x cp / (etp x ep)
    return GradientGroups(plan.ep, plan.tp // plan.expert_tp)


def _classes() -> dict[str, type]:
    from echosim.passes.attention import AttentionKernel
    from echosim.passes.autocast import Autocast
    from echosim.passes.autodiff import Autodiff
    from echosim.passes.context_parallel import ContextParallel, ContextParallelBackward
    from echosim.passes.data_parallel import DataParallel, Optimizer
    from echosim.passes.embedding_sharding import EmbeddingSharding
    from echosim.passes.expert_parallel import ExpertParallel
    from echosim.passes.fused_mlp import FusedExpertMlp
    from echosim.passes.gradient_groups import GradientGroups
    from echosim.passes.precision import Fp8Linears
    from echosim.passes.recompute import Recompute
    from echosim.passes.tensor_parallel import TensorParallel

    classes: list[type] = [
        AttentionKernel, ContextParallel, TensorParallel, ExpertParallel, EmbeddingSharding, Autocast, Autodiff,
        ContextParallelBackward,
        Recompute, Fp8Linears, FusedExpertMlp, DataParallel, Optimizer, GradientGroups,
    ]  # fmt: skip
    return {cls.name: cls for cls in classes}  # type: ignore[attr-defined]


#: (name, configure, level), in the order they run.
BUILTIN_PASSES: tuple[tuple[str, Any, str], ...] = (
    ("attention-kernel", _attention, "graph"),
    ("context-parallel", _context, "graph"),
    ("tensor-parallel", _tensor, "graph"),
    ("expert-parallel", _expert, "graph"),
    ("embedding-sharding", _embedding_sharding, "graph"),
    ("autocast", _autocast, "graph"),
    ("autodiff", _autodiff, "graph"),
    ("context-parallel-backward", _context_backward, "graph"),
    ("recompute", _recompute, "graph"),
    ("fp8-linears", _fp8, "graph"),
    ("fused-expert-mlp", _fused_mlp, "graph"),
    ("data-parallel", _data_parallel, "stage"),
    ("optimizer", _optimizer, "stage"),
    ("gradient-groups", _gradient_groups, "stage"),
)


@hookimpl
def register_passes(register: RegisterPass) -> None:
    classes = _classes()
    previous: dict[str, str] = {}
    for name, configure, level in BUILTIN_PASSES:
        after = (previous[level],) if level in previous else ()
        register(name, classes[name], configure=configure, level=level, after=after)
        previous[level] = name
