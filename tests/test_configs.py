"""``compile --from``: framework configs (Megatron-LM, torchtitan, MaxText, DeepSpeed) read into a plan and a model.

Every file under tests/data/configs holds the keys a framework's own example sets (named with
repository, path and commit in its header, or in deepspeed/SOURCES.md); each must resolve to
the plan the same run written as ``compile`` flags gives.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import SHARED

from echosim.cli import cli
from echosim.commands.options import layout_from_options, parse_layout_flags
from echosim.configs import ConfigError, ConfigModel, read_args, read_source, resolve
from echosim.configs.base import normalised
from echosim.frontend.zoo import ArchConfig
from echosim.validation.cases import read_cases

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data" / "configs"
MEG, TT, MT, DS = DATA / "megatron", DATA / "torchtitan", DATA / "maxtext", DATA / "deepspeed"


def from_config(source: str, flags: str = "", model: str | None = None) -> tuple[Any, Any, Any]:
    """What ``compile [MODEL] --from SOURCE FLAGS`` simulates."""
    chosen, opts = resolve(read_source(source), _flags(flags), model)
    return layout_from_options(chosen, opts, False)


def _flags(text: str) -> dict[str, Any]:
    from echosim.commands.options import _layout_parser

    return _layout_parser.make_context("layout", text.split()).params if text else {}


def by_hand(model: Any, flags: str) -> tuple[Any, Any, Any]:
    return parse_layout_flags(model, flags, "flags")


def same(got: tuple[Any, Any, Any], want: tuple[Any, Any, Any]) -> None:
    assert got[1] == want[1]
    assert got[2] == want[2]
    model = got[0].config if isinstance(got[0], ConfigModel) else got[0]
    if isinstance(model, ArchConfig):  # the same network, whichever defaulted sizes each spelled out
        assert normalised(model) == normalised(want[0])
    else:
        assert model == want[0]


# ---- Megatron-LM ----------------------------------------------------------------------------------------------


def test_megatron_gpt3_175b_script_is_the_zoo_model_with_the_scripts_layout() -> None:
    got = from_config(f"megatron:{MEG}/train_gpt3_175b_distributed.sh", "--devices 1024")
    want = by_hand(
        "gpt3-175b",
        "--devices 1024 --tp 8 --pp 16 --micro-batch 1 --global-batch 1536 --seq-len 2048 --dtype fp16 "
        "--framework megatron",
    )
    same(got, want)
    assert got[1].dp == 8 and got[1].recompute == "none" and got[1].attention == "flash"


def test_megatron_gpt3_175b_script_reproduces_the_default_compile() -> None:
    """The script's differences from the published run (Narayanan et al. 2021) are given beside it:
    1,024 GPUs (the script starts 8 per node on one node), full recomputation (the script sets none)
    and materialised attention (the script's ``--attention-backend auto`` is today's fused kernel)."""
    runner = CliRunner()
    default = runner.invoke(cli, ["compile", "--json"])
    script = f"megatron:{MEG}/train_gpt3_175b_distributed.sh"
    flags = ["--devices", "1024", "--recompute", "full", "--attention", "math", "--framework", "eager"]
    same_run = runner.invoke(cli, ["compile", "--from", script, *flags, "--json"])
    assert default.exit_code == 0 and same_run.exit_code == 0, same_run.output
    assert same_run.stdout == default.stdout  # byte-identical report
    era = runner.invoke(cli, ["compile", "--from", script, "--devices", "1024", "--recompute", "full",
                              "--framework", "megatron-2022", "--json"])  # fmt: skip
    a, b = json.loads(default.stdout), json.loads(era.stdout)
    assert b["plan"].pop("framework") == "megatron-2022" and a["plan"].pop("framework") == "eager"
    # the 2021 framework's defaults are the default run's settings: only the name differs, and eager PyTorch's
    # DDP copies its gradients into buckets and back where Megatron's local DDP reduces its contiguous buffer,
    # while Megatron's loss runs its unfused fp32 kernels (LOSS_KERNEL_BYTES) where eager's is one pass: both
    # memory-bound (the loss on the last stage, so the pipeline bubble follows it): the GEMMs, attention and
    # tensor-parallel traffic are the same. Megatron of 2021 keeps fp16 gradients (its
    # --accumulate-allreduce-grads-in-fp32 is off unless given) where eager's master-copy default counts fp32 ones
    assert a["plan"] == b["plan"] and a["params"] == b["params"]
    same_state = ("params", "optimizer", "activations", "comm_buffers")
    for ea, era_row in zip(a["memory"], b["memory"], strict=True):
        assert [ea[k] for k in same_state] == [era_row[k] for k in same_state]
        assert ea["grads"] == 2 * era_row["grads"]  # the step's fp32 copy of them: transient, not grads
    same = ("compute.matmul", "compute.attention", "comm.tp", "optimizer")
    assert [a["breakdown"][k] for k in same] == [b["breakdown"][k] for k in same]
    assert a["breakdown"]["compute.memory_bound"] != b["breakdown"]["compute.memory_bound"]
    # and its fp16 gradients' all-reduce moves half of eager's fp32 bytes: within 1%
    assert 0 < abs(a["step_time_s"] - b["step_time_s"]) < 1e-2 * b["step_time_s"]


def test_megatron_launch_line_devices_that_cannot_hold_the_layout_are_one_line() -> None:
    result = CliRunner().invoke(cli, ["compile", "--from", f"megatron:{MEG}/train_gpt3_175b_distributed.sh"])
    assert result.exit_code == 1
    assert "launcher starts 8 devices" in result.output and "give --devices" in result.output


def test_megatron_llama3_8b_script_follows_variables_arrays_and_ifs() -> None:
    got = from_config(f"megatron:{MEG}/train_llama3_8b_h100_fp8.sh", "--backend h100-sxm")
    model = ArchConfig("llama", 32, 4096, 32, 128384, ffn=14336, kv_heads=8, head_dim=128, seq_len=8192,
                       tied_embeddings=False)  # fmt: skip
    # NullTokenizer (the mock-data branch) adds an end-of-document token: 128257, padded to a multiple of 128
    want = by_hand(
        ConfigModel(model, "x"),
        "--backend h100-sxm --devices 8 --tp 1 --cp 1 --micro-batch 1 --global-batch 128 --seq-len 8192 "
        "--dtype fp8 --zero 1 --attention flash --framework megatron",
    )
    same(got, (model, want[1], want[2]))
    assert got[1].sp is False  # --sequence-parallel with tensor-parallel size 1: Megatron turns it off


_SLURM_SCRIPT = """#!/bin/bash
TP=${TP:-2}
ARGS=(
    --tensor-model-parallel-size ${TP} --num-layers 4 --hidden-size 256 --num-attention-heads 4
    --micro-batch-size 2 --global-batch-size 16 --seq-length 128 --vocab-size 1000 --bf16
    --moe-layer-freq [0]*1+[1]*3 --num-experts 4 --moe-router-topk 2 --moe-grouped-gemm
)
if [ "${PROFILE:-0}" = 1 ]; then
    PROFILE_CMD="nsys profile --trace=cuda \\
        -o /tmp/out"
else
    PROFILE_CMD=""
