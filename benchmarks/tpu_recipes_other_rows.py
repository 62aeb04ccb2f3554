"""echosim on the tpu-recipes runs the validation table does not hold (issue 16): a check, not a fit.

``cases.csv`` takes 16 training log lines from Google's tpu-recipes READMEs (Trillium and v5p, MaxText). The same
repository publishes nine more MaxText runs in the same form, each README giving the recipe config it ran
(``--model_name``, printed in full as MaxText's tag has it) and one ``completed step`` log line: Llama 3.1 8B on
8 and 64 Trillium chips, Llama 3.1 70B on 256, Llama 2 70B, Mistral 7B, Mixtral 8x7B and Gemma 3 12B on one
slice, Llama 3.1 405B and DeepSeek-V3 on 512 v5p chips. They are transcribed below with the README they come
from (tpu-recipes commit c8cfe2f) and written to ``benchmarks/data/tpu_recipes_other.csv`` in ``cases.csv``'s
columns, the model columns copied from ``cases.csv`` rows of the same model where it has one. Nothing in echosim
was fitted to them; the recipe settings the rows need (remat tensors, splash blocks, vocabulary tiling, capacity
factor) are the configs' own, in ``echosim.validation.rows``.

    PYTHONPATH=. python benchmarks/tpu_recipes_other_rows.py
    PYTHONPATH=. python benchmarks/tpu_recipes_other_rows.py --build  # rewrite the CSV

Each log line is checked against itself: its chips (total_weights / (tokens/s/device x seconds)) must be the
slice's, else the row is not written. The Llama 2 70B line is from a run at 2 sequences per chip (total_weights
2,097,152 = 256 x 2 x 4096) although the config the README prints sets 3; the row takes the log's batch.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from newer_rows import model_row, transcribed_main  # noqa: E402

OUT = ROOT / "benchmarks" / "data" / "tpu_recipes_other.csv"
URL = "https://github.com/AI-Hypercomputer/tpu-recipes/blob/c8cfe2f689081d36701a101cd73a70965d80926b/training/"
#: Models cases.csv does not hold, from MaxText's model configs at tag tpu-recipes-v0.1.2 (commit 14b5876:
#: MaxText/configs/models/llama2-70b.yml, mistral-7b.yml, mixtral-8x7b.yml; no sliding window in MaxText's Mistral).
NEW_MODELS = {
    "llama2-70b": dict(arch="llama", layers="80", hidden="8192", heads="64", kv_heads="8", head_dim="128",
                       ffn_hidden="28672", vocab="32000"),
    "mistral-7b": dict(arch="llama", layers="32", hidden="4096", heads="32", kv_heads="8", head_dim="128",
                       ffn_hidden="14336", vocab="32000"),
    "mixtral-8x7b": dict(arch="moe", layers="32", hidden="4096", heads="32", kv_heads="8", head_dim="128",
                         ffn_hidden="14336", vocab="32000", experts="8", top_k="2", moe_ffn_hidden="14336",
                         shared_experts="0"),
}  # fmt: skip
#: Models cases.csv holds: the row whose model columns (and model notes) are copied.
TEMPLATES = {
    "llama3-8b": "tpurecipes-llama3-8b-bf16-v6e-128",
    "llama3-70b": "tpurecipes-llama3-70b-bf16-v6e-128",
    "llama3-405b": "tpurecipes-llama3-405b-bf16-v6e-512-x2",
    "gemma3-12b": "tpurecipes-gemma3-12b-bf16-v6e-512-x2",
    "deepseekv3": "mbridge2511-deepseekv3-w-o-mtp-bf16-gb200-256",
}
#: One entry per README: (README dir, model, device, chips, config (--model_name), MaxText tag or commit the README
#: checks out, per-device batch, seq_len, weights, remat detail, the log line's seconds, TFLOP/s/device,
#: Tokens/s/device, total_weights).
RUNS = [
    ("trillium/Llama3.1-8B-MaxText/v6e-8", "llama3-8b", "tpu-v6e", 8, "llama3_1_8b_8192_no_collective_matmul",
     "tpu-recipes-v0.1.4", 3, 8192, 3.443, 413.433, 7138.890, 196608),
    ("trillium/Llama3.1-8B-MaxText/v6e-64", "llama3-8b", "tpu-v6e", 64, "llama3_1_8b_8192_bs5",
     "tpu-recipes-v0.1.4", 5, 8192, 5.652, 419.701, 7247.111, 2621440),
    ("trillium/Llama3.1-70B-MaxText/v6e-256", "llama3-70b", "tpu-v6e", 256, "llama3_1_70b_8192",
     "tpu-recipes-v0.1.4", 5, 8192, 42.656, 462.297, 960.248, 10485760),
    ("trillium/Llama2-70B-MaxText", "llama2-70b", "tpu-v6e", 256, "llama2_70b_4096_sc",
     "tpu-recipes-v0.1.2", 2, 4096, 9.052, 402.274, 905.021, 2097152),
    ("trillium/Mistral-7B-MaxText", "mistral-7b", "tpu-v6e", 8, "mistral_7b",
     "tpu-recipes-v0.1.2", 6, 8192, 6.320, 431.981, 7776.813, 393216),
    ("trillium/Mixtral-8x7B-MaxText", "mixtral-8x7b", "tpu-v6e", 256, "mixtral_8x7b_dropped",
     "tpu-recipes-v0.1.2", 12, 4096, 13.484, 302.311, 3645.203, 12582912),
    ("trillium/Gemma3-12B-MaxText/v6e-256", "gemma3-12b", "tpu-v6e", 256, "gemma3_12b_32768_v6e256",
     "tpu-recipes-v0.1.5", 1, 32768, 7.318, 349.442, 4477.768, 8388608),
    ("v5p/Llama3.1-405B-MaxText", "llama3-405b", "tpu-v5p", 512, "llama3_1_405b_8192_v5p_1024",
     "commit 3eb77db", 2, 8192, 131.474, 314.530, 124.618, 8388608),
    ("v5p/DeepSeek3-671B-MaxText", "deepseekv3", "tpu-v5p", 512, "deepseek3_671b_v5p_1024",
     "commit 3eb77db", 6, 8192, 90.668, 152.415, 542.108, 25165824),
]  # fmt: skip
#: Peak bf16 TFLOP/s per chip, for the mfu the notes carry (as cases.csv's tpu_recipes rows: Trillium 918, v5p 459).
PEAK_TFLOPS = {"tpu-v6e": 918, "tpu-v5p": 459}
LEFT_OUT = (
    "training/ironwood/README.md (13 runs on TPU7x): echosim has no Ironwood backend",
    "training/archive/trillium/*-PyTorch (PyTorch/XLA): an average step time with no layout beyond the model; "
    "echosim has no PyTorch/XLA framework entry",
    "training/v5p/Llama2-7B-Maxtext, Mixtral-8X7B-Maxtext: no step time in the README",
    "diffusion recipes (Diffusion-2, SDXL, Wan 2.1): not in echosim's zoo",
)


def build(cases: Path) -> list[dict[str, str]]:
    templates = {r["case_id"]: r for r in csv.DictReader(cases.open())}
    header = list(next(iter(templates.values())))
    rows: list[dict[str, str]] = []
    for readme, model, device, chips, config, tag, per_chip, seq, secs, tflops, tokens, weights in RUNS:
        derived_chips = weights / (tokens * secs)
        if abs(derived_chips - chips) > 0.01 * chips or weights != chips * per_chip * seq:
            raise SystemExit(f"{readme}: the log line gives {derived_chips:.1f} chips, {weights} tokens a step")
        if model in NEW_MODELS:
            row = {**dict.fromkeys(header, ""), **NEW_MODELS[model]}
            model_notes: list[str] = []
        else:
            t = templates[TEMPLATES[model]]
            row = model_row(t)
            model_notes = [n for n in t["notes"].split(" | ") if n.startswith(("MLA attention", "5:1 local"))]
        notes = [
            *model_notes,
            f"source mesh: fsdp={chips}, dp over DCN/slices=1",
            "MaxText remat_policy=" + ("qkv_proj_offloaded" if config == "llama2_70b_4096_sc" else "custom"),
            f"metrics: step_time_s={secs:g}; tokens_per_s_per_device={tokens:g}; "
            f"model_tflops_per_s_per_device={tflops:g}; mfu={tflops / PEAK_TFLOPS[device]:.4f}",
            f"source notes: config {config} (MaxText {tag}, printed in the README); the README's 'completed step' "
            f"log line. Chips check from total_weights/(tok/s*step): {derived_chips:.1f}",
        ]
        if config == "llama2_70b_4096_sc":
            notes.append("per-device batch 2 from the log line's total_weights (the printed config sets 3)")
        if model == "gemma3-12b":
            notes.append("5:1 local(1024 window):global attention")
        row.update(
            case_id=f"tpurecipes-{model}-bf16-{device.removeprefix('tpu-')}-{chips}",
            source_id="tpu_recipes_other",
            source_url=URL + readme + "/README.md",
            table="README (training log line)",
            framework="MaxText (JAX/XLA)",
            confidence="B" if config == "llama2_70b_4096_sc" else "A",
            seq_len=str(seq),
            device=device,
            devices=str(chips),
            devices_per_node="4",
            slices="1",
            dtype="bf16",
            tp="1",
            pp="1",
            dp=str(chips),
            cp="1",
            ep="1",
            zero="3",
            recompute="selective",
            micro_batch=str(per_chip),
            global_batch=str(per_chip * chips),
            step_time_s=f"{secs:g}",
            step_time_basis="measured",
            reported_metric="tflops_per_device",
            reported_value=f"{tflops:g}",
            notes=" | ".join(notes),
        )
        rows.append(row)
    return rows


def main() -> None:
    transcribed_main(__doc__, build, OUT, ROOT, LEFT_OUT, lambda case_id: ["v5p" if "-v5p-" in case_id else "v6e"], 44)


if __name__ == "__main__":
    main()
