"""Really train a small DLRM and a small LSTM language model on this CPU and compare with echosim.

Usage::

    python benchmarks/cpu_reality_nonllm.py [--calibration ONE_RANK TWO_RANKS] [--sweep quick] [--steps 10]
                                            [--repeats 5] [--order model|row] [--models NAME ...]
                                            [--layouts LAYOUT ...]
                                            [--out benchmarks/data/cpu_reality_nonllm.json]

The same method as ``benchmarks/cpu_reality.py`` (whose helpers it imports: the calibration of
this machine for one rank and for two ranks computing at once, the step timing with a barrier,
the load accounting from /proc/stat), for the models of
issue 15 built by :mod:`echosim.frontend.zoo_torch` at a size this machine trains in seconds:

* ``dlrm-small``: 8 tables of 20,000 x 32 (pooling 4 ids each, ``nn.EmbeddingBag`` sum), dense
  arch 13-64-32, two DCN-v2 cross layers of rank 32, over arch 128-64-1; binary cross-entropy;
  dense table gradients and AdamW (what plain PyTorch DDP does, and what echosim models without
  ``--embedding-sharding``).
* ``lstm-small``: a 2-layer LSTM LM, hidden 256, vocabulary 2,000, 20 steps; cross-entropy.
* ``gru-small``: the same LM with a 2-layer GRU (PyTorch runs a CPU GRU step by step in aten ops,
  not in oneDNN's RNN primitive as it runs the LSTM); ``gru-wide``: one GRU of 768, batch 64,
  40 steps; ``rnn-small``: the LM with a 2-layer Elman RNN (tanh).

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
a step (wall x the share of it the process ran). The noise has two parts, both measured: the
run-to-run spread of that CPU time (the median step of each run) and the spread of the prediction
over ``--calibrations`` calibrations made one after the other. A row's noise band is half the range
of each, added in quadrature; the row is within the noise when its error is inside that band.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import tempfile
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
    calibrate,
    calibration_probe,
    calibrations_for,
    drift_of,
    gloo_group,
    run_ranks,
    worker_parser,
)

from echosim.frontend.zoo_torch import TorchZooModel, dlrm_module, lstm_lm_module  # noqa: E402

VOCAB = 2000  # the recurrent language models' vocabulary
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
    **{
        name: (
            TorchZooModel(
                name,
                partial(lstm_lm_module, layers, hidden, VOCAB, steps, cell=cell),
                ((("batch", "seq"), "int64"),),
                label,
                "sequences",
            ),
            batch,
            steps,
        )
        for name, cell, layers, hidden, batch, steps, label in (
            ("lstm-small", "lstm", 2, 256, 16, 20, "2 x LSTM 256"),
            ("gru-small", "gru", 2, 256, 16, 20, "2 x GRU 256"),
            ("gru-wide", "gru", 1, 768, 64, 40, "1 x GRU 768"),
            ("rnn-small", "rnn", 2, 256, 16, 20, "2 x Elman RNN (tanh) 256"),
        )
    },
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
    ids = torch.randint(0, VOCAB, (batch, seq), generator=gen)
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

    faults: list[float] = []
    walls, share = _time_steps(train_step(name, model, opt, inputs, labels), steps, reduce_max, faults)
    if world > 1:
        import torch.distributed as dist

        dist.destroy_process_group()
    return {"steps": walls, "cpu_share": share, "faults_per_step": statistics.median(faults), "faults": faults}


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


def noise(values: list[float]) -> dict[str, float]:
    """Spread of ``values`` around their median: half the range and the sample standard deviation, as shares."""
    mid = statistics.median(values)
    half = (max(values) - min(values)) / 2 / mid
    sd = statistics.stdev(values) / mid if len(values) > 1 else 0.0
    return {"median": mid, "half_range": half, "stdev": sd}


def main() -> None:
    parser = worker_parser(__doc__)
    parser.add_argument("--calibration", nargs=2, metavar=("ONE_RANK", "TWO_RANKS"))
    parser.add_argument("--sweep", default="quick", help="Calibration sweep when calibrating now.")
    parser.add_argument(
        "--calibrations",
        type=int,
        default=2,
        help="Calibration pairs to make now (without --calibration): their spread is the calibration's noise.",
    )
    parser.add_argument(
        "--optimizer",
        choices=("fused", "foreach-off"),
        default="fused",
        help="AdamW as the real run steps it: fused (one pass per tensor, what echosim's Adam cost describes) "
        "or PyTorch's CPU default (a loop of eight elementwise kernels per tensor).",
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--models", nargs="+", choices=tuple(MODELS), default=tuple(MODELS), help="Models to run.")
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=LAYOUTS, help="Layouts to run.")
    parser.add_argument("--repeats", type=int, default=5, help="Runs of each model and layout (fresh processes).")
    parser.add_argument(
        "--order",
        choices=("model", "row"),
        default="model",
        help="Calibrate once before every row, or again just before each row, for its layout's ranks only "
        "(without --calibration; as cpu_reality.py --order row).",
    )
    args = parser.parse_args()
    if args.worker:
        result = worker(args.worker, args.layout, args.rank, args.world, args.port, args.steps, args.optimizer)
        if args.rank == 0:
            print(json.dumps(result))
        return
    per_row = args.order == "row" and not args.calibration
    db = Path(tempfile.mkdtemp()) / "calibration.sqlite"
    if args.calibration:
        pairs = [calibrations_for(args)]
    elif not per_row:
        pairs = [calibrate(db, args.sweep, f"-{i}") for i in range(max(1, args.calibrations))]
    else:
        pairs = []  # made before each row
    rows = []
    print(f"{'model':<12}{'layout':<16}{'predicted s':>12}{'calib +-':>9}{'cpu s':>8}{'runs +-':>8}"
          f"{'vs cpu s':>9}{'noise':>7}{'within':>7}{'others':>7}{'drift':>7}")  # fmt: skip
    for name in args.models:
        for layout in args.layouts:
            ranks = 1 if layout == "1 process" else 2
            if per_row:  # the row's calibrations just before it: minutes of the machine's drift do not sit between
                n = max(1, args.calibrations)
                pairs = [calibrate(db, args.sweep, f"-row{len(rows)}-{i}", keys=(ranks,)) for i in range(n)]
            runs = [measure(name, layout, args.steps, args.optimizer) for _ in range(args.repeats)]
            preds = [predict(name, layout, pair[ranks]) for pair in pairs]
            predicted = statistics.median(p["step_time_s"] for p in preds)
            # the CPU time of a step (wall x the share of it the process ran): what the step costs where the
            # machine's other work does not take the core away
            cpus = [m.step_s * m.cpu_share for m in runs]
            walls = [m.step_s for m in runs]
            run_noise, cal_noise = noise(cpus), noise([p["step_time_s"] for p in preds])
            cpu_s, wall_s = run_noise["median"], statistics.median(walls)
            cpu_error, error = predicted / cpu_s - 1, predicted / wall_s - 1
            # the noise band: the run-to-run spread of the measured step and the spread of the prediction
            # over calibrations, each half its range, added in quadrature
            band = math.hypot(run_noise["half_range"], cal_noise["half_range"])
            # the machine's speed beside each run against the first calibration's: drift, not model error
            drifts = [drift_of(pairs[0][ranks], m.probe) for m in runs]
            totals = [d["total"] for d in drifts if d]
            drift = statistics.median(totals) if totals else math.nan
            row = {"model": name, "layout": layout, "optimizer": args.optimizer, "runs": len(runs),
                   "cpu_step_s": cpu_s, "cpu_steps_s": cpus, "run_noise": run_noise,
                   "calibration_noise": cal_noise, "noise_band": band, "within_noise": abs(cpu_error) <= band,
                   "cpu_error": cpu_error, "measured_step_s": wall_s, "wall_steps_s": walls, "error": error,
                   "cpu_share": [m.cpu_share for m in runs], "other_cores": [m.other_cores for m in runs],
                   "load_before": [m.load_before for m in runs],
                   "iqr_over_median": [_iqr(m.steps) / m.step_s for m in runs],
                   "probes": [m.probe for m in runs], "probe_drift": drifts,
                   "faults_per_step": [m.faults_per_step for m in runs], "faults": [m.faults for m in runs],
                   "calibration_probes": [calibration_probe(pair[ranks]) for pair in pairs],
                   "calibrations": [pair[ranks] for pair in pairs],
                   "predicted_step_s": predicted, "predicted_steps_s": [p["step_time_s"] for p in preds],
                   "breakdown": preds[0]["breakdown"]}  # fmt: skip
            rows.append(row)
            within = "yes" if row["within_noise"] else "no"
            print(f"{name:<12}{layout:<16}{predicted:>12.4f}{cal_noise['half_range']:>9.1%}{cpu_s:>8.4f}"
                  f"{run_noise['half_range']:>8.1%}{cpu_error:>+9.1%}{band:>7.1%}{within:>7}"
                  f"{statistics.mean(row['other_cores']):>7.2f}{drift:>+7.1%}", flush=True)  # fmt: skip
            if args.out:
                args.out.write_text(json.dumps({"calibrations": pairs, "rows": rows}, indent=1, sort_keys=True))
    for key in ("error", "cpu_error"):
        errors = [abs(r[key]) for r in rows]
        print(f"{key}: mean absolute {statistics.mean(errors):.1%}, worst {max(errors):.1%} over {len(rows)} rows")
    bands = [r["noise_band"] for r in rows]
    print(f"noise band (runs and calibrations): {min(bands):.1%}-{max(bands):.1%}; "
          f"within it: {sum(r['within_noise'] for r in rows)} of {len(rows)} rows")  # fmt: skip


def _iqr(steps: list[float]) -> float:
    q = statistics.quantiles(steps, n=4)
    return q[2] - q[0]


if __name__ == "__main__":
    main()
