"""What PyTorch runs in the one-process steps of cpu_reality_nonllm.py's DLRM and LSTM, against echosim's costs.

Usage::

    python benchmarks/cpu_nonllm_ops.py [--steps 20] [--repeats 2] [--calibration REF]
                                        [--out benchmarks/data/cpu_nonllm_ops.json]

Each measurement runs in a fresh process with one intra-op thread, the models, batches and training step of
``cpu_reality_nonllm.py`` (zero_grad(set_to_none=True), forward, loss, backward, fused AdamW):

* ``lstm-small`` under ``ONEDNN_VERBOSE=profile_exec``: every oneDNN primitive a step executes, with its time.
  PyTorch runs each LSTM layer as one oneDNN RNN primitive forward and one backward
  (aten/src/ATen/native/mkldnn/RNN.cpp) and reorders the plain weights around them: the weight reorders before
  a forward primitive, before a backward one, and the gradient reorders after it, summed per step.
* ``dlrm-small``: the process's minor page faults while each table's gradient is made (a hook on the table's
  weight gradient reads getrusage after each one), and per step: CPU time and faults, and their least-squares
  line (the cost of a fault; the step without any).
* ``dlrm-small`` again with glibc's heap held (mallopt(3) tunables ``MALLOC_MMAP_THRESHOLD_`` at 32 MiB and
  ``MALLOC_TRIM_THRESHOLD_`` above any heap): the gradients reuse their memory, the step faults no page.

Beside them, echosim's predictions with the calibration ``--calibration`` (else a quick one-rank calibration
made first): the step, its breakdown, the table gradients' fresh-page fills, the LSTM's weight reorders, and
the DLRM step priced as though no page were fresh (the mmap threshold above every tensor).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

#: glibc's tunables for a heap that keeps its memory: no tensor mapped for itself (the largest threshold
#: mallopt accepts, HEAP_MAX_SIZE / 2 = 32 MiB on 64-bit) and no trim of the heap's top.
HELD_HEAP_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**20), "MALLOC_TRIM_THRESHOLD_": str(2**40)}
MARK = "=====cpu_nonllm_ops: measured steps"
_VERBOSE = re.compile(r"^onednn_verbose,.*,exec,cpu,(?P<kind>\w+),(?P<impl>[^,]*),(?P<prop>[^,]*),.*,(?P<ms>[\d.]+)$")


def _setup(name: str) -> tuple[Any, Any, Any, Any]:
    """The model, its optimizer, its training step, and the step cut in its phases (zero_grad, forward with the
    loss, backward, optimizer step), each a callable taking what the one before returned."""
    import cpu_reality_nonllm as nonllm
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nonllm.MODELS[name][0].build()
    inputs, labels = nonllm._batch(name, 0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def forward(_: Any) -> Any:
        out = model(*inputs)
        if name.startswith("dlrm"):
            return F.binary_cross_entropy_with_logits(out, labels)
        return F.cross_entropy(out.flatten(0, 1), labels.flatten())

    phases = {
        "zero_grad": lambda _: opt.zero_grad(set_to_none=True),
        "forward": forward,
        "backward": lambda loss: loss.backward(),
        "optimizer": lambda _: opt.step(),
    }
    return model, opt, nonllm.train_step(name, model, opt, inputs, labels), phases


def _faults() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def worker(name: str, steps: int) -> dict[str, Any]:
    """``steps`` steps of ``name`` after 3 warm-up steps (CPU time and faults per step; DLRM: faults per table
    gradient), then ``steps`` more timed phase by phase: 2 x ``steps`` after the mark."""
    import time

    model, _, step, phases = _setup(name)
    tables: list[list[int]] = []
    pages = (
        [-(-t.weight.numel() * t.weight.element_size() // 4096) for t in model.tables]
        if name.startswith("dlrm")
        else []
    )
    marks: list[int] = []
    if name.startswith("dlrm"):
        for table in model.tables:
            table.weight.register_hook(lambda g: marks.append(_faults()))
    for _ in range(3):
        step()
    print(MARK, flush=True)
    cpu, faults = [], []
    for _ in range(steps):
        marks.clear()
        f0, t0 = _faults(), time.process_time()
        step()
        cpu.append(time.process_time() - t0)
        faults.append(_faults() - f0)
        # a table's gradient faults between the hook before it (the step's start for the first) and its own
        tables.append([b - a for a, b in zip([f0, *marks], marks, strict=False)])
    timed: dict[str, list[float]] = {k: [] for k in phases}
    for _ in range(steps):  # the same steps again, CPU time by phase
        value = None
        for key, phase in phases.items():
            t0 = time.process_time()
            value = phase(value)
            timed[key].append(time.process_time() - t0)
    return {"cpu_steps_s": cpu, "faults": faults, "table_faults": tables, "table_pages": pages,
            "phases_s": {k: statistics.median(v) for k, v in timed.items()}}  # fmt: skip


def run_worker(name: str, steps: int, env: dict[str, str]) -> tuple[dict[str, Any], str]:
    out = subprocess.run(
        [sys.executable, __file__, "--worker", name, "--steps", str(steps)],
        env={**os.environ, **env}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    lines = out.stdout.splitlines()
    return json.loads(lines[-1]), "\n".join(lines[lines.index(MARK) + 1 : -1]) + "\n" + out.stderr


def onednn_per_step(log: str, steps: int) -> dict[str, float]:
    """Seconds per step of oneDNN's RNN primitives and of the reorders around them (see the module docstring)."""
    sums = {"rnn_forward_s": 0.0, "rnn_backward_s": 0.0, "reorders_before_forward_s": 0.0,
            "reorders_before_backward_s": 0.0, "gradient_reorders_after_backward_s": 0.0, "other_s": 0.0}  # fmt: skip
    pending: list[float] = []
    owed = 0  # reorders after a backward primitive that bring its weight gradients back: as many as went in
    for line in log.splitlines():
        m = _VERBOSE.match(line.strip())
        if not m:
            continue
        seconds = float(m["ms"]) * 1e-3
        if m["kind"] == "rnn":
            backward = m["prop"] == "backward"
            sums["rnn_backward_s" if backward else "rnn_forward_s"] += seconds
            sums["reorders_before_backward_s" if backward else "reorders_before_forward_s"] += sum(pending)
            owed, pending = (len(pending) if backward else 0), []
        elif m["kind"] == "reorder" and "direct_copy" not in m["impl"]:
            if owed:
                sums["gradient_reorders_after_backward_s"] += seconds
                owed -= 1
            else:
                pending.append(seconds)
        else:
            sums["other_s"] += seconds
    sums["other_s"] += sum(pending)
    return {k: v / steps for k, v in sums.items()}


