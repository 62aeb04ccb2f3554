"""Do a training step's GEMMs run like warm ones (operands in cache) or like ones after a cache eviction?

Usage::

    python benchmarks/cpu_matmul_cold.py [--model llama-4L-256] [--passes 5] [--out FILE.json]

``echosim calibrate`` times matmuls warm (the same operands back to back) and memory-bound kernels beyond a core's
L2 after rewriting a buffer the size of the last-level cache (``bench.CacheEvictor``). In a step a GEMM's weight was
last touched by the previous optimizer step and its activations layers before, so its operands might come from
DRAM. This script times every GEMM of one of ``benchmarks/cpu_reality.py``'s models as ``nn.Linear`` runs it (one
thread, fp32; forward ``x @ W.t()``, backward ``dY @ W`` and ``dY.t() @ x``, 1,024 tokens: 4 sequences of 256)
three ways, each pass summing one call of each GEMM by process CPU time: warm (the call right after the same
call), after rewriting a buffer of the LLC's size, and of four times it (STREAM's rule for an array no cache
holds, stream.c v5.10). Then it profiles three real training steps of the same model (``cpu_breakdown.measure``)
and prints the self CPU time of their matmuls beside the three sums. The attention's score products are not GEMMs
here (PyTorch's CPU flash kernel runs them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import cpu_reality as cr  # noqa: E402


def linear_shapes(name: str) -> list[tuple[int, int]]:
    """(out_features, in_features) of every linear of a step of model ``name`` (zoo_modules' layout)."""
    cfg = cr.MODELS[name]
    h, q, kv, ffn = cfg.hidden, cfg.heads * cfg.dim_head, cfg.n_kv_heads * cfg.dim_head, cfg.ffn_hidden
    if cfg.arch == "llama":
        per_layer = [(q, h), (kv, h), (kv, h), (h, q), (ffn, h), (ffn, h), (h, ffn)]
    else:
        per_layer = [(q + 2 * kv, h), (h, q), (ffn, h), (h, ffn)]
    return per_layer * cfg.layers + [(cfg.vocab, h)]


def gemm_calls(name: str) -> list[Callable[[], Any]]:
    """The forward and both backward GEMMs of each linear, on random operands of the step's shapes."""
    import torch

    cfg = cr.MODELS[name]
    tokens = cr.BATCH * cfg.seq_len
    calls: list[Callable[[], Any]] = []
    for out_f, in_f in linear_shapes(name):
        x, w, dy = torch.randn(tokens, in_f), torch.randn(out_f, in_f), torch.randn(tokens, out_f)
        calls += [lambda x=x, w=w: torch.mm(x, w.t()), lambda dy=dy, w=w: torch.mm(dy, w)]
        calls.append(lambda dy=dy, x=x: torch.mm(dy.t(), x))
    return calls


def summed_s(calls: list[Callable[[], Any]], before: Callable[[], None] | None) -> float:
    """CPU seconds of one call of each GEMM, each timed right after a call of itself and then ``before``."""
    total = 0.0
    for fn in calls:
        fn()
        if before is not None:
            before()
        c0 = time.process_time()
        fn()
        total += time.process_time() - c0
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-4L-256", choices=sorted(cr.MODELS))
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--out", type=Path, help="Write the figures as JSON here.")
    args = parser.parse_args()
    import cpu_breakdown as cb
    import torch

    from echosim.calibrate.bench import CacheEvictor, cache_bytes

    torch.set_num_threads(1)
    llc = cache_bytes()
    calls = gemm_calls(args.model)
    ways = {"warm": None, "evicted 1x LLC": CacheEvictor(llc), "evicted 4x LLC": CacheEvictor(4 * llc)}
    load0 = os.getloadavg()[0]
    sums: dict[str, list[float]] = {way: [] for way in ways}
    for _ in range(args.passes):  # the ways interleaved, so that the machine's drift falls on all three
        for way, before in ways.items():
            sums[way].append(summed_s(calls, before))
    step = cb.measure(args.model)
    in_step = step["categories_s"]["matmul"]
    load1 = os.getloadavg()[0]
    print(f"{args.model}: {len(calls)} GEMMs a step, LLC {llc / 2**20:g} MiB, load {load0:.2f} -> {load1:.2f}")
    for way, values in sums.items():
        med = statistics.median(values)
        print(f"{way:16s} {med * 1e3:7.1f} ms (passes {', '.join(f'{v * 1e3:.0f}' for v in values)})")
    print(f"{'in the step':16s} {in_step * 1e3:7.1f} ms (self CPU of aten::mm/addmm/bmm, torch.profiler, 3 steps)")
    if args.out:
        result = {"model": args.model, "llc_bytes": llc, "sums_s": sums, "in_step_s": in_step, "load": load0}
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
