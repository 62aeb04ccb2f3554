"""echosim's flash-attention model against cuDNN's own training benchmark (what Transformer Engine's
FusedAttention runs in Megatron-Core / NeMo), row by row.

NVIDIA publishes its SDPA training benchmark with results per model shape, GPU and cuDNN version in
``benchmark/sdpa_benchmark_training/results/**.csv`` of github.com/NVIDIA/cudnn-frontend (checked at
commit 3929da2: GB200 / GB300 with cuDNN 9.22, H200 with cuDNN 9.19; gpt-oss's sliding-window layer
at head 64, Llama 3.1 at 128, DeepSeek-V3 / Kimi MLA at 192 / 128, Qwen3.5 at 256). Clone that repository
(or any folder of such CSVs) and point this script at it; nothing is copied into echosim and nothing here
changes a prediction. Both CSV layouts (``profile_pass`` fwd / bwd with ``time_ms``; ``both`` with
``fwd_time_ms`` / ``bwd_time_ms``) are read; bf16 rows only, the non-deterministic backward.

    PYTHONPATH=. python benchmarks/cudnn_sdpa_check.py PATH/TO/cudnn-frontend/benchmark/sdpa_benchmark_training/results
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from echosim.backends.compute import attention_time_s
from echosim.backends.devices import DEVICES
from echosim.ir.ops import AttentionAttrs

GPUS = {"NVIDIA GB200": "gb200", "NVIDIA GB300": "gb300", "NVIDIA H200": "h200", "NVIDIA B200": "b200"}


def rows(folder: Path) -> list[tuple[str, str, AttentionAttrs, str, float]]:
    """(model, device, attention, pass, measured ms) of every bf16 row of the CSVs under ``folder``."""
    found = []
    for path in sorted(folder.rglob("*.csv")):
        with path.open() as f:
            for r in csv.DictReader(f):
                device = GPUS.get(r.get("gpu_name", ""))
                if device is None or r["data_type"] != "bfloat16" or r["success"] != "True":
                    continue
                if r["profile_pass"] == "bwd" and r["deterministic_bwd"] == "True":
                    continue
                head = (int(r["head_dim_qk"]) + int(r["head_dim_vo"])) // 2  # MLA: 192 / 128 priced at the mean
                a = AttentionAttrs(
                    int(r["batch_size"]),
                    int(r["num_q_heads"]),
                    int(r["num_kv_heads"]),
                    int(r["q_seqlen"]),
                    int(r["kv_seqlen"]),
                    head,
                    causal=r["attn_mask"] != "no_mask",
                    window=int(r["sliding_window_size"] or 0),
                )
                if r["profile_pass"] == "both":
                    passes = [("fwd", r["fwd_time_ms"]), ("bwd", r["bwd_time_ms"])]
                else:
                    passes = [(r["profile_pass"], r["time_ms"])]
                found += [(r["model_name"], device, a, p, float(t)) for p, t in passes]
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="cudnn-frontend's benchmark/sdpa_benchmark_training/results")
    args = ap.parse_args(argv)
    found = rows(args.folder)
    if not found:
        print(f"no bf16 cuDNN SDPA rows under {args.folder}", file=sys.stderr)
        return 1
    print("model     device  mask    window  seq    heads/kv  head  pass  measured_ms  echosim_ms  error")
    for model, device, a, p, ms in found:
        pred = attention_time_s(DEVICES[device], a, "bf16", backward=p == "bwd") * 1e3
        mask = "causal" if a.causal else "none"
        print(
            f"{model:9s} {device:7s} {mask:7s} {a.window:6d} {a.q_len:6d} {a.heads:4d}/{a.kv_heads:<4d} "
            f"{a.head_dim:4d}  {p}   {ms:10.3f}  {pred:10.3f}  {100 * (pred / ms - 1):+6.1f}%"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
