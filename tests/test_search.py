"""``echosim search``: the space, equivalences proven by compiles, pruning, figures equal to full compiles, output."""

from __future__ import annotations

import itertools
import json
import math
import sys
from dataclasses import replace

import pytest
from click.testing import CliRunner
from conftest import TINY_RWKV, check_whole_warning_carried

from echosim import memo
from echosim.cli import cli
from echosim.compiler import compile as compile_model
from echosim.layout_search import (
    ModelFacts,
    SearchError,
    _batches,
    _schedule_shape,
    canonical,
    memory_lower_bound,
    parse_space,
    schedule_canon,
    search,
)
from echosim.plan import Cluster, Plan

SMALL = {"tp": (1, 2), "pp": (1, 2), "cp": (1, 2), "mb": (1, 2), "zero": (0, 1), "vpp": (1, 2), "sp": (False, True)}


def _run(*args: str) -> tuple[int, str]:
    out = CliRunner().invoke(cli, ["search", *args])
    return out.exit_code, out.output


def _figures(r: object) -> dict[str, float]:
    rep = r  # a Report
    return {
        "step_time_s": rep.step_time_s,  # type: ignore[attr-defined]
        "tokens_per_s": rep.tokens_per_s or 0.0,  # type: ignore[attr-defined]
        "mfu": rep.mfu,  # type: ignore[attr-defined]
        "peak": max(m["peak"] for m in rep.memory),  # type: ignore[attr-defined]
        "bubble": rep.bubble_fraction,  # type: ignore[attr-defined]
    }


def test_top_20_equal_full_compiles() -> None:
    """The figures a search reports are a full compile's: top 20 recompiled from empty caches agree to 1e-6."""
    base = Plan(global_batch=16)
    cluster = Cluster("h100-sxm", 8)
    result = search("gpt3-125m", base, cluster, space={**SMALL, "schedule": ("1f1b", "zb-h1")})
    top = result.ranked[:20]
    assert len(top) == 20
    memo.clear_all()
    for e in top:
        fresh = compile_model("gpt3-125m", e.plan, cluster)
        f = _figures(fresh)
        exposed = sum(v for k, v in fresh.breakdown.items() if k.startswith("comm."))
        got = {"step_time_s": e.step_time_s, "tokens_per_s": e.tokens_per_s, "mfu": e.mfu, "peak": e.peak_bytes,
               "bubble": e.bubble_fraction}  # fmt: skip
        for k, v in f.items():
            assert math.isclose(got[k] or 0.0, v, rel_tol=1e-6, abs_tol=1e-12), (e.plan, k, got[k], v)
        assert math.isclose(e.exposed_comm_s, exposed, rel_tol=1e-6, abs_tol=1e-12)
    steps = [e.step_time_s for e in result.ranked]
    assert steps == sorted(steps)


def test_layouts_that_fit_only_with_full_recompute_are_tried_with_the_fewest_layers_that_fit() -> None:
    """A layout that fits only by recomputing every layer is tried again recomputing the first N layers of each
    stage (full:N), the smallest N that fits: faster than full, its figures a full compile's, one layer fewer over
    the memory. A space that names its recompute values keeps to them."""
    cluster, base = Cluster("a100-40gb", 2), Plan(global_batch=64)
    space = {"mb": (8,), "tp": (1,), "cp": (1,), "pp": (1,), "zero": (0,), "schedule": ("1f1b",)}
    result = search("gpt3-1.3b", base, cluster, space=space)
    best, *rest = result.ranked
    assert best.plan.recompute.startswith("full:")
    n = int(best.plan.recompute.removeprefix("full:"))
    full = next(e for e in rest if e.plan == replace(best.plan, recompute="full"))
    assert 1 <= n < 24 and best.step_time_s < full.step_time_s
    assert compile_model("gpt3-1.3b", best.plan, cluster).step_time_s == best.step_time_s
    assert not compile_model("gpt3-1.3b", replace(best.plan, recompute=f"full:{n - 1}"), cluster).fits
    narrowed = search("gpt3-1.3b", base, cluster, space={**space, "recompute": ("none", "full")})
    assert {e.plan.recompute for e in narrowed.ranked} == {"full"}


@pytest.mark.parametrize(
    ("plan", "same"),
    [
        (Plan(tp=2, dp=4, global_batch=8, recompute="selective"), {"recompute": "none"}),  # flash: nothing replayed
        (Plan(tp=4, pp=2, dp=1, global_batch=8, zero=1), {"zero": 0}),  # one replica: ZeRO is moot
        (Plan(tp=4, pp=2, dp=1, global_batch=8, zero=3, offload_optimizer=True), {"zero": 1}),  # offloaded: stage 1
        (Plan(pp=2, dp=4, global_batch=8, tp_overlap=True), {"tp_overlap": False}),  # no TP collectives
        (Plan(pp=2, dp=4, vpp=2, global_batch=16, schedule="interleaved"), {"schedule": "1f1b"}),
        (Plan(tp=2, pp=4, dp=1, global_batch=1, schedule="gpipe"), {"schedule": "1f1b"}),  # one micro-batch
        (Plan(tp=2, dp=4, global_batch=16, schedule="zb-h1"), {"schedule": "1f1b"}),  # one stage: no bubble to fill
    ],
)
def test_equivalent_layouts_compile_identically(plan: Plan, same: dict[str, object]) -> None:
    """Each rule of ``canonical`` maps a layout to one whose compile is identical, figure for figure."""
    from echosim.plugins import get_registry

    schedules = {n: e.value for n, e in get_registry().schedules.items()}
    facts = ModelFacts.of("gpt3-125m", plan)
    assert canonical(plan, facts, schedule_canon(schedules, sorted(schedules))) == replace(plan, **same)
    cluster = Cluster("h100-sxm", 8)
    a = compile_model("gpt3-125m", plan, cluster).to_dict()
    b = compile_model("gpt3-125m", replace(plan, **same), cluster).to_dict()
    a.pop("plan"), b.pop("plan")
    # the one note that names the schedule asked for (a zero-bubble one on one stage runs its backward whole)
    a["notes"] = [n for n in a["notes"] if not n.startswith(f"schedule {plan.schedule} ")]
    assert a == b


