"""Is an offloaded optimizer step memory-bound on its host? fp32 AdamW on this machine's CPU against its DRAM rate.

Usage::

    python benchmarks/host_adam_cpu.py [--millions 64] [--repeats 7] [--out FILE.json]

echosim prices an offloaded step (``--offload-optimizer``) as ``ADAM_FP32_BYTES_PER_PARAM`` (32) bytes a parameter
through the host's DRAM: Adam's fp32 weight, gradient and two moments read and written back, and the gradient read
once more for the global norm (echosim.backends.compute.host_optimizer_time_s). This script checks that rule where a
host CPU is at hand: it times, on all of this machine's cores, one fp32 ``torch.optim.AdamW`` step (fused and
foreach) plus ``clip_grad_norm_`` over N parameters held in 64 tensors, and a STREAM-triad-like kernel
(``a = b + s * c`` over three fp32 arrays of N elements, 12 bytes an element) for the DRAM rate. It prints the
step's effective bytes a parameter at that rate: 32 if the rule holds.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

TENSORS = 64


def _best(fn: Any, repeats: int) -> list[float]:
    fn()  # warm: first-touch pages, thread pool
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def measure(millions: int, repeats: int) -> dict[str, Any]:
    n = millions * 1_000_000
    arrays = [torch.rand(n), torch.rand(n), torch.empty(n)]
    triad = _best(lambda: torch.add(arrays[0], arrays[1], alpha=1.5, out=arrays[2]), repeats)
    scale = _best(lambda: arrays[0].mul_(1.0000001), repeats)  # in place: each line read before it is written
    arrays.clear()
    stream_GBps = 12 * n / min(triad) / 1e9
    inplace_GBps = 8 * n / min(scale) / 1e9
    rows: dict[str, Any] = {"params": n, "threads": torch.get_num_threads(), "stream_triad_GBps": stream_GBps,
                            "inplace_scale_GBps": inplace_GBps}  # fmt: skip
    for impl in ("fused", "foreach"):
        params = [torch.nn.Parameter(torch.rand(n // TENSORS)) for _ in range(TENSORS)]
        for p in params:
            p.grad = torch.rand_like(p)
        opt = torch.optim.AdamW(params, lr=1e-4, **{impl: True})

        def step(params: list[torch.nn.Parameter] = params, opt: torch.optim.Optimizer = opt) -> None:
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()

        times = _best(step, repeats)
        seconds = min(times)
        rows[impl] = {"seconds": seconds, "bytes_per_param_at_stream": seconds * stream_GBps * 1e9 / n,
                      "bytes_per_param_in_place": seconds * inplace_GBps * 1e9 / n}  # fmt: skip
        del params, opt
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--millions", type=int, default=64, help="parameters, in millions")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, help="also write the figures as JSON")
    args = parser.parse_args()
    rows = measure(args.millions, args.repeats)
    print(f"{rows['params']:,} fp32 parameters, {rows['threads']} threads; triad {rows['stream_triad_GBps']:.1f} GB/s "
          f"(12 B an element), in-place scale {rows['inplace_scale_GBps']:.1f} GB/s (8 B an element)")  # fmt: skip
    for impl in ("fused", "foreach"):
        r = rows[impl]
        print(f"  AdamW {impl:7s} + clip: {r['seconds'] * 1e3:7.1f} ms = {r['bytes_per_param_at_stream']:.1f} B/param "
              f"at the triad rate, {r['bytes_per_param_in_place']:.1f} at the in-place rate (echosim: 32)")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
