"""The op vocabulary of the IR and the typed attributes each op carries.

Every per-op behaviour (FLOPs, backward rule, sharding, cost) lives in tables keyed
by :class:`OpKind` elsewhere; this module only names things.
"""

from __future__ import annotations

from dataclasses import dataclass

from echosim.ir.types import IdentityEnum


class OpKind(IdentityEnum):
    INPUT = "input"
    PARAMETER = "parameter"
    MATMUL = "matmul"
    ATTENTION = "attention"
    ELEMENTWISE = "elementwise"
    NORM = "norm"
    SOFTMAX = "softmax"
    EMBEDDING = "embedding"
    REDUCTION = "reduction"
    VIEW = "view"
    CROSS_ENTROPY = "cross_entropy"
    OPTIMIZER_UPDATE = "optimizer_update"
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    SEND = "send"
    RECV = "recv"
    BROADCAST = "broadcast"

    @property
    def is_collective(self) -> bool:
        return self in COLLECTIVES

    @property
    def is_placeholder(self) -> bool:
        return self in (OpKind.INPUT, OpKind.PARAMETER)


COLLECTIVES = frozenset(
    {
        OpKind.ALL_REDUCE,
        OpKind.ALL_GATHER,
        OpKind.REDUCE_SCATTER,
        OpKind.ALL_TO_ALL,
        OpKind.SEND,
        OpKind.RECV,
        OpKind.BROADCAST,
    }
)


class Phase(IdentityEnum):
    """When a node runs in a training step; recompute is split out so HFU and MFU differ."""

    FORWARD = "fwd"
    BACKWARD = "bwd"
    RECOMPUTE = "recompute"
    OPTIMIZER = "opt"


# ---- typed attributes -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NoAttrs:
    def __str__(self) -> str:
        return ""


@dataclass(frozen=True, slots=True)
class ViewAttrs:
    """A view that permutes its input's axes: output axis ``i`` is input axis ``perm[i]``. Kept because sizes alone
    cannot say which axis went where when two are equal (a ``[b, T, C]`` activation transposed for a convolution
    over the tokens with ``T == C``), and the sharding passes follow a split axis through the view."""

    perm: tuple[int, ...] = ()

    def __str__(self) -> str:
        return f"perm={','.join(map(str, self.perm))}" if self.perm else ""

    @staticmethod
    def permuting(perm: tuple[int, ...], before: tuple[int, ...], after: tuple[int, ...]) -> ViewAttrs | None:
        """The attrs of a view that takes ``before`` to ``after`` by ``perm`` (output axis ``i`` from input axis
        ``perm[i]``); ``None`` for the identity, or where the shapes say otherwise (the IR may hold a frontend's
        tensor in another layout: a weight held transposed)."""
        fits = sorted(perm) == list(range(len(before))) and tuple(before[i] for i in perm) == tuple(after)
        return ViewAttrs(perm) if fits and list(perm) != sorted(perm) else None


@dataclass(frozen=True, slots=True)
class ParamAttrs:
    """A trainable weight; ``shard`` says how many ranks split it (TP/EP).

    ``expert`` marks a routed expert's weight: expert parallelism shards it, so its
    gradient is synchronised over the expert-data-parallel group (``dp * cp / ep`` ranks),
    not over every data-parallel rank.
    """

    shard: int = 1
    expert: bool = False
    sparse: bool = False  # an embedding table a fused sparse optimizer updates (EmbeddingAttrs.sparse)

    def __str__(self) -> str:
        parts = [f"shard={self.shard}"] if self.shard != 1 else []
        if self.expert:
            parts.append("expert")
        if self.sparse:
            parts.append("sparse")
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class MatmulAttrs:
    """``batch`` independent (m x k) @ (k x n) products.

    ``tp`` records the Megatron role of a sharded linear ("colwise" / "rowwise" /
    "vocab") so that backward rules know which gradient needs a reduction.
    ``grad_of`` is "" for a forward product, "dgrad" or "wgrad" for its gradients.
    ``conv_io`` is set on a convolution's products: the elements of its input plus its output
    activation (forward), of dy plus dx (dgrad), of x plus dy (wgrad): the tensors cuDNN
    transposes when the activations are NCHW and the product runs on tensor cores.
    """

    m: int
    n: int
    k: int
    batch: int = 1
    tp: str = ""
    grad_of: str = ""
    precision: str = ""  # "fp8": operands quantised, output in the tensor's (16-bit) dtype
    grouped: bool = False  # MoE experts: one grouped-GEMM kernel over ``batch`` experts' products
    conv_io: int = 0  # a convolution's activation elements in + out (see above); 0 for a plain GEMM
    # share of the product that is the model's own work (MFU's numerator): 1, except the slots a MoE pads its
    # experts to and the one-hot einsums that fill and empty them (echosim.passes.expert_parallel, padded)
    useful: float = 1.0

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k

    def __str__(self) -> str:
        parts = [f"m={self.m} n={self.n} k={self.k}"]
        if self.batch != 1:
            parts.append(f"batch={self.batch}")
        if self.tp:
            parts.append(f"tp={self.tp}")
        if self.grad_of:
            parts.append(self.grad_of)
        if self.precision:
            parts.append(self.precision)
        if self.grouped:
            parts.append("grouped")
        if self.useful != 1.0:
            parts.append(f"useful={self.useful:.4g}")
        return " ".join(parts)


