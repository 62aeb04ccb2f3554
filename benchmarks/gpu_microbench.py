"""Measure kernels and training steps on a real NVIDIA GPU, in microbench.csv's schema.

Run on a machine with a CUDA GPU and PyTorch (nothing else from echosim is needed but
its zoo modules): ``python benchmarks/gpu_microbench.py OUT.csv``. It times

* bf16 GEMMs over square and transformer-shaped sizes, and fp8 GEMMs (``torch._scaled_mm``);
* flash attention (``scaled_dot_product_attention``) forward and forward+backward, causal;
* memory-bound kernels (copy, add, LayerNorm, RMSNorm, GELU, SiLU, softmax, cross entropy);
* one micro-batch forward+backward of small zoo models (GPT and Llama), bf16,

each as the median of CUDA-event timings after warm-up, and writes one CSV row per
measurement (metric ``time_us`` plus TFLOP/s or TB/s where they apply). The rows are
the ground truth ``benchmarks/gpu_check.py`` compares echosim's backend with.
"""

from __future__ import annotations

import csv
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

FIELDS = ["source", "device", "system", "op", "dtype", "shape", "size_bytes", "num_devices", "num_nodes",
          "metric", "value", "notes"]  # fmt: skip
SOURCE = "echosim benchmarks/gpu_microbench.py"


def timed_us(fn: Callable[[], object], warmup: int = 3, iters: int = 10) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


class Writer:
    def __init__(self, path: Path) -> None:
        self.f = path.open("w", newline="")
        self.w = csv.DictWriter(self.f, FIELDS)
        self.w.writeheader()
        self.device = torch.cuda.get_device_name()

    def row(self, op: str, dtype: str, shape: str, metric: str, value: float, size: int = 0, notes: str = "") -> None:
        self.w.writerow({"source": SOURCE, "device": self.device, "system": "single GPU, PyTorch " + torch.__version__,
                         "op": op, "dtype": dtype, "shape": shape, "size_bytes": size or "", "num_devices": 1,
                         "num_nodes": 1, "metric": metric, "value": f"{value:.6g}", "notes": notes})  # fmt: skip
        self.f.flush()


def gemms(out: Writer) -> None:
    dev = "cuda"
    shapes = [(n, n, n) for n in (1024, 2048, 4096, 8192, 16384)]
    # transformer linears: (tokens, out, in) for Llama-3 8B at 8192 tokens and GPT-3 175B / TP 8 at 2048 tokens
    shapes += [(8192, 6144, 4096), (8192, 4096, 4096), (8192, 28672, 4096), (8192, 4096, 14336),
               (4096, 8192, 14336), (14336, 4096, 8192),
               (2048, 4608, 12288), (2048, 12288, 1536), (2048, 6144, 12288), (2048, 12288, 6144),
               (12288, 6144, 2048), (6144, 12288, 2048), (2048, 51200, 12288), (1024, 1024, 16384)]  # fmt: skip
    for m, n, k in shapes:
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
        us = timed_us(lambda: a @ b)  # noqa: B023
        out.row("matmul", "bf16", f"m={m} n={n} k={k}", "time_us", us)
        out.row("matmul", "bf16", f"m={m} n={n} k={k}", "TFLOPS", 2 * m * n * k / us / 1e6)
    if not hasattr(torch, "_scaled_mm"):
        return
    for m, n, k in [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 28672, 4096), (8192, 4096, 14336)]:
        a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=dev)
        try:
            us = timed_us(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))  # noqa: B023
        except RuntimeError as exc:
            print("fp8 gemm failed:", exc)
            return
        out.row("matmul", "fp8", f"m={m} n={n} k={k}", "TFLOPS", 2 * m * n * k / us / 1e6)
        out.row("matmul", "fp8", f"m={m} n={n} k={k}", "time_us", us)


def attention(out: Writer) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for b, h, s, d in [(1, 32, 4096, 128), (2, 32, 8192, 128), (4, 16, 2048, 128), (1, 64, 8192, 128),
                       (8, 12, 2048, 128), (2, 32, 4096, 64)]:  # fmt: skip
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        shape = f"b={b} h={h} s={s} d={d} causal"
        flops = 4 * b * h * s * s * d / 2  # causal: half the score matrix
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            fwd = timed_us(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))  # noqa: B023
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            g = torch.randn_like(o)
            both = timed_us(
                lambda: torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), g)  # noqa: B023
            )
        out.row("attention fwd (flash)", "bf16", shape, "time_us", fwd)
        out.row("attention fwd (flash)", "bf16", shape, "TFLOPS", flops / fwd / 1e6)
        out.row("attention fwd+bwd (flash)", "bf16", shape, "time_us", both)