fi
TRAINING_CMD="
cd /opt/megatron;  # it's the repository
git rev-parse HEAD;
${PROFILE_CMD} python /opt/megatron/pretrain_gpt.py ${ARGS[@]}"
sbatch <<EOF
#!/bin/bash
#SBATCH --nodes=your_own_num_nodes
echo it's submitted
srun bash -x -c "${TRAINING_CMD}"
EOF
"""


def test_a_slurm_script_keeps_its_command_in_a_multi_line_string(tmp_path: Path) -> None:
    """Megatron-LM's own sbatch examples (examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh) keep the training
    command in a double-quoted string over several lines and submit it through a here-document: the string is one
    assignment, its command is found, and a quote left open inside the here-document does not swallow what follows."""
    script = tmp_path / "train.sh"
    script.write_text(_SLURM_SCRIPT)
    got = read_source(f"megatron:{script}")
    assert (got.options["tp"], got.options["micro_batch"], got.options["global_batch"]) == (2, 2, 16)
    assert got.model.config.dense_layers == 1  # type: ignore[union-attr]
    assert not got.unknown


def test_megatron_fsdp_sharding_strategies_are_zero_stages() -> None:
    """--use-megatron-fsdp shards as its --data-parallel-sharding-strategy says (default optim_grads_params, the
    whole state: ZeRO-3); --use-torch-fsdp2 is PyTorch's fully_shard."""
    base = "--num-layers 2 --hidden-size 256 --num-attention-heads 2 --micro-batch-size 1 --vocab-size 1000"
    assert read_args(f"{base} --use-megatron-fsdp").options["zero"] == 3
    for strategy, zero in (("no_shard", 0), ("optim", 1), ("optim_grads", 2), ("optim_grads_params", 3)):
        got = read_args(f"{base} --use-megatron-fsdp --data-parallel-sharding-strategy {strategy}")
        assert got.options["zero"] == zero, strategy
    assert read_args(f"{base} --use-torch-fsdp2").options["zero"] == 3
    alone = read_args(f"{base} --data-parallel-sharding-strategy optim")
    assert "zero" not in alone.options and any("only with --use-megatron-fsdp" in n for n in alone.notes)
    with pytest.raises(ConfigError, match="--data-parallel-sharding-strategy 'full'"):
        read_args(f"{base} --use-megatron-fsdp --data-parallel-sharding-strategy full")


def test_megatron_mixtral_example_builds_its_small_moe() -> None:
    got = from_config(f"megatron:{MEG}/train_mixtral_8x7b_distributed.sh")
    model = ArchConfig("moe", 2, 256, 2, 32000, ffn=896, kv_heads=2, seq_len=256, tied_embeddings=False,
                       experts=2, top_k=2, moe_ffn=896)  # fmt: skip
    want = by_hand(
        ConfigModel(model, "x"),
        "--devices 2 --tp 1 --pp 1 --ep 2 --micro-batch 1 --global-batch 4 --seq-len 256 --dtype fp32 --zero 1 "
        "--framework megatron",
    )
    same(got, (model, want[1], want[2]))


def test_megatron_cp_comm_types_are_the_schemes_echosim_models() -> None:
    """p2p, all_gather, a2a and the hierarchical a2a+p2p (with its sizes) are echosim's --cp-comm; another is named
    as not modelled (tests/test_hierarchical_cp.py reads the sizes)."""
    base = "--num-layers 2 --hidden-size 256 --num-attention-heads 4 --micro-batch-size 1 --context-parallel-size 4"
    for comm in ("p2p", "all_gather", "a2a"):
        assert read_args(f"{base} --cp-comm-type {comm}").options["cp_comm"] == comm
    hierarchical = read_args(f"{base} --cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 2").options
    assert (hierarchical["cp_comm"], hierarchical["cp_a2a"]) == ("a2a+p2p", 2)
    with pytest.raises(ConfigError, match="--cp-comm-type 'ring' is not modelled"):
        read_args(f"{base} --cp-comm-type ring")


def test_from_args_is_the_same_as_a_file_of_arguments() -> None:
    text = (MEG / "korthikanti2022_gpt_22b_selective.args").read_text()
    lines = " ".join(line for line in text.splitlines() if not line.startswith("#"))
    a, b = read_args(lines), read_source(f"megatron:{MEG}/korthikanti2022_gpt_22b_selective.args")
    assert a.options == b.options and a.model.config == b.model.config  # type: ignore[union-attr]


def test_flags_beside_from_override_it() -> None:
    got = from_config(f"megatron:{MEG}/train_gpt3_175b_distributed.sh", "--devices 1024 --tp 4 --global-batch 512")
    assert (got[1].tp, got[1].pp, got[1].dp, got[1].global_batch) == (4, 16, 16, 512)


def test_a_published_row_as_megatron_arguments_predicts_the_rows_step_time() -> None:
    from echosim.compiler import compile as compile_model
    from echosim.validation.cases import read_cases
    from echosim.validation.run import validate_row

    cases = [c for c in read_cases(_cases_csv()) if c.case_id == "korthikanti2022-t5-gpt-22b-sel-a100-80gb-8"]
    assert len(cases) == 1
    row = validate_row(cases[0])
    assert row.predicted_step_time_s is not None
    model, plan, cluster = from_config(
        f"megatron:{MEG}/korthikanti2022_gpt_22b_selective.args", "--framework megatron-2022"
    )
    report = compile_model(model, plan, cluster)
    assert report.step_time_s == pytest.approx(row.predicted_step_time_s, rel=1e-12)


def _cases_csv() -> Path:
    cases = SHARED / "validation" / "cases.csv"
    if not cases.is_file():
        pytest.skip("shared/validation not present")
    return cases


# ---- torchtitan -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "flags", "hand"),
    [
        ("llama3_8b", "--devices 64", "llama3-8b --devices 64 --micro-batch 1 --global-batch 64 --seq-len 8192 "
         "--dtype bf16 --recompute selective --zero 3"),
        ("llama3_70b", "--devices 64", "llama3-70b --devices 64 --tp 8 --micro-batch 8 --global-batch 64 "
         "--seq-len 8192 --dtype bf16 --recompute full --sp --zero 3"),
        ("llama3_405b", "--devices 128", "llama3-405b --devices 128 --tp 8 --micro-batch 2 --global-batch 32 "
         "--seq-len 8192 --dtype fp8 --recompute full --sp --zero 3 --tp-overlap"),
    ],
)  # fmt: skip
def test_torchtitan_configs(name: str, flags: str, hand: str) -> None:
    got = from_config(f"torchtitan:{TT}/{name}.toml", f"{flags} --backend h100-sxm")
    model, _, rest = hand.partition(" ")
    same(got, by_hand(model, f"{rest} --backend h100-sxm --framework torchtitan"))


def test_torchtitan_needs_the_device_count_of_the_launcher() -> None:
    with pytest.raises(ConfigError, match=r"data_parallel_shard_degree = -1.*--devices"):
        resolve(read_source(f"torchtitan:{TT}/llama3_8b.toml"), {}, None)


def test_torchtitan_layer_wise_selective_ac_recomputes_every_nth_layer(tmp_path: Path) -> None:
    """``selective_ac_option = "N"`` wraps every N-th layer in a checkpoint (torchtitan's layer SAC, the default
    "2"): full:every-N; "1" (or "0") every layer; anything but 'op' or a number is one line."""
    text = (TT / "llama3_8b.toml").read_text()

    def recompute(option: str) -> str:
        path = tmp_path / f"o{len(option)}{option.replace('.', '_')}.toml"
        path.write_text(text.replace('selective_ac_option = "op"', f'selective_ac_option = "{option}"'))
        return read_source(f"torchtitan:{path}").options["recompute"]  # type: ignore[no-any-return]

    assert recompute("2") == "full:every-2" and recompute("3") == "full:every-3"
    assert recompute("1") == recompute("0") == "full"
    assert recompute("op") == "selective"
    with pytest.raises(ConfigError, match=r"selective_ac_option '0\.5' \('op' or a whole number of layers\)"):
        recompute("0.5")
    from echosim.compiler import compile as compile_model

    model, plan, cluster = from_config(f"torchtitan:{tmp_path / 'o12.toml'}", "--devices 8 --backend h100-sxm")
    assert plan.recompute == "full:every-2"  # Llama 3 8B's 32 layers: 16 replayed
    every, full = (compile_model(model, replace(plan, recompute=r), cluster) for r in ("full:every-2", "full:16"))
    assert every.step_time_s == full.step_time_s and every.memory == full.memory