def causal_fraction(q_len: int, kv_len: int) -> float:
    """Share of the q x kv score matrix a bottom-right aligned causal mask keeps."""
    offset = kv_len - q_len  # row i sees keys [0, i + offset]
    first = max(0, -offset)  # rows before this see nothing
    rows = q_len - first
    if rows <= 0:
        return 0.0
    lo, hi = first + offset + 1, q_len - 1 + offset + 1  # visible keys of first and last row
    full_from = max(first, kv_len - offset - 1)  # rows from here on see every key
    if full_from >= q_len:
        visible = (lo + hi) * rows / 2
    else:
        ramp = full_from - first
        visible = (lo + lo + ramp - 1) * ramp / 2 + (q_len - full_from) * kv_len
    return visible / (q_len * kv_len)


def _clamped_sum(first: int, count: int, hi: int) -> int:
    """``sum(min(max(t, 0), hi) for t in range(first, first + count))`` in closed form."""
    last = first + count - 1
    total = 0
    lo_t, hi_t = max(first, 1), min(last, hi - 1)  # the terms strictly between 0 and hi
    if hi_t >= lo_t:
        total += (lo_t + hi_t) * (hi_t - lo_t + 1) // 2
    total += hi * max(0, last - max(first, hi) + 1)  # the terms clamped to hi
    return total


def band_pairs(q_len: int, kv_len: int, window: int | None = None) -> int:
    """(query, key) pairs a bottom-right aligned causal mask keeps, within a sliding ``window``.

    Query row ``i`` stands at key position ``i + kv_len - q_len`` and sees the ``window`` keys
    ending there, itself included (``None``: every key before it). This is the band of HF
    transformers' ``sliding_window`` (``masking_utils.sliding_window_overlay``: key ``k`` is
    visible from query ``q`` when ``k > q - sliding_window``), of Mistral 7B (arXiv:2310.06825
    sec. 2: "each token can attend to at most W tokens from the previous layer") and of Gemma 3's
    local layers (arXiv:2503.19786 sec. 2.1).
    """
    if q_len <= 0 or kv_len <= 0:
        return 0
    start = kv_len - q_len + 1  # keys visible from row 0 under the plain causal mask
    seen = _clamped_sum(start, q_len, kv_len)
    if window is None or window >= kv_len:
        return seen
    return seen - _clamped_sum(start - window, q_len, kv_len)


def band_fraction(q_len: int, kv_len: int, window: int | None = None) -> float:
    """Share of the q x kv score matrix the causal band keeps (:func:`band_pairs`)."""
    if q_len <= 0 or kv_len <= 0:
        return 0.0
    return band_pairs(q_len, kv_len, window) / (q_len * kv_len)


