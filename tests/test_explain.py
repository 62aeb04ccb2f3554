"""echosim explain: the critical path adds up to the step, suggestions are real compiles of neighbouring layouts."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import COSTED_LAYOUTS, TINY_RWKV, check_whole_warning_carried

from echosim.cli import cli
from echosim.commands.options import parse_layout_flags
from echosim.compiler import compile as compile_model
from echosim.compiler import lower
from echosim.explain.critical import critical_path, scope_group
from echosim.explain.step import explain
from echosim.explain.whatif import changed_flags, cheapest_fit, neighbours, suggest
from echosim.plan import Cluster, Plan
from echosim.plugins import get_registry

LAYOUTS = COSTED_LAYOUTS
# gpt3-1.3b with 16 sequences per micro-batch: 90 GiB on a 40 GB A100, no single change makes it fit
TOO_BIG = ("gpt3-1.3b", Plan(dp=2, micro_batch=24, global_batch=96), Cluster("a100-40gb", 2))


def _invoke(*args: str) -> tuple[int, str]:
    group = cli
    get_registry().add_commands(group)
    result = CliRunner().invoke(group, list(args))
    return result.exit_code, result.output


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_every_second_of_the_critical_path_lands_on_one_op_transfer_or_tail(name: str) -> None:
    model, plan, devices = LAYOUTS[name]
    c = lower(model, plan, Cluster("h100-sxm", devices))
    path = critical_path(c.costed)
    assert path.total_s == pytest.approx(c.report.step_time_s, rel=1e-9)
    assert sum(path.seconds_by_stage.values()) == pytest.approx(c.report.step_time_s, rel=1e-9)
    assert all(s.seconds > 0 for s in path.shares)
    assert path.tasks[0] == "start"


def test_the_1f1b_critical_path_runs_down_the_pipeline_and_stays_on_the_last_stage() -> None:
    model, plan, devices = LAYOUTS["1f1b"]
    c = lower(model, plan, Cluster("h100-sxm", devices))
    path = critical_path(c.costed)
    stages = [int(t.split("@v")[1]) for t in path.tasks if "@v" in t]
    assert stages[:4] == [0, 1, 2, 3]  # the first micro-batch's forward through every stage
    assert max(path.seconds_by_stage, key=path.seconds_by_stage.get) == 3  # then the last stage's steady state
    top = path.shares[0]
    assert top.category == "compute.matmul" and top.scope == "layers.*.mlp" and top.stage == 3
    assert top.label == "layers.*.mlp matmuls on stage 3"
    transfers = [s for s in path.shares if s.kind == "transfer"]
    assert transfers and all(s.category == "comm.pp" for s in transfers)


def test_scope_groups_fold_the_layer_index() -> None:
    assert scope_group("layers.3.mlp.fc1") == "layers.*.mlp"
    assert scope_group("model.layers.12.self_attn.q_proj") == "model.layers.*.self_attn"
    assert scope_group("layers.0") == "layers.*"
    assert scope_group("lm_head") == "lm_head"
    assert scope_group("") == ""


def test_neighbours_keep_devices_and_batch_and_change_one_thing() -> None:
    plan = Plan(tp=4, pp=4, dp=4, micro_batch=2, global_batch=256, recompute="selective")
    out = neighbours(plan, Cluster("h100-sxm", 64))
    assert len(out) == len(set(out))
    assert all(p.world == 64 and p.batch == 256 for p in out)
    assert replace(plan, vpp=2) in out and replace(plan, micro_batch=1) in out and replace(plan, micro_batch=4) in out
    assert replace(plan, recompute="full") in out and replace(plan, sp=True) in out
    assert replace(plan, tp=8, dp=2) in out and replace(plan, pp=8, tp=2) in out and replace(plan, zero=1) in out
    assert replace(plan, tp_overlap=True) in out and replace(plan, schedule="zb-h1") in out
    assert all(p.sp is False for p in neighbours(Plan(tp=2, dp=2, sp=True), Cluster(devices=4)) if p.tp == 1)


def test_a_change_names_only_what_changed_when_the_global_batch_is_derived() -> None:
    """A neighbour pins the global batch that dp x micro-batch gave, to keep it: that is no change to name
    ("--global-batch 4 --zero 1" read as if the batch had moved)."""
    plan = Plan(tp=2, dp=4)
    out = neighbours(plan, Cluster("h100-sxm", 8))
    assert changed_flags(plan, replace(plan, global_batch=4, zero=1)) == "--zero 1"
    assert changed_flags(plan, replace(plan, global_batch=4, tp=4, dp=2)) == "--tp 4 --dp 2"
    assert changed_flags(plan, replace(plan, global_batch=8)) == "--global-batch 8"
    assert all("--global-batch" not in changed_flags(plan, p) for p in out)


def test_suggestions_that_fit_are_faster_and_ranked_fastest_first() -> None:
    model, plan, devices = LAYOUTS["1f1b"]
    cluster = Cluster("h100-sxm", devices)
    base = compile_model(model, plan, cluster)
    ranked, simulated = suggest(model, plan, cluster, base)
    assert ranked and len(simulated) >= len(ranked)
    times = [o.step_time_s for o in ranked]
    assert times == sorted(times) and all(t < base.step_time_s for t in times) and all(o.fits for o in ranked)


def test_the_first_suggestion_applied_through_compile_gives_exactly_its_figure() -> None:
    model, plan, cluster = TOO_BIG
    code, out = _invoke("explain", model, *shlex.split("--backend a100-40gb --dp 2 --micro-batch 24 --global-batch 96"),
                        "--json")  # fmt: skip
    assert code == 0, out
    result = json.loads(out)
    assert result["fits"] is False and len(result["suggestions"]) == 3
    first = result["suggestions"][0]
    assert set(first) == {"change", "flags", "step_time_s", "peak_gib", "fits", "why"} and first["fits"] is True
    code, out = _invoke("compile", model, *shlex.split(first["flags"]), "--json")
    assert code == 0, out
    report = json.loads(out)
    assert report["step_time_s"] == first["step_time_s"]
    assert max(m["peak"] for m in report["memory"]) / 2**30 == pytest.approx(first["peak_gib"], rel=1e-5)
    assert report["fits"] is True
    # in Python, to the last bit
    name, changed, on = parse_layout_flags(model, first["flags"], "--a")
    ranked, _ = suggest(model, plan, cluster, compile_model(model, plan, cluster))
    assert (ranked[0].plan, ranked[0].cluster) == (changed, on)
    assert compile_model(name, changed, on).step_time_s == ranked[0].step_time_s


def test_a_layout_that_does_not_fit_gets_the_cheapest_changes_that_fit_first() -> None:
    model, plan, cluster = TOO_BIG
    base = compile_model(model, plan, cluster)
    assert not base.fits
    ranked, simulated = suggest(model, plan, cluster, base)
    one_step = neighbours(plan, cluster)
    assert len(simulated) > len(one_step)  # no single change fits: the closest were taken a step further
    fitting = [o for o in ranked if o.fits]
    assert fitting and ranked[: len(fitting)] == fitting
    assert [o.step_time_s for o in fitting] == sorted(o.step_time_s for o in fitting)
    best = cheapest_fit(model, plan, cluster, base)
    assert best is not None and best == fitting[0]
    assert cheapest_fit(model, plan, cluster, compile_model(model, best.plan, cluster)) is None  # it fits already


def test_a_layout_that_fits_with_full_recompute_is_offered_the_fewest_layers_that_fit() -> None:
    """Megatron's block recompute as a suggestion: the smallest N of ``--recompute full:N`` that fits (found by
    bisection), faster than full recompute; one layer fewer does not fit."""
    model, cluster = "gpt3-1.3b", Cluster("a100-40gb", 2)
    plan = Plan(dp=2, micro_batch=8, global_batch=64)
    ranked, _ = suggest(model, plan, cluster, compile_model(model, plan, cluster))
    changes = {o.change: o for o in ranked}
    (partial,) = [o for change, o in changes.items() if change.startswith("--recompute full:")]
    n = int(partial.change.removeprefix("--recompute full:"))
    assert 1 <= n < 24 and partial.fits and partial.step_time_s < changes["--recompute full"].step_time_s
    assert not compile_model(model, replace(plan, recompute=f"full:{n - 1}"), cluster).fits
    # a layout that fits, or one already recomputing in full, gets no such suggestion
    assert not [o for o in suggest(model, partial.plan, cluster, compile_model(model, partial.plan, cluster))[1]
                if o.change.startswith("--recompute full:")]  # fmt: skip


def test_the_fewest_layers_come_in_whole_repeated_blocks() -> None:
    """A model whose repeated block holds two layers (dense, then MoE) is offered an even N."""
    from echosim.frontend.zoo import ArchConfig

    model = ArchConfig(arch="moe", layers=24, hidden=1024, heads=16, kv_heads=16, ffn=4096, vocab=32000, seq_len=2048,
                       experts=8, top_k=2, moe_ffn=2048, moe_layer_step=2)  # fmt: skip
    cluster, plan = Cluster("a100-40gb", 2), Plan(dp=2, micro_batch=8, global_batch=64)
    ranked, simulated = suggest(model, plan, cluster, compile_model(model, plan, cluster))
    (partial,) = [o for o in ranked if o.change.startswith("--recompute full:")]
    n = int(partial.change.removeprefix("--recompute full:"))
    assert partial.fits and n % 2 == 0 and 2 <= n < 24
    assert not [o for o in simulated if o.change.startswith("--recompute full:") and o.error]  # no odd N tried


def test_a_megatron_layout_that_does_not_fit_is_offered_bf16_moments() -> None:
    """GPT-3 2.7B on one A100 40GB already recomputes in full; Adam's moments in bf16 (and TE's 16-bit master
    remainders) take its state from 18 to 12 bytes a parameter, and it fits. Not offered where the framework has no
    precision-aware optimizer, nor to a layout that fits."""
    model, cluster = "gpt3-2.7b", Cluster("a100-40gb", 1)
    plan = Plan(micro_batch=1, global_batch=2, framework="megatron", recompute="full")
    base = compile_model(model, plan, cluster)
    ranked, _ = suggest(model, plan, cluster, base)
    assert not base.fits and ranked[0].fits
    assert ranked[0].change == "--optimizer-dtypes exp_avg=bf16,exp_avg_sq=bf16"
    params = base.memory[0]["params"] // 2  # bf16 weights
    assert base.memory[0]["optimizer"] - ranked[0].report.memory[0]["optimizer"] == pytest.approx(6 * params, abs=8)
    eager = replace(plan, framework="eager")
    assert not [o for o in suggest(model, eager, cluster, compile_model(model, eager, cluster))[1]
                if "optimizer-dtypes" in o.change]  # fmt: skip
    small = replace(plan, global_batch=1)
    assert compile_model("gpt3-1.3b", small, cluster).fits
    assert not [o for o in suggest("gpt3-1.3b", small, cluster, compile_model("gpt3-1.3b", small, cluster))[1]
                if "optimizer-dtypes" in o.change]  # fmt: skip


def test_a_layout_that_does_not_fit_with_fp32_gradients_is_offered_16_bit_ones() -> None:
    """Llama-3 8B on 8 H100 (ZeRO-1, seq 6144) needs 86.4 GiB: fp32 gradients are 4 bytes a parameter on every
    rank, and in the weights' bf16 (``--grad-dtype bf16``) they are 2, so it fits at 71.4 GiB, its gradient
    reduce-scatters moving half the bytes.
    Without a sharded optimizer the step's fp32 copy makes 16-bit gradients cost more, and nothing is offered where
    the gradients are 16-bit already or the layout fits."""
    model, cluster = "llama3-8b", Cluster("h100-sxm", 8)
    plan = Plan(dp=8, zero=1, micro_batch=1, global_batch=8, seq_len=6144, framework="megatron")
    base = compile_model(model, plan, cluster)
    ranked, _ = suggest(model, plan, cluster, base)
    (sixteen,) = [o for o in ranked if o.change == "--grad-dtype bf16"]
    assert not base.fits and sixteen.fits and sixteen.step_time_s < base.step_time_s
    assert base.memory[0]["peak"] - sixteen.peak_bytes == base.memory[0]["params"]  # 2 bytes a parameter each
    nemo = replace(plan, framework="nemo")  # its performance scripts' 16-bit gradients already
    assert not [
        o for o in suggest(model, nemo, cluster, compile_model(model, nemo, cluster))[1] if "grad-dtype" in o.change
    ]
    unsharded = Plan(micro_batch=1, global_batch=2, framework="megatron", recompute="full")
    one = Cluster("a100-40gb", 1)
    tried = [o for o in suggest("gpt3-2.7b", unsharded, one, compile_model("gpt3-2.7b", unsharded, one))[1]
             if "grad-dtype" in o.change]  # fmt: skip
    assert tried and not tried[0].fits
    assert tried[0].peak_bytes > compile_model("gpt3-2.7b", unsharded, one).memory[0]["peak"]


def test_explain_text_names_the_critical_path_communication_bubble_and_suggestions() -> None:
    code, out = _invoke("explain", "gpt3-1.3b", "--tp", "2", "--pp", "4", "--dp", "2", "--global-batch", "16",
                        "--seq-len", "1024", "--backend", "h100-sxm")  # fmt: skip
    assert code == 0, out
    assert "critical path:" in out and "on stage 3" in out
    assert "tp     all_reduce" in out and "hidden except" in out
    assert "bubble" in out and "overlap slowdown" in out
    assert "what helps most" in out and "echosim compile gpt3-1.3b --backend h100-sxm" in out


def test_explain_carries_the_compiles_warnings() -> None:
    """A warning compile gives (here: RWKV's receptance projections run whole on both tensor-parallel ranks) is in the
    explanation's text and JSON too."""
    args = ("explain", TINY_RWKV, "--backend", "h100-sxm", "--tp", "2", "--global-batch", "1", "--seq-len", "16",
            "--no-what-if")  # fmt: skip
    check_whole_warning_carried(_invoke, args, "warning: ")


def test_the_text_of_a_layout_that_does_not_fit_leads_with_what_makes_it_fit() -> None:
    code, out = _invoke("explain", "gpt3-1.3b", "--backend", "a100-40gb", "--dp", "2", "--micro-batch", "16",
                        "--global-batch", "64")  # fmt: skip
    assert code == 0, out
    assert "(does not fit" in out and "changes that make it fit, cheapest first, then the largest peak cuts" in out
    items = [line for line in out.splitlines() if line.startswith("  1. ")]
    assert len(items) == 1 and items[0].endswith(", fits")


def test_explain_reads_the_costed_graph_of_the_compile() -> None:
    model, plan, devices = LAYOUTS["cp+zero3"]
    cluster = Cluster("h100-sxm", devices)
    c = lower(model, plan, cluster)
    e = explain(c, model, plan, cluster, what_if=False)
    by_axis = {x.axis: x for x in e.communication}
    assert {"tp", "cp", "fsdp"} <= set(by_axis)
    for axis, x in by_axis.items():
        assert x.exposed_s == c.report.breakdown.get(f"comm.{axis}", 0.0)
        assert x.busy_s >= x.exposed_s - 1e-9
    assert "reduce_scatter" in by_axis["fsdp"].ops and "all_gather" in by_axis["fsdp"].ops
    assert e.bubble_s == c.report.breakdown.get("bubble", 0.0)
    assert e.slowdown_s["compute"] >= 0 and e.slowdown_s["comm"] >= 0
    assert e.as_dict()["suggestions"] == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "flags"),
    [
        (None, ""),  # the default run: GPT-3 175B on 1,024 A100-80GB
        (
            "llama3-70b",
            "--backend h100-sxm --tp 8 --pp 4 --dp 2 --seq-len 8192 --recompute selective --global-batch 128",
        ),
    ],
)
def test_the_issues_two_runs_the_first_suggestion_through_compile(model: str | None, flags: str) -> None:
    code, out = _invoke("explain", *([model] if model else []), *shlex.split(flags), "--json")
    assert code == 0, out
    result = json.loads(out)
    first = result["suggestions"][0]
    assert first["fits"] and (not result["fits"] or first["step_time_s"] < result["step_time_s"])
    code, out = _invoke("compile", result["model"], *shlex.split(first["flags"]), "--json")
    assert code == 0, out
    report = json.loads(out)
    assert report["step_time_s"] == first["step_time_s"] and report["fits"] is True
    assert max(m["peak"] for m in report["memory"]) / 2**30 == pytest.approx(first["peak_gib"], rel=1e-5)


