"""Measure MoE expert kernels on a real GPU and print echosim's prediction beside each.

Per-rank shapes of the expert layers in the cases.csv MoE rows: grouped GEMMs
(``torch._grouped_mm``, forward, dgrad and wgrad) and the dense batched GEMM echosim
costs them as, plus the token permute / un-permute. Also the forward as Transformer Engine's
``GroupedLinear`` runs it (``te_streams``): one GEMM per local expert, round-robin on TE's four
compute streams, fenced by events on the calling stream (``multi_stream_cublas_gemm``,
transformer_engine/common/gemm/cublaslt_gemm.cu, TE v2.9; the path of ``general_grouped_gemm``
in TE v2.7-v2.14 except the opt-in Hopper bf16 CUTLASS kernel), and the same GEMMs one after
another on one stream (``serial``), each beside echosim's closed form for it
(``expert_gemms_time_s`` on four streams and on one). Which of the grouped and the per-expert times
TE's rows pay is what benchmarks/moe_host_bound.md and moe_te_streams.md leave open. Run on a CUDA machine:

    PYTHONPATH=. python3 benchmarks/moe_kernels_gpu.py [device-name] [out.json]

``device-name`` is an echosim device (default h200). Not a test: it needs a GPU.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import torch

from echosim.backends.compute import expert_gemms_time_s, matmul_time_s, memory_bound_time_s
from echosim.backends.devices import DEVICES

# (label, local experts, rows per expert, hidden, expert ffn, tokens, top_k)
SHAPES = [
    ("qwen3-30b-a3b ep8", 16, 2048, 2048, 768, 4096, 8),
    ("qwen3-30b-a3b ep1", 128, 256, 2048, 768, 4096, 8),
    ("gpt-oss-120b ep8 mbs4", 16, 4096, 2880, 2880, 16384, 4),
    ("grok-1 tp4 ep2", 4, 2048, 6144, 8192, 4096, 2),
    ("mixtral-8x7b ep8", 1, 8192, 4096, 14336, 4096, 2),
]


def bench(fn, reps: int = 30) -> float:
    """Median seconds over ``reps`` runs after warm-up, timed with CUDA events."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return times[len(times) // 2]


def _first(variants: list, out: dict[str, float], key: str) -> None:
    """Time the first operand layout the grouped GEMM accepts."""
    errors = []
    for fn in variants:
        try:
            fn()
        except Exception as exc:  # layouts differ between releases: try the next one
            errors.append(f"{type(exc).__name__}: {exc}"[:120])
            continue
        out[key] = bench(fn)
        return
    out[f"{key}_error"] = " | ".join(errors)  # type: ignore[assignment]


