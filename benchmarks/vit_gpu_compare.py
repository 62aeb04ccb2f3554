"""echosim's ViT step on one H200, per kernel family, against the measured profile of ``vit_gpu_check.py``.

Reads ``benchmarks/data/vit_gpu_check_h200.json`` (the zoo's ``vit_module`` trained eagerly under bf16
``torch.autocast`` with fp32 parameters and fused AdamW), compiles each of its shapes with echosim under the
``eager`` framework (the whole model in bf16) and ``eager-amp`` (autocast over fp32 parameters,
:mod:`echosim.passes.autocast`), and prints the milliseconds per kernel family both ways. The measured side
counts the profile's top 25 kernels only (what the file keeps), so its families sum below the step.

    PYTHONPATH=. .venv/bin/python benchmarks/vit_gpu_compare.py [--json]

The measured families are read from kernel names: cuDNN's SDPA kernels and its dot(dO, O) / dQ-convert helpers
are attention, the patch convolution's cuDNN kernels (implicit GEMM, NCHW -> NHWC transform) are conv, the
same-dtype ``direct_copy`` kernels (``gpu_kernel_impl_nocast``) are layout copies (``.contiguous()`` / reshape
of permuted gradients), the other copy kernels are autocast's dtype casts. (``vit_gpu_check.py``'s own
``family`` counts the SDPA kernels, whose names contain ``wgmma``, and the conv's CUTLASS kernel as GEMM.)
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from functools import partial
from pathlib import Path
from typing import Any

from echosim.backends.devices import DEVICES
from echosim.backends.gpu import GPUBackend
from echosim.compiler import lower
from echosim.plan import Cluster, Plan
from echosim.plugins import hookimpl
from echosim.plugins.manager import load_registry
from echosim.timeline.trace import chrome_trace

DATA = Path(__file__).resolve().parent / "data" / "vit_gpu_check_h200.json"
FAMILIES = ("gemm", "attention", "conv", "cast", "layout copy", "norm", "norm.grad", "norm.pgrad", "add", "cat",
            "bias.grad", "dropout", "gelu", "optimizer", "other")  # fmt: skip


class _Nchw:
    """The H200 backend with NCHW activations at the convolution (``conv_layout="nchw"``): the script feeds
    ``torch.randn(batch, 3, 224, 224)`` in PyTorch's default memory format, as ``nonllm_accuracy.py``'s rows
    say with their ``conv_layout`` column."""

    @hookimpl
    def register_backends(self, register: Any) -> None:
        register("h200-nchw", partial(GPUBackend, DEVICES["h200"], conv_layout="nchw"))


REGISTRY = load_registry(extra_plugins=[_Nchw()])


def vit_b16_pretrain_fused() -> Any:
    """The module vit_gpu_check.py timed: ViT-B/16's pre-training form with one fused q/k/v linear (the zoo's
    ``vit-b16-pretrain`` now builds flax's separate projections, as the Rosetta rows ran)."""
    import torch

    from echosim.frontend.zoo_torch import vit_module

    return vit_module(dropout=0.1, representation=768), [(("batch", 3, 224, 224), torch.float32)]


def vit_l16() -> Any:
    """ViT-L/16 as ``vit_gpu_check.py`` builds it (a ``path.py:factory`` source for echosim)."""
    import torch

    from echosim.frontend.zoo_torch import vit_module

    return vit_module(layers=24, hidden=1024, heads=16, ffn=4096), [(("batch", 3, 224, 224), torch.float32)]


def measured_family(kernel: str) -> str:
    """Family of a CUDA kernel name in the stored profile."""
    k = kernel.lower()
    rules = (
        ("attention", ("sdpa", "dot_do_o", "convert_dq")), ("conv", ("cudnn", "nchwtonhwc")),
        ("gemm", ("nvjet", "gemm", "cutlass")), ("norm.pgrad", ("gammabeta",)), ("norm.grad", ("layer_norm_grad",)),
        ("norm", ("layer_norm",)), ("layout copy", ("nocast<at::native::direct_copy",)), ("cast", ("copy_kernel",)),
        ("add", ("functor_add",)), ("cat", ("catarray",)),
        ("bias.grad", ("reduce_kernel",)), ("dropout", ("dropout", "masked_scale")), ("gelu", ("gelu",)),
        ("optimizer", ("multi_tensor",)),
    )  # fmt: skip
    return next((fam for fam, keys in rules if any(s in k for s in keys)), "other")


