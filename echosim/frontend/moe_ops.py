"""The three data-dependent steps of a mixture-of-experts layer, as fx leaf functions.

Routing decides at run time which rows go where, which ``torch.fx`` cannot trace
and a meta tensor cannot evaluate. Each step here has a static output shape
(every token is sent to exactly ``top_k`` experts, as in a dropless MoE) and a
plain-PyTorch body that computes the real result on CPU, so the same module is
captured on meta and checked numerically in tests. The fx frontend maps each to
one IR op (permute, grouped matmul, unpermute).
"""

from __future__ import annotations

import torch


def _expert_order(expert_ids: torch.Tensor) -> torch.Tensor:
    """Row order that groups the flattened (token, choice) pairs by expert (stable)."""
    return torch.argsort(expert_ids.flatten(), stable=True)


def moe_dispatch(tokens: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
    """Copy each token once per chosen expert, rows grouped by expert: ``[T*k, h]``."""
    k = expert_ids.shape[-1]
    return tokens.repeat_interleave(k, dim=0)[_expert_order(expert_ids)]


def grouped_mm(rows: torch.Tensor, weight: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
    """Rows grouped by expert times that expert's ``[in, out]`` weight (a grouped GEMM)."""
    owner = expert_ids.flatten()[_expert_order(expert_ids)]
    return torch.bmm(rows.unsqueeze(1), weight[owner]).squeeze(1)


def moe_combine(rows: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Undo the dispatch permutation and sum each token's ``k`` outputs by router weight."""
    t, k = expert_ids.shape
    unpermuted = torch.empty_like(rows).index_copy(0, _expert_order(expert_ids), rows)
    return (unpermuted.view(t, k, rows.shape[-1]) * weights.unsqueeze(-1)).sum(dim=1)


def expert_bias_rows(bias: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Each dispatched row's expert bias ``[E, h]`` times its router weight: ``[T*k, h]``, rows grouped by
    expert. Megatron-Core's TEGroupedMLP adds fc2's bias this way after the grouped GEMM (``_apply_bias``:
    ``t + b * p`` per local expert, then ``torch.cat``), the router weights having scaled the activation."""
    order = _expert_order(expert_ids)
    return bias[expert_ids.flatten()[order]] * weights.flatten()[order].unsqueeze(-1)
