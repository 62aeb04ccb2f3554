"""What to compile for a row: its model, its Plan and Cluster, and why it cannot be compiled yet.

A row states an architecture, a device and a layout; blank cells take the defaults of the
framework the source used (named in each function here), never a value fitted to the
published time. :func:`unsupported` names what a row needs that echosim does not model,
so the row is skipped with that reason instead of compiled wrongly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from echosim.backends.topology import fill_domains
from echosim.validation.cases import ARCHES, DTYPES, Case, backend_for

#: Backends whose node (``devices_per_node``) is an ICI slice, not a host (cases.csv gives hosts).
SLICE_BACKENDS = ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e")
#: Devices with fp8 tensor cores: a blank dtype there could be 16-bit or fp8, so the row is not guessed.
FP8_BACKENDS = ("h100-sxm", "h100-96gb", "h800", "h200", "b200", "gb200", "b300", "gb300", "mi300x")


def unsupported(c: Case, registry: Any = None) -> str:
    """Why a row cannot be expressed yet ('' if it can); layout features are judged by Plan."""
    if reason := ARCHES[c["arch"]]:
        return reason
    if c["arch"] == "moe" and not (c.int("experts", 0) and c.int("top_k", 0)):
        return "column(s) 'experts', 'top_k' blank (a moe row needs its routed experts)"
    if reason := DTYPES[c["dtype"]]:
        return reason
    backend = backend_for(c["device"])
    if backend is None:
        return f"no backend for device {c['device']!r} yet"
    if registry is not None and backend not in registry.backends:
        return f"backend {backend!r} is not installed"
    if not c["dtype"] and backend in FP8_BACKENDS and not _framework_default(c, "dtype"):
        return "dtype blank on an fp8-capable device (16-bit or fp8 is not stated; the framework has no default)"
    stated = ("layers", "hidden", "heads", "seq_len", "devices", "global_batch")
    blank = [col for col in stated if c.numbers[col] is None]
    if c.numbers["vocab"] is None and _vocab(c) is None:
        blank.append("vocab")
    if c.numbers["dp"] is None and _derived_dp(c) is None:
        blank.append("dp")
    if blank:
        return f"column(s) {', '.join(map(repr, blank))} blank (not given by the source)"
    return ""


def _framework(c: Case) -> Any:
    from echosim.frameworks import framework_named_in, get_framework

    return get_framework(framework_named_in(c["framework"]))


def _framework_default(c: Case, field: str) -> Any:
    """The row's framework's default for a Plan setting (``None``: it has none)."""
    return next((d.value for d in _framework(c).defaults if d.field == field), None)


def _vocab(c: Case) -> int | None:
    """The row's embedding rows: its ``vocab``, else its framework's default tokenizer padded the
    framework's way (:meth:`echosim.frameworks.Framework.padded_vocab`); ``None`` when neither."""
    if stated := c.int("vocab"):
        return stated
    framework = _framework(c)
    default = framework.model_default("vocab", c["arch"])
    return None if default is None else framework.padded_vocab(default.value, c.int("tp", 1) or 1)


def _derived_dp(c: Case) -> int | None:
    """``dp``, else ``devices / (tp * pp * cp)`` (the README's definition of the column)."""
    if stated := c.int("dp"):
        return stated
    devices = c.int("devices")
    other = (c.int("tp", 1) or 1) * (c.int("pp", 1) or 1) * (c.int("cp", 1) or 1)
    return devices // other if devices and devices % other == 0 else None


#: MaxText trains without dropout: base.yml sets ``dropout_rate: 0.0`` and gpt3-175b.yml ``enable_dropout: False``
#: (MaxText/configs, tag tpu-recipes-v0.1.2 and commit 81e1d96, the v5p GPT-3 script's), so its GPT rows draw no
#: dropout masks where the other frameworks' GPT rows keep GPT-3's 0.1.
MAXTEXT_DROPOUT = 0.0


def row_model(c: Case) -> Any:
    from echosim.frontend.zoo import ArchConfig

    gpt = c["arch"] == "gpt"
    return ArchConfig(
        arch=c["arch"],
        layers=c.int("layers") or 0,
        hidden=c.int("hidden") or 0,
        heads=c.int("heads") or 0,
        vocab=_vocab(c) or 0,
        ffn=c.int("ffn_hidden", 0) or 0,
        kv_heads=c.int("kv_heads", 0) or 0,
        head_dim=c.int("head_dim", 0) or 0,
        seq_len=c.int("seq_len") or 0,
        dropout=(MAXTEXT_DROPOUT if is_maxtext(c) else 0.1) if gpt else 0.0,
        tied_embeddings=gpt,
        **_experts(c),
        **_latent_attention(c),
        **_local_attention(c),
    )


#: Models with sliding-window (local) attention layers, by (layers, hidden, heads, head_dim) -> (window in
#: keys, global_layer_step: every step-th layer is global; :attr:`echosim.frontend.zoo.ArchConfig.sliding_window`).
#: cases.csv has no column for it (its notes name the pattern). Gemma 3 12B: ``sliding_window_size: 1024``
#: (MaxText src/maxtext/configs/models/gemma3-12b.yml, commit e591f30) with five local layers to one global
#: (MaxText src/maxtext/models/gemma3.py ``GEMMA3_ATTENTION_PATTERN``; HF google/gemma-3-12b-pt config.json
#: ``sliding_window`` 1024, ``sliding_window_pattern`` 6; arXiv:2503.19786 sec. 2.1). gpt-oss-120b:
#: ``sliding_window`` 128 with ``layer_types`` alternating sliding_attention / full_attention from layer 0
#: (HF openai/gpt-oss-120b config.json; arXiv:2508.10925 sec. 2.1).
#: Gemma 3's pattern folds six layers into one repeated block; the memory model counts the layer inputs
#: MaxText's remat policy keeps and the recompute working set per layer inside it (Graph.block_layers).
SLIDING_WINDOW: dict[tuple[int, int, int, int], tuple[int, int]] = {
    (48, 3840, 16, 256): (1024, 6),  # gemma3-12b
    (36, 2880, 64, 64): (128, 2),  # gpt-oss-120b
}


def _local_attention(c: Case) -> dict[str, int]:
    """The sliding window and global-layer step of a row's model (:data:`SLIDING_WINDOW`), if it has one."""
    key = tuple(c.int(k) or 0 for k in ("layers", "hidden", "heads", "head_dim"))
    found = SLIDING_WINDOW.get(key)  # type: ignore[arg-type]
    if found is None or c["arch"] == "gpt":
        return {}
    return {"sliding_window": found[0], "global_layer_step": found[1]}


#: Models whose MoE layers alternate with dense ones, by (layers, hidden, experts, top_k) -> the MoE layer
#: step (:attr:`echosim.frontend.zoo.ArchConfig.moe_layer_step`): cases.csv has no column for it and its
#: ``ffn_hidden`` is then the dense layers' width. Llama 4 Maverick: ``interleave_moe_layer_step: 2``
#: with ``base_mlp_dim: 16384`` (MaxText src/maxtext/configs/models/llama4-17b-128e.yml lines 25 and 37,
#: commit e591f30; HF Llama-4-Maverick-17B-128E config.json ``interleave_moe_layer_step`` 2,
#: ``intermediate_size_mlp`` 16384). Llama 4 Scout (16 experts) has step 1.
MOE_LAYER_STEP: dict[tuple[int, int, int, int], int] = {(48, 5120, 128, 1): 2}
#: Models whose first layers keep a dense MLP of width ``ffn_hidden``, by (layers, hidden, experts, top_k)
#: (:attr:`echosim.frontend.zoo.ArchConfig.dense_layers`); cases.csv has no column for them (a row that gives no
#: ``ffn_hidden`` keeps every layer MoE). DeepSeek-V3: the first 3 of 61 (arXiv:2412.19437 sec. 4.2, "we substitute
#: all FFNs except for the first three layers with MoE layers"; HF deepseek-ai/DeepSeek-V3 config.json
#: ``first_k_dense_replace`` 3, ``intermediate_size`` 18432), which gives its published 671B parameters (61 MoE
#: layers would give 704B). DeepSeek-V2: the first of 60 (arXiv:2405.04434 sec. 3.1, "all FFNs except for the
#: first layer"). Kimi K2: the first of 61 (HF moonshotai/Kimi-K2-Instruct config.json ``first_k_dense_replace`` 1).
#: GLM-4.5 and GLM-4.5-Air: 3 of 92 and 1 of 46 (HF zai-org/GLM-4.5, GLM-4.5-Air config.json
#: ``first_k_dense_replace``; slime's scripts/models/glm4.5-355B-A32B.sh, ``--moe-layer-freq [0]*3+[1]*89``, in
#: the zyzshishui/slime copy of THUDM/slime).
DENSE_FIRST_LAYERS: dict[tuple[int, int, int, int], int] = {
    (61, 7168, 256, 8): 3,  # DeepSeek-V3
    (60, 5120, 160, 6): 1,  # DeepSeek-V2
    (61, 7168, 384, 8): 1,  # Kimi K2
    (92, 5120, 160, 8): 3,  # GLM-4.5
    (46, 4096, 128, 8): 1,  # GLM-4.5-Air
}


#: DeepSeek's MLA sizes (DeepSeek-V2, arXiv:2405.04434 sec. 3.1.2: d_h^R = d_h / 2, d_c = 4 d_h,
#: d_c' = 1536; DeepSeek-V3, arXiv:2412.19437 sec. 4.2 keeps them): the query/key head is
#: d_h + d_h^R, so a row's head_dim gives d_h = 2/3 head_dim, the value head d_h.
MLA_Q_LORA_RANK = 1536
MLA_KV_LORA_PER_HEAD_DIM = 4


def is_latent_attention(c: Case) -> bool:
    """MLA rows: cases.csv leaves ``kv_heads`` blank for multi-head latent attention (its README)
    and states the query/key ``head_dim``, which is not hidden / heads (MLA's heads are wider than
    the model: 128 x 192 over 7168); a gpt row is multi-head attention by definition."""
    head_dim, heads, hidden = c.int("head_dim") or 0, c.int("heads") or 0, c.int("hidden") or 0
    return c["arch"] != "gpt" and c.int("kv_heads") is None and head_dim > 0 and head_dim * heads != hidden


def _latent_attention(c: Case) -> dict[str, int]:
    """MLA's latent sizes derived from ``head_dim`` by DeepSeek's rules (above). Dense first layers
    (DeepSeek-V3: 3) are not a column: every layer is a MoE layer, which costs the same FLOPs
    (DeepSeek sizes the dense FFN as the active experts': 18432 = (8 + 1) x 2048)."""
    if not is_latent_attention(c):
        return {}
    head_dim = c.int("head_dim") or 0
    d_h = 2 * head_dim // 3
    return {
        "kv_lora_rank": MLA_KV_LORA_PER_HEAD_DIM * d_h,
        "q_lora_rank": MLA_Q_LORA_RANK,
        "rope_head_dim": head_dim - d_h,
        "v_head_dim": d_h,
    }


def _experts(c: Case) -> dict[str, int]:
    """Routed-expert fields of a ``moe`` row (the zoo's llama-style MoE block)."""
    if c["arch"] != "moe":
        return {}
    model = _moe_model(c)
    experts, top_k = model[2], model[3]
    step = MOE_LAYER_STEP.get(model, 1)
    return {
        "experts": experts,
        "top_k": top_k,
        "moe_ffn": c.int("moe_ffn_hidden", 0) or 0,
        "shared_experts": c.int("shared_experts", 0) or 0,
        **({"moe_layer_step": step} if step > 1 else {}),
        **({"dense_layers": dense} if (dense := DENSE_FIRST_LAYERS.get(model, 0)) and c.int("ffn_hidden", 0) else {}),
        **({"mtp_layers": mtp} if (mtp := mtp_layers(c)) else {}),
        **_zoo_expert_mlp(model),
    }