def test_torchtitan_notes_what_it_does_not_model() -> None:
    cfg = read_source(f"torchtitan:{TT}/llama3_405b.toml")
    assert any("training.compile" in n for n in cfg.notes)


# ---- MaxText ----------------------------------------------------------------------------------------------------

_TPU = "--backend tpu-v5p --framework maxtext --dtype bf16 --attention flash --recompute full --zero 3"


def test_maxtext_llama2_7b() -> None:
    got = from_config(f"maxtext:{MT}/base.yml,{MT}/models/llama2-7b.yml", "--devices 256 --backend tpu-v5p")
    # base.yml: per_device_batch_size 12 on 256 chips, fsdp over all of them
    same(got, by_hand("llama2-7b", f"--devices 256 --micro-batch 12 --global-batch 3072 --seq-len 2048 {_TPU}"))


def test_maxtext_context_parallel_strategies_are_echosims_cp_comm() -> None:
    """context_parallel_strategy (base.yml: all_gather) as --cp-comm: ring is the ring (p2p), ulysses the head
    exchange (a2a), usp the hierarchical a2a+p2p: Ulysses over context_usp_ulysses inside the ring over context (it
    was refused; before that, every strategy was read as the ring)."""
    base = f"maxtext:{MT}/base.yml,{MT}/models/llama2-7b.yml,ici_context_parallelism=2"
    flags = "--devices 256 --backend tpu-v5p"
    assert (from_config(base, flags)[1].cp, from_config(base, flags)[1].cp_comm) == (2, "all_gather")
    for strategy, comm in (("all_gather", "all_gather"), ("ring", "p2p"), ("ulysses", "a2a")):
        assert from_config(f"{base},context_parallel_strategy={strategy}", flags)[1].cp_comm == comm
    usp = from_config(f"{base},context_parallel_strategy=usp,ici_context_usp_ulysses_parallelism=4", flags)[1]
    assert (usp.cp, usp.cp_comm, usp.cp_a2a) == (8, "a2a+p2p", 4)
    for bad in ("context_parallel_strategy=usp", "ici_context_usp_ulysses_parallelism=4",
                "context_parallel_strategy=usp,ici_context_usp_ulysses_parallelism=4,hardware=gpu"):  # fmt: skip
        with pytest.raises(ConfigError, match="usp"):
            from_config(f"{base},{bad}", flags)
    # the framework's own default, for a layout given as flags
    assert by_hand("llama2-7b", f"--devices 256 --cp 2 {_TPU}")[1].cp_comm == "all_gather"


def test_a_maxtext_search_runs_context_parallelism_as_maxtext_does() -> None:
    """search --framework maxtext without --cp-comm costs its cp layouts all-gathering K/V, as compile does."""
    args = ["search", "llama3-8b", "--framework", "maxtext", "--backend", "tpu-v5p", "--devices", "2", "--seq-len",
            "8192", "--global-batch", "2", "--space", "cp=2", "--space", "tp=1", "--space", "pp=1", "--micro-batches",
            "1", "--recompute", "full", "--json"]  # fmt: skip

    def best(*more: str) -> float:
        result = CliRunner().invoke(cli, [*args, *more])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)["best"][0]["step_time_s"]

    assert best() == best("--cp-comm", "all_gather") != best("--cp-comm", "p2p")


def test_maxtext_gpt3_175b_with_an_override() -> None:
    got = from_config(f"maxtext:{MT}/base.yml,{MT}/models/gpt3-175b.yml,per_device_batch_size=2",
                      "--devices 512 --backend tpu-v5p")  # fmt: skip
    model = ArchConfig("gpt", 96, 12288, 96, 50304, ffn=49152, head_dim=128, seq_len=2048, dropout=0.0,
                       tied_embeddings=True)  # fmt: skip
    want = by_hand(ConfigModel(model, "x"), f"--devices 512 --micro-batch 2 --global-batch 1024 --seq-len 2048 {_TPU}")
    same(got, (model, want[1], want[2]))


def test_maxtext_quantization_int8_runs_integer_gemms() -> None:
    got = from_config(f"maxtext:{MT}/base.yml,{MT}/models/gpt3-175b.yml,quantization=int8",
                      "--devices 512 --backend tpu-v5p")  # fmt: skip
    assert got[1].dtype == "int8"
    with pytest.raises(ConfigError, match="quantization 'int4w' is not modelled"):
        from_config(f"maxtext:{MT}/base.yml,{MT}/models/gpt3-175b.yml,quantization=int4w", "--devices 512")


def test_maxtext_remat_policies_echosim_names_keep_their_tensors() -> None:
    """A named MaxText policy is the policy (echosim.passes.recompute.POLICIES), not Megatron's selective."""
    for policy in ("save_qkv_proj", "save_dot_except_mlp", "minimal"):
        got = from_config(f"maxtext:{MT}/base.yml,{MT}/models/gpt3-175b.yml,remat_policy={policy}",
                          "--devices 512 --backend tpu-v5p")  # fmt: skip
        assert got[1].recompute == policy


def test_maxtext_weight_dtype_bfloat16_selects_16_bit_state() -> None:
    fp32 = from_config(f"maxtext:{MT}/base.yml,{MT}/models/llama2-7b.yml", "--devices 256 --backend tpu-v5p")
    bf16 = from_config(f"maxtext:{MT}/base.yml,{MT}/models/llama2-7b.yml,weight_dtype=bfloat16",
                       "--devices 256 --backend tpu-v5p")  # fmt: skip
    assert fp32[1].framework == "maxtext" and bf16[1].framework == "maxtext-bf16-weights"


def test_maxtext_mu_dtype_keeps_adams_first_moment_in_it() -> None:
    """mu_dtype=bfloat16 (MaxText's performance guide runs DeepSeek-V3 with it) keeps optax's first moment in bf16 over
    fp32 weights: 2 bytes a parameter fewer; unset or equal to weight_dtype it changes nothing."""
    base = f"maxtext:{MT}/base.yml,{MT}/models/llama2-7b.yml"
    flags = "--devices 256 --backend tpu-v5p"
    plain, mu = from_config(base, flags), from_config(f"{base},mu_dtype=bfloat16", flags)
    assert mu[1].optimizer_dtypes == "exp_avg=bf16" and not plain[1].optimizer_dtypes
    assert not from_config(f"{base},mu_dtype=float32", flags)[1].optimizer_dtypes
    from echosim.compiler import compile as compile_model

    a, b = compile_model(*plain).memory[0], compile_model(*mu).memory[0]
    assert a["optimizer"] * 6 == pytest.approx(b["optimizer"] * 8, abs=8)  # 4 + 2 bytes where it was 4 + 4
    with pytest.raises(ConfigError, match="mu_dtype 'int8' \\(bfloat16, float16, float32\\)"):
        from_config(f"{base},mu_dtype=int8", flags)


def test_maxtext_mixtral_with_expert_parallelism() -> None:
    got = from_config(f"maxtext:{MT}/base.yml {MT}/models/mixtral-8x7b.yml per_device_batch_size=2 "
                      "ici_expert_parallelism=8", "--devices 256 --backend tpu-v5p")  # fmt: skip
    same(got, by_hand("mixtral-8x7b", f"--devices 256 --ep 8 --micro-batch 2 --global-batch 512 --seq-len 2048 {_TPU}"))


def test_maxtext_capacity_factor_counts_only_on_the_dense_path() -> None:
    """capacity_factor reaches MaxText's dense_matmul only (padded experts, einsum dispatch); the sparse path is
    dropless whatever it says."""
    base = f"maxtext:{MT}/base.yml {MT}/models/mixtral-8x7b.yml per_device_batch_size=2 ici_expert_parallelism=8"
    dense = from_config(f"{base} capacity_factor=1.25 sparse_matmul=false", "--devices 256 --backend tpu-v5p")
    sparse = from_config(f"{base} capacity_factor=1.25", "--devices 256 --backend tpu-v5p")
    assert dense[1].moe_capacity_factor == 1.25 and sparse[1].moe_capacity_factor == 0.0