@dataclass(frozen=True, slots=True)
class AttentionAttrs:
    """Scaled dot-product attention, fused (flash) or materialised.

    ``model_scale`` multiplies the model FLOPs of the scores the mask keeps; only context
    parallelism sets it, where the simulated rank's blocks are not the average rank's share
    (see :mod:`echosim.passes.context_parallel`).

    ``window``: sliding-window (local) attention, each query sees the ``window`` most recent keys
    itself included (:func:`band_pairs`); 0: full causal attention. Only a causal
    attention has one.

    ``padded``: the caller packs q, k and v into the kernel's variable-length layout and scatters the
    output back to the padded one, each through its own copy kernels (:data:`VARLEN_PAD_COPIES`).

    ``repeat_kv``: the caller expands K and V to the query heads by copies before the kernel (torchtitan's
    ``repeat_kv``: ``expand`` then ``reshape``), whose backward sums the heads' gradients back
    (:meth:`repeat_kv_elements`).
    """

    batch: int
    heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int
    causal: bool = True
    flash: bool = True
    # the flash kernel: "" = the device's own best, "fa2" = FlashAttention-2, "te" = TE's pick, "fa1" = FlashAttention
    # v1, "triton" = FlashAttention's Triton kernel (echosim.backends.compute.PUBLISHED_RATIO_KERNELS)
    kernel: str = ""
    model_scale: float = 1.0
    dropout: bool = False  # dropout on the attention probabilities (training with dropout_p > 0)
    window: int = 0  # sliding window in keys (0: full attention)
    padded: bool = False  # q, k, v unpadded into the varlen layout and the output padded back, by copies
    repeat_kv: bool = False  # K and V copied out to the query heads before the kernel (grouped-query attention)
    fp8: bool = False  # FP8 attention (Transformer Engine's fp8_dot_product_attention; echosim.backends.fp8_attention)
    # TPU splash attention's (q, kv) blocks of its forward, dkv and dq kernels, six sizes in MaxText's order
    # sa_block_q, sa_block_kv, sa_block_q_dkv, sa_block_kv_dkv, sa_block_q_dq, sa_block_kv_dq
    # (echosim.backends.tpu.splash_blocks); (): MaxText's defaults
    blocks: tuple[int, ...] = ()
    # the value head size where it differs from the query/key one (DeepSeek's MLA): head_dim then holds their mean,
    # so the FLOPs stay exact, and a kernel that pads each to its own template sizes still sees both; 0: the same
    head_dim_v: int = 0

    def __post_init__(self) -> None:
        if self.blocks and (len(self.blocks) != 6 or min(self.blocks) < 1):
            raise ValueError(f"splash blocks are six sizes >= 1 (forward, dkv, dq: q then kv), got {self.blocks}")
        if self.window < 0 or (self.window and not self.causal):
            raise ValueError(f"a sliding window needs causal attention and window >= 1 (0: none), got {self.window}")

    @property
    def head_dims(self) -> tuple[int, int]:
        """(query/key, value) head sizes: both ``head_dim`` unless :attr:`head_dim_v` says otherwise."""
        if not self.head_dim_v:
            return self.head_dim, self.head_dim
        return 2 * self.head_dim - self.head_dim_v, self.head_dim_v

    @property
    def keep(self) -> float:
        """Share of the score matrix the mask keeps: the causal band (within the window), or all of it."""
        return band_fraction(self.q_len, self.kv_len, self.window or None) if self.causal else 1.0

    @property
    def flops(self) -> int:
        """FLOPs of QK^T and PV over the full (unmasked) q x kv score matrix."""
        return 4 * self.batch * self.heads * self.q_len * self.kv_len * self.head_dim

    @property
    def model_flops(self) -> int:
        """FLOPs of the scores the model needs: a causal mask keeps about half of them.

        This is the convention of Megatron-LM's ``num_floating_point_operations`` and of
        MaxText's ``calculate_tflops_training_per_device`` (causal attention counted as half
        the full score matrix). Flash and splash kernels skip the masked blocks, so counting
        the full matrix let MFU pass 100% at long sequence. A sliding window counts the pairs
        inside its band exactly (``q * window - window * (window - 1) / 2`` for q = kv >= window);
        MaxText's ``calculate_gemma3_tflops_training_per_device`` approximates a local layer as
        ``seq * min(window, seq)`` score pairs (src/maxtext/utils/maxtext_utils.py).
        """
        return round(self.flops * self.keep * self.model_scale)

    def __str__(self) -> str:
        return (
            f"b={self.batch} h={self.heads} kv={self.kv_heads} q={self.q_len} "
            f"k={self.kv_len} d={self.head_dim}"
            f"{' causal' if self.causal else ''}{f' window={self.window}' if self.window else ''}"
            f"{' flash' if self.flash else ' math'}"
            f"{' ' + self.kernel if self.kernel and self.flash else ''}"
            f"{' padded' if self.padded and self.flash else ''}"
            f"{' repeat_kv' if self.repeat_kv and self.kv_heads < self.heads else ''}"
        )

    def repeat_kv_elements(self, backward: bool) -> tuple[int, int]:
        """Elements ``repeat_kv``'s copies read and write, and their kernel count (0, 0 unless ``repeat_kv``
        and fewer K/V heads than query heads). Forward: K and V each read at their own heads and written at
        the query heads (``reshape`` of an ``expand`` materialises it); backward: the expand's gradient, a sum
        over each group of query heads, reads the expanded gradient and writes the K/V heads' (the
        direction does not change the count)."""
        if not self.repeat_kv or self.kv_heads >= self.heads:
            return 0, 0
        per_head = self.batch * self.kv_len * self.head_dim
        return 2 * per_head * (self.kv_heads + self.heads), 2

    def pad_copy_elements(self, backward: bool) -> tuple[int, int]:
        """Elements the varlen unpad / pad copies read and write around the kernel, and their kernel count
        (0, 0 unless ``padded``): :data:`VARLEN_PAD_COPIES` over q's and k's (= v's) element counts."""
        if not (self.padded and self.flash):
            return 0, 0
        per_q, per_kv, kernels = VARLEN_PAD_COPIES[backward]
        q = self.batch * self.heads * self.q_len * self.head_dim
        kv = self.batch * self.kv_heads * self.kv_len * self.head_dim
        return per_q * q + per_kv * kv, kernels