def _zoo_expert_mlp(model: tuple[int, int, int, int]) -> dict[str, Any]:
    """The experts' SwiGLU clamp and biases of the zoo model with this (layers, hidden, experts, top_k), where it
    has them (gpt-oss-120b: :attr:`echosim.frontend.zoo.ArchConfig.expert_clamp` and ``expert_bias``, with
    their sources there): a row of that model runs the same expert MLP."""
    from echosim.frontend.zoo import ZOO

    for cfg in ZOO.values():
        if (cfg.layers, cfg.hidden, cfg.experts, cfg.top_k) == model:
            return {
                **({"expert_clamp": cfg.expert_clamp} if cfg.expert_clamp else {}),
                **({"expert_bias": True} if cfg.expert_bias else {}),
            }
    return {}


#: Multi-token-prediction depth of the models trained with it, by (layers, hidden, experts, top_k):
#: :attr:`echosim.frontend.zoo.ArchConfig.mtp_layers`. DeepSeek-V3 trains with one MTP module (arXiv:2412.19437
#: sec. 2.2 and sec. 4.2, MTP depth D = 1); Megatron-Bridge's DeepSeek-V3 pretrain recipe defaults to
#: ``mtp_num_layers=1`` in every release with MoE rows (src/megatron/bridge/recipes/deepseek/deepseek_v3.py:
#: v0.1.0rc4 line 51, v0.2.0 line 174, v0.3.0 line 198, v0.3.1 / v0.4.0 / v0.4.1 line 84), and the performance
#: scripts keep it (the H100 layout "Et|(tt|)*30mL" holds its ``m``). A row whose source names a variant
#: without it ("w/o MTP" in its notes: Megatron-Bridge 25.11's DeepSeekV3 rows) runs none.
MTP_LAYERS: dict[tuple[int, int, int, int], int] = {
    (61, 7168, 256, 8): 1,  # DeepSeek-V3 (671B)
}


def _moe_model(c: Case) -> tuple[int, int, int, int]:
    """The (layers, hidden, experts, top_k) key the per-model MoE tables (MTP_LAYERS, MOE_ROUTER_GROUPS) use."""
    layers, hidden, experts, top_k = (c.int(k) or 0 for k in ("layers", "hidden", "experts", "top_k"))
    return layers, hidden, experts, top_k


def mtp_layers(c: Case) -> int:
    """Multi-token-prediction modules the row's run trained with (:data:`MTP_LAYERS`); 0 when none."""
    model = _moe_model(c)
    if c["arch"] != "moe" or "w/o MTP" in c["notes"]:
        return 0
    return MTP_LAYERS.get(model, 0)


def is_maxtext(c: Case) -> bool:
    from echosim.frameworks import framework_named_in

    return framework_named_in(c["framework"]) == "maxtext"


#: torchtitan splits a data-parallel rank's batch (``training.batch_size``) into as many pipeline
#: micro-batches as there are stages unless ``experimental.pipeline_parallel_microbatches`` is set:
#: ``n_microbatches = ... or job_config.experimental.pipeline_parallel_degree``
#: (torchtitan/parallelisms/pipelining_utils.py and pipeline_llama.py, commit 9dec370, the one its
#: 2024-12 benchmarks name).
TORCHTITAN_PP_MICROBATCHES = "pipeline_parallel_degree"


def torchtitan_pp_micro_batch(c: Case) -> int | None:
    """A torchtitan pipeline row's micro-batch when the row leaves it blank: the rank's batch over pp.

    None when the row is not torchtitan, not pipelined, or its batch does not divide.
    """
    from echosim.frameworks import framework_named_in

    pp = c.int("pp", 1) or 1
    if pp <= 1 or not framework_named_in(c["framework"]).startswith("torchtitan"):
        return None
    dp, global_batch = _derived_dp(c), c.int("global_batch")
    if not dp or not global_batch or global_batch % (dp * pp):
        return None
    return global_batch // (dp * pp)


#: Virtual stages per rank torchtitan builds for a looped (multi-stage) schedule when the run gives no
#: ``experimental.pipeline_parallel_split_points``: generate_split_points sets ``num_stages_per_rank = 2``
#: for a ``PipelineScheduleMulti`` (Interleaved1F1B, ...) and 1 for a single-stage one (1F1B, GPipe), then
#: splits the layers over ``pp * 2`` stages (torchtitan/parallelisms/pipelining_utils.py, commit 9dec370).
TORCHTITAN_LOOPED_STAGES_PER_RANK = 2
_LOOPED_SCHEDULE = re.compile(r"schedule (Interleaved ?1F1B|InterleavedZeroBubble|LoopedBFS|ZBVZeroBubble)", re.I)


def torchtitan_vpp(c: Case) -> int | None:
    """A torchtitan pipeline row's virtual stages per rank when it leaves ``vpp`` blank and its notes name a
    looped schedule: torchtitan's default split (:data:`TORCHTITAN_LOOPED_STAGES_PER_RANK`); None otherwise."""
    from echosim.frameworks import framework_named_in

    if c["vpp"].strip() or (c.int("pp", 1) or 1) <= 1:
        return None
    if not framework_named_in(c["framework"]).startswith("torchtitan") or not _LOOPED_SCHEDULE.search(c["notes"]):
        return None
    return TORCHTITAN_LOOPED_STAGES_PER_RANK


def replica_micro_batch(c: Case) -> int:
    """Sequences one data-parallel replica runs per micro-batch.

    Megatron-LM, NeMo, torchtitan and Composer state the micro-batch of a replica (a blank is
    Megatron's default of 1, or, for a torchtitan pipeline, the rank's batch over its stages:
    :func:`torchtitan_pp_micro_batch`). MaxText states ``per_device_batch_size``: sequences per *chip*, with
    ``global_batch_size = per_device_batch_size * num_devices`` and ``gradient_accumulation_steps: 1``
    (MaxText ``src/maxtext/configs/base.yml``, commit e591f30, lines 326 and 968), so one replica of
    ``tp * cp`` chips runs ``per_device * tp * cp`` sequences at once, with no accumulation steps.
    """
    if not c["micro_batch"].strip() and (pipelined := torchtitan_pp_micro_batch(c)):
        return pipelined
    per_row = c.int("micro_batch", 1) or 1
    if not is_maxtext(c):
        return per_row
    return per_row * (c.int("tp", 1) or 1) * (c.int("cp", 1) or 1)


_REMAT = re.compile(r"remat_policy=(\w+)(?: \(([^)]*)\))?")
_TENSORS = {"decoder_layer_input": "decoder_layer_input", "q/k/v proj": "qkv_proj", "qkv_proj": "qkv_proj",
            "out_proj": "out_proj", "context": "context", "mlpwi": "mlpwi", "mlpwo": "mlpwo"}  # fmt: skip


_QKV_OUT = "decoder_layer_input=offload,qkv_proj=offload,out_proj=offload"
#: The per-tensor choices of the published Trillium (and v5p) recipes that use ``remat_policy: custom``, by the
#: config name a row's notes give (benchmarks/maxtext_trillium_model_configs.py, MaxText commit e591f30).
TRILLIUM_CUSTOM = {
    "llama3_1_8b_8192": _QKV_OUT,
    "llama3_1_8b_8192_no_collective_matmul": _QKV_OUT,
    "llama3_1_70b_8192_bs2": "decoder_layer_input=offload,qkv_proj=offload",
    "llama3_1_70b_8192_bs2_bfloat16_no_collective_matmul": "decoder_layer_input=offload,qkv_proj=offload",
    "llama3_1_70b_8192_bs4": "decoder_layer_input=offload,qkv_proj=offload",
    "llama3_1_405b_8192_pure_fsdp_ici": "decoder_layer_input=offload",
    "mixtral_8x22b_dropped": _QKV_OUT,
    "gemma3_12b_32768_v6e256": "decoder_layer_input=device",
    # v5p recipe (benchmarks/maxtext_v5p_model_configs.py, MaxText 9ca35d7 = tag tpu-recipes-v0.1.3, which
    # tpu-recipes' v5p Llama4-Maverick README cites): decoder_layer_input, out_proj and query/key/value_proj offload
    "llama4_maverick_dropless_v5p_256": _QKV_OUT,
    # the configs tpu-recipes' other READMEs print (benchmarks/tpu_recipes_other_rows.py: tpu-recipes c8cfe2f,
    # MaxText tags tpu-recipes-v0.1.2 / v0.1.4 / v0.1.5 and, for v5p, commit 3eb77db)
    "llama3_1_8b_8192_bs5": _QKV_OUT,
    "llama3_1_70b_8192": "decoder_layer_input=offload,qkv_proj=offload",
    "mistral_7b": _QKV_OUT,
    "mixtral_8x7b_dropped": _QKV_OUT,
    "llama3_1_405b_8192_v5p_1024": "context=offload,mlpwo=offload",
    "deepseek3_671b_v5p_1024": "decoder_layer_input=offload,out_proj=offload",
}
_CONFIG = re.compile(r"config (\w+)")
#: Trillium recipe configs that set ``weight_dtype: bfloat16`` (benchmarks/maxtext_trillium_model_configs.py,
#: MaxText commit e591f30): their rows run the ``maxtext-bf16-weights`` framework entry.
TRILLIUM_BF16_WEIGHTS = frozenset({"llama3_1_70b_8192_bs2_bfloat16_no_collective_matmul"})
#: Trillium recipe configs that set ``sa_use_fused_bwd_kernel: True`` (benchmarks/maxtext_trillium_model_configs.py,
#: MaxText commit e591f30 and tag tpu-recipes-v0.1.5): their rows run the ``...-splash-fused`` framework entries,
#: whose splash backward is one kernel (5 block products, not MaxText's default 7: echosim.backends.tpu).
TRILLIUM_FUSED_BWD = frozenset({
    "llama3_1_8b_8192", "llama3_1_8b_8192_no_collective_matmul", "llama3_1_70b_8192_bs2",
    "llama3_1_70b_8192_bs2_bfloat16_no_collective_matmul", "llama3_1_70b_8192_bs4",
    "llama3_1_8b_8192_bs5", "llama3_1_70b_8192", "mistral_7b",  # tpu-recipes' other READMEs (tags v0.1.2, v0.1.4)
})  # fmt: skip
_SA_2048 = (2048,) * 6
_SA_Q1024 = (1024, 512, 2048, 512, 2048, 512)
#: Splash attention's blocks (``sa_block_q``, ``sa_block_kv``, ``sa_block_q_dkv``, ``sa_block_kv_dkv``,
#: ``sa_block_q_dq``, ``sa_block_kv_dq``; an unset one is base.yml's 512) of the recipe configs that set them, by
#: the config name a row's notes give (benchmarks/maxtext_trillium_model_configs.py, MaxText commit e591f30;
#: the v5p Llama 4 configs in benchmarks/maxtext_v5p_model_configs.py, the same at e591f30 and 9ca35d7):
#: rows run :attr:`echosim.plan.Plan.splash_blocks` (echosim.backends.tpu.splash_blocks).
MAXTEXT_SPLASH_BLOCKS: dict[str, tuple[int, ...]] = {
    "llama3_1_8b_8192": _SA_2048,
    "llama3_1_8b_8192_no_collective_matmul": _SA_2048,
    "llama3_1_70b_8192_bs2": _SA_2048,
    "llama3_1_70b_8192_bs2_bfloat16_no_collective_matmul": _SA_2048,
    "llama3_1_70b_8192_bs4": _SA_2048,
    "llama3_1_405b_8192_pure_fsdp_ici": _SA_Q1024,
    "gpt_3_175b": _SA_Q1024,
    "gpt_3_175b_bf16": _SA_Q1024,
    "mixtral_8x22b_dropped": (2048, 512, 2048, 512, 2048, 512),
    "llama4_scout_dropless_v5p_256": _SA_2048,
    "llama4_maverick_dropless_v5p_256": _SA_2048,
    "gemma3_12b_32768_2x_v6e256": (1024, 1024, 512, 2048, 1024, 1024),
    "gemma3_12b_32768_4x_v6e256": (1024, 1024, 512, 2048, 1024, 1024),
    # the configs tpu-recipes' other READMEs print (benchmarks/tpu_recipes_other_rows.py)
    "gemma3_12b_32768_v6e256": (1024, 1024, 512, 2048, 1024, 1024),
    "llama3_1_8b_8192_bs5": _SA_2048,
    "llama3_1_70b_8192": _SA_2048,
    "mistral_7b": _SA_2048,
    "llama2_70b_4096_sc": _SA_Q1024,
    "mixtral_8x7b_dropped": (2048, 512, 2048, 512, 2048, 512),
    "llama3_1_405b_8192_v5p_1024": _SA_2048,
    "deepseek3_671b_v5p_1024": _SA_2048,
}
#: The recipe config of a tpu-recipes README whose rows' notes name none: the README's ``--model_name``, whose
#: settings it prints (training/trillium/Gemma3-12B-MaxText/{2x,4x}-v6e-256/README.md, tpu-recipes 2079524 and
#: 5a49e2f: MaxText tag tpu-recipes-v0.1.5).
RECIPE_README_CONFIGS = {
    "Gemma3-12B-MaxText/2x-v6e-256/": "gemma3_12b_32768_2x_v6e256",
    "Gemma3-12B-MaxText/4x-v6e-256/": "gemma3_12b_32768_4x_v6e256",
}