def test_zero_bubble_on_one_stage_says_it_runs_whole() -> None:
    """``--schedule zb-h1`` without a pipeline is compiled as 1F1B (nothing to defer into), and the report says so;
    on two stages the weight gradients are deferred and the step differs."""
    cluster = Cluster("h100-sxm", 8)
    one = compile_model("gpt3-125m", Plan(tp=2, dp=4, global_batch=16, schedule="zb-h1"), cluster)
    assert any("no bubble for deferred weight gradients" in n for n in one.to_dict()["notes"])
    two = [
        compile_model("gpt3-125m", Plan(pp=2, dp=4, global_batch=16, schedule=s), cluster) for s in ("zb-h1", "1f1b")
    ]
    assert two[0].step_time_s != two[1].step_time_s
    assert not any("deferred weight" in n for n in two[0].to_dict()["notes"])


@pytest.mark.parametrize(
    ("framework", "dtype", "backend"),
    [("torchtitan", "bf16", "h100-sxm"), ("deepspeed", "bf16", "a100-80gb"), ("deepspeed", "fp16", "a100-80gb"),
     ("deepspeed-2021", "fp16", "a100-80gb"), ("maxtext", "bf16", "tpu-v5p"), ("nemo", "bf16", "h100-sxm")],
)  # fmt: skip
def test_canonical_keeps_every_figure_under_each_frameworks_rules(framework: str, dtype: str, backend: str) -> None:
    """Each rule of ``canonical`` on frameworks whose state or recompute policy differs from Megatron's: the layout
    it maps to compiles to the same report, or it is left as it is (two such rules were wrong: torchtitan's own
    ``selective``, DeepSpeed's gradients under ZeRO)."""
    cluster = Cluster(backend, 4)
    for changes in ({"tp": 4, "dp": 1, "zero": 1}, {"tp": 4, "dp": 1, "zero": 3}, {"tp": 2, "dp": 2, "recompute":
                    "selective"}, {"dp": 4, "tp_overlap": True}):  # fmt: skip
        plan = Plan(global_batch=8, framework=framework, dtype=dtype, **changes)  # type: ignore[arg-type]
        same = canonical(plan, ModelFacts.of("gpt3-125m", plan))
        if same == plan:
            continue
        a = compile_model("gpt3-125m", plan, cluster).to_dict()
        b = compile_model("gpt3-125m", same, cluster).to_dict()
        a.pop("plan"), b.pop("plan")
        assert a == b, (plan, same)


def test_selective_recompute_is_distinct_with_materialised_attention() -> None:
    facts = ModelFacts.of("gpt3-125m", Plan(attention="math"))
    plan = Plan(dp=8, global_batch=8, recompute="selective", attention="math")
    assert canonical(plan, facts).recompute == "selective"


def test_zero_on_one_replica_stays_where_the_framework_keeps_other_state_under_it() -> None:
    """DeepSpeed keeps bf16 gradients under ZeRO and fp32 ones without it (Framework.grads_16bit_under_zero): ZeRO-1
    on one replica is not ZeRO 0 there, and a search prices it as the compile does. Megatron's is moot alone."""
    plan = Plan(tp=2, dp=1, zero=1, global_batch=4, framework="deepspeed", dtype="bf16")
    assert canonical(plan, ModelFacts.of("gpt3-1.3b", plan)).zero == 1
    megatron = replace(plan, framework="megatron")
    assert canonical(megatron, ModelFacts.of("gpt3-1.3b", megatron)).zero == 0
    cluster = Cluster("h100-sxm", 2)
    space = {"tp": (2,), "pp": (1,), "mb": (1,), "zero": (0, 1), "cp": (1,), "vpp": (1,), "sp": (False,),
             "recompute": ("none",), "tp_overlap": (False,), "schedule": ("1f1b",)}  # fmt: skip
    found = search("gpt3-1.3b", replace(plan, tp=1), cluster, space=space)
    byzero = {e.plan.zero: e for e in [*found.ranked, *found.others]}
    assert set(byzero) == {0, 1}
    for zero, e in byzero.items():
        report = compile_model("gpt3-1.3b", replace(plan, zero=zero), cluster)
        assert e.peak_bytes == max(m["peak"] for m in report.memory)
    assert byzero[1].peak_bytes < byzero[0].peak_bytes  # bf16 gradients, where ZeRO 0 keeps fp32 ones


def test_a_frameworks_own_selective_policy_is_not_folded_into_none() -> None:
    """torchtitan's "selective" is its per-op policy (``Framework.selective``), which replays matmuls even with
    flash attention: a search keeps it, and its figures are the compile's (it was folded into ``none``, so
    torchtitan's published Llama 3.1 8B layouts were searched as ``none`` and called out of memory)."""
    plan = Plan(dp=8, zero=3, global_batch=16, micro_batch=2, recompute="selective", framework="torchtitan")
    facts = ModelFacts.of("llama3-8b", plan)
    assert canonical(plan, facts).recompute == "selective"
    cluster = Cluster("h100-sxm", 8)
    space = {"tp": (1,), "pp": (1,), "mb": (2,), "zero": (3,), "cp": (1,), "vpp": (1,), "sp": (False,),
             "recompute": ("none", "selective"), "tp_overlap": (False,), "schedule": ("1f1b",)}  # fmt: skip
    found = search("llama3-8b", replace(plan, dp=1), cluster, space=space)
    byrc = {e.plan.recompute: e for e in [*found.ranked, *found.others] if e.simulated}
    assert set(byrc) == {"none", "selective"}
    report = compile_model("llama3-8b", plan, cluster)
    assert byrc["selective"].step_time_s == pytest.approx(report.step_time_s, rel=1e-12)
    assert byrc["selective"].peak_bytes == max(m["peak"] for m in report.memory)
    assert byrc["selective"].peak_bytes < byrc["none"].peak_bytes


