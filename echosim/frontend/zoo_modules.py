"""The torch modules behind the zoo (:func:`build_module`); plain PyTorch so torch.fx traces them as written.

Module names follow the conventions sharding plans match on: ``attn.qkv`` /
``attn.q_proj`` (column-parallel), ``attn.proj`` / ``attn.o_proj`` (row-parallel),
``mlp.fc1`` / ``mlp.gate_proj`` (column), ``mlp.fc2`` / ``mlp.down_proj`` (row),
``embed`` (vocab-parallel) and ``lm_head``. MoE layers name their router
``moe.router`` (replicated) and their experts ``moe.experts.{gate,up,down}_proj``,
so expert weights match the same column/row-parallel patterns.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from echosim.frontend.attention_ops import local_attention
from echosim.frontend.moe_ops import expert_bias_rows, grouped_mm, moe_combine, moe_dispatch
from echosim.frontend.zoo import ArchConfig

# Routing is data-dependent: fx records these as single calls (leaves) instead of tracing into them.
torch.fx.wrap("moe_dispatch")
torch.fx.wrap("grouped_mm")
torch.fx.wrap("moe_combine")
torch.fx.wrap("expert_bias_rows")
torch.fx.wrap("local_attention")  # sliding-window attention: one call with its window (attention_ops.py)


def _embedding(num: int, dim: int) -> nn.Embedding:
    """An embedding without its random init: on meta there is nothing to fill, and the
    default init path imports torch._dynamo (about 1.5 s)."""
    return nn.Embedding(num, dim, _weight=torch.empty(num, dim))


class GPTAttention(nn.Module):
    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.p = cfg.heads, cfg.n_kv_heads, cfg.dim_head, cfg.dropout
        inner = cfg.heads * cfg.dim_head
        # One fused Linear for q, k and v; with grouped-query attention (Nemotron-4, Megatron-Core's
        # GPT with num_query_groups) k and v have kv_heads heads each.
        self.qkv = nn.Linear(cfg.hidden, inner + 2 * self.kv_heads * cfg.dim_head)
        self.proj = nn.Linear(inner, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        kv = self.kv_heads * self.head_dim
        q, k, v = self.qkv(x).split((self.heads * self.head_dim, kv, kv), dim=-1)
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        gqa = self.kv_heads != self.heads
        o = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p, is_causal=True, enable_gqa=gqa)
        return self.proj(o.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


class GPTMLP(nn.Module):
    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden, cfg.ffn_hidden)
        self.fc2 = nn.Linear(cfg.ffn_hidden, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class GPTBlock(nn.Module):
    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.attn = GPTAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.hidden)
        self.mlp = GPTMLP(cfg)
        self.drop1 = nn.Dropout(cfg.dropout)
        self.drop2 = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop1(self.attn(self.ln1(x)))
        return x + self.drop2(self.mlp(self.ln2(x)))


class GPT(nn.Module):
    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.embed = _embedding(cfg.vocab, cfg.hidden)
        self.pos = _embedding(cfg.seq_len, cfg.hidden)
        self.drop = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(GPTBlock(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        if cfg.tied_embeddings:
            self.lm_head.weight = self.embed.weight

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        positions = self.pos.weight.narrow(0, 0, input_ids.shape[1])
        x = self.drop(self.embed(input_ids) + positions)
        for layer in self.layers:
            x = layer(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ArchConfig, window: int | None = None) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.n_kv_heads, cfg.dim_head
        self.window = window  # a scalar setting: local and global layers do not fold together
        self.q_proj = nn.Linear(cfg.hidden, cfg.heads * cfg.dim_head, bias=False)
        self.k_proj = nn.Linear(cfg.hidden, cfg.n_kv_heads * cfg.dim_head, bias=False)
        self.v_proj = nn.Linear(cfg.hidden, cfg.n_kv_heads * cfg.dim_head, bias=False)
        self.o_proj = nn.Linear(cfg.heads * cfg.dim_head, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        gqa = self.kv_heads != self.heads
        if self.window is not None:
            o = local_attention(q, k, v, self.window, gqa)
        else:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        return self.o_proj(o.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


class MLAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-V2/V3; module names as HF's DeepseekV3Attention).

    Queries come from a ``q_lora_rank`` latent (or a plain projection), keys and values from one
    ``kv_lora_rank`` latent plus a rotary key shared by all heads. The down projections are
    replicated under tensor parallelism (Megatron-Core's MLA), the up projections split by heads.
    """

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        h, a, c = cfg.hidden, cfg.heads, cfg.kv_lora_rank
        self.heads, self.rope, self.v_dim = a, cfg.rope_head_dim, cfg.v_head_dim
        self.qk_dim, self.nope, self.latent = cfg.dim_head, cfg.dim_head - cfg.rope_head_dim, c
        if cfg.q_lora_rank:
            self.q_a_proj = nn.Linear(h, cfg.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, a * self.qk_dim, bias=False)
        else:
            self.q_proj = nn.Linear(h, a * self.qk_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(h, c + self.rope, bias=False)
        self.kv_a_layernorm = RMSNorm(c)
        self.kv_b_proj = nn.Linear(c, a * (self.nope + self.v_dim), bias=False)
        self.o_proj = nn.Linear(a * self.v_dim, h, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if hasattr(self, "q_b_proj") else self.q_proj(x)
        q = q.view(b, s, self.heads, self.qk_dim).transpose(1, 2)
        q_nope, q_rope = q.split((self.nope, self.rope), dim=-1)
        latent, k_rope = self.kv_a_proj_with_mqa(x).split((self.latent, self.rope), dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(b, s, self.heads, self.nope + self.v_dim)
        k_nope, v = kv.transpose(1, 2).split((self.nope, self.v_dim), dim=-1)
        k_rope = _rotate(k_rope.view(b, 1, s, self.rope), cos, sin).expand(b, self.heads, s, self.rope)
        q = torch.cat((q_nope, _rotate(q_rope, cos, sin)), dim=-1)
        k = torch.cat((k_nope, k_rope), dim=-1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(o.transpose(1, 2).reshape(b, s, self.heads * self.v_dim))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ArchConfig, ffn: int = 0) -> None:
        super().__init__()
        ffn = ffn or cfg.ffn_hidden
        self.gate_proj = nn.Linear(cfg.hidden, ffn, bias=False)
        self.up_proj = nn.Linear(cfg.hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class GroupedLinear(nn.Module):
    """One ``[in, out]`` weight per expert; rows arrive grouped by expert."""

    def __init__(self, experts: int, fan_in: int, fan_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(experts, fan_in, fan_out))

    def forward(self, rows: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
        return grouped_mm(rows, self.weight, expert_ids)


class Experts(nn.Module):
    """``experts`` SwiGLU MLPs run as three grouped GEMMs."""

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        e, h, f = cfg.experts, cfg.hidden, cfg.expert_ffn
        self.gate_proj = GroupedLinear(e, h, f)
        self.up_proj = GroupedLinear(e, h, f)
        self.down_proj = GroupedLinear(e, f, h)
        self.clamp = cfg.expert_clamp
        self.down_bias = nn.Parameter(torch.empty(e, h)) if cfg.expert_bias else None

    def forward(self, rows: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_proj(rows, ids), self.up_proj(rows, ids)
        if self.clamp:  # as Megatron-Core clamps (ArchConfig.expert_clamp): each half, then one concatenation
            limit = self.clamp
            gate, up = torch.cat((gate.clamp(max=limit), up.clamp(min=-limit, max=limit)), -1).chunk(2, -1)
        out = self.down_proj(F.silu(gate) * up, ids)
        if self.down_bias is not None:  # ArchConfig.expert_bias: b * p, the add, the experts' pieces concatenated
            out = torch.cat((out + expert_bias_rows(self.down_bias, ids, weights),))
        return out


class MoE(nn.Module):
    """Top-k routed experts plus optional shared experts (softmax, then top-k, as Megatron-Core)."""

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.top_k = cfg.top_k
        self.router = nn.Linear(cfg.hidden, cfg.experts, bias=False)
        self.experts = Experts(cfg)
        self.shared = LlamaMLP(cfg, cfg.expert_ffn * cfg.shared_experts) if cfg.shared_experts else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.flatten(0, 1)
        probs = F.softmax(self.router(tokens), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        out = moe_combine(self.experts(moe_dispatch(tokens, ids), ids, weights), ids, weights)
        if self.shared is not None:
            out = out + self.shared(tokens)
        return out.view_as(x)


class LlamaBlock(nn.Module):
    def __init__(self, cfg: ArchConfig, index: int = 0) -> None:
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden)
        self.attn = MLAttention(cfg) if cfg.mla else LlamaAttention(cfg, cfg.attention_window(index))
        self.post_norm = RMSNorm(cfg.hidden)
        if cfg.is_moe_layer(index):
            self.moe = MoE(cfg)
        else:
            self.mlp = LlamaMLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.input_norm(x), cos, sin)
        ffn = self.moe if hasattr(self, "moe") else self.mlp
        return x + ffn(self.post_norm(x))


class MTPLayer(nn.Module):
    """One multi-token-prediction depth (:attr:`ArchConfig.mtp_layers`): norms, the 2h -> h projection,
    one more block (the model's last layer kind) and its own final norm before the shared output head."""

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.enorm = RMSNorm(cfg.hidden)
        self.hnorm = RMSNorm(cfg.hidden)
        self.eh_proj = nn.Linear(2 * cfg.hidden, cfg.hidden, bias=False)
        self.block = LlamaBlock(cfg, cfg.layers - 1)
        self.norm = RMSNorm(cfg.hidden)

    def forward(
        self, hidden: torch.Tensor, embedded: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        x = self.eh_proj(torch.cat((self.enorm(embedded), self.hnorm(hidden)), dim=-1))
        return self.block(x, cos, sin)


class LayerBlock(nn.ModuleList):
    """``layers_per_block`` consecutive layers (the dense ones, then the MoE one; the local ones, then the
    global one): the unit that repeats when layers interleave, so the fold keeps one block with the block count."""

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        for layer in self:
            x = layer(x, cos, sin)
        return x


class Llama(nn.Module):
    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.embed = _embedding(cfg.vocab, cfg.hidden)
        step = cfg.layers_per_block
        if step > 1:
            blocks = range(0, cfg.layers, step)
            self.layers = nn.ModuleList(LayerBlock(LlamaBlock(cfg, i + j) for j in range(step)) for i in blocks)
        else:
            self.layers = nn.ModuleList(LlamaBlock(cfg, i) for i in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        if cfg.mtp_layers:
            self.mtp = nn.ModuleList(MTPLayer(cfg) for _ in range(cfg.mtp_layers))
        if cfg.tied_embeddings:
            self.lm_head.weight = self.embed.weight
        rot = cfg.rope_head_dim if cfg.mla else cfg.dim_head  # MLA rotates only its rope part
        inv = 1.0 / (10000.0 ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
        freqs = torch.outer(torch.arange(cfg.seq_len, dtype=torch.float32), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        s = input_ids.shape[1]
        cos, sin = self.cos.narrow(0, 0, s), self.sin.narrow(0, 0, s)
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        for depth in getattr(self, "mtp", ()):  # the shared embedding of the next tokens (shapes as the ids')
            x = depth(x, self.embed(input_ids), cos, sin)
            loss = loss + F.cross_entropy(self.lm_head(depth.norm(x)).flatten(0, 1), labels.flatten())
        return loss


def build_module(cfg: ArchConfig) -> nn.Module:
    """The ``nn.Module`` for ``cfg``, built on the meta device: no weight is allocated."""
    with torch.device("meta"):
        if cfg.arch == "gpt":
            return GPT(cfg)
        if cfg.arch in ("llama", "moe"):
            return Llama(cfg)  # moe: the llama skeleton; its blocks hold MoE layers
    raise ValueError(f"unknown architecture {cfg.arch!r} (known: gpt, llama, moe)")
