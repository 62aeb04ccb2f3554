"""benchmarks/gpt_oss_breakdown.py: the breakdown's op kinds and the attention readings it swaps in and out."""

from __future__ import annotations

from pathlib import Path

from script_loader import load_script

import echosim.backends.compute as compute
from echosim.backends.devices import DEVICES
from echosim.ir.ops import AttentionAttrs

ROOT = Path(__file__).resolve().parents[1]


def _module():
    return load_script("benchmarks/gpt_oss_breakdown.py")


def test_kinds() -> None:
    m = _module()
    assert m.kind("matmul", "layers.0.moe.experts") == "expert_mm"
    assert m.kind("matmul", "layers.0.attn") == "mm"
    assert m.kind("attention", "layers.1") == "attention"
    assert m.kind("all_to_all", "layers.0") == "all_to_all"
    assert m.kind("elementwise", "layers.0.moe") == "other"


def test_readings_change_the_window_cost_and_restore_it() -> None:
    m = _module()
    # 4096 queries, a 128-key window: 2 key tiles of 128 per 128-row query tile; full causal: i + 1 tiles
    assert compute.band_kv_blocks(4096, 4096, 128, 128, 128)[5] == 2
    with m.patched("no-window-skip"):
        assert compute.band_kv_blocks(4096, 4096, 128, 128, 128)[5] == 6
    assert compute.band_kv_blocks(4096, 4096, 128, 128, 128)[5] == 2
    dev = DEVICES["h100-sxm"]
    a = AttentionAttrs(1, 64, 8, 4096, 4096, 64, causal=True, flash=True)
    with m.patched("unfused"):
        assert compute.attention_time_s(dev, a, "bf16") == compute.math_attention_time_s(dev, a, "bf16")
    assert compute.attention_time_s(dev, a, "bf16") < compute.math_attention_time_s(dev, a, "bf16")