def echosim_family(name: str, args: dict[str, Any]) -> str:
    """Family of an echosim trace event (its op name and attributes)."""
    op, scope = args.get("op", ""), args.get("scope", "")
    if op == "matmul":
        return "conv" if scope == "patch" else "gemm"
    if op == "attention":
        return "attention"
    if op == "optimizer_update" or name.startswith("optimizer"):
        return "optimizer"
    rules = (
        ("layout copy", ("grad_copy",)), ("cast", (".to_bf16", ".to_fp32", "grad_cast")), ("norm.pgrad", ("pgrad",)),
        ("bias.grad", ("bgrad",)),
        ("add", ("grad_acc",)), ("cat", ("grad_cat",)), ("dropout", ("dropout",)), ("gelu", ("gelu",)),
        ("add", ("add",)),
    )  # fmt: skip
    for fam, keys in rules:
        if any(s in name for s in keys):
            return fam
    if op == "norm":
        return "norm.grad" if name.endswith(".grad") else "norm"
    return "other"


def predict(row: dict[str, Any], framework: str) -> tuple[float, dict[str, float]]:
    """echosim's step (ms) and its milliseconds per family for the row's shape under ``framework``."""
    here = Path(__file__).resolve()
    model = {"vit-l16": f"{here}:vit_l16", "vit-b16-pretrain": f"{here}:vit_b16_pretrain_fused"}.get(
        row["model"], row["model"]
    )
    b = row["batch"]
    plan = Plan(micro_batch=b, global_batch=b, dtype="bf16", framework=framework, attention="flash")
    compiled = lower(model, plan, Cluster(backend="h200-nchw", devices=1), REGISTRY)
    fams: dict[str, float] = defaultdict(float)
    for e in chrome_trace(compiled.costed, max_op_events=10**9)["traceEvents"]:
        if e.get("ph") == "X" and ("op" in e.get("args", {}) or e["name"].startswith("optimizer")):
            fams[echosim_family(e["name"], e["args"])] += e["dur"] / 1e3
    return compiled.report.step_time_s * 1e3, dict(fams)


def main() -> None:
    data = json.loads(DATA.read_text())
    out = []
    for row in data["rows"]:
        measured: dict[str, float] = defaultdict(float)
        for kernel, ms in row["top_kernels_ms"].items():
            measured[measured_family(kernel)] += ms
        eager, fam_eager = predict(row, "eager")
        amp, fam_amp = predict(row, "eager-amp")
        print(f"\n{row['model']} {row['kwargs']} batch {row['batch']}: measured {row['step_ms']:.1f} ms, "
              f"echosim eager {eager:.1f} ms ({eager / row['step_ms'] - 1:+.1%}), "
              f"eager-amp {amp:.1f} ms ({amp / row['step_ms'] - 1:+.1%})")  # fmt: skip
        print(f"  {'family':11} {'measured':>9} {'eager':>7} {'amp':>7}   (measured: top-25 kernels)")
        for fam in FAMILIES:
            print(f"  {fam:11} {measured.get(fam, 0):9.2f} {fam_eager.get(fam, 0):7.2f} {fam_amp.get(fam, 0):7.2f}")
        out.append({"model": row["model"], "kwargs": row["kwargs"], "batch": row["batch"],
                    "measured_ms": row["step_ms"], "eager_ms": round(eager, 2), "amp_ms": round(amp, 2),
                    "measured_top25_by_family": {k: round(v, 3) for k, v in measured.items()},
                    "eager_by_family": {k: round(v, 3) for k, v in fam_eager.items()},
                    "amp_by_family": {k: round(v, 3) for k, v in fam_amp.items()}})  # fmt: skip
    if "--json" in sys.argv:
        print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
