"""``--grad-dtype``: the gradient buffer's dtype over 16-bit weights with an fp32 master (Megatron-Core's
``grad_reduce_in_fp32``, ``--grad-reduce-in-bf16``, Megatron-FSDP's main gradients, Megatron-Bridge's mixed-precision
config), and the optimizer step's fp32 copy of 16-bit gradients."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from layout_samples import drawn

from echosim import fast_eval, memo
from echosim.cli import cli
from echosim.compiler import compile as compile_model
from echosim.configs import ConfigError, read_args, read_source
from echosim.layout_search import _evaluate_batch
from echosim.plan import Cluster, Plan, PlanError

_LLAMA = {"dp": 8, "zero": 1, "seq_len": 4096, "micro_batch": 1, "global_batch": 64, "framework": "megatron"}
_PARAMS = 8_030_261_248  # Llama-3 8B


def _dp_bytes(**plan: object) -> int:
    """Bytes the data-parallel gradient reductions of one stage graph move (not ZeRO's weight all-gathers)."""
    from echosim.compiler import lower
    from echosim.ir.ops import Axis, CollectiveAttrs, OpKind

    graph = lower("llama3-8b", Plan(**{**_LLAMA, **plan}), Cluster("h100-sxm", 8)).stages[0].graph  # type: ignore[arg-type]
    reductions = (OpKind.REDUCE_SCATTER, OpKind.ALL_REDUCE)
    dp = [n for n in graph if isinstance(n.attrs, CollectiveAttrs) and n.attrs.axis is Axis.DP and n.op in reductions]
    return sum(n.attrs.bytes for n in dp)


def _memory(**plan: object) -> dict:
    report = compile_model("llama3-8b", Plan(**{**_LLAMA, **plan}), Cluster("h100-sxm", 8))  # type: ignore[arg-type]
    return {**report.memory[0], "step": report.step_time_s, "plan": report.plan}


def test_sixteen_bit_gradients_halve_the_buffer_and_its_reduction() -> None:
    """Llama-3 8B on 8 H100, ZeRO-1: the gradient buffer is 4 bytes a parameter in fp32 (the megatron framework's
    default) and 2 in bf16, and its reduce-scatters move those bytes (Megatron-Core's DDP reduces its buffer in the
    buffer's dtype), so the step is shorter by the exposed half of the reduction and nothing else moves. The
    distributed optimizer's fp32 copy is one eighth of 4 bytes, far under the activations it outlives."""
    plain, fp32, bf16 = _memory(), _memory(grad_dtype="fp32"), _memory(grad_dtype="bf16")
    assert plain["grads"] == fp32["grads"] == 4 * _PARAMS and bf16["grads"] == 2 * _PARAMS
    assert plain["peak"] - bf16["peak"] == 2 * _PARAMS
    assert plain["step"] == fp32["step"] > bf16["step"]
    reduced = [_dp_bytes(grad_dtype=g) for g in ("fp32", "bf16")]
    assert reduced[0] == 2 * reduced[1] > 0
    assert {k: plain[k] for k in ("activations", "transient", "optimizer")} == {
        k: bf16[k] for k in ("activations", "transient", "optimizer")
    }
    assert "grad_dtype" not in plain["plan"] and bf16["plan"]["grad_dtype"] == "bf16"


def test_without_a_sharded_optimizer_the_step_copies_every_gradient_to_fp32() -> None:
    """ZeRO-0 with full recompute keeps little activation: at the optimizer step Megatron-Core's
    ``main_param.grad = model_param.main_grad.float()`` holds 4 more bytes a parameter beside the 2-byte buffer, so
    16-bit gradients need more memory than fp32 ones, whose ``.float()`` is the buffer itself."""
    fp32 = _memory(zero=0, recompute="full")
    bf16 = _memory(zero=0, recompute="full", grad_dtype="bf16")
    state = bf16["params"] + bf16["grads"] + bf16["optimizer"] + bf16["comm_buffers"]
    assert bf16["peak"] == state + 4 * _PARAMS  # the step's copy, the activations gone
    assert bf16["peak"] - fp32["peak"] == 2 * _PARAMS - (fp32["activations"] + fp32["transient"])
    assert fp32["transient"] < bf16["transient"]
    # ZeRO-1 copies one eighth of it: the backward's peak stands
    sharded = _memory(grad_dtype="bf16")
    assert sharded["peak"] == sum(sharded[k] for k in ("params", "grads", "optimizer", "comm_buffers",
                                                       "activations", "transient", "fragmentation"))  # fmt: skip
    assert sharded["transient"] == _memory()["transient"]


def test_a_search_prices_the_step_copy_as_the_compile_does() -> None:
    """The brief figures of a search (its own peak arithmetic) equal the report's with the step's copy in play:
    16-bit gradients on every layout, ZeRO 0-3."""
    cluster = Cluster("h100-sxm", 16)
    plans = drawn("gpt3-350m", Plan(global_batch=32, framework="megatron", grad_dtype="bf16"), cluster, 40, 5)
    memo.clear_all()
    fast_eval.FALLBACKS.clear()
    brief = _evaluate_batch("gpt3-350m", plans, cluster, 0.03, fast=True, brief=True)
    assert not fast_eval.FALLBACKS, fast_eval.FALLBACKS
    memo.clear_all()
    full = _evaluate_batch("gpt3-350m", plans, cluster, 0.03, fast=True)
    for b, f, plan in zip(brief, full, plans, strict=True):
        assert b.peak_bytes == f.peak_bytes and b.fits == f.fits, plan
    copied = [p for p in plans if p.zero == 0]
    assert copied


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        ({"grad_dtype": "fp16", "dtype": "bf16"}, "the weights are bf16"),
        ({"grad_dtype": "bf16", "dtype": "fp32"}, "fp32 training keeps its gradients in the weights' dtype"),
        ({"grad_dtype": "bf16", "dtype": "bf16", "framework": "eager-amp"}, "framework 'eager-amp'"),
        ({"grad_dtype": "fp8", "dtype": "bf16"}, "unknown --grad-dtype 'fp8'"),
        (
            {"grad_dtype": "fp32", "dtype": "bf16", "framework": "megatron", "optimizer_dtypes": "main_grads=bf16"},
            "main gradients are fp32 when gradients accumulate in fp32",
        ),
    ],
)
def test_bad_uses_are_one_line(plan: dict, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        compile_model("gpt3-125m", Plan(**plan), Cluster("h100-sxm", 1))  # type: ignore[arg-type]


def test_the_cli_takes_it_and_refuses_a_mismatch_in_one_line() -> None:
    base = ["compile", "gpt3-125m", "--backend", "h100-sxm", "--devices", "1", "--dtype", "bf16"]
    ok = CliRunner().invoke(cli, [*base, "--grad-dtype", "bf16", "--json"])
    assert ok.exit_code == 0, ok.output
    bad = CliRunner().invoke(cli, [*base, "--grad-dtype", "fp16"])
    assert bad.exit_code != 0 and len(bad.output.strip().splitlines()) == 1 and "Traceback" not in bad.output


_ARGS = ("--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
         "--micro-batch-size 1 --global-batch-size 8 --vocab-size 1000")  # fmt: skip


def test_megatron_flags() -> None:
    """Megatron-LM's arguments.py (commit d98e8a6): bf16 accumulates in fp32 unless --grad-reduce-in-bf16; fp16
    does not unless --accumulate-allreduce-grads-in-fp32; Megatron-FSDP's main gradients default to the model's."""
    assert read_args(f"{_ARGS} --bf16 --grad-reduce-in-bf16").options["grad_dtype"] == "bf16"
    both = read_args(f"{_ARGS} --bf16 --grad-reduce-in-bf16 --accumulate-allreduce-grads-in-fp32")
    assert both.options["grad_dtype"] == "bf16"  # --grad-reduce-in-bf16 turns the other off
    assert read_args(f"{_ARGS} --fp16 --accumulate-allreduce-grads-in-fp32").options["grad_dtype"] == "fp32"
    assert "grad_dtype" not in read_args(f"{_ARGS} --bf16").options
    fp16 = read_args(f"{_ARGS} --fp16 --grad-reduce-in-bf16")
    assert "grad_dtype" not in fp16.options  # the megatron framework's own fp16 gradients
    assert not any("Megatron keeps fp16 gradients" in n for n in fp16.notes)
    assert any("--grad-reduce-in-bf16: read by Megatron only with --bf16" in n for n in fp16.notes)
    assert "grad_dtype" not in read_args(f"{_ARGS} --grad-reduce-in-bf16").options  # fp32 training
    fsdp = f"{_ARGS} --bf16 --use-megatron-fsdp"
    assert read_args(fsdp).options["grad_dtype"] == "bf16"
    assert read_args(f"{fsdp} --megatron-fsdp-main-grads-dtype fp32").options["grad_dtype"] == "fp32"
    with pytest.raises(ConfigError, match="--main-grads-dtype bf16 with --accumulate-allreduce-grads-in-fp32"):
        read_args(f"{_ARGS} --bf16 --accumulate-allreduce-grads-in-fp32 --use-precision-aware-optimizer "
                  "--main-grads-dtype bf16")  # fmt: skip


_BRIDGE = ("model:\n  num_layers: 4\n  hidden_size: 256\n  num_attention_heads: 4\n  seq_length: 128\n"
           "  vocab_size: 1000\ntrain:\n  global_batch_size: 8\n  micro_batch_size: 1\n")  # fmt: skip


@pytest.mark.parametrize(
    ("tail", "want"),
    [
        ("mixed_precision: bf16_mixed\nddp:\n  grad_reduce_in_fp32: false\n", "fp32"),  # the recipe's overrides ddp
        ("mixed_precision: fp16_mixed\n", "fp16"),
        ("mixed_precision: bf16_with_mxfp8_mixed\n", "fp32"),
        ("mixed_precision:\n  bf16: true\n  grad_reduce_in_fp32: false\nddp:\n  grad_reduce_in_fp32: true\n", "bf16"),
        ("ddp:\n  grad_reduce_in_fp32: true\n", ""),  # fp32 training: nothing to set
        ("mixed_precision:\n  bf16: true\nddp:\n  grad_reduce_in_fp32: false\n", ""),  # the section leaves it out
    ],
)
def test_megatron_bridge_mixed_precision_wins_over_ddp(tmp_path: Path, tail: str, want: str) -> None:
    """Megatron-Bridge's finalize resolves a recipe name and copies the mixed-precision config's
    grad_reduce_in_fp32 over the DDP config's (config.py, mixed_precision.py, commit 067f987)."""
    path = tmp_path / "run_config.yaml"
    path.write_text(_BRIDGE + tail)
    assert read_source(f"mbridge:{path}").options.get("grad_dtype", "") == want


def test_megatron_bridge_without_mixed_precision_reads_ddp(tmp_path: Path) -> None:
    path = tmp_path / "run_config.yaml"
    path.write_text(_BRIDGE.replace("  vocab_size: 1000\n", "  vocab_size: 1000\n  bf16: true\n")
                    + "ddp:\n  grad_reduce_in_fp32: true\n")  # fmt: skip
    assert read_source(f"mbridge:{path}").options["grad_dtype"] == "fp32"
    path.write_text(path.read_text().replace("grad_reduce_in_fp32: true", "grad_reduce_in_fp32: false"))
    assert read_source(f"mbridge:{path}").options["grad_dtype"] == "bf16"


@pytest.mark.parametrize(
    ("dtype", "zero", "grad_bytes"),
    [("bf16", 0, 4), ("bf16", 1, 2), ("bf16", 2, 2), ("fp16", 0, 2), ("fp16", 1, 2)],
)
def test_deepspeed_keeps_the_models_dtype_under_zero(dtype: str, zero: int, grad_bytes: int) -> None:
    """DeepSpeed's grad_accum_dtype default (DeepSpeedEngine.get_data_types, commit 38327e0): the model's dtype,
    except bf16 without ZeRO (BF16_Optimizer accumulates in fp32). dp 8: ZeRO-2 shards the gradients."""
    plan = Plan(dp=8, zero=zero, dtype=dtype, framework="deepspeed", global_batch=8)
    row = compile_model("gpt3-125m", plan, Cluster("h100-sxm", 8)).memory[0]
    shard = 8 if zero >= 2 else 1
    assert row["grads"] * 2 * shard == pytest.approx(grad_bytes * row["params"] * (8 if zero >= 3 else 1), rel=1e-6)


def test_deepspeed_grad_accum_dtype(tmp_path: Path) -> None:
    """``data_types.grad_accum_dtype`` (DeepSpeed's DtypeEnum spellings) is the gradient dtype; another value is one
    line."""
    path = tmp_path / "ds.json"
    base = '{"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}, "zero_optimization": {"stage": 1}'
    path.write_text(base + ', "data_types": {"grad_accum_dtype": "fp32"}}')
    assert read_source(f"deepspeed:{path}").options["grad_dtype"] == "fp32"
    path.write_text(base + ', "data_types": {"grad_accum_dtype": "bfloat16"}}')
    assert read_source(f"deepspeed:{path}").options["grad_dtype"] == "bf16"
    path.write_text(base + "}")
    assert "grad_dtype" not in read_source(f"deepspeed:{path}").options
    for bad in ('"fp8"', "[1]", "3"):
        path.write_text(base + f', "data_types": {{"grad_accum_dtype": {bad}}}}}')
        with pytest.raises(ConfigError, match=r"data_types\.grad_accum_dtype .* \(DeepSpeed knows"):
            read_source(f"deepspeed:{path}")


def test_a_grad_accum_dtype_of_another_type_is_one_line(tmp_path: Path) -> None:
    # found by benchmarks/fuzz.py --targets deepspeed-config: a list or an object there was a TypeError
    path = tmp_path / "ds.json"
    path.write_text('{"train_micro_batch_size_per_gpu": 1, "data_types": {"grad_accum_dtype": {"a": 1}}}')
    with pytest.raises(ConfigError, match="DeepSpeed knows fp32, fp16, bf16"):
        read_source(f"deepspeed:{path}")


def test_nemo_grad_sync_dtype(tmp_path: Path) -> None:
    """NeMo's distributed_fused_adam keeps and reduce-scatters gradients in ``optim.grad_sync_dtype``
    (NVIDIA's launcher sets ``+training.model.optim.grad_sync_dtype=bf16``)."""
    text = (Path(__file__).parent / "data" / "configs" / "nemo" / "gpt3_5b.yaml").read_text()
    path = tmp_path / "run.yaml"
    path.write_text(text.replace("  optim:\n", "  optim:\n    grad_sync_dtype: bf16\n", 1))
    assert read_source(f"nemo:{path}").options["grad_dtype"] == "bf16"
    path.write_text(text.replace("  optim:\n", "  optim:\n    grad_sync_dtype: fp8\n", 1))
    with pytest.raises(ConfigError, match=r"model\.optim\.grad_sync_dtype 'fp8'"):
        read_source(f"nemo:{path}")


def test_nemo_1s_distributed_optimizers_keep_fp32_gradients_unless_told(tmp_path: Path) -> None:
    """NeMo 1 builds Apex's DistributedFusedAdam with dtype fp32, whose grad_sync_dtype defaults to it, and
    Megatron-Core's distributed optimizer with grad_reduce_in_fp32 unless grad_sync_dtype says otherwise: a launcher
    config that names neither keeps fp32 gradients. mcore_distributed_optim shards the optimizer state as
    distributed_fused_adam does (it was read as a plain Adam, ZeRO 0)."""
    config = Path(__file__).parent / "data" / "configs" / "nemo" / "gpt3_5b.yaml"
    assert read_source(f"nemo:{config}").options["grad_dtype"] == "fp32"
    path = tmp_path / "run.yaml"
    path.write_text(config.read_text().replace("distributed_fused_adam", "mcore_distributed_optim"))
    mcore = read_source(f"nemo:{path}").options
    assert mcore["grad_dtype"] == "fp32" and mcore.get("zero", 1) == 1
    path.write_text(config.read_text().replace("distributed_fused_adam", "fused_adam"))
    plain = read_source(f"nemo:{path}").options
    assert "grad_dtype" not in plain and plain["zero"] == 0


def test_megatron_keeps_fp16_gradients_unless_told_and_reduces_them_so() -> None:
    """Megatron-LM's --accumulate-allreduce-grads-in-fp32 is off unless given and only bf16 turns it on (arguments.py,
    2021 and today): an fp16 run keeps and all-reduces fp16 gradients, a bf16 run fp32 ones; --grad-dtype fp32 is the
    flag. Both Megatron eras, and their derived entries."""
    for framework in ("megatron", "megatron-2022", "megatron-ce-native"):
        fp16 = _memory(dtype="fp16", framework=framework)
        assert fp16["grads"] == 2 * _PARAMS, framework
        assert _memory(dtype="fp16", framework=framework, grad_dtype="fp32")["grads"] == 4 * _PARAMS
    assert _memory(dtype="bf16")["grads"] == 4 * _PARAMS
    reduced = [_dp_bytes(dtype="fp16", grad_dtype=g) for g in ("fp32", "")]
    assert reduced[0] == 2 * reduced[1] > 0