def maxtext_config_name(c: Case) -> str:
    """The MaxText recipe config a row runs: the one its notes name, else its README's ('' when neither)."""
    named = _CONFIG.search(c["notes"])
    if named:
        return named.group(1)
    return next((cfg for path, cfg in RECIPE_README_CONFIGS.items() if path in c["source_url"]), "")


def maxtext_splash_blocks(c: Case) -> tuple[int, ...]:
    """The splash blocks of the MaxText recipe config a row runs (:data:`MAXTEXT_SPLASH_BLOCKS`; () when none:
    base.yml's defaults)."""
    return MAXTEXT_SPLASH_BLOCKS.get(maxtext_config_name(c), ()) if is_maxtext(c) else ()


#: ``capacity_factor`` of the Trillium MoE recipe configs that drop tokens (``megablox: False``,
#: ``sparse_matmul: False``: MaxText's dense_matmul path, :attr:`echosim.frameworks.Framework.moe_capacity_padding`),
#: by the config name a row's notes give: mixtral_8x22b_dropped sets 1.25
#: (benchmarks/maxtext_trillium_model_configs.py, MaxText commit e591f30). Dropless (megablox) configs have none.
TRILLIUM_CAPACITY_FACTOR = {"mixtral_8x22b_dropped": 1.25, "mixtral_8x7b_dropped": 1.25}  # 8x7b: tag v0.1.2


#: ``quantization`` of the Trillium recipe configs that set one, by the config name a row's notes give, where the
#: row's dtype column does not say it: gpt_3_175b (the GPT-3 175B "fp8" recipe, whose README pins MaxText commit
#: e7292a3) sets ``quantization: "int8"`` (benchmarks/maxtext_trillium_model_configs.py at e7292a3 and at tag
#: tpu-recipes-v0.1.2), AQT integer GEMMs (:mod:`echosim.passes.precision`).
TRILLIUM_QUANTIZATION = {"gpt_3_175b": "int8"}
_SCRIPT = re.compile(r"MaxText/configs/([\w/]+\.sh)")
#: Settings of the MaxText launch script a row's notes name (``MaxText/configs/...sh``) that its columns do not
#: carry. v5p/gpt3_175b/v5p_1024.sh (tpu-recipes' v5p GPT-3 175B README, 2024-10-28) runs
#: ``gpt3_175b_base.sh 4 "full" 1 64 8``: per_device_batch_size 4, remat_policy full, ici_data 1 x ici_fsdp 64 x
#: ici_tensor 8, and the base script passes ``quantization=int8`` (MaxText commits 81e1d96, 2024-09-13, the
#: MLPerf 4.0 scripts, through e1fde45).
MAXTEXT_SCRIPTS: dict[str, dict[str, Any]] = {
    "v5p/gpt3_175b/v5p_1024.sh": {"tp": 8, "per_device_batch": 4, "recompute": "full", "dtype": "int8"},
}


def maxtext_quantization(c: Case) -> str:
    """The GEMM format of the MaxText recipe config or launch script a row's notes name ('' when none)."""
    if not is_maxtext(c):
        return ""
    config = _CONFIG.search(c["notes"])
    script = _SCRIPT.search(c["notes"])
    if script and script.group(1) in MAXTEXT_SCRIPTS:
        return str(MAXTEXT_SCRIPTS[script.group(1)].get("dtype", ""))
    return TRILLIUM_QUANTIZATION.get(config.group(1), "") if config else ""


def maxtext_script_layout(c: Case) -> dict[str, Any]:
    """tp, dp, micro-batch and recompute of the MaxText launch script a row's notes name (empty when none):
    the replica of ``tp`` chips runs ``per_device_batch * tp`` sequences (:func:`replica_micro_batch`)."""
    script = _SCRIPT.search(c["notes"]) if is_maxtext(c) else None
    settings = MAXTEXT_SCRIPTS.get(script.group(1), {}) if script else {}
    if not settings:
        return {}
    tp = int(settings["tp"])
    devices = c.int("devices") or 0
    return {"tp": tp, "dp": devices // tp, "micro_batch": int(settings["per_device_batch"]) * tp,
            "recompute": settings["recompute"]}  # fmt: skip


def moe_capacity_factor(c: Case) -> float:
    """The capacity factor of the MaxText recipe config a MoE row's notes name (0: dropless or not known)."""
    config = _CONFIG.search(c["notes"])
    if c["arch"] != "moe" or not is_maxtext(c) or not config:
        return 0.0
    return TRILLIUM_CAPACITY_FACTOR.get(config.group(1), 0.0)


#: Token dropping in NeMo 25.09's Megatron-Bridge performance runs (v0.1.0rc4 scripts/performance/run_script.py):
#: the Qwen3 30B-A3B and 235B-A22B recipes always apply it, DeepSeek-V3 on B200 and GB200 (use_tokendrop for
#: gpu in ["b200", "gb200"]); apply_moe_token_drop sets moe_expert_capacity_factor=1.0 and
#: moe_pad_expert_input_to_capacity=True (src/megatron/bridge/training/utils/moe_token_drop.py). By
#: (layers, hidden) -> the devices whose runs drop ('' = all).
MEGATRON_BRIDGE_2509_TOKEN_DROP: dict[tuple[int, int], tuple[str, ...]] = {
    (48, 2048): (),  # Qwen3-30B-A3B
    (94, 4096): (),  # Qwen3-235B-A22B
    (61, 7168): ("b200", "gb200"),  # DeepSeek-V3
}
MEGATRON_BRIDGE_TOKEN_DROP_CAPACITY = 1.0  # apply_moe_token_drop's moe_expert_capacity_factor default


_STATED_TOKEN_DROP = re.compile(r"\btoken drop at capacity factor ([\d.]+), padded\b")


def token_drop_capacity(c: Case) -> float:
    """The capacity factor of a MoE row whose run dropped tokens, padded to capacity: the one its notes state
    ("token drop at capacity factor F, padded", from its source's recipe), or a NeMo 25.09 Megatron-Bridge
    row's (:data:`MEGATRON_BRIDGE_2509_TOKEN_DROP`); 0 otherwise."""
    if c["arch"] == "moe" and (stated := _STATED_TOKEN_DROP.search(c["notes"])):
        return float(stated.group(1))
    if c["source_id"] != "megatron_bridge_25.09" or c["arch"] != "moe":
        return 0.0
    devices = MEGATRON_BRIDGE_2509_TOKEN_DROP.get((c.int("layers") or 0, c.int("hidden") or 0))
    if devices is None or (devices and c["device"] not in devices):
        return 0.0
    return MEGATRON_BRIDGE_TOKEN_DROP_CAPACITY


#: NeMo 1 rows whose NeMo-Framework-Launcher training config sets ``cross_entropy_loss_fusion: true`` (Megatron-Core's
#: 'native' fused loss), by source and the model names that begin their case ids: at tag 24.07 the launcher sets it
#: in launcher_scripts/conf/training/llama/llama3_*.yaml and nemotron/nemotron_{4,8,15,22}b.yaml, not in the
#: nemotron_340b, llama2, gpt3, mixtral or grok configs (NeMo-Framework-Launcher tag 24.07; none at 24.05).
NEMO_LAUNCHER_FUSED_LOSS: dict[str, tuple[str, ...]] = {
    "nemo_2407": ("llama3-", "nemotron-4b-", "nemotron-8b-", "nemotron-15b-", "nemotron-22b-"),
}


#: NeMo 1 rows (NeMo-Framework-Launcher) and their gradient buffer. NeMo 1 builds distributed_fused_adam with
#: ``dtype=torch.float32`` ("Make sure optimizer state is in FP32": MegatronBaseModel.setup_optimization,
#: nemo/collections/nlp/models/language_modeling/megatron_base_model.py), and Apex's DistributedFusedAdam keeps
#: and reduce-scatters gradients in ``grad_sync_dtype``, ``dtype`` unless given ("if grad_sync_dtype is None:
#: grad_sync_dtype = dtype", apex/contrib/optimizers/distributed_fused_adam.py); mcore_distributed_optim likewise
#: reduces in fp32 unless the config says otherwise (setup_mcore_distributed_parallel: ``grad_reduce_in_fp32=
#: (self.cfg.optim.get('grad_sync_dtype', 'fp32') == 'fp32')``). At launcher tag 24.07 the H100 example scripts of
#: the GPT-3 and Llama 2/3 models pass ``+training.model.optim.grad_sync_dtype=bf16`` (examples/training/{gpt,llama}/
#: h100/*.sh), the nemotron_340b config sets it, and the Nemotron 8B and 22B examples and configs do not (launcher
#: commit 79f9243, "Removed grad_sync_dtype from Nemotron models"): fp32 for those, bf16 for the model names below.
NEMO_LAUNCHER_SOURCES = ("nemo_2407",)
NEMO_LAUNCHER_BF16_GRAD_SYNC: dict[str, tuple[str, ...]] = {
    "nemo_2407": ("gpt3-", "llama2-", "llama3-", "nemotron-340b-"),
}


def launcher_grad_dtype(c: Case) -> str:
    """The gradient buffer's dtype of a NeMo 1 launcher row (:data:`NEMO_LAUNCHER_SOURCES`); '' for other rows."""
    if c["source_id"] not in NEMO_LAUNCHER_SOURCES:
        return ""
    model = c["case_id"].split("-", 1)[-1]
    return "bf16" if model.startswith(NEMO_LAUNCHER_BF16_GRAD_SYNC.get(c["source_id"], ())) else "fp32"


#: torchtitan commits named in cases.csv (and benchmarks/data/torchtitan_newer.csv) whose --training.compile also
#: compiles the loss: descendants of bbb1b61 (2025-04-02), where build_cross_entropy_loss wraps it in torch.compile
#: (torchtitan/components/loss.py; `git merge-base --is-ancestor bbb1b61 820504e` holds).
TORCHTITAN_COMPILED_LOSS = ("e7c0cae", "820504e")


#: A Megatron-LM row whose notes quote its command line's loss kernel (``--cross-entropy-fusion-impl te``).
_STATED_CE_IMPL = re.compile(r"--cross-entropy-fusion-impl (native|te)\b")