def _line(xs: list[float], ys: list[float]) -> dict[str, float]:
    fit = statistics.linear_regression(xs, ys)
    return {"per_fault_s": fit.slope, "no_faults_s": fit.intercept, "r": statistics.correlation(xs, ys)}


def predictions(name: str, calibration: str) -> dict[str, Any]:
    """echosim's step for ``name`` (one process), and the parts this script measures."""
    import cpu_reality_nonllm as nonllm

    import echosim.backends.cpu as cpu
    from echosim.backends.base import for_program
    from echosim.compiler import lower, prepare
    from echosim.ir.ops import EmbeddingAttrs, Phase
    from echosim.passes.flops import io_bytes
    from echosim.plan import Cluster, Plan

    model, batch, seq = nonllm.MODELS[name]
    plan = Plan(dp=1, micro_batch=batch, global_batch=batch, seq_len=seq, dtype="fp32")
    cluster = Cluster("cpu-x86", 1, 2, calibration=calibration)
    report = lower(model, plan, cluster).report
    out: dict[str, Any] = {"step_s": report.step_time_s, "breakdown": report.breakdown}
    prepared = prepare(model, plan, cluster)
    graph = prepared.stages[0].graph
    backend = for_program(prepared.backend, graph)
    phases = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
    for n in graph:
        if not n.op.is_collective:
            key = {Phase.FORWARD: "forward", Phase.BACKWARD: "backward", Phase.OPTIMIZER: "optimizer"}[n.phase]
            phases[key] += backend.op_time_s(n, io_bytes(graph, n))
    out["phases_s"] = phases
    inner = backend
    while hasattr(inner, "inner"):  # the guarded and calibrated wrappers
        inner = inner.inner
    spec = inner.cpu
    if name.startswith("dlrm"):
        grads = [n for n in graph if isinstance(n.attrs, EmbeddingAttrs) and n.phase is Phase.BACKWARD]
        out["table_gradient_pages"] = sum(-(-n.out.nbytes // cpu.PAGE_BYTES) for n in grads)
        out["fresh_page_s"] = cpu.PAGE_BYTES / (spec.fresh_memory_GBps * 1e9)
        out["table_backward_s"] = sum(backend.op_time_s(n, io_bytes(graph, n)) for n in grads)
        held = cpu.step_mmap_threshold_bytes
        cpu.step_mmap_threshold_bytes = lambda g: 2**62  # every tensor heap-fed: no fresh page
        try:
            out["no_fresh_pages_step_s"] = lower(model, plan, cluster).report.step_time_s
        finally:
            cpu.step_mmap_threshold_bytes = held
    else:
        reorders = [b for n in graph for b in cpu.rnn_weight_reorder_bytes(n)]
        out["weight_reorders"] = len(reorders)
        out["weight_reorders_s"] = sum(cpu.reorder_time_s(spec, b) for b in reorders)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2, help="Fresh processes per measurement.")
    parser.add_argument("--calibration", help="A one-rank calibration reference (DB#NAME); else one made now.")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.steps)))
        return
    calibration = args.calibration
    if not calibration:
        from cpu_reality import calibrate

        calibration = calibrate(Path(tempfile.mkdtemp()) / "calibration.sqlite", "quick", keys=(1,))[1]
    result: dict[str, Any] = {"calibration": calibration, "steps": args.steps, "load": [], "lstm": [], "dlrm": [],
                              "dlrm_held_heap": []}  # fmt: skip
    for _ in range(args.repeats):
        result["load"].append(os.getloadavg()[0])
        run, log = run_worker("lstm-small", args.steps, {"ONEDNN_VERBOSE": "profile_exec"})
        result["lstm"].append(
            {"cpu_step_s": statistics.median(run["cpu_steps_s"]), "phases_s": run["phases_s"],
             **onednn_per_step(log, 2 * args.steps)}
        )  # fmt: skip
        run, _ = run_worker("dlrm-small", args.steps, {})
        tables = run["table_faults"]
        result["dlrm"].append({
            "cpu_step_s": statistics.median(run["cpu_steps_s"]), "faults": run["faults"], "phases_s": run["phases_s"],
            "cpu_steps_s": run["cpu_steps_s"], "table_faults": tables,
            # a table whose gradient took fresh pages: at least half its pages faulted while it was made
            "tables_faulting": [sum(2 * f >= p for f, p in zip(s, run["table_pages"], strict=True)) for s in tables],
            "fit": _line([float(f) for f in run["faults"]], run["cpu_steps_s"]),
        })  # fmt: skip
        run, _ = run_worker("dlrm-small", args.steps, HELD_HEAP_ENV)
        result["dlrm_held_heap"].append(
            {
                "cpu_step_s": statistics.median(run["cpu_steps_s"]),
                "faults_median": statistics.median(run["faults"]),
                "phases_s": run["phases_s"],
            }
        )
    result["predicted"] = {name: predictions(name, calibration) for name in ("lstm-small", "dlrm-small")}
    text = json.dumps(result, indent=1, sort_keys=True)
    if args.out:
        args.out.write_text(text)
    pred = result["predicted"]
    for name, runs in (
        ("lstm", result["lstm"]),
        ("dlrm", result["dlrm"]),
        ("dlrm held heap", result["dlrm_held_heap"]),
    ):
        for run in runs:
            print(f"{name} phases (ms): " + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in run["phases_s"].items()))
    for name in ("lstm-small", "dlrm-small"):
        print(
            f"{name} predicted phases (ms): "
            + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in result["predicted"][name]["phases_s"].items())
        )
    for i, (lstm, dlrm, held) in enumerate(zip(result["lstm"], result["dlrm"], result["dlrm_held_heap"], strict=True)):
        reorders = sum(v for k, v in lstm.items() if "reorders" in k)
        print(f"run {i} (load {result['load'][i]:.2f}): lstm step {lstm['cpu_step_s'] * 1e3:.1f} ms, oneDNN RNN "
              f"forward {lstm['rnn_forward_s'] * 1e3:.2f} backward {lstm['rnn_backward_s'] * 1e3:.2f} ms, weight "
              f"reorders {reorders * 1e3:.2f} ms a step")  # fmt: skip
        print(f"      dlrm step {dlrm['cpu_step_s'] * 1e3:.1f} ms, faults median {statistics.median(dlrm['faults'])}, "
              f"tables faulting median {statistics.median(dlrm['tables_faulting'])} of 8, "
              f"{dlrm['fit']['per_fault_s'] * 1e6:.2f} us a fault, {dlrm['fit']['no_faults_s'] * 1e3:.1f} ms without "
              f"(r {dlrm['fit']['r']:.2f}); held heap {held['cpu_step_s'] * 1e3:.1f} ms, "
              f"{held['faults_median']} faults")  # fmt: skip
    lp, dp = pred["lstm-small"], pred["dlrm-small"]
    print(f"predicted: lstm step {lp['step_s'] * 1e3:.1f} ms ({lp['weight_reorders']} weight reorders "
          f"{lp['weight_reorders_s'] * 1e3:.2f} ms); dlrm step {dp['step_s'] * 1e3:.1f} ms, "
          f"{dp['table_gradient_pages']} fresh pages a step at {dp['fresh_page_s'] * 1e6:.2f} us, "
          f"{dp['no_fresh_pages_step_s'] * 1e3:.1f} ms without")  # fmt: skip


if __name__ == "__main__":
    main()
