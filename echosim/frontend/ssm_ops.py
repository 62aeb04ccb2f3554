"""Sequence-mixing kernels that transformers runs as Python loops where their CUDA packages are missing.

**Mamba's selective scan.** transformers' Mamba-1 family (Mamba, Falcon-Mamba, Jamba, Zamba) calls
``mamba_selective_scan``, which is mamba-ssm's fused CUDA kernel (``selective_scan_fn``) wherever that package
runs and a Python loop over the sequence otherwise: on ``meta`` the capture took the loop, one small op per token
per layer (tens of thousands of IR nodes for two tiny layers), and costed a training step as thousands of
kernel launches. Training runs the fused kernel: it loads delta, A, B, C and the input from HBM into
SRAM, discretises and scans there and writes only the output (Gu and Dao 2023, "Mamba", arXiv:2312.00752,
sec. 3.3.2), so it is memory-bound on those reads and writes; its backward recomputes the states
instead of reading them back (same section). :func:`selective_scan` is that kernel as a PyTorch
custom op with the signature of mamba-ssm's ``selective_scan_fn``; its body is a plain sequential
reference, so the op runs on CPU in tests, and its fake kernel gives export the output's shape.

**Mamba-2's state space duality (SSD)** (Dao and Gu 2024, "Transformers are SSMs", arXiv:2405.21060, sec. 6):
transformers' Mamba-2 family (Mamba-2, Nemotron-H, Bamba, Falcon-H1, Granite-4.0-H, Zamba2) calls
``mamba2_chunk_scan``, mamba-ssm's ``mamba_chunk_scan_combined`` (Triton kernels) where it runs and otherwise a
chunked reference whose einsums keep the heads in the middle of their operands, where a sharding pass cannot
tell them from the positions. :func:`ssd_scan` is that kernel as a custom op (a per-token reference body), and
the export frontend lowers it to the chunked algorithm's GEMMs with the heads leading (``aten_rules``).

**RWKV-4's WKV** (Peng et al. 2023, "RWKV", arXiv:2305.13048, sec. 3.1) is a CUDA kernel in training, one thread
per channel scanning the tokens, and a Python loop over the tokens without it: :func:`wkv` is that kernel, costed
like the selective scan (memory-bound, one backward kernel).

**The gated delta rule** (Qwen3-Next, Qwen3.5, OLMo-hybrid: Yang, Kautz and Hatamizadeh 2024, "Gated Delta
Networks", arXiv:2412.06464) is flash-linear-attention's chunked kernel (``chunk_gated_delta_rule``) in
training and otherwise transformers' chunked reference, which loops over chunks and, under export, solves each
chunk's triangular system row by row: thousands of small ops per layer. :func:`gated_delta_rule` is that kernel
as a custom op (a per-token reference body, as transformers' ``torch_recurrent_gated_delta_rule``), and the
export frontend lowers it to the chunked algorithm's GEMMs (``aten_rules``).

:func:`fused_scan` puts them in place of transformers' functions while a model is captured.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

#: transformers modules that define ``torch_chunk_gated_delta_rule`` (flash-linear-attention's kernel or its loop).
DELTA_RULE_MODULES = (
    "transformers.models.qwen3_next.modeling_qwen3_next",
    "transformers.models.qwen3_5.modeling_qwen3_5",
    "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
    "transformers.models.olmo_hybrid.modeling_olmo_hybrid",
    "transformers.models.lara_mini.modeling_lara_mini",
    "transformers.models.qwen4_exp.modeling_qwen4_exp",
)

#: transformers modules that define ``chunk_kimi_delta_attention`` (Kimi Delta Attention, FLA's ``chunk_kda``: the
#: gated delta rule with a decay per key channel; Kimi Team 2025, "Kimi Linear", arXiv:2510.26692).
KDA_MODULES = (
    "transformers.models.kimi_linear.modeling_kimi_linear",
    "transformers.models.bailing_hybrid.modeling_bailing_hybrid",
    "transformers.models.glm5_next.modeling_glm5_next",
)

#: transformers modules that define ``mamba2_chunk_scan`` (mamba-ssm's ``mamba_chunk_scan_combined`` or its
#: chunked reference in torch).
SSD_MODULES = (
    "transformers.models.mamba2.modeling_mamba2",
    "transformers.models.nemotron_h.modeling_nemotron_h",
    "transformers.models.bamba.modeling_bamba",
    "transformers.models.falcon_h1.modeling_falcon_h1",
    "transformers.models.granitemoehybrid.modeling_granitemoehybrid",
    "transformers.models.zamba2.modeling_zamba2",
)

#: transformers modules that define ``rwkv_linear_attention`` (the WKV CUDA kernel or its loop).
WKV_MODULES = ("transformers.models.rwkv.modeling_rwkv",)

#: FLOPs of the WKV scan per (batch, token, channel): two maxima, four exponentials, six multiply-adds and a division
#: for the output and the state, as the stabilised recurrence computes them (counted from the paper's formula).
WKV_FLOPS = 14

#: transformers modules that define ``mamba_selective_scan`` (mamba-ssm's ``selective_scan_fn`` or its loop).
SCAN_MODULES = (
    "transformers.models.mamba.modeling_mamba",
    "transformers.models.falcon_mamba.modeling_falcon_mamba",
    "transformers.models.jamba.modeling_jamba",
    "transformers.models.zamba.modeling_zamba",
)

#: FLOPs of the scan per (batch, channel, step) and state dimension: discretising A and B, the state update and
#: the output's dot product with C, 9 in all (Tri Dao, state-spaces/mamba issue 110, "9 * B * L * D * N").
SCAN_FLOPS_PER_STATE = 9


def _like_first(x: torch.Tensor, *_: Any) -> torch.Tensor:
    """The fake kernel of an op whose output is shaped and typed as its first input (what export needs)."""
    return torch.empty_like(x)


def _like_third(_a: torch.Tensor, _b: torch.Tensor, x: torch.Tensor, *_: Any) -> torch.Tensor:
    """The fake kernel of an op whose output is shaped and typed as its third input."""
    return torch.empty_like(x)


@torch.library.custom_op("echosim::selective_scan", mutates_args=())
def selective_scan(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False,
) -> torch.Tensor:
    """``y`` of the selective scan over ``u, delta, z: (batch, d, L)``, ``A: (d, N)``, ``B, C: (batch, N, L)``,
    ``D, delta_bias: (d,)``; the state ``h_t = exp(delta_t A) h_{t-1} + delta_t B_t u_t``, ``y_t = C_t h_t``,
    plus ``D u`` and gated by ``silu(z)`` (mamba-ssm's ``selective_scan_ref``, written out step by step)."""
    dt = delta.float() if delta_bias is None else delta.float() + delta_bias.float()[..., None]
    if delta_softplus:
        dt = F.softplus(dt)
    batch, d, steps = u.shape
    h = u.new_zeros(batch, d, A.shape[-1], dtype=torch.float32)
    ys = []
    for t in range(steps):
        step = dt[:, :, t, None]
        h = torch.exp(step * A.float()) * h + step * B[:, None, :, t].float() * u[:, :, t, None].float()
        ys.append((h * C[:, None, :, t].float()).sum(-1))
    y = torch.stack(ys, dim=-1)
    if D is not None:
        y = y + u.float() * D.float()[..., None]
    if z is not None:
        y = y * F.silu(z.float())
    return y.to(u.dtype)


selective_scan.register_fake(_like_first)


def _fused(original: Any) -> Any:
    """``mamba_selective_scan`` as the fused kernel; what the kernel path would not take goes to ``original``."""

    def scan(
        u: torch.Tensor,
        delta: torch.Tensor,
        A: torch.Tensor,
        B: torch.Tensor,
        C: torch.Tensor,
        D: torch.Tensor | None = None,
        z: torch.Tensor | None = None,
        delta_bias: torch.Tensor | None = None,
        delta_softplus: bool = False,
        return_last_state: bool = False,
        **kwargs: Any,
    ) -> Any:
        # a cached decode (the last state returned) or B and C shared over the batch are not training's path
        if return_last_state or B.dim() != 3 or C.dim() != 3 or u.dim() != 3:
            return original(u, delta, A, B, C, D=D, z=z, delta_bias=delta_bias, delta_softplus=delta_softplus,
                            return_last_state=return_last_state, **kwargs)  # fmt: skip
        return selective_scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus)

    return scan


