"""Host-bound MoE layers: measure what a dropless layer's device-to-host sync and per-expert launches cost.

Prepared for a device session (issue 16): the Megatron-Bridge MoE rows that run the dropless
``alltoall`` dispatcher without CUDA graphs miss by 3-9 ms per MoE layer and micro-batch
(docs/accuracy.md), while the same models under HybridEP + CUDA graphs are within 10%. Two
behaviours could carry it, and this script measures both on one GPU, in plain PyTorch eager:

* the dispatcher copies the tokens-per-expert counts to the host (``.tolist()``) before it can
  size the permutation and the all_to_all, so the host stops until the GPU has drained;
* Transformer Engine's grouped GEMM launches one GEMM per local expert (4 streams), so a layer
  issues ``3 x experts`` GEMM launches forward and twice that backward.

For each shape, a chain of ``--layers`` MoE layers (router, top-k, counts, permute, per-expert
SwiGLU GEMMs, un-permute, weighted sum) runs forward + backward, and the script reports:

* ``wall_sync_s`` / ``wall_nosync_s``: wall seconds per layer with the ``.tolist()`` sync and with
  the counts known in advance (the host can run ahead);
* ``host_issue_s``: host seconds per layer to enqueue the no-sync chain (no synchronisation at all);
* ``gpu_kernel_s``: seconds per layer the GPU spends in kernels (profiler), and ``kernels`` per layer.

Host-bound execution shows as ``wall_nosync_s ~ host_issue_s > gpu_kernel_s``; the sync's cost as
``wall_sync_s - wall_nosync_s``. ``host_issue_s`` is an upper bound once the GPU is the slower side (a full
launch queue blocks the host). ``self.fc1[e]`` backpropagates as a scatter into a zeroed gradient of the
whole ``[experts, ...]`` weight per expert, so ``gpu_kernel_s`` carries ``experts`` such passes per weight
that TE's GroupedLinear (one weight tensor per expert) does not: compare the sync's cost, not the GPU time.
The output is data for a host-time rule, not a test:

    PYTHONPATH=. python3 benchmarks/moe_host_gpu.py [--layers 8] [--out moe_host.json]

Without a GPU it runs one tiny shape on the CPU (a smoke test of the script itself).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

# (label, tokens per micro-batch, hidden, expert ffn, local experts, top_k): the per-rank shapes of
# cases.csv rows whose EP groups stay inside a node (each rank routes to its own experts here, so top_k
# must not exceed the local experts: gpt-oss at ep 64, 2 local experts of top-4, cannot be run this way).
# The shapes of the stored run (benchmarks/moe_host_h200.json, moe_host_bound.md "Session 11").
SHAPES = [
    ("qwen3-30b-a3b ep8 mbs1", 4096, 2048, 768, 16, 8),
    ("qwen3-235b-a22b ep8 mbs1", 4096, 4096, 1536, 16, 8),
    ("deepseek-v3 ep8 mbs1", 4096, 7168, 2048, 32, 8),
    ("qwen3-30b-a3b ep8 mbs4", 16384, 2048, 768, 16, 8),
]
TINY = [("tiny (cpu smoke test)", 64, 32, 16, 4, 2)]


class Layer(torch.nn.Module):
    """One dropless MoE layer as Megatron-Core's alltoall path runs it on one rank (no EP exchange)."""

    def __init__(self, hidden: int, ffn: int, experts: int, top_k: int) -> None:
        super().__init__()
        self.top_k, self.experts = top_k, experts
        self.router = torch.nn.Linear(hidden, experts, bias=False)
        self.fc1 = torch.nn.Parameter(torch.randn(experts, hidden, 2 * ffn) * 0.02)
        self.fc2 = torch.nn.Parameter(torch.randn(experts, ffn, hidden) * 0.02)

    def forward(self, x: torch.Tensor, counts: list[int] | None) -> torch.Tensor:
        probs = F.softmax(self.router(x).float(), dim=-1)
        weights, _ = torch.topk(probs, self.top_k, dim=-1)
        # force-balanced choices (Megatron's --moe-router-force-load-balancing, as NVIDIA's benchmarks run)
        flat = torch.arange(x.shape[0] * self.top_k, device=x.device) % self.experts
        order = torch.argsort(flat, stable=True)
        if counts is None:  # the dispatcher's device-to-host copy: the host waits for the GPU here
            counts = torch.bincount(flat, minlength=self.experts).tolist()
        rows = x.index_select(0, order // self.top_k)
        outs = []
        for e, part in enumerate(torch.split(rows, counts)):  # one GEMM per expert, as TE launches them
            gate, up = (part @ self.fc1[e]).chunk(2, dim=-1)
            outs.append((F.silu(gate) * up) @ self.fc2[e])
        back = torch.empty_like(rows).index_copy(0, order, torch.cat(outs))
        return x + (back.view(x.shape[0], self.top_k, -1) * weights.unsqueeze(-1).to(x.dtype)).sum(dim=1)


def _wall(fn: Callable[[], None], sync: Callable[[], None], reps: int) -> float:
    fn()
    sync()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - start) / reps


def measure(shape: tuple, layers: int, device: str, reps: int) -> dict[str, object]:
    label, tokens, hidden, ffn, experts, top_k = shape
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    chain = [Layer(hidden, ffn, experts, top_k).to(device, dtype) for _ in range(layers)]
    x0 = torch.randn(tokens, hidden, device=device, dtype=dtype, requires_grad=True)
    balanced = [tokens * top_k // experts] * experts  # force-balanced routing, as NVIDIA's benchmarks
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def step(counts: list[int] | None) -> None:
        x = x0
        for layer in chain:
            x = layer(x, counts)
        x.float().sum().backward()

    # both variants route the same balanced way: they differ only in the device-to-host copy
    out: dict[str, object] = {"shape": label, "layers": layers}
    out["wall_sync_s"] = _wall(lambda: step(None), sync, reps) / layers
    out["wall_nosync_s"] = _wall(lambda: step(balanced), sync, reps) / layers
    sync()
    start = time.perf_counter()
    step(balanced)
    out["host_issue_s"] = (time.perf_counter() - start) / layers
    sync()
    if device == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step(balanced)
            sync()
        kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
        out["gpu_kernel_s"] = sum(e.device_time for e in kernels) / 1e6 / layers
        out["kernels"] = len(kernels) / layers
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shapes = SHAPES if device == "cuda" else TINY
    meta = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__}
    rows = [measure(s, args.layers, device, args.reps) for s in shapes]
    text = json.dumps({"meta": meta, "rows": rows}, indent=1, sort_keys=True)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
