"""``--optimizer-dtypes``: the main gradients, the master weights and Adam's moments in the dtypes named. Megatron's
precision-aware optimizer (Transformer Engine's FusedAdam) also keeps only the 16 bits of each fp32 master that bf16
weights lack; another framework keeps the master in ``main_params``'s dtype. Bytes per parameter against
Megatron-Core's rules, the compiled memory against them, and the config readers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from echosim.cli import cli
from echosim.compiler import compile as compile_model
from echosim.configs import ConfigError, read_args, read_source
from echosim.layout_search import memory_lower_bound
from echosim.passes.data_parallel import ADAM_BYTES_PER_PARAM, optimizer_step_bytes
from echosim.passes.memory import StatePolicy
from echosim.plan import Cluster, Plan, PlanError


@pytest.mark.parametrize(
    ("dtype", "spec", "grad", "optimizer"),
    [
        ("bf16", "", 4, 12),  # Megatron's default: fp32 main grads, master, exp_avg, exp_avg_sq
        ("bf16", "main_params=fp32", 4, 2 + 4 + 4),  # on, all fp32: the master's low 16 bits only
        ("bf16", "exp_avg=bf16,exp_avg_sq=bf16", 4, 2 + 2 + 2),  # DeepSeek recipes' moments
        ("bf16", "main_grads=bf16,exp_avg=fp8,exp_avg_sq=bf16", 2, 2 + 1 + 2),
        ("mxfp8", "exp_avg=bf16,exp_avg_sq=bf16", 4, 4 + 2 + 2),  # an FP8 recipe: Megatron-Core's fp32 master
        ("mxfp8", "main_params=fp16", 4, 2 + 4 + 4),  # a 16-bit master: TE's again, as remainders
        ("fp16", "exp_avg=bf16,exp_avg_sq=bf16", 4, 4 + 2 + 2),  # fp16 weights: no remainders, an fp32 master
        ("fp16", "main_params=fp16", 4, 2 + 4 + 4),
    ],
)
def test_transformer_engines_state_bytes_per_parameter(dtype: str, spec: str, grad: int, optimizer: int) -> None:
    policy = StatePolicy.for_training(dtype, optimizer_dtypes=spec, te_optimizer=True)
    assert (policy.weight_bytes, policy.grad_bytes, policy.optimizer_bytes) == (2, grad, optimizer)
    sharded = StatePolicy.for_training(dtype, zero=1, dp=8, optimizer_dtypes=spec, te_optimizer=True)
    assert sharded.optimizer_bytes == optimizer / 8 and sharded.grad_bytes == grad


@pytest.mark.parametrize(
    ("dtype", "spec", "optimizer"),
    [
        ("bf16", "main_params=fp32", 12),  # no remainders outside TE: all fp32 is the default
        ("fp8", "exp_avg=bf16,exp_avg_sq=bf16", 4 + 2 + 2),  # DeepSeek-V3's report: fp32 master, bf16 moments
        ("bf16", "main_params=fp16,exp_avg=bf16", 2 + 2 + 4),
    ],
)
def test_other_frameworks_keep_the_master_in_its_dtype(dtype: str, spec: str, optimizer: int) -> None:
    assert StatePolicy.for_training(dtype, optimizer_dtypes=spec).optimizer_bytes == optimizer


@pytest.mark.parametrize(
    ("state", "spec", "optimizer"),
    [
        ({"fp32_weights": True}, "exp_avg=bf16", 2 + 4),  # MaxText's mu_dtype=bfloat16 over fp32 weights
        ({"fp32_weights": True}, "exp_avg=bf16,exp_avg_sq=bf16", 2 + 2),
        ({"weights_16bit": True}, "exp_avg=fp32", 4 + 2),  # a moment not named keeps the weights' dtype
        ({}, "exp_avg=bf16", 2 + 4),  # fp32 training (below)
    ],
)
def test_without_a_master_only_the_moments_change(state: dict, spec: str, optimizer: int) -> None:
    dtype = "fp32" if not state else "bf16"
    plain = StatePolicy.for_training(dtype, **state)
    got = StatePolicy.for_training(dtype, optimizer_dtypes=spec, **state)
    assert (got.weight_bytes, got.grad_bytes, got.optimizer_bytes) == (plain.weight_bytes, plain.grad_bytes, optimizer)


def test_a_framework_with_16_bit_gradients_keeps_them() -> None:
    """NeMo's performance scripts reduce 16-bit gradients (Framework.grads_16bit): main_grads does not raise them."""
    policy = StatePolicy.for_training("bf16", fp32_grads=False, optimizer_dtypes="exp_avg=bf16", te_optimizer=True)
    assert (policy.grad_bytes, policy.optimizer_bytes) == (2, 2 + 2 + 4)


