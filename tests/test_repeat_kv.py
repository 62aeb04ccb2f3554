"""torchtitan 2024-2025 expands K and V to the query heads by copies before SDPA (repeat_kv).

The copies against their closed form, the frameworks that select them, and context parallelism, where
only the rank's own chunk is expanded (the ring's later steps read chunks already expanded).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import TINY_LLAMA, capture

from echosim.backends.compute import attention_time_s, memory_bound_time_s
from echosim.backends.devices import get_device
from echosim.frameworks import get_framework
from echosim.ir.ops import AttentionAttrs, Phase
from echosim.passes.attention import AttentionKernel
from echosim.passes.autodiff import Autodiff
from echosim.passes.base import run_passes
from echosim.passes.context_parallel import ContextParallel
from echosim.passes.plugin import _attention
from echosim.plan import Plan, plan_with_defaults

B, HEADS, KV_HEADS, SEQ, D = 2, 32, 8, 8192, 128  # Llama 3.1 8B, torchtitan's 2024-12 local batch


def _attn(**kw: object) -> AttentionAttrs:
    base = AttentionAttrs(B, HEADS, KV_HEADS, SEQ, SEQ, D, kernel="fa2")
    return replace(base, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("backward", [False, True])
def test_the_copies_read_the_kv_heads_and_write_the_query_heads(backward: bool) -> None:
    # forward: K and V each read at 8 heads and written at 32; backward: the expand's gradient summed back
    per = B * SEQ * D
    assert _attn(repeat_kv=True).repeat_kv_elements(backward) == (2 * per * (KV_HEADS + HEADS), 2)
    assert _attn().repeat_kv_elements(backward) == (0, 0)
    assert _attn(repeat_kv=True, kv_heads=HEADS).repeat_kv_elements(backward) == (0, 0)  # nothing to expand


@pytest.mark.parametrize("backward", [False, True])
def test_the_copies_add_two_streaming_kernels_to_the_attention(backward: bool) -> None:
    dev = get_device("h100-96gb")
    extra = attention_time_s(dev, _attn(repeat_kv=True), "bf16", backward) - attention_time_s(
        dev, _attn(), "bf16", backward
    )
    nbytes = 2 * B * SEQ * D * (KV_HEADS + HEADS) * 2  # bf16
    assert extra == pytest.approx(memory_bound_time_s(dev, nbytes, 2), rel=1e-9)


def test_torchtitan_before_enable_gqa_expands_kv() -> None:
    for name in ("torchtitan-2025", "torchtitan-2025-compile", "torchtitan-2025-compile-loss"):
        assert get_framework(name).attention_repeat_kv, name
        assert _attention(plan_with_defaults(Plan(), {"framework": name})).repeat_kv
    for name in ("torchtitan", "torchtitan-compile", "megatron", "nemo", "eager"):  # b5bcd76 passes enable_gqa
        assert not get_framework(name).attention_repeat_kv, name
        assert not _attention(plan_with_defaults(Plan(), {"framework": name})).repeat_kv


def test_under_context_parallelism_only_the_diagonal_step_copies() -> None:
    cp = 4
    g = run_passes(
        capture(TINY_LLAMA.with_(seq_len=64)),
        [AttentionKernel(repeat_kv=True), ContextParallel(cp, "all_gather", torch=True), Autodiff()],
    )
    steps = [n for n in g if n.phase is Phase.FORWARD and isinstance(n.attrs, AttentionAttrs)]
    copied = [n for n in steps if n.attrs.repeat_kv]
    assert copied and len(steps) == cp * len(copied) and all(n.name.endswith(".cp0") for n in copied)
    assert all(n.attrs.q_len == n.attrs.kv_len == 64 // cp for n in copied)  # the rank's own chunk
