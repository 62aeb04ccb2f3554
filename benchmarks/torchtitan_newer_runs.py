"""echosim on torchtitan runs the validation table does not hold (issue 16): a check, not a fit.

``cases.csv`` takes torchtitan's December 2024 H100 benchmark and a June 2025 H200 one. The same repository
published another H100 table in June 2025, async tensor parallelism against plain TP, each with BF16, float8
tensorwise and float8 rowwise linears (``benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md``, torchtitan
commit b5bcd76). Its 12 runs were written in ``cases.csv``'s columns to ``benchmarks/data/torchtitan_newer.csv``,
the model and hardware columns copied from the December table's rows of the same model on the same Grand Teton
H100s. They are checked only: nothing in echosim was fitted to them.

    PYTHONPATH=. python benchmarks/torchtitan_newer_runs.py
    PYTHONPATH=. python benchmarks/torchtitan_newer_runs.py --build ASYNCTP.md  # rewrite the CSV

Left out, with the reason printed: torchao's MXFP8 tables (8 B200s at a power limit the source does not give;
Llama 4 Scout on GB200, whose torchtitan and torchao pages give different local batches and GPU counts).
"""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from newer_rows import transcribed_main  # noqa: E402

OUT = ROOT / "benchmarks" / "data" / "torchtitan_newer.csv"
COMMIT = "b5bcd76c66d0acb1a08b176d9639425bc55e0b2a"
PAGE = "benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md"
URL = f"https://github.com/pytorch/torchtitan/blob/{COMMIT}/{PAGE}"
#: The page's table headings -> (the December 2024 case_id whose model and hardware columns the rows copy,
#: the layout the heading states: tp, data-parallel shard degree, local batch, recompute).
TABLES = {
    "Llama3 70b on 256 H100s": ("torchtitan2412-t4-llama-3p1-70b-fp8-h100-96gb-256", 8, 32, 16, "full"),
    "Llama3 8b on 64 H100s": ("torchtitan2412-t3-llama-3p1-8b-compile-fp8-h100-96gb-128", 8, 8, 12, "selective"),
}
#: Quantization column -> (dtype, case_id tag, the recipe in words).
QUANT = {
    "None (bfloat16)": ("bf16", "bf16", "bf16 linears"),
    "float8 tensorwise": ("fp8", "fp8-tensorwise", "float8 linears, tensorwise scaling (torchao)"),
    "float8 rowwise": ("fp8", "fp8-rowwise", "float8 linears, rowwise scaling (torchao)"),
}
FRAMEWORK = "torchtitan (commit 820504e, torch 38410cf9 2025-06-14, torchao 6243040)"
LEFT_OUT = (
    "torchao MXFP8 dense table (torchtitan/components/quantization/mxfp8.md): '8x power limited B200 GPUs', "
    "the limit not given, and no model named on that page",
    "Llama 4 Scout MXFP8 on GB200 (mxfp8.md; torchao prototype/moe_training/README.md): local batch 10 on one "
    "page, 1 on the other; '512' GPUs against '64 nodes of 4 devices each = 256 chips'",
)


def build(page: Path, cases: Path) -> list[dict[str, str]]:
    templates = {r["case_id"]: r for r in csv.DictReader(cases.open())}
    text = page.read_text()
    rows: list[dict[str, str]] = []
    for m in re.finditer(r"#### (.+)\n\n((?:\|.*\n)+)", text):
        heading = m.group(1)
        key = next((k for k in TABLES if heading.startswith(k)), None)
        if key is None:
            continue
        template_id, tp, shard, local_batch, recompute = TABLES[key]
        t = templates[template_id]
        lines = [ln for ln in m.group(2).splitlines() if not ln.startswith("| :")]
        for ln in lines[1:]:
            quant, plain, async_tp, _ = (v.strip() for v in ln.strip("|").split("|"))
            dtype, tag, recipe = QUANT[quant]
            devices = tp * shard
            seq = int(t["seq_len"])
            gbs = local_batch * shard
            for variant, tps in (("", plain), ("-asynctp", async_tp)):
                size = "70b" if "70b" in key else "8b"
                notes = [
                    "H100 96GB HBM2e Grand Teton at 500 W power limit",
                    f"torchtitan '{recipe}'",
                    f"recompute: {'full' if recompute == 'full' else 'selective (per-op SAC)'}",
                    "step_time from global_batch*seq_len/(tokens_per_s_per_device*devices)",
                    f"metrics: tokens_per_s_per_gpu={tps}",
                    f"source notes: {heading}" + (", async TP" if variant else ", vanilla TP") + ", torch.compile",
                    "seq_len from the repo's default train config at commit 820504e (8192)",
                ]
                row = dict(t)
                row.update(
                    case_id=f"torchtitan2506-llama-3p1-{size}{variant}-{tag}-h100-96gb-{devices}",
                    source_id="torchtitan_2506_asynctp",
                    source_url=URL,
                    table=heading,
                    framework=FRAMEWORK,
                    confidence="B",
                    devices=str(devices),
                    dtype=dtype,
                    tp=str(tp),
                    pp="1",
                    dp=str(shard),
                    cp="1",
                    sp="1",
                    zero="3",
                    recompute=recompute,
                    micro_batch=str(local_batch),
                    global_batch=str(gbs),
                    step_time_s=f"{gbs * seq / (float(tps) * devices):.6g}",
                    step_time_basis="tokens_per_s",
                    reported_metric="tokens_per_s_per_gpu",
                    reported_value=tps,
                    notes=" | ".join(notes),
                )
                rows.append(row)
    return rows


def main() -> None:
    transcribed_main(
        __doc__, build, OUT, ROOT, LEFT_OUT,
        lambda case_id: ["rowwise" if "rowwise" in case_id else "bf16 + tensorwise"], 66, inputs=("ASYNCTP_MD",),
    )  # fmt: skip


if __name__ == "__main__":
    main()
