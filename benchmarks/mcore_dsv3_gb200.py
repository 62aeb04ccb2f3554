"""echosim on Megatron-Core's DeepSeek-V3 GB200 optimisation guide (issue 16): a check, not a fit.

NVIDIA's Megatron-LM team published how they took DeepSeek-V3 pre-training on 256 GB200 GPUs (MXFP8) from 494 to
970 TFLOP/s per GPU on one fixed layout (TP 1, PP 8, VPP 4, EP 32, MBS 1, GBS 2048, sequence 4096), with the
TFLOP/s after each of 13 software changes (``docs/discussions/deepseek-v3-gb200-optimization/
deepseek-v3-gb200-optimization.md``, Megatron-LM commit 1d9edcf, section 3) and the final run's full command line
(``deepseek-v3-gb200-reproduce-guide.md``, commit 32ea0af: Megatron-Core dev effebd8, TE 2.9 + PRs, cuDNN 9.14).

The final run is written to ``benchmarks/data/mcore_dsv3_gb200.csv`` in ``cases.csv``'s columns (model columns from
``cases.csv``'s DeepSeek-V3 rows) and checked like the other published runs ``cases.csv`` lacks. The earlier 12
stages ran the same layout with more host overhead (the guide's own diagnosis: kernel launches the CPU cannot keep up
with), which echosim does not price; they are printed against echosim's GPU-side step as a reading, not checked.

TFLOP/s converts to a step time with Megatron-LM's own FLOP count (``num_floating_point_operations`` in
``megatron/training/training.py`` at the guide's commit effebd8): :func:`megatron_flops_per_token`.

    PYTHONPATH=. python benchmarks/mcore_dsv3_gb200.py
    PYTHONPATH=. python benchmarks/mcore_dsv3_gb200.py --build  # rewrite the CSV
"""

from __future__ import annotations

import csv
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from newer_rows import model_row, transcribed_main  # noqa: E402

OUT = ROOT / "benchmarks" / "data" / "mcore_dsv3_gb200.csv"
GUIDE = (
    "https://github.com/NVIDIA/Megatron-LM/blob/1d9edcf8c7c16c66ca6acc3801265b21588116a3/docs/discussions/"
    "deepseek-v3-gb200-optimization/deepseek-v3-gb200-optimization.md"
)
REPRODUCE = (
    "https://github.com/NVIDIA/Megatron-LM/blob/32ea0afdbf6bd87380a8cb0b9eafb4eda18a9fd9/docs/discussions/"
    "deepseek-v3-gb200-optimization/deepseek-v3-gb200-reproduce-guide.md"
)
#: The cases.csv row whose model columns (DeepSeek-V3, no MTP) the row copies.
TEMPLATE = "mbridge2511-deepseekv3-w-o-mtp-mxfp8-gb200-256"
GPUS, GBS, MBS, SEQ, TP, PP, VPP, EP = 256, 2048, 1, 4096, 1, 8, 4, 32
#: The guide's section 3 table: (change, token dispatcher, TFLOP/s per GPU), in the order they were made.
HISTORY = [
    ("baseline", "alltoall", 494.46),
    ("fuse torch.zeros for scaling factors, permute kernel", "alltoall", 529.55),
    ("router fusion", "alltoall", 540.00),
    ("DeepEP", "deepep", 566.07),
    ("remove up_proj recompute", "deepep", 610.71),
    ("CUDA graphs", "deepep", 663.27),
    ("tune DeepEP", "deepep", 691.49),
    ("CPU-side optimisation", "deepep", 762.12),
    ("PDL for quantisation, fused swizzle", "deepep", 797.67),
    ("CUDA graphs capture shared expert", "deepep", 829.93),
    ("HybridEP", "hybridep", 943.56),
    ("CPU-side optimisation", "hybridep", 956.21),
    ("fuse quantisation into normalisation", "hybridep", 970.01),
]
#: Stages before "remove up_proj recompute" recompute the MLA up projection (``--recompute-modules mlp up_proj``),
#: the later ones the MoE activation (``mlp moe_act``); ``mlp`` recomputes the 3 dense layers' MLP.
UP_PROJ_STAGES = 4


def megatron_flops_per_token(
    layers: int = 61,
    dense_layers: int = 3,
    hidden: int = 7168,
    ffn: int = 18432,
    moe_ffn: int = 2048,
    top_k: int = 8,
    shared_ffn: int = 2048,
    heads: int = 128,
    q_lora: int = 1536,
    kv_lora: int = 512,
    qk_head: int = 128,
    qk_rope: int = 64,
    v_head: int = 128,
    vocab: int = 129280,
    seq: int = SEQ,
    mtp: int = 0,
) -> float:
    """Megatron-LM's training FLOPs per token of an MLA + MoE model with SwiGLU (3 x forward, 2 per MAC, causal
    attention scores halved), as ``num_floating_point_operations`` counts them at commit effebd8. ``mtp`` MTP modules
    add a MoE layer, their two norms and projection, and a logit each. DeepSeek-V3 by default."""
    per_mac = 3 * 2
    mlp = hidden * 3 * (ffn * dense_layers + (moe_ffn * top_k + shared_ffn) * (layers - dense_layers + mtp))
    q = q_lora * (hidden + heads * (qk_head + qk_rope) + 1)
    kv = kv_lora * (hidden + heads * (qk_head + v_head) + 1) + hidden * qk_rope
    attention = (q + kv + heads * v_head * hidden + seq * heads * (qk_head + qk_rope + v_head) / 2) * (layers + mtp)
    mtp_extra = mtp * (3 * hidden + 2 * hidden * hidden)
    logits = hidden * vocab * (mtp + 1)
    return per_mac * (mlp + attention + mtp_extra + logits)


