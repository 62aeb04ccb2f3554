"""Predicted vs published training throughput of the non-LLM zoo (ResNet-50, ViT-B/16, BERT-large, DLRM-DCNv2,
GNMT, SuperBench's LSTM).

Each row of ``benchmarks/data/nonllm_throughput.csv`` is one published measurement with its
source; echosim compiles the same layout (with the row's run settings ``tf32``, ``conv_layout``, ``attention``,
``embedding_sharding``, ``overlap_dp``, empty where the framework overlaps the gradient reduction with the
backward, and ``tp``, empty for 1; ``gpus`` counts every device, ``micro_batch`` is per data-parallel replica)
and the script prints samples/s both ways, the signed error and the MAPE per model family: over its comparable
rows, and over all its rows (a family whose rows are all not comparable gets only the latter). Nothing here is
fitted to the rows.

    python benchmarks/nonllm_accuracy.py [--json]
"""

from __future__ import annotations

import csv
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

DATA = Path(__file__).resolve().parent / "data" / "nonllm_throughput.csv"


class _RunSettings:
    """Each GPU backend once more as ``NAME-no-tf32`` (fp32 GEMMs on the FP32 pipes, as PyTorch runs them
    unless ``torch.backends.cuda.matmul.allow_tf32`` is set: the row's ``tf32`` column) and as ``NAME-nchw``
    (convolutions on NCHW activations, PyTorch's default memory format: the row's ``conv_layout`` column)."""

    @hookimpl
    def register_backends(self, register: Any) -> None:
        for name, device in DEVICES.items():
            register(f"{name}-no-tf32", partial(GPUBackend, device, allow_tf32=False))
            register(f"{name}-nchw", partial(GPUBackend, device, conv_layout="nchw"))


REGISTRY = load_registry(extra_plugins=[_RunSettings()])


def predict(row: dict[str, str]) -> tuple[float, dict[str, float]]:
    """echosim's samples/s for the row's layout, and the step's breakdown."""
    gpus, tp = int(row["gpus"]), int(row["tp"] or 1)
    backend = row["backend"]
    if row["tf32"] == "no":  # the FP32 pipes run NCHW natively: no layout variant needed
        backend += "-no-tf32"
    elif row["conv_layout"] == "nchw":
        backend += "-nchw"
    plan = Plan(
        dp=gpus // tp,
        tp=tp,
        micro_batch=int(row["micro_batch"]),
        global_batch=int(row["global_batch"]),
        seq_len=int(row["seq_len"]),
        dtype=row["dtype"],
        embedding_sharding=row["embedding_sharding"],
        attention=row["attention"] or "flash",
        overlap_dp=row["overlap_dp"] != "no",  # "no": the run's framework leaves the gradient reduction exposed
        # the training loop's framework: "eager-amp" where the run's forward ran under torch.autocast with fp32
        # parameters (the row's note cites the script), "jax-xla" / "nemo-megatron-vit" on the ViT rows whose stack
        # is not eager PyTorch (no autograd layout copies), "apex-ddp" where apex's DistributedDataParallel reduces
        # the gradients (not torch DDP's buckets); a row without the column is plain eager PyTorch under torch DDP
        framework=row.get("framework") or "eager",
    )
    report = lower(row["model"], plan, Cluster(backend=backend, devices=gpus), REGISTRY).report
    return report.samples_per_s * units_per_sample(row), report.breakdown


def units_per_sample(row: dict[str, str]) -> int:
    """What the row's unit counts per echosim sample. A GNMT row is published in tokens/s, counted as
    DeepLearningExamples' trainer counts them (source length + target length - 1 per sentence pair): the
    zoo's ``gnmt`` reads ``seq_len`` source tokens and ``seq_len`` decoder inputs (target length - 1)."""
    if row["unit"] != "tokens/s":
        return 1
    if row["model"] != "gnmt":
        raise ValueError(f"tokens per sample of {row['model']!r} are not defined here")
    return 2 * int(row["seq_len"])


def main() -> None:
    with open(DATA, encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    errors: dict[str, list[float]] = defaultdict(list)  # rows whose workload echosim is given exactly
    every_row: dict[str, list[float]] = defaultdict(list)
    out = []
    head = f"{'model':18} {'backend':10} gpus {'batch':>6} {'seq':>4} {'dtype':5}"
    print(f"{head} {'published':>10} {'predicted':>10}  error")
    for row in rows:
        predicted, parts = predict(row)
        published = float(row["published_samples_per_s"])
        error = predicted / published - 1
        every_row[row["family"]].append(abs(error))
        if row["comparable"] == "yes":
            errors[row["family"]].append(abs(error))
        out.append({**row, "predicted_samples_per_s": round(predicted, 1), "error": round(error, 4),
                    "breakdown_s": {k: round(v, 6) for k, v in parts.items()}})  # fmt: skip
        print(
            f"{row['model']:18} {row['backend']:10} {row['gpus']:>4} {row['micro_batch']:>6} {row['seq_len']:>4} "
            f"{row['dtype'] + ('' if row['tf32'] == 'yes' else '*'):5} "
            f"{published:>10,.0f} {predicted:>10,.0f} {error:+7.1%}{'' if row['comparable'] == 'yes' else '  (!)'}"
        )
    print("* fp32 without TF32 (the run left torch.backends.cuda.matmul.allow_tf32 off)")
    print("(!) not comparable: the run's sequences are shorter than seq_len, by a distribution not published (note)")
    print("published and predicted are in the row's unit: images/s, sequences/s, queries/s or tokens/s (GNMT)\n")
    summary, whole = mape_per_family(errors), mape_per_family(every_row)
    for family, all_rows in whole.items():  # every family with a row, comparable or not
        mape = f"{summary[family]:6.1%}" if family in summary else f"{'-':>6}"
        print(
            f"MAPE {family:9} {mape}  ({len(errors[family])} comparable rows; "
            f"{all_rows:.1%} over all {len(every_row[family])})"
        )
    every = [e for es in errors.values() for e in es]
    print(f"MAPE {'all':9} {sum(every) / len(every):6.1%}  ({len(every)} comparable rows)")
    if "--json" in sys.argv:
        print(json.dumps({"rows": out, "mape": summary, "mape_all_rows": whole}, indent=1))


def mape_per_family(errors: dict[str, list[float]]) -> dict[str, float]:
    """Mean absolute error per family, over the families that have rows."""
    return {family: sum(e) / len(e) for family, e in errors.items() if e}


if __name__ == "__main__":
    main()
