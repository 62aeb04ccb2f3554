"""Really train small GPT, Llama and MoE models on this CPU and compare the measured memory with echosim's.

Usage::

    python benchmarks/memory_cpu.py [--out FILE.json]

Each model (the zoo's own modules, fp32, AdamW) runs one warm-up step, so that Adam's states
exist, then one tracked step (forward, backward, ``AdamW.step``) under PyTorch's ``MemTracker``
(``torch.distributed._tools.mem_tracker``) on real CPU tensors: it attributes every live tensor
to parameters, gradients, optimizer state, activations or temporaries and records the peak.
echosim compiles the same model with the same micro-batch on one device (framework ``eager``:
plain autograd) and the figures are printed side by side, part by part. The GPT model keeps
dropout, so its attention runs PyTorch's math path on CPU (``--attention math``); Llama and
MoE use the fused kernel (``scaled_dot_product_attention`` without dropout).

The zoo's MoE expert GEMM is an fx leaf whose reference body gathers one weight copy per row
(for numerics, not memory); here it runs as a loop over experts, one GEMM per expert's rows,
which allocates what a grouped GEMM allocates: the rows' outputs.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

ROWS_PER_MODEL = ("params", "grads", "optimizer", "peak")


def _models() -> dict[str, Any]:
    from echosim.frontend.zoo import ArchConfig

    return {
        "gpt": ArchConfig(
            "gpt", layers=4, hidden=256, heads=4, vocab=4096, seq_len=512, dropout=0.1, tied_embeddings=True
        ),
        "llama": ArchConfig("llama", layers=4, hidden=256, heads=4, kv_heads=2, vocab=4096, ffn=704, seq_len=512),
        "moe": ArchConfig(
            "moe",
            layers=4,
            hidden=256,
            heads=4,
            kv_heads=2,
            vocab=4096,
            ffn=704,
            seq_len=512,
            experts=4,
            top_k=2,
            moe_ffn=352,
        ),
    }


def _loop_grouped_mm(rows: Any, weight: Any, expert_ids: Any) -> Any:
    """One GEMM per expert over its rows (rows arrive grouped by expert)."""
    import torch

    counts = torch.bincount(expert_ids.flatten(), minlength=weight.shape[0]).tolist()
    outs = [chunk @ weight[e] for e, chunk in enumerate(torch.split(rows, counts)) if counts[e]]
    return torch.cat(outs)


def measure(cfg: Any, batch: int) -> dict[str, float]:
    """MemTracker's peak snapshot (bytes per category) of one real training step on CPU."""
    import torch

    from echosim.frontend import zoo_modules

    torch.manual_seed(0)
    saved = zoo_modules.grouped_mm
    zoo_modules.grouped_mm = _loop_grouped_mm
    try:
        model = {"gpt": zoo_modules.GPT, "llama": zoo_modules.Llama, "moe": zoo_modules.Llama}[cfg.arch](cfg)
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, 0.02)
        return peak_of_one_step(model, cfg, batch)
    finally:
        zoo_modules.grouped_mm = saved


def peak_of_one_step(model: Any, cfg: Any, batch: int) -> dict[str, float]:
    """MemTracker's peak snapshot (bytes per category) of one AdamW step, after a warm-up step has
    created Adam's states; real or fake tensors alike (tests/test_memory_tracker.py uses FakeTensorMode)."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, cfg.vocab, (batch, cfg.seq_len))
    model(ids, ids).backward()
    opt.step()
    opt.zero_grad(set_to_none=False)
    tracker = MemTracker()
    tracker.track_external(model, opt)
    with tracker:
        model(ids, ids).backward()
        opt.step()
    snap = tracker.get_tracker_snapshot("peak")
    (device,) = snap
    return {str(k).rsplit(".", 1)[-1]: float(v) for k, v in snap[device].items()}


def predict(cfg: Any, batch: int) -> dict[str, Any]:
    from echosim.compiler import lower
    from echosim.plan import Cluster, Plan

    plan = Plan(micro_batch=batch, dtype="fp32", attention="math" if cfg.dropout else "flash")
    return lower(cfg, plan, Cluster("cpu-x86", 1)).report.memory[0]


def compare(arch: str, batch: int = 2) -> dict[str, Any]:
    """Measured and predicted bytes, part by part, for one zoo model."""
    cfg = _models()[arch]
    theirs, ours = measure(cfg, batch), predict(cfg, batch)
    measured = {"params": theirs["PARAM"], "grads": theirs["GRAD"], "optimizer": theirs["OPT"], "peak": theirs["Total"]}
    return {
        "arch": arch,
        "batch": batch,
        "measured": measured,
        "measured_activations_and_temporaries": theirs.get("ACT", 0.0) + theirs.get("TEMP", 0.0),
        "predicted": {k: float(ours[k]) for k in ROWS_PER_MODEL},
        "predicted_parts": {k: float(v) for k, v in ours.items() if k not in ("stage", "layers", "fits", "capacity")},
        "error": {k: float(ours[k]) / measured[k] - 1.0 for k in ROWS_PER_MODEL},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="also write the figures as JSON")
    args = parser.parse_args()
    results = [compare(arch) for arch in _models()]
    print(f"{'model':8} {'part':10} {'measured MiB':>13} {'echosim MiB':>12} {'error':>8}")
    for r in results:
        for part in ROWS_PER_MODEL:
            m, p = r["measured"][part], r["predicted"][part]
            print(f"{r['arch']:8} {part:10} {m / 2**20:13.1f} {p / 2**20:12.1f} {r['error'][part]:+8.1%}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2, sort_keys=True)


if __name__ == "__main__":
    main()
