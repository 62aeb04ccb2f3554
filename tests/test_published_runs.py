"""What published runs need: GQA on the gpt block, MLA, block-scaled precisions, more (virtual) stages
than layers, fused projections under tensor parallelism, and the one-line refusals."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from conftest import capture

from echosim.cli import cli
from echosim.compiler import lower
from echosim.frontend.zoo import PUBLISHED_PARAMS, ZOO, ArchConfig
from echosim.frontend.zoo_modules import build_module
from echosim.ir.ops import AttentionAttrs, MatmulAttrs, OpKind
from echosim.passes.autodiff import Autodiff
from echosim.passes.base import run_passes
from echosim.passes.flops import graph_flops
from echosim.plan import Cluster, Plan, PlanError

# A small MLA model with DeepSeek's proportions: head 48 = nope 32 + rope 16, v 32, kv latent 4 x 32.
TINY_MLA = ArchConfig(
    "llama", layers=2, hidden=128, heads=4, vocab=256, ffn=192, head_dim=48, seq_len=32,
    kv_lora_rank=128, q_lora_rank=96, rope_head_dim=16, v_head_dim=32,
)  # fmt: skip


def params_of(cfg: ArchConfig) -> int:
    return sum(p.numel() for p in build_module(cfg).parameters())


# ---- GQA on the gpt block (Nemotron-4) -----------------------------------------------------------


def test_gpt_block_with_grouped_query_attention() -> None:
    cfg = ArchConfig("gpt", 2, 256, 8, 512, kv_heads=2, seq_len=64, tied_embeddings=True)
    assert params_of(cfg) == cfg.param_count()
    assert build_module(cfg).layers[0].attn.qkv.out_features == (8 + 2 * 2) * 32
    compiled = lower(cfg, Plan(tp=2, sp=True), Cluster("null", 2))
    attn = [n.attrs for n in compiled.graph if isinstance(n.attrs, AttentionAttrs)]
    assert attn and all((a.heads, a.kv_heads) == (4, 1) for a in attn)  # split per head group
    with pytest.raises(PlanError, match=r"tp=4 does not divide key/value heads \(2\)"):
        lower(cfg, Plan(tp=4), Cluster("null", 4))


# ---- MLA -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("q_lora", [96, 0])
def test_mla_parameters_match_the_closed_form(q_lora: int) -> None:
    cfg = TINY_MLA.with_(q_lora_rank=q_lora)
    assert params_of(cfg) == cfg.param_count()
    moe = cfg.with_(arch="moe", experts=4, top_k=2, moe_ffn=32, shared_experts=1, dense_layers=1)
    assert params_of(moe) == moe.param_count()


def test_deepseek_v3_has_its_published_sizes() -> None:
    """671B in total and 37B activated per token (arXiv:2412.19437, without the 14B MTP module); the
    captured model folds its 58 MoE layers after the 3 dense ones and pipelines them, the uniform split counting
    the dense ones: 61 layers as 16, 15, 15, 15, the first stage's 3 dense and 13 MoE."""
    cfg = ZOO["deepseek-v3"]
    compiled = lower("deepseek-v3", Plan(pp=4, dp=2, ep=2, seq_len=256, global_batch=8), Cluster("null", 8))
    assert compiled.graph.repeats == {"layers.3": 58} and compiled.report.params == cfg.param_count()
    assert [s.layers for s in compiled.stages] == [13, 15, 15, 15]
    assert cfg.param_count() == pytest.approx(PUBLISHED_PARAMS["deepseek-v3"], rel=0.001)
    assert cfg.active_params() == pytest.approx(37e9, rel=0.02)
    # attention alone: 187.1M per layer (q: 7168*1536 + 1536 + 1536*128*192; kv: 7168*576 + 512 +
    # 512*128*256; o: 128*128*7168)
    assert cfg.attention_params() == 7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256 + (
        128 * 128 * 7168
    )


