"""ViT training steps timed on a real GPU, to check echosim's vision-transformer cost where no framework stands between.

Prepared for issue 15 (the ViT family of ``benchmarks/nonllm_accuracy.py`` is predicted too fast on every published
row). Times one PyTorch training step (forward, cross-entropy, backward, fused AdamW) of the zoo's own modules
(:func:`echosim.frontend.zoo_torch.vit_module`, the same code echosim captures) on random data, eager and bf16
autocast, at a few batch sizes, with CUDA events; then one profiled step per shape, its CUDA time summed per kernel
family (GEMM, attention, elementwise/norm, optimizer, other). Not a test: it needs a GPU.

    python3 benchmarks/vit_gpu_check.py [out.json]
"""

from __future__ import annotations

import json
import sys
import time

import torch

from echosim.frontend.zoo_torch import vit_module

# (label, vit_module kwargs, batch per GPU): ViT-B/16 in its pre-training form (dropout 0.1, tanh pre-logits 768:
# the Rosetta/Google recipe) and ViT-g/14-like width at a batch that fits one GPU.
SHAPES = [
    ("vit-b16-pretrain", dict(dropout=0.1, representation=768), 256),
    ("vit-b16-pretrain", dict(dropout=0.1, representation=768), 512),
    ("vit-b16", {}, 256),
    ("vit-l16", dict(layers=24, hidden=1024, heads=16, ffn=4096), 128),
]


def family(name: str) -> str:
    """Kernel family of a CUDA kernel name. Attention and convolution are matched before GEMMs: cuDNN's SDPA
    kernels carry ``wgmma`` and its convolutions ``cutlass`` in their names (the run stored in
    ``benchmarks/data/vit_gpu_check_h200.json`` predates this order, so its ``profiled_ms_by_family`` counts them
    as GEMMs; ``benchmarks/vit_gpu_compare.py`` re-classifies its ``top_kernels_ms``)."""
    n = name.lower()
    if any(k in n for k in ("sdpa", "flash", "fmha", "attention", "dot_do_o", "convert_dq")):
        return "attention"
    if "cudnn" in n or any(k in n for k in ("conv", "implicit", "winograd", "nchwtonhwc")):  # SDPA matched above
        return "conv"
    if any(k in n for k in ("gemm", "cutlass", "sm90_xmma", "sm80_xmma", "ampere_", "nvjet", "wgmma")):
        return "gemm"
    if any(k in n for k in ("adam", "multi_tensor", "foreach")):
        return "optimizer"
    return "elementwise/norm/other"


def run(label: str, kwargs: dict, batch: int, reps: int = 10) -> dict:
    torch.manual_seed(0)
    model = vit_module(**kwargs).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    images = torch.randn(batch, 3, 224, 224, device="cuda")
    labels = torch.randint(0, 1000, (batch,), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        step()
    end.record()
    torch.cuda.synchronize()
    step_ms = start.elapsed_time(end) / reps
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    fams: dict[str, float] = {}
    kernels: dict[str, float] = {}
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
        if us and e.key:
            kernels[e.key[:120]] = us / 1e3
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
        if us and e.key and not e.key.startswith("ProfilerStep"):
            fams[family(e.key)] = fams.get(family(e.key), 0.0) + us / 1e3
    return {
        "model": label, "kwargs": kwargs, "batch": batch, "step_ms": round(step_ms, 3),
        "images_per_s": round(batch / step_ms * 1e3, 1),
        "profiled_ms_by_family": {k: round(v, 3) for k, v in sorted(fams.items())},
        "top_kernels_ms": {k: round(v, 3) for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])[:25]},
    }  # fmt: skip


def main() -> None:
    out = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": [],
    }
    for label, kwargs, batch in SHAPES:
        row = run(label, kwargs, batch)
        torch.cuda.empty_cache()
        print(json.dumps(row), flush=True)
        out["rows"].append(row)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