@torch.library.custom_op("echosim::gated_delta_rule", mutates_args=())
def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk_size: int = 64,
    qk_l2norm: bool = False,
) -> torch.Tensor:
    """``o: (batch, T, Hv, dv)`` of the gated delta rule over ``q, k: (batch, T, Hk, dk)``, ``v: (batch, T, Hv, dv)``,
    ``g, beta: (batch, T, Hv)``, each key head serving ``Hv / Hk`` value heads: the state decays by ``exp(g_t)``
    (Kimi Delta Attention: ``g: (batch, T, H, dk)``, a decay per key channel, a row of the state each),
    ``S += k_t (beta_t (v_t - S^T k_t))^T``, ``o_t = S^T q_t / sqrt(dk)``, token by token (``chunk_size`` is the
    kernel's chunk; it does not change the result)."""
    rep = v.shape[2] // k.shape[2]
    q, k = (x.float().repeat_interleave(rep, dim=2) for x in (q, k))
    if qk_l2norm:
        q, k = (x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6) for x in (q, k))
    q = q / q.shape[-1] ** 0.5
    state = q.new_zeros(v.shape[0], v.shape[2], k.shape[-1], v.shape[-1])
    outs = []
    for t in range(v.shape[1]):
        decay = g[:, t].float().exp()
        state = state * (decay[..., None] if g.dim() == 4 else decay[..., None, None])
        remembered = (state * k[:, t, :, :, None]).sum(-2)
        delta = (v[:, t].float() - remembered) * beta[:, t].float()[..., None]
        state = state + k[:, t, :, :, None] * delta[:, :, None, :]
        outs.append((state * q[:, t, :, :, None]).sum(-2))
    return torch.stack(outs, dim=1).to(v.dtype)


