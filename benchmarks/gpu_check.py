"""Compare echosim's h200 backend with kernels and training steps measured on a real H200.

Usage: ``python benchmarks/gpu_check.py [benchmarks/data/h200_microbench.csv]``. The CSV
was written by ``benchmarks/gpu_microbench.py`` on one H200 (PyTorch 2.11, CUDA 13): bf16
and fp8 GEMMs, flash attention forward and forward+backward, memory-bound kernels, and one
micro-batch forward+backward of three small zoo models. Each ``time_us`` row is predicted
with the uncalibrated ``h200`` backend; the training rows are compiled end to end (one
device, the optimizer step left out as in the measurement). Prints one line per row and
the error per group.
"""

from __future__ import annotations

import csv
import re
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from echosim.frontend.zoo import ArchConfig  # noqa: E402

DEFAULT = ROOT / "benchmarks" / "data" / "h200_microbench.csv"
# The zoo models gpu_microbench.py trained (same definitions as its models()).
MODELS = {
    "llama-1b": ArchConfig("llama", layers=8, hidden=2048, heads=16, kv_heads=8, vocab=32000, ffn=5632, seq_len=4096),
    "gpt-1.3b": ArchConfig(
        "gpt", layers=12, hidden=2048, heads=16, vocab=51200, seq_len=2048, dropout=0.1, tied_embeddings=True
    ),
    "llama-8b-4l": ArchConfig(
        "llama", layers=4, hidden=4096, heads=32, kv_heads=8, vocab=128256, ffn=14336, seq_len=8192
    ),
}
MEMORY_OPS = {
    "copy": "ELEMENTWISE",
    "add": "ELEMENTWISE",
    "gelu": "ELEMENTWISE",
    "silu": "ELEMENTWISE",
    "layernorm": "NORM",
    "rmsnorm": "NORM",
    "softmax": "SOFTMAX",
    "cross_entropy": "CROSS_ENTROPY",
}


def _dims(shape: str) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", shape)}


def _node(op: str, attrs: Any, dtype: str, phase: Any = None) -> Any:
    from echosim.ir.graph import Node
    from echosim.ir.ops import OpKind, Phase
    from echosim.ir.types import DType, TensorSpec

    return Node(0, OpKind[op], (), TensorSpec((1,), DType(dtype)), attrs, phase=phase or Phase.FORWARD)


def predict_us(backend: Any, row: dict[str, str]) -> tuple[str, float] | None:
    """(group, predicted µs) for a ``time_us`` row, or None when echosim does not cost it."""
    from echosim.ir.ops import AttentionAttrs, ElementwiseAttrs, MatmulAttrs, NormAttrs, Phase

    op, dtype, d = row["op"], row["dtype"], _dims(row["shape"])
    if op == "matmul":
        node = _node("MATMUL", MatmulAttrs(d["m"], d["n"], d["k"]), "bf16")
        if dtype == "fp8":
            node = _node("MATMUL", MatmulAttrs(d["m"], d["n"], d["k"], precision="fp8"), "bf16")
        return f"matmul {dtype}", backend.op_time_s(node, 0) * 1e6
    if op.startswith("attention"):
        attrs = AttentionAttrs(d["b"], d["h"], d["h"], d["s"], d["s"], d["d"], causal=True, flash=True)
        fwd = backend.op_time_s(_node("ATTENTION", attrs, "bf16"), 0)
        if "fwd+bwd" in op:
            return "attention fwd+bwd", (
                fwd + backend.op_time_s(_node("ATTENTION", attrs, "bf16", Phase.BACKWARD), 0)
            ) * 1e6
        return "attention fwd", fwd * 1e6
    if op in MEMORY_OPS:
        kind = MEMORY_OPS[op]
        attrs = NormAttrs(op) if kind == "NORM" else ElementwiseAttrs(op)
        return "memory-bound", backend.op_time_s(_node(kind, attrs, "bf16"), int(row["size_bytes"])) * 1e6
    if op.startswith("train"):
        return "train fwd+bwd", train_us(row) * 1e6
    return None


def train_us(row: dict[str, str]) -> float:
    """One micro-batch forward+backward of the zoo model on one H200 (seconds): the step less its optimizer."""
    from echosim.compiler import compile as compile_model
    from echosim.plan import Cluster, Plan

    name = row["shape"].split()[0]
    batch = _dims(row["shape"])["batch"]
    plan = Plan(micro_batch=batch, global_batch=batch, dtype="bf16", attention="flash")
    report = compile_model(MODELS[name], plan, Cluster("h200", 1, 8))
    return report.step_time_s - report.breakdown.get("optimizer", 0.0)


def compare(path: Path = DEFAULT) -> list[dict[str, Any]]:
    from echosim.backends.loading import load_backend

    backend = load_backend("h200")
    out = []
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row["metric"] != "time_us":
                continue
            got = predict_us(backend, row)
            if got is None:
                continue
            group, predicted = got
            measured = float(row["value"])
            out.append(
                {
                    "group": group,
                    "op": row["op"],
                    "dtype": row["dtype"],
                    "shape": row["shape"],
                    "measured_us": measured,
                    "predicted_us": predicted,
                    "error": predicted / measured - 1,
                }
            )
    return out


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    groups: dict[str, list[float]] = {}
    for r in rows:
        groups.setdefault(r["group"], []).append(r["error"])
    return {
        g: {
            "rows": len(e),
            "mean_error": statistics.mean(e),
            "mape": statistics.mean(abs(x) for x in e),
            "min": min(e),
            "max": max(e),
        }
        for g, e in groups.items()
    }


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    rows = compare(path)
    print(f"{'group':<20}{'shape':<50}{'measured us':>13}{'predicted us':>14}{'error':>8}")
    for r in rows:
        print(
            f"{r['group']:<20}{r['shape'][:49]:<50}{r['measured_us']:>13.1f}{r['predicted_us']:>14.1f}"
            f"{100 * r['error']:>+7.1f}%"
        )
    print()
    for g, s in summary(rows).items():
        print(
            f"{g:<20} {s['rows']:3d} rows  mean error {100 * s['mean_error']:+6.1f}%  MAPE {100 * s['mape']:5.1f}%"
            f"  range {100 * s['min']:+.1f}% .. {100 * s['max']:+.1f}%"
        )


if __name__ == "__main__":
    main()