def test_maxtext_model_name_loads_the_model_config_and_overrides_apply() -> None:
    got = from_config(f"maxtext:{MT}/base.yml model_name=llama2-7b per_device_batch_size=4 ici_tensor_parallelism=4",
                      "--devices 256 --backend tpu-v5p")  # fmt: skip
    # a replica is 4 chips (tp): 4 sequences per chip x 4 chips; global 4 x 256
    same(got, by_hand("llama2-7b", f"--devices 256 --tp 4 --micro-batch 16 --global-batch 1024 --seq-len 2048 {_TPU}"))


def test_maxtext_tpu_needs_a_backend() -> None:
    with pytest.raises(ConfigError, match=r"hardware: 'tpu'.*--backend"):
        resolve(read_source(f"maxtext:{MT}/base.yml,{MT}/models/llama2-7b.yml"), {"devices": 8}, None)


# ---- DeepSpeed --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "hand"),
    [
        ("ds_zero2_config", "--micro-batch 1 --global-batch 16 --dtype fp16 --zero 2"),
        ("ds_zero_stage_3_config", "--micro-batch 8 --global-batch 128 --dtype fp16 --zero 3"),
        ("ds_zero2_cpu_offload_config", "--micro-batch 1 --global-batch 16 --dtype fp16 --zero 2 --offload-optimizer"),
    ],
)
def test_deepspeed_configs(name: str, hand: str) -> None:
    got = from_config(f"deepspeed:{DS}/{name}.json", "--devices 16", model="gpt3-1.3b")
    same(got, by_hand("gpt3-1.3b", f"--devices 16 {hand} --framework deepspeed"))


def test_deepspeed_offload_is_read() -> None:
    cfg = read_source(f"deepspeed:{DS}/ds_zero2_cpu_offload_config.json")
    assert cfg.options["offload_optimizer"] is True
    assert not [n for n in cfg.notes if "offload" in n]


def test_deepspeed_batch_left_to_the_hf_trainer_is_given_beside_it() -> None:
    got = from_config(f"deepspeed:{DS}/ds_config_fp16_z2.json", "--devices 8 --micro-batch 4", model="gpt3-125m")
    same(got, by_hand("gpt3-125m", "--devices 8 --micro-batch 4 --global-batch 32 --dtype fp16 --zero 2 "
                                   "--framework deepspeed"))  # fmt: skip


def test_deepspeed_needs_the_model_it_trains() -> None:
    with pytest.raises(ConfigError, match="names no model"):
        resolve(read_source(f"deepspeed:{DS}/ds_zero2_config.json"), {"devices": 16}, None)


# ---- what the user sees, and bad input ----------------------------------------------------------------------------


def test_the_resolved_layout_unknown_and_ignored_keys_are_printed(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 2 --hidden-size 256 "
                      "--num-attention-heads 4 --seq-length 128 --vocab-size 1000 --micro-batch-size 2 "
                      "--frobnicate 3 --lr 1e-4 --seed 7\n")  # fmt: skip
    result = CliRunner().invoke(cli, ["compile", "--from", f"megatron:{script}", "--verbose", "--json"])
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)  # stdout stays one JSON document
    assert "--dp 8 --micro-batch 2" in result.stderr
    assert "not understood (not simulated): --frobnicate" in result.stderr
    assert "ignored (no effect on step time or memory): --lr, --seed" in result.stderr
    quiet = CliRunner().invoke(cli, ["compile", "--from", f"megatron:{script}", "--json"])
    assert "ignored" not in quiet.stderr and "--frobnicate" in quiet.stderr


def _one_line_error(args: list[str]) -> str:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


def test_bad_input_is_one_line_naming_the_file_and_the_key(tmp_path: Path) -> None:
    not_megatron = tmp_path / "train.sh"
    not_megatron.write_text("#!/bin/bash\nset -e\npython train.py --lr 3e-4 --epochs 3\n")
    line = _one_line_error(["compile", "--from", f"megatron:{not_megatron}"])
    assert str(not_megatron) in line and "not a Megatron launch line" in line and "--num-layers" in line
    prose = tmp_path / "notes.txt"
    prose.write_text("This is not a launch script. It's prose.\n")
    line = _one_line_error(["compile", "--from", f"megatron:{prose}"])
    assert str(prose) in line and "not a Megatron launch script" in line

    typo = f"maxtext:{MT}/base.yml,{MT}/models/llama2-7b.yml,per_device_batch_sise=4"
    line = _one_line_error(["compile", "--from", typo, "--devices", "8", "--backend", "tpu-v5p"])
    assert "base.yml" in line and "unknown MaxText key 'per_device_batch_sise'" in line
    model = tmp_path / "model.yml"
    model.write_text("base_emb_dim: 1024\nbase_num_layers: 4\n")
    line = _one_line_error(["compile", "--from", f"maxtext:{MT}/base.yml,{model}", "--devices", "8"])
    assert str(model) in line and "'base_num_layers'" in line

    no_batch = tmp_path / "ds.json"
    no_batch.write_text('{"zero_optimization": {"stage": 1}, "bf16": {"enabled": true}}')
    line = _one_line_error(["compile", "gpt3-125m", "--from", f"deepspeed:{no_batch}", "--devices", "8"])
    assert str(no_batch) in line and "no batch size" in line and "train_batch_size" in line
    line = _one_line_error(["compile", "gpt3-125m", "--from", f"deepspeed:{DS}/ds_config_fp16_z2.json"])
    assert "ds_config_fp16_z2.json" in line and "train_micro_batch_size_per_gpu = 'auto'" in line


def test_unknown_framework_and_both_sources_are_one_line() -> None:
    assert "FRAMEWORK:FILE" in _one_line_error(["compile", "--from", "jax:x.yml"])
    line = _one_line_error(["compile", "--from", f"megatron:{MEG}/train_gpt3_175b_distributed.sh",
                            "--from-args", "--num-layers 2"])  # fmt: skip
    assert "give one" in line


def test_check_entries_may_name_a_framework_config(tmp_path: Path) -> None:
    config = tmp_path / "pyproject.toml"
    config.write_text(
        "[[tool.echosim.check]]\n"
        f'from = "deepspeed:{DS}/ds_zero2_config.json"\n'
        'model = "gpt3-125m"\ndevices = 16\nmax_memory_gib = 1\n'
    )
    result = CliRunner().invoke(cli, ["check", "--config", str(config), "--json"])
    assert result.exit_code == 3  # the 1 GiB budget is broken (exit 3: ran, a requirement does not hold)
    [outcome] = json.loads(result.stdout)
    assert outcome["model"] == "gpt3-125m" and any("memory" in f for f in outcome["failures"])


# ---- NeMo (NeMo-Framework-Launcher training YAML) ---------------------------------------------------------------

NEMO = DATA / "nemo"


def test_nemo_gpt3_175b() -> None:
    got = from_config(f"nemo:{NEMO}/gpt3_175b.yaml")
    # GPT-2 BPE (50,257) padded to a multiple of 128 x TP 4: 50,688; ffn ${multiply:4, ${.hidden_size}}
    model = ArchConfig("gpt", 96, 12288, 96, 50688, ffn=49152, seq_len=2048, dropout=0.1, tied_embeddings=True)
    want = by_hand(
        ConfigModel(model, "x"),
        "--devices 1024 --tp 4 --pp 8 --vpp 12 --schedule interleaved --micro-batch 1 --global-batch 2048 "
        "--seq-len 2048 --dtype bf16 --recompute selective --sp --zero 1 --tp-overlap --framework nemo "
        "--grad-dtype fp32",
    )
    same(got, (model, want[1], want[2]))