def test_neighbours_offload_under_zero_and_only_there() -> None:
    """Under ZeRO the optimizer can go to the host (and ZeRO-3's weights); a change of stage takes an offload off
    that the new stage cannot hold, and one replica keeps the stage an offload needs."""
    cluster = Cluster("h100-sxm", 8)
    plain = neighbours(Plan(dp=8, global_batch=8), cluster)
    assert not any(p.offload_optimizer or p.offload_params for p in plain)
    zero1 = Plan(dp=8, zero=1, global_batch=8)
    assert replace(zero1, offload_optimizer=True) in neighbours(zero1, cluster)
    zero3 = Plan(dp=8, zero=3, global_batch=8, offload_optimizer=True)
    out = neighbours(zero3, cluster)
    assert replace(zero3, offload_params=True) in out and replace(zero3, offload_optimizer=False) in out
    assert replace(zero3, zero=2) in out  # ZeRO-2 keeps the offloaded optimizer
    both = replace(zero3, offload_params=True)
    assert replace(both, zero=2, offload_params=False) in neighbours(both, cluster)
    alone = Plan(tp=8, zero=1, global_batch=8, offload_optimizer=True)
    assert all(p.zero >= 1 for p in neighbours(alone, Cluster("h100-sxm", 8)) if p.offload_optimizer)


