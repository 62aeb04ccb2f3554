"""The same vision and speech models through the torch and the ONNX frontends: step, parameters, FLOPs.

Usage::

    python benchmarks/onnx_parity.py [--backend h100-sxm] [--batch 2] [--models unet swin conformer]

Each model is written to a ``.py`` file (a factory returning the module and its input shapes), exported to ONNX
with ``torch.onnx.export(dynamo=True)`` on the CPU (small real weights, the batch fixed at ``--batch``), and
compiled from both on one device of ``--backend`` at that batch. torch.onnx writes some modules PyTorch runs as
one kernel as several ops (GroupNorm as InstanceNormalization between reshapes and an affine Mul and Add, SiLU
as ``x * sigmoid(x)``, GLU as Split, Sigmoid, Mul); echosim's ONNX rules read them back as the one kernel, so
the two routes should cost the same step. What they cannot agree on: an eval-mode export folds BatchNorm into
the convolution before it, and stores identical initializers once.

Needs ``onnxscript`` (``pip install 'echosim[onnx-export]'``). Prints one row per model and route.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import warnings
from pathlib import Path

MODELS = {
    "unet": '''
import torch, torch.nn as nn, torch.nn.functional as F

class Res(nn.Module):
    def __init__(s, c, o):
        super().__init__()
        s.n1, s.c1 = nn.GroupNorm(32, c), nn.Conv2d(c, o, 3, padding=1)
        s.n2, s.c2 = nn.GroupNorm(32, o), nn.Conv2d(o, o, 3, padding=1)
        s.skip = nn.Conv2d(c, o, 1) if c != o else nn.Identity()
    def forward(s, x):
        return s.skip(x) + s.c2(F.silu(s.n2(s.c1(F.silu(s.n1(x))))))

class Attn(nn.Module):
    def __init__(s, c, heads=8):
        super().__init__()
        s.n, s.qkv, s.o, s.h = nn.GroupNorm(32, c), nn.Conv2d(c, 3 * c, 1), nn.Conv2d(c, c, 1), heads
    def forward(s, x):
        b, c, hh, ww = x.shape
        q, k, v = s.qkv(s.n(x)).reshape(b, 3, s.h, c // s.h, hh * ww).transpose(-1, -2).unbind(1)
        y = F.scaled_dot_product_attention(q, k, v).transpose(-1, -2).reshape(b, c, hh, ww)
        return x + s.o(y)

class UNet(nn.Module):
    """A diffusion model's noise predictor: residual blocks with GroupNorm and SiLU, attention at each level."""
    def __init__(s, ch=(128, 256, 512)):
        super().__init__()
        s.inp, s.down, s.up, c = nn.Conv2d(4, ch[0], 3, padding=1), nn.ModuleList(), nn.ModuleList(), ch[0]
        for o in ch:
            s.down.append(nn.ModuleList([Res(c, o), Attn(o), nn.Conv2d(o, o, 3, 2, 1)]))
            c = o
        s.mid = nn.Sequential(Res(c, c), Attn(c), Res(c, c))
        for o in reversed(ch):
            s.up.append(nn.ModuleList([nn.ConvTranspose2d(c, c, 4, 2, 1), Res(c + o, o), Attn(o)]))
            c = o
        s.out = nn.Conv2d(c, 4, 3, padding=1)
    def forward(s, x, noise):
        h, skips = s.inp(x), []
        for r, a, d in s.down:
            h = a(r(h))
            skips.append(h)
            h = d(h)
        h = s.mid(h)
        for u, r, a in s.up:
            h = a(r(torch.cat([u(h), skips.pop()], 1)))
        return F.mse_loss(s.out(h), noise)

def model():
    return UNet(), [(("batch", 4, 64, 64), torch.float32), (("batch", 4, 64, 64), torch.float32)]
''',
    "swin": '''
import torch, torch.nn as nn, torch.nn.functional as F