def test_mla_flops_match_the_closed_form() -> None:
    """Forward + backward = 3 x forward: the latent projections, QK^T over the 48-wide head, PV over
    the 32-wide value head (the causal half of the scores), the MLP and the output layer."""
    c = TINY_MLA
    b, s, h, a = 2, c.seq_len, c.hidden, c.heads
    t = b * s
    proj = c.hidden * c.q_lora_rank + c.q_lora_rank * a * c.head_dim  # q down + up
    proj += h * (c.kv_lora_rank + c.rope_head_dim) + c.kv_lora_rank * a * (c.head_dim - c.rope_head_dim + c.v_head_dim)
    proj += a * c.v_head_dim * h  # o_proj
    core = b * a * s * (s + 1) * (c.head_dim + c.v_head_dim)
    mlp = 3 * h * c.ffn
    forward = c.layers * (2 * t * (proj + mlp) + core) + 2 * t * h * c.vocab
    g = run_passes(capture(c, batch=b), [Autodiff()])
    assert graph_flops(g).model == 3 * forward


def test_validate_reads_mla_from_the_columns(tmp_path) -> None:
    """kv_heads blank + head_dim 192 (DeepSeek-V3's row): d_h 128, rope 64, kv latent 512, q latent 1536."""
    from test_validate import row, write

    from echosim.validation.cases import read_cases
    from echosim.validation.rows import row_model

    cells = {"arch": "moe", "layers": "61", "hidden": "7168", "heads": "128", "kv_heads": "", "head_dim": "192"}
    cells |= {"ffn_hidden": "18432", "vocab": "129280", "experts": "256", "top_k": "8", "moe_ffn_hidden": "2048"}
    cfg = row_model(read_cases(write(tmp_path, row(**cells, shared_experts="1")))[0])
    assert (cfg.kv_lora_rank, cfg.q_lora_rank, cfg.rope_head_dim, cfg.v_head_dim) == (512, 1536, 64, 128)
    # the first 3 layers dense (rows.DENSE_FIRST_LAYERS; no column gives them): every layer MoE would be 671B +
    # 3 x (257 x 3 x 7168 x 2048 - 3 x 7168 x 18432) = 703.8B parameters, with the same FLOPs per token
    # The row trains one MTP module (rows.MTP_LAYERS): a MoE block, a 2h -> h projection and three norms, 11.6B;
    # DeepSeek-V3's report counts 14B with the checkpoint's own copy of the embedding and output head (1.85B)
    full = ZOO["deepseek-v3"].with_(mtp_layers=1)
    assert (cfg.mtp_layers, cfg.dense_layers) == (1, 3)
    assert full.param_count() - ZOO["deepseek-v3"].param_count() == pytest.approx(11.6e9, rel=0.01)
    assert cfg.param_count() == full.param_count()
    # a blank kv_heads with head_dim = hidden / heads is an unstated GQA, not MLA
    plain = row_model(read_cases(write(tmp_path, row(arch="llama", kv_heads="", head_dim="16")))[0])
    assert plain.kv_lora_rank == 0 and plain.n_kv_heads == plain.heads
    all_moe = full.with_(dense_layers=0).param_count() - full.param_count()
    assert all_moe == 3 * (3 * 7168 * 2048 * 257 + 7168 * 256 - 3 * 7168 * 18432)


