"""Named architectures as data: the small parameter set each is built from (no torch here).

:func:`echosim.frontend.zoo_modules.build_module` turns an :class:`ArchConfig` into
an ``nn.Module`` on the ``meta`` device. Three families cover the rows of published training runs:

* ``gpt``: LayerNorm, GELU 4h MLP, multi-head attention, learned positions,
  embedding tied to the output layer (GPT-3 / Megatron).
* ``llama``: RMSNorm, SwiGLU MLP, rotary positions, grouped-query attention,
  untied output layer (Llama 2/3).
* ``moe``: the llama block with its MLP replaced by a mixture of experts: a linear
  router with top-k choice, ``experts`` routed SwiGLU experts of width ``moe_ffn``
  and ``shared_experts`` always-on experts of the same width (Mixtral, Qwen3-MoE,
  GPT-OSS, Grok-1; DeepSeek-style fine-grained + shared experts).

Shapes come from the papers and model cards cited per entry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class ArchConfig:
    """The small parameter set every zoo model is built from."""

    arch: str  # "gpt" | "llama" | "moe"
    layers: int
    hidden: int
    heads: int
    vocab: int
    ffn: int = 0  # 0: 4 * hidden
    kv_heads: int = 0  # 0: heads
    head_dim: int = 0  # 0: hidden // heads
    seq_len: int = 2048
    dropout: float = 0.0
    tied_embeddings: bool = False
    description: str = ""
    experts: int = 0  # routed experts per MoE layer (arch "moe")
    top_k: int = 0  # experts each token is sent to
    moe_ffn: int = 0  # FFN width of one expert; 0: ffn_hidden
    shared_experts: int = 0  # always-on experts of width moe_ffn
    # Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434 sec. 2.1): keys and values come from
    # a kv_lora_rank latent, queries from a q_lora_rank one (0: a plain q projection); head_dim is
    # the query/key head (nope + rope_head_dim), v_head_dim the value head. kv_lora_rank 0: no MLA.
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    rope_head_dim: int = 0
    v_head_dim: int = 0
    dense_layers: int = 0  # the first layers of a moe model keep a dense MLP of width ffn (DeepSeek)
    # Every moe_layer_step-th layer is a MoE layer, the others keep a dense MLP of width ffn: layer i
    # (from 0) is MoE when (i + 1) % moe_layer_step == 0, the rule of HF transformers' Llama 4
    # (``interleave_moe_layer_step``, models/llama4/configuration_llama4.py ``moe_layers``) and of
    # MaxText (src/maxtext/models/llama4.py ``determine_is_moe_layer``, commit e591f30). Llama 4
    # Maverick: 2 (MaxText configs/models/llama4-17b-128e.yml line 37); 1: every layer (after dense_layers).
    moe_layer_step: int = 1
    # Sliding-window (local) attention: a local layer's query sees the sliding_window most recent keys,
    # itself included (HF transformers ``sliding_window``); 0: every layer attends to all earlier keys.
    # With a window, layer i (from 0) is global (full attention) when (i + 1) % global_layer_step == 0,
    # the rule of HF's Gemma 3 config (``sliding_window_pattern`` 6 -> ``layer_types``, five local then
    # one global) and of gpt-oss's (``layer_types`` alternating sliding / full: step 2); 0: every layer
    # is local (Mistral 7B v0.1).
    sliding_window: int = 0
    global_layer_step: int = 0
    # Multi-token prediction (DeepSeek-V3, arXiv:2412.19437 sec. 2.2): each of mtp_layers sequential modules
    # norms the previous depth's hidden state and the shared embedding of the next token, projects their
    # concatenation (2h -> h), runs one more transformer block (a MoE one in a moe model), and the shared
    # output head and a cross-entropy on the result. Megatron-Core puts the modules after the decoder
    # (``mtp`` in pipeline_model_parallel_layout), so they run on the last pipeline stage.
    mtp_layers: int = 0
    # gpt-oss's clamped SwiGLU (arXiv:2508.10925 sec. 2.1; HF ``swiglu_limit`` 7.0): the experts' gate is
    # clamped from above and their linear half to [-limit, limit] before the activation; 0: no clamp.
    # Megatron-Core applies it outside its fused activation kernel: ``weighted_bias_quick_geglu_impl``
    # (megatron/core/fusions/fused_bias_geglu.py, Megatron-LM d728871 = Megatron-Bridge v0.4.1's, the same
    # in 0d8e071 = v0.2.0's and b0cc270 = v0.3.0's) chunks fc1's output, clamps each half and concatenates
    # them (three memory-bound kernels forward; in backward the clamps' masks and the chunk's concatenated
    # gradient) before the fused GeGLU; the Megatron-Bridge gpt-oss bridge sets
    # ``activation_func_clamp_value = 7.0`` (src/megatron/bridge/models/gpt_oss/gpt_oss_bridge.py).
    expert_clamp: float = 0.0
    # Biased experts (gpt-oss: HF ``gate_up_proj_bias`` / ``down_proj_bias``; Megatron-Bridge's bridge sets
    # ``add_bias_linear = True``). fc1's bias rides in TE GroupedLinear's GEMM (``skip_bias_add=False``) and is
    # not an op of its own; fc2's is added after the grouped GEMM by TEGroupedMLP ``_apply_bias``
    # (megatron/core/transformer/moe/experts.py, Megatron-LM d728871 = Megatron-Bridge v0.4.1's; the same
    # in 0d8e071 and b0cc270): per local expert ``t + b * p`` (p: the router weights), then ``torch.cat`` of
    # the pieces: a scaled-bias write, an add and a copy of fc2's output, and their gradients. Only fc2's
    # bias is counted here (``[experts, hidden]`` per MoE layer).
    expert_bias: bool = False

    @property
    def ffn_hidden(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def expert_ffn(self) -> int:
        return self.moe_ffn or self.ffn_hidden

    def with_(self, **changes: Any) -> ArchConfig:
        return replace(self, **changes)

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    def attention_params(self) -> int:
        """Weights of one llama-style attention block: GQA projections or MLA's latent ones."""
        h, hd, a, kv = self.hidden, self.dim_head, self.heads, self.n_kv_heads
        if not self.mla:
            return h * (a + 2 * kv) * hd + a * hd * h
        rope, v, c = self.rope_head_dim, self.v_head_dim, self.kv_lora_rank
        q = self.q_lora_rank * (h + 1 + a * hd) if self.q_lora_rank else h * a * hd  # down, norm, up
        kv_path = h * (c + rope) + c + c * a * (hd - rope + v)  # down (with the shared rope key), norm, up
        return q + kv_path + a * v * h

    def is_moe_layer(self, index: int) -> bool:
        """Whether layer ``index`` (from 0) holds the experts: after the dense first layers, every
        ``moe_layer_step``-th one."""
        return self.arch == "moe" and index >= self.dense_layers and (index + 1) % max(self.moe_layer_step, 1) == 0

    @property
    def moe_layers(self) -> int:
        """How many layers hold experts (0 for a dense model)."""
        return sum(self.is_moe_layer(i) for i in range(self.layers))

    def attention_window(self, index: int) -> int | None:
        """The sliding window of layer ``index`` (from 0); ``None``: full (global) attention."""
        if self.sliding_window <= 0:
            return None
        step = self.global_layer_step
        return None if step > 0 and (index + 1) % step == 0 else self.sliding_window

    @property
    def layers_per_block(self) -> int:
        """Layers of the block that repeats: ``moe_layer_step`` dense-then-MoE layers, ``global_layer_step``
        local-then-global layers, both when both interleave (their least common multiple), else one."""
        moe = self.moe_layer_step if self.arch == "moe" and self.moe_layer_step > 1 else 1
        local = self.global_layer_step if self.sliding_window > 0 and self.global_layer_step > 1 else 1
        return math.lcm(moe, local)

    def active_params(self) -> int:
        """Parameters one token runs through: routed experts count top_k of ``experts``."""
        if self.arch != "moe":
            return self.param_count()
        idle = self.moe_layers * 3 * self.hidden * self.expert_ffn * (self.experts - self.top_k)
        return self.param_count() - idle

    def param_count(self) -> int:
        """Closed-form parameter count (checked against the built module in tests)."""
        h, hd, a, kv = self.hidden, self.dim_head, self.heads, self.n_kv_heads
        if self.arch == "gpt":
            attn = h * (a + 2 * kv) * hd + (a + 2 * kv) * hd + a * hd * h + h
            mlp = 2 * h * self.ffn_hidden + self.ffn_hidden + h
            norms = 4 * h
            embed = self.vocab * h + self.seq_len * h
            head = 0 if self.tied_embeddings else self.vocab * h
            return self.layers * (attn + mlp + norms) + embed + 2 * h + head
        attn = self.attention_params()
        dense = 3 * h * self.ffn_hidden
        mlp, dense_layers = dense, self.layers
        if self.arch == "moe":
            router = h * self.experts
            mlp = router + 3 * h * self.expert_ffn * (self.experts + self.shared_experts)
            mlp += self.experts * h if self.expert_bias else 0
            dense_layers = self.layers - self.moe_layers
        norms = 2 * h
        embed = self.vocab * h
        head = 0 if self.tied_embeddings else self.vocab * h
        layers = self.layers * (attn + norms) + dense_layers * dense + (self.layers - dense_layers) * mlp
        block = attn + norms + (mlp if self.arch == "moe" else dense)
        mtp = self.mtp_layers * (2 * h + 2 * h * h + block + h)  # two norms, projection, block, final norm
        return layers + embed + h + head + mtp


