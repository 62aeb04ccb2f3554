"""``--recompute full:N`` (Megatron's ``--recompute-method block --recompute-num-layers N``): only the first N layers
of each pipeline stage are checkpointed; time, FLOPs and saved activations grow one layer at a time from ``none``
to ``full``."""

from __future__ import annotations

import json

import pytest

from echosim.compiler import compile as compile_model
from echosim.compiler import lower
from echosim.errors import EchosimError
from echosim.frontend.zoo import ArchConfig
from echosim.ir.serialize import graph_from_data, graph_to_data
from echosim.plan import Cluster, Plan, PlanError

LAYERS_PER_STAGE = 6  # gpt3-125m's 12 layers over pp = 2


def _lowered(recompute: str, **plan: object) -> object:
    base = {"pp": 2, "dp": 2, "micro_batch": 2, "global_batch": 16, "seq_len": 1024, "recompute": recompute}
    return lower("gpt3-125m", Plan(**{**base, **plan}), Cluster("a100-80gb", 4))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def ends() -> tuple[object, object]:
    return _lowered("none"), _lowered("full")


@pytest.mark.parametrize("n", [1, 2, 5])
def test_each_replayed_layer_adds_one_layers_share(ends: tuple, n: int) -> None:
    """Hardware FLOPs and each stage's saved activations move from ``none`` by n / 6 of the way to ``full``,
    exactly (integers); each stage's backward by the same share, to float rounding."""
    none, full = ends
    part = _lowered(f"full:{n}")
    k = LAYERS_PER_STAGE
    assert (part.report.hardware_flops_per_step - none.report.hardware_flops_per_step) * k == n * (
        full.report.hardware_flops_per_step - none.report.hardware_flops_per_step
    )
    for a, f, p in zip(none.report.memory, full.report.memory, part.report.memory, strict=True):
        assert (a["activations"] - f["activations"]) % k == 0
        assert p["activations"] == f["activations"] + (k - n) * (a["activations"] - f["activations"]) // k
    for a, f, p in zip(none.costed.stages, full.costed.stages, part.costed.stages, strict=True):
        assert p.bwd == pytest.approx(a.bwd + n * (f.bwd - a.bwd) / k, rel=1e-9)
        assert p.fwd == a.fwd == f.fwd
        assert p.b_units == 4 and [c for _, c in p.units("B")[1:3]] == [k - n, n]
    assert none.report.step_time_s < part.report.step_time_s < full.report.step_time_s


def test_the_costed_graph_names_both_backward_block_units_and_its_longest_path_is_the_step() -> None:
    part = _lowered("full:2")
    units = {d.get("unit") for _, d in part.costed.dag().nodes(data=True)}
    assert {"backward.block", "backward.block_replayed", "forward.block"} <= units
    assert part.costed.longest_path_s() == pytest.approx(part.report.step_time_s, rel=1e-12)


def test_n_at_or_above_a_stages_layers_is_full(ends: tuple) -> None:
    _, full = ends
    for n in (LAYERS_PER_STAGE, 100):
        part = _lowered(f"full:{n}")
        assert part.report.step_time_s == full.report.step_time_s
        assert [m["peak"] for m in part.report.memory] == [m["peak"] for m in full.report.memory]
        assert part.costed.stages[0].b_units == 3


def test_every_nth_layer_replays_as_many_as_the_first_ones(ends: tuple) -> None:
    """torchtitan's layer-wise AC (full:every-N) replays k // N layers of a stage of k: the same sums as full:k//N;
    a stage of fewer than N layers replays none, figure for figure ``none``."""
    none, _ = ends
    for every, first in ((2, 3), (3, 2)):
        a, b = _lowered(f"full:every-{every}"), _lowered(f"full:{first}")
        assert a.report.step_time_s == b.report.step_time_s
        assert a.report.hardware_flops_per_step == b.report.hardware_flops_per_step
        assert a.report.memory == b.report.memory
    nothing = _lowered("full:every-7")
    assert nothing.report.step_time_s == none.report.step_time_s
    assert [m["peak"] for m in nothing.report.memory] == [m["peak"] for m in none.report.memory]
    assert nothing.report.hardware_flops_per_step == none.report.hardware_flops_per_step


