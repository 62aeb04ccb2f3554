"""Frameworks: each default is cited, applies only to what is not given, and bad names are one line."""

from __future__ import annotations

import re
from dataclasses import fields

import pytest
from click.testing import CliRunner

from echosim.cli import cli
from echosim.frameworks import DEFAULT_FRAMEWORK, FRAMEWORKS, FrameworkError, framework_named_in, get_framework
from echosim.plan import Plan, plan_from_options, plan_with_defaults

PLAN_FIELDS = {f.name for f in fields(Plan)}


def test_every_default_is_a_plan_field_with_a_source() -> None:
    assert set(FRAMEWORKS) == {
        "eager",
        "eager-amp",
        "megatron-2022",
        "megatron",
        "megatron-ce-native",
        "megatron-ce-te",
        "nemo",
        "nemo-ce-native",
        "megatron-bridge",
        "torchtitan",
        "torchtitan-compile",
        "maxtext",
        "maxtext-bf16-weights",
        "maxtext-te",
        "maxtext-splash-fused",
        "maxtext-bf16-weights-splash-fused",
        "deepspeed",
        "torchtitan-2025",
        "torchtitan-2025-compile",
        "torchtitan-2025-compile-loss",
        "composer",
        "composer-fa1",
        "composer-triton",
        "composer-triton-pure",
        "deepspeed-2021",
        "hai-llm",
        "megascale",
        "jax-xla",
        "nemo-megatron-vit",
        "apex-ddp",
    }
    for fw in FRAMEWORKS.values():
        assert fw.version and fw.title
        for d in fw.defaults:
            assert d.field in PLAN_FIELDS, (fw.name, d.field)
            assert len(d.source) > 20, (fw.name, d.field)
            assert not d.when_above_one or d.when_above_one in PLAN_FIELDS


def test_the_default_framework_changes_nothing() -> None:
    assert Plan().framework == DEFAULT_FRAMEWORK == "eager"
    assert plan_with_defaults(Plan(), {}) == Plan()
    assert not get_framework("eager").defaults


def test_framework_defaults_fill_only_what_is_not_given() -> None:
    assert plan_with_defaults(Plan(), {"framework": "nemo", "dp": 8}).zero == 1  # distributed optimizer
    assert plan_with_defaults(Plan(), {"framework": "nemo", "dp": 8, "zero": 0}).zero == 0
    maxtext = plan_with_defaults(Plan(), {"framework": "maxtext"})
    assert (maxtext.recompute, maxtext.zero) == ("full", 3)
    assert plan_with_defaults(Plan(), {"framework": "maxtext", "recompute": "none"}).recompute == "none"


@pytest.mark.parametrize(
    ("row", "name", "kernel"),
    [
        ("torchtitan (torch 2.6 nightly 2024-12-23, torchao)", "torchtitan-2025", "fa2"),
        ("torchtitan (commit e7c0cae, torch 2.8.0a0 NGC 25.05)", "torchtitan-2025", "fa2"),
        ("torchtitan", "torchtitan", ""),  # today's torchtitan puts cuDNN attention first
        ("Composer + PyTorch FSDP (torch 1.13/2.0 era), FlashAttention", "composer", "fa2"),
        ("Megatron-Bridge / Megatron-Core", "megatron-bridge", "te"),  # Transformer Engine: cuDNN from Hopper on
        ("NeMo 24.07 (Megatron-Core, TransformerEngine)", "nemo", "te"),
        ("Megatron-LM", "megatron", "te"),
    ],
)
def test_frameworks_name_the_flash_kernel_they_call(row: str, name: str, kernel: str) -> None:
    fw = get_framework(framework_named_in(row))
    assert (fw.name, fw.attention_kernel) == (name, kernel)
    assert not kernel or len(fw.attention_source) > 40


def test_an_earlier_release_keeps_the_memory_rules_of_its_entry() -> None:
    old, new = get_framework("torchtitan-2025"), get_framework("torchtitan")
    for field in ("ce_saved", "ce_working", "fp32_weights", "selective", "pp_unsharded"):
        assert getattr(old, field) == getattr(new, field), field
    # its one extra default is a timing one: PyTorch's CP rotate method (passes.context_parallel ``torch``)
    assert [d.field for d in old.defaults if d not in new.defaults] == ["cp_comm"]
    assert [d for d in old.defaults if d.field != "cp_comm"] == list(new.defaults)