def test_nemo_gpt3_5b() -> None:
    got = from_config(f"nemo:{NEMO}/gpt3_5b.yaml")
    model = ArchConfig("gpt", 24, 4096, 32, 50304, seq_len=2048, dropout=0.1, tied_embeddings=True)
    want = by_hand(
        ConfigModel(model, "x"),
        "--devices 128 --micro-batch 4 --global-batch 2048 --seq-len 2048 --dtype bf16 --zero 1 --framework nemo "
        "--grad-dtype fp32",
    )
    same(got, (model, want[1], want[2]))


def test_nemo_llama2_7b_with_the_model_named() -> None:
    with pytest.raises(ConfigError, match="padded_vocab_size, or name the MODEL"):
        from_config(f"nemo:{NEMO}/llama2_7b.yaml")  # a SentencePiece file holds the vocabulary size
    got = from_config(f"nemo:{NEMO}/llama2_7b.yaml", model="llama2-7b")
    same(got, by_hand("llama2-7b", "--devices 128 --micro-batch 1 --global-batch 2048 --seq-len 4096 --dtype bf16 "
                                   "--zero 1 --attention flash --framework nemo --grad-dtype fp32"))  # fmt: skip


def test_nemo_reports_in_its_own_names(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(
        "trainer: {num_nodes: 1, devices: 8, precision: 32}\n"
        "model: {num_layers: 2, hidden_size: 256, num_attention_heads: 4, encoder_seq_length: 128,\n"
        "        padded_vocab_size: 1024, micro_batch_size: 1, masked_softmax_fusion: true, frobnicate: 3,\n"
        "        seed: 1234, data: {seq_length: 128}}\n"
    )
    cfg = read_source(f"nemo:{config}")
    assert cfg.unknown == ["model.frobnicate"]
    assert "model.seed" in cfg.ignored and "model.data.seq_length" in cfg.ignored
    assert "not modelled: masked_softmax_fusion" in cfg.notes
    assert any(n.startswith("trainer.precision 32") for n in cfg.notes)
    assert any(n.startswith("model.optim.overlap_grad_sync not given") for n in cfg.notes)


def test_a_published_row_as_a_maxtext_config_predicts_the_rows_step_time() -> None:
    from echosim.compiler import compile as compile_model
    from echosim.validation.cases import read_cases
    from echosim.validation.run import validate_row

    case_id = "dgxc2504-llama-3-70b-bf16-h100-sxm-128"
    [case] = [c for c in read_cases(_cases_csv()) if c.case_id == case_id]
    row = validate_row(case)
    assert row.predicted_step_time_s is not None
    model, plan, cluster = from_config(
        f"maxtext:{MT}/base.yml,{MT}/dgxc2504_llama3_70b_bf16_h100_128.yml", "--devices 128 --backend h100-sxm"
    )
    assert model == "llama3-70b" and (plan.micro_batch, plan.global_batch, plan.zero) == (2, 256, 3)
    assert compile_model(model, plan, cluster).step_time_s == pytest.approx(row.predicted_step_time_s, rel=1e-12)


def test_megatron_expert_tensor_parallel_size_reads_as_etp() -> None:
    """--expert-tensor-parallel-size is the experts' own tensor-parallel degree (Megatron's MoE parallel folding)."""
    args = ("--num-layers 2 --hidden-size 256 --num-attention-heads 2 --num-experts 8 --moe-router-topk 2 "
            "--tensor-model-parallel-size 2 --sequence-parallel --expert-model-parallel-size 8 "
            "--expert-tensor-parallel-size 1 --micro-batch-size 1")  # fmt: skip
    got = read_args(args)
    assert (got.options["tp"], got.options["ep"], got.options["etp"]) == (2, 8, 1)
    assert not any("expert-tensor-parallel-size" in n for n in got.notes)
    assert "moe_ep_overlap" not in got.options
    assert read_args(f"{args} --overlap-moe-expert-parallel-comm").options["moe_ep_overlap"] is True


def test_megatron_flex_dispatcher_with_deepep_reads_as_deepep() -> None:
    """TransformerConfig's flex dispatcher defaults to the deepep backend; --moe-enable-deepep sets it;
    alltoall stays NCCL's all_to_all; the hybridep backend reads as HybridEP (no fp8 padding copies)."""
    moe = "--num-layers 2 --hidden-size 256 --num-attention-heads 2 --num-experts 4 --moe-router-topk 2 --ep 1"
    base = moe.replace(" --ep 1", " --expert-model-parallel-size 2 --micro-batch-size 1 --global-batch-size 2")
    for extra, want in (
        ("--moe-token-dispatcher-type flex", "deepep"),
        ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep", "deepep"),
        ("--moe-enable-deepep", "deepep"),
        ("--moe-token-dispatcher-type alltoall", None),
        ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep", "hybridep"),
    ):
        got = read_args(f"{base} {extra}")
        assert got.options.get("moe_dispatcher") == want, extra
    hybrid = read_args(f"{base} --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep")
    assert not any("not modelled" in n for n in hybrid.notes)
    grouped = read_args(f"{base} --moe-enable-deepep --moe-router-num-groups 2 --moe-router-group-topk 1")
    assert (grouped.options["moe_router_groups"], grouped.options["moe_router_group_topk"]) == (2, 1)


_SMALL_MOE = (
    "--num-layers 4 --hidden-size 256 --num-attention-heads 4 --num-experts 8 --moe-router-topk 2 "
    "--moe-grouped-gemm --micro-batch-size 1 --global-batch-size 8 --seq-length 128 --vocab-size 1000 "
    "--swiglu --normalization RMSNorm --position-embedding-type rope --hidden-dropout 0 --attention-dropout 0"
)


def test_megatron_latent_attention_dense_first_layers_and_mtp_build_the_model() -> None:
    """--multi-latent-attention and its sizes, --moe-layer-freq's dense first layers and --mtp-num-layers: the
    ArchConfig fields DeepSeek-V3 uses (Megatron's defaults for the sizes a line leaves out)."""
    got = read_args(f"{_SMALL_MOE} --multi-latent-attention --q-lora-rank 64 --kv-lora-rank 32 --qk-head-dim 32 "
                    "--qk-pos-emb-head-dim 16 --v-head-dim 32 --qk-layernorm --moe-layer-freq ([0]*1+[1]*3) "
                    "--mtp-num-layers 1")  # fmt: skip
    cfg = got.model.config  # type: ignore[union-attr]
    assert (cfg.kv_lora_rank, cfg.q_lora_rank, cfg.head_dim, cfg.rope_head_dim, cfg.v_head_dim) == (32, 64, 48, 16, 32)
    assert (cfg.dense_layers, cfg.moe_layer_step, cfg.mtp_layers) == (1, 1, 1)
    assert not got.unknown and not any("qk-layernorm" in n for n in got.notes)  # MLA's latent norms are built
    defaults = read_args(f"{_SMALL_MOE} --multi-latent-attention").model.config  # type: ignore[union-attr]
    assert (defaults.kv_lora_rank, defaults.q_lora_rank, defaults.head_dim, defaults.v_head_dim) == (32, 0, 192, 128)
    step = read_args(f"{_SMALL_MOE} --moe-layer-freq ([0]+[1])*2").model.config  # type: ignore[union-attr]
    assert (step.dense_layers, step.moe_layer_step) == (0, 2)
    every = read_args(f"{_SMALL_MOE} --moe-layer-freq 2")  # Megatron's layers 0 and 2, echosim's 1 and 3
    assert every.model.config.moe_layer_step == 2  # type: ignore[union-attr]
    assert any("Megatron's MoE layers are 0, 2, 4" in n for n in every.notes)
    plain = read_args(_SMALL_MOE.replace(" --moe-grouped-gemm", ""))
    assert any("SequentialMLP" in n for n in plain.notes)


def test_megatron_layout_recompute_modules_and_fp8_recipe_reach_the_plan() -> None:
    """--pipeline-model-parallel-layout sets the stages (vpp = stages / pp), --recompute-modules the selective
    policy (modules echosim does not model are noted), --fp8-recipe mxfp8 the block-scaled format."""
    got = read_args(f"{_SMALL_MOE} --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout Et|t|t|tL "
                    "--recompute-granularity selective --recompute-modules moe_act mlp mhc --fp8-format e4m3 "
                    "--fp8-recipe mxfp8")  # fmt: skip
    opts = got.options
    assert (opts["vpp"], opts["schedule"], opts["pp_balance"]) == (2, "interleaved", "layout:Et|t|t|tL")
    assert (opts["recompute"], opts["dtype"]) == ("selective:moe_act,mlp", "mxfp8")
    assert any("--recompute-modules mhc: not modelled" in n for n in got.notes)
    assert read_args(f"{_SMALL_MOE} --fp8-format e4m3").options["dtype"] == "fp8"  # 'delayed', one scale a tensor
    only_other = read_args(f"{_SMALL_MOE} --recompute-granularity selective --recompute-modules mhc")
    assert only_other.options["recompute"] == "none"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("--moe-layer-freq [0,2]*2", "sums and repeats of [0/1, ...] lists"),
        ("--moe-layer-freq [0]*3", "has 3 layers, --num-layers 4"),
        ("--moe-layer-freq [1,0,0,1]", "dense layers first, then MoE layers, or a MoE layer every step-th layer"),
        ("--moe-layer-freq [1]*999999999999", "sums and repeats of [0/1, ...] lists"),  # refused, never expanded
        ("--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout Et|t|ttL", "not a multiple"),
        ("--pipeline-model-parallel-layout Et|tX|ttL", "unknown character"),
        ("--pipeline-model-parallel-layout Etttt|L --num-virtual-stages-per-pipeline-rank 2", "both set"),
        ("--recompute-granularity selective --recompute-modules up_proj", "'up_proj' is not a Megatron-Core module"),
        ("--fp8-format e4m3 --fp8-recipe perchannel", "--fp8-recipe 'perchannel'"),
    ],
)
def test_megatron_bad_layouts_and_patterns_are_one_line(extra: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        resolve(read_args(f"{_SMALL_MOE} {extra}"), {}, None)  # a model error is raised when no MODEL is named


def test_the_deepseek_v3_gb200_guides_command_line_is_the_zoo_model_and_its_check_row() -> None:
    """The published launch arguments of Megatron-Core's DeepSeek-V3 GB200 run read as the zoo's deepseek-v3 with the
    run's layout, and predict what the same run written as a row does (benchmarks/mcore_dsv3_gb200.csv): the row
    takes the 3 dense layers from rows.DENSE_FIRST_LAYERS, its recompute modules and dispatcher from its notes."""
    from echosim.compiler import compile as compile_model
    from echosim.validation.run import validate_row

    source = f"megatron:{MEG}/mcore_dsv3_gb200_guide.args"
    model, plan, cluster = from_config(source, "--backend gb200 --devices 256 --devices-per-node 32", "deepseek-v3")
    assert (plan.tp, plan.pp, plan.vpp, plan.ep, plan.dp, plan.zero) == (1, 8, 4, 32, 32, 1)
    assert (plan.dtype, plan.recompute, plan.moe_dispatcher) == ("mxfp8", "selective:moe_act,mlp", "hybridep")
    assert plan.pp_balance == "layout:Et|(tt|)*30L" and plan.framework == "megatron-ce-te"
    assert getattr(model, "name", model) == "deepseek-v3"
    row = validate_row(read_cases(ROOT / "benchmarks" / "data" / "mcore_dsv3_gb200.csv")[0])
    assert row.predicted_step_time_s is not None
    step = compile_model(model, plan, cluster).step_time_s
    assert step == pytest.approx(row.predicted_step_time_s, rel=1e-9)


def test_maxtext_fused_splash_backward_selects_its_framework_entry() -> None:
    """sa_use_fused_bwd_kernel: True (the Trillium Llama recipes) runs splash attention's one-kernel backward."""
    base = f"maxtext:{MT}/base.yml,{MT}/models/llama2-7b.yml"
    plain = from_config(base, "--devices 256 --backend tpu-v6e")
    fused = from_config(f"{base},sa_use_fused_bwd_kernel=true", "--devices 256 --backend tpu-v6e")
    both = from_config(f"{base},sa_use_fused_bwd_kernel=true,weight_dtype=bfloat16", "--devices 256 --backend tpu-v6e")
    assert (plain[1].framework, fused[1].framework) == ("maxtext", "maxtext-splash-fused")
    assert both[1].framework == "maxtext-bf16-weights-splash-fused"


def test_maxtext_splash_blocks_reach_the_plan() -> None:
    """sa_block_* (a recipe's splash attention blocks) become Plan.splash_blocks in sa_block_q ... sa_block_kv_dq
    order; base.yml's 512s state none; --splash-blocks writes and reads them back; a wrong count is refused."""
    from echosim.commands.options import parse_layout_flags
    from echosim.compiler import compile as compile_model
    from echosim.errors import EchosimError
    from echosim.plan import Cluster, Plan, plan_flags

    base = f"maxtext:{MT}/base.yml,{MT}/models/llama2-7b.yml"
    tpu = "--devices 256 --backend tpu-v6e"
    plain = from_config(base, tpu)
    gpt3 = from_config(f"{base},sa_block_q=1024,sa_block_q_dkv=2048,sa_block_q_dq=2048", tpu)
    assert plain[1].splash_blocks == ()
    assert gpt3[1].splash_blocks == (1024, 512, 2048, 512, 2048, 512)
    plan, cluster = Plan(dp=8, splash_blocks=(2048,) * 6), Cluster(devices=8)
    flags = plan_flags(plan, cluster)
    assert flags[-2:] == ["--splash-blocks", "2048,2048,2048,2048,2048,2048"]
    assert parse_layout_flags("llama3-8b", " ".join(flags), "--a") == ("llama3-8b", plan, cluster)
    with pytest.raises(EchosimError, match="--splash-blocks takes six sizes"):
        compile_model("llama3-8b", Plan(dp=8, splash_blocks=(2048, 2048)), Cluster("tpu-v6e", 8, 8))


def test_check_entry_takes_splash_blocks_as_a_list() -> None:
    """``echosim check``'s TOML list of six sizes reaches the plan (splash blocks of 2048 compute more of the causal
    mask than 512: a slower step)."""
    from echosim.check import run_check

    entry = {"model": "llama3-8b", "backend": "tpu-v6e", "devices": 8, "zero": 3, "framework": "maxtext"}
    plain = run_check(entry, {}, 0)
    blocks = run_check({**entry, "splash_blocks": [2048] * 6}, {}, 0)
    assert blocks.step_time_s > plain.step_time_s


def test_launch_script_conditions_compare_integers_and_patterns(tmp_path: Path) -> None:
    """``[[ $N -gt 1 ]]`` compares integers (an unset variable is 0, as ``[[ ]]`` takes it), ``[[ $A == *x* ]]``
    matches a pattern against the whole expansion, and ``$?`` is 0: the commands before it are taken to succeed."""
    script = tmp_path / "train.sh"
    script.write_text(
        "which srun\nBATCH=$((1-$?))\nMODEL_ARGS=(--num-layers 2 --hidden-size 256 --num-attention-heads 2)\n"
        "TP=1\nif [[ $BATCH -eq 1 ]] && [[ $UNSET -lt 1 ]]; then\n  TP=2\nfi\n"
        'if [[ ${MODEL_ARGS[@]} == *"hidden-size 256"* ]]; then\n  PP=2\nelse\n  PP=1\nfi\n'
        "torchrun --nproc_per_node 8 pretrain_gpt.py ${MODEL_ARGS[@]} --tensor-model-parallel-size $TP "
        "--pipeline-model-parallel-size $PP --micro-batch-size 1 --vocab-size 1000\n"
    )
    got = read_source(f"megatron:{script}")
    assert (got.options["tp"], got.options["pp"]) == (2, 2)
    script.write_text("if [[ 1 -eq x ]]; then\n  A=1\nfi\npython train.py --num-layers 2\n")
    with pytest.raises(ConfigError, match="cannot evaluate the condition"):
        read_source(f"megatron:{script}")


# ---- Megatron-Bridge ----------------------------------------------------------------------------------------------


def test_a_megatron_bridge_config_is_the_run_its_megatron_arguments_are() -> None:
    """The DeepSeek-V3 GB200 guide's run as a ConfigContainer YAML reads as the same model and layout as its launch
    line (megatron/mcore_dsv3_gb200_guide.args); only the framework entry differs (Megatron-Bridge's), and the step
    is the same."""
    from echosim.compiler import compile as compile_model

    flags = "--backend gb200 --devices 256 --devices-per-node 32"
    bridge = from_config(f"mbridge:{DATA}/mbridge/dsv3_gb200_guide.yaml", flags)
    megatron = from_config(f"megatron:{MEG}/mcore_dsv3_gb200_guide.args", flags, "deepseek-v3")
    assert getattr(bridge[0], "name", bridge[0]) == "deepseek-v3"  # the zoo entry its sizes are
    assert replace(bridge[1], framework="x", tp_overlap=False, grad_dtype="") == replace(megatron[1], framework="x")
    assert bridge[1].framework == "megatron-bridge" and bridge[2] == megatron[2]
    # its recipe name resolves to bf16_with_mxfp8_mixed(), whose grad_reduce_in_fp32=True overrides the DDP config:
    # fp32 gradients, as the launch line's bf16 default (the framework entry alone would count 16-bit ones)
    assert bridge[1].grad_dtype == "fp32" and megatron[1].grad_dtype == ""
    assert compile_model(*bridge).step_time_s == pytest.approx(compile_model(*megatron).step_time_s, rel=1e-9)
    got = read_source(f"mbridge:{DATA}/mbridge/dsv3_gb200_guide.yaml")
    assert not got.unknown and "model.init_method_std" in got.ignored
    assert got.options["recompute"] == "selective:moe_act,mlp" and not any("recompute" in n for n in got.notes)


def test_megatron_bridge_and_nemo_block_recompute_is_full_n(tmp_path: Path) -> None:
    """Megatron-Bridge's ``recompute_method: block`` / ``recompute_num_layers`` (its H100 Llama-3 8B FP8 preset
    sets 5: perf_recipes/llama/h100/llama3.py, commit 067f987) and NeMo's ``activations_checkpoint_*`` are
    Megatron's flags: full:N (uniform: full:uniform-N)."""
    bridge = tmp_path / "run_config.yaml"
    bridge.write_text(
        "model:\n  num_layers: 4\n  hidden_size: 256\n  num_attention_heads: 4\n  seq_length: 128\n"
        "  vocab_size: 1000\n  recompute_granularity: full\n  recompute_method: block\n"
        "  recompute_num_layers: 5\ntrain:\n  global_batch_size: 8\n  micro_batch_size: 1\n"
    )
    assert read_source(f"mbridge:{bridge}").options["recompute"] == "full:5"
    bridge.write_text(bridge.read_text().replace("recompute_method: block", "recompute_method: uniform"))
    assert read_source(f"mbridge:{bridge}").options["recompute"] == "full:uniform-5"
    nemo = tmp_path / "nemo.yaml"
    text = (NEMO / "gpt3_5b.yaml").read_text()
    old = "  activations_checkpoint_granularity: null\n"
    assert old in text
    nemo.write_text(
        text.replace(
            old,
            "  activations_checkpoint_granularity: full\n"
            "  activations_checkpoint_method: block\n  activations_checkpoint_num_layers: 2\n",
        )
    )
    assert read_source(f"nemo:{nemo}").options["recompute"] == "full:2"
    nemo.write_text(
        nemo.read_text().replace("activations_checkpoint_method: block", "activations_checkpoint_method: uniform")
    )
    assert read_source(f"nemo:{nemo}").options["recompute"] == "full:uniform-2"


def test_megatron_bridge_precision_sections_and_unknown_keys(tmp_path: Path) -> None:
    """mixed_precision as a recipe name or as its fields; an unknown recipe, a file with no model section and a key
    echosim does not read are reported under the YAML's names."""
    base = ("model:\n  num_layers: 2\n  hidden_size: 256\n  num_attention_heads: 4\n  seq_length: 128\n"
            "  vocab_size: 1000\n  tensor_model_parallel_size: 2\ntrain:\n  global_batch_size: 8\n"
            "  micro_batch_size: 1\n")  # fmt: skip
    path = tmp_path / "run_config.yaml"
    for precision, dtype in (("bf16_with_mxfp8_mixed", "mxfp8"), ("bf16-with-fp8-current-scaling-mixed", "fp8"),
                             ("bf16_with_nvfp4_mixed", "nvfp4"), ("bf16_mixed", "bf16"),
                             ("\n  bf16: true\n  fp8: e4m3\n  fp8_recipe: mxfp8", "mxfp8")):  # fmt: skip
        path.write_text(f"{base}mixed_precision: {precision}\n")
        assert read_source(f"mbridge:{path}").options["dtype"] == dtype, precision
    path.write_text(f"{base}mixed_precision: bf16_with_fp9_mixed\n")
    with pytest.raises(ConfigError, match="mixed_precision 'bf16_with_fp9_mixed' is not a recipe"):
        read_source(f"mbridge:{path}")
    path.write_text(f"{base}mixed_precision: 5\n")
    with pytest.raises(ConfigError, match="mixed_precision 5: a recipe name or its fields"):
        read_source(f"mbridge:{path}")
    path.write_text(
        f"{base}mixed_precision: bf16_with_mxfp8_mixed\n".replace(
            "  num_layers: 2\n", "  num_layers: 2\n  fp8_recipe: [1, 2]\n"
        )
    )
    with pytest.raises(ConfigError, match=re.escape("model.fp8_recipe takes one value")):  # the YAML's name
        read_source(f"mbridge:{path}")
    path.write_text("train:\n  global_batch_size: 8\n")
    with pytest.raises(ConfigError, match="no model: section"):
        read_source(f"mbridge:{path}")
    path.write_text(
        base.replace("model:\n", "model:\n  moe_router_pre_softmax: true\n  heterogeneous_block_specs: true\n")
    )
    got = read_source(f"mbridge:{path}")
    assert got.unknown == ["model.heterogeneous_block_specs"] and got.needs_devices
    assert (got.options["tp"], got.options["global_batch"], got.options["micro_batch"]) == (2, 8, 1)


def test_a_nemo_value_the_megatron_reader_refuses_is_named_as_the_yaml_names_it(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("model:\n  num_layers: 2\n  hidden_size: 256\n  num_attention_heads: 4\n"
                    "  encoder_seq_length: 128\n  activations_checkpoint_granularity: partial\n")  # fmt: skip
    with pytest.raises(ConfigError, match=re.escape("model.activations_checkpoint_granularity 'partial'")):
        read_source(f"nemo:{path}")


def test_a_line_that_runs_the_program_wins_over_a_command_kept_in_a_string(tmp_path: Path) -> None:
    """A string holding a .py command is the training command only where no line runs one: a helper assigned after
    the launch line (a preprocessing command for later) does not replace it."""
    script = tmp_path / "train.sh"
    script.write_text(
        "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 2 --hidden-size 256 --num-attention-heads 4 "
        "--tensor-model-parallel-size 2 --micro-batch-size 1 --vocab-size 1000 --seq-length 128\n"
        'PREP="python tools/preprocess_data.py --input corpus.json"\n'
    )
    got = read_source(f"megatron:{script}")
    assert got.options["tp"] == 2 and got.options["devices"] == 8


_EIGHT = ("--num-layers 8 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
          "--micro-batch-size 1 --global-batch-size 8 --bf16 --pipeline-model-parallel-size 4 "
          "--vocab-size 1000")  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "layout"),
    [
        ("--decoder-first-pipeline-num-layers 1 --decoder-last-pipeline-num-layers 1", "Et|ttt|ttt|tL"),
        ("--decoder-first-pipeline-num-layers 2", "Ett|tt|tt|ttL"),
        ("--num-layers 6 --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split",
         "Et|tt|tt|tL"),
        ("--num-layers 14 --virtual-pipeline-model-parallel-size 2 --account-for-embedding-in-pipeline-split "
         "--account-for-loss-in-pipeline-split", "Et|tt|tt|tt|tt|tt|tt|tL"),
        ("--decoder-last-pipeline-num-layers 2 --virtual-pipeline-model-parallel-size 2",
         "Et|t|t|t|t|t|t|tL"),
    ],
)  # fmt: skip
def test_megatron_uneven_pipeline_flags_are_the_layout_they_amount_to(flags: str, layout: str) -> None:
    """--decoder-first/last-pipeline-num-layers and --account-for-embedding/loss-in-pipeline-split split the layers
    as Megatron-Core's get_num_layers_to_build does: a rank's layers evenly over its virtual stages, v * pp + r."""
    got = read_args(f"{_EIGHT} {flags}")
    assert got.options["pp_balance"] == f"layout:{layout}" and not got.unknown


