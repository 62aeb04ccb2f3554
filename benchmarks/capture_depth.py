"""Capture + compile cost of Llama-3 70B from its HF config at 8 and 80 layers.

Each depth runs in a fresh Python process, end to end as ``echosim compile
hf:...`` does it (imports of torch and transformers included), and reports wall
time and peak resident memory. With folding, depth changes only a repeat count;
``--unfolded`` also captures every layer for contrast (slow at 80 layers).

    python benchmarks/capture_depth.py [--unfolded]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "echosim" / "frontend" / "configs" / "llama3-70b.json"

CHILD = """
import json, resource, sys, time
t0 = time.perf_counter()
from echosim.compiler import lower
from echosim.plan import Cluster, Plan
from echosim.frontend import CaptureSpec, hf
path, fold = sys.argv[1], sys.argv[2] == "1"
plan = Plan(tp=8, pp=4, dp=1, seq_len=8192, global_batch=16)
if fold:
    report = lower("hf:" + path, plan, Cluster("h100-sxm", devices=32)).report
    nodes = None
else:
    spec = CaptureSpec(plan.micro_batch, plan.seq_len, plan.dtype)
    cap, _ = hf.capture_config(hf.build_config(hf.config_path("hf:" + path)), spec, path, fold=False)
    report, nodes = None, len(cap.graph)
print(json.dumps({
    "seconds": time.perf_counter() - t0,
    "peak_MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "step_time_s": report.step_time_s if report else None,
    "nodes": nodes,
}))
"""


def measure(layers: int, fold: bool, tmp: Path) -> dict[str, object]:
    config = json.loads(CONFIG.read_text())
    config["num_hidden_layers"] = layers
    path = tmp / f"llama3-70b-{layers}.json"
    path.write_text(json.dumps(config))
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), "1" if fold else "0"], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--unfolded", action="store_true", help="also capture every layer (no folding)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{'layers':>6}  {'folded':>6}  {'seconds':>8}  {'peak MB':>8}  step time")
        for fold in (True, False) if args.unfolded else (True,):
            for layers in (8, 80):
                r = measure(layers, fold, Path(tmp))
                step = f"{r['step_time_s']:.3f} s" if r["step_time_s"] else f"{r['nodes']} IR nodes (capture only)"
                print(f"{layers:>6}  {fold!s:>6}  {r['seconds']:>8.2f}  {r['peak_MB']:>8.0f}  {step}")


if __name__ == "__main__":
    main()
