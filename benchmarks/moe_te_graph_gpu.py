"""Per-expert GEMMs in Transformer Engine's issue order, with and without the host: eager vs CUDA-graph replay.

Prepared and run for issue 16 (benchmarks/moe_host_bound.md, "Session 11"; raw: moe_te_graph_h200.json). TE's
GroupedLinear runs one cuBLAS GEMM per local expert, round-robin on four compute streams fenced by events
(``multi_stream_cublas_gemm``, transformer_engine/common/gemm/cublaslt_gemm.cu; see
:func:`echosim.backends.compute.expert_gemms_time_s`). Timed three ways per shape, each eager (the host issues
every launch, here from Python) and as a replayed CUDA graph (no host work: the GPU side alone): ``te4`` (that
order on four streams), ``serial`` (one stream) and ``grouped`` (``torch._grouped_mm``, row-major weights, a
column-major copy where the build rejects them). Eager minus graph is the host's share; graph ``te4`` against
``serial`` is what four streams recover on the GPU. Not a test: it needs a GPU.

    python3 benchmarks/moe_te_graph_gpu.py [out.json]
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import torch

# (label, local experts, rows per expert, k, n): bf16 expert GEMMs of the ep 8 rows at micro-batch 1
SHAPES = [
    ("q30 up", 16, 2048, 2048, 1536),  # qwen3-30b-a3b: gate/up, 2048 -> 2 x 768
    ("q30 down", 16, 2048, 768, 2048),
    ("q235 up", 16, 2048, 4096, 3072),  # qwen3-235b-a22b: 4096 -> 2 x 1536
    ("q235 down", 16, 2048, 1536, 4096),
    ("dsv3 up", 32, 1024, 7168, 4096),  # DeepSeek-V3: 7168 -> 2 x 2048
    ("dsv3 down", 32, 1024, 2048, 7168),
    ("q30 ep1 up", 128, 256, 2048, 1536),  # qwen3-30b-a3b without EP: 128 small experts
]
TE_COMPUTE_STREAMS = 4  # num_compute_streams, transformer_engine/common/util/multi_stream.cpp (v2.7-v2.18)


def bench(fn: Callable[[], object], reps: int = 20) -> float:
    """Mean µs per call over ``reps`` back-to-back calls after 3 warm-ups, timed with CUDA events."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return round(start.elapsed_time(end) / reps * 1e3, 1)


def measure(label: str, experts: int, m: int, k: int, n: int) -> dict[str, object]:
    bf16 = torch.bfloat16
    x = torch.randn(experts * m, k, device="cuda", dtype=bf16)
    w = torch.randn(experts, k, n, device="cuda", dtype=bf16) / k**0.5
    xs, ws = list(x.split(m)), list(w.unbind(0))
    outs = [torch.empty(m, n, device="cuda", dtype=bf16) for _ in range(experts)]
    side = [torch.cuda.Stream() for _ in range(TE_COMPUTE_STREAMS)]

    def te4() -> None:
        caller = torch.cuda.current_stream()
        ready = caller.record_event()
        for i in range(experts):
            stream = side[i % TE_COMPUTE_STREAMS]
            stream.wait_event(ready)
            with torch.cuda.stream(stream):
                torch.mm(xs[i], ws[i], out=outs[i])
        for stream in side:
            caller.wait_event(stream.record_event())

    def serial() -> None:
        for i in range(experts):
            torch.mm(xs[i], ws[i], out=outs[i])

    offs = torch.arange(1, experts + 1, device="cuda", dtype=torch.int32) * m
    w_col = w.transpose(-2, -1).contiguous().transpose(-2, -1)

    def grouped() -> torch.Tensor:
        try:
            return torch._grouped_mm(x, w, offs=offs)
        except Exception:  # builds that want column-major B
            return torch._grouped_mm(x, w_col, offs=offs)

    row: dict[str, object] = {"shape": label, "experts": experts, "m": m, "k": k, "n": n}
    for name, fn in (("te4", te4), ("serial", serial), ("grouped", grouped)):
        try:
            row[f"{name}_eager_us"] = bench(fn)
            graph, warm = torch.cuda.CUDAGraph(), torch.cuda.Stream()
            warm.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(warm):
                fn()
            torch.cuda.current_stream().wait_stream(warm)
            with torch.cuda.graph(graph):
                fn()
            row[f"{name}_graph_us"] = bench(graph.replay)
        except Exception as exc:  # a variant this build cannot run or capture
            row[f"{name}_error"] = str(exc)[:150]
    return row


def main() -> None:
    rows = []
    for shape in SHAPES:
        rows.append(measure(*shape))
        print(rows[-1], flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
