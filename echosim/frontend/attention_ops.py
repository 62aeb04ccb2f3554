"""Sliding-window (local) attention as an fx leaf function.

``F.scaled_dot_product_attention`` has no window argument: a model that wants a band passes a
mask, and a mask tensor says nothing a cost model can read. The zoo's local layers call
:func:`local_attention` instead; ``torch.fx`` records it as one call (it is wrapped in
:mod:`echosim.frontend.zoo_modules`), and the fx frontend maps it to one attention op that
keeps its window. Its body is plain PyTorch (SDPA with the band as a boolean mask), so the
same module runs on CPU in tests. Models that call SDPA with a mask only (or torch.export,
which traces through this body) are costed as full causal attention with a mask input.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def band_mask(q_len: int, kv_len: int, window: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``[q_len, kv_len]`` booleans: key ``k`` visible from query row ``i`` (bottom-right aligned)
    when ``i + kv_len - q_len - window < k <= i + kv_len - q_len``."""
    rows = torch.arange(q_len, device=device).unsqueeze(1) + (kv_len - q_len)
    keys = torch.arange(kv_len, device=device).unsqueeze(0)
    return (keys <= rows) & (keys > rows - window)


def local_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, enable_gqa: bool = False
) -> torch.Tensor:
    """Causal attention over ``(batch, heads, seq, dim)`` where each query sees its ``window`` latest keys."""
    mask = band_mask(q.shape[-2], k.shape[-2], window, q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=enable_gqa)