def _gpt(layers: int, hidden: int, heads: int, head_dim: int = 0, desc: str = "") -> ArchConfig:
    return ArchConfig(
        "gpt",
        layers,
        hidden,
        heads,
        vocab=51200,
        head_dim=head_dim,
        seq_len=2048,
        dropout=0.1,
        tied_embeddings=True,
        description=desc,
    )


_GPT3 = "GPT-3 paper (Brown et al. 2020, arXiv:2005.14165) Table 2.1; Megatron vocab 51200"
_L2 = "Llama 2 (Touvron et al. 2023, arXiv:2307.09288) / HF config"
_L3 = "Llama 3 herd (Dubey et al. 2024, arXiv:2407.21783) Table 3 / HF config"
_MISTRAL = (
    "Mistral 7B v0.1 (Jiang et al. 2023, arXiv:2310.06825) Table 1 / HF config: every layer attends within a "
    "4096-token sliding window, context 8192"
)

ZOO: dict[str, ArchConfig] = {
    "gpt3-125m": _gpt(12, 768, 12, desc=_GPT3),
    "gpt3-350m": _gpt(24, 1024, 16, desc=_GPT3),
    "gpt3-760m": _gpt(24, 1536, 16, desc=_GPT3),
    "gpt3-1.3b": _gpt(24, 2048, 16, desc=_GPT3),
    "gpt3-2.7b": _gpt(32, 2560, 32, desc=_GPT3),
    "gpt3-6.7b": _gpt(32, 4096, 32, desc=_GPT3),
    "gpt3-13b": _gpt(40, 5140, 40, head_dim=128, desc=_GPT3),
    "gpt3-175b": _gpt(96, 12288, 96, desc=_GPT3),
    "llama2-7b": ArchConfig("llama", 32, 4096, 32, 32000, ffn=11008, seq_len=4096, description=_L2),
    "llama2-13b": ArchConfig("llama", 40, 5120, 40, 32000, ffn=13824, seq_len=4096, description=_L2),
    "llama2-70b": ArchConfig("llama", 80, 8192, 64, 32000, ffn=28672, kv_heads=8, seq_len=4096, description=_L2),
    "llama3-8b": ArchConfig("llama", 32, 4096, 32, 128256, ffn=14336, kv_heads=8, seq_len=8192, description=_L3),
    "llama3-70b": ArchConfig("llama", 80, 8192, 64, 128256, ffn=28672, kv_heads=8, seq_len=8192, description=_L3),
    "llama3-405b": ArchConfig("llama", 126, 16384, 128, 128256, ffn=53248, kv_heads=8, seq_len=8192, description=_L3),
    "mistral-7b": ArchConfig(
        "llama", 32, 4096, 32, 32000, ffn=14336, kv_heads=8, seq_len=8192, sliding_window=4096, description=_MISTRAL
    ),
}

