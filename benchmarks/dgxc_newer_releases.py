"""echosim on DGX Cloud Benchmarking v25.05 (issue 16): a check, not a fit.

``cases.csv`` takes its DGX Cloud Benchmarking rows from v25.04 (NVIDIA/dgxc-benchmarking commit 741c886): H100
only, NeMo 24.12-25.02 containers. The next release, v25.05 (tag v25.05.05), reruns the recipes in NeMo 25.04
containers and adds GB200: Llama 3.1 405B, Nemotron-4 15B and 340B (weak and strong scaling), Grok-1 314B and
Llama 4 Maverick. Each README gives its layouts (TP, PP, CP, EP, ETP, DP, VP, MBS, GBS) and step times.

The READMEs' tables differ in layout from file to file, so the numbers are transcribed below, one entry per
table, with the README and the lines they come from. The model columns are copied from ``cases.csv`` rows of
the same model. ``--build`` writes ``benchmarks/data/dgxc_newer_releases.csv`` in ``cases.csv``'s columns. Nothing in
echosim was fitted to these rows.

    PYTHONPATH=. python benchmarks/dgxc_newer_releases.py
    PYTHONPATH=. python benchmarks/dgxc_newer_releases.py --build  # rewrite the CSV

DeepSeek-V3's stage split, MTP module, token dropping, recompute and TP-overlap setting are not in its README: they
are read from the launch script and the NeMo commit its setup pins (``DEEPSEEK_*`` below). Left out: Nemotron-H (a
hybrid Mamba model, not in the zoo).
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from newer_rows import model_row, transcribed_main  # noqa: E402

OUT = ROOT / "benchmarks" / "data" / "dgxc_newer_releases.csv"
TAG_COMMIT = "c5c765f"  # v25.05.05 (git rev-parse v25.05.05^{commit}, abbreviated)
URL = "https://github.com/NVIDIA/dgxc-benchmarking/blob/v25.05.05/"
#: Model -> (the cases.csv row whose model columns and model notes the rows copy, README, NeMo container).
MODELS = {
    "llama-3p1-405b": ("dgxc2504-llama-3p1-405b-bf16-h100-sxm-512", "llama3.1/README.md", "25.04.01"),
    "nemotron-4-15b": ("dgxc2504-nemotron-4-15b-fp8-h100-sxm-16", "nemotron/README.md", "25.04.00"),
    "nemotron-4-340b": ("dgxc2504-nemotron-4-340b-bf16-h100-sxm-256", "nemotron/README.md", "25.04.00"),
    "grok-1-314b": ("dgxc2504-grok-1-314b-fp8-h100-sxm-512", "grok1/README.md", "25.04.00"),
    "llama4-maverick-400b": ("tpurecipes-llama4-maverick-bf16-v5p-128", "llama4/README.md", "25.04.01"),
    "deepseek-v3-671b": (
        "mbridge2511-deepseekv3-w-o-mtp-bf16-gb200-256",
        "deepseek_v3/pretraining/README.md",
        "25.04.01",
    ),
}
#: DeepSeek-V3's recipe (deepseek_v3/pretraining/launch.sh at v25.05.05: RM='mla_up_proj' on H100, 'core_attn' on
#: GB200; NeMo commit 7a8f1cc, the one its setup.sh pins, scripts/performance/llm/pretrain_deepseek_v3.py:
#: USE_TOKEN_DROP = True -> MegatronTokenDropCallback (capacity factor 1.0, padded), tp_comm_overlap=False,
#: num_layers_in_first_pipeline_stage = 64 // pp - 1, last = 64 // pp - 2; nemo/collections/llm/recipes/
#: deepseek_v3.py pretrain_recipe(use_mtp=True): one MTP module, on the last stage).
DEEPSEEK_RECOMPUTE = {"h100-sxm": "mla_up_proj", "gb200": "core_attn"}
DEEPSEEK_NOTES = ("token drop at capacity factor 1.0, padded", "TP communication overlap off")
#: On GB200 the NeMo 25.04 container's Transformer Engine (NeMo v2.3.x and 7a8f1cc pin TE bee4649c, 2025-03-18, in
#: requirements/manifest.json; TE v2.5, 2025-06-29, is the first to fuse MLA's head_dim_qk 192 on sm_100) runs
#: DeepSeek-V3's attention unfused (rows.UNFUSED_ATTENTION_NOTE); the recipe recomputes core_attn there, the
#: materialised attention, and mla_up_proj on H100, where cuDNN fuses it.
DEEPSEEK_BLACKWELL_NOTE = "attention unfused (Transformer Engine before v2.5: no fused MLA attention on sm_100)"


def deepseek_layout(pp: int) -> str:
    """The recipe's stages: 64 // pp layers each, one fewer on the first (with the embedding), two fewer on the last
    (with the MTP module and the loss): 61 layers."""
    per = 64 // pp
    return f"Et*{per - 1}|(t*{per}|)*{pp - 2}t*{per - 2}mL"


#: One entry per published table: (model, device, seq_len, layout lines, step lines, tp, pp, cp, ep, etp, vp,
#: micro-batch, [(GPUs, GBS, BF16 step s, FP8 step s)], extra note). ep / etp 0: none (dense).
TABLES = [
    ("llama-3p1-405b", "gb200", 8192, "12-16", "86-98", 4, 8, 2, 0, 0, 8, 1,
     [(128, 64, 9.347, 6.131), (256, 128, 9.484, 6.183), (512, 256, 9.508, 6.244)], ""),
    ("llama-3p1-405b", "h100-sxm", 8192, "23-25", "102-113", 8, 8, 2, 0, 0, 8, 1, [(512, 256, 19.810, 13.020)], ""),
    ("nemotron-4-15b", "h100-sxm", 4096, "19-21", "99-111", 2, 1, 1, 0, 0, 0, 2, [(16, 64, 2.746, 1.988)], ""),
    ("nemotron-4-340b", "h100-sxm", 4096, "24-26", "113-125", 8, 8, 1, 0, 0, 12, 1, [(256, 64, 4.606, 3.107)], ""),
    ("nemotron-4-340b", "gb200", 4096, "35-39", "132-144", 8, 4, 1, 0, 0, 12, 1,
     [(128, 32, 2.189, 1.483), (256, 64, 2.19, 1.517), (512, 128, 2.229, 1.549)], "weak scaling"),
    ("nemotron-4-340b", "gb200", 4096, "43-47", "147-160", 8, 4, 1, 0, 0, 12, 1,
     [(128, 512, 32.66, 21.83), (256, 512, 16.58, 11.21), (512, 512, 8.468, 5.668)], "strong scaling"),
    ("grok-1-314b", "gb200", 8192, "13-17", "82-94", 4, 1, 1, 8, 4, 0, 1,
     [(128, 256, 7.325, 5.298), (256, 512, 7.39, 5.224), (512, 1024, 7.324, 5.193)], ""),
    ("grok-1-314b", "h100-sxm", 8192, "23-25", "98-110", 4, 8, 2, 8, 1, 8, 1, [(512, 1024, 15.933, 13.433)], ""),
    ("llama4-maverick-400b", "gb200", 8192, "9-13", "69-81", 1, 2, 1, 64, 1, 12, 1,
     [(128, 1024, 7.781, 6.093), (256, 2048, 7.859, 6.223), (512, 4096, 7.992, 6.327)], ""),
    ("llama4-maverick-400b", "h100-sxm", 8192, "17-19", "88-101", 4, 1, 1, 128, 4, 0, 1, [(512, 1024, 4.426, 3.855)],
     "the FP8 run used CUDA graphs (README line 88)"),
    ("deepseek-v3-671b", "h100-sxm", 4096, "13-15", "80-86", 2, 8, 1, 64, 1, 0, 1, [(512, 4096, 48.948, None)], ""),
    ("deepseek-v3-671b", "h100-sxm", 4096, "13-16", "80-86", 2, 16, 1, 64, 1, 0, 1, [(1024, 8192, 52.04, None)], ""),
    ("deepseek-v3-671b", "gb200", 4096, "22-24", "93-99", 2, 4, 1, 32, 1, 0, 1, [(128, 1024, 34.168, None)], ""),
    ("deepseek-v3-671b", "gb200", 4096, "22-26", "93-99", 2, 4, 1, 64, 1, 0, 1,
     [(256, 2048, 34.194, None), (512, 4096, 34.274, None)], ""),
]  # fmt: skip
LEFT_OUT = ("Nemotron-H 56B (nemotronh/README.md): hybrid Mamba-Transformer, not in echosim's zoo",)


def build(cases: Path) -> list[dict[str, str]]:
    templates = {r["case_id"]: r for r in csv.DictReader(cases.open())}
    rows: list[dict[str, str]] = []
    for model, device, seq, layout_lines, step_lines, tp, pp, cp, ep, etp, vp, mb, runs, extra in TABLES:
        template_id, readme, container = MODELS[model]
        t = templates[template_id]
        model_notes = [n for n in t["notes"].split(" | ") if n.startswith(("Nemotron:", "MoE every", "MLA attention"))]
        for gpus, gbs, *steps in runs:
            for dtype, step in zip(("bf16", "fp8"), steps, strict=True):
                if step is None:  # DeepSeek-V3 ran BF16 only
                    continue
                notes = list(model_notes)
                if model == "deepseek-v3-671b":
                    layout, modules = deepseek_layout(pp), DEEPSEEK_RECOMPUTE[device]
                    notes += [f"pipeline layout {layout}", f"recompute modules {modules}", *DEEPSEEK_NOTES]
                    if device == "gb200":
                        notes.append(DEEPSEEK_BLACKWELL_NOTE)
                if device == "gb200":
                    notes.append("devices_per_node = 72-GPU NVL72 NVLink domain (4 GPUs per compute tray)")
                if dtype == "fp8":
                    notes.append("FP8 scaling recipe not stated by the README")
                if ep:
                    notes.append(f"expert tensor parallel {etp} (the README's ETP column)")
                notes += [
                    "optimizer sharding not stated by source (Megatron/NeMo default is the distributed optimizer, "
                    "ZeRO-1-like)",
                    f"step time: the README's 'Training step time (seconds per step)', lines {step_lines}; layout "
                    f"lines {layout_lines}",
                ]
                if extra and (dtype == "fp8" or "CUDA" not in extra):
                    notes.append(f"source notes: {extra}")
                suffix = "-strong" if extra == "strong scaling" else ""
                row = model_row(t)
                row.update(
                    case_id=f"dgxc2505-{model}-{dtype}-{device}-{gpus}{suffix}",
                    source_id="dgxc_benchmarking_v25.05",
                    source_url=URL + readme,
                    table=f"{readme} {device} performance (tag v25.05.05)",
                    framework=f"NeMo {container} container (NeMo 2.0 / Megatron-Core), recipe GSW 25.05",
                    confidence="A",
                    seq_len=str(seq),
                    device=device,
                    devices=str(gpus),
                    devices_per_node="72" if device == "gb200" else "8",
                    slices="1",
                    dtype=dtype,
                    tp=str(tp),
                    pp=str(pp),
                    dp=str(gpus // (tp * pp * cp)),
                    cp=str(cp),
                    ep=str(ep) if ep else "",
                    vpp=str(vp) if vp and pp > 1 else "",
                    recompute="selective" if model == "deepseek-v3-671b" else "",
                    micro_batch=str(mb),
                    global_batch=str(gbs),
                    step_time_s=f"{step:g}",
                    step_time_basis="measured",
                    reported_metric="iteration_time_s",
                    reported_value=f"{step:g}",
                    notes=" | ".join(notes),
                )
                rows.append(row)
    return rows


def main() -> None:
    transcribed_main(
        __doc__, build, OUT, ROOT, LEFT_OUT,
        lambda case_id: ["gb200" if "-gb200-" in case_id else "h100-sxm", case_id.split("-")[1]], width=48,
    )  # fmt: skip


if __name__ == "__main__":
    main()
