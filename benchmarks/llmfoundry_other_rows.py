"""echosim on the llm-foundry benchmark rows ``cases.csv`` does not hold (issue 16): a check, not a fit.

``cases.csv`` takes 37 rows of llm-foundry's MPT benchmark tables (``scripts/train/benchmarking/README.md``,
llm-foundry commit 4952183): runs on 16 GPUs or more, all at sequence length 2048. The same README has 189
more rows from the same harness: 8-GPU runs at sequence lengths 512 to 65,536, an H100 FP8 table, and the
125M-760M models. ``--build`` writes them to ``benchmarks/data/llmfoundry_other_rows.csv`` in ``cases.csv``'s
columns. The model columns are copied from ``cases.csv`` rows of the same MPT size where there is one, and for
125M, 350M and 760M from the llm-foundry yamls (scripts/train/yamls/pretrain/mpt-*.yaml, same commit).

    PYTHONPATH=. python benchmarks/llmfoundry_other_rows.py
    PYTHONPATH=. python benchmarks/llmfoundry_other_rows.py --build README.md  # rewrite the CSV

The step is the README's global batch x sequence length over its Throughput (T/s), as for the table's rows.
"""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from newer_rows import model_row, transcribed_main  # noqa: E402

OUT = ROOT / "benchmarks" / "data" / "llmfoundry_other_rows.csv"
COMMIT = "495218376830947dce625efabc4d86be7c47cc45"
URL = f"https://github.com/mosaicml/llm-foundry/blob/{COMMIT}/scripts/train/benchmarking/README.md"
DEVICES = {"h100_80gb": "h100-sxm", "a100_80gb": "a100-80gb", "a100_40gb": "a100-40gb"}
#: MPT sizes cases.csv has no row of: (layers, d_model, heads) from scripts/train/yamls/pretrain/mpt-*.yaml
#: (expansion_ratio 4, vocab_size 50368).
SMALL_MPT = {"125m": (12, 768, 12), "350m": (24, 1024, 16), "760m": (24, 1536, 12)}


def _templates(cases: Path) -> tuple[dict[str, dict[str, str]], set[tuple[str, ...]]]:
    """The model columns of each MPT size in cases.csv, and the (table, size, devices, global batch) it holds."""
    sizes: dict[str, dict[str, str]] = {}
    held: set[tuple[str, ...]] = set()
    for row in csv.DictReader(cases.open()):
        if row["source_id"] != "llm_foundry_bench":
            continue
        size = re.match(r"llmfoundry-mpt-(\w+)-", row["case_id"]).group(1)  # type: ignore[union-attr]
        sizes.setdefault(size, row)
        held.add((row["table"], size, row["seq_len"], row["devices"], row["global_batch"]))
    for size, (layers, hidden, heads) in SMALL_MPT.items():
        base = dict(next(iter(sizes.values())))
        base.update(layers=str(layers), hidden=str(hidden), heads=str(heads), kv_heads=str(heads),
                    head_dim=str(hidden // heads), ffn_hidden=str(4 * hidden), vocab="50368")  # fmt: skip
        sizes[size] = base
    return sizes, held


def build(readme: Path, cases: Path) -> list[dict[str, str]]:
    sizes, held = _templates(cases)
    rows: list[dict[str, str]] = []
    seen: set[str] = set()
    for m in re.finditer(r"## (.+)\n\n?((?:\|.*\n)+)", readme.read_text()):
        table = m.group(1).strip()
        lines = [ln for ln in m.group(2).splitlines() if not ln.startswith("|  ---")]
        head = [h.strip() for h in lines[0].strip("|").split("|")]
        for ln in lines[1:]:
            r = dict(zip(head, (v.strip() for v in ln.strip("|").split("|")), strict=True))
            size, seq, gpus, gbs = r["Model"], r["SeqLen (T)"], r["# GPUs"], r["GlobalBatchSize"]
            if (table, size, seq, gpus, gbs) in held:
                continue
            device = DEVICES[r["GPU"]]
            dtype = "fp8" if r["Precision"] == "amp_fp8" else "bf16"
            case_id = f"llmfoundry-mpt-{size}-{dtype}-{device}-{gpus}-s{seq}"
            if case_id in seen:  # a second row of the same model, precision, GPUs and sequence length
                case_id += f"-gbs{gbs}"
            seen.add(case_id)
            t = sizes[size]
            step = int(gbs) * int(seq) / float(r["Throughput (T/s)"])
            row = model_row(t)
            row.update(
                case_id=case_id,
                source_id="llm_foundry_bench",
                source_url=URL,
                table=table,
                framework=t["framework"],
                confidence="A",
                seq_len=seq,
                device=device,
                devices=gpus,
                devices_per_node="8",
                slices="1",
                dtype=dtype,
                tp="1",
                pp="1",
                dp=gpus,
                cp="1",
                zero="3" if r["Sharding Strategy"] == "FULL_SHARD" else "2",
                recompute="full" if r["Activation Checkpointing"] == "True" else "none",
                micro_batch=r["MicroBatchSize"],
                global_batch=gbs,
                step_time_s=f"{step:.6g}",
                step_time_basis="tokens_per_s",
                reported_metric="mfu_pct",
                reported_value=r["MFU"],
                notes=(
                    "step_time from global_batch*seq_len/tokens_per_s_total | metrics: "
                    f"tokens_per_s_total={r['Throughput (T/s)']}; tokens_per_s_per_gpu={r['Throughput (T/s/GPU)']}; "
                    f"mfu_pct={r['MFU']}; hfu_pct={r['HFU']} | source notes: Exact NumParams={r['NumParams']}. "
                    f"Precision mode '{r['Precision']}'"
                ),
            )
            rows.append(row)
    return rows


def _groups(case_id: str) -> list[str]:
    seq = int(re.search(r"-s(\d+)", case_id).group(1))  # type: ignore[union-attr]
    device = next(d for d in DEVICES.values() if f"-{d}-" in case_id)
    span = "seq <= 2048" if seq <= 2048 else ("seq 4096-16384" if seq <= 16384 else "seq >= 32768")
    return [f"{device}{' fp8' if '-fp8-' in case_id else ''}", span]


def main() -> None:
    transcribed_main(__doc__, build, OUT, ROOT, (), _groups, 48, inputs=("README_MD",))


if __name__ == "__main__":
    main()