@pytest.mark.parametrize(
    "plan",
    [Plan(tp=2, pp=2, dp=2, global_batch=8), Plan(dp=8, zero=3, global_batch=8), Plan(tp=4, dp=2, zero=1,
                                                                                       global_batch=8)],
)  # fmt: skip
def test_memory_lower_bound_is_below_the_compiled_peak(plan: Plan) -> None:
    facts = ModelFacts.of("gpt3-1.3b", plan)
    rep = compile_model("gpt3-1.3b", plan, Cluster("h100-sxm", 8))
    assert 0 < memory_lower_bound(plan, facts.params) <= min(m["peak"] for m in rep.memory)


def test_space_counts_add_up_and_every_dimension_is_searched() -> None:
    result = search("gpt3-125m", Plan(global_batch=16), Cluster("h100-sxm", 8), space=SMALL)
    c = result.counts()
    assert c["combinations"] == c["not_applicable"] + c["duplicates"] + c["pruned"] + c["simulated"]
    seen = {k: {getattr(e.plan, k) for e in result.ranked} for k in ("tp", "pp", "cp", "vpp", "sp", "zero")}
    assert all(len(v) == 2 for v in seen.values()), seen
    assert c["duplicates"] > 0 and not any(e.plan.recompute == "selective" for e in result.evaluated)


def test_unknown_space_key_lists_the_known_ones() -> None:
    code, out = _run("gpt3-125m", "--devices", "8", "--global-batch", "8", "--space", "tpp=1,2")
    assert code == 1 and "unknown key 'tpp'" in out and "known: tp, pp, dp, cp, cp_comm, ep, vpp, sp, zero" in out
    assert "Traceback" not in out
    with pytest.raises(SearchError, match="expected true or false"):
        parse_space(["sp=maybe"])


def test_a_global_batch_no_layout_divides_says_so() -> None:
    code, out = _run("gpt3-125m", "--devices", "8", "--global-batch", "4", "--space", "tp=1 pp=1 cp=1")
    assert code == 1 and "divides the global batch 4" in out and "dp in [8]" in out


def test_an_empty_space_names_the_constraint_that_removed_everything() -> None:
    code, out = _run("gpt3-175b", "--devices", "8", "--global-batch", "8", "--space", "tp=1,2 pp=1 cp=1")
    assert code == 1 and "every layout was removed before simulation" in out and "memory lower bound" in out


def test_json_lists_every_evaluated_layout_with_reasons_and_is_byte_stable() -> None:
    args = ("gpt3-125m", "--devices", "4", "--global-batch", "6", "--space", "cp=1 mb=1,2 vpp=1 zero=0,3", "--json")
    code, out = _run(*args)
    assert code == 0, out
    data = json.loads(out)
    assert data["count"] == len(data["layouts"]) == data["counts"]["evaluated"]
    rejected = [x for x in data["layouts"] if x["reason"]]
    assert rejected and all(not x["fits"] for x in rejected)
    assert any("not a multiple of micro-batch*dp" in x["reason"] for x in rejected)
    for key in ("tp", "pp", "dp", "cp", "ep", "vpp", "sp", "zero", "micro_batch", "recompute", "schedule"):
        assert key in data["layouts"][0]
    assert _run(*args)[1] == out