def grouped(groups: int, m: int, k: int, n: int) -> dict[str, float]:
    x = torch.randn(groups * m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(groups, k, n, device="cuda", dtype=torch.bfloat16) / k**0.5
    dy = torch.randn(groups * m, n, device="cuda", dtype=torch.bfloat16)
    offs = torch.arange(1, groups + 1, device="cuda", dtype=torch.int32) * m
    col = w.transpose(-2, -1).contiguous().transpose(-2, -1)  # same values, column-major
    gm = torch._grouped_mm
    out: dict[str, float] = {}
    _first([lambda: gm(x, w, offs=offs), lambda: gm(x, col, offs=offs)], out, "fwd")
    wt = w.transpose(-2, -1)
    _first([lambda: gm(dy, wt, offs=offs), lambda: gm(dy, wt.contiguous(), offs=offs)], out, "dgrad")
    xt = x.t()
    _first(
        [
            lambda: gm(xt, dy, offs=offs),
            lambda: gm(xt.contiguous(), dy, offs=offs),
            lambda: gm(xt, dy.t().contiguous().t(), offs=offs),
        ],
        out,
        "wgrad",
    )
    xb = x.view(groups, m, k)
    out["bmm_fwd"] = bench(lambda: torch.bmm(xb, w))
    out["te_streams_fwd"] = bench(per_expert(xb, w, TE_COMPUTE_STREAMS))
    out["serial_fwd"] = bench(per_expert(xb, w, 1))
    return out


#: Transformer Engine's compute streams for grouped GEMMs (``num_compute_streams = 4``,
#: transformer_engine/common/util/multi_stream.cpp, TE v2.9).
TE_COMPUTE_STREAMS = 4


def per_expert(x: torch.Tensor, w: torch.Tensor, streams: int) -> Callable[[], None]:
    """One ``x[e] @ w[e]`` per expert, issued as TE's multi_stream_cublas_gemm does: the side streams
    wait on the calling stream, GEMM ``e`` runs on stream ``e % streams``, the calling stream waits on all."""
    out = torch.empty(x.shape[0], x.shape[1], w.shape[2], device=x.device, dtype=x.dtype)

    def serial() -> None:
        for e in range(x.shape[0]):
            torch.mm(x[e], w[e], out=out[e])

    if streams <= 1 or x.device.type != "cuda":
        return serial
    side = [torch.cuda.Stream(device=x.device) for _ in range(streams)]

    def run() -> None:
        main = torch.cuda.current_stream(x.device)
        start = main.record_event()
        for s in side:
            s.wait_event(start)
        for e in range(x.shape[0]):
            with torch.cuda.stream(side[e % streams]):
                torch.mm(x[e], w[e], out=out[e])
        for s in side:
            main.wait_event(s.record_event())

    return run


def permutes(tokens: int, k: int, h: int) -> tuple[float, float]:
    """Gather the T*k routed rows; scatter them back and sum each token's k by router weight."""
    x = torch.randn(tokens, h, device="cuda", dtype=torch.bfloat16)
    order = torch.randperm(tokens * k, device="cuda")
    src = order // k
    y = torch.randn(tokens * k, h, device="cuda", dtype=torch.bfloat16)
    wts = torch.rand(tokens, k, 1, device="cuda", dtype=torch.bfloat16)
    permute = bench(lambda: x.index_select(0, src))
    unpermute = bench(lambda: (torch.empty_like(y).index_copy_(0, order, y).view(tokens, k, h) * wts).sum(1))
    return permute, unpermute


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "h200"
    dev = DEVICES[name]
    print(torch.cuda.get_device_name(), torch.__version__)
    results = []
    for label, g, m, h, f, tokens, k in SHAPES:
        for proj, (kk, nn) in (("gate/up", (h, f)), ("down", (f, h))):
            meas = grouped(g, m, kk, nn)
            pred = {
                "fwd": matmul_time_s(dev, m, nn, kk, g, grouped=True),
                "dgrad": matmul_time_s(dev, m, kk, nn, g, grouped=True),
                "wgrad": matmul_time_s(dev, kk, nn, m, g, grouped=True),
                "serial_fwd": expert_gemms_time_s(dev, m, nn, kk, g, streams=1),
                "te_streams_fwd": expert_gemms_time_s(dev, m, nn, kk, g, streams=TE_COMPUTE_STREAMS),
            }
            results.append({"shape": label, "proj": proj, "measured": meas, "predicted": pred})
            row = " ".join(
                f"{p}={meas.get(p, float('nan')) * 1e6:7.1f}/{pred[p] * 1e6:7.1f}us" for p in ("fwd", "dgrad", "wgrad")
            )
            errs = " ".join(str(v) for key, v in meas.items() if key.endswith("error"))
            print(f"{label:24} {proj:8} meas/pred {row} bmm={meas['bmm_fwd'] * 1e6:7.1f}us {errs}")
            print(
                f"{'':24} {proj:8} per expert meas/pred: te_streams={meas['te_streams_fwd'] * 1e6:7.1f}/"
                f"{pred['te_streams_fwd'] * 1e6:7.1f}us serial={meas['serial_fwd'] * 1e6:7.1f}/"
                f"{pred['serial_fwd'] * 1e6:7.1f}us"
            )
        permute, unpermute = permutes(tokens, k, h)
        row_bytes = 2 * h
        pred_perm = memory_bound_time_s(dev, tokens * row_bytes + tokens * k * row_bytes + tokens * k * 8)
        pred_unperm = memory_bound_time_s(dev, 2 * tokens * k * row_bytes + tokens * row_bytes + tokens * k * 10)
        results.append({"shape": label, "permute": [permute, pred_perm], "unpermute": [unpermute, pred_unperm]})
        print(
            f"{label:24} permute meas/pred {permute * 1e6:7.1f}/{pred_perm * 1e6:7.1f}us "
            f"unpermute {unpermute * 1e6:7.1f}/{pred_unperm * 1e6:7.1f}us"
        )
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