def test_megatron_uneven_pipeline_reaches_the_stages_and_refuses_what_megatron_refuses(tmp_path: Path) -> None:
    args = tmp_path / "run.args"
    args.write_text(f"{_EIGHT} --decoder-first-pipeline-num-layers 1 --decoder-last-pipeline-num-layers 1\n")
    model, plan, cluster = from_config(f"megatron:{args}", "--devices 4")
    from echosim.compiler import lower

    assert [row["layers"] for row in lower(model, plan, cluster).report.memory] == [1, 3, 3, 1]
    for flags, message in (
        ("--decoder-first-pipeline-num-layers 3", "the 5 of --num-layers 8 left for 3 pipeline ranks"),
        ("--decoder-first-pipeline-num-layers 1 --account-for-loss-in-pipeline-split", "cannot be set together"),
        ("--pipeline-model-parallel-layout Et|tt|ttt|ttL --decoder-last-pipeline-num-layers 2", "both set the"),
        ("--account-for-embedding-in-pipeline-split", "plus the embedding and loss counted"),
        (
            "--decoder-first-pipeline-num-layers 1 --decoder-last-pipeline-num-layers 1 "
            "--virtual-pipeline-model-parallel-size 2",
            r"layers \(1\) do not split over 2",
        ),
    ):
        with pytest.raises(ConfigError, match=message):
            read_args(f"{_EIGHT} {flags}")
    # Megatron-Bridge's TransformerConfig names for the same settings
    path = tmp_path / "run_config.yaml"
    path.write_text("model:\n  num_layers: 8\n  hidden_size: 256\n  num_attention_heads: 4\n  seq_length: 128\n"
                    "  vocab_size: 1000\n  pipeline_model_parallel_size: 4\n  num_layers_in_last_pipeline_stage: 2\n"
                    "train:\n  global_batch_size: 8\n  micro_batch_size: 1\n")  # fmt: skip
    assert read_source(f"mbridge:{path}").options["pp_balance"] == "layout:Ett|tt|tt|ttL"