_MIXTRAL = "Mixtral of Experts (Jiang et al. 2024, arXiv:2401.04088) Table 1 / HF config"
_QWEN3 = "Qwen3 technical report (arXiv:2505.09388) Table 2 / HF config"
#: gpt-oss's SwiGLU clamp (HF openai/gpt-oss-120b config.json ``swiglu_limit`` 7.0; Megatron-Bridge
#: gpt_oss_bridge.py ``activation_func_clamp_value = 7.0``): :attr:`ArchConfig.expert_clamp`.
GPT_OSS_SWIGLU_LIMIT = 7.0

_OSS = (
    "gpt-oss-120b model card (arXiv:2508.10925 sec. 2.1: layers alternate between banded-window attention of "
    "128 tokens and full attention) / HF config openai/gpt-oss-120b (``sliding_window`` 128, ``layer_types`` "
    "sliding_attention, full_attention, ...); the attention sinks are left out"
)
_GROK = "Grok-1 open release (github.com/xai-org/grok-1) config; cases.csv dgxc2504 rows"
_DSV3 = (
    "DeepSeek-V3 technical report (arXiv:2412.19437) sec. 4.2 / HF config: MLA (kv_lora 512, q_lora 1536, "
    "rope 64 + nope 128, v 128), first 3 layers dense (18432), 256 routed + 1 shared expert of 2048, top-8; "
    "the multi-token-prediction module and the router's sigmoid gate are left out"
)
_L4 = (
    "Llama 4 Maverick (Meta model card, llama.com/docs/model-cards-and-prompt-formats/llama4: 17B active, "
    "400B total) / HF config Llama-4-Maverick-17B-128E and MaxText configs/models/llama4-17b-128e.yml: 48 "
    "layers alternating dense (d_ff 16384) and MoE (interleave_moe_layer_step 2: 128 routed experts of "
    "8192, top-1, one shared expert); text decoder only, chunked attention costed as full attention"
)
_QMOE = (
    "Qwen1.5-MoE-A2.7B HF config: DeepSeek-style fine-grained (60 x 1408) + shared (4 x 1408) experts "
    "(DeepSeekMoE, Dai et al. 2024, arXiv:2401.06066); the shared-expert sigmoid gate is left out"
)