gated_delta_rule.register_fake(_like_third)


@torch.library.custom_op("echosim::ssd_scan", mutates_args=())
def ssd_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    chunk_size: int,
    dt_softplus: bool,
    dt_min: float,
    dt_max: float,
) -> torch.Tensor:
    """``y: (batch, T, H, P)`` of Mamba-2's scan over ``x: (batch, T, H, P)``, ``dt: (batch, T, H)``, ``A, D,
    dt_bias: (H,)``, ``B, C: (batch, T, G, N)``, each group of B and C serving ``H / G`` heads: with
    ``d_t = clamp(softplus(dt_t + dt_bias))``, the state ``h_t = exp(d_t A) h_{t-1} + d_t x_t B_t^T``, ``y_t = h_t C_t
    + D x_t``, token by token (``chunk_size`` is the kernel's chunk; it does not change the result)."""
    d = dt.float() if dt_bias is None else dt.float() + dt_bias.float()
    if dt_softplus:
        d = F.softplus(d)
    d = d.clamp(dt_min, dt_max)
    rep = x.shape[2] // B.shape[2]
    b, c = (t.float().repeat_interleave(rep, dim=2) for t in (B, C))
    state = x.new_zeros(x.shape[0], x.shape[2], x.shape[3], B.shape[-1], dtype=torch.float32)
    ys = []
    for t in range(x.shape[1]):
        step = d[:, t]  # (batch, H)
        state = torch.exp(step * A.float())[..., None, None] * state
        state = state + (step[..., None] * x[:, t].float())[..., None] * b[:, t, :, None, :]
        ys.append((state * c[:, t, :, None, :]).sum(-1))
    y = torch.stack(ys, dim=1)
    if D is not None:
        y = y + x.float() * D.float()[:, None]
    return y.to(x.dtype)


ssd_scan.register_fake(_like_first)


def _ssd(original: Any) -> Any:
    """``mamba2_chunk_scan`` as the fused kernel; a state carried in or out, a gate, or packed sequences go to
    ``original`` (a cached decode, not training's path)."""

    def scan(
        hidden_states: torch.Tensor,
        dt: torch.Tensor,
        A: torch.Tensor,
        B: torch.Tensor,
        C: torch.Tensor,
        chunk_size: int,
        D: torch.Tensor | None = None,
        dt_bias: torch.Tensor | None = None,
        initial_states: torch.Tensor | None = None,
        dt_softplus: bool = False,
        dt_limit: tuple[float, float] = (0.0, float("inf")),
        return_final_states: bool = False,
        **kwargs: Any,
    ) -> Any:
        # mamba-ssm's arguments beyond training's; other keywords are the decoder's, passed down (router logits)
        carried = any(kwargs.get(key) is not None for key in ("z", "seq_idx", "cu_seqlens"))
        carried = carried or bool(kwargs.get("return_varlen_states"))
        if initial_states is not None or return_final_states or carried:
            return original(hidden_states, dt, A, B, C, chunk_size, D=D, dt_bias=dt_bias,
                            initial_states=initial_states, dt_softplus=dt_softplus, dt_limit=dt_limit,
                            return_final_states=return_final_states, **kwargs)  # fmt: skip
        low, high = (float(v) for v in dt_limit)
        return ssd_scan(hidden_states, dt, A, B, C, D, dt_bias, int(chunk_size), dt_softplus, low, high)

    return scan