def test_maxtext_deepseek_decoder_block_builds_dense_layers_shared_experts_and_mla() -> None:
    """decoder_block: deepseek (MaxText models/deepseek3-671b.yml, deepseek2-16b.yml at e591f30): DeepSeek-V3 reads
    as the zoo's deepseek-v3 (3 dense layers, 1 shared expert, MLA with a query latent); DeepSeek-V2-Lite as its
    15.7B parameters (arXiv:2405.04434 appendix B: 15.7B in total), with 2 shared experts and no query latent."""
    v3 = read_source(f"maxtext:{MT}/base.yml,{MT}/models/deepseek3-671b.yml n_routing_groups=8 topk_routing_group=4")
    assert v3.model == "deepseek-v3" and not v3.unknown
    assert (v3.options["moe_router_groups"], v3.options["moe_router_group_topk"]) == (8, 4)
    assert "routed_score_func sigmoid: the router costed as a softmax" in v3.notes
    lite = read_source(f"maxtext:{MT}/base.yml,{MT}/models/deepseek2-16b.yml")
    cfg = lite.model.config  # type: ignore[union-attr]
    fields = (cfg.dense_layers, cfg.shared_experts, cfg.q_lora_rank, cfg.kv_lora_rank, cfg.head_dim)
    assert fields == (1, 2, 0, 512, 192)
    assert cfg.param_count() == pytest.approx(15.7e9, rel=0.005) and not any("routed_score" in n for n in lite.notes)
    with pytest.raises(ConfigError, match="attention_type 'local_sliding' with decoder_block deepseek"):
        read_source(f"maxtext:{MT}/base.yml,{MT}/models/deepseek2-16b.yml attention_type=local_sliding")
    # found by benchmarks/fuzz.py --targets maxtext-config: a number where a list belongs was a TypeError
    with pytest.raises(ConfigError, match="mlp_activations 3 is not a list of activation names"):
        read_source(f"maxtext:{MT}/base.yml,{MT}/models/deepseek2-16b.yml mlp_activations=3")