def test_the_optimizer_step_moves_the_states_in_their_dtypes() -> None:
    """The fused Adam's traffic: main gradient read twice, master and moments read and written, the 16-bit weight
    written (and read where the master is its remainder). All fp32 is the constant it replaces, less the master's
    saved 2 + 2 bytes, plus the weight's read."""
    assert optimizer_step_bytes("fp16", "main_params=fp32") == ADAM_BYTES_PER_PARAM
    assert optimizer_step_bytes("bf16", "main_params=fp32") == ADAM_BYTES_PER_PARAM - 4 + 2
    assert optimizer_step_bytes("bf16", "main_params=fp32", te=False) == ADAM_BYTES_PER_PARAM
    assert optimizer_step_bytes("mxfp8", "exp_avg=bf16,exp_avg_sq=bf16") == 2 * 4 + 2 * (4 + 4) + 2


@pytest.fixture(scope="module")
def runs() -> tuple[object, object]:
    plan = {"dp": 4, "zero": 1, "micro_batch": 1, "global_batch": 8, "seq_len": 1024, "framework": "megatron"}
    cluster = Cluster("h100-sxm", 4)
    plain = compile_model("llama3-8b", Plan(**plan), cluster)  # type: ignore[arg-type]
    lowered = compile_model("llama3-8b", Plan(optimizer_dtypes="exp_avg=bf16,exp_avg_sq=bf16", **plan), cluster)  # type: ignore[arg-type]
    return plain, lowered


def test_the_compiled_memory_holds_half_the_optimizer_state(runs: tuple) -> None:
    plain, lowered = runs
    a, b = plain.memory[0], lowered.memory[0]
    assert b["optimizer"] * 2 == pytest.approx(a["optimizer"], abs=2)  # 6 bytes a parameter where it was 12
    assert (b["params"], b["grads"], b["activations"]) == (a["params"], a["grads"], a["activations"])
    assert b["peak"] < a["peak"]
    # the optimizer step moves 24 bytes a parameter (main grad 4 twice, master remainder 2 and moments 2 + 2 read
    # and written, the weight read and written) where it moved 34; it is memory-bound, so its time follows (but
    # for a few kernels' fixed costs)
    (a_step,), (b_step,) = ([s["optimizer_s"] for s in r.stages] for r in runs)
    assert b_step / a_step == pytest.approx(24 / ADAM_BYTES_PER_PARAM, rel=1e-3)
    assert plain.step_time_s - lowered.step_time_s == pytest.approx(a_step - b_step, rel=1e-9)


def test_the_plan_states_it_only_where_set(runs: tuple) -> None:
    plain, lowered = runs
    assert "optimizer_dtypes" not in plain.plan
    assert lowered.plan["optimizer_dtypes"] == "exp_avg=bf16,exp_avg_sq=bf16"


