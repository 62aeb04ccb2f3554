"""echosim on NeMo performance-summary tables the validation table does not hold (issue 16): a check, not a fit.

``cases.csv`` takes NeMo's published pre-training tables for 24.07 (DGX-H100, ``nemo_2407``) and for 25.04
(DGX-GB200, ``nemo_2504_gb200``). Two more tables of the same pages are transcribed here:

* NeMo 25.02, DGX-B200 (the first table of docs.nvidia.com's performance summary when 25.02 was current): eight
  models at FP8, and the first row of the DGX-H100 table after it (GPT-3 175B);
* NeMo 25.07, DGX-GB200: the first four rows, at FP8 with per-tensor current scaling. Each cell's second value,
  in parentheses, is the layout and rate of another FP8 recipe (Megatron-Bridge's 25.09 footnote: "different
  quantization granularities"); only the first is taken.

They were read from the stored pages (``search`` corpus ``pages``); the rest of each page (H100, B200 tables of
25.04 / 25.07) was not in the stored text. Written to ``benchmarks/data/nemo_docs_other.csv`` in ``cases.csv``'s
columns, the model columns copied from ``cases.csv`` rows of the same model. Nothing in echosim was fitted to them.

    PYTHONPATH=. python benchmarks/nemo_docs_other_rows.py
    PYTHONPATH=. python benchmarks/nemo_docs_other_rows.py --build  # rewrite the CSV

Each row must satisfy GBS = MBS x DP x GA with DP = GPUs / (TP x PP x CP), or it is not written. The 25.02
Mixtral-8x22B row prints GBS 1 and MBS 64; read the other way round (GBS 64, MBS 1) it holds (DP 4 x GA 16), and that
is the layout NeMo v2.2.0's ``scripts/llm/performance/recommended_model_configs/model_configs_b200.csv`` gives
(256 GPUs, seq 65536, TP 2, PP 4, CP 8, EP 8, VP 14, MBS 1, GBS 64), so the row takes it.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from newer_rows import model_row, transcribed_main  # noqa: E402

OUT = ROOT / "benchmarks" / "data" / "nemo_docs_other.csv"
#: Model -> the cases.csv row whose model columns (and model notes) the rows copy.
TEMPLATES = {
    "gpt3-175b": "nemo2504-gpt3-175b-fp8-gb200-128",
    "llama3-8b": "nemo2504-llama3-8b-fp8-gb200-8",
    "llama3-70b": "nemo2504-llama3-70b-fp8-gb200-64",
    "llama3-405b": "nemo2504-llama3-405b-fp8-gb200-128",
    "nemotron-15b": "nemo2504-nemotron-15b-fp8-gb200-64",
    "nemotron-340b": "nemo2504-nemotron-340b-fp8-gb200-128",
    "mixtral-8x7b": "nemo2504-mixtral-8x7b-fp8-gb200-64",
    "mixtral-8x22b": "tpurecipes-mixtral-8x22b-bf16-v6e-256",
    "llama4-scout": "tpurecipes-llama4-scout-bf16-v5p-512",
}
PAGE_2502 = "https://docs.nvidia.com/nemo-framework/user-guide/latest/performance/performance_summary.html"
PAGE_2507 = "https://docs.nvidia.com/nemo-framework/user-guide/latest/performance/performance-summary.html"
#: (release, device, page, model, GPUs, GBS, MBS, seq, FSDP, TP, PP, CP, VP, EP, GA, tokens/s/GPU, TFLOP/s/GPU or 0).
TABLES = [
    ("25.02", "b200", PAGE_2502, "gpt3-175b", 512, 2048, 2, 2048, 0, 4, 4, 1, 6, 1, 32, 1600, 1722),
    ("25.02", "b200", PAGE_2502, "llama3-8b", 8, 128, 2, 8192, 0, 1, 1, 1, 1, 1, 8, 26006, 1506),
    ("25.02", "b200", PAGE_2502, "llama3-70b", 64, 128, 1, 8192, 0, 2, 4, 2, 5, 1, 32, 3062, 1474),
    ("25.02", "b200", PAGE_2502, "llama3-405b", 128, 64, 1, 8192, 0, 4, 8, 2, 8, 1, 32, 625, 1658),
    ("25.02", "b200", PAGE_2502, "nemotron-15b", 64, 256, 2, 4096, 0, 1, 1, 1, 1, 1, 2, 14760, 1387),
    ("25.02", "b200", PAGE_2502, "nemotron-340b", 128, 32, 1, 4096, 0, 8, 4, 1, 12, 1, 8, 602, 1268),
    ("25.02", "b200", PAGE_2502, "mixtral-8x7b", 64, 256, 2, 4096, 0, 1, 1, 1, 1, 8, 2, 15457, 1282),
    ("25.02", "b200", PAGE_2502, "mixtral-8x22b", 256, 64, 1, 65536, 0, 2, 4, 8, 14, 8, 16, 2232, 824),
    ("25.02", "h100-sxm", PAGE_2502, "gpt3-175b", 512, 2048, 2, 2048, 0, 4, 8, 1, 6, 1, 64, 866, 932),
    ("25.07", "gb200", PAGE_2507, "llama3-8b", 8, 128, 2, 8192, 0, 1, 1, 1, 1, 1, 8, 31737, 1838),
    ("25.07", "gb200", PAGE_2507, "llama3-70b", 64, 128, 1, 8192, 1, 1, 1, 1, 1, 1, 2, 4066, 1957),
    ("25.07", "gb200", PAGE_2507, "llama3-405b", 128, 64, 1, 8192, 1, 2, 1, 1, 1, 1, 1, 706, 1854),
    ("25.07", "gb200", PAGE_2507, "llama4-scout", 64, 1024, 1, 8192, 0, 1, 1, 1, 1, 16, 16, 13783, 1501),
]  # fmt: skip
SYSTEM = {"b200": "DGX-B200", "gb200": "DGX-GB200", "h100-sxm": "DGX-H100"}
LEFT_OUT = (
    "NeMo 25.07 DGX-GB200 LLAMA4-Maverick and the rows after it: cut off in the stored page",
    "NeMo 25.02 DGX-H100 after its first row, and the 25.04 / 25.07 DGX-B200 and DGX-H100 tables: not in the stored "
    "pages' text",
    "each 25.07 cell's parenthesised value (another FP8 recipe, another layout)",
)
_MODEL_NOTES = ("Nemotron:", "MoE every", "MLA attention")


def build(cases: Path) -> list[dict[str, str]]:
    templates = {r["case_id"]: r for r in csv.DictReader(cases.open())}
    rows: list[dict[str, str]] = []
    for release, device, page, model, gpus, gbs, mbs, seq, fsdp, tp, pp, cp, vp, ep, ga, tokens, tflops in TABLES:
        dp = gpus // (tp * pp * cp)
        if dp * tp * pp * cp != gpus or mbs * dp * ga != gbs:
            raise SystemExit(f"NeMo {release} {device} {model}: GBS {gbs} != MBS {mbs} x DP {dp} x GA {ga}")
        t = templates[TEMPLATES[model]]
        row = model_row(t)
        notes = [n for n in t["notes"].split(" | ") if n.startswith(_MODEL_NOTES)]
        if device == "gb200":
            notes.append("devices_per_node = 72-GPU NVL72 NVLink domain (4 GPUs per compute tray)")
        notes += [
            "FP8 recipe: " + ("fp8 (per-tensor current scaling)" if release == "25.07" else
                              "fp8 (bf16_with_fp8_mixed: per-tensor delayed scaling, NeMo v2.2.0)"),
            "step_time from global_batch*seq_len/(tokens_per_s_per_device*devices)",
            f"metrics: tokens_per_s_per_gpu={tokens}" + (f"; tflops_per_gpu={tflops} (model)" if tflops else ""),
            f"source notes: NeMo {release} performance summary, {SYSTEM[device]} pre-training table, read from "
            "the stored page",
        ]  # fmt: skip
        if model == "mixtral-8x22b":
            notes.append("GBS and MBS read swapped (the page prints GBS 1, MBS 64): GBS = MBS x DP x GA holds only so")
        if not fsdp:
            notes.insert(0, "optimizer sharding not stated by source (Megatron/NeMo default is the distributed "
                         "optimizer, ZeRO-1-like)")  # fmt: skip
        row.update(
            case_id=f"nemo{release.replace('.', '')}-{model}-fp8-{device}-{gpus}",
            source_id=f"nemo_{release.replace('.', '')}_{device}",
            source_url=page,
            table=f"Pre-Training Performance, {SYSTEM[device]} (NeMo {release})",
            framework=f"NeMo {release} (NeMo 2.0 / Megatron-Core)",
            confidence="C" if model == "mixtral-8x22b" else "B",
            seq_len=str(seq),
            device=device,
            devices=str(gpus),
            devices_per_node="72" if device == "gb200" else "8",
            slices="1",
            dtype="fp8",
            tp=str(tp),
            pp=str(pp),
            dp=str(dp),
            cp=str(cp),
            ep=str(ep) if ep > 1 else "",
            vpp=str(vp),
            zero="3" if fsdp else "",
            micro_batch=str(mbs),
            global_batch=str(gbs),
            step_time_s=f"{gbs * seq / (tokens * gpus):.6g}",
            step_time_basis="tokens_per_s",
            reported_metric="tflops_per_gpu" if tflops else "tokens_per_s_per_gpu",
            reported_value=str(tflops or tokens),
            notes=" | ".join(notes),
        )
        rows.append(row)
    return rows


def main() -> None:
    transcribed_main(__doc__, build, OUT, ROOT, LEFT_OUT, group)


def group(case_id: str) -> list[str]:
    """The release and device of a row, and whether its model is a MoE: '2502 b200 dense'."""
    device = next(d for d in ("h100-sxm", "gb200", "b200") if f"-{d}-" in case_id)
    kind = "moe" if "mixtral" in case_id or "scout" in case_id else "dense"
    return [f"{case_id.split('-')[0].removeprefix('nemo')} {device} {kind}"]


if __name__ == "__main__":
    main()