def test_a_parallel_degree_of_zero_in_a_config_is_one_line() -> None:
    """Found by benchmarks/fuzz.py --targets megatron-config (seed 61): --tensor-model-parallel-size 0 with the
    launcher's devices divided by zero."""
    got = read_args(f"{_EIGHT} --tensor-model-parallel-size 0")
    with pytest.raises(ConfigError, match="tp=0: a parallel degree is at least 1"):
        resolve(got, {"devices": 8}, "llama3-8b")


def test_megatron_partial_recompute_methods() -> None:
    """--recompute-method block recomputes only the first N layers of each stage: echosim's full:N (N = 1 by
    Megatron's default, 0 none); uniform keeps one checkpoint per chunk of N layers: full:uniform-N (N = 1 is
    full)."""
    base = f"{_EIGHT} --recompute-granularity full"
    block = read_args(f"{base} --recompute-method block --recompute-num-layers 2")
    assert block.options["recompute"] == "full:2" and not [n for n in block.notes if "recompute" in n]
    assert read_args(f"{base} --recompute-method block").options["recompute"] == "full:1"
    zero = read_args(f"{base} --recompute-method block --recompute-num-layers 0")
    assert zero.options["recompute"] == "none" and any("no layer is recomputed" in n for n in zero.notes)
    with pytest.raises(ConfigError, match="--recompute-num-layers -1: a layer count is at least 0"):
        read_args(f"{base} --recompute-method block --recompute-num-layers -1")
    with pytest.raises(ConfigError, match="--recompute-method 'blocks' \\(Megatron knows uniform, block\\)"):
        read_args(f"{base} --recompute-method blocks")
    uniform = read_args(f"{base} --recompute-method uniform --recompute-num-layers 2")
    assert uniform.options["recompute"] == "full:uniform-2" and not [n for n in uniform.notes if "recompute" in n]
    one = read_args(f"{base} --recompute-method uniform")
    assert one.options["recompute"] == "full" and not any("recompute-method" in n for n in one.notes)
    with pytest.raises(ConfigError, match="--recompute-num-layers 0: a chunk holds at least 1 layer"):
        read_args(f"{base} --recompute-method uniform --recompute-num-layers 0")
