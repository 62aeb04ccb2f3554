"""``--fsdp-reduce-dtype``: the dtype of ZeRO-3 / FSDP's gradient reduce-scatter, as a run sets it (Megatron-FSDP's
``--megatron-fsdp-grad-comm-dtype``); torchtitan takes only float32, its framework's default."""

from __future__ import annotations

from pathlib import Path

import pytest

from echosim.compiler import compile as compile_model
from echosim.compiler import lower
from echosim.configs import ConfigError, read_args, read_source
from echosim.ir.ops import Axis, CollectiveAttrs, OpKind
from echosim.ir.types import DType
from echosim.plan import Cluster, Plan, PlanError

TT = Path(__file__).parent / "data" / "configs" / "torchtitan"
_PLAN = {"dp": 16, "zero": 3, "micro_batch": 2, "global_batch": 32, "seq_len": 2048}


def _reduce_scatters(framework: str, reduce: str = "") -> tuple[list[tuple[DType, int]], float]:
    plan = Plan(framework=framework, fsdp_reduce_dtype=reduce, **_PLAN)  # type: ignore[arg-type]
    run = lower("llama3-8b", plan, Cluster("h100-sxm", 16))
    graph = run.stages[0].graph
    gradients = (n for n in graph if isinstance(n.attrs, CollectiveAttrs) and n.attrs.axis is Axis.FSDP)
    got = [(n.out.dtype, n.out.nbytes) for n in gradients if n.op is OpKind.REDUCE_SCATTER]
    return got, run.report.step_time_s


@pytest.mark.parametrize(("framework", "default"), [("torchtitan", DType.FP32), ("megatron", DType.BF16)])
def test_the_reduce_scatters_take_the_dtype_given(framework: str, default: DType) -> None:
    """Every gradient reduce-scatter takes the dtype given, at its size in bytes; the framework's own choice is
    unchanged when none is given, and a narrower reduction is no slower."""
    plain, plain_s = _reduce_scatters(framework)
    fp32, fp32_s = _reduce_scatters(framework, "fp32")
    bf16, bf16_s = _reduce_scatters(framework, "bf16")
    assert plain and {d for d, _ in plain} == {default}
    assert {d for d, _ in fp32} == {DType.FP32} and {d for d, _ in bf16} == {DType.BF16}
    assert [b for _, b in fp32] == [2 * b for _, b in bf16]
    assert (plain_s == fp32_s) if default is DType.FP32 else (plain_s == bf16_s)
    assert bf16_s <= fp32_s


def test_the_plan_states_it_only_where_set() -> None:
    cluster = Cluster("h100-sxm", 16)
    assert "fsdp_reduce_dtype" not in compile_model("llama3-8b", Plan(framework="torchtitan", **_PLAN), cluster).plan
    given = compile_model("llama3-8b", Plan(framework="torchtitan", fsdp_reduce_dtype="bf16", **_PLAN), cluster)
    assert given.plan["fsdp_reduce_dtype"] == "bf16"


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        ({"fsdp_reduce_dtype": "bf16", "zero": 1, "dp": 2}, "the dtype of ZeRO-3 / FSDP's gradient reduce-scatter"),
        ({"fsdp_reduce_dtype": "fp8", "zero": 3, "dp": 2}, "unknown --fsdp-reduce-dtype 'fp8'"),
    ],
)
def test_bad_uses_are_one_line(plan: dict, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        compile_model("gpt3-125m", Plan(**plan), Cluster("h100-sxm", 2))  # type: ignore[arg-type]


_FSDP = ("--num-layers 8 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
         "--micro-batch-size 1 --global-batch-size 8 --bf16 --vocab-size 1000 --use-megatron-fsdp")  # fmt: skip


def test_megatron_fsdp_grad_comm_dtype() -> None:
    """--megatron-fsdp-grad-comm-dtype, whose auto takes --megatron-fsdp-main-grads-dtype, whose auto is the model's
    gradient dtype (Megatron-LM arguments.py, commit d98e8a6)."""
    assert read_args(f"{_FSDP} --megatron-fsdp-grad-comm-dtype fp32").options["fsdp_reduce_dtype"] == "fp32"
    assert read_args(f"{_FSDP} --megatron-fsdp-main-grads-dtype fp32").options["fsdp_reduce_dtype"] == "fp32"
    both = f"{_FSDP} --megatron-fsdp-main-grads-dtype fp32 --megatron-fsdp-grad-comm-dtype bf16"
    assert read_args(both).options["fsdp_reduce_dtype"] == "bf16"
    assert "fsdp_reduce_dtype" not in read_args(_FSDP).options
    optim = read_args(f"{_FSDP} --data-parallel-sharding-strategy optim --megatron-fsdp-grad-comm-dtype fp32")
    assert "fsdp_reduce_dtype" not in optim.options
    assert any("distributed optimizer's reduction" in n for n in optim.notes)
    with pytest.raises(ConfigError, match="--megatron-fsdp-grad-comm-dtype 'fp64'"):
        read_args(f"{_FSDP} --megatron-fsdp-grad-comm-dtype fp64")


def test_torchtitan_takes_only_float32(tmp_path: Path) -> None:
    text = (TT / "llama3_8b.toml").read_text()
    path = tmp_path / "job.toml"
    path.write_text(text.replace("[training]\n", '[training]\nmixed_precision_reduce = "float32"\n', 1))
    got = read_source(f"torchtitan:{path}")
    assert "fsdp_reduce_dtype" not in got.options and not [n for n in got.notes if "reduce" in n]
    path.write_text(text.replace("[training]\n", '[training]\nmixed_precision_reduce = "bfloat16"\n', 1))
    with pytest.raises(ConfigError, match="mixed_precision_reduce 'bfloat16' \\(torchtitan takes only float32\\)"):
        read_source(f"torchtitan:{path}")


def test_megatron_bridge_ddp_fields(tmp_path: Path) -> None:
    """Megatron-Bridge's ``ddp`` section holds Megatron-Core's DistributedDataParallelConfig fields
    (``megatron_fsdp_grad_comm_dtype``, ``megatron_fsdp_main_grads_dtype``: torch dtypes, None for auto)."""
    path = tmp_path / "run_config.yaml"
    base = ("model:\n  num_layers: 4\n  hidden_size: 256\n  num_attention_heads: 4\n  seq_length: 128\n"
            "  vocab_size: 1000\n  bf16: true\ntrain:\n  global_batch_size: 8\n  micro_batch_size: 1\n"
            "ddp:\n  use_megatron_fsdp: true\n  data_parallel_sharding_strategy: optim_grads_params\n")  # fmt: skip
    path.write_text(base + "  megatron_fsdp_grad_comm_dtype:\n    _target_: torch.float32\n    _call_: false\n")
    assert read_source(f"mbridge:{path}").options["fsdp_reduce_dtype"] == "fp32"
    path.write_text(base + "  megatron_fsdp_grad_comm_dtype: null\n  megatron_fsdp_main_grads_dtype: null\n")
    got = read_source(f"mbridge:{path}")
    assert got.options["zero"] == 3 and "fsdp_reduce_dtype" not in got.options
