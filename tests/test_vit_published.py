"""benchmarks/vit_published.py: per-GPU step times of the published ViT rows and the H200-anchored eager step."""

from __future__ import annotations

import math
from pathlib import Path

from script_loader import load_script

ROOT = Path(__file__).resolve().parents[1]


def _module():
    return load_script("benchmarks/vit_published.py")


def test_step_per_gpu_counts_data_parallel_replicas() -> None:
    m = _module()
    # 8 GPUs x 512 images at 7,200 images/s: one step of 4,096 images takes 568.9 ms
    assert math.isclose(m.step_ms_per_gpu({"gpus": "8", "tp": "", "micro_batch": "512"}, 7200.0), 4096 / 7.2)
    # 32 GPUs in groups of tp 4: 8 replicas of 64 images
    assert math.isclose(m.step_ms_per_gpu({"gpus": "32", "tp": "4", "micro_batch": "64"}, 795.0), 512 / 0.795)


def test_anchoring_applies_only_to_measured_shapes() -> None:
    m = _module()
    out = m.rows({("vit-b16-pretrain", 512): 1.25})
    assert len(out) == 10  # the ViT rows of nonllm_throughput.csv
    for r in out:
        if (r["model"], r["micro_batch"]) == ("vit-b16-pretrain", 512):
            assert math.isclose(r["eager_anchored_ms"], 1.25 * r["eager_amp_ms"])
        else:
            assert r["h200_k"] is None and r["eager_anchored_ms"] is None
        assert r["published_ms"] > 0 and r["predicted_ms"] > 0 and r["eager_amp_ms"] > 0