def row_framework(c: Case) -> str:
    """The framework entry a row ran: its ``framework`` column, the MaxText recipe's weight dtype and splash
    backward kernel (:data:`TRILLIUM_BF16_WEIGHTS`, :data:`TRILLIUM_FUSED_BWD`), or, for
    torchtitan's 2024-2025 rows, whether the source says the run used torch.compile (its notes)."""
    from echosim.frameworks import framework_named_in, maxtext_framework

    name = framework_named_in(c["framework"])
    if name == "maxtext":
        config = _CONFIG.search(c["notes"])
        recipe = config.group(1) if config else ""
        te = SOURCE_MAXTEXT_ATTENTION.get(c["source_id"]) == "cudnn_flash_te"
        return maxtext_framework(recipe in TRILLIUM_BF16_WEIGHTS, te, recipe in TRILLIUM_FUSED_BWD)
    if name == "torchtitan-2025" and "torch.compile" in c["notes"]:
        compiled_loss = any(f"commit {x}" in c["framework"] for x in TORCHTITAN_COMPILED_LOSS)
        return "torchtitan-2025-compile-loss" if compiled_loss else "torchtitan-2025-compile"
    if name == "megatron" and (stated := _STATED_CE_IMPL.search(c["notes"])):
        return f"megatron-ce-{stated.group(1)}"  # the row's command line passes --cross-entropy-loss-fusion
    if name == "megatron" and c["source_id"] == "megatron_lm_llama_fp8":
        # examples/llama/README.md's table is run with examples/llama/train_llama3_8b_h100_fp8.sh, which passes
        # --cross-entropy-loss-fusion and leaves --cross-entropy-fusion-impl at 'native' (Megatron-LM commit
        # bf6e998, 2025-06-14, to d98e8a6)
        return "megatron-ce-native"
    if name == "nemo" and c["case_id"].split("-", 1)[-1].startswith(NEMO_LAUNCHER_FUSED_LOSS.get(c["source_id"], ())):
        return "nemo-ce-native"
    if name == "megatron-2022" and c.int("zero") == 3:  # Megatron-LM (2021) had no ZeRO-3: DeepSpeed's
        return "deepspeed-2021"
    if name == "composer" and c["source_id"] == "llm_foundry_bench" and llm_foundry_attn_impl(c) == "triton":
        return "composer-triton-pure" if llm_foundry_pure(c) else "composer-triton"
    if name == "composer" and llm_foundry_flash_v1(c):
        return "composer-fa1"
    return name


def llm_foundry_pure(c: Case) -> bool:
    """Whether an llm-foundry benchmark row ran FSDP mixed_precision 'PURE': the README pairs Precision 'bf16'
    (the row's notes, "Precision mode 'bf16'") with MP Mode 'PURE' in every row, 'amp_bf16' / 'amp_fp8' with
    'DEFAULT' (scripts/train/benchmarking/README.md, llm-foundry commit 4952183; submit_benchmarks.py's defaults
    at 300cc5c: ``--precisions bf16``, ``--fsdp_config_mixed_precision PURE``)."""
    return "Precision mode 'bf16'" in c["notes"]


#: The ``--attn_impl`` llm-foundry's large-scale sweep passes per model (scripts/train/benchmarking/sweep.py,
#: llm-foundry commit 5e85bd6, which added the "H100 80GB BF16 (Large Scale, >= 128 GPUs)" table), keyed by
#: the MPT yaml's d_model (scripts/train/yamls/pretrain/mpt-{1b,3b,7b,13b,30b,70b}.yaml).
LLM_FOUNDRY_SWEEP_ATTN = {2048: "flash", 2560: "flash", 4096: "flash", 5120: "triton", 7168: "triton", 8192: "flash"}
LLM_FOUNDRY_LARGE_SCALE_TABLE = "H100 80GB BF16 (Large Scale, >= 128 GPUs)"


def llm_foundry_attn_impl(c: Case) -> str:
    """The attention kernel an llm-foundry benchmark row ran: its sweep's ``--attn_impl`` for the large-scale
    table; every other table was submitted through sweep.sh, which passes none, so submit_benchmarks.py's
    default ``--attn_impl triton`` (llm-foundry commits ef350d9 for the A100 tables, b2a43a1 for the H100 one)."""
    if c["table"] == LLM_FOUNDRY_LARGE_SCALE_TABLE:
        return LLM_FOUNDRY_SWEEP_ATTN.get(c.int("hidden", 0), "triton")
    return "triton"


def llm_foundry_flash_v1(c: Case) -> bool:
    """Whether an llm-foundry benchmark row's attn_impl 'flash' ran flash-attn 1.x (FlashAttention v1).

    The large-scale H100 table came in with commit 5e85bd6 ("Shashank/new benchmarks (#838)", squashed from
    "adding new benchmarks" then "Update submit_benchmarks.py"). Before that commit submit_benchmarks.py launched
    every run from ``git_branch: v0.4.0`` with ``pip_install: -e .[gpu]``, whose extra pins flash-attn==1.0.9
    (setup.py at v0.4.0); the commit moved the launcher to ``main`` with ``.[gpu-flash2]`` (flash-attn 2.4.2).
    The table does not come from the committed launcher: its rows record MP Mode 'DEFAULT' where the committed
    sweep.py passes ``--fsdp_config_mixed_precision PURE``, so the environment is the one the launcher had when
    the runs were submitted, flash-attn 1.0.9. (Same-model rows of the other H100 table, Triton attention on 8-64
    GPUs, give the same tokens per GPU as these: 7b 10,643 on 8 GPUs vs 10,475 on 128.)"""
    return (
        c["source_id"] == "llm_foundry_bench"
        and c["table"] == LLM_FOUNDRY_LARGE_SCALE_TABLE
        and llm_foundry_attn_impl(c) == "flash"
    )


#: ``num_vocab_tiling`` of the Trillium recipe configs that set one, by config name (:func:`maxtext_config_name`):
#: every Gemma3-12B config sets 16 (gemma3_12b_32768_v6e256, _2x_v6e256, _4x_v6e256 in
#: benchmarks/maxtext_trillium_model_configs.py, MaxText commit e591f30).
TRILLIUM_VOCAB_TILING = {
    "gemma3_12b_32768_2x_v6e256": 16,
    "gemma3_12b_32768_4x_v6e256": 16,
    "gemma3_12b_32768_v6e256": 16,
    "llama3_1_405b_8192_v5p_1024": 4,  # benchmarks/maxtext_v5p_model_configs.py, MaxText commit 3eb77db
}


def loss_chunks(c: Case) -> int:
    """The vocabulary tiling of the MaxText recipe a row ran (1: none known)."""
    return TRILLIUM_VOCAB_TILING.get(maxtext_config_name(c), 1) if is_maxtext(c) else 1


#: The ``remat_policy`` of the MaxText launch script a source ran, by ``source_id``, for its rows whose notes name
#: none. DGX Cloud Benchmarking v25.04's MaxText Llama3 70B recipe passes ``remat_policy=${POLICY}`` with
#: ``POLICY="save_qkv_proj"`` for BF16 and FP8 alike (maxtext/configure.sh, NVIDIA/dgxc-benchmarking commit
#: 741c886; also v25.02 and v25.02.01), where MaxText's base.yml default is ``full``.
SOURCE_REMAT_POLICY = {"dgxc_benchmarking_v25.04": "save_qkv_proj"}

#: The ``attention`` kernel of the MaxText launch script a GPU source ran, by ``source_id``: DGX Cloud Benchmarking
#: v25.04's maxtext/configure.sh passes ``attention=cudnn_flash_te`` (NVIDIA/dgxc-benchmarking commit 741c886),
#: Transformer Engine's cuDNN fused attention (the ``maxtext-te`` framework entry).
SOURCE_MAXTEXT_ATTENTION = {"dgxc_benchmarking_v25.04": "cudnn_flash_te"}


def remat_policy(c: Case) -> str:
    """The MaxText remat policy a row's notes name (``remat_policy=NAME``), else its source's launch script's
    (:data:`SOURCE_REMAT_POLICY`); '' when neither.

    ``custom (offload decoder_layer_input, q/k/v proj)`` lists the tensors the run offloads; a
    bare ``custom`` takes the per-tensor choices of the recipe config the notes name
    (:data:`TRILLIUM_CUSTOM`), else MaxText's defaults (:mod:`echosim.passes.recompute`).
    """
    m = _REMAT.search(c["notes"])
    if not is_maxtext(c):
        return ""
    if not m:
        return SOURCE_REMAT_POLICY.get(c["source_id"], "")
    name, detail = m.group(1), (m.group(2) or "").strip()
    if name == "custom" and not detail.startswith("offload "):
        config = _CONFIG.search(c["notes"])
        recipe = TRILLIUM_CUSTOM.get(config.group(1) if config else "")
        return f"custom:{recipe}" if recipe else name
    if name != "custom":
        return name
    tensors = [_TENSORS.get(t.strip()) for t in detail.removeprefix("offload ").split(",")]
    if None in tensors:
        return name
    return "custom:" + ",".join(f"{t}=offload" for t in tensors)


#: Launch flags of the script a source says it ran, for the Plan settings its table leaves out (by
#: ``source_id``). Megatron-LM's Llama-3 FP8 table (examples/llama/README.md) is produced by
#: examples/llama/train_llama3_8b_h100_fp8.sh, which passes --use-distributed-optimizer and
#: --sequence-parallel (Megatron-LM commit d98e8a6); Megatron turns sequence parallelism off at tp 1. Its 70B and
#: 405B rows name no script of their own: "This configuration follows those defined in NeMo Framework's performance
#: scripts" (the README, d98e8a6), and those overlap TP communication with the GEMMs on H100 (NeMo
#: scripts/performance/llm/pretrain_llama3_70b.py and pretrain_llama31_405b.py at ab020f6, 2025-06-12, the README's
#: month: userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192 / _h16384_tp8_cp2_mbs1_seqlen8192 into
#: MegatronCommOverlapCallback, "Required for performance"); it only applies where tp > 1.
#: DeepSeek-V3's own run (deepseek_v3_2024) dispatches the DeepEP way: "each token ... is first
#: transmitted via IB to the GPUs with the same in-node index on its target nodes ... forwarded via
#: NVLink" (arXiv:2412.19437 sec. 3.2.2; its node-limited routing, at most 4 nodes, is not modelled).
#: Megatron-Bridge's 25.09 table has no precision column, but it is an FP8 table: its footnote reads
#: "The numbers in parentheses indicate the use of different quantization granularities" (per-tensor
#: current scaling outside, 32x32 / 128x128 blocks inside), and the 25.11 table lists the same layouts
#: as "FP8-CS (FP8-MX)" at the same throughput (LLAMA3_8B on 8 GB200: 31357 (29925) tokens/s/GPU in
#: 25.09, 31508 (29789) in 25.11). docs/performance-summary-archive.md, Megatron-Bridge commit 067f987.
SOURCE_FLAGS: dict[str, dict[str, Any]] = {
    "megatron_lm_llama_fp8": {"zero": 1, "sp": True, "tp_overlap": True},
    "megatron_bridge_25.09": {"dtype": "fp8"},
    "deepseek_v3_2024": {"moe_dispatcher": "deepep"},
}

#: Pipeline balance of a source's own run where its layer split is not published but its balancing is. DeepSeek-V3
#: (deepseek_v3_2024) puts "the shallowest layers (including the embedding layer) and deepest layers (including
#: the output head)" on one PP rank to balance DualPipe's stages (arXiv:2412.19437 sec. 3.2.1): DualPipe's
#: placement (stage r and pp-1-r on rank r) puts them together; the split balances stage cost, which carries
#: the output head and the MTP module.
SOURCE_PP_BALANCE: dict[str, str] = {"deepseek_v3_2024": "cost"}

