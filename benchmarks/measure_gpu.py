"""Measure GEMMs, streaming kernels and attention on the local GPU; compare with a backend's model.

Writes the measurements into an echosim calibration database (keys from
``echosim.calibrate.db``) and a JSON report of measured vs predicted, so the
analytic model can be checked on hardware the validation data does not cover and the
database can be used with ``echosim cost --calibration FILE``.

    python benchmarks/measure_gpu.py --backend h200 --out out/   # on a machine with a GPU
    python benchmarks/measure_gpu.py --dry-run                   # CPU, tiny shapes, no timing claims
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

GEMMS = [  # (m, n, k): square sweep, MAMF-style best shapes, GPT-3 175B TP-8 products
    (1024, 1024, 1024),
    (2048, 2048, 2048),
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (2048, 2048, 13312),
    (2048, 4608, 12288),
    (2048, 12288, 1536),
    (2048, 6144, 12288),
    (12288, 6144, 2048),
    (4096, 128, 4096),
]
ATTENTION = [  # (batch, heads, seq, head_dim, causal)
    (2, 16, 8192, 128, False),
    (4, 16, 4096, 128, True),
    (1, 32, 2048, 128, True),
]
STREAM_ELEMENTS = 2**28  # fp32: 1 GiB per array


def timed(fn, warmup: int, iters: int, sync) -> float:  # type: ignore[no-untyped-def]
    for _ in range(warmup):
        fn()
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - start) / iters


def main() -> None:
    import torch

    from echosim.backends.loading import load_backend
    from echosim.calibrate.db import CalibrationDB, attention_key, matmul_key
    from echosim.ir.graph import Node
    from echosim.ir.ops import AttentionAttrs, ElementwiseAttrs, MatmulAttrs, OpKind
    from echosim.ir.types import DType, TensorSpec

    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="h200")
    ap.add_argument("--out", default="out")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dry = args.dry_run or not torch.cuda.is_available()
    dev = "cpu" if dry else "cuda"
    sync = (lambda: None) if dry else torch.cuda.synchronize
    warmup, iters = (1, 1) if dry else (5, 20)
    scale = 64 if dry else 1
    backend = load_backend(args.backend)
    name = torch.cuda.get_device_name() if not dry else "cpu (dry run)"
    source = f"benchmarks/measure_gpu.py on {name}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}"
    db = CalibrationDB(out / f"{args.backend}-calibration.sqlite")
    report: dict[str, object] = {"device": name, "torch": torch.__version__, "backend": args.backend, "rows": []}
    rows: list[dict[str, object]] = report["rows"]  # type: ignore[assignment]
    dtype = torch.bfloat16

    def node(op: OpKind, attrs: object, dt: str = "bf16") -> Node:
        return Node(0, op, (), TensorSpec((1,), DType(dt)), attrs)

    for m, n, k in GEMMS:
        m, n, k = max(8, m // scale), max(8, n // scale), max(8, k // scale)
        a = torch.randn(m, k, device=dev, dtype=dtype)
        b = torch.randn(k, n, device=dev, dtype=dtype)
        seconds = timed(lambda a=a, b=b: a @ b, warmup, iters, sync)
        predicted = backend.op_time_s(node(OpKind.MATMUL, MatmulAttrs(m, n, k)), 0)
        db.put(args.backend, "matmul", matmul_key(m, n, k), "bf16", seconds, source)
        rows.append(
            {
                "op": "matmul bf16",
                "shape": f"m={m} n={n} k={k}",
                "measured_tflops": 2 * m * n * k / seconds / 1e12,
                "predicted_tflops": 2 * m * n * k / predicted / 1e12,
            }
        )

    n = STREAM_ELEMENTS // scale**2
    x = torch.randn(n, device=dev)
    y = torch.randn(n, device=dev)
    z = torch.empty(n, device=dev)
    for label, fn, arrays in [
        ("copy", lambda x=x, z=z: z.copy_(x), 2),
        ("add", lambda x=x, y=y, z=z: torch.add(x, y, out=z), 3),
        ("triad", lambda x=x, y=y, z=z: torch.add(x, y, alpha=2.0, out=z), 3),
    ]:
        seconds = timed(fn, warmup, iters, sync)
        nbytes = arrays * n * 4
        predicted = backend.op_time_s(node(OpKind.ELEMENTWISE, ElementwiseAttrs(label), "fp32"), nbytes)
        db.put(args.backend, "elementwise", f"bytes={nbytes}", "fp32", seconds, source)
        rows.append(
            {
                "op": f"stream {label}",
                "shape": f"{arrays} x {n} fp32",
                "measured_TBps": nbytes / seconds / 1e12,
                "predicted_TBps": nbytes / predicted / 1e12,
            }
        )
    del x, y, z

    for batch, heads, seq, d, causal in ATTENTION:
        seq = max(64, seq // scale)
        q = torch.randn(batch, heads, seq, d, device=dev, dtype=dtype)
        k_, v = torch.randn_like(q), torch.randn_like(q)
        full_flops = 4 * batch * heads * seq * seq * d
        counted = full_flops / 2 if causal else full_flops

        def unfused(q=q, k_=k_, v=v, causal=causal, seq=seq, bh=batch * heads, d=d):  # type: ignore[no-untyped-def]
            s = torch.baddbmm(
                torch.empty(bh, seq, seq, device=dev, dtype=dtype),
                q.flatten(0, 1),
                k_.flatten(0, 1).transpose(1, 2),
                beta=0,
                alpha=1 / math.sqrt(d),
            )
            if causal:
                s = s + torch.triu(torch.full((seq, seq), -10000.0, device=dev, dtype=dtype), 1)
            return torch.bmm(torch.softmax(s, dim=-1), v.flatten(0, 1))

        def flash(q=q, k_=k_, v=v, causal=causal):  # type: ignore[no-untyped-def]
            return torch.nn.functional.scaled_dot_product_attention(q, k_, v, is_causal=causal)

        for kernel, fn in [("math", unfused), ("flash", flash)]:
            seconds = timed(fn, warmup, iters, sync)
            attrs = AttentionAttrs(batch, heads, heads, seq, seq, d, causal=causal, flash=kernel == "flash")
            predicted = backend.op_time_s(node(OpKind.ATTENTION, attrs), 0)
            db.put(args.backend, "attention", attention_key(attrs, False), "bf16", seconds, source)
            rows.append(
                {
                    "op": f"attention {kernel} fwd",
                    "shape": f"b={batch} h={heads} s={seq} d={d} causal={causal}",
                    "measured_tflops": counted / seconds / 1e12,
                    "predicted_tflops": counted / predicted / 1e12,
                }
            )
        del q, k_, v
    for r in rows:
        keys = [k for k in r if k.startswith("measured_")]
        meas, pred = r[keys[0]], r[keys[0].replace("measured", "predicted")]
        r["error"] = pred / meas - 1.0  # type: ignore[operator]
        error = 100 * r["error"]  # type: ignore[operator]
        print(f"{r['op']:22s} {r['shape']:34s} measured {meas:9.2f} predicted {pred:9.2f} error {error:+6.1f}%")
    (out / f"{args.backend}-measured.json").write_text(json.dumps(report, indent=2))
    db.close()


if __name__ == "__main__":
    main()
