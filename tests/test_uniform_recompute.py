"""``--recompute full:uniform-N`` (Megatron's ``--recompute-method uniform --recompute-num-layers N``): every layer
replays, as under ``full``, but one input is checkpointed per chunk of N layers of a stage and a chunk's layers are
replayed together, so fewer inputs are kept and N layers' replayed activations live at once."""

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
IN_FLIGHT = (2, 1)  # a 1F1B pipeline of two stages: micro-batches whose activations each stage holds
HIDDEN_BYTES = 1024 * 2 * 768 * 2  # a layer's checkpointed input: seq 1024 x micro-batch 2 x hidden 768, bf16


def _lowered(recompute: str, **plan: object) -> object:
    base = {"pp": 2, "dp": 2, "micro_batch": 2, "global_batch": 16, "seq_len": 1024, "recompute": recompute}
    return lower("gpt3-125m", Plan(**{**base, **plan}), Cluster("a100-80gb", 4))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def full() -> object:
    return _lowered("full")


def test_full_keeps_one_input_per_layer(full: object) -> None:
    """The closed form the chunked counts below are checked against: a checkpointed layer keeps its input (the last
    stage keeps the loss's logits besides)."""
    assert full.report.memory[0]["activations"] == IN_FLIGHT[0] * LAYERS_PER_STAGE * HIDDEN_BYTES


@pytest.mark.parametrize("n", [2, 3, 4, 6, 12])
def test_one_checkpoint_per_chunk_and_n_layers_replayed_at_once(full: object, n: int) -> None:
    """Time and FLOPs are full's exactly; each stage keeps ceil(6 / N) inputs instead of 6 (integers, exact); the
    replay's working set grows by one layer's replay and one layer input for each further layer of a chunk, a chunk
    being no longer than the stage."""
    two, got = _lowered("full:uniform-2"), _lowered(f"full:uniform-{n}")
    assert got.report.step_time_s == full.report.step_time_s
    assert got.report.hardware_flops_per_step == full.report.hardware_flops_per_step
    chunk = min(n, LAYERS_PER_STAGE)
    for f, g, held in zip(full.report.memory, got.report.memory, IN_FLIGHT, strict=True):
        kept = -(-LAYERS_PER_STAGE // n)  # chunks of the stage
        assert f["activations"] - g["activations"] == held * (LAYERS_PER_STAGE - kept) * HIDDEN_BYTES
        assert g["peak"] - f["peak"] == g["activations"] - f["activations"] + g["transient"] - f["transient"]
        assert g["transient"] >= f["transient"]  # the last stage's is its loss's, larger than a chunk's replay
    f, t, g = (r.report.memory[0] for r in (full, two, got))
    step = t["transient"] - f["transient"]
    assert step > HIDDEN_BYTES  # a layer's replayed activations besides its input
    assert g["transient"] == f["transient"] + (chunk - 1) * step and g["peak"] > f["peak"]


def test_a_chunk_is_counted_per_virtual_stage() -> None:
    """Megatron walks a (virtual) stage's layers N at a time: with vpp 2 a virtual stage holds 3 layers, so N = 3
    and N = 6 are the same chunk."""
    three, six = (_lowered(f"full:uniform-{n}", vpp=2, global_batch=32) for n in (3, 6))
    assert three.report.memory == six.report.memory
    assert three.report.step_time_s == six.report.step_time_s


def test_a_block_of_two_layers_drops_the_input_between_them() -> None:
    """A repeated block of two layers (dense then MoE): N = 2 keeps the block's input once per repetition and
    replays the second layer's input with the first; N must be whole repetitions."""
    model = ArchConfig(
        arch="moe", layers=8, hidden=256, heads=4, kv_heads=4, ffn=512, vocab=1024, seq_len=256,
        experts=8, top_k=2, moe_ffn=256, moe_layer_step=2,
    )  # fmt: skip
    cluster = Cluster("h100-sxm", 1)
    full, pair, four = (compile_model(model, Plan(recompute=m), cluster) for m in ("full", "full:uniform-2",
                                                                                   "full:uniform-4"))  # fmt: skip
    hidden = 256 * 256 * 2  # seq 256 x micro-batch 1 x hidden 256, bf16: 8 inputs kept under full
    assert full.memory[0]["activations"] - pair.memory[0]["activations"] == 4 * hidden  # 4 of 8 kept
    assert full.memory[0]["activations"] - four.memory[0]["activations"] == 6 * hidden  # 2 of 8 kept
    assert full.step_time_s == pair.step_time_s == four.step_time_s
    assert full.memory[0]["transient"] < pair.memory[0]["transient"] < four.memory[0]["transient"]
    with pytest.raises(PlanError, match="holds 2 layers, so N must be a multiple of 2"):
        compile_model(model, Plan(recompute="full:uniform-3"), cluster)


def test_the_chunk_survives_serialisation() -> None:
    graph = _lowered("full:uniform-2").stages[0].graph
    back = graph_from_data(json.loads(json.dumps(graph_to_data(graph))))
    assert back.replay_group == 2 and not back.partial_replay()
    assert "replay_group" not in graph_to_data(_lowered("full").stages[0].graph)


@pytest.mark.parametrize("mode", ["full:uniform-1", "full:uniform-0", "full:uniform-x"])
def test_a_bad_n_is_one_line(mode: str) -> None:
    with pytest.raises(PlanError, match="full:uniform-N is a whole number >= 2"):
        compile_model("gpt3-125m", Plan(dp=2, recompute=mode), Cluster("a100-80gb", 2))


def test_offloading_chunked_checkpoints_is_refused() -> None:
    with pytest.raises(EchosimError, match="offloading the activations of a stage that checkpoints chunks"):
        compile_model("gpt3-125m", Plan(recompute="full:uniform-2", offload_layers=1, framework="megatron"),
                      Cluster("a100-80gb", 1))  # fmt: skip


def test_a_search_times_it_as_the_full_compile() -> None:
    """The fast evaluator falls back for these layouts: a search's figure is the compile's."""
    from click.testing import CliRunner

    from echosim.cli import cli

    args = ["search", "gpt3-125m", "--backend", "a100-80gb", "--devices", "4", "--global-batch", "16", "--seq-len",
            "1024", "--space", "mb=2 tp=1 cp=1 pp=2 zero=0 vpp=1 recompute=full:uniform-2", "--json"]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    best = json.loads(result.output)["best"][0]
    assert best["recompute"] == "full:uniform-2" and best["simulated"]
    report = _lowered("full:uniform-2", schedule=best["schedule"]).report
    assert best["step_time_s"] == pytest.approx(report.step_time_s, rel=1e-12)
    assert best["peak_bytes"] == max(m["peak"] for m in report.memory)