#: A row whose source names DualPipe as its pipeline schedule (its ``framework`` column or the notes' "Pipeline
#: schedule: DualPipe"): DeepSeek-V3's HAI-LLM run (arXiv:2412.19437 sec. 3.2.1).
_DUALPIPE = re.compile(r"\bDualPipe\b")


def row_schedule(c: Case, vpp: int) -> str:
    """The pipeline schedule a row ran: DualPipe where its source names it, else Megatron's 1F1B (interleaved
    with virtual stages)."""
    if _DUALPIPE.search(c["framework"]) or _DUALPIPE.search(c["notes"]):
        return "dualpipe"
    return "interleaved" if vpp > 1 else "1f1b"


#: Megatron-Bridge 25.09's parenthesised FP8 variant (the rows whose ``dtype`` says fp8; the per-tensor rows
#: are blank and take ``SOURCE_FLAGS``) is block-scaled. On Blackwell it runs MXFP8: the 25.11 table labels
#: the same layouts "FP8-CS (FP8-MX)", and Transformer Engine runs FP8 block scaling on sm_100 through
#: MXFP8 GEMMs alone (cuBLASLt has no 128x128-block FP8 GEMM there: TransformerEngine PR #2157; its GEMM
#: profiling guide: "On Blackwell (SM100+), FP8 Block is emulated via MXFP8"). Hopper keeps fp8.
BLOCK_SCALED_FP8_SOURCES = ("megatron_bridge_25.09",)


def block_scaled_dtype(c: Case) -> str:
    """``mxfp8`` for a block-scaled FP8 row on a part whose tensor cores take MXFP8, else ``""``."""
    from echosim.backends.devices import DEVICES

    if c["source_id"] not in BLOCK_SCALED_FP8_SOURCES or c["dtype"] != "fp8":
        return ""
    device = DEVICES.get(backend_for(c["device"]) or "")
    return "mxfp8" if device is not None and "mxfp8" in device.block_scaled_formats else ""


#: Settings a source's launch script passes for one model where its table prints "NA", by
#: (source_id, layers, hidden). DGX Cloud Benchmarking v25.04's Nemotron table lists VP=NA for
#: Nemotron-4 340B, while the launch.sh it ships runs MODEL_SIZE=340b with VP=12 and passes
#: ``-vp $VP`` to NeMo (nemotron/launch.sh, NVIDIA/dgxc-benchmarking commit 741c886; the v25.02 and
#: v25.05 tables print VP=12 for the same runs).
SOURCE_MODEL_FLAGS: dict[tuple[str, int, int], dict[str, Any]] = {
    ("dgxc_benchmarking_v25.04", 96, 18432): {"vpp": 12},
    # deepseek_v3_pretrain_1024gpu_h100_bf16_config sets ddp.overlap_grad_reduce = False (Megatron-Bridge 067f987)
    ("megatron_bridge_cards", 61, 7168): {"overlap_dp": False},
}


_MB = "Megatron-Bridge scripts/performance"
#: CPU activation offloading (``cpu_offloading_num_layers``) in the Megatron-FSDP performance recipes
#: behind Megatron-Bridge's published tables, by the recipe's identity: (layers, hidden, device,
#: precision family, tp, pp, micro-batch) -> layers offloaded. Every release that publishes a layout
#: uses the same count: v0.1.0rc4 (NeMo 25.09) scripts/performance/configs/llama3/
#: llama3_70b_llm_pretrain.yaml and configs/llama31/llama31_405b_llm_pretrain.yaml; v0.2.0 (25.11)
#: configs/llama3*/workload_base_configs.py; v0.3.0 (26.02) configs/llama/llama3_workload_base_configs.py;
#: commit 067f987 (26.04) src/megatron/bridge/perf_recipes/llama/{gb200,gb300}/llama3*.py.
MEGATRON_FSDP_OFFLOAD: dict[tuple[int, int, str, str, int, int, int], int] = {
    (80, 8192, "gb200", "bf16", 1, 1, 1): 20,  # LLAMA3_70B_GB200_BF16
    (80, 8192, "gb200", "fp8", 1, 1, 2): 40,  # LLAMA3_70B_GB200_FP8_CS
    (80, 8192, "gb300", "bf16", 1, 1, 2): 30,  # LLAMA3_70B_GB300_BF16
    (80, 8192, "gb300", "fp8", 1, 1, 2): 20,  # LLAMA3_70B_GB300_FP8_CS
    (126, 16384, "gb200", "fp8", 2, 1, 1): 95,  # llama31_405b gb200 fp8_cs / fp8_ds
    (126, 16384, "gb300", "bf16", 2, 1, 1): 40,  # LLAMA31_405B_GB300_BF16
    (126, 16384, "gb300", "fp8", 2, 1, 1): 10,  # LLAMA31_405B_GB300_FP8_CS
}


def _precision_family(dtype: str) -> str:
    return "fp8" if dtype in ("fp8", "mxfp8", "nvfp4") else "bf16" if dtype in ("bf16", "fp16") else dtype


def offload_layers(c: Case) -> int:
    """Layers a Megatron-Bridge Megatron-FSDP performance recipe offloads (:data:`MEGATRON_FSDP_OFFLOAD`).

    A row without a precision (the 25.09 table has no such column) takes the recipe its layout
    names when exactly one precision's recipe has that layout; 0 when no recipe matches.
    """
    if not c["source_id"].startswith("megatron_bridge") or c.int("zero") != 3:
        return 0
    model = (c.int("layers") or 0, c.int("hidden") or 0, c["device"])
    layout = (c.int("tp", 1) or 1, c.int("pp", 1) or 1, c.int("micro_batch", 1) or 1)
    found = [n for (*m, fam, tp, pp, mb), n in MEGATRON_FSDP_OFFLOAD.items()
             if tuple(m) == model and (tp, pp, mb) == layout
             and (not c["dtype"] or fam == _precision_family(c["dtype"]))]  # fmt: skip
    return found[0] if len(found) == 1 else 0


#: ``recompute_modules`` of the Megatron-Bridge MoE performance recipes (Megatron-Core selective
#: recompute, :data:`echosim.passes.recompute.MEGATRON_MODULES`), by (layers, hidden, device) and,
#: where a device's recipes differ, the layout (tp, pp, vpp, ep, micro-batch). The same in v0.2.0
#: (NeMo 25.11) scripts/performance/configs/{deepseek,gpt_oss}/workload_base_configs.py, v0.3.0 (26.02)
#: configs/*/*_workload_base_configs.py and commit 067f987 (26.04) src/megatron/bridge/perf_recipes/
#: {deepseek,gpt_oss}/*; v0.1.0rc4 (25.09) sets DeepSeek-V3's by GPU in scripts/performance/run_script.py
#: (H100 mla_up_proj + mlp, B200 mla_up_proj, GB200 mla_up_proj). DeepSeek's "mlp" replays its 3 dense
#: layers' MLPs (:data:`DENSE_FIRST_LAYERS`).
MEGATRON_BRIDGE_RECOMPUTE: dict[tuple[int, int, str, tuple[int, ...]], tuple[str, ...]] = {
    (36, 2880, "b200", ()): ("layernorm", "moe_act"),  # GPT_OSS_120B_B200_BF16
    (36, 2880, "gb200", ()): ("layernorm", "moe_act"),  # GPT_OSS_120B_GB200_BF16
    (36, 2880, "h100-sxm", ()): ("layernorm", "moe_act"),  # GPT_OSS_120B_H100_BF16
    (61, 7168, "b200", (1, 16, 1, 8, 1)): ("mla_up_proj",),  # DEEPSEEK_V3_B200
    (61, 7168, "b200", (1, 8, 2, 32, 1)): ("mla_up_proj", "mlp"),  # deepseek_v3 b200 fp8mx
    (61, 7168, "gb200", (1, 4, 4, 64, 1)): ("mla_up_proj",),  # DEEPSEEK_V3_GB200
    (61, 7168, "gb300", (1, 4, 4, 64, 1)): ("moe_act",),  # DEEPSEEK_V3_GB300
    # DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_V1 (FP8_CS, FP8_MX, NVFP4: pp 2, vp 8, ep 32, mbs 2) in
    # v0.3.0 / v0.3.1 / v0.4.0 / v0.4.1 scripts/performance/configs/deepseek/deepseek_workload_base_configs.py
    (61, 7168, "gb300", (1, 2, 8, 32, 2)): ("mla_up_proj",),
    (61, 7168, "h100-sxm", (2, 8, 4, 64, 1)): ("mla_up_proj", "mlp"),  # DEEPSEEK_V3_H100
}


@dataclass(frozen=True, slots=True)
class MoePreset:
    """What a Megatron-Bridge MoE performance preset sets that echosim prices: the token dispatcher ('' for
    Megatron-Core's alltoall), combined 1F1B (``moe_a2a_overlap``), the selective-recompute modules, FP8
    attention (``fp8_dot_product_attention``) and the fused grouped expert MLP (``cutedsl_fused_grouped_mlp``)."""

    dispatcher: str
    ep_overlap: bool
    recompute: tuple[str, ...] = ()
    fp8_attention: bool = False
    fused_mlp: bool = False


_HYBRIDEP_OVERLAP = MoePreset("hybridep", True, fp8_attention=True, fused_mlp=True)
#: The MoE presets of the releases after 26.04.01, by (source_id, layers, hidden, device): every published row
#: of a model and system in these releases ran one preset (V2, or V1 where no V2 exists: ``--config_variant``
#: defaults to "v2", scripts/performance/argument_parser.py, and utils.py falls back to V1). NeMo 26.06 = tag
#: v0.5.0, 26.06.01 = tag v0.5.1 and 26.08 = tag v0.6.0 (the same settings for GB200 / GB300; v0.6.0 moved them
#: to src/megatron/bridge/perf_recipes/{deepseek,gpt_oss,qwen}/{gb200,gb300}/*.py), v0.5.0 scripts/performance/configs/
#: {deepseek,gpt_oss,qwen}/*_workload_base_configs.py: DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_FP8_MX_V2 (and
#: _GBS15360) hybridep + a2a overlap, ``recompute_modules=[]`` (selective, nothing recomputed); _GB200_FP8_MX_V2
#: hybridep + overlap + mla_up_proj; _B300_V2 hybridep + mla_up_proj, no overlap; GPT_OSS_120B_PRETRAIN_CONFIG
#: _{GB300,GB200}_FP8_MX_V2 hybridep + overlap, no recompute; _B300_BF16_V2 hybridep; QWEN3_30B_A3B_PRETRAIN_CONFIG
#: _{GB300,GB200,B300}_FP8_MX_V1 hybridep + overlap; _H100_FP8_CS_V1 hybridep; QWEN3_235B_A22B_PRETRAIN_CONFIG
#: _{GB300,GB200}_FP8_MX_V2 hybridep + overlap (qwen3_llm_pretrain.py clears the recipe's recompute). Every
#: preset with the overlap also sets ``cutedsl_fused_grouped_mlp=True``, and ``fp8_dot_product_attention=True``
#: but DeepSeek-V3's on GB200 (overrides.py applies both; mixed_precision.py defaults the latter to False). They
#: also run full-iteration CUDA graphs, which echosim does not price (benchmarks/mbridge_newer_releases.md).
#: They take precedence over the release-independent tables below.
MEGATRON_BRIDGE_MOE_PRESETS: dict[tuple[str, int, int, str], MoePreset] = {
    **{
        (release, *model): preset
        for release in ("megatron_bridge_26.06", "megatron_bridge_26.06.01", "megatron_bridge_26.08")
        for model, preset in {
            (61, 7168, "gb300"): _HYBRIDEP_OVERLAP,
            (61, 7168, "gb200"): MoePreset("hybridep", True, ("mla_up_proj",), fused_mlp=True),
            (36, 2880, "gb300"): _HYBRIDEP_OVERLAP,
            (36, 2880, "gb200"): _HYBRIDEP_OVERLAP,
            (48, 2048, "gb300"): _HYBRIDEP_OVERLAP,
            (48, 2048, "gb200"): _HYBRIDEP_OVERLAP,
            (94, 4096, "gb300"): _HYBRIDEP_OVERLAP,
            (94, 4096, "gb200"): _HYBRIDEP_OVERLAP,
        }.items()
    },
    ("megatron_bridge_26.06", 61, 7168, "b300"): MoePreset("hybridep", False, ("mla_up_proj",)),
    ("megatron_bridge_26.06", 36, 2880, "b300"): MoePreset("hybridep", False),
    ("megatron_bridge_26.06", 48, 2048, "b300"): _HYBRIDEP_OVERLAP,
    ("megatron_bridge_26.06", 48, 2048, "h100-sxm"): MoePreset("hybridep", False),
    # Megatron-Bridge's model verification cards (benchmarks/mbridge_cards.py), the perf recipes at commit 067f987:
    # perf_recipes/qwen/h100/qwen3_moe.py qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config (HybridEP from
    # recipes/qwen/h100/qwen3_moe.py, overlap_moe_expert_parallel_comm, no recompute); perf_recipes/deepseek/h100/
    # deepseek_v3.py deepseek_v3_pretrain_1024gpu_h100_bf16_config (HybridEP from recipes/deepseek/h100/
    # deepseek_v3.py, recompute_modules mla_up_proj and mlp, no overlap); perf_recipes/gpt_oss/gb200/gpt_oss.py
    # gpt_oss_120b_pretrain_64gpu_gb200_bf16_config (alltoall from recipes/gpt_oss/h100/gpt_oss.py, the overlap,
    # recompute_modules layernorm and moe_act)
    ("megatron_bridge_cards", 48, 2048, "h100-sxm"): MoePreset("hybridep", True),
    ("megatron_bridge_cards", 61, 7168, "h100-sxm"): MoePreset("hybridep", False, ("mla_up_proj", "mlp")),
    ("megatron_bridge_cards", 36, 2880, "gb200"): MoePreset("alltoall", True, ("layernorm", "moe_act")),
}