def test_a_searchs_memory_bound_follows_it() -> None:
    base = Plan(dp=8, zero=1, framework="megatron")
    lowered = memory_lower_bound(Plan(dp=8, zero=1, framework="megatron", optimizer_dtypes="exp_avg=bf16"), 10**9)
    assert lowered < memory_lower_bound(base, 10**9)


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        ({"optimizer_dtypes": "exp_avg=bf8"}, "'exp_avg=bf8' is not one of main_grads=fp32|bf16"),
        ({"optimizer_dtypes": "moments=bf16"}, "'moments=bf16' is not one of"),
        ({"optimizer_dtypes": "main_params=bf16"}, "'main_params=bf16' is not one of"),
        ({"optimizer_dtypes": "main_grads=bf16", "dtype": "fp32"}, "main_grads is the dtype of a master copy"),
        ({"optimizer_dtypes": "main_params=fp16", "framework": "torchtitan"}, "framework 'torchtitan' keeps none"),
        (
            {"optimizer_dtypes": "exp_avg=bf16,main_params=fp16", "framework": "maxtext-bf16-weights"},
            "only exp_avg and exp_avg_sq can be set",
        ),
    ],
)
def test_bad_dtypes_and_frameworks_without_a_master_are_one_line(plan: dict, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        compile_model("gpt3-125m", Plan(**{"framework": "megatron", **plan}), Cluster("h100-sxm", 1))  # type: ignore[arg-type]


def test_the_cli_takes_it_and_refuses_a_bad_one() -> None:
    base = ["compile", "gpt3-125m", "--backend", "h100-sxm", "--devices", "2", "--zero", "1", "--framework",
            "megatron", "--json"]  # fmt: skip
    good = CliRunner().invoke(cli, [*base, "--optimizer-dtypes", "exp_avg=bf16,exp_avg_sq=bf16"])
    assert good.exit_code == 0, good.output
    assert json.loads(good.output)["plan"]["optimizer_dtypes"] == "exp_avg=bf16,exp_avg_sq=bf16"
    bad = CliRunner().invoke(cli, [*base, "--optimizer-dtypes", "exp_avg=int4"])
    assert bad.exit_code != 0 and "Traceback" not in bad.output and "exp_avg=int4" in bad.output


_EIGHT = ("--num-layers 8 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
          "--micro-batch-size 1 --global-batch-size 8 --bf16 --vocab-size 1000")  # fmt: skip


def test_megatron_arguments() -> None:
    got = read_args(f"{_EIGHT} --use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16")
    assert got.options["optimizer_dtypes"] == "main_grads=fp32,main_params=fp32,exp_avg=bf16,exp_avg_sq=bf16"
    assert not [n for n in got.notes if "dtype" in n or "precision-aware" in n]
    assert read_args(f"{_EIGHT} --use-precision-aware-optimizer").options["optimizer_dtypes"] == (
        "main_grads=fp32,main_params=fp32,exp_avg=fp32,exp_avg_sq=fp32"
    )
    assert "optimizer_dtypes" not in read_args(f"{_EIGHT} --exp-avg-dtype fp32").options
    with pytest.raises(ConfigError, match="--exp-avg-dtype bf16 needs --use-precision-aware-optimizer"):
        read_args(f"{_EIGHT} --exp-avg-dtype bf16")
    with pytest.raises(ConfigError, match="--main-params-dtype 'bf16' \\(Megatron knows fp32, fp16\\)"):
        read_args(f"{_EIGHT} --use-precision-aware-optimizer --main-params-dtype bf16")


@pytest.mark.parametrize(
    "dtype",
    ["{_target_: torch.bfloat16, _call_: false}", "torch.bfloat16", "bf16", "bfloat16"],
)
def test_megatron_bridge_yaml(tmp_path: Path, dtype: str) -> None:
    """DeepSeek's Megatron-Bridge perf recipes (perf_recipes/deepseek/common.py, commit 067f987) keep the moments in
    bf16; the YAML holds a torch dtype as Megatron's representer writes it, or as a name Megatron-Bridge reads."""
    path = tmp_path / "run_config.yaml"
    path.write_text(
        "model:\n  num_layers: 4\n  hidden_size: 256\n  num_attention_heads: 4\n  seq_length: 128\n"
        "  vocab_size: 1000\n  bf16: true\ntrain:\n  global_batch_size: 8\n  micro_batch_size: 1\n"
        f"optimizer:\n  use_precision_aware_optimizer: true\n  exp_avg_dtype: {dtype}\n"
        f"  exp_avg_sq_dtype: {dtype}\n  main_grads_dtype: torch.float32\n"
    )
    got = read_source(f"mbridge:{path}")
    assert got.options["optimizer_dtypes"] == "main_grads=fp32,main_params=fp32,exp_avg=bf16,exp_avg_sq=bf16"
    assert not got.unknown