def test_neighbours_shard_the_embedding_tables_each_other_way() -> None:
    """A sharded model's neighbours try every other TorchRec type; a model left unsharded tries none."""
    cluster = Cluster("h100-sxm", 16)
    plan = Plan(dp=16, global_batch=16, embedding_sharding="auto")
    kinds = {p.embedding_sharding for p in neighbours(plan, cluster)} - {"auto"}
    assert kinds == {"table", "row", "column", "data", "table_row"}
    assert all(p.embedding_sharding == "none" for p in neighbours(replace(plan, embedding_sharding="none"), cluster))


def test_shardings_that_give_the_same_layout_are_offered_once() -> None:
    """DLRM-DCNv2's tables are 128 wide: column-wise is one 128-column shard a table, table-wise's layout to the last
    bit, and explain offered both at -0.9%; now the first in neighbourhood order (table-wise) stands for both."""
    cluster = Cluster("a100-80gb", 8)
    plan = Plan(dp=8, micro_batch=2048, embedding_sharding="auto")
    ranked, tried = suggest("dlrm-dcnv2", plan, cluster, compile_model("dlrm-dcnv2", plan, cluster))
    by_kind = {o.plan.embedding_sharding: o for o in tried if not o.error and o.plan.micro_batch == 2048
               and o.plan.zero == 0}  # fmt: skip
    table, column = by_kind["table"], by_kind["column"]
    assert (table.step_time_s, table.peak_bytes) == (column.step_time_s, column.peak_bytes)  # the same layout
    offered = [o.plan.embedding_sharding for o in ranked]
    assert "table" in offered and "column" not in offered


