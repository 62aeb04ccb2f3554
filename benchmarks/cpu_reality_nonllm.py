"""Really train a small DLRM and a small LSTM language model on this CPU and compare with echosim.

Usage::

    python benchmarks/cpu_reality_nonllm.py [--calibration ONE_RANK TWO_RANKS] [--sweep quick] [--steps 10]
                                            [--repeats 5] [--out benchmarks/data/cpu_reality_nonllm.json]

The same method as ``benchmarks/cpu_reality.py`` (whose helpers it imports: the calibration of
this machine for one rank and for two ranks computing at once, the step timing with a barrier,
the load accounting from /proc/stat), for the models of
issue 15 built by :mod:`echosim.frontend.zoo_torch` at a size this machine trains in seconds:

* ``dlrm-small``: 8 tables of 20,000 x 32 (pooling 4 ids each, ``nn.EmbeddingBag`` sum), dense
  arch 13-64-32, two DCN-v2 cross layers of rank 32, over arch 128-64-1; binary cross-entropy;
  dense table gradients and AdamW (what plain PyTorch DDP does, and what echosim models without
  ``--embedding-sharding``).
* ``lstm-small``: a 2-layer LSTM LM, hidden 256, vocabulary 2,000, 20 steps; cross-entropy.

Layouts: one process (one intra-op thread), and DDP x2 over gloo (two processes, one thread
each, each its own micro-batch). fp32. The step is zero_grad + forward + backward (+ DDP's
all-reduce) + AdamW.step, the median of ``--steps`` after 3 warm-up steps (the slower rank's).
AdamW is ``fused=True`` by default: one pass over each tensor, the optimizer echosim's Adam cost
describes. PyTorch's CPU default (``--optimizer foreach-off``) runs eight elementwise kernels per
tensor (lerp, mul, addcmul, sqrt, div, add, addcdiv and the weight decay's mul) with temporaries:
about 2.6x the traffic and a square root per element, which echosim does not model; the DLRM's
step is mostly optimizer (its tables are 97% of its parameters), so it shows there.

Each model and layout runs ``--repeats`` times in fresh processes. The machine is shared, so a
step's wall time counts time the scheduler gave to others: the comparison is on the CPU time of
a step (wall x the share of it the process ran), the noise is the spread of that CPU time over
the runs, and a row is within the noise when the prediction lies inside the runs' range.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from cpu_reality import (  # noqa: E402
    Measured,
    _free_port,
    _time_steps,
    calibrations_for,
    gloo_group,
    run_ranks,
    worker_parser,
)

from echosim.frontend.zoo_torch import TorchZooModel, dlrm_module, lstm_lm_module  # noqa: E402

DLRM_ROWS = (20000,) * 8
DLRM_POOL = (4,) * 8
MODELS: dict[str, tuple[TorchZooModel, int, int]] = {  # model, micro-batch, sequence (0: none)
    "dlrm-small": (
        TorchZooModel(
            "dlrm-small",
            partial(dlrm_module, DLRM_ROWS, DLRM_POOL, 32, 13, (64, 32), (128, 64, 1), 2, 32),
            ((("batch", 13), "float32"), (("batch", sum(DLRM_POOL)), "int64")),
            "8 tables of 20,000 x 32",
            "queries",
        ),
        256,
        0,
    ),
    "lstm-small": (
        TorchZooModel(
            "lstm-small",
            partial(lstm_lm_module, 2, 256, 2000, 20),
            ((("batch", "seq"), "int64"),),
            "2 x LSTM 256",
            "sequences",
        ),
        16,
        20,
    ),
}
LAYOUTS = ("1 process", "DDP x2 (gloo)")


def _batch(name: str, rank: int) -> tuple[Any, ...]:
    import torch

    _, batch, seq = MODELS[name]
    gen = torch.Generator().manual_seed(rank)
    if name.startswith("dlrm"):
        dense = torch.randn(batch, 13, generator=gen)
        sparse = torch.randint(0, min(DLRM_ROWS), (batch, sum(DLRM_POOL)), generator=gen)
        labels = torch.randint(0, 2, (batch, 1), generator=gen).float()
        return (dense, sparse), labels
    ids = torch.randint(0, 2000, (batch, seq), generator=gen)
    return (ids,), ids


def train_step(name: str, model: Any, opt: Any, inputs: tuple[Any, ...], labels: Any) -> Callable[[], None]:
    """A training step of ``name``: zero_grad, forward, its loss (BCE: DLRM, CE: LSTM), backward, step."""
    import torch.nn.functional as F

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        out = model(*inputs)
        if name.startswith("dlrm"):
            loss = F.binary_cross_entropy_with_logits(out, labels)
        else:
            loss = F.cross_entropy(out.flatten(0, 1), labels.flatten())
        loss.backward()
        opt.step()

    return step


def worker(name: str, layout: str, rank: int, world: int, port: int, steps: int, optimizer: str) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model: Any = MODELS[name][0].build()
    inputs, labels = _batch(name, rank)
    reduce_max = gloo_group(rank, world, port)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=optimizer == "fused")

    walls, share = _time_steps(train_step(name, model, opt, inputs, labels), steps, reduce_max)
    if world > 1:
        import torch.distributed as dist

        dist.destroy_process_group()
    return {"steps": walls, "cpu_share": share}


def measure(name: str, layout: str, steps: int, optimizer: str) -> Measured:
    """One layout in fresh processes (one thread each); the slower rank's steps."""
    world = 1 if layout == "1 process" else 2
    args = ["--worker", name, "--layout", layout, "--world", str(world), "--port", str(_free_port()),
            "--steps", str(steps), "--optimizer", optimizer]  # fmt: skip
    return run_ranks(__file__, args, world, f"{name} / {layout}")