@pytest.mark.slow
@pytest.mark.parametrize(("source", "ep", "experts"), [("hf:qwen3-30b-a3b", 8, 128), ("hf:mixtral-8x7b", 8, 8)])
def test_real_hf_moe_configs_split_by_ep(source: str, ep: int, experts: int) -> None:
    plan = Plan(dp=ep, ep=ep, seq_len=1024, global_batch=ep)
    compiled = lower(source, plan, Cluster("h100-sxm", ep))
    stacks = {n.out.shape[0] for n in compiled.graph if n.op is OpKind.PARAMETER and len(n.out.shape) == 3}
    assert stacks == {experts // ep}
    assert compiled.report.breakdown["comm.ep"] > 0


# ---- precisions ------------------------------------------------------------------------------------


def test_block_scaled_formats_run_where_the_device_has_them() -> None:
    cfg = ZOO["llama3-8b"]
    plan = Plan(dp=8, global_batch=8, seq_len=2048)
    times = {d: lower(cfg, Plan(**{**plan.as_dict(), "dtype": d}), Cluster("b200", 8)).report for d in
             ("bf16", "fp8", "mxfp8", "nvfp4")}  # fmt: skip
    step = {d: r.step_time_s for d, r in times.items()}
    assert step["nvfp4"] < step["mxfp8"] < step["bf16"] and step["fp8"] < step["bf16"]
    assert step["mxfp8"] == pytest.approx(step["fp8"], rel=0.05)  # the fp8 rate, the block scales' bytes
    # MFU against the 16-bit peak for every format: it grows as the step shrinks
    assert times["nvfp4"].mfu * step["nvfp4"] == pytest.approx(times["bf16"].mfu * step["bf16"], rel=1e-9)
    g = lower(cfg, Plan(**{**plan.as_dict(), "dtype": "nvfp4"}), Cluster("b200", 8)).graph
    assert {n.attrs.precision for n in g if isinstance(n.attrs, MatmulAttrs) and n.scope.endswith("proj")} == {"nvfp4"}


@pytest.mark.parametrize(("dtype", "backend"), [("nvfp4", "h100-sxm"), ("mxfp8", "h200"), ("nvfp4", "tpu-v5p")])
def test_a_format_the_device_lacks_is_one_line(dtype: str, backend: str) -> None:
    result = CliRunner().invoke(cli, ["compile", "llama3-8b", "--backend", backend, "--devices", "8", "--dtype", dtype])
    assert result.exit_code != 0 and "Traceback" not in result.output
    (line,) = result.output.strip().splitlines()
    assert f"--dtype {dtype}: backend '{backend}' cannot run {dtype}" in line


def test_search_in_a_format_the_device_lacks_is_one_line_not_a_table() -> None:
    args = ["search", "llama3-8b", "--backend", "h100-sxm", "--devices", "8", "--global-batch", "8"]
    result = CliRunner().invoke(cli, [*args, "--dtype", "nvfp4"])
    assert result.exit_code != 0
    (line,) = result.output.strip().splitlines()
    assert "--dtype nvfp4: backend 'h100-sxm' cannot run nvfp4" in line


def test_an_ep_that_does_not_divide_the_experts_is_one_line() -> None:
    result = CliRunner().invoke(cli, ["compile", "mixtral-8x7b", "--devices", "6", "--ep", "3", "--json"])
    assert result.exit_code != 0
    (line,) = result.output.strip().splitlines()
    assert "ep=3 does not divide" in line and "8" in line


# ---- more (virtual) pipeline stages than layers --------------------------------------------------


def test_embedding_and_loss_take_stages_of_their_own() -> None:
    """Megatron-Core's account_for_embedding/loss_in_pipeline_split: 4 layers on 6 stages."""
    cfg = ZOO["llama3-8b"].with_(layers=4, seq_len=512)
    compiled = lower(cfg, Plan(pp=3, vpp=2, dp=1, global_batch=6), Cluster("h100-sxm", 3))
    assert [s.layers for s in compiled.stages] == [0, 1, 1, 1, 1, 0]
    first, last = compiled.stages[0].graph, compiled.stages[-1].graph
    assert any(n.op is OpKind.EMBEDDING for n in first) and not any(n.op is OpKind.ATTENTION for n in first)
    assert any(n.op is OpKind.CROSS_ENTROPY for n in last) and not any(n.op is OpKind.ATTENTION for n in last)
    with pytest.raises(PlanError, match=r"pp\*vpp=8 exceeds the number of layers \(4\) plus the embedding"):
        lower(cfg, Plan(pp=4, vpp=2, dp=1, global_batch=8), Cluster("h100-sxm", 4))


# ---- fused projections (Phi-3) -------------------------------------------------------------------


def test_fused_qkv_and_gate_up_split_per_head_group_and_half() -> None:
    """Phi-3's qkv_proj ([q, k, v] of 4 heads / 2 kv heads) and gate_up_proj (2 x 96) under tp=2: each
    rank holds 2 query heads with 1 kv head and 48 of each half; FLOPs split evenly."""
    from pathlib import Path

    source = f"hf:{Path(__file__).parent / 'configs' / 'tiny-phi3.json'}"
    one = lower(source, Plan(seq_len=16), Cluster("null", 1))
    two = lower(source, Plan(tp=2, sp=True, seq_len=16), Cluster("null", 2))
    attn = {(n.attrs.heads, n.attrs.kv_heads) for n in two.graph if isinstance(n.attrs, AttentionAttrs)}
    assert attn == {(2, 1)}
    weights = {n.scope: n.out.shape for n in two.graph if n.op is OpKind.PARAMETER and "proj" in n.scope}
    assert weights["model.layers.0.self_attn.qkv_proj"] == ((4 + 2 * 2) * 16 // 2, 64)
    assert weights["model.layers.0.mlp.gate_up_proj"] == (2 * 96 // 2, 64)
    assert two.report.model_flops_per_step == pytest.approx(one.report.model_flops_per_step, rel=1e-9)  # all ranks


def test_report_json_is_deterministic_for_new_formats() -> None:
    args = ["compile", "deepseek-v3", "--backend", "gb300", "--devices", "8", "--dp", "8", "--ep", "8"]
    args += ["--dtype", "mxfp8", "--global-batch", "8", "--seq-len", "1024", "--json"]
    one, two = (CliRunner().invoke(cli, args) for _ in range(2))
    assert one.exit_code == 0, one.output
    assert one.output == two.output and json.loads(one.output)["plan"]["dtype"] == "mxfp8"


# ---- interleaved MoE layers (Llama 4 Maverick) ---------------------------------------------------

TINY_INTERLEAVED = ArchConfig(
    "moe", layers=4, hidden=64, heads=4, vocab=128, ffn=96, kv_heads=2, seq_len=16,
    experts=4, top_k=1, moe_ffn=32, shared_experts=1, moe_layer_step=2,
)  # fmt: skip


def test_interleaved_moe_layers_match_the_closed_form() -> None:
    """Layers 1 and 3 hold the experts (HF Llama 4 / MaxText: (i + 1) % step == 0), 0 and 2 a dense MLP."""
    cfg = TINY_INTERLEAVED
    assert [cfg.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    h, attn = 64, 64 * (4 + 2 * 2) * 16 + 4 * 16 * 64
    moe = h * 4 + 3 * h * 32 * (4 + 1)  # router, 4 routed + 1 shared expert
    dense = 3 * h * 96
    assert cfg.param_count() == 4 * (attn + 2 * h) + 2 * dense + 2 * moe + 2 * 128 * h + h
    assert params_of(cfg) == cfg.param_count()
    # one token runs through the shared expert and top_k = 1 of the 4 routed ones
    assert cfg.active_params() == cfg.param_count() - 2 * 3 * h * 32 * 3


def test_interleaved_moe_block_folds_as_dense_then_moe_pair() -> None:
    """The repeating unit is the (dense, MoE) pair: the fold keeps one pair with the pair count."""
    cfg = TINY_INTERLEAVED.with_(layers=8)
    compiled = lower(cfg, Plan(pp=2, dp=1, seq_len=16, global_batch=4), Cluster("null", 2))
    assert compiled.graph.repeats == {"layers.0": 4}
    assert compiled.report.params == cfg.param_count() == params_of(cfg)
    assert [s.layers for s in compiled.stages] == [2, 2]
    scopes = {".".join(n.scope.split(".")[2:4]) for n in compiled.graph if n.scope.startswith("layers.0.")}
    assert {"0.mlp", "1.moe"} <= scopes and "0.moe" not in scopes and "1.mlp" not in scopes


def test_llama4_maverick_has_its_published_sizes() -> None:
    """Meta's model card: 400B total, 17B active. 24 MoE layers of 128 x 8192 routed + 1 shared
    expert, 24 dense of 16384, GQA 40 / 8 heads of 128, vocabulary 202048, untied output layer."""
    cfg = ZOO["llama4-maverick"]
    h = 5120
    attn = h * (40 + 16) * 128 + 40 * 128 * h
    moe = h * 128 + 3 * h * 8192 * 129
    closed = 48 * (attn + 2 * h) + 24 * 3 * h * 16384 + 24 * moe + 2 * 202048 * h + h
    assert cfg.param_count() == closed == 400_711_848_960
    assert cfg.param_count() == pytest.approx(PUBLISHED_PARAMS["llama4-maverick"], rel=0.002)
    assert cfg.active_params() == pytest.approx(17e9, rel=0.02)
    # every layer MoE would be 784B, the figure echosim gave before it knew the step
    assert cfg.with_(moe_layer_step=1).param_count() == pytest.approx(784e9, rel=0.002)


def test_interleaved_moe_refuses_a_depth_the_step_does_not_divide() -> None:
    from echosim.errors import EchosimError

    with pytest.raises(EchosimError, match="layers divisible by the step"):
        lower(TINY_INTERLEAVED.with_(layers=5), Plan(seq_len=16, global_batch=1), Cluster("null", 1))


def test_validate_gives_llama4_maverick_its_dense_layers(tmp_path) -> None:
    """A Maverick row (48 x 5120, 128 experts, top-1, ffn 16384, experts 8192 + 1 shared) is the
    zoo's model: half its layers dense, 400.7B parameters, not 784B."""
    from test_validate import row, write

    from echosim.validation.cases import read_cases
    from echosim.validation.rows import row_model

    cells = {"arch": "moe", "layers": "48", "hidden": "5120", "heads": "40", "kv_heads": "8", "head_dim": "128"}
    cells |= {"ffn_hidden": "16384", "vocab": "202048", "experts": "128", "top_k": "1", "moe_ffn_hidden": "8192"}
    cfg = row_model(read_cases(write(tmp_path, row(**cells, shared_experts="1")))[0])
    assert cfg.moe_layer_step == 2 and cfg.param_count() == ZOO["llama4-maverick"].param_count()
    scout = row_model(read_cases(write(tmp_path, row(**(cells | {"experts": "16"}), shared_experts="1")))[0])
    assert scout.moe_layer_step == 1 and scout.moe_layers == 48


# ---- Megatron-Core pipeline layouts ---------------------------------------------------------------


def test_megatron_layout_strings_give_layers_per_stage() -> None:
    from echosim.passes.pipeline import layout_counts

    # DeepSeek-V3 on H100 (Megatron-Bridge): the embedding and one layer, 30 stages of two, MTP and loss
    assert layout_counts("Et|(tt|)*30mL") == [1] + [2] * 30 + [0]
    assert layout_counts("Et*4|(t*4|)*14tmL") == [4] * 15 + [1]
    assert layout_counts("Ettt|(tt|)*29,m|L") == [3] + [2] * 29 + [0, 0]  # Megatron-Core's own example


@pytest.mark.parametrize(
    ("layout", "message"),
    [("Etx|tL", "unknown character"), ("tt|EL", "embedding E must open"), ("Et|tt", "loss L close")],
)
def test_a_bad_layout_is_one_line(layout: str, message: str) -> None:
    result = CliRunner().invoke(
        cli, ["compile", "llama3-8b", "--devices", "2", "--pp", "2", "--pp-balance", f"layout:{layout}"]
    )
    assert result.exit_code != 0
    (line,) = result.output.strip().splitlines()
    assert message in line


def test_a_layout_splits_the_stages_as_written() -> None:
    """6 layers on pp 2 x vpp 2: 'Et|ttt|t|tL' gives 1, 3, 1, 1; rank 0 holds chunks 0 and 2 (2 layers)."""
    cfg = ZOO["llama3-8b"].with_(layers=6, seq_len=256)
    plan = Plan(pp=2, vpp=2, dp=1, global_batch=4, schedule="interleaved", pp_balance="layout:Et|ttt|t|tL")
    compiled = lower(cfg, plan, Cluster("h100-sxm", 2))
    assert [s.layers for s in compiled.stages] == [1, 3, 1, 1]
    assert [m["layers"] for m in compiled.report.memory] == [2, 4]
    with pytest.raises(PlanError, match=r"has 3 stages, not pp x vpp = 2\*2"):
        lower(cfg, replace_plan(plan, pp_balance="layout:Ett|ttt|tL"), Cluster("h100-sxm", 2))
    with pytest.raises(PlanError, match="the model's 6 layers"):
        lower(cfg, replace_plan(plan, pp_balance="layout:Et|tt|t|tL"), Cluster("h100-sxm", 2))


def test_a_layout_counts_dense_first_layers_and_runs_them_on_the_first_stage() -> None:
    """DeepSeek-style dense first layers sit before the repeated MoE block, with the embedding: a layout that counts
    them (Megatron-Core's does: 'Et|tt|tt|ttL' for 3 dense + 4 MoE layers) gives the first stages' share of them to the
    first stage. A layout over the MoE layers alone still works."""
    from echosim.passes.pipeline import leading_layers

    cfg = ZOO["deepseek-v3"].with_(layers=7, seq_len=128, experts=8, top_k=2)
    plan = Plan(pp=2, vpp=2, dp=1, ep=1, global_batch=4, schedule="interleaved", pp_balance="layout:Et|tt|tt|ttL")
    compiled = lower(cfg, plan, Cluster("h100-sxm", 2))
    assert [s.layers for s in compiled.stages] == [0, 0, 2, 2]  # the 3 dense layers: stage 0's one and stage 1's two
    assert [
        s.layers for s in lower(cfg, replace_plan(plan, pp_balance="layout:E|t|tt|tL"), Cluster("h100-sxm", 2)).stages
    ] == [0, 1, 2, 1]
    assert (leading_layers("layers.3"), leading_layers("layers.0"), leading_layers("h")) == (3, 0, 0)


def replace_plan(plan: Plan, **changes: object) -> Plan:
    from dataclasses import replace

    return replace(plan, **changes)  # type: ignore[arg-type]


def test_validate_takes_the_recipes_pipeline_layout() -> None:
    from conftest import SHARED

    from echosim.validation.cases import read_cases
    from echosim.validation.rows import row_plan

    path = SHARED / "validation" / "cases.csv"
    if not path.exists():
        pytest.skip("shared/validation not present")
    cases = {c.case_id: c for c in read_cases(path)}
    h100 = row_plan(cases["mbridge2509-deepseekv3-dropless-h100-sxm-1024"])[0]
    assert h100.pp_balance == "layout:Et|(tt|)*30mL"
    assert row_plan(cases["mbridge2511-deepseekv3-w-o-mtp-bf16-gb300-256"])[0].pp_balance == "uniform"
    # pp 16 without a layout in the script: the DeepSeek-V3 recipe's own map, MTP beside the loss
    b200 = row_plan(cases["mbridge2511-deepseekv3-w-mtp-mxfp8-b200-256"])[0]
    assert b200.pp_balance == "layout:Et*4|(t*4|)*14tmL"
    # a run without MTP takes the same split without its m; DeepSeek's own run balances stage cost
    assert row_plan(cases["mbridge2511-deepseekv3-w-o-mtp-bf16-gb200-256"])[0].pp_balance == "layout:Et*4|(t*4|)*14tL"
    assert row_plan(cases["deepseekv3-2024-t1-deepseek-v3-671b-fp8-h800-2048"])[0].pp_balance == "cost"


def test_deepseek_v3_rows_train_with_one_mtp_module() -> None:
    """DeepSeek-V3 trains with MTP depth 1 (its report; Megatron-Bridge's recipe default); the 25.11 rows
    whose source names a variant without it run none."""
    from conftest import SHARED

    from echosim.validation.cases import read_cases
    from echosim.validation.rows import row_model

    path = SHARED / "validation" / "cases.csv"
    if not path.exists():
        pytest.skip("shared/validation not present")
    cases = {c.case_id: c for c in read_cases(path)}
    assert row_model(cases["mbridge2511-deepseekv3-w-mtp-mxfp8-b200-256"]).mtp_layers == 1
    assert row_model(cases["deepseekv3-2024-t1-deepseek-v3-671b-fp8-h800-2048"]).mtp_layers == 1
    assert row_model(cases["mbridge2511-deepseekv3-w-o-mtp-bf16-gb200-256"]).mtp_layers == 0
    assert row_model(cases["mbridge2511-qwen3-30b-a3b-mxfp8-b200-8"]).mtp_layers == 0


def test_mtp_module_runs_on_the_last_pipeline_stage() -> None:
    """One MTP depth: a 2h -> h projection, one more (MoE) block and a second pass through the shared output
    head and loss, all after the decoder, so on the last stage only; parameters as the closed form counts."""
    cfg = ArchConfig("moe", layers=4, hidden=64, heads=4, kv_heads=2, vocab=512, ffn=128, seq_len=64,
                     experts=4, top_k=2, moe_ffn=32)  # fmt: skip
    mtp = cfg.with_(mtp_layers=1)
    module = build_module(mtp)
    assert sum(p.numel() for p in module.parameters()) == mtp.param_count()
    assert capture(mtp).param_count() == mtp.param_count()
    block = cfg.attention_params() + 2 * 64 + 64 * 4 + 3 * 64 * 32 * 4
    assert mtp.param_count() - cfg.param_count() == 3 * 64 + 2 * 64 * 64 + block
    plan = Plan(pp=2, dp=1, global_batch=2)
    base, more = (lower(c, plan, Cluster("h100-sxm", 2)) for c in (cfg, mtp))
    assert [s.layers for s in more.stages] == [s.layers for s in base.stages] == [2, 2]
    first = [graph_flops(s.graph).model for s in (base.stages[0], more.stages[0])]
    last = [graph_flops(s.graph).model for s in (base.stages[-1], more.stages[-1])]
    assert first[1] == first[0] and last[1] > last[0]


def test_rows_of_models_with_dense_first_layers_build_them(tmp_path) -> None:
    """rows.DENSE_FIRST_LAYERS by (layers, hidden, experts, top_k); a row without ffn_hidden keeps every layer MoE
    (a dense MLP needs its width)."""
    from test_validate import row, write

    from echosim.validation.cases import read_cases
    from echosim.validation.rows import row_model

    def dense(layers: str, hidden: str, experts: str, top_k: str, ffn: str = "12288") -> int:
        cells = {"arch": "moe", "layers": layers, "hidden": hidden, "heads": "64", "kv_heads": "8",
                 "head_dim": "128", "ffn_hidden": ffn, "vocab": "151552", "experts": experts, "top_k": top_k,
                 "moe_ffn_hidden": "1536"}  # fmt: skip
        return row_model(read_cases(write(tmp_path, row(**cells)))[0]).dense_layers

    assert dense("92", "5120", "160", "8") == 3  # GLM-4.5
    assert dense("46", "4096", "128", "8") == 1  # GLM-4.5-Air
    assert dense("61", "7168", "384", "8") == 1  # Kimi K2
    assert dense("60", "5120", "160", "6") == 1  # DeepSeek-V2
    assert dense("92", "5120", "160", "8", ffn="") == 0
    assert dense("48", "4096", "128", "8") == 0  # Qwen3-235B-A22B: every layer MoE


def test_a_row_that_names_the_parts_it_recomputes_replays_them(tmp_path) -> None:
    """ "recompute: selective (RMSNorm + MLA up-projection recomputed)" (DeepSeek-V3's report sec. 3.2.3) is
    Megatron-Core's layernorm and mla_up_proj modules, with what the row's source recomputes besides; an unknown
    part leaves the column's 'selective'."""
    from test_validate import row, write

    from echosim.validation.cases import read_cases
    from echosim.validation.rows import stated_recompute

    def stated(notes: str, source: str = "") -> str:
        cells = row(notes=notes, **({"source_id": source} if source else {}))
        return stated_recompute(read_cases(write(tmp_path, cells))[0])

    assert stated("recompute: selective (RMSNorm + MLA up-projection recomputed) | x") == (
        "selective:layernorm,mla_up_proj"
    )
    # the report's sec. 3.3.3 also recomputes the experts' SwiGLU output (rows.SOURCE_RECOMPUTED_PARTS)
    assert stated("recompute: selective (RMSNorm + MLA up-projection recomputed)", "deepseek_v3_2024") == (
        "selective:layernorm,mla_up_proj,moe_act"
    )
    assert stated("recompute: selective (RMSNorm + SwiGLU recomputed)") == ""
    assert stated("recompute modules moe_act,mlp") == "selective:moe_act,mlp"