def test_an_optimizer_that_does_not_fit_is_offered_the_host() -> None:
    """Llama 3 70B on 8 H100 at tp 8 with the distributed optimizer: 153.7 GiB; the one change that fits is the
    offload."""
    plan = Plan(tp=8, zero=1, global_batch=8, seq_len=4096, recompute="full")
    cluster = Cluster("h100-sxm", 8)
    base = compile_model("llama3-70b", plan, cluster)
    assert not base.fits
    best = cheapest_fit("llama3-70b", plan, cluster, base)
    assert best is not None and best.plan == replace(plan, offload_optimizer=True)


def test_a_model_without_token_sequences_is_offered_its_whole_batch_at_once() -> None:
    """ResNet-50 at the default micro-batch of one image: the first suggestion is each device's whole batch, compiled
    for real; a language model that accumulates is not offered it (its micro-batches are a memory choice)."""
    cluster = Cluster("a100-80gb", 8)
    plan = Plan(dp=8, global_batch=2048)
    base = compile_model("resnet50", plan, cluster)
    ranked, _ = suggest("resnet50", plan, cluster, base)
    assert ranked[0].plan.micro_batch == 256 and ranked[0].fits
    assert ranked[0].step_time_s == compile_model("resnet50", ranked[0].plan, cluster).step_time_s
    assert ranked[0].step_time_s < base.step_time_s / 5
    llm = Plan(dp=8, global_batch=64)
    _, tried = suggest("gpt3-125m", llm, cluster, compile_model("gpt3-125m", llm, cluster))
    assert not any(o.plan.micro_batch == 8 for o in tried)