def test_nemo_overlaps_tp_communication_in_dense_recipes_only() -> None:
    """Megatron-Bridge's dense recipes that split tensors run tp_comm_overlap; its MoE recipes do not."""
    dense = plan_with_defaults(Plan(), {"framework": "nemo", "tp": 4}, "llama")
    assert dense.tp_overlap and dense.sp
    assert plan_with_defaults(Plan(), {"framework": "nemo", "tp": 4}).tp_overlap  # family not known
    assert not plan_with_defaults(Plan(), {"framework": "nemo", "tp": 4}, "moe").tp_overlap
    assert not plan_with_defaults(Plan(), {"framework": "nemo", "tp": 1}, "llama").tp_overlap
    assert not plan_with_defaults(Plan(), {"framework": "nemo", "tp": 4, "tp_overlap": False}, "gpt").tp_overlap
    assert not plan_with_defaults(Plan(), {"framework": "megatron", "tp": 4}, "gpt").tp_overlap  # off unless given


def test_megascale_is_megatron_with_its_tp_collectives_overlapped() -> None:
    """MegaScale's paper (sec. 3.2) fuses the TP / SP collectives with the GEMMs; everything else is Megatron's, and
    its step on a tensor-parallel layout is shorter by the TP time the overlap hides."""
    from echosim.compiler import compile as compile_model
    from echosim.plan import Cluster

    megascale, megatron = FRAMEWORKS["megascale"], FRAMEWORKS["megatron"]
    assert [d for d in megascale.defaults if d.field != "tp_overlap"] == list(megatron.defaults)
    assert plan_with_defaults(Plan(), {"framework": "megascale", "tp": 8}, "gpt").tp_overlap
    assert not plan_with_defaults(Plan(), {"framework": "megascale", "tp": 1}, "gpt").tp_overlap
    assert not plan_with_defaults(Plan(), {"framework": "megascale", "tp": 8, "tp_overlap": False}, "gpt").tp_overlap
    assert framework_named_in("MegaScale (Megatron-LM based)") == "megascale"
    layout = {"tp": 8, "dp": 2, "sp": True, "micro_batch": 1, "global_batch": 16, "seq_len": 2048, "dtype": "bf16"}
    steps = {
        name: compile_model(
            "gpt3-6.7b",
            plan_with_defaults(Plan(), {**layout, "framework": name}, "gpt"),
            Cluster("a100-80gb", 16, 8),
        ).step_time_s
        for name in ("megascale", "megatron")
    }
    assert steps["megascale"] < steps["megatron"]


def test_the_default_run_keeps_its_stated_settings_under_a_framework() -> None:
    _, plan, _ = plan_from_options(None, {"framework": "megatron"})
    assert (plan.framework, plan.recompute, plan.tp, plan.pp) == ("megatron", "full", 8, 16)


def test_unknown_framework_is_one_line_naming_the_known_ones() -> None:
    with pytest.raises(
        FrameworkError,
        match=r"'keras' \(known: apex-ddp, composer, composer-fa1, composer-triton, composer-triton-pure, deepspeed",
    ):
        get_framework("keras")
    result = CliRunner().invoke(cli, ["compile", "gpt3-125m", "--framework", "keras"])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert (
        len(lines) == 1
        and "known: apex-ddp, composer, composer-fa1, composer-triton, composer-triton-pure, deepspeed, "
        "deepspeed-2021, eager, eager-amp, hai-llm, jax-xla, maxtext, "
        "maxtext-bf16-weights, maxtext-bf16-weights-splash-fused, maxtext-splash-fused, maxtext-te, megascale, "
        "megatron, megatron-2022, megatron-bridge, megatron-ce-native, megatron-ce-te, nemo, nemo-ce-native, "
        "nemo-megatron-vit, torchtitan"
        in lines[0]
    )


def test_the_framework_option_help_names_every_framework() -> None:
    from echosim.commands.options import FRAMEWORK_HELP

    listed = set(re.findall(r"[a-z][a-z0-9-]*[a-z0-9]", FRAMEWORK_HELP))
    assert set(FRAMEWORKS) <= listed, sorted(set(FRAMEWORKS) - listed)


def test_unknown_framework_in_a_plan_is_refused_before_capture() -> None:
    from echosim.compiler import lower
    from echosim.plan import Cluster

    with pytest.raises(FrameworkError, match="unknown framework"):
        lower("gpt3-125m", Plan(framework="nope"), Cluster(devices=1))