def moe_preset(c: Case) -> MoePreset | None:
    """The preset of a Megatron-Bridge MoE row's release, model and system (:data:`MEGATRON_BRIDGE_MOE_PRESETS`)."""
    if c["arch"] != "moe":
        return None
    return MEGATRON_BRIDGE_MOE_PRESETS.get((c["source_id"], c.int("layers") or 0, c.int("hidden") or 0, c["device"]))


def _modules_pattern() -> re.Pattern[str]:
    from echosim.passes.recompute import MEGATRON_MODULES

    name = "|".join(MEGATRON_MODULES)
    return re.compile(rf"\brecompute modules ((?:{name})(?:,(?:{name}))*)\b")


_STATED_MODULES = _modules_pattern()


#: What a row's notes call the parts its run recomputes ("recompute: selective (RMSNorm + MLA up-projection
#: recomputed)", DeepSeek-V3's report sec. 3.2.3, "Recomputation of RMSNorm and MLA Up-Projection"), as the
#: Megatron-Core module that replays the same ops.
STATED_PARTS = {"RMSNorm": "layernorm", "MLA up-projection": "mla_up_proj"}
_STATED_PARTS = re.compile(r"\brecompute: selective \(([^()]+) recomputed\)")

#: Parts a source's text recomputes besides those its rows' notes name, by ``source_id``: DeepSeek-V3's report
#: (arXiv:2412.19437 sec. 3.3.3, "Low-Precision Storage and Communication") also caches the inputs of the MoE
#: experts' SwiGLU and "recompute[s] its output in the backward pass": Megatron-Core's ``moe_act``. (That it caches
#: those inputs in FP8 is the ``hai-llm`` framework's, which its ``framework`` column names.)
SOURCE_RECOMPUTED_PARTS: dict[str, tuple[str, ...]] = {"deepseek_v3_2024": ("moe_act",)}

#: Optimizer state dtypes a source states, by ``source_id`` (:func:`echosim.passes.memory.optimizer_dtypes`):
#: DeepSeek-V3's report (arXiv:2412.19437 sec. 3.3.3, "Low-Precision Optimizer States") tracks AdamW's first and
#: second moments in BF16 while "the master weights ... and gradients ... are still retained in FP32";
#: Megatron-Core's DeepSeek-V3 GB200 guide launches with ``--use-precision-aware-optimizer`` and bf16 moments (its
#: arguments: tests/data/configs/megatron/mcore_dsv3_gb200_guide.args).
_BF16_MOMENTS = "main_grads=fp32,main_params=fp32,exp_avg=bf16,exp_avg_sq=bf16"
SOURCE_OPTIMIZER_DTYPES = {"deepseek_v3_2024": _BF16_MOMENTS, "mcore_dsv3_gb200_guide": _BF16_MOMENTS}


def stated_recompute(c: Case) -> str:
    """``selective:MODULES`` for a row whose notes name the modules its recipe recomputes ("recompute modules
    mla_up_proj", Megatron-Core's ``recompute_modules``) or the parts its run recomputes (:data:`STATED_PARTS`,
    all of them known); '' otherwise. The ``recompute`` column can only say 'selective'."""
    stated = _STATED_MODULES.search(c["notes"])
    if stated:
        return f"selective:{stated.group(1)}"
    parts = _STATED_PARTS.search(c["notes"])
    names = [p.strip() for p in parts.group(1).split("+")] if parts else []
    if names and all(n in STATED_PARTS for n in names):
        modules = [STATED_PARTS[n] for n in names] + list(SOURCE_RECOMPUTED_PARTS.get(c["source_id"], ()))
        return "selective:" + ",".join(dict.fromkeys(modules))
    return ""


def megatron_bridge_recompute(c: Case) -> str:
    """The ``selective:MODULES`` policy of the Megatron-Bridge recipe a row ran; '' when none is known."""
    if not c["source_id"].startswith("megatron_bridge"):
        return ""
    if (preset := moe_preset(c)) is not None:
        return "selective:" + ",".join(preset.recompute) if preset.recompute else "none"
    model = (c.int("layers") or 0, c.int("hidden") or 0, c["device"])
    layout = tuple(c.int(k, 1) or 1 for k in ("tp", "pp", "vpp", "ep", "micro_batch"))
    modules = MEGATRON_BRIDGE_RECOMPUTE.get((*model, ()), MEGATRON_BRIDGE_RECOMPUTE.get((*model, layout), ()))
    return "selective:" + ",".join(modules) if modules else ""


#: The token dispatcher of the Megatron-Bridge MoE performance recipes whose expert-parallel groups
#: span nodes, by (layers, hidden, device, (tp, pp, vpp, ep, micro-batch)): DeepSeek-V3 on H100 runs
#: DeepEP (v0.1.0rc4 / NeMo 25.09 scripts/performance/run_script.py: enable_deepep for gpu h100 unless
#: token-dropping; v0.2.0 configs/deepseek/workload_base_configs.py DEEPSEEK_V3_H100_BASE_CONFIG
#: moe_flex_dispatcher_backend="deepep"), and so does the 256-GPU B200 MXFP8 recipe with ep 32
#: (src/megatron/bridge/perf_recipes/deepseek/b200/deepseek_v3.py deepseek_v3_pretrain_256gpu_b200_fp8mx_config,
#: commit 067f987). Recipes not listed run Megatron-Core's alltoall dispatcher or keep EP inside an
#: NVLink domain, where the two dispatchers cost the same here.
MEGATRON_BRIDGE_DISPATCHER: dict[tuple[int, int, str, tuple[int, ...]], str] = {
    (61, 7168, "h100-sxm", (2, 8, 4, 64, 1)): "deepep",  # DEEPSEEK_V3_H100
    (61, 7168, "b200", (1, 8, 2, 32, 1)): "deepep",  # deepseek_v3 b200 fp8mx
}


#: The Megatron-Core pipeline layout (``pipeline_model_parallel_layout``) a Megatron-Bridge performance
#: recipe states, by (layers, hidden, device, (tp, pp, vpp, ep, micro-batch)); echosim's ``layout:`` balance
#: (:func:`echosim.passes.pipeline.layout_counts`). DeepSeek-V3 on H100: ``layout="Et|(tt|)*30mL"`` (v0.1.0rc4
#: / NeMo 25.09 scripts/performance/run_script.py for gpu h100; v0.2.0 scripts/performance/configs/deepseek/
#: deepseek_llm_pretrain.py deepseek_v3_h100_config). DeepSeek-V3 on GB300 with pp 2, vp 8:
#: ``pp_layout="Et*4|(t*4|)*14tmL"`` (DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_V1, v0.3.0-v0.4.1 scripts/performance/
#: configs/deepseek/deepseek_workload_base_configs.py). The ``m`` (multi-token prediction) is the MTP module, which
#: follows the decoder on the last stage (:data:`MTP_LAYERS`).
MEGATRON_BRIDGE_PP_LAYOUT: dict[tuple[int, int, str, tuple[int, ...]], str] = {
    (61, 7168, "h100-sxm", (2, 8, 4, 64, 1)): "Et|(tt|)*30mL",
    (61, 7168, "gb300", (1, 2, 8, 32, 2)): "Et*4|(t*4|)*14tmL",
}


#: The pipeline layout Megatron-Bridge's DeepSeek-V3 pretrain recipe picks from (pp, vp) when a performance
#: script passes none (``layout_map`` / ``map_pp_vp_to_layout`` in src/megatron/bridge/recipes/deepseek/
#: deepseek_v3.py, the same in v0.1.0rc4 line 118, v0.2.0 line 235, v0.3.0 line 49, v0.3.1 - v0.4.1 line 37):
#: the last stage holds the multi-token-prediction module (``m``, when the run has one) and the loss beside
#: a short run of decoder layers. Written in Megatron-Core's layout grammar; the ``m`` is dropped for a run
#: without MTP (the recipe's ``last_layer``).
DEEPSEEK_V3_RECIPE_LAYOUT: dict[tuple[int, int], str] = {
    (4, 1): "Et*16|t*16|t*16|t*13mL",
    (8, 1): "Et*8|(t*8|)*6t*5mL",
    (4, 2): "Et*8|(t*8|)*6t*5mL",
    (16, 1): "Et*4|(t*4|)*14tmL",
    (8, 2): "Et*4|(t*4|)*14tmL",
    (4, 4): "Et*4|(t*4|)*14tmL",
}


_STATED_LAYOUT = re.compile(r"\bpipeline layout ([EtmL|()*\d]+)(?=\s|$)")  # Megatron-Core's layout symbols


def pp_layout(c: Case) -> str:
    """``layout:STRING`` for a row whose notes state its pipeline layout ("pipeline layout STRING", in
    :mod:`echosim.passes.pipeline`'s layout syntax, from its source's recipe) or a Megatron-Bridge row whose recipe
    states one; '' otherwise."""
    if stated := _STATED_LAYOUT.search(c["notes"]):
        return f"layout:{stated.group(1)}"
    if not c["source_id"].startswith("megatron_bridge"):
        return ""
    layout = tuple(c.int(k, 1) or 1 for k in ("tp", "pp", "vpp", "ep", "micro_batch"))
    found = MEGATRON_BRIDGE_PP_LAYOUT.get((c.int("layers") or 0, c.int("hidden") or 0, c["device"], layout), "")
    model = _moe_model(c)
    if not found and model in MTP_LAYERS:  # the DeepSeek-V3 recipe's own choice by (pp, vp)
        found = DEEPSEEK_V3_RECIPE_LAYOUT.get((layout[1], layout[2]), "")
        found = found if mtp_layers(c) else found.replace("m", "")
    return f"layout:{found}" if found else ""


