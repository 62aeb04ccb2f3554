"""echosim's fused attention, forward and backward, against cuDNN's published training SDPA benchmarks (issue 16).

``benchmarks/data/cudnn_training_sdpa.csv`` holds bf16 rows of NVIDIA's cudnn-frontend training benchmark, each
with its file at a commit:

* ``benchmark/sdpa_benchmark_training/results/{h200,gb200,gb300}_919_only_cudnn/llama3.1_*.csv``: cuDNN 9.19, its
  own graph, Llama 3.1's 64 query / 8 key-value heads of 128, 2,048-32,768 tokens, causal (``top_left``) and not;
* ``benchmark/sdpa_benchmark_training/artifacts/sdpa_bf16_benchmark_results_NVIDIA_B200.csv``: cuDNN 9.13 (the
  run's log: ``torch.backends.cudnn.version() = 91300``, PyTorch 2.9 of NGC 25.09) through PyTorch's SDPA cuDNN
  backend, 128 / 8 heads, causal, 2,048-131,072 tokens.

Each row is priced as Transformer Engine's attention (``kernel="te"``: cuDNN's fused kernel on Hopper and
Blackwell). The script prints, per row, the forward and backward times both ways and the backward over the
forward, and per device the mean errors and the measured and modelled backward / forward ratios. Nothing here
changes a prediction.

    PYTHONPATH=. python benchmarks/cudnn_training_check.py [--csv benchmarks/data/cudnn_training_sdpa.csv]
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from echosim.backends.compute import attention_time_s
from echosim.backends.devices import DEVICES

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cudnn_prefill_check import attention, cli_results  # noqa: E402
from cudnn_prefill_check import read_rows as _read_rows  # noqa: E402

DATA = HERE / "data" / "cudnn_training_sdpa.csv"


def read_rows(path: Path = DATA) -> list[dict[str, str]]:
    return _read_rows(path)


def compare(row: dict[str, str]) -> dict[str, Any]:
    """Forward and backward times (ms) of one row, measured and predicted."""
    a = attention(row)
    dev = DEVICES[row["backend"]]
    return {
        "backend": row["backend"],
        "causal": a.causal,
        "heads": a.heads,
        "tokens": a.q_len,
        "fwd_ms": float(row["fwd_ms"]),
        "bwd_ms": float(row["bwd_ms"]),
        "fwd_pred_ms": attention_time_s(dev, a, "bf16") * 1e3,
        "bwd_pred_ms": attention_time_s(dev, a, "bf16", backward=True) * 1e3,
    }


def summary(results: list[dict[str, Any]], min_tokens: int = 8192) -> dict[str, dict[str, float]]:
    """Per device over its rows of at least ``min_tokens`` (where a kernel runs at its plateau): mean error of
    the forward and the backward time, and the median backward / forward ratio measured and predicted."""
    by_device: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        if r["tokens"] >= min_tokens:
            by_device[r["backend"]].append(r)
    return {
        device: {
            "rows": len(rs),
            "fwd_mean": statistics.mean(r["fwd_pred_ms"] / r["fwd_ms"] - 1 for r in rs),
            "bwd_mean": statistics.mean(r["bwd_pred_ms"] / r["bwd_ms"] - 1 for r in rs),
            "ratio_measured": statistics.median(r["bwd_ms"] / r["fwd_ms"] for r in rs),
            "ratio_predicted": statistics.median(r["bwd_pred_ms"] / r["fwd_pred_ms"] for r in rs),
        }
        for device, rs in sorted(by_device.items())
    }


def main() -> None:
    results = cli_results(__doc__, DATA, compare)
    head = f"{'device':7s} {'mask':6s} {'heads':>5s} {'tokens':>6s} {'fwd ms':>9s} {'echosim':>9s} {'err':>7s}"
    print(f"{head} {'bwd ms':>9s} {'echosim':>9s} {'err':>7s} {'bwd/fwd':>7s} {'echosim':>7s}")
    for r in results:
        fe, be = r["fwd_pred_ms"] / r["fwd_ms"] - 1, r["bwd_pred_ms"] / r["bwd_ms"] - 1
        mask = "causal" if r["causal"] else "none"
        left = (
            f"{r['backend']:7s} {mask:6s} {r['heads']:5d} {r['tokens']:6d} {r['fwd_ms']:9.3f} {r['fwd_pred_ms']:9.3f}"
        )
        ratios = f"{r['bwd_ms'] / r['fwd_ms']:7.2f} {r['bwd_pred_ms'] / r['fwd_pred_ms']:7.2f}"
        print(f"{left} {fe:+7.1%} {r['bwd_ms']:9.3f} {r['bwd_pred_ms']:9.3f} {be:+7.1%} {ratios}")
    print("\nper device, rows of >= 8,192 tokens: mean error of the times, median backward / forward")
    print(f"{'device':7s} {'rows':>4s} {'fwd':>7s} {'bwd':>7s} {'bwd/fwd measured':>16s} {'echosim':>8s}")
    for device, s in summary(results).items():
        print(
            f"{device:7s} {s['rows']:4d} {s['fwd_mean']:+7.1%} {s['bwd_mean']:+7.1%} "
            f"{s['ratio_measured']:16.2f} {s['ratio_predicted']:8.2f}"
        )


if __name__ == "__main__":
    main()
