"""A local search freezes what survives each batch out of the cyclic collector and hands it back at the end."""

from __future__ import annotations

import gc

from echosim.layout_search import search
from echosim.plan import Cluster, Plan


def test_batch_survivors_are_frozen_during_a_search_and_unfrozen_after() -> None:
    assert gc.get_freeze_count() == 0
    seen: list[int] = []
    space = {"tp": (1, 2), "pp": (1, 2), "mb": (1,), "recompute": ("none",)}
    result = search("gpt3-125m", Plan(global_batch=8), Cluster("h100-sxm", 4), space=space,
                    progress=lambda done, total: seen.append(gc.get_freeze_count()))  # fmt: skip
    assert result.evaluated and seen and all(n > 0 for n in seen)  # between batches: the caches are frozen
    assert gc.get_freeze_count() == 0  # handed back when the search ends
