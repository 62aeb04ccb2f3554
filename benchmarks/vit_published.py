"""Are the published ViT rates bound by the GPU step at all? The ViT family against an eager step measured on an H200.

Issue 15: every ViT row of ``benchmarks/data/nonllm_throughput.csv`` is predicted too fast (family MAPE 42.7 %).
Rosetta's ViT-B/16 rows miss most: A100 +46.7 %, H100 +100.7 %. One real measurement bears on them:
``benchmarks/vit_gpu_check.py`` trained the same model, ViT-B/16 in its pre-training form, eagerly on one H200 at
the same 512 images per GPU (bf16 autocast, fused AdamW). The result is in ``benchmarks/data/vit_gpu_check_h200.json``,
and echosim's ``eager-amp`` step for that shape is 13.5 % shorter than the measured one (``vit_gpu_compare.py``:
its GEMMs are priced 10 % slow, its copies, concatenations and norms far too fast).

For each ViT row this script prints the published time per step and GPU, echosim's step under the row's framework,
and echosim's ``eager-amp`` step. It also prints that step times ``k``, the H200's measured / predicted ratio for
the same model and batch. That product is an eager-PyTorch step on the row's GPU, anchored to the measurement; ``k``
is carried from the H200 to the row's GPU, which is an assumption. Where the published step is longer than even
this eager estimate, the run spends time that no GPU-kernel rule can give it. Rosetta's README names a candidate:
its input pipeline, DALI decoding on the host CPU. Nothing here changes a prediction.

    PYTHONPATH=. python benchmarks/vit_published.py
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import nonllm_accuracy  # noqa: E402
import vit_gpu_compare  # noqa: E402


def h200_ratios() -> dict[tuple[str, int], float]:
    """Measured / echosim ``eager-amp`` step on the H200, per (model, batch) of the stored profile."""
    data = json.loads(vit_gpu_compare.DATA.read_text())
    out = {}
    for row in data["rows"]:
        predicted_ms, _ = vit_gpu_compare.predict(row, "eager-amp")
        out[(row["model"], int(row["batch"]))] = row["step_ms"] / predicted_ms
    return out


def step_ms_per_gpu(row: dict[str, str], samples_per_s: float) -> float:
    """Milliseconds per step of one data-parallel replica's micro-batch (the row's ``micro_batch`` images)."""
    replicas = int(row["gpus"]) // int(row["tp"] or 1)
    return 1e3 * int(row["micro_batch"]) * replicas / samples_per_s


def rows(ratios: dict[tuple[str, int], float]) -> list[dict[str, Any]]:
    with open(nonllm_accuracy.DATA, encoding="utf-8") as fh:
        vit = [r for r in csv.DictReader(fh) if r["family"] == "vit"]
    out = []
    for r in vit:
        published = float(r["published_samples_per_s"])
        own, _ = nonllm_accuracy.predict(r)
        amp, _ = nonllm_accuracy.predict({**r, "framework": "eager-amp"})
        k = ratios.get((r["model"], int(r["micro_batch"])))
        anchored = step_ms_per_gpu(r, amp) * k if k else None
        out.append({
            "model": r["model"], "backend": r["backend"], "gpus": int(r["gpus"]), "micro_batch": int(r["micro_batch"]),
            "framework": r["framework"], "published_ms": step_ms_per_gpu(r, published),
            "predicted_ms": step_ms_per_gpu(r, own), "eager_amp_ms": step_ms_per_gpu(r, amp), "h200_k": k,
            "eager_anchored_ms": anchored,
        })  # fmt: skip
    return out


def main() -> None:
    ratios = h200_ratios()
    print("H200, measured / echosim eager-amp step:", ", ".join(f"{m} b{b} {k:.3f}" for (m, b), k in ratios.items()))
    print(f"\n{'model':17} {'backend':9} gpus  mb {'framework':17} {'published':>9} {'echosim':>8} {'eager-amp':>9} "
          f"{'anchored':>8}  published / anchored   (ms per step and GPU)")  # fmt: skip
    for r in rows(ratios):
        anchored = r["eager_anchored_ms"]
        tail = f"{anchored:8.1f}  {r['published_ms'] / anchored:.2f}" if anchored else f"{'-':>8}  -"
        print(
            f"{r['model']:17} {r['backend']:9} {r['gpus']:4} {r['micro_batch']:3} {r['framework']:17} "
            f"{r['published_ms']:9.1f} {r['predicted_ms']:8.1f} {r['eager_amp_ms']:9.1f} {tail}"
        )


if __name__ == "__main__":
    main()