def predict(name: str, layout: str, calibration: str) -> dict[str, Any]:
    from echosim.compiler import lower
    from echosim.plan import Cluster, Plan

    model, batch, seq = MODELS[name]
    world = 1 if layout == "1 process" else 2
    plan = Plan(dp=world, micro_batch=batch, global_batch=world * batch, seq_len=seq, dtype="fp32")
    report = lower(model, plan, Cluster("cpu-x86", world, 2, calibration=calibration)).report
    return {"step_time_s": report.step_time_s, "breakdown": report.breakdown}


def main() -> None:
    parser = worker_parser(__doc__)
    parser.add_argument("--calibration", nargs=2, metavar=("ONE_RANK", "TWO_RANKS"))
    parser.add_argument("--sweep", default="quick", help="Calibration sweep when calibrating now.")
    parser.add_argument(
        "--optimizer",
        choices=("fused", "foreach-off"),
        default="fused",
        help="AdamW as the real run steps it: fused (one pass per tensor, what echosim's Adam cost describes) "
        "or PyTorch's CPU default (a loop of eight elementwise kernels per tensor).",
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--repeats", type=int, default=5, help="Runs of each model and layout (fresh processes).")
    args = parser.parse_args()
    if args.worker:
        result = worker(args.worker, args.layout, args.rank, args.world, args.port, args.steps, args.optimizer)
        if args.rank == 0:
            print(json.dumps(result))
        return
    calibrations = calibrations_for(args)
    rows = []
    print(f"{'model':<12}{'layout':<16}{'predicted s':>12}{'cpu s':>8}{'cpu range':>18}{'vs cpu s':>9}"
          f"{'wall s':>8}{'vs wall':>8}{'others':>7}{'load':>6}")  # fmt: skip
    for name in MODELS:
        for layout in LAYOUTS:
            runs = [measure(name, layout, args.steps, args.optimizer) for _ in range(args.repeats)]
            p = predict(name, layout, calibrations[1 if layout == "1 process" else 2])
            # the CPU time of a step (wall x the share of it the process ran): what the step costs where the
            # machine's other work does not take the core away; its spread over the runs is the noise
            cpus = [m.step_s * m.cpu_share for m in runs]
            walls = [m.step_s for m in runs]
            cpu_s, wall_s = statistics.median(cpus), statistics.median(walls)
            cpu_error, error = p["step_time_s"] / cpu_s - 1, p["step_time_s"] / wall_s - 1
            row = {"model": name, "layout": layout, "optimizer": args.optimizer, "runs": len(runs),
                   "cpu_step_s": cpu_s, "cpu_steps_s": cpus, "cpu_spread": (max(cpus) - min(cpus)) / cpu_s,
                   "within_cpu_range": min(cpus) <= p["step_time_s"] <= max(cpus), "cpu_error": cpu_error,
                   "measured_step_s": wall_s, "wall_steps_s": walls, "error": error,
                   "cpu_share": [m.cpu_share for m in runs], "other_cores": [m.other_cores for m in runs],
                   "load_before": [m.load_before for m in runs],
                   "iqr_over_median": [_iqr(m.steps) / m.step_s for m in runs],
                   "predicted_step_s": p["step_time_s"], "breakdown": p["breakdown"]}  # fmt: skip
            rows.append(row)
            span = f"{min(cpus):.4f}-{max(cpus):.4f}"
            print(f"{name:<12}{layout:<16}{p['step_time_s']:>12.4f}{cpu_s:>8.4f}{span:>18}{cpu_error:>+9.1%}"
                  f"{wall_s:>8.4f}{error:>+8.1%}{statistics.mean(row['other_cores']):>7.2f}"
                  f"{statistics.mean(row['load_before']):>6.1f}", flush=True)  # fmt: skip
            if args.out:
                args.out.write_text(json.dumps({"calibration": calibrations, "rows": rows}, indent=1, sort_keys=True))
    for key in ("error", "cpu_error"):
        errors = [abs(r[key]) for r in rows]
        print(f"{key}: mean absolute {statistics.mean(errors):.1%}, worst {max(errors):.1%} over {len(rows)} rows")
    inside = sum(r["within_cpu_range"] for r in rows)
    print(f"prediction inside the range of the runs' CPU times: {inside} of {len(rows)} rows")


def _iqr(steps: list[float]) -> float:
    q = statistics.quantiles(steps, n=4)
    return q[2] - q[0]


if __name__ == "__main__":
    main()