#: The copies around a varlen flash-attention call that packs padded (batch, seq) tensors, as
#: llm-foundry's ``flash_attn_fn`` makes them with flash-attn's ``bert_padding`` helpers (llmfoundry/
#: models/layers/attention.py at commits 5e85bd6 and 4952183; flash_attn/bert_padding.py, flash-attn
#: 2.4): ``index_first_axis`` on q, k and v is a ``torch.gather`` that reads and writes each once, and
#: ``pad_input`` on the output is ``torch.zeros`` then an indexed assignment (write; read + write).
#: Backward: each ``index_first_axis`` becomes ``torch.zeros`` plus ``scatter_`` (write; read + write)
#: and ``pad_input`` an indexed read (read + write). Per phase: (elements per q element, per k element
#: (v the same), kernels). Forward: q 2 + 3 (output, q-sized), k and v 2 each, 5 kernels; backward:
#: q 3 + 2, k and v 3 each, 7 kernels. A sequence with no padding still pays them: the indices cover
#: every token.
VARLEN_PAD_COPIES: dict[bool, tuple[int, int, int]] = {False: (5, 4, 5), True: (5, 6, 7)}  # by "is backward"


@dataclass(frozen=True, slots=True)
class ElementwiseAttrs:
    """A memory-bound map (gelu, add, dropout, ...); ``fn`` names it for reports."""

    fn: str
    flops_per_element: int = 1
    # run inside a neighbouring GEMM's epilogue: no kernel and no HBM round trip (echosim.passes.fused_mlp)
    epilogue: bool = False

    def __str__(self) -> str:
        return f"{self.fn} [epilogue]" if self.epilogue else self.fn


#: Bytes per element, as (per activation byte, fp32 bytes), and kernels of the Llama reference RMSNorm
#: ``(x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).type_as(x) * weight`` under eager autograd
#: (torchtitan/models/norms.py RMSNorm at commit 9dec370). Forward, per element of x: upcast (read a,
#: write 4), pow (4 + 4), mean (4), multiply by the row's rsqrt (4 + 4), downcast (4 + a), times the
#: weight (a + a): 4a + 28 bytes in 8 kernels (eps add and rsqrt on one value per row). Backward through
#: the same graph, PyTorch's derivative formulas, weight gradient apart (its ``pgrad`` node): grad x
#: weight (a + a), upcast of the gradient (a + 4), the rsqrt product's two gradients (4 + 4, then 4 + 4
#: + 4 and a row sum 4), mean's expand (4), pow's ``grad * 2 * x`` (x.pow(1): 4 + 4, times 2: 4 + 4,
#: times grad: 4 + 4 + 4), the two gradients of x added (4 + 4 + 4), downcast (4 + a): 4a + 76 bytes in
#: 13 kernels (eps add and rsqrt again tiny). Inductor (torch.compile) or a fused kernel moves 2a forward, 3a backward.
REFERENCE_RMSNORM: dict[bool, tuple[int, int, int]] = {False: (4, 28, 8), True: (4, 76, 13)}  # by "is backward"


