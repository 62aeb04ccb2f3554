"""transformers MoE layers whose reference forward is not what training runs, replaced while a model is captured.

transformers 4.x and 5 write Llama 4's MoE layer (``Llama4TextMoe``) densely: every token is repeated once per
expert, scaled by its router score (zero for the experts it was not routed to) and run through every expert
with one ``bmm`` (``Llama4TextExperts``: "This should really not be run on a single machine"). Costed as written,
a Llama 4 Maverick layer does 128 experts' work for each token where training does one (top-1): the experts'
FLOPs 128 times over, and expert parallelism cannot split a layer with no dispatch. Training stacks route:
Megatron-Core and torchtitan sort each token's top-k choices by expert and run grouped GEMMs.

:func:`routed_experts` gives ``Llama4TextMoe`` that forward while a model is captured: the router's top-k (the
scores are the sigmoid of the chosen logits, applied to each expert's input as Llama 4 does), the (token,
choice) rows sorted by expert, the experts as transformers 5's grouped GEMMs, and the rows put back in token order
and summed, plus the shared expert. The result equals the dense forward (``tests/test_moe_patches.py``), and the
capture holds the same ops as transformers' other MoE layers, so :mod:`echosim.frontend.moe_routing` finds the
dispatch and ``--ep`` splits it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from echosim.frontend.ssm_ops import replaced

LLAMA4 = "transformers.models.llama4.modeling_llama4"
DBRX = "transformers.models.dbrx.modeling_dbrx"


def _by_expert(top_index: Any, experts: int) -> tuple[Any, Any]:
    """The (token, choice) rows sorted by expert, as transformers 5's grouped-GEMM experts sort them: the sort's
    permutation and the offsets ending each expert's rows."""
    import torch

    expert_ids, perm = torch.sort(top_index.reshape(-1))
    counts = torch.histc(
        expert_ids.float() if expert_ids.device.type in ("cpu", "mps") else expert_ids.int(),
        bins=experts,
        min=0,
        max=experts - 1,
    )
    return perm, torch.cumsum(counts, dim=0, dtype=torch.int32)


def _per_token(rows: Any, perm: Any, tokens: int, k: int) -> Any:
    """Rows sorted by expert put back in (token, choice) order and summed over each token's choices."""
    import torch

    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.size(0), device=perm.device)
    return rows[inverse].view(tokens, k, -1).sum(dim=1)


def llama4_routed_forward(self: Any, hidden_states: Any) -> tuple[Any, Any]:
    """``Llama4TextMoe.forward`` with each token run through its top-k experts only (same result)."""
    import torch

    hidden = hidden_states.reshape(-1, self.hidden_dim)
    router_scores, router_logits = self.router(hidden)  # the chosen experts' sigmoid scores, zero elsewhere
    scores, top_index = torch.topk(router_scores, self.top_k, dim=1)
    tokens, k = top_index.shape
    perm, offsets = _by_expert(top_index, self.num_experts)
    rows = hidden[perm // k] * scores.reshape(-1)[perm].unsqueeze(-1)  # Llama 4 scales the experts' input
    routed = _per_token(self.experts(rows, offsets), perm, tokens, k)
    return self.shared_expert(hidden) + routed.to(hidden.dtype), router_logits


def llama4_grouped_experts(self: Any, rows: Any, offsets: Any) -> Any:
    """``Llama4TextExperts`` on rows sorted by expert: transformers 5's grouped GEMMs, ``offsets`` ending each
    expert's rows (its weights are stored ``[experts, in, out]``)."""
    from transformers.integrations.moe import _grouped_linear

    gate, up = _grouped_linear(rows, self.gate_up_proj, offsets, is_transposed=True).chunk(2, dim=-1)
    return _grouped_linear(up * self.act_fn(gate), self.down_proj, offsets, is_transposed=True)


def dbrx_grouped_experts(self: Any, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    """``DbrxExperts.forward`` as grouped GEMMs over rows sorted by expert (same result). transformers loops over
    the experts a batch hits and selects each one's tokens with ``torch.where``: a shape that depends on the
    routing, which torch.export cannot capture. The weights are stored ``[experts * ffn, hidden]``, ``w2`` the
    down-projection's transpose."""
    from transformers.integrations.moe import _grouped_linear

    batch, hidden = hidden_states.shape[0], self.hidden_size
    tokens, k = top_k_index.shape
    perm, offsets = _by_expert(top_k_index, self.num_experts)
    rows = hidden_states.reshape(-1, hidden)[perm // k]
    split = (self.num_experts, self.ffn_hidden_size, hidden)
    mlp = self.mlp
    gate = _grouped_linear(rows, mlp.w1.view(split), offsets)
    up = _grouped_linear(rows, mlp.v1.view(split), offsets)
    down = _grouped_linear(mlp.activation_fn(gate) * up, mlp.w2.view(split), offsets, is_transposed=True)
    weighted = down * top_k_weights.reshape(-1)[perm].unsqueeze(-1).to(down.dtype)
    return _per_token(weighted, perm, tokens, k).view(batch, -1, hidden).to(hidden_states.dtype)


#: (module, class, the method's replacement) for each patched class.
_PATCHES = (
    (LLAMA4, "Llama4TextMoe", llama4_routed_forward),
    (LLAMA4, "Llama4TextExperts", llama4_grouped_experts),
    (DBRX, "DbrxExperts", dbrx_grouped_experts),
)


@contextmanager
def routed_experts() -> Iterator[int]:
    """While active, imported MoE classes route their tokens through grouped GEMMs (``_PATCHES``); yields how
    many classes were patched."""
    targets = (
        (getattr(sys.modules.get(module), name, None), "forward", lambda _original, forward=forward: forward)
        for module, name, forward in _PATCHES  # a model's module is imported once the model is built
    )
    with replaced(targets) as count:
        yield count