def test_a_model_with_replicated_tables_is_offered_them_sharded() -> None:
    """examples/dlrm.py without --embedding-sharding: its 13B replicated table parameters under Adam need 224 GiB,
    and compile said no single change nearby made it fit. Sharding the tables (row-wise Adagrad, no dense gradient)
    is that change, compiled for real; a model without pooled tables is not offered it."""
    example = str(Path(__file__).resolve().parents[1] / "examples" / "dlrm.py") + ":model"
    code, out = _invoke("compile", example, "--micro-batch", "2048")
    assert code == 0, out
    assert "does not fit; the cheapest change that fits (simulated): --embedding-sharding auto: step" in out
    cluster = Cluster("a100-80gb", 1)
    plan = Plan(micro_batch=2048)
    ranked, _ = suggest(example, plan, cluster, compile_model(example, plan, cluster))
    assert ranked[0].plan.embedding_sharding == "auto" and ranked[0].fits
    assert ranked[0].step_time_s == compile_model(example, ranked[0].plan, cluster).step_time_s
    llm = Plan(dp=8, global_batch=64)
    _, tried = suggest(
        "gpt3-125m", llm, Cluster("a100-80gb", 8), compile_model("gpt3-125m", llm, Cluster("a100-80gb", 8))
    )
    assert not any(o.plan.embedding_sharding != "none" for o in tried)