def test_json_is_the_same_whatever_the_hash_seed() -> None:
    """Hashes of names and of identities (the IR's enums) vary between processes: no output may depend on them."""
    import os
    import subprocess

    args = ["gpt3-125m", "--devices", "4", "--global-batch", "8", "--space", "cp=1,2 mb=1,2 zero=0,3", "--json"]
    outs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        run = subprocess.run(
            [sys.executable, "-m", "echosim", "search", *args], env=env, capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr
        outs.append(run.stdout)
    assert outs[0] == outs[1] and json.loads(outs[0])["counts"]["simulated"] > 0


def test_scale_out_reports_throughput_per_device_time_and_cost(tmp_path) -> None:  # type: ignore[no-untyped-def]
    plot = tmp_path / "pareto.png"
    space = "pp=1,2 cp=1 vpp=1 zero=0 mb=1 sp=false"
    code, out = _run("gpt3-125m", "--devices", "4,8", "--global-batch", "16", "--space", space,
                     "--tokens", "1e9", "--price-per-device-hour", "2", "--plot", str(plot), "--json")  # fmt: skip
    assert code == 0, out
    rows = json.loads(out)["scale_out"]
    assert [r["devices"] for r in rows] == [4, 8]
    for r in rows:
        assert math.isclose(r["per_device_per_s"] * r["devices"], r["throughput_per_s"])
        assert math.isclose(r["hours_to_train"], 1e9 / r["throughput_per_s"] / 3600)
        assert math.isclose(r["cost_to_train"], r["hours_to_train"] * r["devices"] * 2)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tokens_to_train_a_model_without_token_ids_is_one_line() -> None:
    """As compile --tokens: ResNet-50's images are no tokens (search gave days to train 1e9 'tokens' of images)."""
    out = CliRunner().invoke(cli, ["search", "resnet50", "--backend", "a100-80gb", "--devices", "8,16",
                                   "--global-batch", "2048", "--tokens", "1e9"])  # fmt: skip
    assert out.exit_code == 1 and "Traceback" not in out.output and "scale-out" not in out.output
    last = out.output.strip().splitlines()[-1]  # after the first size's progress line
    assert last == "Error: --tokens: this model reads no token ids; time to train needs tokens per second"


def test_no_layout_of_replicated_tables_fits_names_the_option_that_shards_them() -> None:
    """DLRM-DCNv2 without --embedding-sharding on 8 H100: ZeRO-3 lets 13 layouts past the memory bound, none fits,
    and the table of the best was empty with nothing to say why; the one-line error names the option only where
    the bound removes every layout."""
    args = ["search", "dlrm-dcnv2", "--backend", "h100-sxm", "--devices", "8", "--global-batch", "16384"]
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 0, out.output
    assert "no layout fits: its 26,135,627,264 embedding-table parameters are replicated: --embedding-sharding auto" \
        in out.output  # fmt: skip
    data = json.loads(CliRunner().invoke(cli, [*args, "--json"]).output)
    assert data["counts"]["fit"] == 0 and "--embedding-sharding auto" in data["hint"]
    fitting = json.loads(CliRunner().invoke(cli, [*args, "--embedding-sharding", "auto", "--json"]).output)
    assert fitting["counts"]["fit"] > 0 and "hint" not in fitting


def test_the_table_explains_the_best_and_gives_reasons() -> None:
    code, out = _run("gpt3-125m", "--devices", "4", "--global-batch", "6", "--space", "cp=1 vpp=1 zero=0")
    assert code == 0, out
    assert "why: best is" in out and "faster per step than the runner-up" in out
    assert "not a multiple of micro-batch*dp" in out and "MFU" in out and "bubble" in out


def test_objectives_rank_differently_only_where_they_differ() -> None:
    base, cluster = Plan(global_batch=8), Cluster("h100-sxm", 4)
    space = {"cp": (1,), "vpp": (1,), "zero": (0,), "mb": (1,)}
    by_step = search("gpt3-125m", base, cluster, space=space, objective="step-time")
    by_rate = search("gpt3-125m", base, cluster, space=space, objective="tokens-per-s")
    assert {e.plan for e in by_step.ranked} == {e.plan for e in by_rate.ranked}
    steps = [e.step_time_s or 0.0 for e in by_rate.ranked]  # a fixed batch: faster is more tokens/s
    assert all(a <= b * (1 + 1e-12) for a, b in itertools.pairwise(steps))
    with pytest.raises(SearchError, match="known: step-time, tokens-per-s, cost"):
        search("gpt3-125m", base, cluster, space=space, objective="speed")


def test_layouts_of_the_same_step_rank_by_their_peak_memory() -> None:
    """On one stage GPipe and 1F1B take the same step (to the last bit or 1 ulp, by the order of sums) and GPipe holds
    every micro-batch's activations: the smaller peak goes first, as ZeRO-2 before ZeRO-1 at the same step."""
    space = {"tp": (1,), "pp": (1,), "cp": (1,), "vpp": (1,), "mb": (2,), "zero": (0, 1, 2), "recompute": ("none",),
             "schedule": ("gpipe", "1f1b"), "sp": (False,), "tp_overlap": (False,)}  # fmt: skip
    ranked = search("gpt3-125m", Plan(global_batch=64), Cluster("h100-sxm", 4), space=space).ranked
    assert [(e.plan.zero, e.plan.schedule) for e in ranked[:4]] == [(2, "1f1b"), (1, "1f1b"), (2, "gpipe"),
                                                                     (1, "gpipe")]  # fmt: skip
    assert all(math.isclose(e.step_time_s or 0, ranked[0].step_time_s or 0, rel_tol=1e-12) for e in ranked[:4])
    peaks = [e.peak_bytes for e in ranked[:4]]
    assert peaks == sorted(peaks) and peaks[0] < peaks[-1] / 4


def test_ray_missing_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    code, out = _run("gpt3-125m", "--devices", "4", "--global-batch", "8", "--space", "cp=1 vpp=1 zero=0",
                     "--executor", "ray")  # fmt: skip
    assert code == 1 and "echosim[ray]" in out


@pytest.mark.slow
def test_ray_ranks_the_top_20_exactly_as_local() -> None:
    ray = pytest.importorskip("ray")
    base, cluster = Plan(global_batch=16), Cluster("h100-sxm", 8)
    local = search("gpt3-125m", base, cluster, space=SMALL)
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        remote = search("gpt3-125m", base, cluster, space=SMALL, executor="ray")
    finally:
        ray.shutdown()
    assert len(local.ranked) >= 20
    assert [(e.plan, e.step_time_s) for e in remote.ranked[:20]] == [(e.plan, e.step_time_s) for e in local.ranked[:20]]
    assert remote.counts() == local.counts()


def test_ctrl_c_keeps_the_best_so_far(monkeypatch: pytest.MonkeyPatch) -> None:
    """A KeyboardInterrupt during simulation ends the search with the layouts simulated until then."""
    calls = []

    def interrupt(done: int, total: int) -> None:
        calls.append(done)
        if len(calls) == 2:
            raise KeyboardInterrupt

    result = search("gpt3-125m", Plan(global_batch=16), Cluster("h100-sxm", 8), space=SMALL, progress=interrupt)
    assert result.interrupted and result.simulated == calls[-1] < len(result.enumeration.to_simulate)
    assert result.best is not None and result.best.ok

    import echosim.layout_search as ls

    real = ls.search
    monkeypatch.setattr(ls, "search", lambda *a, **k: real(*a, **{**k, "progress": interrupt}))
    calls.clear()
    code, out = _run("gpt3-125m", "--devices", "8", "--global-batch", "16", "--space", "cp=1 vpp=1 zero=0")
    assert code == 0 and "interrupted: the best of the" in out and "why: best is" in out


def test_local_processes_rank_as_in_process() -> None:
    base, cluster = Plan(global_batch=8), Cluster("h100-sxm", 4)
    space = {"cp": (1,), "vpp": (1,), "zero": (0,), "mb": (1,), "sp": (False,)}
    one = search("gpt3-125m", base, cluster, space=space)
    two = search("gpt3-125m", base, cluster, space=space, workers=2)
    assert [(e.plan, e.step_time_s) for e in two.ranked] == [(e.plan, e.step_time_s) for e in one.ranked]


def test_a_layouts_copy_of_a_prepared_one_equals_dataclasses_replace() -> None:
    """:func:`_prepare` copies a prepared layout, its step options and facts without ``dataclasses.replace``'s
    ``__init__``: the copy equals replace's, field by field, for dataclasses with no ``__post_init__``,
    ``init=False`` field or slots (what the copy assumes), and the original is left as it was."""
    from dataclasses import fields, is_dataclass

    from echosim.compiler import Joint, Prepared, prepare_joint
    from echosim.layout_search import _replaced
    from echosim.timeline.lower import StepOptions
    from echosim.timeline.report import StepFacts

    for cls in (Joint, Prepared, StepOptions, StepFacts):
        assert is_dataclass(cls) and not hasattr(cls, "__post_init__") and not hasattr(cls, "__slots__")
        assert all(f.init for f in fields(cls))
    joint = prepare_joint("gpt3-350m", Plan(pp=2, dp=4, global_batch=16), Cluster("h100-sxm", 8))
    options = _replaced(joint.options, tp_overlap=True)
    assert options == replace(joint.options, tp_overlap=True) and options is not joint.options
    assert joint.options.tp_overlap is False
    facts = _replaced(joint.facts, plan={**joint.facts.plan, "schedule": "gpipe"})
    assert facts == replace(joint.facts, plan={**joint.facts.plan, "schedule": "gpipe"})
    copy = _replaced(joint, options=options, facts=facts)
    want = replace(joint, options=options, facts=facts)
    assert all(getattr(copy, f.name) is getattr(want, f.name) for f in fields(Joint))
    assert vars(copy).keys() == vars(want).keys()


def test_a_schedule_shape_is_cut_into_the_fewest_batches_it_needs() -> None:
    """Each shape (pp, vpp, schedule, micro-batches) of n layouts lies in ceil(n / size) batches (its schedule is
    timed once per batch), shapes that fit together share one, and the layouts keep their stable sorted order."""
    size = 8
    counts = {(1, 1): 3, (2, 1): 9, (2, 2): 4, (4, 1): 17, (8, 1): 1}
    plans = [
        Plan(
            pp=pp,
            vpp=vpp,
            dp=64 // pp,
            global_batch=64,
            seq_len=1024 + k,
            schedule="interleaved" if vpp > 1 else "1f1b",
        )
        for (pp, vpp), n in counts.items()
        for k in range(1, n + 1)
    ]
    batches = _batches(plans[::-1], size)
    assert all(len(b) <= size for b in batches)
    assert [p for b in batches for p in b] == sorted(plans[::-1], key=_schedule_shape)
    for (pp, vpp), n in counts.items():
        holding = [b for b in batches if any((p.pp, p.vpp) == (pp, vpp) for p in b)]
        assert len(holding) == math.ceil(n / size), (pp, vpp)
    # 3 + 5 (of 9: 5 and 4), 4 + 4, then 17 as 6, 6 and 5 (+ 1)
    assert [len(b) for b in batches] == [8, 8, 6, 6, 6]


def test_a_search_checks_the_rules_of_each_layout_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The enumeration checks every layout's plan rules (``check_plan``, :func:`_rule`); the search's batches do not
    check again the layouts they copy from one prepared before (another schedule or TP overlap), which a batch
    evaluated on its own does."""
    import echosim.layout as layout
    from echosim.layout_search import _evaluate_batch

    real, callers = layout.check_plan, []

    def counted(*args: object, **kwargs: object) -> None:
        callers.append(sys._getframe(1).f_code.co_name)
        real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(layout, "check_plan", counted)
    base, cluster = Plan(global_batch=16), Cluster("h100-sxm", 8)
    space = {"tp": (2,), "pp": (2,), "cp": (1,), "vpp": (1,), "sp": (False,), "zero": (1,), "mb": (1,),
             "recompute": ("full",), "schedule": ("1f1b", "gpipe", "zb-h1"), "tp_overlap": (False, True)}  # fmt: skip
    result = search("gpt3-125m", base, cluster, space=space)
    # one check per layout less its TP overlap (_rule reads none: the test below)
    assert result.simulated == 6 and callers.count("_rule") == 3 and "_prepare" not in callers
    callers.clear()
    _evaluate_batch("gpt3-125m", [e.plan for e in result.ranked], cluster, 1.0, fast=True)
    assert callers.count("_prepare") == 5  # one layout prepared, five copied and checked


@pytest.mark.parametrize(
    "plan",
    [Plan(tp=2, pp=2, dp=2, global_batch=8), Plan(tp=2, pp=2, dp=2, vpp=2, schedule="interleaved", global_batch=8),
     Plan(tp=8, global_batch=3), Plan(tp=3, dp=3, global_batch=9), Plan(tp=2, dp=4, zero=3, global_batch=8)],
)  # fmt: skip
def test_no_rule_of_the_enumeration_reads_the_tp_overlap(plan: Plan) -> None:
    """The enumeration checks a layout and its TP-overlap twin once (:func:`enumerate_layouts` keeps :func:`_rule`'s
    outcome by the layout less ``tp_overlap``): no rule, passed or broken, may read that field."""
    from echosim.layout_search import _rule
    from echosim.plugins import get_registry

    read: list[str] = []

    class Watched(Plan):
        def __getattribute__(self, name: str) -> object:
            read.append(name)
            return super().__getattribute__(name)

    schedules = {name: e.value for name, e in get_registry().schedules.items()}
    interleaved = [n for n, s in schedules.items() if getattr(s, "interleaved", False)]
    facts = ModelFacts.of("gpt3-125m", plan)
    cluster = Cluster("h100-sxm", plan.world)
    for overlap in (False, True):
        watched = Watched(**{**plan.__dict__, "tp_overlap": overlap})
        outcome = _rule(watched, cluster, schedules, interleaved, facts, 80 * 2**30)
        assert outcome == _rule(replace(plan, tp_overlap=overlap), cluster, schedules, interleaved, facts, 80 * 2**30)
    assert "tp" in read and "tp_overlap" not in read


def test_the_memory_lower_bound_is_priced_once_per_what_it_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The enumeration keeps each memory lower bound by all that ``memory_lower_bound`` reads of a plan
    (framework, dtype, pp, ZeRO stage, dp x cp, tp x pp x ep): one pricing per distinct key, and the same layouts
    rejected with the same messages as pricing each plan."""
    import echosim.layout_search as ls

    real, priced = ls.memory_lower_bound, []
    monkeypatch.setattr(ls, "memory_lower_bound", lambda plan, *a: priced.append(plan) or real(plan, *a))
    base, cluster = Plan(global_batch=64), Cluster("h100-sxm", 16)
    enum = search("gpt3-1.3b", base, cluster, sample=slice(0, 0), memory_fraction=0.05).enumeration
    keys = {(p.framework, p.dtype, p.pp, p.zero, p.dp * p.cp, p.tp * p.pp * p.ep) for p in priced}
    assert len(priced) == len(keys) < len(enum.to_simulate) + len(enum.rejected)
    assert enum.removed_by["memory lower bound"] > 0
    params = ModelFacts.of("gpt3-1.3b", base).params
    for e in enum.rejected:
        if e.reason.startswith("memory lower bound"):  # the message names the bound priced for this very plan
            assert e.reason.startswith(f"memory lower bound {real(e.plan, params) / 2**30:.1f} GiB "), e.reason


def test_a_layouts_costing_key_is_every_field_but_its_schedule_and_tp_overlap() -> None:
    """``_costing_key`` (read by one C-level ``attrgetter``) is the tuple of every plan field but the two no pass
    reads, in field order."""
    from dataclasses import fields

    from echosim.layout_search import _costing_key

    plan = Plan(tp=2, pp=2, dp=2, global_batch=8, schedule="gpipe", tp_overlap=True, recompute="full")
    want = tuple(getattr(plan, f.name) for f in fields(Plan) if f.name not in ("schedule", "tp_overlap"))
    assert type(_costing_key(plan)) is tuple and _costing_key(plan) == want
    assert _costing_key(replace(plan, schedule="1f1b", tp_overlap=False)) == want


def test_a_batch_reads_the_plugin_registry_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """:func:`_prepare` takes what it reads of the registry (schedules, the plugins' passes) from its batch, read
    once, not per layout; a plugin's pass makes a layout prepared alone as before: a mandatory one always, an
    optional one where the plan names it."""
    from types import SimpleNamespace

    import echosim.plugins as plugins
    from echosim.layout_search import _evaluate_batch, _Registered

    real, reads = plugins.get_registry, []

    def counted() -> object:
        reads.append(1)
        return real()

    cluster = Cluster("h100-sxm", 8)
    plans = [
        Plan(tp=2, pp=2, dp=2, global_batch=16, schedule=s, tp_overlap=o) for s in ("1f1b", "gpipe") for o in (0, 1)
    ]
    # the model's first capture reads the registry too, once per process (captures are kept): done before counting,
    # so that the count does not depend on which test captured the model first
    _evaluate_batch("gpt3-125m", plans[:1], cluster, 1.0, fast=True)
    monkeypatch.setattr(plugins, "get_registry", counted)
    out = _evaluate_batch("gpt3-125m", plans, cluster, 1.0, fast=True)
    assert len(out) == 4 and all(e.simulated for e in out)
    assert len(reads) <= 2  # the batch's _Registered and its prepared joints' key, not one per layout

    def entry(owner: str, optional: bool) -> SimpleNamespace:
        return SimpleNamespace(owner=owner, value=SimpleNamespace(optional=optional))

    own = {"tensor-parallel": entry("echosim.passes.tensor_parallel", False)}
    for passes, named, alone in (
        (own, ("no-dropout",), False),
        ({**own, "no-dropout": entry("pipeline-demo", True)}, (), False),
        ({**own, "no-dropout": entry("pipeline-demo", True)}, ("no-dropout",), True),
        ({**own, "always": entry("pipeline-demo", False)}, (), True),
    ):
        fake = SimpleNamespace(passes=passes, schedules={})
        monkeypatch.setattr(plugins, "get_registry", lambda fake=fake: fake)
        assert _Registered.now().runs_foreign_pass(Plan(passes=named)) is alone


def test_an_enumerated_plan_equals_the_one_plans_init_builds() -> None:
    """The enumeration builds its plans without ``Plan.__init__`` (:func:`_new_plan`): the same fields in the same
    order, equal and hashing alike, for a ``Plan`` with no ``__post_init__``, ``init=False`` field or slots."""
    from dataclasses import fields

    from echosim.layout_search import _new_plan

    assert not hasattr(Plan, "__post_init__") and not hasattr(Plan, "__slots__")
    assert all(f.init for f in fields(Plan))
    base = Plan(global_batch=64, framework="megatron", recompute="full", splash_blocks=(1, 2, 3, 4, 5, 6))
    fixed = {f.name: getattr(base, f.name) for f in fields(Plan)}
    changes = {"tp": 4, "pp": 2, "dp": 8, "vpp": 2, "schedule": "interleaved", "tp_overlap": True, "global_batch": 32}
    plan, want = _new_plan(fixed, **changes), Plan(**{**fixed, **changes})
    assert type(plan) is Plan and plan == want and hash(plan) == hash(want)
    assert list(vars(plan).items()) == list(vars(want).items())
    assert plan.microbatches == want.microbatches == 4 and fixed == vars(base)


def test_search_says_what_compile_warns_of_for_the_best_layout() -> None:
    """A search's batched costing reads no warnings; the best layout's compile does, and the search passes them on
    (text and JSON): here RWKV's receptance projections run whole on both tensor-parallel ranks."""
    args = (TINY_RWKV, "--backend", "h100-sxm", "--devices", "2", "--global-batch", "4", "--seq-len", "16",
            "--space", "tp=2", "--space", "pp=1", "--space", "recompute=none")  # fmt: skip
    check_whole_warning_carried(_run, args, "warning (#1): ")


def test_why_gives_a_sub_millisecond_gap_in_significant_digits() -> None:
    """A small model's best and runner-up differ by microseconds: the line says how much, not "0.0 ms"."""
    from echosim.layout_search import _ms

    assert [_ms(x) for x in (0.0, 2.3e-5, 0.00099, 0.0012, 1.234)] == [
        "0.0 ms", "0.023 ms", "0.99 ms", "1.2 ms", "1234.0 ms"
    ]  # fmt: skip


def test_the_context_parallel_scheme_is_a_dimension() -> None:
    """--space cp_comm=... lists each cp > 1 layout once per scheme (a layout without cp once), rejects the schemes
    that cannot run the model with the compile's own line, and costs each as compile does."""
    flags = ["mistral-7b", "--backend", "h100-sxm", "--devices", "8", "--seq-len", "16384", "--global-batch", "8",
             "--space", "tp=1", "--space", "pp=1", "--space", "cp=1,2,4", "--micro-batches", "1", "--recompute",
             "full", "--zero", "1", "--schedules", "1f1b"]  # fmt: skip
    code, out = _run(*flags, "--space", "cp_comm=p2p,all_gather,a2a", "--json")
    assert code == 0, out
    rows = json.loads(out)["layouts"]
    got = sorted((r["cp"], r["cp_comm"], r["simulated"]) for r in rows)
    # Mistral's sliding window: the ring refuses it, all_gather and a2a run it
    assert got == [(1, "p2p", True), (2, "a2a", True), (2, "all_gather", True), (2, "p2p", False),
                   (4, "a2a", True), (4, "all_gather", True), (4, "p2p", False)]  # fmt: skip
    assert all("sliding-window" in r["reason"] for r in rows if not r["simulated"])
    for r in rows:
        if r["simulated"] and r["cp"] > 1:
            result = CliRunner().invoke(cli, ["compile", "mistral-7b", "--backend", "h100-sxm", "--devices", "8",
                                              "--seq-len", "16384", "--global-batch", "8", "--cp", str(r["cp"]),
                                              "--cp-comm", r["cp_comm"], "--micro-batch", "1", "--recompute", "full",
                                              "--zero", "1", "--json"])  # fmt: skip
            assert result.exit_code == 0, result.output
            assert json.loads(result.output)["step_time_s"] == pytest.approx(r["step_time_s"], rel=1e-5)
    # left out, the dimension holds --cp-comm's scheme alone
    code, out = _run(*flags, "--cp-comm", "a2a", "--json")
    assert code == 0, out
    assert {(r["cp"], r["cp_comm"]) for r in json.loads(out)["layouts"]} == {(1, "a2a"), (2, "a2a"), (4, "a2a")}
    code, out = _run(*flags, "--space", "cp_comm=ring")
    assert code != 0 and "Traceback" not in out
    assert "unknown scheme 'ring' (known: p2p, all_gather, a2a, a2a+p2p)" in out


def test_search_shards_embedding_tables_in_every_layout() -> None:
    """Replicated, DLRM-DCNv2's 26B table parameters fit no 80 GiB device (the memory bound prunes every layout);
    sharded as compile would shard them, the data-parallel layouts fit, and the rest are refused by name."""
    args = ["dlrm-dcnv2", "--backend", "h100-sxm", "--devices", "16", "--global-batch", "32768",
            "--space", "pp=1", "--space", "tp=1,2", "--micro-batches", "2048", "--zero", "0,1", "--json"]  # fmt: skip
    code, out = _run(*args)
    assert code == 1 and "by memory lower bound" in out and len(out.strip().splitlines()) == 1
    assert "embedding-table parameters are replicated: --embedding-sharding auto shards them" in out
    code, out = _run(*args, "--embedding-sharding", "auto")
    assert code == 0, out
    result = json.loads(out)
    assert result["counts"]["fit"] > 0 and all(b["tp"] == 1 for b in result["best"] if b["fits"])
    refused = [c for c in result["layouts"] if c["tp"] == 2]
    assert refused and all("tp=2" in c["reason"] for c in refused)
    code, out = _run(*args, "--embedding-sharding", "grid")
    assert code == 1 and "'grid': unknown" in out and len(out.strip().splitlines()) == 1


def test_the_memory_bound_spreads_sharded_tables_over_the_data_parallel_ranks() -> None:
    """Tables a plan shards keep at least their rows and row-wise Adagrad state over dp; the dense parameters the
    usual bytes."""
    plan = Plan(dp=8, zero=0, framework="megatron")
    dense_only = memory_lower_bound(plan, 10**6)
    tables = (10**9, 2 * 10**9 + 4 * 10**7)  # 10^9 parameters: 2 bytes each, and a 4-byte accumulator per row
    sharded = replace(plan, embedding_sharding="auto")
    assert memory_lower_bound(sharded, 10**9 + 10**6, tables=tables) == dense_only + tables[1] // 8
    # unsharded, the tables are dense parameters like the rest
    assert memory_lower_bound(plan, 10**9 + 10**6, tables=tables) == memory_lower_bound(plan, 10**9 + 10**6)


def test_recompute_in_a_model_without_a_repeated_block_is_no_recompute() -> None:
    """echosim checkpoints layers: in a model whose layers fold into no repeated block (DLRM) every recompute policy
    replays nothing, so a search simulates it once, as none."""
    facts = ModelFacts.of("dlrm-dcnv2", Plan())
    assert facts.shape.layers is None
    for policy in ("full", "selective", "full:1"):
        assert canonical(Plan(dp=8, global_batch=8, recompute=policy), facts).recompute == "none"
    llama = ModelFacts.of("llama3-8b", Plan())
    assert canonical(Plan(dp=8, global_batch=8, recompute="full"), llama).recompute == "full"


def test_models_without_token_sequences_also_try_each_degrees_whole_share_of_the_batch() -> None:
    """DLRM trains thousands of samples a device with no accumulation: its micro-batches include the global batch
    over each data-parallel degree; a language model's stay 1-8 (a share of sequences would be thousands of them)."""
    from echosim.layout_search import DEFAULT_MICRO_BATCHES, full_space

    cluster = Cluster("h100-sxm", 16, 8)
    base = Plan(global_batch=32768)
    mbs = full_space(ModelFacts.of("dlrm-dcnv2", base), base, cluster, {}, {}).values["mb"]
    assert mbs == (*DEFAULT_MICRO_BATCHES, 2048, 4096, 8192, 16384, 32768)
    base = Plan(global_batch=512)
    assert full_space(ModelFacts.of("llama3-8b", base), base, cluster, {}, {}).values["mb"] == DEFAULT_MICRO_BATCHES
    # asked for, the space is the user's
    given = {"mb": (64,)}
    assert full_space(ModelFacts.of("dlrm-dcnv2", base), base, cluster, {}, given).values["mb"] == (64,)


def test_a_model_no_tensor_parallel_rule_splits_is_searched_at_tp_1() -> None:
    """tp > 1 on DLRM is not a layout (no module path matches the plan): the default space holds tp 1 only, where
    it used to list every degree as a rejected layout; asked for, tp 2 is refused with its reason."""
    from echosim.layout_search import full_space

    cluster = Cluster("h100-sxm", 16, 8)
    base = Plan(global_batch=32768)
    assert full_space(ModelFacts.of("dlrm-dcnv2", base), base, cluster, {}, {}).values["tp"] == (1,)
    assert full_space(ModelFacts.of("llama3-8b", base), base, cluster, {}, {}).values["tp"] == (1, 2, 4, 8)
    args = ["dlrm-dcnv2", "--backend", "h100-sxm", "--devices", "16", "--global-batch", "32768", "--space", "pp=1",
            "--micro-batches", "2048", "--zero", "0", "--schedules", "1f1b", "--embedding-sharding", "row"]  # fmt: skip
    code, out = _run(*args, "--json")
    assert code == 0, out
    assert {c["tp"] for c in json.loads(out)["layouts"]} == {1}
    code, out = _run(*args, "--space", "tp=2")
    assert code == 1 and "no module path of 'dlrm-dcnv2' matches the tensor-parallel plan" in out


def test_search_compares_embedding_sharding_types() -> None:
    """``--space embedding_sharding=...`` is a dimension like the others: each type simulated, named in the table's
    dp column and the JSON; a model without pooled tables lists its layouts once; an unknown type is one line."""
    args = ["dlrm-dcnv2", "--backend", "h100-sxm", "--devices", "16", "--global-batch", "32768",
            "--space", "pp=1", "--space", "tp=1", "--micro-batches", "2048", "--zero", "0", "--schedules", "1f1b",
            "--space", "embedding_sharding=table,row,table_row"]  # fmt: skip
    code, out = _run(*args, "--json")
    assert code == 0, out
    result = json.loads(out)
    assert sorted(c["embedding_sharding"] for c in result["layouts"]) == ["row", "table", "table_row"]
    steps = {c["embedding_sharding"]: c["step_time_s"] for c in result["layouts"]}
    for kind, step in steps.items():  # the figures are compile's
        plan = Plan(dp=16, micro_batch=2048, global_batch=32768, embedding_sharding=kind)
        assert step == pytest.approx(compile_model("dlrm-dcnv2", plan, Cluster("h100-sxm", 16)).step_time_s)
    code, out = _run(*args)
    best = min(steps, key=steps.get)
    assert code == 0 and f"16 {best}" in out
    small = ["gpt3-125m", "--devices", "2", "--global-batch", "8", "--space", "tp=1", "--space", "pp=1"]
    code, out = _run(*small, "--micro-batches", "1", "--zero", "0", "--space", "embedding_sharding=row,table", "--json")
    assert code == 0, out
    assert all("embedding_sharding" not in c for c in json.loads(out)["layouts"])  # nothing to shard: none
    code, out = _run(*args[:-1], "embedding_sharding=diagonal")
    assert code == 1 and "unknown type 'diagonal'" in out and len(out.strip().splitlines()) == 1


def test_the_table_shows_millisecond_steps_to_three_digits() -> None:
    """A recommendation model's 3 ms steps would all read 0.003 to the millisecond; below 0.1 s the table keeps three
    significant digits (at most six decimals), above it the millisecond."""
    from echosim.commands.search import _seconds

    assert [_seconds(s) for s in (30.0614, 0.8244, 0.00313, 0.003378, 0.000742, 3.2e-5, 0.0)] == [
        "30.061", "0.824", "0.00313", "0.00338", "0.000742", "0.000032", "0.000",
    ]  # fmt: skip


def test_a_degree_s_whole_batch_is_no_micro_batch_of_another_degree() -> None:
    """The shares of the batch a search adds for DLRM (32,768 / dp) are listed only with degrees they divide into;
    asked for with --micro-batches, a micro-batch that does not divide is still refused with its reason."""
    args = ["dlrm-dcnv2", "--backend", "h100-sxm", "--devices", "16", "--global-batch", "32768",
            "--embedding-sharding", "row", "--space", "pp=1", "--zero", "0", "--schedules", "1f1b"]  # fmt: skip
    code, out = _run(*args, "--json")
    assert code == 0, out
    result = json.loads(out)
    assert not any("is not a multiple of micro-batch*dp" in c.get("reason", "") for c in result["layouts"])
    assert {c["micro_batch"] for c in result["layouts"] if c["dp"] == 16} >= {2048}
    code, out = _run(*args, "--micro-batches", "4096,2048", "--json")
    reasons = [c.get("reason", "") for c in json.loads(out)["layouts"]]
    assert code == 0 and any("not a multiple of micro-batch*dp = 4096*16" in r for r in reasons)


def test_on_stages_keeps_one_whole_backward_copy_per_schedule() -> None:
    """``on_stages`` hands back one copy per registered zero-bubble schedule (the caches key on its identity), the
    schedule itself on more stages, and a plugin's schedule object without ``split_backward`` as it is."""
    from types import SimpleNamespace

    from echosim.timeline.schedule import BUILTIN_SCHEDULES, on_stages

    zb = next(s for s in BUILTIN_SCHEDULES if s.name == "zb-h1")
    assert on_stages(zb, 1) is on_stages(zb, 1) and not on_stages(zb, 1).split_backward
    assert on_stages(zb, 1).orders is zb.orders and on_stages(zb, 2) is zb
    plugin = SimpleNamespace(name="mine", orders=zb.orders)
    assert on_stages(plugin, 1) is plugin  # type: ignore[arg-type]
