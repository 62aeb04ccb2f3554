"""Where a real CPU training step spends its time, category by category, against echosim's op costs.

Usage::

    python benchmarks/cpu_breakdown.py [--model llama-4L-256] [--calibration REF] [--out FILE.json]

Trains one of ``benchmarks/cpu_reality.py``'s models in this process (one intra-op thread,
fp32, fused AdamW, the same step; ``--unfused``: PyTorch's CPU default loop), profiles three
steps with ``torch.profiler`` (self CPU time of every op) and sums it by category; then
costs the same step's graph on the calibrated ``cpu-x86`` backend (one rank, no schedule:
the sum of the ops' costs) and sums it by the same categories. Without ``--calibration``
it calibrates this machine first (one rank).

Categories: matmuls (``aten::mm``/``bmm``/``addmm``), attention (the SDPA kernels),
cross entropy (``log_softmax``/``nll_loss`` and their backward, with the zero-filled
gradient), the optimizer (every op under ``Optimizer.step``), other kernels (element-wise,
norms, embedding, copies), and framework time (autograd nodes, views, dispatch of ops
that move no data), which echosim counts only as the per-op overhead of the ops it costs.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import cpu_reality as cr  # noqa: E402

CATEGORIES = ("matmul", "attention", "cross entropy", "optimizer", "other kernels", "framework")
FRAMEWORK = ("aten::view", "aten::t", "aten::transpose", "aten::as_strided", "aten::_unsafe_view", "aten::slice",
             "aten::narrow", "aten::expand", "aten::reshape", "aten::permute", "aten::unsqueeze", "aten::squeeze",
             "aten::empty", "aten::empty_strided", "aten::to", "aten::detach", "aten::alias", "aten::matmul",
             "aten::linear", "aten::select", "aten::contiguous", "aten::split", "aten::chunk", "aten::result_type",
             "aten::_reshape_alias", "aten::resolve_conj", "aten::resolve_neg", "aten::lift_fresh", "aten::empty_like",
             "aten::zeros_like", "aten::ones_like", "aten::numpy_T", "aten::_has_compatible_shallow_copy_type",
             "aten::item", "aten::_local_scalar_dense", "aten::scaled_dot_product_attention", "aten::rms_norm",
             "aten::cross_entropy_loss", "aten::unflatten", "aten::flatten")  # fmt: skip


def real_category(name: str, under_optimizer: bool) -> str:
    if under_optimizer:
        return "optimizer"
    if name in ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm"):
        return "matmul"
    if "scaled_dot_product" in name:
        return "attention"
    if "log_softmax" in name or "nll_loss" in name:
        return "cross entropy"
    if not name.startswith("aten::") or name in FRAMEWORK:
        return "framework"
    return "other kernels"


def measure(model_name: str, steps: int = 3, fused: bool = True) -> dict[str, Any]:
    """Median step seconds (5 steps) and profiled self CPU seconds a step by category (``steps`` steps)."""
    from torch.profiler import ProfilerActivity, profile

    step = cr.one_thread_step(model_name, fused)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    by: dict[str, float] = dict.fromkeys(CATEGORIES, 0.0)
    ops: dict[str, float] = {}
    for e in prof.events():
        parent, under = e.cpu_parent, e.name.startswith("Optimizer.")
        while parent is not None and not under:
            under, parent = parent.name.startswith("Optimizer."), parent.cpu_parent
        cat = real_category(e.name, under)
        by[cat] += e.self_cpu_time_total / 1e6 / steps
        ops[e.name] = ops.get(e.name, 0.0) + e.self_cpu_time_total / 1e6 / steps
    # the zero-filled logits gradient of nll_loss's backward runs as aten::fill_ under its autograd node
    top = sorted(ops.items(), key=lambda kv: -kv[1])[:20]
    return {"step_s": sorted(times)[2], "categories_s": by, "top_ops_s": dict(top)}


def pred_category(node: Any) -> str:
    from echosim.ir.ops import OpKind

    if node.op is OpKind.MATMUL:
        return "matmul"
    if node.op is OpKind.ATTENTION:
        return "attention"
    if node.op is OpKind.CROSS_ENTROPY:
        return "cross entropy"
    if node.op is OpKind.OPTIMIZER_UPDATE:
        return "optimizer"
    return "other kernels"


def predict(model_name: str, calibration: str) -> dict[str, Any]:
    from echosim.compiler import prepare
    from echosim.ir.ops import OpKind
    from echosim.passes.flops import io_bytes
    from echosim.plan import Cluster

    cfg = cr.MODELS[model_name]
    plan, devices = cr.plan_for(cfg, "1 process")
    step = prepare(cfg.with_(dropout=0.0), plan, Cluster("cpu-x86", devices, 2, calibration=calibration))
    by: dict[str, float] = dict.fromkeys(CATEGORIES, 0.0)
    for stage in step.stages:
        g = stage.graph
        for node in g:
            if node.op in (OpKind.VIEW, OpKind.INPUT, OpKind.PARAMETER) or node.op.is_collective:
                continue
            by[pred_category(node)] += step.backend.op_time_s(node, io_bytes(g, node)) * g.multiplicity(node)
    return {"categories_s": by}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-4L-256", choices=sorted(cr.MODELS))
    parser.add_argument("--calibration", help="Calibration for one rank (NAME, PATH or PATH#NAME); default: now.")
    parser.add_argument("--out", type=Path, help="Write the comparison as JSON.")
    parser.add_argument("--unfused", action="store_true", help="AdamW as PyTorch's CPU default (8 kernels a tensor).")
    args = parser.parse_args()
    calibration = args.calibration
    if not calibration:
        from echosim.calibrate.run import run_calibration

        db = Path(tempfile.mkdtemp()) / "calibration.sqlite"
        run_calibration(backend="cpu-x86", name="one-rank", db=db, sweep="standard", ranks=1, threads=1)
        calibration = f"{db}#one-rank"
    real = measure(args.model, fused=not args.unfused)
    pred = predict(args.model, calibration)
    print(f"{args.model}, 1 process: real step {real['step_s']:.4f} s (profiled ops sum below)")
    print(f"{'category':<15} {'real ms':>9} {'echosim ms':>11} {'error':>7}")
    for cat in CATEGORIES:
        r, p = real["categories_s"][cat], pred["categories_s"][cat]
        err = f"{p / r - 1:+.0%}" if r > 0 else ""
        print(f"{cat:<15} {r * 1e3:9.2f} {p * 1e3:11.2f} {err:>7}")
    r, p = sum(real["categories_s"].values()), sum(pred["categories_s"].values())
    print(f"{'total':<15} {r * 1e3:9.2f} {p * 1e3:11.2f} {p / r - 1:+7.0%}")
    if args.out:
        from echosim.calibrate.fit import machine_identity

        doc = {
            "model": args.model,
            "adamw_fused": not args.unfused,
            "machine": machine_identity(),
            "real": real,
            "echosim": pred,
        }
        args.out.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