@dataclass(frozen=True, slots=True)
class NormAttrs:
    """``reference``: the Llama reference RMSNorm module (upcast, pow, mean, rsqrt, multiply, downcast,
    weight) run op by op under eager autograd instead of one fused kernel (:mod:`echosim.passes.attention`)."""

    kind: str  # "layernorm" | "rmsnorm"
    reference: bool = False

    def __str__(self) -> str:
        return f"{self.kind} reference" if self.reference else self.kind


@dataclass(frozen=True, slots=True)
class EmbeddingAttrs:
    """A lookup of rows of a ``vocab x dim`` table.

    ``lookups``: rows gathered per run when that differs from one per output row (a pooled
    ``embedding_bag`` sums several rows into each output row); 0: one per output row.
    ``sparse``: the table is updated row by row in backward by a fused sparse optimizer
    (TorchRec / FBGEMM table-batched embeddings): no dense gradient, no gradient all-reduce.
    """

    vocab: int
    dim: int
    tp: str = ""
    lookups: int = 0
    sparse: bool = False

    def __str__(self) -> str:
        parts = [f"vocab={self.vocab} dim={self.dim}"]
        if self.tp:
            parts.append(f"tp={self.tp}")
        if self.lookups:
            parts.append(f"lookups={self.lookups}")
        if self.sparse:
            parts.append("sparse")
        return " ".join(parts)


#: Bytes per logit the cross-entropy kernels of a framework move, as (forward, backward) pairs of
#: (multiple of the logits' itemsize ``a``, fixed fp32 bytes): ``m * a + b``. Counted kernel by
#: kernel from the source; '' (no entry) = one pass over the logits in and the gradient out (the IR op).
#:
#: ``unfused``: Megatron-Core's VocabParallelCrossEntropy in eager PyTorch (megatron/core/tensor_parallel/
#: cross_entropy.py, Megatron-LM commit d98e8a6; megatron/mpu/cross_entropy.py with gpt_model's
#: ``output.float()`` in 2021-2022, commit 01fc083; ``logits.float()`` in compute_language_model_loss and an
#: out-of-place subtraction, same bytes, in early 2024, commit 2894a4b): forward ``.float()`` (read a, write 4),
#: ``max`` (read 4), ``-=`` max in place (4 + 4), ``torch.exp(out=)`` (4 + 4), ``sum`` (4), ``div_`` by the sum (4 + 4):
#: a + 32; backward ``mul_`` by the incoming gradient (4 + 4), then autograd casts the fp32 gradient to
#: the logits' dtype (read 4, write a): a + 12.
#: ``native``: --cross-entropy-loss-fusion with cross_entropy_fusion_impl 'native'
#: (megatron/core/fusions/fused_cross_entropy.py): the same steps in three functions under ``jit_fuser``
#: (torch.compile from torch 2.2, megatron/core/jit.py), each one kernel: the upcast with the max (read a,
#: write 4), subtract, exp and sum (4 + 4), the division (4 + 4): a + 20; backward one function that scales
#: the saved softmax in place (read 4, write 4) and returns it in bf16 (write a): a + 8.
#: ``te``: cross_entropy_fusion_impl 'te', Transformer Engine's Triton parallel cross entropy
#: (transformer_engine/pytorch/triton/cross_entropy.py from TE commit 8ca2caf, 2025-02, until v2.18's 01bbe3e
#: keeps the gradient in fp32; the releases of the Megatron-Bridge rows):
#: online_softmax_kernel reads the logits once (a), cross_entropy_kernel reads them again and writes the
#: gradient over them in place (a + a): 3a; backward element_mul_kernel scales it in place (a + a): 2a
#: (the loss is per token, so grad_output is not the scalar 1.0 that skips it).
#: ``eager``: torchtitan's uncompiled loss, ``F.cross_entropy(pred.flatten(0, 1).float(), labels)``
#: (torchtitan/train.py at 9dec370, components/loss.py at b5bcd76): ``.float()`` (read a, write 4), then
#: ``log_softmax``, whose rows of a large vocabulary (over the 48 KiB of shared memory a block gets) run
#: ``cunn_SoftMaxForward``: the max, the sum of exponentials and the write each read the row (4 + 4 + 4 + 4);
#: ``nll_loss`` gathers one logit per token: a + 20. Backward ``nll_loss_backward`` zero-fills its fp32
#: gradient (4) before scattering the tokens' values, ``cunn_SoftMaxBackward`` sums the incoming gradient,
#: then reads it with the saved output and writes the result (4 + 4 + 4 + 4), autograd casts it back to the
#: logits' dtype (4 + a): a + 24 (aten/src/ATen/native/cuda/SoftMax.cu, LossNLL.cu).
#: ``eager-loss-parallel``: the same loss of a vocabulary-parallel slice (tp > 1, under
#: ``loss_parallel()``): DTensor's handlers run the decomposition op by op
#: (torch/distributed/tensor/parallel/loss.py, ``_log_softmax``, ``_nll_loss_and_log_softmax_backward``):
#: ``.float()`` (a + 4), ``amax`` (4), ``x - max`` (4 + 4), ``exp`` (4 + 4), ``sum`` (4), ``shifted - lse``
#: (4 + 4): a + 36; backward ``zeros_like`` (4), ``exp(x)`` (4 + 4), the sum (4 + 4 + 4), the product by the
#: per-token gradient (4 + 4), the cast back (4 + a): a + 36.
LOSS_KERNEL_BYTES: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {
    "unfused": ((1, 32), (1, 12)),
    "native": ((1, 20), (1, 8)),
    "te": ((3, 0), (2, 0)),
    "eager": ((1, 20), (1, 24)),
    "eager-loss-parallel": ((1, 36), (1, 36)),
}


