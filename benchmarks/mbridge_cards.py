"""echosim on Megatron-Bridge's model verification cards (issue 16): a check, not a fit.

Megatron-Bridge keeps a verification card per model (``examples/model_verification_cards/<model>/card.yaml``,
commit 067f987). A card's ``pretrain_performance`` items run the canonical performance recipe for 50 steps on mock
data and record the average step time, model TFLOP/s and tokens/s per GPU of steps 41-50, with the recipe, the
node count and the date. Most of them repeat rows of the performance summary (``mbridge_newer_releases.py`` holds
those). Three do not, and they are transcribed here:

* Qwen3-30B-A3B on 16 H100 in BF16 (``qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config``);
* DeepSeek-V3 on 1,024 H100 in BF16 (``deepseek_v3_pretrain_1024gpu_h100_bf16_config``);
* GPT-OSS 120B on 64 GB200 in BF16 (``gpt_oss_120b_pretrain_64gpu_gb200_bf16_config``).

Their settings come from those recipes (``src/megatron/bridge/perf_recipes/{qwen/h100/qwen3_moe.py,
deepseek/h100/deepseek_v3.py, gpt_oss/gb200/gpt_oss.py}`` and the recipes they start from, commit 067f987). The rows
run under ``megatron_bridge_cards`` (:data:`echosim.validation.rows.MEGATRON_BRIDGE_MOE_PRESETS`). The model columns
are copied from ``cases.csv`` rows of the same models. Nothing in echosim was fitted to them.

    PYTHONPATH=. python benchmarks/mbridge_cards.py
    PYTHONPATH=. python benchmarks/mbridge_cards.py --build  # rewrite the CSV
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from newer_rows import model_row, transcribed_main  # noqa: E402

OUT = ROOT / "benchmarks" / "data" / "mbridge_cards.csv"
COMMIT = "067f987df03b8355b03192d88d70f1709fedf51a"
CARDS = f"https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/{COMMIT}/examples/model_verification_cards"
#: (card, device, recipe, template cases.csv row, GPUs, dtype, tp, pp, vpp, ep, micro-batch, global batch, seq,
#: step ms, model TFLOP/s per GPU, tokens/s per GPU, last verified, what the recipe sets beyond the layout).
CARD_ROWS = [
    ("qwen3-30b-a3b", "h100-sxm", "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config",
     "mbridge2511-qwen3-30b-a3b-fp8-h100-sxm-16",
     16, "bf16", 1, 1, 1, 16, 1, 1024, 4096, 20147.290, 299.352, 13011.378, "2026-07-27",
     "HybridEP (flex), EP communication overlap (delay_wgrad_compute off), no recompute, CUDA graphs of moe_router "
     "and moe_preprocess"),
    ("deepseek-v3", "h100-sxm", "deepseek_v3_pretrain_1024gpu_h100_bf16_config",
     "mbridge2511-deepseekv3-w-mtp-mxfp8-b200-256",
     1024, "bf16", 2, 8, 4, 64, 1, 16384, 4096, 61756.130, 276.030, 1061.206, "2026-08-15",
     "HybridEP (flex), one MTP layer, pipeline layout Et|(tt|)*30mL, recompute mla_up_proj and mlp, sequence "
     "parallel, overlap_grad_reduce off"),
    ("gpt-oss-120b", "gb200", "gpt_oss_120b_pretrain_64gpu_gb200_bf16_config",
     "mbridge2511-gpt-oss-120b-bf16-gb200-64",
     64, "bf16", 1, 1, 1, 64, 4, 1280, 4096, 4995.630, 535.230, 16398.332, "2026-08-17",
     "alltoall dispatcher, EP communication overlap with delay_wgrad_compute, recompute layernorm and moe_act"),
]  # fmt: skip
SYSTEM = {"h100-sxm": "H100", "gb200": "GB200"}
LEFT_OUT = (
    "the cards' pretrain_performance items that repeat a performance-summary row (DeepSeek-V3, Qwen3-30B-A3B and "
    "Qwen3-235B-A22B on GB200 / GB300, GPT-OSS 120B on GB300): benchmarks/mbridge_newer_releases.py checks those",
    "models cases.csv has no row of (DeepSeek-V4, GLM-5, Nemotron 3, Moonlight, Gemma 4)",
    "the functional items (pretrain, sft, peft, checkpoint_resume): small mock-data runs, not performance recipes",
)
NVL72 = "devices_per_node = 72-GPU NVL72 NVLink domain (4 GPUs per compute tray)"
_MODEL_NOTES = ("MLA attention", "gpt-oss", "MoE", "Qwen3")


def build(cases: Path) -> list[dict[str, str]]:
    templates = {r["case_id"]: r for r in csv.DictReader(cases.open())}
    rows: list[dict[str, str]] = []
    for (card, device, recipe, template, gpus, dtype, tp, pp, vpp, ep, mbs, gbs, seq, step_ms, tflops, tokens, day,
         settings) in CARD_ROWS:  # fmt: skip
        if abs(gbs * seq / (tokens * gpus) - step_ms / 1e3) > 2e-3 * step_ms / 1e3:
            raise SystemExit(f"{card} {device}: tokens/s per GPU {tokens} does not give the step {step_ms} ms")
        t = templates[template]
        row = model_row(t)
        notes = [n for n in t["notes"].split(" | ") if n.startswith(_MODEL_NOTES)]
        if device == "gb200":
            notes.append(NVL72)
        notes += [
            "optimizer sharding: the distributed optimizer (ZeRO-1), Megatron-Bridge's default",
            f"recipe {recipe}: {settings}",
            f"metrics: step_time_ms={step_ms}; tflops_per_gpu={tflops} (model); tokens_per_s_per_gpu={tokens}",
            f"source notes: card.yaml pretrain_performance.{SYSTEM[device]}, steps 41-50 of 50, last verified {day}",
            "EP is carved out of DP (Megatron convention). MoE benchmarks force-balance tokens across experts",
        ]
        row.update(
            case_id=f"mbridgecard-{card}-{dtype}-{device}-{gpus}",
            source_id="megatron_bridge_cards",
            source_url=f"{CARDS}/{card}/card.yaml",
            table=f"pretrain_performance.{SYSTEM[device]}",
            framework=f"Megatron-Bridge / Megatron-Core (model verification card, {recipe})",
            confidence="A",
            seq_len=str(seq),
            device=device,
            devices=str(gpus),
            devices_per_node="72" if device == "gb200" else "8",
            slices="1",
            dtype=dtype,
            tp=str(tp),
            pp=str(pp),
            dp=str(gpus // (tp * pp)),
            cp="1",
            ep=str(ep),
            vpp=str(vpp) if vpp > 1 else "",
            sp="1" if tp > 1 else "",
            micro_batch=str(mbs),
            global_batch=str(gbs),
            step_time_s=f"{step_ms / 1e3:.6g}",
            step_time_basis="measured",
            reported_metric="step_time_ms",
            reported_value=str(step_ms),
            notes=" | ".join(notes),
        )
        rows.append(row)
    return rows


def main() -> None:
    transcribed_main(__doc__, build, OUT, ROOT, LEFT_OUT, group)


def group(case_id: str) -> list[str]:
    """The row's device: 'h100-sxm' or 'gb200'."""
    return [next(d for d in SYSTEM if f"-{d}-" in case_id)]


if __name__ == "__main__":
    main()