@pytest.mark.parametrize(
    "plan",
    [
        {"schedule": "zb-h1"},  # the weight-gradient units after the two block units
        {"vpp": 2, "global_batch": 32},  # N per virtual stage (3 layers each)
        {"zero": 3},  # the per-layer gathers appended to both block units
        {"framework": "eager"},  # PyTorch DDP's buckets, ready layer by layer in the two units
    ],
)
def test_other_schedules_and_data_parallel_tails_sit_between_none_and_full(plan: dict) -> None:
    times = [_lowered(mode, **plan).report.step_time_s for mode in ("none", "full:2", "full")]
    assert times[0] < times[1] < times[2]


def test_expert_all_to_all_overlap_pairs_both_backward_units() -> None:
    """Combined 1F1B hides EP all-to-alls under the other micro-batch: with full:N the backward's two units each
    pair with as many forward layers (a replayed layer runs its all-to-alls twice, so it hides more)."""
    model = ArchConfig(
        arch="moe", layers=8, hidden=256, heads=4, kv_heads=4, ffn=512, vocab=1024, seq_len=256,
        experts=8, top_k=2, moe_ffn=256,
    )  # fmt: skip
    plan = {"pp": 2, "vpp": 2, "dp": 2, "ep": 2, "micro_batch": 1, "global_batch": 16, "moe_ep_overlap": True,
            "framework": "megatron"}  # fmt: skip

    def hidden(mode: str) -> float:
        c = lower(model, Plan(recompute=mode, **plan), Cluster("h100-sxm", 4))  # type: ignore[arg-type]
        return sum(s.ep_hidden for s in c.costed.stages)

    none, part, full = hidden("none"), hidden("full:1"), hidden("full")  # two layers per virtual stage
    assert 0 < none < part < full


def test_the_replay_count_survives_serialisation() -> None:
    graph = _lowered("full:2").stages[0].graph
    back = graph_from_data(json.loads(json.dumps(graph_to_data(graph))))
    assert back.replay_layers == 2 and back.partial_replay()
    assert "replay_layers" not in graph_to_data(_lowered("full").stages[0].graph)


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("full:0", "a whole number >= 1"),
        ("full:two", "a whole number >= 1"),
        ("full:-1", "a whole number >= 1"),
        ("full:every-1", "full:every-N is a whole number >= 2"),
        ("full:every-x", "full:every-N is a whole number >= 2"),
    ],
)
def test_a_bad_n_is_one_line(mode: str, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        compile_model("gpt3-125m", Plan(dp=2, recompute=mode), Cluster("a100-80gb", 2))


def test_n_must_be_whole_blocks_and_offload_is_refused() -> None:
    """A repeated block of two layers (dense then MoE) replays whole blocks; CPU offloading of a stage that
    recomputes some layers is not modelled."""
    model = ArchConfig(
        arch="moe", layers=4, hidden=256, heads=4, kv_heads=4, ffn=512, vocab=1024, seq_len=256,
        experts=8, top_k=2, moe_ffn=256, moe_layer_step=2,
    )  # fmt: skip
    with pytest.raises(PlanError, match="holds 2 layers, so N must be a multiple of 2"):
        compile_model(model, Plan(recompute="full:1"), Cluster("h100-sxm", 1))
    assert compile_model(model, Plan(recompute="full:2"), Cluster("h100-sxm", 1)).step_time_s > 0
    with pytest.raises(EchosimError, match="offloading the activations of a stage that recomputes only some"):
        compile_model("gpt3-125m", Plan(recompute="full:2", offload_layers=1, framework="megatron"),
                      Cluster("a100-80gb", 1))  # fmt: skip


def test_the_cli_takes_full_n() -> None:
    from click.testing import CliRunner

    from echosim.cli import cli

    result = CliRunner().invoke(
        cli, ["compile", "gpt3-125m", "--backend", "a100-80gb", "--pp", "2", "--recompute", "full:2", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["plan"]["recompute"] == "full:2"
    bad = CliRunner().invoke(cli, ["compile", "gpt3-125m", "--backend", "a100-80gb", "--recompute", "full:x"])
    assert bad.exit_code != 0 and "Traceback" not in bad.output and "full:x" in bad.output