@dataclass(frozen=True, slots=True)
class CrossEntropyAttrs:
    """``kernel``: the framework's loss kernels, a key of :data:`LOSS_KERNEL_BYTES` ('' = one pass)."""

    vocab: int
    tp: str = ""
    kernel: str = ""

    def __str__(self) -> str:
        tp = f" tp={self.tp}" if self.tp else ""
        return f"vocab={self.vocab}{tp}" + (f" {self.kernel}" if self.kernel else "")


class Axis(IdentityEnum):
    """A parallel axis a collective runs over; its value names it in reports (``comm.tp``).

    The backend places each axis's groups on the machine (how many nodes one group spans,
    how many groups share a node's links), so the axis says *where* bytes travel.
    """

    TP = "tp"
    PP = "pp"
    DP = "dp"
    CP = "cp"
    # hierarchical context parallelism (Megatron-Core's a2a+p2p): all_to_alls inside groups of ``cp_a2a``
    # neighbouring CP ranks, then the ring over the ``cp / cp_a2a`` ranks those groups leave apart
    CP_A2A = "cp_a2a"
    CP_P2P = "cp_p2p"
    EP = "ep"
    EDP = "edp"  # the data-parallel group of routed experts (dp * cp / ep ranks)
    FSDP = "fsdp"  # ZeRO-3 / FSDP parameter and gradient traffic, placed like dp
    EFSDP = "efsdp"  # the experts' share of it, placed like edp
    EMBED = "embed"  # tied embedding gradients between the first and the last pipeline stage
    # table-wise-row-wise embedding sharding (TorchRec's intra_and_cross_node_pg): the data-parallel ranks of
    # one node, and the ranks with the same local rank on every node
    DP_INTRA = "dp_intra"
    DP_CROSS = "dp_cross"


class Role(IdentityEnum):
    """When a collective runs in the step; the pass that inserts it decides, the timeline reads it.

    ``LAYER``: inside one micro-batch's forward or backward, on the communication stream;
    ``GRAD_SYNC``: a gradient reduction overlapped with the last micro-batch's backward (the
    data-parallel tail); ``STEP_END``: after the last backward, before or around the optimizer
    step; ``PIPELINE``: a point-to-point transfer between stages, composed by the schedule.
    """

    LAYER = "layer"
    GRAD_SYNC = "grad_sync"
    STEP_END = "step_end"
    PIPELINE = "pipeline"


