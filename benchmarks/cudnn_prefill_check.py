"""echosim's fused-attention forward against cuDNN 9.27's published prefill sweep (issue 16). A check.

``benchmarks/data/cudnn_prefill_sweep.csv`` holds the causal, square (query tokens = key tokens) rows of NVIDIA's
cudnn-frontend attention benchmark (``benchmark/attention_inference/results/prefill_sweep``, ``cudnn`` backend,
bf16, batch 1, grouped-query heads as Llama 3.1 shards them over tp 1 / 2 / 4 / 8, and Qwen 3.5's head_dim 256
on H200), each row with its file at a commit. A causal prefill is the forward of a training step's attention,
so each row is priced as echosim prices Transformer Engine's attention (``kernel="te"``: cuDNN's fused kernel on
Hopper and Blackwell) and the script prints, per row, echosim's TFLOP/s against the measured one, and per device

* the MAPE and mean error of the rate;
* ``shape``: the same after dividing each row's ratio by that of the device's 64-head 16,384-token row, which
  leaves how the rate moves with sequence length and heads and takes out the level.

The file also keeps the same benchmark's gpt-oss rows (``results/gpt_oss``: head_dim 64, learnable attention
sinks, full causal and a 128-token sliding window, H200 and B200), the kernel Transformer Engine runs for
gpt-oss (``benchmarks/gpt_oss_breakdown.md``). echosim prices no sink, so they are printed apart, as times, and
left out of the summary. Their ``tflops`` column is the benchmark's, which counts a windowed row's FLOPs as if
it were full causal; the comparison uses the times.

What each device's level rests on: H200 takes cuDNN 9.4's forward at one non-causal shape (16 heads, 16,384
tokens, ``devices._CUDNN_HOPPER_FWD_TFLOPS``), a different version, mask and shape than every row here. B200 takes
cuDNN 9.13's rate from the FlashAttention-4 paper; GB200 and GB300 that rate times this sweep's own ratios to
B200 at 64 heads and 16,384 tokens, so those rows are not independent of the model and their level is 9.13's.

    PYTHONPATH=. python benchmarks/cudnn_prefill_check.py [--csv benchmarks/data/cudnn_prefill_sweep.csv]
"""

from __future__ import annotations

import argparse
import csv
import statistics
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from echosim.backends.compute import attention_time_s
from echosim.backends.devices import DEVICES
from echosim.ir.ops import AttentionAttrs

DATA = Path(__file__).resolve().parent / "data" / "cudnn_prefill_sweep.csv"
#: the row each device's ``shape`` column divides by: 64 query heads (Llama 3.1 405B unsharded) at 16,384 tokens
REFERENCE = (64, 16384)


def read_rows(path: Path = DATA) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def cli_results(doc: str, default: Path, compare: Callable[[dict[str, str]], dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of ``--csv`` (``default`` without it), each through ``compare``: the command line of this check
    and of its siblings (``cudnn_training_check``, ``cudnn_norms_check``), which keep their rows the same way."""
    ap = argparse.ArgumentParser(description=doc.split("\n", 1)[0])
    ap.add_argument("--csv", type=Path, default=default)
    args = ap.parse_args()
    return [compare(row) for row in read_rows(args.csv)]


def attention(row: dict[str, str]) -> AttentionAttrs:
    """The row's attention as echosim's IR holds it: Transformer Engine's fused kernel; a file without a ``window``
    column (the training benchmark's) has none."""
    return AttentionAttrs(
        batch=int(row["batch"]),
        heads=int(row["num_q_heads"]),
        kv_heads=int(row["num_kv_heads"]),
        q_len=int(row["q_tokens"]),
        kv_len=int(row["kv_len"]),
        head_dim=int(row["head_dim"]),
        causal=row["causal"] == "yes",
        flash=True,
        kernel="te",
        window=int(row.get("window") or 0),
    )


def compare(row: dict[str, str]) -> dict[str, Any]:
    """Measured and predicted TFLOP/s of one row, on the FLOPs the benchmark counts (causal: half the scores).

    The benchmark's rate is its FLOPs over its time; the time (``time_ms``) is the measurement, so echosim's rate
    is the same FLOPs over echosim's time."""
    a = attention(row)
    measured_s = float(row["time_ms"]) * 1e-3
    flops = float(row["tflops"]) * 1e12 * measured_s
    predicted_s = attention_time_s(DEVICES[row["backend"]], a, "bf16")
    return {
        "backend": row["backend"],
        "heads": a.heads,
        "head_dim": a.head_dim,
        "tokens": a.q_len,
        "window": a.window,
        "sinks": row["sinks"] == "yes",
        "measured": float(row["tflops"]),
        "predicted": flops / predicted_s / 1e12,
        "measured_ms": measured_s * 1e3,
        "predicted_ms": predicted_s * 1e3,
    }


def summary(results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per device, over the rows without sinks: rows, MAPE and mean error of the rate, and the same with the level
    taken out (``shape_*``)."""
    by_device: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        if not r["sinks"]:
            by_device[r["backend"]].append(r)
    out = {}
    for device, rs in sorted(by_device.items()):
        ratio = [r["predicted"] / r["measured"] for r in rs]
        ref = next(
            r["predicted"] / r["measured"]
            for r in rs
            if (r["heads"], r["tokens"]) == REFERENCE and r["head_dim"] == 128
        )
        shape = [x / ref - 1 for x in ratio]
        out[device] = {
            "rows": len(rs),
            "mape": statistics.mean(abs(x - 1) for x in ratio),
            "mean": statistics.mean(x - 1 for x in ratio),
            "shape_mape": statistics.mean(abs(x) for x in shape),
            "shape_max": max(abs(x) for x in shape),
        }
    return out


def main() -> None:
    results = cli_results(__doc__, DATA, compare)
    print(f"{'device':7s} {'heads':>5s} {'d':>4s} {'tokens':>6s} {'cuDNN 9.27':>10s} {'echosim':>8s} {'error':>7s}")
    for r in results:
        if r["sinks"]:
            continue
        error = r["predicted"] / r["measured"] - 1
        print(
            f"{r['backend']:7s} {r['heads']:5d} {r['head_dim']:4d} {r['tokens']:6d} "
            f"{r['measured']:10.1f} {r['predicted']:8.1f} {error:+7.1%}"
        )
    print(f"\n{'device':7s} {'rows':>4s} {'MAPE':>6s} {'mean':>7s} {'shape MAPE':>10s} {'shape max':>9s}")
    for device, s in summary(results).items():
        print(
            f"{device:7s} {s['rows']:4d} {s['mape']:6.1%} {s['mean']:+7.1%} {s['shape_mape']:10.1%} "
            f"{s['shape_max']:9.1%}"
        )
    print("\ngpt-oss attention (head_dim 64, learnable sinks; echosim prices no sink), forward times in ms")
    head = f"{'device':7s} {'heads':>5s} {'window':>6s} {'tokens':>6s} {'cuDNN 9.27':>10s} {'echosim':>8s}"
    print(f"{head} {'echosim/meas':>12s}")
    for r in results:
        if r["sinks"]:
            ratio = r["predicted_ms"] / r["measured_ms"]
            print(
                f"{r['backend']:7s} {r['heads']:5d} {r['window'] or '-':>6} {r['tokens']:6d} "
                f"{r['measured_ms']:10.4f} {r['predicted_ms']:8.4f} {ratio:12.2f}"
            )


if __name__ == "__main__":
    main()