#: Group-limited routing of the models that use it, by (layers, hidden, experts, top_k): (groups, groups a
#: token's experts come from). DeepSeek-V3: ``n_group: 8, topk_group: 4`` (its config.json; arXiv:2412.19437
#: sec. 2.1.2, "each token will be sent to at most M = 4 nodes"); Megatron-Bridge's DeepSeekV3ModelProvider
#: sets moe_router_num_groups=8, moe_router_group_topk=4 (src/megatron/bridge/models/deepseek/
#: deepseek_provider.py, v0.2.0 through commit 067f987). It changes what DeepEP sends across nodes
#: (:func:`echosim.backends.deepep.node_reach`); NCCL's all_to_all moves every (token, expert) copy anyway.
MOE_ROUTER_GROUPS: dict[tuple[int, int, int, int], tuple[int, int]] = {
    (61, 7168, 256, 8): (8, 4),  # DeepSeek-V3 (671B)
}


def moe_router_groups(c: Case) -> tuple[int, int]:
    """(groups, groups per token) of the row's model's group-limited routing; (0, 0) when it has none."""
    if c["arch"] != "moe":
        return (0, 0)
    model = _moe_model(c)
    return MOE_ROUTER_GROUPS.get(model, (0, 0))


#: Megatron-Bridge releases whose performance presets run a model on a system with the HybridEP dispatcher
#: (``moe_flex_dispatcher_backend="hybridep"``), by (source_id, layers, hidden, device): every preset of that
#: model and system in the release sets it, whatever the precision. NeMo 25.11 = v0.2.0 scripts/performance/
#: configs/deepseek/workload_base_configs.py DEEPSEEK_V3_GB200_BASE_CONFIG, DEEPSEEK_V3_GB300_BASE_CONFIG and
#: configs/qwen3/workload_base_configs.py QWEN3_235B_A22B_GB200_* / _GB300_*, QWEN3_30B_A3B_GB200_* / _GB300_*;
#: 26.02.01 = v0.3.1 configs/qwen/qwen3_workload_base_configs.py QWEN3_235B_A22B_PRETRAIN_CONFIG_GB200_*_V1 /
#: _GB300_*_V1 and the 256-GPU _V2 presets built on them; 26.04 = v0.4.0 configs/deepseek/
#: deepseek_workload_base_configs.py DEEPSEEK_V3_PRETRAIN_CONFIG_B200_V1 / _B300_V1 (pp 16, ep 8; _V2: GBS 4096);
#: 26.04.01 = v0.4.1 DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_V1 (pp 2, vp 8, ep 32, MBS 2) and
#: gpt_oss_workload_base_configs.py GPT_OSS_120B_PRETRAIN_CONFIG_GB200_BF16_V2. NeMo 25.09 (v0.1.0rc4) has no
#: HybridEP. Other releases and systems run alltoall or DeepEP (:data:`MEGATRON_BRIDGE_DISPATCHER`).
MEGATRON_BRIDGE_HYBRIDEP: frozenset[tuple[str, int, int, str]] = frozenset({
    ("megatron_bridge_25.11", 61, 7168, "gb200"), ("megatron_bridge_25.11", 61, 7168, "gb300"),
    ("megatron_bridge_25.11", 94, 4096, "gb200"), ("megatron_bridge_25.11", 94, 4096, "gb300"),
    ("megatron_bridge_25.11", 48, 2048, "gb200"), ("megatron_bridge_25.11", 48, 2048, "gb300"),
    ("megatron_bridge_26.02.01", 94, 4096, "gb200"), ("megatron_bridge_26.02.01", 94, 4096, "gb300"),
    ("megatron_bridge_26.04", 61, 7168, "b200"), ("megatron_bridge_26.04", 61, 7168, "b300"),
    ("megatron_bridge_26.04.01", 61, 7168, "gb300"), ("megatron_bridge_26.04.01", 36, 2880, "gb200"),
})  # fmt: skip


_STATED_DISPATCHER = re.compile(r"\bdispatcher (HybridEP|DeepEP)\b")


def moe_dispatcher(c: Case) -> str:
    """The token dispatcher a MoE row ran: the one its notes name ("dispatcher HybridEP", from a launch line's
    ``--moe-flex-dispatcher-backend``), else that of the Megatron-Bridge recipe it ran ('' when none is known)."""
    if c["arch"] == "moe" and (stated := _STATED_DISPATCHER.search(c["notes"])):
        return stated.group(1).lower()
    if not c["source_id"].startswith("megatron_bridge") or c["arch"] != "moe":
        return ""
    if (preset := moe_preset(c)) is not None:
        return preset.dispatcher
    layout = tuple(c.int(k, 1) or 1 for k in ("tp", "pp", "vpp", "ep", "micro_batch"))
    model = (c.int("layers") or 0, c.int("hidden") or 0, c["device"])
    found = MEGATRON_BRIDGE_DISPATCHER.get((*model, layout), "")
    return found or ("hybridep" if (c["source_id"], *model) in MEGATRON_BRIDGE_HYBRIDEP else "")


#: Expert tensor parallelism of the Megatron-Bridge MoE performance recipes: 1 (the experts whole on every
#: rank, expert parallelism folded over tp x dp) in every release that publishes MoE rows: the v0.1.0rc4-era
#: perf matrices (scripts/performance/configs/deepseek/deepseek_v3_llm_pretrain.yaml ``etp: 1`` for h100
#: tp 2 ep 64, b200, gb200; configs/qwen3/qwen3_235b_a22b_llm_pretrain.yaml ``etp: 1`` for h100 tp 2 ep 32,
#: gb200, b200) and the later workload presets (BASE_DEEPSEEK_V3_CONFIG, BASE_QWEN3_235B_A22B_CONFIG,
#: BASE_QWEN3_30B_A3B_CONFIG = WorkloadBaseConfig(expert_tensor_parallel_size=1) in configs/deepseek/
#: deepseek_workload_base_configs.py and configs/qwen/qwen3_workload_base_configs.py).
MEGATRON_BRIDGE_EXPERT_TP = 1


_EXPERT_TP = re.compile(r"\bexpert tensor parallel (\d+)\b")


def expert_tp(c: Case) -> int | None:
    """The routed experts' tensor-parallel degree of a MoE row: the one its notes state ("expert tensor parallel
    N", from a source's ETP column; ``cases.csv`` has no column for it), else a Megatron-Bridge recipe's
    (:data:`MEGATRON_BRIDGE_EXPERT_TP`); None: Megatron's default, tp."""
    if c["arch"] != "moe":
        return None
    if stated := _EXPERT_TP.search(c["notes"]):
        return int(stated.group(1))
    return MEGATRON_BRIDGE_EXPERT_TP if c["source_id"].startswith("megatron_bridge") else None


#: Megatron-Bridge MoE performance recipes that overlap the EP all-to-alls with the adjacent micro-batch
#: (``moe_a2a_overlap=True``: ``comm_overlap.overlap_moe_expert_parallel_comm = True``, with
#: ``delay_wgrad_compute``, scripts/performance/utils/overrides.py ``_set_moe_a2a_overlap_overrides``;
#: WorkloadBaseConfig's default is False), by (source_id, layers, hidden, device, (tp, pp, vpp, ep,
#: micro-batch), global batch). QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_*_V1/_V2 (tp 2, pp 8, vp 4, ep 32;
#: V2 = GBS 8192), configs/qwen/qwen3_workload_base_configs.py (commit 01b2977); DEEPSEEK_V3_PRETRAIN_CONFIG
#: _B200_FP8_MX_V2 (deepep, pp 8, vp 2, ep 32, GBS 4096), configs/deepseek/deepseek_workload_base_configs.py
#: (commit 0426418); GPT_OSS_120B_PRETRAIN_CONFIG_GB200_BF16_V2 (ep 64, MBS 4, GBS 1280, hybridep),
#: configs/gpt_oss/gpt_oss_workload_base_configs.py (v0.4.1 and v0.4.2 line 106). NeMo 25.11 runs v0.2.0,
#: whose QWEN3_235B_A22B_H100_FP8_CS_BASE_CONFIG (tp 2, pp 8, vp 4, ep 32, GBS 2048) sets it too
#: (configs/qwen3/workload_base_configs.py line 143; utils/helpers.py set_workload_base_configs applies
#: it). Held back: NeMo 25.09's DeepSeek-V3 H100 script also sets it (v0.1.0rc4 scripts/performance/run_script.py
#: lines 62, 82-84, ``A2A_1F1B``), but with it those rows go +2.1% -> -21.2% and every row that takes the overlap
#: is 15-41% too fast while the same rows without it are +2..+34%: the combined-1F1B model hides more than these
#: runs did, and wants checking before more rows take it. A row takes it only where its release's own preset has
#: the row's layout and batch: the 26.02.01
#: (r0.3.1) presets of the H100 Qwen3-30B and B300 Qwen3-235B rows' layouts are ep 16 / no vp there.
MEGATRON_BRIDGE_EP_OVERLAP: frozenset[tuple[str, int, int, str, tuple[int, ...], int]] = frozenset({
    ("megatron_bridge_25.11", 94, 4096, "h100-sxm", (2, 8, 4, 32, 1), 2048),
    ("megatron_bridge_26.04.01", 94, 4096, "h100-sxm", (2, 8, 4, 32, 1), 8192),
    ("megatron_bridge_26.04.01", 61, 7168, "b200", (1, 8, 2, 32, 1), 4096),
    ("megatron_bridge_26.04.01", 36, 2880, "gb200", (1, 1, 1, 64, 4), 1280),
})  # fmt: skip


def ep_overlap(c: Case) -> bool:
    """Whether the Megatron-Bridge recipe behind a row runs combined 1F1B (:data:`MEGATRON_BRIDGE_MOE_PRESETS`,
    then :data:`MEGATRON_BRIDGE_EP_OVERLAP`)."""
    if (preset := moe_preset(c)) is not None:
        return preset.ep_overlap
    layout = tuple(c.int(k, 1) or 1 for k in ("tp", "pp", "vpp", "ep", "micro_batch"))
    key = (c["source_id"], c.int("layers") or 0, c.int("hidden") or 0, c["device"], layout, c.int("global_batch") or 0)
    return key in MEGATRON_BRIDGE_EP_OVERLAP


#: The micro-batch of the Megatron-Bridge recipe behind a published row whose table contradicts itself
#: (its GBS is not MBS x DP x GA: the row's notes flag it), by (source_id, layers, hidden, device, tp, pp,
#: vpp, ep); only where the same release's performance recipe has that layout (system, GPUs, global batch,
#: parallel sizes) and states the micro-batch.
#: 25.09 DGX-GB200 LLAMA3_70B, the parenthesised (MXFP8) variant: MBS 2 but GA 16 with GBS 128 and DP 8,
#: i.e. 1; v0.1.0rc4 scripts/performance/configs/llama3/llama3_70b_llm_pretrain.yaml perf_matrix gb200
#: fp8_mx: ``mbs: 1, tp: 2, pp: 4, vp: 5``.
#: 25.11 DGX-H100 GPT OSS 120B: MBS 4 and GA 2 (the DGX-B200 row's pair, DP 64) with PP 4 (DP 16); v0.2.0
#: scripts/performance/configs/gpt_oss/workload_base_configs.py GPT_OSS_120B_H100_BF16_BASE_CONFIG: pp 4,
#: ep 8, GBS 512 on 64 GPUs with the base ``micro_batch_size=1``.
#: (25.11 DGX-GB300 Qwen3_235B_a22B, also flagged, has no recipe of its layout in v0.2.0: kept as stated.)
MEGATRON_BRIDGE_MICRO_BATCH: dict[tuple[str, int, int, str, int, int, int, int], int] = {
    ("megatron_bridge_25.09", 80, 8192, "gb200", 2, 4, 5, 1): 1,
    ("megatron_bridge_25.11", 36, 2880, "h100-sxm", 1, 4, 1, 8): 1,
}


