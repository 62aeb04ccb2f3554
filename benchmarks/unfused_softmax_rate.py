"""What rate does PyTorch's unfused attention leave its softmax, part by part? (issue 16: a check, nothing fitted)

``microbench.csv`` holds Azure's runs of flash-attention's ``benchmarks/benchmark_flash_attention.py``, whose
"Pytorch" forward is eager ``softmax(Q K^T) V``: two batched GEMMs around ``torch.softmax`` over the score
matrix. echosim prices it as those GEMMs plus the softmax's bytes (read and write the scores) at STREAM rate
(``compute.math_attention_time_s``). This script takes each row's measured time, subtracts echosim's GEMM time, and
prints the rate that leaves for the softmax's bytes next to the part's STREAM rate.

    PYTHONPATH=. python benchmarks/unfused_softmax_rate.py
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

from echosim.backends import compute
from echosim.backends.device_names import backend_for_device
from echosim.backends.devices import get_device
from echosim.ir.ops import AttentionAttrs

ROOT = Path(__file__).resolve().parents[1]
MICROBENCH = ROOT.parent / "shared" / "validation" / "microbench.csv"
MODEL_WIDTH = 2048  # the benchmark's dim: heads = 2048 / head_dim


def rows(path: Path = MICROBENCH) -> list[dict[str, str]]:
    """The unfused ("standard PyTorch") attention rows of the file."""
    with path.open(encoding="utf-8") as fh:
        return [r for r in csv.DictReader(fh) if r["op"].startswith("attention: standard PyTorch")]


def decompose(row: dict[str, str]) -> dict[str, float]:
    """Measured time, echosim's GEMM and softmax times, and the softmax rate the measurement leaves (TB/s)."""
    dims = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", row["shape"])}
    batch, seq, head_dim = dims["batch"], dims["seq"], dims["head_dim"]
    heads = MODEL_WIDTH // head_dim
    dtype = "bf16" if "bf16" in row["dtype"] else "fp16"
    dev = get_device(backend_for_device(row["device"]) or "")
    attrs = AttentionAttrs(batch, heads, heads, seq, seq, head_dim, causal=False, flash=False)
    measured = attrs.flops / (float(row["value"]) * 1e12)
    echosim = compute.math_attention_time_s(dev, attrs, dtype)
    gemms = compute.matmul_time_s(dev, seq, seq, head_dim, batch * heads, dtype)
    gemms += compute.matmul_time_s(dev, seq, head_dim, seq, batch * heads, dtype)
    softmax_bytes = 2 * batch * heads * seq * seq * compute.itemsize(dtype)  # what echosim's softmax reads, writes
    left = measured - gemms
    return {
        "measured_ms": measured * 1e3,
        "echosim_ms": echosim * 1e3,
        "gemms_ms": gemms * 1e3,
        "softmax_ms": (echosim - gemms) * 1e3,
        "softmax_TBps_left": softmax_bytes / left / 1e12 if left > 0 else float("nan"),
        "stream_TBps": dev.hbm_stream_GBps / 1e3,
    }


def report() -> dict[str, dict[str, float]]:
    """Print one line per row; return them by device."""
    out = {}
    head = f"{'device':16s} {'shape':34s} {'measured':>9s} {'echosim':>8s} {'GEMMs':>7s}"
    print(f"{head} {'softmax left':>13s} {'STREAM':>7s}")
    for row in rows():
        d = decompose(row)
        out[row["device"]] = d
        print(
            f"{row['device']:16s} {row['shape']:34s} {d['measured_ms']:7.2f}ms {d['echosim_ms']:6.2f}ms "
            f"{d['gemms_ms']:5.2f}ms {d['softmax_TBps_left']:8.2f} TB/s {d['stream_TBps']:5.2f}"
        )
    return out


if __name__ == "__main__":
    report()