def _moe(layers: int, hidden: int, heads: int, kv: int, vocab: int, experts: int, top_k: int, moe_ffn: int,
         seq: int, desc: str, head_dim: int = 0, shared: int = 0) -> ArchConfig:  # fmt: skip
    return ArchConfig(
        "moe",
        layers,
        hidden,
        heads,
        vocab,
        kv_heads=kv,
        head_dim=head_dim,
        seq_len=seq,
        experts=experts,
        top_k=top_k,
        moe_ffn=moe_ffn,
        shared_experts=shared,
        description=desc,
    )


ZOO.update(
    {
        "mixtral-8x7b": _moe(32, 4096, 32, 8, 32000, 8, 2, 14336, 4096, _MIXTRAL),
        "mixtral-8x22b": _moe(56, 6144, 48, 8, 32768, 8, 2, 16384, 4096, _MIXTRAL),
        "qwen3-30b-a3b": _moe(48, 2048, 32, 4, 151936, 128, 8, 768, 4096, _QWEN3, head_dim=128),
        "qwen3-235b-a22b": _moe(94, 4096, 64, 4, 151936, 128, 8, 1536, 4096, _QWEN3, head_dim=128),
        "gpt-oss-120b": _moe(36, 2880, 64, 8, 201088, 128, 4, 2880, 4096, _OSS, head_dim=64).with_(
            sliding_window=128, global_layer_step=2, expert_clamp=GPT_OSS_SWIGLU_LIMIT, expert_bias=True
        ),
        "grok-1": _moe(64, 6144, 48, 8, 131072, 8, 2, 32768, 8192, _GROK, head_dim=128),
        "qwen1.5-moe-a2.7b": _moe(24, 2048, 16, 16, 151936, 60, 4, 1408, 4096, _QMOE, shared=4),
        "llama4-maverick": _moe(48, 5120, 40, 8, 202048, 128, 1, 8192, 8192, _L4, head_dim=128, shared=1).with_(
            ffn=16384, moe_layer_step=2
        ),
        "deepseek-v3": _moe(61, 7168, 128, 0, 129280, 256, 8, 2048, 4096, _DSV3, head_dim=192, shared=1).with_(
            ffn=18432, kv_lora_rank=512, q_lora_rank=1536, rope_head_dim=64, v_head_dim=128, dense_layers=3
        ),
    }
)

# Published parameter counts (model cards / papers), for tests and `echosim models`.
PUBLISHED_PARAMS: dict[str, float] = {
    "gpt3-125m": 125e6,
    "gpt3-350m": 350e6,
    "gpt3-760m": 760e6,
    "gpt3-1.3b": 1.3e9,
    "gpt3-2.7b": 2.7e9,
    "gpt3-6.7b": 6.7e9,
    "gpt3-13b": 13.0e9,
    "gpt3-175b": 175.0e9,
    "llama2-7b": 6.74e9,
    "llama2-13b": 13.0e9,
    "llama2-70b": 69.0e9,
    "llama3-8b": 8.03e9,
    "llama3-70b": 70.6e9,
    "llama3-405b": 405.9e9,
    "mistral-7b": 7.24e9,  # 7,241,732,096 in the HF checkpoint
    "mixtral-8x7b": 46.7e9,
    "mixtral-8x22b": 141e9,
    "qwen3-30b-a3b": 30.5e9,
    "qwen3-235b-a22b": 235e9,
    "gpt-oss-120b": 116.8e9,
    "grok-1": 314e9,
    "qwen1.5-moe-a2.7b": 14.3e9,
    "llama4-maverick": 400e9,  # Meta's model card: 400B total, 17B active
    "deepseek-v3": 671e9,  # without the 14B multi-token-prediction module (arXiv:2412.19437 sec. 1)
}