@dataclass(frozen=True, slots=True)
class CollectiveAttrs:
    """A collective over one parallel axis (``tp``, ``dp``, ``pp`` ...) of ``size`` ranks.

    ``bytes`` is the nccl-tests buffer size (all_reduce input, all_gather output,
    reduce_scatter input, send/recv payload). An expert-parallel all_to_all that a
    DeepEP-style dispatcher runs (a token crosses the network once per destination node,
    then NVLink to each expert's GPU) carries its layer's routed ``experts`` and choices
    per token ``top_k``; 0 for NCCL's all_to_all. Under group-limited routing a token's experts
    come from ``group_topk`` of ``groups`` equal groups of experts (0: any expert).
    ``bucket_copy``: a gradient reduction whose
    gradients the framework copies into a flat bucket before it and back after it (PyTorch DDP
    with ``gradient_as_bucket_view=False``; the timeline costs the copies on the compute stream).
    ``blocking``: the framework synchronises the device before it launches this collective, so it runs in
    line with compute instead of beside it. ``rank_copies``: the framework calls PyTorch's list form of the
    collective, which copies one slice per rank between NCCL's flat buffer and the caller's tensors.
    ``pieces``: the framework runs it as one collective per tensor, of these sizes (bytes, summing to
    ``bytes``; empty: one collective).
    ``ready``: a PyTorch DDP bucket (``echosim.passes.data_parallel.ddp_bucket_assignment``), outside the
    repeated block because it may span layers: where in the backward its last gradient becomes ready, 0 after
    the units before the block, ``j`` after the block's ``j``-th repetition, repeats + 1 at its end (-1: not
    such a bucket; a gradient reduction of the block is ready after each repetition, the rest at the end).
    """

    axis: Axis
    size: int
    bytes: int
    role: Role = Role.LAYER
    experts: int = 0
    top_k: int = 0
    groups: int = 0
    group_topk: int = 0
    bucket_copy: bool = False
    blocking: bool = False
    rank_copies: bool = False
    pieces: tuple[int, ...] = ()
    ready: int = -1
    # bytes the rank first copies from host memory over its host link: a ZeRO-3 weight shard kept there
    # (Plan.offload_params: DeepSpeed's offload_param fetches the shard to the device, then all-gathers it)
    host_bytes: int = 0

    def __str__(self) -> str:
        role = f" role={self.role.value}" if self.role is not Role.LAYER else ""
        deepep = f" deepep experts={self.experts} top_k={self.top_k}" if self.top_k else ""
        if self.groups:
            deepep += f" groups={self.group_topk}/{self.groups}"
        copy = " bucket_copy" if self.bucket_copy else ""
        copy += " blocking" if self.blocking else ""
        copy += " rank_copies" if self.rank_copies else ""
        copy += f" pieces={len(self.pieces)}" if self.pieces else ""
        copy += f" ready={self.ready}" if self.ready >= 0 else ""
        copy += f" host_bytes={self.host_bytes}" if self.host_bytes else ""
        return f"axis={self.axis.value} size={self.size} bytes={self.bytes}{role}{deepep}{copy}"


@dataclass(frozen=True, slots=True)
class OptimizerAttrs:
    """One fused optimizer step over ``params`` local elements. ``host_ranks``: 0 where the device steps it; else
    the host CPU does, on state kept in host memory (DeepSpeed's ZeRO-Offload, Megatron-Core's
    ``--optimizer-cpu-offload``), for a job of that many ranks (a host's share of them step at once), and
    ``bytes_per_param`` is the host's traffic; ``overlapped``: its copies and host update pipelined."""

    kind: str
    params: int
    bytes_per_param: int
    host_ranks: int = 0
    overlapped: bool = False

    def __str__(self) -> str:
        host = f" host_ranks={self.host_ranks}" if self.host_ranks else ""
        host += " overlapped" if self.overlapped else ""
        return f"{self.kind} params={self.params} bytes/param={self.bytes_per_param}{host}"


Attrs = (
    NoAttrs
    | ViewAttrs
    | ParamAttrs
    | MatmulAttrs
    | AttentionAttrs
    | ElementwiseAttrs
    | NormAttrs
    | EmbeddingAttrs
    | CrossEntropyAttrs
    | CollectiveAttrs
    | OptimizerAttrs
)

ATTRS_FOR: dict[OpKind, tuple[type, ...]] = {
    OpKind.INPUT: (NoAttrs,),
    OpKind.PARAMETER: (ParamAttrs,),
    OpKind.MATMUL: (MatmulAttrs,),
    OpKind.ATTENTION: (AttentionAttrs,),
    OpKind.ELEMENTWISE: (ElementwiseAttrs,),
    OpKind.NORM: (NormAttrs,),
    OpKind.SOFTMAX: (NoAttrs,),
    OpKind.EMBEDDING: (EmbeddingAttrs,),
    OpKind.REDUCTION: (ElementwiseAttrs, NoAttrs),
    OpKind.VIEW: (NoAttrs, ViewAttrs),
    OpKind.CROSS_ENTROPY: (CrossEntropyAttrs,),
    OpKind.OPTIMIZER_UPDATE: (OptimizerAttrs,),
    **{kind: (CollectiveAttrs,) for kind in COLLECTIVES},
}