def memory_bound(out: Writer) -> None:
    n = 1 << 28  # 256M elements: 512 MB in bf16, many times the L2
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    tensors = {
        "copy": (lambda: x.clone(), 2),
        "add": (lambda: x + y, 3),
        "gelu": (lambda: F.gelu(x), 2),
        "silu": (lambda: F.silu(x), 2),
    }
    for name, (fn, passes) in tensors.items():
        us = timed_us(fn)
        nbytes = passes * n * 2
        out.row(name, "bf16", f"n={n}", "time_us", us, nbytes)
        out.row(name, "bf16", f"n={n}", "achieved_TBps", nbytes / us / 1e6, nbytes)
    rows, cols = 16384, 8192
    h = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(cols, device="cuda", dtype=torch.bfloat16)
    for name, fn in {
        "layernorm": lambda: F.layer_norm(h, (cols,), w, w),
        "rmsnorm": lambda: F.rms_norm(h, (cols,), w),
        "softmax": lambda: torch.softmax(h, dim=-1),
    }.items():
        us = timed_us(fn)
        out.row(name, "bf16", f"rows={rows} cols={cols}", "time_us", us, 2 * rows * cols * 2)
    logits = torch.randn(8192, 128256, device="cuda", dtype=torch.bfloat16)
    labels = torch.randint(0, 128256, (8192,), device="cuda")
    us = timed_us(lambda: F.cross_entropy(logits, labels))
    out.row("cross_entropy", "bf16", "rows=8192 vocab=128256", "time_us", us, logits.numel() * 2)


def models(out: Writer) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from echosim.frontend import zoo_modules
    from echosim.frontend.zoo import ArchConfig

    configs = {
        "llama-1b": ArchConfig("llama", layers=8, hidden=2048, heads=16, kv_heads=8, vocab=32000, ffn=5632,
                               seq_len=4096),
        "gpt-1.3b": ArchConfig("gpt", layers=12, hidden=2048, heads=16, vocab=51200, seq_len=2048, dropout=0.1,
                               tied_embeddings=True),
        "llama-8b-4l": ArchConfig("llama", layers=4, hidden=4096, heads=32, kv_heads=8, vocab=128256, ffn=14336,
                                  seq_len=8192),
    }  # fmt: skip
    for name, cfg in configs.items():
        for batch in (1, 2):
            torch.manual_seed(0)
            with torch.device("cuda"):
                model = (zoo_modules.GPT if cfg.arch == "gpt" else zoo_modules.Llama)(cfg).to(torch.bfloat16)
            with torch.no_grad():
                for p in model.parameters():
                    p.normal_(0.0, 0.02)
            ids = torch.randint(0, cfg.vocab, (batch, cfg.seq_len), device="cuda")

            def step(model: torch.nn.Module = model, ids: torch.Tensor = ids) -> None:
                model(ids, ids).backward()

            us = timed_us(step, warmup=3, iters=8)
            shape = f"{name} layers={cfg.layers} hidden={cfg.hidden} seq={cfg.seq_len} batch={batch}"
            out.row("train fwd+bwd (zoo model)", "bf16", shape, "time_us", us,
                    notes="one micro-batch, bf16 weights, flash attention, no optimizer step")  # fmt: skip
            del model
            torch.cuda.empty_cache()


def full_steps(out: Writer) -> None:
    """Whole fp32 training steps with AdamW: step time, optimizer time and peak memory."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from echosim.frontend import zoo_modules
    from echosim.frontend.zoo import ArchConfig

    torch.backends.cuda.matmul.allow_tf32 = True
    configs = {
        "llama-1b": ArchConfig("llama", layers=8, hidden=2048, heads=16, kv_heads=8, vocab=32000, ffn=5632,
                               seq_len=2048),
        "gpt-350m": ArchConfig("gpt", layers=24, hidden=1024, heads=16, vocab=51200, seq_len=2048, dropout=0.1,
                               tied_embeddings=True),
    }  # fmt: skip
    for name, cfg in configs.items():
        batch = 2
        torch.cuda.empty_cache()
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = (zoo_modules.GPT if cfg.arch == "gpt" else zoo_modules.Llama)(cfg)
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, 0.02)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        ids = torch.randint(0, cfg.vocab, (batch, cfg.seq_len), device="cuda")

        def fwd_bwd(model: torch.nn.Module = model, ids: torch.Tensor = ids) -> None:
            model(ids, ids).backward()

        def step(opt: torch.optim.Optimizer = opt) -> None:
            opt.step()

        for _ in range(2):  # creates gradients and Adam's states
            fwd_bwd()
            step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        fwd_bwd()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        shape = f"{name} layers={cfg.layers} hidden={cfg.hidden} seq={cfg.seq_len} batch={batch}"
        notes = "fp32 weights, TF32 matmuls, fused AdamW, after two warm-up steps"
        out.row("train step peak memory (zoo model)", "fp32", shape, "bytes", peak, notes=notes)
        out.row("train fwd+bwd (zoo model)", "fp32", shape, "time_us", timed_us(fwd_bwd, 1, 5), notes=notes)
        out.row("optimizer step (fused AdamW)", "fp32", shape, "time_us", timed_us(step, 1, 5), notes=notes)
        del model, opt
        torch.cuda.empty_cache()


SECTIONS = {f.__name__: f for f in (gemms, attention, memory_bound, models, full_steps)}


def main() -> None:
    """``python gpu_microbench.py OUT.csv [SECTION ...]`` (default: every section)."""
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu_microbench.csv")
    chosen = [SECTIONS[name] for name in sys.argv[2:]] or list(SECTIONS.values())
    out = Writer(path)
    t0 = time.time()
    for section in chosen:
        try:
            section(out)
        except Exception as exc:  # keep what the other sections measured
            print(f"{section.__name__} failed: {type(exc).__name__}: {exc}")
        print(f"{section.__name__} done at {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