@torch.library.custom_op("echosim::wkv", mutates_args=())
def wkv(time_decay: torch.Tensor, time_first: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``wkv_t = (a_t + e^(u + k_t) v_t) / (b_t + e^(u + k_t))`` over ``key, value: (batch, T, C)``, with
    ``a_t = sum_{i<t} e^(-(t-1-i) w + k_i) v_i`` (``b_t`` the same without ``v``), ``w = exp(time_decay)`` and
    ``u = time_first``; scaled by a running maximum exponent so no exponential overflows."""
    w, u = -torch.exp(time_decay.float()), time_first.float()
    a = torch.zeros_like(key[:, 0], dtype=torch.float32)
    b = torch.zeros_like(a)
    top = torch.full_like(a, -1e38)  # the exponent a and b are scaled by
    out = []
    for t in range(key.shape[1]):
        k, v = key[:, t].float(), value[:, t].float()
        now = torch.maximum(top, u + k)
        old, new = torch.exp(top - now), torch.exp(u + k - now)
        out.append((old * a + new * v) / (old * b + new))
        then = torch.maximum(top + w, k)
        old, new = torch.exp(top + w - then), torch.exp(k - then)
        a, b, top = old * a + new * v, old * b + new, then
    return torch.stack(out, dim=1).to(key.dtype)


wkv.register_fake(_like_third)


def _wkv(original: Any) -> Any:
    """``rwkv_linear_attention`` as the WKV kernel; a state carried in or out (a cached decode) goes to ``original``."""

    def attention(time_decay: Any, time_first: Any, key: Any, value: Any, state: Any = None,
                  return_state: bool = False) -> Any:  # fmt: skip
        if state is not None or return_state:
            return original(time_decay, time_first, key, value, state=state, return_state=return_state)
        return wkv(time_decay, time_first, key, value), None

    return attention


def _chunked(original: Any) -> Any:
    """``torch_chunk_gated_delta_rule`` as the chunked kernel; a state carried in or out, or packed sequences, go
    to ``original`` (a cached decode, not training's path)."""

    def chunk(
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        chunk_size: int = 64,
        initial_state: torch.Tensor | None = None,
        output_final_state: bool = False,
        use_qk_l2norm_in_kernel: bool = False,
        **kwargs: Any,
    ) -> Any:
        if initial_state is not None or output_final_state or kwargs.get("cu_seqlens") is not None:
            return original(query, key, value, g=g, beta=beta, chunk_size=chunk_size, initial_state=initial_state,
                            output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                            **kwargs)  # fmt: skip
        return gated_delta_rule(query, key, value, g, beta, chunk_size, use_qk_l2norm_in_kernel), None

    return chunk


@contextmanager
def fused_scan() -> Iterator[int]:
    """While active, the imported transformers modules scan with :func:`selective_scan`, :func:`ssd_scan`,
    :func:`gated_delta_rule` and :func:`wkv`; yields how many modules."""
    with replaced(
        (sys.modules.get(name), attr, wrap)
        for names, attr, wrap in (
            (SCAN_MODULES, "mamba_selective_scan", _fused),
            (SSD_MODULES, "mamba2_chunk_scan", _ssd),
            (DELTA_RULE_MODULES, "torch_chunk_gated_delta_rule", _chunked),
            (KDA_MODULES, "chunk_kimi_delta_attention", _chunked),
            (WKV_MODULES, "rwkv_linear_attention", _wkv),
        )
        for name in names  # a model's module is loaded once the model is built
    ) as count:
        yield count


@contextmanager
def replaced(targets: Iterable[tuple[Any, str, Callable[[Any], Any]]]) -> Iterator[int]:
    """While active, ``owner.attribute = make(original)`` for each target whose owner has the attribute (a
    transformers module not imported has none); yields how many were replaced."""
    patched: list[tuple[Any, str, Any]] = []
    for owner, attr, make in targets:
        original = getattr(owner, attr, None)
        if original is None:
            continue
        patched.append((owner, attr, original))
        setattr(owner, attr, make(original))
    try:
        yield len(patched)
    finally:
        for owner, attr, original in reversed(patched):
            setattr(owner, attr, original)
