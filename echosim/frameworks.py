"""The training frameworks echosim knows, and the defaults each one applies to what a run leaves unsaid.

Data, one entry per framework: a layout setting a user (or a published row) does not give
takes the framework's own default, each cited with the file and version it comes from.
``eager`` is plain PyTorch autograd with no framework: no defaults beyond the Plan's own.
A leaf below :mod:`echosim.plan`: the plan names a framework, and the compiler, the passes
and validation read its entry from here.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any

from echosim.errors import EchosimError

DEFAULT_FRAMEWORK = "eager"


def weights_16bit_dtype(dtype: str) -> str:
    """The 16-bit dtype of the weights when training in ``dtype``: fp16 under fp16, else bf16 (the fp8, mxfp8 and
    nvfp4 recipes quantise only the GEMMs' operands of bf16 weights)."""
    return "fp16" if dtype == "fp16" else "bf16"


class FrameworkError(EchosimError):
    """An unknown framework name; the message names the known ones."""


@dataclass(frozen=True)
class Default:
    """One setting a framework applies when the run does not give it.

    ``when_above_one`` names a Plan field that must exceed 1 for the default to apply
    (sequence parallelism only exists with tensor parallelism). ``arch`` limits a model
    default to one architecture family (the GPT tokenizer is GPT models' default);
    ``not_arch`` keeps a layout default off one family's models (a run whose family is not
    known takes it).
    """

    field: str
    value: Any
    source: str
    when_above_one: str = ""
    arch: str = ""
    not_arch: str = ""


@dataclass(frozen=True)
class Framework:
    name: str
    title: str
    version: str  # the version whose code and docs the defaults below are read from
    defaults: tuple[Default, ...] = ()
    row_names: tuple[str, ...] = ()  # prefixes of cases.csv's ``framework`` column that mean this framework
    # memory behaviour, each a citation ('' = eager PyTorch's): the gated MLP's activation fused into
    # one kernel that saves only its input; weights kept in fp32 with no separate master copy
    fused_gated: str = ""
    fp32_weights: str = ""
    ce_saved: float = 0.0  # the loss over the vocabulary: bytes per logit kept for backward (0: eager's)
    ce_working: float = 0.0  # ... and allocated by its backward
    ce_source: str = ""
    ce_working_tp: float = 0.0  # ... allocated by its backward when tp > 1 splits the vocabulary (0: ce_working)
    ce_tp_source: str = ""

    def loss_working(self, tp: int) -> float:
        """Bytes per logit the loss's backward allocates under ``tp``-way tensor parallelism."""
        return self.ce_working_tp if tp > 1 and self.ce_working_tp else self.ce_working

    selective: str = ""  # the recompute policy this framework's "selective" means ('' = Megatron's)
    selective_source: str = ""

    def recompute_policy(self, name: str) -> str:
        """The policy a plan's ``recompute`` names under this framework."""
        return self.selective if name == "selective" and self.selective else name

    pp_unsharded: str = ""  # FSDP under a pipeline keeps weights and gradients unsharded across micro-batches
    grads_16bit: str = ""  # gradients accumulated and reduced in the weights' 16-bit dtype, not fp32
    # ... under ZeRO (any stage) or fp16 only: DeepSpeed's grad_accum_dtype default, fp32 for bf16 without ZeRO
    grads_16bit_under_zero: str = ""
    # ... under fp16 only: Megatron's --accumulate-allreduce-grads-in-fp32 is off unless given, and bf16 turns it on
    grads_16bit_under_fp16: str = ""
    probs_in_experts: str = ""  # MoE router weights applied in the experts' activation, not at the combine
    # Activations an FP8 run caches in fewer bytes than the IR's ops keep them ('' = as kept), and where that is
    # documented: the MoE layers' SwiGLU inputs in FP8 with one fp32 scale per 1x128 tile
    # (SavedPolicy.gated_inputs_bytes), and the attention output kept once in a 12-bit format for both its
    # readers, the attention's backward and the output projection's weight gradient (SavedPolicy.attention_out_bytes)
    fp8_gated_inputs: str = ""
    attention_out_12bit: str = ""
    # FP8 runs: the MoE dispatch, and the combine's gradient in backward, move FP8 rows with their scales
    # (echosim.passes.precision.Fp8Linears, ``dispatch``; '' = the rows' 16 bits), and where that is documented
    fp8_dispatch: str = ""
    weights_16bit: str = ""  # 16-bit weights, gradients and optimizer moments, no master copy
    fsdp_reduce_fp32: str = ""  # ZeRO-3 / FSDP reduce-scatters gradients in fp32, not the parameters' 16 bits
    # FSDP1's FlatParameter gradient path: each FSDP unit's gradients are concatenated into one flat gradient
    # by autograd, cast to the reduce dtype and pre-divided in place before its reduce-scatter, all on the
    # device (echosim.passes.data_parallel, ``flat_grads``; '' = no such kernels)
    fsdp_flat_grads: str = ""
    # FSDP2's copies around its collectives: each all-gather's output copied out into the unsharded parameters,
    # each unit's gradients copied (and cast to the reduce dtype) into the reduce-scatter input
    # (echosim.passes.data_parallel, ``fsdp2_copies``; '' = none)
    fsdp2_copies: str = ""

    def state(self, pp: int = 1, grad_dtype: str = "", zero: int = 0, dtype: str = "") -> dict[str, bool]:
        """Keyword arguments of :meth:`echosim.passes.memory.StatePolicy.for_training` for this framework;
        ``grad_dtype``: the run's gradient buffer (``Plan.grad_dtype``) where it sets one; ``zero`` and ``dtype``:
        the run's ZeRO stage and precision, which DeepSpeed's default gradient dtype follows."""
        out = {"fp32_weights": True} if self.fp32_weights else {}
        if self.weights_16bit:
            out["weights_16bit"] = True
        if grad_dtype:
            out["fp32_grads"] = grad_dtype == "fp32"
        elif (
            self.grads_16bit
            or (self.grads_16bit_under_zero and (zero >= 1 or dtype == "fp16"))
            or (self.grads_16bit_under_fp16 and dtype == "fp16")
        ):
            out["fp32_grads"] = False
        if pp > 1 and self.pp_unsharded:
            out["unsharded_between_microbatches"] = True
        if self.precision_aware_optimizer:
            out["te_optimizer"] = True
        return out

    def master_copy(self, dtype: str) -> bool:
        """Whether training in ``dtype`` keeps 16-bit weights with a separate fp32 master copy (not fp32 training,
        fp32 weights cast for compute, nor MaxText's 16-bit weights alone): what ``Plan.optimizer_dtypes`` can lower
        besides Adam's moments."""
        return dtype != "fp32" and not (self.fp32_weights or self.weights_16bit)

    # ---- timing behaviour (step time, not memory): the kernels the framework calls ----
    # The flash-attention kernel when it is not the device's best ('' = the best: FA3 on Hopper, cuDNN
    # on Blackwell; "fa2" = FlashAttention-2; "te" = the one Transformer Engine's DotProductAttention picks:
    # cuDNN's fused attention from Hopper on, FlashAttention-2 on Ampere), and where that is documented.
    attention_kernel: str = ""
    attention_source: str = ""
    # The RMSNorm the framework runs ('' = one fused kernel; "reference" = the Llama reference module op by
    # op under eager autograd: echosim.passes.flops.REFERENCE_RMSNORM), and where that is documented.
    norm_kernels: str = ""
    norm_source: str = ""
    # The framework calls a varlen flash kernel on padded (batch, seq) tensors: q, k and v are gathered into
    # the packed layout and the output scattered back, by copy kernels each way ('' = the kernel takes the
    # padded tensors; echosim.ir.ops.VARLEN_PAD_COPIES), and where that is documented.
    attention_unpad: str = ""
    # The model expands K and V to the query heads by copies before the attention kernel (grouped-query
    # attention without the kernel's own GQA support; echosim.ir.ops.AttentionAttrs.repeat_kv), and where
    # that is documented ('' = the kernel reads the K/V heads as they are).
    attention_repeat_kv: str = ""
    # The cross-entropy kernels the framework calls over the logits, a key of echosim.ir.ops.LOSS_KERNEL_BYTES
    # ('' = one pass in and the gradient out), and where that is documented.
    loss_kernel: str = ""
    loss_source: str = ""

    # Data parallelism without ZeRO through PyTorch DDP's reducer with its default
    # gradient_as_bucket_view=False: every gradient is copied into its flat bucket, divided by the
    # world size on the way, and the reduced bucket is copied back into .grad ('' = no such copies). Only over
    # whole model replicas: a layout that splits the model stands for Megatron-Core's DDP, whose gradients are
    # views of its buffer (echosim.passes.plugin._data_parallel, one predicate with ddp_buckets).
    ddp_bucket_copies: str = ""
    # ZeRO 0 through PyTorch DDP's reducer: its gradient buckets (bucket_cap_mb, the first bucket's cap, in the
    # order gradients become ready: echosim.passes.data_parallel.ddp_bucket_assignment), where they come from
    # ('' = one repeated layer's gradients at a time, Megatron's rule)
    ddp_buckets: str = ""
    # Megatron-Core's DDP sizes its gradient buckets by the data-parallel group: max(40M, 1M x dp x cp) parameters
    # (echosim.passes.data_parallel.megatron_bucket_params; '' = 40M parameters, Megatron-LM's fixed default)
    ddp_bucket_dp_scaled: str = ""
    # The forward runs under torch.autocast over fp32 parameters: autocast's op lists pick each op's dtype and
    # cast its inputs (echosim.passes.autocast); the optimizer steps the fp32 parameters (no master copy)
    # ('' = the model runs in the plan's dtype throughout, as frameworks that keep 16-bit parameters do).
    autocast: str = ""
    # Autograd runs op by op: a gradient that reaches a view's backward in an order its strides cannot reshape
    # is copied (the unbind of a fused q/k/v projection: its gradients stacked head-major, then reshaped back
    # into the projection's rows; echosim.passes.autodiff._strided_view) ('' = the framework's compiled or
    # fused kernels write the gradient in the layout its consumer reads), and where that is documented.
    layout_copies: str = ""

    # ZeRO-3 as DeepSpeed ran it before its v0.5.6 parameter all-gather rework ('' = per layer, prefetched
    # beside compute, as FSDP does): one all_gather and one reduce_scatter per parameter tensor, each behind a
    # device-wide synchronize and each through PyTorch's list collectives (echosim.passes.data_parallel).
    zero3_per_param: str = ""

    # The optimizer step's bytes per local parameter when the framework's optimizer is not a fused Adam
    # (0: echosim.passes.data_parallel's fused-Adam figures), and where its kernels are documented.
    optimizer_bytes: int = 0
    # Megatron-Core's precision-aware optimizer (Transformer Engine's FusedAdam with lower-precision master and
    # moments: Plan.optimizer_dtypes), where the framework has it ('' = it has not), and where that is documented
    precision_aware_optimizer: str = ""
    optimizer_source: str = ""

    # MoE with a capacity factor: every expert padded to its capacity, tokens dispatched and combined by
    # one-hot einsums ('' = Megatron-Core's dropping: rows over capacity dropped, the rest permuted, no
    # padding; echosim.passes.expert_parallel, ``padded``), and where that is documented.
    moe_capacity_padding: str = ""
    # MoE under an fp8 / mxfp8 / nvfp4 recipe: the routed rows copied into GEMM-aligned per-expert segments
    # before the grouped GEMMs and back after them, forward and backward (echosim.passes.expert_parallel,
    # ``quant_pad``; '' = no such copies), and where that is documented.
    moe_quant_padding: str = ""

    # Context parallelism through PyTorch's experimental context_parallel (SDPA dispatched to its ring
    # attention; echosim.passes.context_parallel, ``torch``) instead of Transformer Engine's ('' = TE's),
    # and where that is documented; ``compiled_collectives``: the block that issues those exchanges is
    # compiled whole, so each is waited on where it is issued ('' = eager: waited at first use).
    cp_torch: str = ""
    compiled_collectives: str = ""

    # Model settings the framework fills when a run does not state them (the tokenizer's vocabulary).
    model_defaults: tuple[Default, ...] = ()
    vocab_multiple: int = 1  # the embedding rows a tokenizer's vocabulary is padded to a multiple of, x tp

    def model_default(self, field: str, arch: str) -> Default | None:
        """The framework's default for a model setting of an ``arch`` model, if it has one."""
        for d in self.model_defaults:
            if d.field == field and d.arch in ("", arch):
                return d
        return None

    def padded_vocab(self, vocab: int, tp: int) -> int:
        """The embedding rows for a tokenizer of ``vocab`` tokens (Megatron's _vocab_size_with_padding)."""
        multiple = self.vocab_multiple * max(1, tp)
        return -(-vocab // multiple) * multiple

    def defaults_for(self, given: Collection[str], plan: Any, arch: str = "") -> dict[str, Any]:
        """The defaults that apply to ``plan`` of an ``arch`` model ('' = not known): fields not ``given``,
        conditions met."""
        out: dict[str, Any] = {}
        for d in self.defaults:
            if d.field in given:
                continue
            if d.when_above_one and getattr(plan, d.when_above_one, 1) <= 1:
                continue
            if d.not_arch and arch == d.not_arch:
                continue
            out[d.field] = d.value
        return out


_MEGATRON_ARGS = "Megatron-LM megatron/training/arguments.py (commit d98e8a6)"
# Megatron-Core's TEDotProductAttention is Transformer Engine's DotProductAttention, whose backend selection
# prefers FusedAttention (cuDNN) to FlashAttention on compute capability 9.0 and later whenever both can run.
_TE_ATTENTION = (
    "TEDotProductAttention -> transformer_engine DotProductAttention; get_attention_backend: 'Disabling "
    "FlashAttention to give FusedAttention preference on Hopper+ for performance reasons' (TE v1.2 to v1.13 "
    "transformer_engine/pytorch/attention.py on sm90; v2.0 to v2.18 on sm90 and later, the same file, then "
    "pytorch/dot_product_attention/utils.py from v2.2 and pytorch/attention/dot_product_attention/utils.py from v2.3)"
)
_BRIDGE = "Megatron-Bridge (commit 067f987)"
_VOCAB_CE = dict(
    ce_saved=4.0,
    ce_working=2.0,
    ce_source="vocab-parallel cross-entropy upcasts this rank's vocabulary slice to fp32 and keeps the "
    "softmax in it for backward, which writes the gradient in place and hands back a 16-bit copy; the "
    "16-bit logits are dropped (megatron/core/tensor_parallel/cross_entropy.py, commit d98e8a6)",
)
# The loss kernels Megatron-Core runs: the unfused VocabParallelCrossEntropy unless cross_entropy_loss_fusion.
_UNFUSED_LOSS = dict(
    loss_kernel="unfused",
    loss_source="cross_entropy_loss_fusion defaults to False (megatron/core/model_parallel_config.py; "
    f"--cross-entropy-loss-fusion off unless given, {_MEGATRON_ARGS}), so compute_language_model_loss calls "
    "tensor_parallel.vocab_parallel_cross_entropy: the eager fp32 kernels of echosim.ir.ops.LOSS_KERNEL_BYTES "
    "(megatron/core/models/common/language_module/language_module.py, commit d98e8a6)",
)
_MOE_PROBS = (
    "Megatron-Core applies the router's probabilities inside the experts: TEGroupedMLP passes "
    "permuted_probs to weighted_bias_swiglu_impl between fc1 and fc2 (megatron/core/transformer/moe/"
    "experts.py), and the token dispatcher's unpermute takes no probabilities (token_dispatcher.py), so "
    "the combine's backward is a gather that keeps nothing (Megatron-LM commit d98e8a6)"
)
_MOE_QUANT_PAD = (
    "TEGroupedMLP pads each local expert's rows with Transformer Engine's Fp8Padding before fc1 and strips them "
    "with Fp8Unpadding after fc2 under an FP8 recipe (megatron/core/transformer/moe/experts.py, TEGroupedMLP."
    "forward, core_v0.14.0 and core_v0.15.0; FP4 too from core_v0.16.0), unless the router or the HybridEP "
    "dispatcher already aligned them (moe_router_padding_for_fp8, off in the recipes; skip_routed_expert_padding "
    "at commit d98e8a6)"
)
_PRECISION_AWARE = (
    "--use-precision-aware-optimizer with --main-grads-dtype, --main-params-dtype, --exp-avg-dtype, --exp-avg-sq-dtype "
    "(megatron/training/arguments.py; Transformer Engine's FusedAdam, megatron/core/optimizer/__init__.py and "
    "optimizer_config.py, Megatron-LM commit d98e8a6); Megatron-Bridge's OptimizerConfig takes the same fields, and "
    "its DeepSeek and Qwen3 MoE performance recipes set them (perf_recipes/deepseek/common.py, commit 067f987)"
)
# DeepSeek-V3's report, on what its FP8 framework keeps for backward (arXiv:2412.19437, sec. 3.3.3)
_DSV3_CACHES = "DeepSeek-V3 report (arXiv:2412.19437), sec. 3.3.3 'Low-Precision Storage and Communication'"
_SWIGLU = (
    "megatron/core/fusions/fused_bias_swiglu.py: SwiGLUFunction saves only its input and recomputes "
    f"SiLU in backward; on unless --no-bias-swiglu-fusion ({_MEGATRON_ARGS})"
)
# Megatron trains GPT models on the GPT-2 BPE tokenizer unless told otherwise: pretrain_gpt.py passes
# args_defaults={'tokenizer_type': 'GPT2BPETokenizer'}, NeMo-Framework-Launcher's GPT-3 data
# preparation uses tokenizer_type GPT2BPETokenizer; GPT-2's vocabulary has 50,257 tokens. The
# embedding is padded to a multiple of --make-vocab-size-divisible-by (default 128) x tp.
_GPT2_VOCAB = Default(
    "vocab",
    50257,
    "GPT2BPETokenizer (Megatron-LM pretrain_gpt.py args_defaults; NeMo-Framework-Launcher GPT-3 data "
    "preparation), GPT-2's 50,257 tokens",
    arch="gpt",
)
_VOCAB_MULTIPLE = 128  # --make-vocab-size-divisible-by default (_MEGATRON_ARGS), times tp

# Megatron-Core's default gradient bucket (DistributedDataParallelConfig.bucket_size = None): resolved to
# max(40000000, 1000000 * dp_cp size) parameters before the DDP wrapper is built.
_MCORE_BUCKETS = (
    "bucket_size=None resolves to max(40000000, 1000000 * dp_cp size) parameters, 'larger DP sizes need larger "
    "buckets to ensure collectives do not become latency-bound' (megatron/core/distributed/"
    "distributed_data_parallel_config.py, megatron/training/training.py resolve_ddp_bucket_size, Megatron-LM commit "
    "d98e8a6; since commit 0fda386, core_v0.7.0; Megatron-Bridge's dist_utils the same)"
)

# What torchtitan (with or without torch.compile) keeps between micro-batches and saves for backward.
_TORCHTITAN_MEMORY: dict[str, str] = dict(
    pp_unsharded="reshard_after_forward_policy 'default' is not pp_enabled (torchtitan/distributed/"
    "fsdp.py, commit b5bcd76); torch.distributed.pipelining's stage calls set_requires_gradient_sync"
    "(False) before all but the last backward, and FSDP2 accumulates those unsharded gradients in "
    "reduce_dtype (fp32 in torchtitan)",
    selective="op",
    selective_source="activation_checkpoint mode 'selective' with selective_ac_option 'op' "
    "(torchtitan/models/llama3/train_configs/llama3_8b.toml, 2024-2025; SelectiveAC in "
    "torchtitan/models/llama3/config_registry.py, commit b5bcd76)",
    fp32_weights="FSDP2 keeps the sharded parameters in fp32 and casts to bf16 for compute "
    "(mixed_precision_param = 'bfloat16', torchtitan/config/configs.py, commit b5bcd76); AdamW "
    "states follow the fp32 parameters",
)

# How torchtitan's FSDP2 moves gradients and parameters (step time, not memory).
_TORCHTITAN_FSDP2: dict[str, str] = dict(
    fsdp_reduce_fp32="torchtitan's FSDP2 MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32): "
    "--training.mixed_precision_reduce defaults to 'float32', its only choice (torchtitan/config_manager.py, "
    "commit 9dec370; mixed_precision_reduce = 'float32' in torchtitan/config/configs.py, commit b5bcd76)",
    fsdp2_copies="FSDP2 (torch 2.4-2.6 torch/distributed/_composable/fsdp/_fsdp_collectives.py): "
    "foreach_all_gather_copy_out copies each all-gather's output into the unsharded parameters with "
    "split_with_sizes_copy, and foreach_reduce copies the unit's gradients into the reduce-scatter input of "
    "reduce_dtype with chunk_cat (foreach_reduce_scatter_copy_in); with a float32 reduce_dtype no division kernel "
    "(_get_gradient_divide_factors returns None, NCCL averages)",
)

_TORCHTITAN_FSDP = Default(
    "zero",
    3,
    "FSDP2 over every data-parallel rank: data_parallel_shard_degree = -1 "
    "(torchtitan/config/configs.py, commit b5bcd76)",
)

_TORCHTITAN_SP = Default(
    "sp",
    True,
    "tensor parallelism splits the norms' and residuals' activations over the TP ranks with "
    "SequenceParallel: enable_sequence_parallel = True by default (torchtitan/config/configs.py, commit b5bcd76)",
    when_above_one="tp",
)

# ---- timing behaviour: how a framework issues its kernels and collectives (step time, not memory) ----

# NeMo 2.0 / Megatron-Bridge overlap tensor-parallel communication with the GEMMs (Transformer Engine
# userbuffers) in their dense pre-training recipes that split tensors, and ship a tuned userbuffers
# layout per model shape for it; their MoE recipes switch it off.
_NEMO_TP_OVERLAP = Default(
    "tp_overlap",
    True,
    "CommOverlapConfig(tp_comm_overlap=True) with a userbuffers layout from src/megatron/bridge/training/"
    "comm_overlap.py (h6144 tp2, h8192 tp4, h12288 tp4, h16384 tp8, h18432 tp8) in the dense recipes "
    "gpt/h100/gpt3_175b.py, llama/h100/llama3.py (70B, 405B), nemotronh/h100/nemotronh.py; the MoE "
    f"recipes (deepseek, kimi, moonlight, olmoe) set tp_comm_overlap=False ({_BRIDGE})",
    when_above_one="tp",
    not_arch="moe",
)

_DDP_BUCKETS = (
    "DistributedDataParallel(bucket_cap_mb=None): 25 MiB buckets, the first 1 MiB (torch/nn/parallel/distributed.py "
    "_BucketCapacityConfig, dist._DEFAULT_FIRST_BUCKET_BYTES, torch 2.13), rebuilt after the first iteration in the "
    "order the gradients became ready (torch/csrc/distributed/c10d/reducer.cpp Reducer::rebuild_buckets, "
    "compute_bucket_assignment_by_size), each all-reduced once its gradients are ready, in bucket order "
    "(Reducer::mark_bucket_ready)"
)

_DDP_COPIES = (
    "DistributedDataParallel(gradient_as_bucket_view=False) by default (torch/nn/parallel/distributed.py, "
    "torch 2.13): Reducer::mark_variable_ready_dense runs at::mul_out(bucket_view, grad, 1/world) as each "
    "gradient becomes ready (the default all-reduce hook's division, fused into the copy), and "
    "finalize_backward's copy_bucket_to_grad runs grad.copy_(bucket_view) after the bucket's all-reduce "
    "(torch/csrc/distributed/c10d/reducer.cpp); the docs: gradient_as_bucket_view=True 'avoids the overhead "
    "of copying between gradients and allreduce communication buckets'"
)

# Composer's DecoupledAdamW as llm-foundry runs it (weight_decay 0): one tensor at a time, eight eager
# kernels over fp32 state, grads and weights: exp_avg.mul_ (8) .add_(grad) (12), exp_avg_sq.mul_ (8)
# .addcmul_(grad, grad) (16), sqrt (8), division by sqrt(bias_correction2) (8), add_(eps) (8),
# param.addcdiv_(exp_avg, denom) (16) = 84; then FSDP.clip_grad_norm_ reads each gradient for the norm and
# scales it in place (4 + 8) = 96 (the composer entry's optimizer_source).
COMPOSER_ADAMW_BYTES_PER_PARAM = 96

# Eager autograd's copies where a gradient is reshaped across its strides (Framework.layout_copies).
_LAYOUT_COPIES = (
    "torch.reshape returns a copy where the strides allow no view (https://pytorch.org/docs/stable/generated/"
    "torch.reshape.html); view's derivative is grad.reshape(self.sizes()) and unbind's is stack "
    "(tools/autograd/derivatives.yaml)"
)

FRAMEWORKS: dict[str, Framework] = {
    f.name: f
    for f in (
        Framework(
            "eager",
            "plain PyTorch autograd: every op saves what its derivative formula reads",
            "torch 2.x",
            ddp_bucket_copies=_DDP_COPIES,
            ddp_buckets=_DDP_BUCKETS,
            layout_copies=_LAYOUT_COPIES,
        ),
        Framework(
            "eager-amp",
            "plain PyTorch autograd under torch.autocast (bf16/fp16) with fp32 parameters",
            "torch 2.x",
            ddp_bucket_copies=_DDP_COPIES,
            ddp_buckets=_DDP_BUCKETS,
            layout_copies=_LAYOUT_COPIES,
            fp32_weights="torch.amp: the model's parameters stay fp32 and autocast casts them per op "
            "(https://pytorch.org/docs/stable/amp.html; the 'typical mixed precision training' example)",
            autocast="torch.autocast(device_type='cuda', dtype=torch.bfloat16) around the forward and loss, fp32 "
            "parameters (https://pytorch.org/docs/stable/amp.html, Autocast Op Reference; "
            "aten/src/ATen/autocast_mode.cpp)",
        ),
        Framework(
            "megatron-2022",
            "Megatron-LM before FlashAttention: attention scores materialised (baddbmm, fused softmax, bmm)",
            "Megatron-LM 2021-2022 (before commit d693034)",
            (
                Default(
                    "attention",
                    "math",
                    "FlashAttention entered Megatron-LM on 2022-12-08 (commit d693034, --use-flash-attn, off by "
                    "default); the runs of Narayanan et al. 2021 and Korthikanti et al. 2022 predate it",
                ),
                Default("zero", 0, f"--use-distributed-optimizer is off unless given ({_MEGATRON_ARGS})"),
                Default("sp", False, f"--sequence-parallel is off unless given ({_MEGATRON_ARGS})"),
                Default("recompute", "none", f"--recompute-granularity defaults to None ({_MEGATRON_ARGS})"),
            ),
            row_names=("Megatron-LM (2021)", "Megatron-LM (2022)"),
            grads_16bit_under_fp16="--accumulate-allreduce-grads-in-fp32 is off unless given, and only bf16 turns it "
            "on; without it the local DDP keeps each main_grad in the parameter's dtype and all-reduces it so "
            "(megatron/arguments.py and megatron/model/distributed.py, Megatron-LM commit a8d172b, 2021-04-28); "
            "the fp16 optimizer copies them to fp32 at the step (main_param.grad = model_param.main_grad.float())",
            loss_kernel="unfused",
            loss_source="pretrain_gpt's loss is mpu.vocab_parallel_cross_entropy(output.float(), labels) unless "
            "--fp16-lm-cross-entropy (megatron/model/gpt_model.py, megatron/mpu/cross_entropy.py, Megatron-LM "
            "commit 01fc083, 2021): the same eager kernels as Megatron-Core's unfused loss",
            model_defaults=(_GPT2_VOCAB,),
            vocab_multiple=_VOCAB_MULTIPLE,
        ),
        Framework(
            "megatron",
            "Megatron-LM / Megatron-Core with Transformer Engine",
            "Megatron-LM core_r0.x (commit d98e8a6)",
            (
                Default("zero", 0, f"--use-distributed-optimizer is off unless given ({_MEGATRON_ARGS})"),
                Default("sp", False, f"--sequence-parallel is off unless given ({_MEGATRON_ARGS})"),
                Default("recompute", "none", f"--recompute-granularity defaults to None ({_MEGATRON_ARGS})"),
            ),
            row_names=("Megatron-LM",),
            grads_16bit_under_fp16="--accumulate-allreduce-grads-in-fp32 is off unless given, and bf16 turns it on "
            f"unless --grad-reduce-in-bf16 ({_MEGATRON_ARGS}); Megatron-Core's DDP keeps its buffer in fp32 when it "
            "is on, else in the parameters' dtype (grad_reduce_in_fp32, distributed_data_parallel.py)",
            ddp_bucket_dp_scaled=_MCORE_BUCKETS,
            attention_kernel="te",
            attention_source="--attention-backend defaults to auto, which sets NVTE_FLASH_ATTN=1 and NVTE_FUSED_ATTN=1 "
            "and leaves the choice to TE (megatron/core/models/common/language_module/language_module.py "
            f"_set_attention_backend, commit d98e8a6); {_TE_ATTENTION}",
            fused_gated=_SWIGLU,
            probs_in_experts=_MOE_PROBS,
            moe_quant_padding=_MOE_QUANT_PAD,
            precision_aware_optimizer=_PRECISION_AWARE,
            **_VOCAB_CE,
            **_UNFUSED_LOSS,
            model_defaults=(_GPT2_VOCAB,),
            vocab_multiple=_VOCAB_MULTIPLE,
        ),
        Framework(
            "nemo",
            "NeMo 2.0 / Megatron-Bridge recipes on Megatron-Core, as their performance scripts run them",
            "NeMo 25.x (commit 8cfedd7), Megatron-Bridge (commit 067f987)",
            (
                Default(
                    "zero",
                    1,
                    "the distributed optimizer: use_distributed_optimizer=True in _pretrain_common "
                    f"(src/megatron/bridge/recipes/common.py, {_BRIDGE}); NeMo 2.0 recipes use "
                    "distributed_fused_adam_with_cosine_annealing",
                ),
                Default(
                    "recompute",
                    "none",
                    f"recompute_granularity=None in the pre-training recipes ({_BRIDGE})",
                ),
                Default(
                    "sp",
                    True,
                    "the recipes that split tensors turn sequence parallelism on with them: trainer("
                    "sequence_parallelism=True) in nemo/collections/llm/recipes/llama3_70b.py (NeMo commit "
                    "0189a3b), as in the Mixtral, Nemotron and GPT-3 175B recipes",
                    when_above_one="tp",
                ),
                Default(
                    "dtype",
                    "bf16",
                    f'the pre-training recipes\' precision_config defaults to "bf16_mixed" ({_BRIDGE}, '
                    "src/megatron/bridge/recipes/*); fp8 and mxfp8 are opt-in recipes",
                ),
                _NEMO_TP_OVERLAP,
            ),
            row_names=("NeMo",),
            ddp_bucket_dp_scaled=_MCORE_BUCKETS,
            attention_kernel="te",
            attention_source="the performance scripts set NVTE_FUSED_ATTN=1 and NVTE_FLASH_ATTN=1 (NeMo "
            "scripts/performance/executors.py, commit 8cfedd7; earlier releases leave TE's defaults, both on); "
            f"{_TE_ATTENTION}",
            grads_16bit="the performance scripts that produce NVIDIA's published tables turn fp32 gradient "
            "reduction off: recipe.trainer.plugins.grad_reduce_in_fp32 = False in set_precision_configs "
            "(NeMo scripts/performance/helpers.py, commit 8cfedd7); cfg.ddp.grad_reduce_in_fp32 = False "
            "(Megatron-Bridge scripts/performance, v0.1.0rc4 yaml mixed_precision.grad_reduce_in_fp32: false; "
            f"v0.2.0 set_llama3_common_configs; perf_recipes/_common.py _benchmark_common, {_BRIDGE}); "
            "Megatron-Core's DDP then keeps its gradient buffer in the parameters' dtype",
            fused_gated=_SWIGLU,
            probs_in_experts=_MOE_PROBS,
            moe_quant_padding=_MOE_QUANT_PAD,
            precision_aware_optimizer=_PRECISION_AWARE,
            **_VOCAB_CE,
            loss_kernel="unfused",
            loss_source="NeMo 1 (24.03 to 24.12 containers, NeMo-Framework-Launcher) takes cross_entropy_loss_fusion "
            "from the model config only (megatron_base_model.py build_transformer_config, NeMo v2.1.0), so without "
            "the key Megatron-Core's default False holds: the unfused vocab-parallel loss "
            "(megatron/core/model_parallel_config.py)",
            model_defaults=(_GPT2_VOCAB,),
            vocab_multiple=_VOCAB_MULTIPLE,
        ),
        Framework(
            "torchtitan",
            "torchtitan: FSDP2 with per-op selective activation checkpointing",
            "torchtitan (commit b5bcd76)",
            (
                _TORCHTITAN_FSDP,
                _TORCHTITAN_SP,
                Default(
                    "dtype",
                    "bf16",
                    "FSDP2 mixed precision: mixed_precision_param = 'bfloat16' (torchtitan/config/configs.py, "
                    "commit b5bcd76); float8 linears are opt-in (model.converters)",
                ),
            ),
            row_names=("torchtitan",),
            ce_saved=4.0,
            ce_working=8.0,
            ce_source="the loss is F.cross_entropy(pred.float(), ...): log_softmax keeps its fp32 output, the "
            "16-bit logits are deleted before backward (torchtitan/components/loss.py, train.py, commit "
            "b5bcd76); backward holds the fp32 gradient coming in and the fp32 one going out",
            loss_kernel="eager",
            loss_source="F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1)) runs eager (torchtitan "
            "train.py loss_fn at 9dec370, components/loss.py cross_entropy_loss at b5bcd76; --training.compile "
            "compiles the loss only from bbb1b61): the upcast, log_softmax and nll_loss kernels of "
            "echosim.ir.ops.LOSS_KERNEL_BYTES['eager']; with tp > 1, loss_parallel()'s DTensor decomposition "
            "('eager-loss-parallel', torch/distributed/tensor/parallel/loss.py)",
            ce_working_tp=12.0,
            ce_tp_source="with tp > 1 the loss runs under torch.distributed.tensor.parallel.loss_parallel() "
            "(loss_parallel_enabled = tp > 1 and not training.disable_loss_parallel, torchtitan "
            "parallel_dims.py and utils.get_train_context at 9dec370, the commit of its 2024-12 benchmarks). "
            "Its nll_loss backward (torch/distributed/tensor/parallel/loss.py, _nll_loss_and_log_softmax_backward) "
            "does log_softmax's backward too, unfused: grad_input = zeros_like(x), then "
            "(grad_input + torch.exp(x)) * grad_output, so three fp32 tensors over this rank's logits are live "
            "at once (grad_input, the sum, the product; exp(x) before the product), beside the saved fp32 "
            "log-probabilities",
            **_TORCHTITAN_MEMORY,
            **_TORCHTITAN_FSDP2,
        ),
        Framework(
            "torchtitan-compile",
            "torchtitan with torch.compile of the model and the loss (--training.compile)",
            "torchtitan (commit b5bcd76)",
            (
                _TORCHTITAN_FSDP,
                _TORCHTITAN_SP,
            ),
            row_names=("torchtitan (torch.compile",),
            ce_working=2.0,
            ce_source="--training.compile compiles the loss too since commit bbb1b61 (2025-04-02, "
            "torchtitan/components/loss.py): Inductor fuses the fp32 upcast, the log-softmax and its backward, "
            "so the 16-bit logits are kept and the gradient is written once, in 16 bits",
            **_TORCHTITAN_MEMORY,
            **_TORCHTITAN_FSDP2,
        ),
        Framework(
            "maxtext",
            "MaxText (JAX/XLA)",
            "MaxText (commit e591f30)",
            (
                Default(
                    "zero",
                    3,
                    "ici_fsdp_parallelism: -1 shards weights, gradients and optimizer state over "
                    "the slice (src/maxtext/configs/base.yml, commit e591f30)",
                ),
                Default(
                    "recompute",
                    "full",
                    "remat_policy: 'full' (src/maxtext/configs/base.yml, commit e591f30)",
                ),
                Default(
                    "sp",
                    True,
                    "activations are split over the tensor axis like Megatron's sequence parallelism: "
                    "logical_axis_rules map activation_embed to 'tensor' (src/maxtext/configs/base.yml, "
                    "commit e591f30)",
                    when_above_one="tp",
                ),
                Default("dtype", "bf16", "dtype: 'bfloat16' (src/maxtext/configs/base.yml, commit e591f30)"),
                Default(
                    "cp_comm",
                    "all_gather",
                    "context_parallel_strategy: 'all_gather' (src/maxtext/configs/base.yml, commit e591f30)",
                    when_above_one="cp",
                ),
            ),
            row_names=("MaxText",),
            fused_gated="XLA fuses an elementwise producer into its consumer: the gated MLP's activation and "
            "product are one fusion whose backward recomputes the activation from its input, so the "
            "activation's output is never a buffer (MaxText's gated MLP, src/maxtext/layers/linears.py, "
            "commit e591f30)",
            ce_working=2.0,
            ce_source="the loss is jnp code that XLA compiles: the softmax cross-entropy and its gradient fuse "
            "into loops over the logits, so the gradient over the logits is written once, in the logits' dtype "
            "(src/maxtext/train.py loss_fn, commit e591f30)",
            fp32_weights="weight_dtype: float32, mu_dtype inherits it (src/maxtext/configs/base.yml, "
            "commit e591f30); gradients take the weights' dtype",
            moe_capacity_padding="with capacity_factor > 0 and sparse_matmul off, dense_matmul builds per-sequence "
            "dispatch / combine masks of E x C slots (generate_masks) and runs the einsums 'BSM,BSEC -> EBCM', "
            "the experts on every slot, and 'EBCM,BSEC -> BSM' (src/maxtext/layers/moe.py, commit e591f30)",
        ),
        Framework(
            "hai-llm",
            "DeepSeek's HAI-LLM as the DeepSeek-V3 report describes its FP8 training (fused SwiGLU, FP8 and 12-bit "
            "activation caches)",
            "DeepSeek-V3 technical report (arXiv:2412.19437)",
            row_names=("HAI-LLM",),
            fused_gated=f'{_DSV3_CACHES}: "we cache the inputs of the SwiGLU operator and recompute its output in '
            'the backward pass"',
            fp8_gated_inputs=f'{_DSV3_CACHES}: the SwiGLU inputs in MoE "are also stored in FP8 with our '
            'fine-grained quantization method", whose activation scales are per 1x128 tile (sec. 3.3.2)',
            attention_out_12bit=f'{_DSV3_CACHES}: the inputs of the Linear after the attention operator "are also '
            'used in the backward pass of the attention operator" and are cached in "a customized E5M6 data '
            'format" (1 + 5 + 6 bits)',
            fp8_dispatch="DeepSeek-V3 report (arXiv:2412.19437), sec. 3.3.3 'Low-Precision Communication': the "
            "activation before the MoE up-projections is quantised into FP8 before the dispatch, and the activation "
            "gradient before the down-projections likewise; the forward and backward combines stay BF16",
        ),
        Framework(
            "deepspeed",
            "DeepSpeed (ZeRO)",
            "DeepSpeed 0.x",
            (
                Default(
                    "zero",
                    0,
                    "zero_optimization.stage defaults to 0 (DeepSpeed config docs, "
                    "https://www.deepspeed.ai/docs/config-json/)",
                ),
            ),
            grads_16bit_under_zero="data_types.grad_accum_dtype unset: the model's dtype, except bf16 without ZeRO, "
            "which accumulates in fp32 (DeepSpeedEngine.get_data_types, deepspeed/runtime/engine.py, commit "
            "38327e0); ZeRO's optimizers then cast this rank's partition to fp32 at the step (stage_1_and_2.py, "
            "stage3.py), as the ZeRO paper counts 2 + 2 + 12 bytes a parameter (arXiv:1910.02054, sec. 3.1)",
        ),
    )
}


# NeMo with cross_entropy_loss_fusion and Megatron-Core's default cross_entropy_fusion_impl='native': NeMo 2.0
# (the 25.02 and 25.04 containers) by GPTConfig's default, NeMo 1 where a launcher config sets it
# (validation.rows); Megatron-Bridge's performance scripts (NeMo 25.09 on) select Transformer Engine's.
FRAMEWORKS["nemo-ce-native"] = replace(
    FRAMEWORKS["nemo"],
    name="nemo-ce-native",
    title="NeMo on Megatron-Core with cross_entropy_loss_fusion: the jit-fused ('native') cross entropy (NeMo 2.0)",
    row_names=("NeMo 25.0",),
    loss_kernel="native",
    loss_source="GPTConfig.cross_entropy_loss_fusion: bool = True (nemo/collections/llm/gpt/model/base.py, NeMo tags "
    "v2.1.0 to v2.3.0); cross_entropy_fusion_impl keeps Megatron-Core's default 'native' (model_parallel_config.py) "
    "except in the DeepSeek-V3 and Llama 4 performance scripts (scripts/performance/llm, v2.3.0). NeMo 1 copies a "
    "config's model.cross_entropy_loss_fusion into its TransformerConfig (megatron_base_model.py "
    "build_transformer_config, NeMo v2.1.0)",
)
FRAMEWORKS["megatron-bridge"] = replace(
    FRAMEWORKS["nemo"],
    name="megatron-bridge",
    title="Megatron-Bridge performance recipes (NeMo 25.09 on): Transformer Engine's fused cross entropy",
    row_names=("Megatron-Bridge",),
    loss_kernel="te",
    loss_source="GPTProvider.cross_entropy_loss_fusion: bool = True (src/megatron/bridge/models/gpt_provider.py) and "
    "the performance scripts set recipe.model.cross_entropy_fusion_impl = 'te' (scripts/performance configs "
    "v0.1.0rc4, utils/helpers.py v0.2.0 to v0.2.2, utils/overrides.py v0.3.0 to commit 067f987)",
)

# Megatron-LM run with --cross-entropy-loss-fusion, and --cross-entropy-fusion-impl (default native)
for _impl in ("native", "te"):
    FRAMEWORKS[f"megatron-ce-{_impl}"] = replace(
        FRAMEWORKS["megatron"],
        name=f"megatron-ce-{_impl}",
        title=f"Megatron-LM with --cross-entropy-loss-fusion --cross-entropy-fusion-impl {_impl}",
        row_names=(),
        loss_kernel=_impl,
        loss_source=f"--cross-entropy-loss-fusion with cross_entropy_fusion_impl '{_impl}': "
        "compute_language_model_loss (megatron/core/models/common/language_module/language_module.py, commit d98e8a6)",
    )
del _impl

# MegaScale (ByteDance, arXiv:2402.15627, NSDI 2024) is built on Megatron-LM and overlaps the tensor /
# sequence-parallel collectives with the GEMMs (sec. 3.2, "Communication overlapping in 3D parallelism"): the
# all-gathers and reduce-scatters are fused with the parallel linears next to them, each GEMM split into chunks
# pipelined with the communication. Its parallel transformer block (sec. 3.1: attention and MLP read the same
# normalised input, one all-gather and one reduce-scatter a layer where the serial block has two) and its
# sliding-window attention (the window is not published) are not modelled: the step is the serial block's.
FRAMEWORKS["megascale"] = replace(
    FRAMEWORKS["megatron"],
    name="megascale",
    title="MegaScale: Megatron-LM with its tensor-parallel collectives overlapped with the GEMMs",
    version="MegaScale as its paper describes it (arXiv:2402.15627)",
    row_names=("MegaScale",),
    defaults=(
        *FRAMEWORKS["megatron"].defaults,
        Default(
            "tp_overlap",
            True,
            "MegaScale (arXiv:2402.15627) sec. 3.2: the tensor / sequence-parallel all-gathers and reduce-scatters "
            "are fused with the parallel linears, their GEMMs split into chunks pipelined with the communication",
            when_above_one="tp",
        ),
    ),
)


# ---- timing behaviour: earlier releases whose kernels differ (memory rules as the entry they derive from) ----

# torchtitan before commit 6a3a9da (2025-10-09) ran F.scaled_dot_product_attention with the flash
# backend first (cuDNN first only on sm_100, commit 3b85aa31f): PyTorch's flash backend is
# FlashAttention-2's sm80 kernels (aten/src/ATen/native/transformers/cuda/flash_attn), on Hopper too.
FRAMEWORKS["torchtitan-2025"] = replace(
    FRAMEWORKS["torchtitan"],
    name="torchtitan-2025",
    title="torchtitan releases of 2024-2025: FSDP2, PyTorch SDPA's FlashAttention-2 kernels on Hopper",
    version="torchtitan before commit 6a3a9da (2025-10-09), e.g. e7c0cae (2025-06-11) and 820504e (2025-06-13)",
    row_names=("torchtitan (torch 2.6", "torchtitan (commit e7c0cae", "torchtitan (commit 820504e"),
    defaults=(
        *FRAMEWORKS["torchtitan"].defaults,
        Default(
            "cp_comm",
            "all_gather",
            "--experimental.context_parallel_rotate_method defaults to 'allgather' (torchtitan/config_manager.py, "
            "commit 9dec370; parallelism.context_parallel_rotate_method at e7c0cae)",
            when_above_one="cp",
        ),
    ),
    attention_kernel="fa2",
    attention_repeat_kv="Attention.forward: keys = repeat_kv(xk, self.n_rep), values = repeat_kv(xv, self.n_rep) "
    "(x[:, :, :, None, :].expand(...).reshape(...), a copy) before F.scaled_dot_product_attention "
    "(torchtitan/models/llama/model.py at 9dec370, models/llama3/model.py at e7c0cae); from b5bcd76 the "
    "attention passes enable_gqa to SDPA instead (torchtitan/models/common/attention.py)",
    attention_source="ScaledDotProductAttention._init_backend: [FLASH_ATTENTION, EFFICIENT_ATTENTION, MATH], "
    "CUDNN_ATTENTION first only with CUDA capability 10.0 (torchtitan/models/attention.py, commit e7c0cae); "
    "before that plain F.scaled_dot_product_attention (torch 2.6's default order puts flash first)",
    norm_kernels="reference",
    norm_source="train_configs/llama3_*.toml: norm_type = 'rmsnorm', compile = false; build_norm('rmsnorm') is "
    "torchtitan's RMSNorm module, (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps))"
    ".type_as(x) * weight (torchtitan/models/norms.py, commit 9dec370, the one its 2024-12 benchmarks name)",
    cp_torch="create_context_parallel_ctx: context_parallel(cp_mesh, ...) after "
    "set_rotate_method(--experimental.context_parallel_rotate_method, default 'allgather') (torchtitan/utils.py, "
    "config_manager.py, commit 9dec370; config_manager.py at e7c0cae); the Llama attention expands K and V to "
    "the query heads (repeat_kv) before F.scaled_dot_product_attention (torchtitan/models/llama/model.py, "
    "9dec370; models/llama3/model.py, e7c0cae); ring attention, its fp32 merge and backward: "
    "torch/distributed/tensor/experimental/_attention.py (PyTorch 1963fc8, the torch its 2024-12 benchmarks name)",
)
# The same runs with --training.compile: torch.compile of each TransformerBlock, where Inductor fuses the
# norm into one kernel each way (torchtitan/parallelisms/parallelize_llama.py apply_compile, commit 9dec370).
# The loss stays eager until commit bbb1b61 (2025-04-02), so the memory rules are the eager entry's.
FRAMEWORKS["torchtitan-2025-compile"] = replace(
    FRAMEWORKS["torchtitan-2025"],
    name="torchtitan-2025-compile",
    title="torchtitan releases of 2024-2025 with torch.compile of each transformer block (fused norms)",
    row_names=(),
    norm_kernels="",
    norm_source="apply_compile: torch.compile per TransformerBlock (torchtitan/parallelisms/parallelize_llama.py, "
    "commit 9dec370); Inductor fuses the RMSNorm's upcast, reduction and products",
    compiled_collectives="apply_compile: torch.compile(transformer_block, fullgraph=True) (torchtitan "
    "parallelize_llama.py, 9dec370 and e7c0cae) traces the ring attention's functional collectives, which "
    "while tracing return wait_tensor(...) at once (_maybe_wrap_tensor, torch/distributed/"
    "_functional_collectives.py); Inductor's reorder_for_compute_comm_overlap (torch/_inductor/config.py) "
    "defaults to False, so nothing moves the waits",
)
# From commit bbb1b61 (2025-04-02) --training.compile compiles the loss too (build_cross_entropy_loss:
# torch.compile(cross_entropy_loss), torchtitan/components/loss.py, e.g. at e7c0cae); before it the line is
# commented out (train.py at 9dec370), so the 2024-12 rows keep the eager kernels. Timing only: the memory
# rules stay the compile entry's.
FRAMEWORKS["torchtitan-2025-compile-loss"] = replace(
    FRAMEWORKS["torchtitan-2025-compile"],
    name="torchtitan-2025-compile-loss",
    title="torchtitan 2025 releases with torch.compile of each transformer block and of the loss (bbb1b61 on)",
    row_names=(),
    loss_kernel="",
    loss_source="",
)
# ZeRO-3 in 2021 was DeepSpeed's: Megatron-LM of 2021 has no stage 3 (its distributed optimizer, 2022, shards
# optimizer state only), and Narayanan et al. 2021 (arXiv:2104.04473, sec. 5.2) ran their ZeRO-3 comparison
# through the DeepSpeed library on the Megatron model code, so the Megatron-LM (2021) kernels stay.
FRAMEWORKS["deepspeed-2021"] = replace(
    FRAMEWORKS["megatron-2022"],
    name="deepspeed-2021",
    title="DeepSpeed ZeRO-3 of 2021 (v0.3.13-v0.5.5) on Megatron-LM (2021) model code",
    version="DeepSpeed commit c83e49f (2021-04-14, v0.3.14)",
    row_names=(),
    zero3_per_param="deepspeed/runtime/zero/stage3.py (commit c83e49f): fetch_sub_module all-gathers each "
    "sub-module's parameters one by one (partition_parameters.py _allgather_param: torch.cuda.synchronize(), "
    "then torch.distributed.all_gather over a list of per-rank partitions) and _synchronize_communication "
    "ends in torch.cuda.synchronize(); _reduce_scatter_gradients runs torch.distributed.reduce_scatter per "
    "parameter over a list of per-rank slices. DeepSpeed PR #1188 (commit c0eeb69, 2021-10-31): 'the async "
    "version is not async at all, because each all_gather calls torch.cuda.synchronize()', and "
    "'torch.distributed.all_gather will do implicit memcpy at the end of each ncclAllgather'",
    grads_16bit="ZeRO keeps the gradients in fp16: Rajbhandari et al. 2020 (arXiv:1910.02054, sec. 3.1) count "
    "2 + 2 + 12 bytes a parameter under mixed-precision Adam, and stage3.py (commit c83e49f) keeps each rank's "
    "reduced gradients in grads_in_partition (torch.half), casting one optimizer sub-group at a time to fp32 at "
    "the step (_prepare_fp32_grad_for_sub_group) and dropping it after (_release_sub_group). Narayanan et al. "
    "2021 (footnote to Table 2): batch 2560 on 640 GPUs for the 530B model because 560 GPUs with micro-batch 4 "
    "did not fit; with fp16 gradients echosim puts that model at 79.2 GiB on 640 GPUs and 80.9 GiB on 560",
)

# Published non-LLM rows whose stack is not eager PyTorch but has no entry of its own, priced with the eager
# entry's rules as before, less the layout copies of the zoo module's autograd (benchmarks/nonllm_throughput.csv).
FRAMEWORKS["jax-xla"] = replace(
    FRAMEWORKS["eager"],
    name="jax-xla",
    title="JAX under XLA (Rosetta's T5X / Praxis ViT): the step compiled whole, layouts chosen for its fusions",
    version="JAX-Toolbox Rosetta (2023)",
    layout_copies="",  # XLA's layout assignment picks each dot's operand layouts (no reshape kernels of autograd)
    # no DDP reducer: XLA schedules the step's all-reduces itself (priced per layer, as before), on the gradient
    # buffers the compiled step writes (jax.lax.pmean over the gradient pytree; XLA's all-reduce combiner joins
    # operands into one tuple all-reduce, https://openxla.org/xla/operation_semantics#allreduce), so no gradient
    # is copied into a bucket and back either
    ddp_buckets="",
    ddp_bucket_copies="",
)
FRAMEWORKS["apex-ddp"] = replace(
    FRAMEWORKS["eager"],
    name="apex-ddp",
    title="eager PyTorch under apex's DistributedDataParallel (DeepLearningExamples' GNMT and BERT)",
    version="apex.parallel (2020)",
    # DeepLearningExamples' PyTorch/Translation/GNMT seq2seq/train/trainer.py wraps the model in
    # apex.parallel.DistributedDataParallel, and PyTorch/LanguageModeling/BERT run_pretraining.py in apex's
    # DDP(model, message_size=250000000, ...) (or all-reduces once after accumulation): apex buckets by its own
    # rule (message_size elements), not torch DDP's reducer, so priced per layer, as before
    ddp_buckets="",
)
FRAMEWORKS["nemo-megatron-vit"] = replace(
    FRAMEWORKS["eager"],
    name="nemo-megatron-vit",
    title="NeMo 1.x's Megatron ViT (ParallelAttention on [s, b, h] tensors, its own head layouts)",
    version="NeMo 1.x vision_transformer (2023)",
    # Megatron's attention splits heads from a [s, b, np, 3 hn] view and merges them with an explicit
    # .contiguous() (megatron/model/transformer.py CoreAttention), not the zoo module's permute and reshape
    layout_copies="",
    # Megatron's gradient reduction, not PyTorch DDP's buckets (priced per layer, as before), and no DDP wrapper to
    # copy into them: under megatron_amp_O2 (the recipe's bf16 O2) NeMo's NLPDDPStrategy.configure_ddp does not
    # wrap the model in DDP ("do not use DDP if using megatron amp O2 or distributed optimizer",
    # nemo/collections/nlp/parts/nlp_overrides.py, NVIDIA/NeMo dd84799); MainParamsOptimizerWrapper accumulates
    # into its contiguous main-gradient buffers and all-reduces those
    ddp_buckets="",
    ddp_bucket_copies="",
)

# llm-foundry's attn_impl 'flash' calls the flash-attn package, version 2 (flash_attn_varlen_func; the
# gpu extra pins flash-attn==2.5.0, setup.py at llm-foundry commit 4952183) or, on older images, version 1.
FRAMEWORKS["composer"] = replace(
    FRAMEWORKS["eager"],
    name="composer",
    title="MosaicML Composer + PyTorch FSDP (llm-foundry): flash-attn 2 kernels",
    version="llm-foundry commit 4952183 (2024-04), Composer FSDP",
    row_names=("Composer",),
    fsdp_reduce_fp32="Composer's FSDP mixed_precision 'DEFAULT' (its default, and the 'MP Mode' of every H100 row of "
    "llm-foundry's scripts/train/benchmarking/README.md tables; the A100 rows ran 'PURE': composer-triton-pure) "
    "builds MixedPrecision(param_dtype=<autocast dtype>, reduce_dtype=torch.float32) (composer/distributed/"
    "mosaic_parallelism.py get_mixed_precision; composer/trainer/dist_strategy.py in 2023), and FSDP's "
    "post-backward hook casts the unsharded gradient to reduce_dtype before the reduce-scatter "
    "(torch/distributed/fsdp/_runtime_utils.py _post_backward_hook)",
    ddp_bucket_copies="",  # FSDP: its own flat parameters, no DDP reducer
    ddp_buckets="",
    fsdp_flat_grads="FSDP1 (torch 2.0-2.2) runs the module on views of the unsharded FlatParameter, "
    "tensor.split(flat_param._numels) then .view(shape) (FlatParamHandle._get_unflat_views, "
    "_use_unsharded_views(as_params=False) in torch/distributed/fsdp/flat_param.py), so autograd's "
    "SplitWithSizesBackward concatenates the unit's gradients into one flat gradient; _post_backward_hook then "
    "casts it with flat_param.grad.to(reduce_dtype) and the default reduce_scatter_hook (torch 2.0 "
    "_runtime_utils.py, default_hooks.py; torch 2.1 _reduce_grad) divides it in place by "
    "gradient_predivide_factor, which is >= 2 for every world size >= 2 (DefaultState._get_gradient_predivide_"
    "factor), before reduce_scatter_tensor",
    attention_kernel="fa2",
    attention_source="attn_impl 'flash' -> flash_attn_interface.flash_attn_varlen_func (llmfoundry/models/layers/"
    "attention.py, llm-foundry commit 4952183; extra 'gpu' pins flash-attn==2.5.0)",
    optimizer_bytes=COMPOSER_ADAMW_BYTES_PER_PARAM,
    optimizer_source="llm-foundry's pretraining yamls train with optimizer decoupled_adamw (weight_decay 0.0) and "
    "algorithms.gradient_clipping (norm, 1.0); Composer's DecoupledAdamW.adamw loops over the parameters one by "
    "one with eager in-place ops, exp_avg.mul_().add_(), exp_avg_sq.mul_().addcmul_(), (exp_avg_sq.sqrt() / "
    "sqrt(bias_correction2)).add_(eps), param.addcdiv_() (composer/optim/decoupled_weight_decay.py, Composer commit "
    "eb4fbd0, 2024-01); Composer clips FSDP models with FullyShardedDataParallel.clip_grad_norm_, which reads every "
    "gradient for the norm and scales it in place",
    attention_unpad="flash_attn_fn packs q, k and v with bert_padding.index_first_axis (a torch.gather each) and "
    "scatters the output back with bert_padding.pad_input (torch.zeros, then an indexed assignment) around "
    "flash_attn_varlen_func, also when no token is padding (llmfoundry/models/layers/attention.py at commits "
    "5e85bd6, the H100 large-scale benchmarks, and 4952183; flash_attn/bert_padding.py, flash-attn 2.4)",
)

# llm-foundry's attn_impl 'triton': the Triton FlashAttention kernel llm-foundry copies from the flash-attention
# repository (llmfoundry/models/layers/flash_attn_triton.py, "Copied from .../flash_attn/flash_attn_triton.py"
# at flash-attention commit eff9fe6, on the triton-pre-mlir fork setup.py installs), costed at the fastest rate
# it is documented to run, FlashAttention v1's next to FlashAttention-2 (compute.triton_flash_slowdown). Which
# benchmark rows ran it: echosim.validation.rows.llm_foundry_attn_impl.
FRAMEWORKS["composer-triton"] = replace(
    FRAMEWORKS["composer"],
    name="composer-triton",
    title="MosaicML Composer + PyTorch FSDP (llm-foundry) with attn_impl 'triton' (Triton FlashAttention kernel)",
    row_names=(),
    attention_kernel="triton",
    attention_source="attn_impl 'triton' -> llmfoundry.models.layers.flash_attn_triton.flash_attn_func "
    "(llmfoundry/models/layers/attention.py triton_flash_attn_fn, llm-foundry commit 5e85bd6)",
    attention_unpad="",  # triton_flash_attn_fn hands the kernel the padded (b, s, h, d) tensors: views, no copies
)

# llm-foundry's attn_impl 'flash' with the flash-attn 1.x package: flash_attn_fn calls
# flash_attn_interface.flash_attn_unpadded_func (FlashAttention v1) on the same unpadded q, k, v when
# is_flash_v1_installed() (llmfoundry/models/layers/attention.py, llm-foundry commit 5e85bd6), costed at FA1's
# published rate next to FlashAttention-2 (echosim.backends.compute.FA1_FWD_BWD_TFLOPS). Which benchmark rows ran
# it: echosim.validation.rows.llm_foundry_flash_v1.
FRAMEWORKS["composer-fa1"] = replace(
    FRAMEWORKS["composer"],
    name="composer-fa1",
    title="MosaicML Composer + PyTorch FSDP (llm-foundry) with attn_impl 'flash' on flash-attn 1.x (FlashAttention v1)",
    row_names=(),
    attention_kernel="fa1",
    attention_source="attn_impl 'flash' with flash-attn 1.0.9 (extra 'gpu', setup.py at llm-foundry v0.4.0 and "
    "5e85bd6) -> flash_attn_interface.flash_attn_unpadded_func (llmfoundry/models/layers/attention.py "
    "flash_attn_fn, is_flash_v1_installed(), llm-foundry commit 5e85bd6)",
)

# llm-foundry's A100 benchmark tables were run with submit_benchmarks.py's defaults ``--precisions bf16`` and
# ``--fsdp_config_mixed_precision PURE`` (scripts/train/benchmarking/submit_benchmarks.py, llm-foundry commit
# 300cc5c; every row of the README whose Precision is 'bf16' has MP Mode 'PURE'). Composer's 'PURE' builds
# MixedPrecision(param_dtype=bf16, reduce_dtype=bf16, buffer_dtype=bf16) (composer/trainer/mosaic_fsdp.py
# get_mixed_precision, Composer v0.12-v0.16; 'bf16' is the deprecated name of 'amp_bf16', trainer.py v0.12.0),
# so FSDP reduce-scatters the gradients in bf16, not fp32.
FRAMEWORKS["composer-triton-pure"] = replace(
    FRAMEWORKS["composer-triton"],
    name="composer-triton-pure",
    title="MosaicML Composer + PyTorch FSDP (llm-foundry), Triton attention, FSDP mixed_precision 'PURE' (bf16 "
    "gradient reduce-scatters)",
    row_names=(),
    fsdp_reduce_fp32="",
)

# MaxText with weight_dtype: bfloat16 (a per-recipe setting, e.g. the Trillium Llama-3.1 70B v6e-32 recipe):
# the weights, their gradients and Adam's moments are all 16-bit.
FRAMEWORKS["maxtext-bf16-weights"] = replace(
    FRAMEWORKS["maxtext"],
    name="maxtext-bf16-weights",
    title="MaxText with weight_dtype: bfloat16 (16-bit weights, gradients and optimizer state)",
    row_names=(),
    fp32_weights="",
    weights_16bit="weight_dtype: bfloat16 keeps the parameters in bf16; gradients take the parameters' "
    "dtype; optax.adamw gets mu_dtype=config.mu_dtype, which inherits weight_dtype when unset "
    "(src/maxtext/optimizers/optimizers.py, src/maxtext/configs/base.yml line 993, commit e591f30), and "
    "scale_by_adam builds nu with zeros_like(params): 2 + 2 + 2 + 2 bytes per parameter, no fp32 copy",
)

# MaxText on GPU with attention=cudnn_flash_te: Transformer Engine's JAX DotProductAttention, cuDNN's fused attention
# (as DGX Cloud Benchmarking's MaxText recipes pass it). MaxText's default, 'autoselected', is not this kernel.
FRAMEWORKS["maxtext-te"] = replace(
    FRAMEWORKS["maxtext"],
    name="maxtext-te",
    title="MaxText on GPU with attention=cudnn_flash_te (Transformer Engine's cuDNN fused attention)",
    row_names=(),
    attention_kernel="te",
    attention_source="attention=cudnn_flash_te -> transformer_engine.jax.flax.transformer.DotProductAttention "
    "(src/maxtext/layers/attention_op.py cudnn_flash_attention, MaxText commit e591f30), which runs TE's fused "
    "(cuDNN) attention",
)


# MaxText's splash attention runs its backward as two kernels (dkv, then dq) unless a recipe sets
# sa_use_fused_bwd_kernel: True, as the Trillium Llama-3.1 8B and 70B recipes do
# (benchmarks/maxtext_trillium_model_configs.py, MaxText commit e591f30): the fused kernel forms dq with dk and dv.
for _base in ("maxtext", "maxtext-bf16-weights"):
    FRAMEWORKS[f"{_base}-splash-fused"] = replace(
        FRAMEWORKS[_base],
        name=f"{_base}-splash-fused",
        title=f"{FRAMEWORKS[_base].title}, splash attention with its fused backward kernel",
        row_names=(),
        attention_kernel="splash-fused",
        attention_source="sa_use_fused_bwd_kernel: True -> splash_attention_kernel.BlockSizes(use_fused_bwd_kernel="
        "True): one dkv kernel also forms dq, 5 block products in the backward instead of 7 (MaxText "
        "src/MaxText/layers/attention_op.py, tag tpu-recipes-v0.1.5; base.yml's default is False)",
    )
del _base


def maxtext_framework(bf16_weights: bool = False, te_attention: bool = False, fused_bwd: bool = False) -> str:
    """The MaxText entry a run's settings select: ``weight_dtype: bfloat16`` (which wins over TE attention: no
    entry has both), ``attention=cudnn_flash_te`` on GPU, and ``sa_use_fused_bwd_kernel: True`` (splash attention,
    TPU: not with TE's attention)."""
    if not bf16_weights and te_attention:
        return "maxtext-te"
    name = "maxtext-bf16-weights" if bf16_weights else "maxtext"
    return f"{name}-splash-fused" if fused_bwd else name


def loss_framework(base: str, kernel: str) -> str:
    """The Megatron-Core entry (``base`` 'megatron' or 'nemo') whose loss runs ``kernel`` ('unfused', 'native', 'te'):
    what a config's cross_entropy_loss_fusion and cross_entropy_fusion_impl select."""
    names = {
        "megatron": {"unfused": "megatron", "native": "megatron-ce-native", "te": "megatron-ce-te"},
        "nemo": {"unfused": "nemo", "native": "nemo-ce-native", "te": "megatron-bridge"},
    }
    return names[base][kernel]


def get_framework(name: str) -> Framework:
    """The framework called ``name``; an unknown name is one line naming the known ones."""
    try:
        return FRAMEWORKS[name]
    except KeyError:
        raise FrameworkError(f"unknown framework {name!r} (known: {', '.join(sorted(FRAMEWORKS))})") from None


def framework_named_in(text: str) -> str:
    """The framework a free-text description (cases.csv's ``framework`` column) names; eager when none matches."""
    text = text.strip()
    matches = [(len(p), f.name) for f in FRAMEWORKS.values() for p in f.row_names if text.startswith(p)]
    return max(matches)[1] if matches else DEFAULT_FRAMEWORK  # the longest prefix: the most specific entry