def step_time_s(tflops: float) -> float:
    """The step time a stage's TFLOP/s per GPU stands for (Megatron-LM's FLOP count, no MTP)."""
    return GBS * SEQ * megatron_flops_per_token() / (tflops * 1e12 * GPUS)


def build(cases: Path) -> list[dict[str, str]]:
    templates = {r["case_id"]: r for r in csv.DictReader(cases.open())}
    t = templates[TEMPLATE]
    row = model_row(t)
    tflops = HISTORY[-1][2]
    notes = [n for n in t["notes"].split(" | ") if n.startswith("MLA attention")]
    notes += [
        "w/o MTP (the launch command passes no --mtp-num-layers)",
        "pipeline layout Et|(tt|)*30L",
        "recompute modules moe_act,mlp",
        "--cross-entropy-fusion-impl te",
        "devices_per_node = 32: the guide places every 32 GPUs (8 compute trays) in one NVL72 rack, EP 32 inside it",
        "dispatcher HybridEP (flex), 32 SMs; partial CUDA graphs (attn, moe_router, moe_preprocess); "
        "--use-distributed-optimizer; MoE force-balanced (--moe-router-force-load-balancing)",
        f"step_time from global_batch*seq_len*{megatron_flops_per_token():.6g} FLOPs/token (Megatron-LM "
        "num_floating_point_operations at effebd8)/(tflops_per_gpu*devices)",
        f"metrics: tflops_per_gpu={tflops} (model); the guide's section 3 table, last row",
        f"source notes: launch command {REPRODUCE}",
    ]
    row.update(
        case_id="mcore-dsv3-guide-mxfp8-gb200-256",
        source_id="mcore_dsv3_gb200_guide",
        source_url=GUIDE,
        table="3. Summary and Outlook (optimisation history), last row",
        framework="Megatron-LM (Megatron-Core dev effebd8, Transformer Engine 2.9)",
        confidence="A",
        seq_len=str(SEQ),
        device="gb200",
        devices=str(GPUS),
        devices_per_node="32",
        slices="1",
        dtype="mxfp8",
        tp=str(TP),
        pp=str(PP),
        dp=str(GPUS // (TP * PP)),
        cp="1",
        ep=str(EP),
        vpp=str(VPP),
        sp="",  # --sequence-parallel is passed, but a no-op at TP 1
        zero="1",
        recompute="selective",
        micro_batch=str(MBS),
        global_batch=str(GBS),
        step_time_s=f"{step_time_s(tflops):.6g}",
        step_time_basis="tflops_per_gpu",
        reported_metric="tflops_per_gpu",
        reported_value=str(tflops),
        notes=" | ".join(notes),
    )
    return [row]


def history() -> list[tuple[str, float, float, float]]:
    """(change, TFLOP/s, step s, step / echosim's) for every stage; echosim's step recomputes and dispatches as
    that stage did."""
    from echosim.compiler import compile as compile_model
    from echosim.validation.cases import read_cases
    from echosim.validation.rows import row_model, row_plan

    case = read_cases(OUT)[0]
    plan, cluster = row_plan(case)
    model = row_model(case)
    steps: dict[tuple[str, str], float] = {}
    out = []
    for i, (change, dispatcher, tflops) in enumerate(HISTORY):
        recompute = "selective:mla_up_proj,mlp" if i < UP_PROJ_STAGES else plan.recompute
        key = (recompute, dispatcher)
        if key not in steps:
            steps[key] = compile_model(model, replace(plan, recompute=recompute, moe_dispatcher=dispatcher),
                                       cluster).step_time_s  # fmt: skip
        step = step_time_s(tflops)
        out.append((change, tflops, step, step / steps[key]))
    return out


def main() -> None:
    transcribed_main(__doc__, build, OUT, ROOT, (), lambda case_id: ["guide"])
    if "--build" in sys.argv:
        return
    print(f"\n{'stage':52s} {'TFLOP/s':>8s} {'step s':>7s} {'/ echosim':>9s}")
    for change, tflops, step, ratio in history():
        print(f"{change:52s} {tflops:8.2f} {step:7.3f} {ratio:9.2f}")


if __name__ == "__main__":
    main()
