"""Seeded layout samples shared by the tests that check the search's fast paths against a full compile."""

from __future__ import annotations

import random

from echosim.frontend.zoo import ArchConfig
from echosim.layout_search import search
from echosim.plan import Cluster, Plan


def small_moe() -> ArchConfig:
    """An 8-layer MoE small enough to compile many layouts of in a test."""
    return ArchConfig(
        "moe", layers=8, hidden=1024, heads=16, kv_heads=4, vocab=32000, seq_len=2048, experts=8, top_k=2,
        moe_ffn=1024,
    )  # fmt: skip


def drawn(model: object, base: Plan, cluster: Cluster, n: int, seed: int) -> list[Plan]:
    """``n`` layouts drawn with ``seed`` from what the search would simulate (every schedule, 1-4 micro-batches)."""
    space = {"schedule": ("1f1b", "gpipe", "interleaved", "zb-h1"), "mb": (1, 2, 4)}
    plans = search(model, base, cluster, space=space, sample=slice(0, 0)).enumeration.to_simulate
    return random.Random(seed).sample(plans, min(n, len(plans)))