def test_compile_reports_the_framework_and_applies_its_defaults() -> None:
    import json

    out = CliRunner().invoke(
        cli, ["compile", "gpt3-125m", "--dp", "2", "--global-batch", "2", "--framework", "nemo", "--json"]
    )
    assert out.exit_code == 0, out.output
    plan = json.loads(out.output)["plan"]
    assert (plan["framework"], plan["zero"]) == ("nemo", 1)


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("NeMo 25.02.01 container (NeMo 2.0 / Megatron-Core), recipe GSW 25.04", "nemo-ce-native"),
        ("Megatron-Bridge / Megatron-Core (NeMo 25.11)", "megatron-bridge"),
        ("Megatron-LM (2021)", "megatron-2022"),
        ("Megatron-LM (2022)", "megatron-2022"),
        ("Megatron-LM", "megatron"),
        ("MegaScale (Megatron-LM based)", "megascale"),
        ("MaxText (NVIDIA JAX container 25.01-maxtext)", "maxtext"),
        ("torchtitan (torch 2.6 nightly 2024-12-23, torchao)", "torchtitan-2025"),
        ("torchtitan (torch.compile)", "torchtitan-compile"),
        ("Composer + PyTorch FSDP (torch 1.13/2.0 era), FlashAttention", "composer"),
        ("", "eager"),
    ],
)
def test_rows_name_their_framework(text: str, name: str) -> None:
    assert framework_named_in(text) == name


def test_check_entries_take_a_framework(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from echosim.check import load_config, run_check

    cfg = tmp_path / "pyproject.toml"
    cfg.write_text(
        '[tool.echosim]\nbackend = "h100-sxm"\n[[tool.echosim.check]]\nmodel = "gpt3-125m"\n'
        'dp = 2\nglobal_batch = 2\nframework = "unknown-one"\n'
    )
    config = load_config(cfg)
    with pytest.raises(FrameworkError, match="unknown framework 'unknown-one'"):
        run_check(config.entries[0], config.defaults, 0)


def test_search_takes_the_frameworks_zero_stage() -> None:
    import json

    out = CliRunner().invoke(
        cli,
        ["search", "gpt3-125m", "--backend", "h100-sxm", "--devices", "2", "--global-batch", "4",
         "--micro-batches", "1", "--recompute", "none", "--framework", "nemo", "--json"],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    best = json.loads(out.output)["best"]
    assert {(c["dp"], c["zero"]) for c in best} == {(2, 1), (1, 0)}  # ZeRO is moot on one replica


def test_a_framework_on_fa2_prices_attention_at_fa2s_rate_end_to_end() -> None:
    """torchtitan releases before 2025-10 ran PyTorch SDPA's FlashAttention-2 on Hopper: slower attention than
    today's torchtitan (cuDNN first), the same GEMMs."""
    import json

    def breakdown(framework: str) -> dict:
        out = CliRunner().invoke(
            cli,
            ["compile", "gpt3-125m", "--backend", "h100-sxm", "--dp", "2", "--global-batch", "4",
             "--framework", framework, "--json"],
        )  # fmt: skip
        assert out.exit_code == 0, out.output
        return json.loads(out.output)["breakdown"]

    old, new = breakdown("torchtitan-2025"), breakdown("torchtitan")
    assert old["compute.attention"] > 1.3 * new["compute.attention"]
    assert old["compute.matmul"] == new["compute.matmul"]


def test_composer_fsdp_reduces_gradients_in_fp32_and_cites_it() -> None:
    """Composer's default FSDP mixed precision ('DEFAULT') reduce-scatters fp32 gradients; eager FSDP keeps 16 bits."""
    from echosim.ir.types import DType
    from echosim.passes.plugin import _data_parallel

    composer = get_framework("composer")
    assert "reduce_dtype=torch.float32" in composer.fsdp_reduce_fp32
    assert not get_framework("eager").fsdp_reduce_fp32
    plan = Plan(dp=8, zero=3, framework="composer")
    assert _data_parallel(plan).fsdp_reduce_dtype is DType.FP32
    assert _data_parallel(Plan(dp=8, zero=3)).fsdp_reduce_dtype is None


def test_the_readme_counts_the_framework_entries() -> None:
    """The README says how many entries an unknown --framework lists; it had drifted (24 of 29)."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert f"lists all {len(FRAMEWORKS)} entries" in readme
