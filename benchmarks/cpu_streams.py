"""Streaming kernels on this CPU, in place and out of place, warm and after evicting the caches.

Usage::

    python benchmarks/cpu_streams.py [--out benchmarks/data/cpu_streams.json]

One intra-op thread. For arrays of 1-128 MiB it times (process CPU time, median of 7) an out-of-place
multiply ``x * 1.5`` and add ``x + y``, their in-place twins ``x.mul_(1.0)`` and ``x.add_(y)``, and a copy
into an existing tensor ``z.copy_(x)``, each warm (repeated on the same tensors) and after rewriting a
buffer the size of the last-level cache the OS reports (``bench.CacheEvictor``), and prints the rate of
the bytes each op reads and writes. Then fused AdamW (``torch.optim.AdamW(fused=True)``, 28 bytes a
parameter: read parameter, gradient and both moments, write three) on 20 and 64 MiB of parameters, and
the per-op costs of PyTorch's dispatcher and autograd on 8-element tensors.

What it showed on this machine (``benchmarks/data/cpu_streams.json``): after an eviction an out-of-place
op's counted bytes move at 7-14 GB/s and an in-place op's at 9-27 GB/s; counting a read of every line an
out-of-place op writes (write-allocate), all five move 17-22 GB/s at 8-16 MiB, and fused AdamW's 22-25 GB/s
matches the in-place rate: the rule of ``echosim.backends.cpu.memory_bound_time_s``. Warm, 4-16 MiB arrays
stay near 27 GB/s (out of place) up to working sets of 64 MiB, far beyond a core's 2 MiB L2: the share of
the socket's L3 this VM keeps (see docs/beyond-transformers.md for why no rule uses it). Out-of-place
outputs of 32 MiB and more run at 5-7 GB/s warm or not: glibc maps them afresh (page faults).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rate(fn: Any, nbytes: int, evict: Any) -> float:
    from echosim.calibrate.bench import time_fn

    _, cpu = time_fn(fn, 7, before=evict)
    return nbytes / cpu / 1e9


def streams(evictor: Any) -> dict[str, dict[str, float]]:
    import torch

    out = {}
    for mib in (1, 2, 4, 8, 16, 32, 64, 128):
        n = mib * 2**20 // 4
        x, y, z = torch.randn(n), torch.randn(n), torch.empty(n)
        row = {}
        for tag, evict in (("ev", evictor), ("warm", None)):
            row[f"mul_{tag}"] = rate(lambda x=x: x * 1.5, 8 * n, evict)
            row[f"mul__{tag}"] = rate(lambda x=x: x.mul_(1.0), 8 * n, evict)
            row[f"add_{tag}"] = rate(lambda x=x, y=y: x + y, 12 * n, evict)
            row[f"add__{tag}"] = rate(lambda x=x, y=y: x.add_(y), 12 * n, evict)
            row[f"copyto_{tag}"] = rate(lambda x=x, z=z: z.copy_(x), 8 * n, evict)
        out[str(mib)] = row
        print(mib, "MiB", " ".join(f"{k}={v:.1f}" for k, v in row.items()), flush=True)
    return out


def adamw(evictor: Any) -> dict[str, list[float]]:
    import torch

    out = {}
    for total_mib, parts in ((20, 8), (64, 16)):
        params = [torch.nn.Parameter(torch.randn(total_mib * 2**20 // 4 // parts)) for _ in range(parts)]
        for p in params:
            p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
        opt.step()
        nbytes = 28 * sum(p.numel() for p in params)
        out[f"adamw{total_mib}"] = [rate(opt.step, nbytes, evictor), rate(opt.step, nbytes, None)]
        print(f"fused AdamW, {total_mib} MiB of parameters: evicted {out[f'adamw{total_mib}'][0]:.1f} GB/s, "
              f"warm {out[f'adamw{total_mib}'][1]:.1f} GB/s (28 B a parameter)", flush=True)  # fmt: skip
    return out


def overheads() -> dict[str, float]:
    import torch

    from echosim.calibrate.bench import time_fn

    t, tg, k = torch.ones(8), torch.ones(8, requires_grad=True), 200

    def per(fn: Any) -> float:
        return time_fn(fn, 30, warmup=5)[1] / k * 1e6

    def plain() -> None:
        for _ in range(k):
            t + t

    def recorded() -> None:
        for _ in range(k):
            tg * 1.5

    def view() -> None:
        for _ in range(k):
            t.view(2, 4)

    def chain() -> Any:
        x = tg
        for _ in range(k):
            x = x * 1.5
        return x

    def chain_backward() -> None:
        chain().sum().backward()

    o = {
        "plain_add_us": per(plain),
        "grad_mul_fwd_us": per(recorded),
        "view_us": per(view),
        "chain_fwd_us": per(chain),
        "chain_fwd_bwd_us": per(chain_backward),
    }
    o["bwd_per_node_us"] = o["chain_fwd_bwd_us"] - o["chain_fwd_us"]
    print(o, flush=True)
    return o


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import torch

    from echosim.calibrate.bench import CacheEvictor, cache_bytes

    torch.set_num_threads(1)
    evictor = CacheEvictor()
    print(f"last-level cache (OS) {cache_bytes() / 2**20:g} MiB, L2 {cache_bytes(2) / 2**20:g} MiB", flush=True)
    result = {"streams_GBps": streams(evictor), "adamw_GBps": adamw(evictor), "overhead": overheads()}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
