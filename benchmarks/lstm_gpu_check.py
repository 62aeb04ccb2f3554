"""Time cuDNN LSTM, GRU and RNN training steps on the local GPU at fixed shapes, to check echosim's recurrent cost.

Each case is SuperBench's LSTM benchmark model (``echosim.frontend.zoo_torch.lstm_superbench_module``'s
layout: one ``nn.LSTM`` of ``layers`` layers over float features, a linear classifier on the last step,
cross-entropy), or the same stack as ``layers`` separate single-layer ``nn.LSTM`` modules (``split``: cuDNN
then cannot overlap one layer's steps with the next layer's). Times forward+backward and a full step with
SGD (momentum, nesterov), CUDA events, median of ``--iters`` after warm-up. The ``gru-`` and ``rnn-`` cases run
``nn.GRU`` and ``nn.RNN`` (tanh) at GNMT's layer shape: their kernel lists say whether cuDNN runs a GRU or RNN step
as one recurrent GEMM and one gate kernel each way, as echosim.frontend.recurrent costs every cell. Writes JSON to
argv[1].

    python benchmarks/lstm_gpu_check.py out.json

benchmarks/data/lstm_gpu_check_h200.json is one run on an H200 (torch 2.11.0+cu130, cuDNN 9.19) in a sandboxed VM
whose kernel-launch latency is not bare metal's: read its kernel lists (counts per layer and step, the kernels cuDNN
picks) more than its wall times. It is a check of the cost model's structure, not a published row.
"""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any

import torch
from torch import nn

CASES = [  # (name, input, hidden, layers, steps, batch)
    ("superbench", 224, 1000, 8, 32, 224),
    ("gnmt-layer", 1024, 1024, 1, 50, 128),
    ("gnmt-4", 1024, 1024, 4, 50, 128),
    ("zaremba", 1500, 1500, 2, 35, 64),
    ("gru-gnmt-layer", 1024, 1024, 1, 50, 128),
    ("rnn-gnmt-layer", 1024, 1024, 1, 50, 128),
]
CELLS = {"gru": nn.GRU, "rnn": nn.RNN}  # a case named after one runs that layer instead of nn.LSTM


class Net(nn.Module):
    def __init__(self, inp: int, hidden: int, layers: int, split: bool, layer: type[nn.Module] = nn.LSTM) -> None:
        super().__init__()
        if split:
            self.lstms = nn.ModuleList(
                layer(inp if i == 0 else hidden, hidden, batch_first=True) for i in range(layers)
            )
        else:
            self.lstms = nn.ModuleList([layer(inp, hidden, layers, batch_first=True)])
        self.linear = nn.Linear(hidden, 100)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for lstm in self.lstms:
            x = lstm(x)[0]
        return self.linear(x[:, -1, :])


def timed(fn: Any, iters: int) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def measure(net: nn.Module, inp: int, steps: int, batch: int, dtype: torch.dtype, profile: bool) -> dict[str, Any]:
    """Milliseconds of a no-grad forward, a forward+backward and a whole SGD step of ``net``."""
    net = net.cuda().to(dtype)
    opt = torch.optim.SGD(net.parameters(), lr=1e-5, momentum=0.9, weight_decay=1e-4, nesterov=True)
    x = torch.randn(batch, steps, inp, device="cuda", dtype=dtype)
    y = torch.randint(0, 100, (batch,), device="cuda")
    loss_fn = nn.CrossEntropyLoss()

    def fwd_bwd() -> None:
        net.zero_grad(set_to_none=False)
        loss_fn(net(x), y).backward()

    def step() -> None:
        fwd_bwd()
        opt.step()

    def fwd() -> None:
        with torch.no_grad():
            net(x)

    out: dict[str, Any] = {
        "fwd_nograd_ms": timed(fwd, 20),
        "fwd_bwd_ms": timed(fwd_bwd, 20),
        "step_ms": timed(step, 20),
    }
    if profile:  # the kernels of one forward+backward: count and total microseconds per kernel name
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fwd_bwd()
            torch.cuda.synchronize()
        kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
        kernels.sort(key=lambda e: -e.device_time_total)
        out["kernels"] = [[e.key[:120], e.count, round(e.device_time_total, 1)] for e in kernels[:25]]
    return out


def main() -> None:
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    results = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "cases": [],
    }
    for name, inp, hidden, layers, steps, batch in CASES:
        for dtype in (torch.float32, torch.float16):
            for split in (False, True) if layers > 1 else (False,):
                net = Net(inp, hidden, layers, split, CELLS.get(name.split("-")[0], nn.LSTM))
                row = {"case": name, "input": inp, "hidden": hidden, "layers": layers, "steps": steps,
                       "batch": batch, "dtype": str(dtype).removeprefix("torch."), "split": split,
                       **measure(net, inp, steps, batch, dtype, profile=name != "zaremba")}  # fmt: skip
                print(json.dumps(row), flush=True)
                results["cases"].append(row)
                torch.cuda.empty_cache()
    with open(sys.argv[1], "w", encoding="utf-8") as fh:
        json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