def recipe_micro_batch(c: Case) -> int | None:
    """The recipe's micro-batch for a Megatron-Bridge row whose table contradicts itself
    (:data:`MEGATRON_BRIDGE_MICRO_BATCH`); None when the row's own micro-batch stands."""
    if not c["source_id"].startswith("megatron_bridge") or "CONSISTENCY:" not in c["notes"]:
        return None
    tp, pp, vpp, ep = (c.int(k, 1) or 1 for k in ("tp", "pp", "vpp", "ep"))
    return MEGATRON_BRIDGE_MICRO_BATCH.get(
        (c["source_id"], c.int("layers") or 0, c.int("hidden") or 0, c["device"], tp, pp, vpp, ep)
    )


#: The layout of the Megatron-Bridge recipe behind a published row whose table prints another one, by
#: (source_id, layers, hidden, device, dtype, (tp, pp, vpp, micro-batch) as printed): only where every branch of
#: the release's code has one recipe for that system, GPU count, precision and global batch, and the printed
#: layout is not one the recipe can run.
#: 26.02.01 DGX-GB300 LLAMA3_70B (docs/performance-summary-archive.md, added by commit e40d000 "patch container
#: numbers") prints MXFP8 as MBS 2, PP 4, VP n/a and NVFP4 as MBS 2, TP 1, PP 1, FSDP 0 (a whole 70B model
#: replicated on every GPU). NeMo 26.02.01 runs Megatron-Bridge r0.3.x, whose presets (tags v0.3.0, v0.3.1 and
#: branches r0.3.0, llmb-r0.3.1: scripts/performance/configs/llama/llama3_workload_base_configs.py
#: LLAMA3_70B_PRETRAIN_CONFIG_GB300_FP8_MX_V2 and _NVFP4_V2 on BASE_LLAMA3_70B_CONFIG_GBS256) are both
#: ``pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=5`` with WorkloadBaseConfig's
#: ``micro_batch_size=1`` and tp 1: the layout the 26.02 and 26.04.01 tables print for the same runs.
MEGATRON_BRIDGE_RECIPE_LAYOUT: dict[tuple[str, int, int, str, str, tuple[int, ...]], dict[str, int]] = {
    ("megatron_bridge_26.02.01", 80, 8192, "gb300", "mxfp8", (1, 4, 1, 2)): {"pp": 4, "vpp": 5, "micro_batch": 1},
    ("megatron_bridge_26.02.01", 80, 8192, "gb300", "nvfp4", (1, 1, 1, 2)): {"pp": 4, "vpp": 5, "micro_batch": 1},
}


def recipe_layout(c: Case) -> dict[str, int]:
    """pp, vpp, micro-batch and the data-parallel size of the recipe behind a Megatron-Bridge row whose table
    prints another layout (:data:`MEGATRON_BRIDGE_RECIPE_LAYOUT`); empty when the printed layout stands."""
    if not c["source_id"].startswith("megatron_bridge"):
        return {}
    printed = tuple(c.int(k, 1) or 1 for k in ("tp", "pp", "vpp", "micro_batch"))
    key = (c["source_id"], c.int("layers") or 0, c.int("hidden") or 0, c["device"], c["dtype"], printed)
    found = MEGATRON_BRIDGE_RECIPE_LAYOUT.get(key)
    if not found:
        return {}
    tp, cp, devices = c.int("tp", 1) or 1, c.int("cp", 1) or 1, c.int("devices") or 0
    return {**found, "dp": devices // (tp * found["pp"] * cp)}


#: Megatron-Bridge's Llama 3 / 3.1 performance scripts switch TP communication overlap off for NVFP4 on every
#: Blackwell system: ``cfg.comm_overlap.tp_comm_overlap = False if precision == "nvfp4" else ...`` in each of
#: ``llama3_{8b,70b}_pretrain_config_{gb300,gb200,b300,b200}`` and ``llama31_405b_pretrain_config_{...}``
#: (scripts/performance/configs/llama/llama3_llm_pretrain.py and llama31_llm_pretrain.py, tags v0.3.0 to v0.5.0,
#: the releases that publish NVFP4 rows). The dense recipes otherwise overlap it (frameworks._NEMO_TP_OVERLAP).
MEGATRON_BRIDGE_NVFP4_TP_OVERLAP = False


#: A row's notes saying its attention ran unfused (materialised scores, Plan.attention 'math'), where its source's
#: software had no fused kernel for the model's shapes on that part: e.g. Transformer Engine before v2.5 for MLA's
#: head_dim_qk 192 on Blackwell (transformer_engine/common/fused_attn/fused_attn.cpp, v2.1-v2.4:
#: ``!(sm_arch_ >= 100 && (head_dim_qk > 128 || head_dim_v > 128))``; FlashAttention is off whenever
#: head_dim_qk != head_dim_v, pytorch/attention/dot_product_attention/utils.py; v2.5 adds d_qk 192 / d_v 128 on
#: sm_100 with cuDNN 9.11).
UNFUSED_ATTENTION_NOTE = "attention unfused"

#: A row's notes saying its recipe turned TP communication overlap off (e.g. NeMo's DeepSeek-V3 performance recipe:
#: ``MegatronCommOverlapCallback(tp_comm_overlap=False)``).
TP_OVERLAP_OFF_NOTE = "TP communication overlap off"


def megatron_bridge_tp_overlap(c: Case) -> bool | None:
    """The TP-overlap setting a Megatron-Bridge row's script states (None: the framework's default)."""
    if c["source_id"].startswith("megatron_bridge") and c["arch"] != "moe" and c["dtype"] == "nvfp4":
        return MEGATRON_BRIDGE_NVFP4_TP_OVERLAP
    return None


_ASYNC_TP = re.compile(r"\basync ?tp\b", re.I)


def torchtitan_async_tp(c: Case) -> bool | None:
    """True for a torchtitan row with tp > 1 whose source says it ran async tensor parallelism
    (``parallelism.enable_async_tensor_parallel``): its all-gather / reduce-scatter are split into chunks that
    overlap the TP matmuls (torch/distributed/_symmetric_memory ``fused_all_gather_matmul`` /
    ``fused_matmul_reduce_scatter``), what ``tp_overlap`` prices. The torchtitan config reader maps the same
    flag to ``tp_overlap`` (:mod:`echosim.configs.torchtitan`). None otherwise (the framework's default)."""
    from echosim.frameworks import framework_named_in

    if (c.int("tp", 1) or 1) <= 1 or not framework_named_in(c["framework"]).startswith("torchtitan"):
        return None
    return True if _ASYNC_TP.search(c["notes"]) else None


def stated_tp_overlap(c: Case) -> bool | None:
    """The TP-overlap setting a row's source states: off where its notes say so (:data:`TP_OVERLAP_OFF_NOTE`),
    a Megatron-Bridge NVFP4 script's, a torchtitan run's async TP; None: the framework's default."""
    if TP_OVERLAP_OFF_NOTE in c["notes"]:
        return False
    bridge = megatron_bridge_tp_overlap(c)
    return bridge if bridge is not None else torchtitan_async_tp(c)


def _source_flags(c: Case) -> dict[str, Any]:
    """The source's script flags for the settings the row leaves blank (sp and tp_overlap only where tp > 1)."""
    flags = dict(SOURCE_FLAGS.get(c["source_id"], {}))
    flags.update(SOURCE_MODEL_FLAGS.get((c["source_id"], c.int("layers") or 0, c.int("hidden") or 0), {}))
    if (c.int("tp", 1) or 1) <= 1:
        flags.pop("sp", None)
        flags.pop("tp_overlap", None)
    return {k: v for k, v in flags.items() if not c[k].strip()}


def row_plan(c: Case, calibration: str = "") -> tuple[Any, Any]:
    """The row's Plan and Cluster. Blank cells take the defaults of the row's framework
    (:mod:`echosim.frameworks`, read from its ``framework`` column), then the Plan's own."""
    from echosim.plan import Cluster, Plan, plan_with_defaults

    flags = _source_flags(c)
    recipe = recipe_layout(c)
    vpp = flags.get("vpp") or recipe.get("vpp") or c.int("vpp") or torchtitan_vpp(c) or 1
    stated = {
        "tp": c.int("tp") or None,
        "pp": c.int("pp") or None,
        "dp": _derived_dp(c),
        "cp": c.int("cp") or None,
        "ep": c.int("ep") or None,
        "vpp": c.int("vpp") or torchtitan_vpp(c),
        "sp": None if c.int("sp") is None else c.int("sp") == 1,
        "zero": c.int("zero"),
        "micro_batch": recipe_micro_batch(c) or replica_micro_batch(c),
        "global_batch": c.int("global_batch") or 0,
        "seq_len": c.int("seq_len") or 0,
        # blank: the framework's default, else 16-bit mixed precision (fp16 and bf16 cost the same)
        "dtype": maxtext_quantization(c) or block_scaled_dtype(c) or c["dtype"] or None,
        "recompute": remat_policy(c) or stated_recompute(c) or c["recompute"] or megatron_bridge_recompute(c) or None,
        "schedule": row_schedule(c, vpp),
        "framework": row_framework(c),
    }
    stated.update(flags)
    stated.update(recipe)
    stated.update(maxtext_script_layout(c))
    stated["moe_dispatcher"] = stated.get("moe_dispatcher") or moe_dispatcher(c) or None
    stated["etp"] = expert_tp(c)
    stated["moe_ep_overlap"] = ep_overlap(c) or None
    if (overlap := stated_tp_overlap(c)) is not None:
        stated["tp_overlap"] = overlap
    if UNFUSED_ATTENTION_NOTE in c["notes"]:
        stated["attention"] = "math"
    preset = moe_preset(c)
    stated["fp8_attention"] = (preset is not None and preset.fp8_attention) or None
    stated["moe_fused_mlp"] = (preset is not None and preset.fused_mlp) or None
    drop = token_drop_capacity(c)
    stated["moe_capacity_factor"] = moe_capacity_factor(c) or drop or None
    stated["moe_pad_to_capacity"] = bool(drop) or None
    groups, group_topk = moe_router_groups(c)
    stated["moe_router_groups"], stated["moe_router_group_topk"] = groups or None, group_topk or None
    stated["offload_layers"] = offload_layers(c) or None
    stated["optimizer_dtypes"] = SOURCE_OPTIMIZER_DTYPES.get(c["source_id"])
    stated["grad_dtype"] = launcher_grad_dtype(c) or None
    stated["splash_blocks"] = maxtext_splash_blocks(c) or None
    stated["loss_chunks"] = chunks if (chunks := loss_chunks(c)) > 1 else None
    stated["pp_balance"] = pp_layout(c) or SOURCE_PP_BALANCE.get(c["source_id"]) or None
    plan = plan_with_defaults(Plan(), {k: v for k, v in stated.items() if v is not None}, c["arch"])
    backend = backend_for(c["device"]) or c["device"]
    devices = c.int("devices") or 0
    stated = c.int("devices_per_node", 8) or 8
    # cases.csv counts TPU hosts (4 chips); the TPU backend's node is the ICI slice. 128 GPUs of
    # NVL72 racks are two domains of 64.
    slice_chips = devices // (c.int("slices", 1) or 1)
    per_node = slice_chips if backend in SLICE_BACKENDS else fill_domains(devices, stated)
    cluster = Cluster(backend, devices, per_node, **({"calibration": calibration} if calibration else {}))
    return plan, cluster