class Block(nn.Module):
    def __init__(s, d, h, w, shift):
        super().__init__()
        s.qkv, s.proj, s.h, s.w, s.shift = nn.Linear(d, 3 * d), nn.Linear(d, d), h, w, shift
        s.ln1, s.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        s.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
    def forward(s, x):
        b, H, W, d = x.shape
        y = s.ln1(x)
        if s.shift:
            y = torch.roll(y, (-s.w // 2, -s.w // 2), (1, 2))
        y = y.view(b, H // s.w, s.w, W // s.w, s.w, d).permute(0, 1, 3, 2, 4, 5).reshape(-1, s.w * s.w, d)
        q, k, v = s.qkv(y).reshape(y.shape[0], -1, 3, s.h, d // s.h).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(-1, s.w * s.w, d)
        y = s.proj(y).view(b, H // s.w, W // s.w, s.w, s.w, d).permute(0, 1, 3, 2, 4, 5).reshape(b, H, W, d)
        if s.shift:
            y = torch.roll(y, (s.w // 2, s.w // 2), (1, 2))
        x = x + y
        return x + s.mlp(s.ln2(x))

class Swin(nn.Module):
    """Swin-T (Liu et al. 2021): four stages of windowed attention, plain and shifted windows in turn."""
    def __init__(s, d=96, depth=(2, 2, 6, 2)):
        super().__init__()
        s.patch, s.stages, s.merges = nn.Conv2d(3, d, 4, 4), nn.ModuleList(), nn.ModuleList()
        for i, n in enumerate(depth):
            s.stages.append(nn.ModuleList(Block(d, d // 32, 7, j % 2 == 1) for j in range(n)))
            if i < 3:
                s.merges.append(nn.Linear(4 * d, 2 * d))
                d *= 2
        s.head = nn.Linear(d, 1000)
    def forward(s, img, labels):
        x = s.patch(img).permute(0, 2, 3, 1)
        for i, stage in enumerate(s.stages):
            for block in stage:
                x = block(x)
            if i < 3:
                b, H, W, d = x.shape
                x = x.view(b, H // 2, 2, W // 2, 2, d).permute(0, 1, 3, 4, 2, 5).reshape(b, H // 2, W // 2, 4 * d)
                x = s.merges[i](x)
        return F.cross_entropy(s.head(x.mean((1, 2))), labels)

def model():
    return Swin(), [(("batch", 3, 224, 224), torch.float32), (("batch",), torch.long)]
''',
    "conformer": '''
import torch, torch.nn as nn, torch.nn.functional as F

class Conv(nn.Module):
    def __init__(s, d, k=31):
        super().__init__()
        s.ln, s.pw1 = nn.LayerNorm(d), nn.Conv1d(d, 2 * d, 1)
        s.dw, s.bn, s.pw2 = nn.Conv1d(d, d, k, padding=k // 2, groups=d), nn.BatchNorm1d(d), nn.Conv1d(d, d, 1)
    def forward(s, x):
        y = F.glu(s.pw1(s.ln(x).transpose(1, 2)), dim=1)
        return x + s.pw2(F.silu(s.bn(s.dw(y)))).transpose(1, 2)

class Block(nn.Module):
    def __init__(s, d=256, h=4):
        super().__init__()
        ff = lambda: nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.SiLU(), nn.Linear(4 * d, d))
        s.ff1, s.ff2, s.ln, s.out = ff(), ff(), nn.LayerNorm(d), nn.LayerNorm(d)
        s.mha, s.conv = nn.MultiheadAttention(d, h, batch_first=True), Conv(d)
    def forward(s, x):
        x = x + 0.5 * s.ff1(x)
        y = s.ln(x)
        x = s.conv(x + s.mha(y, y, y, need_weights=False)[0])
        return s.out(x + 0.5 * s.ff2(x))

class Conformer(nn.Module):
    """A Conformer encoder (Gulati et al. 2020) on 80 log-mel features, CTC-style output over 128 symbols."""
    seq_len = 400
    def __init__(s, d=256, n=8):
        super().__init__()
        s.sub = nn.Sequential(nn.Conv2d(1, d, 3, 2), nn.ReLU(), nn.Conv2d(d, d, 3, 2), nn.ReLU())
        s.proj, s.blocks, s.head = nn.Linear(d * 19, d), nn.ModuleList(Block(d) for _ in range(n)), nn.Linear(d, 128)
    def forward(s, feats):
        x = s.sub(feats.unsqueeze(1))
        b, c, t, f = x.shape
        x = s.proj(x.permute(0, 2, 1, 3).reshape(b, t, c * f))
        for block in s.blocks:
            x = block(x)
        return s.head(x).log_softmax(-1).mean()

def model():
    return Conformer(), [(("batch", "seq", 80), torch.float32)]
''',
}


def _factory(path: Path) -> object:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.model


def export(path: Path, batch: int, seq: int) -> Path:
    """The model of ``path`` exported to ONNX on the CPU (eval mode, real small weights) at one fixed batch."""
    import torch

    net, inputs = _factory(path)()  # type: ignore[operator]
    net.eval()
    args = tuple(
        torch.zeros([batch if d == "batch" else seq if d == "seq" else d for d in shape], dtype=dtype)
        for shape, dtype in inputs
    )
    out = path.with_suffix(".onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, args, str(out), dynamo=True, external_data=False, verbose=False)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="h100-sxm")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64, help="frames of the Conformer's input")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    args = parser.parse_args()

    from echosim.compiler import compile as simulate
    from echosim.plan import Cluster, Plan

    plan = Plan(micro_batch=args.batch, seq_len=args.seq)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            path = Path(tmp) / f"{name}.py"
            path.write_text(MODELS[name])
            onnx_path = export(path, args.batch, args.seq)
            for route, source in (("torch", f"{path}:model"), ("onnx", str(onnx_path))):
                report = simulate(source, plan, Cluster(args.backend, devices=1))
                row = {"model": name, "route": route, "step_ms": round(report.step_time_s * 1e3, 3),
                       "params": report.params, "model_flops": report.model_flops_per_step}  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
    for name in args.models:
        torch_row, onnx_row = (r for r in rows if r["model"] == name)
        gap = onnx_row["step_ms"] / torch_row["step_ms"] - 1
        print(f"{name}: onnx step {onnx_row['step_ms']} ms vs torch {torch_row['step_ms']} ms ({gap:+.1%})")


if __name__ == "__main__":
    sys.exit(main())
