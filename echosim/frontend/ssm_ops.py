"""Mamba's selective scan as one op, the way training runs it.

transformers' Mamba-1 family (Mamba, Falcon-Mamba, Jamba, Zamba) calls ``mamba_selective_scan``, which
is mamba-ssm's fused CUDA kernel (``selective_scan_fn``) wherever that package runs and a Python loop
over the sequence otherwise: on ``meta`` the capture took the loop, one small op per token per layer
(tens of thousands of IR nodes for two tiny layers), and costed a training step as thousands of
kernel launches. Training runs the fused kernel: it loads delta, A, B, C and the input from HBM into
SRAM, discretises and scans there and writes only the output (Gu and Dao 2023, "Mamba", arXiv:2312.00752,
sec. 3.3.2), so it is memory-bound on those reads and writes; its backward recomputes the states
instead of reading them back (same section). :func:`selective_scan` is that kernel as a PyTorch
custom op with the signature of mamba-ssm's ``selective_scan_fn``; its body is a plain sequential
reference, so the op runs on CPU in tests, and its fake kernel gives export the output's shape.
:func:`fused_scan` puts it in place of transformers' ``mamba_selective_scan`` while a model is
captured; the export frontend maps the op to one IR node (``aten_rules``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

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


@selective_scan.register_fake
def _(
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
    return torch.empty_like(u)


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


@contextmanager
def fused_scan() -> Iterator[int]:
    """While active, the imported transformers Mamba-1 modules scan with :func:`selective_scan`; yields how many."""
    patched: list[tuple[Any, Any]] = []
    for name in SCAN_MODULES:  # a model's module is loaded once the model is built
        module = sys.modules.get(name)
        original = getattr(module, "mamba_selective_scan", None)
        if original is None:
            continue
        patched.append((module, original))
        module.mamba_selective_scan = _fused(original)
    try:
        yield len(patched)
    finally:
        for module, original in patched:
            module.mamba_selective_scan = original
