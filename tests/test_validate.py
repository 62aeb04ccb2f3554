"""`echosim validate --cases`: reading, skipping, converting, grouping and filtering rows of a cases file."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from echosim.validation import published
from echosim.validation.cases import REQUIRED, CasesError, read_cases
from echosim.validation.published import published_step_time
from echosim.validation.rows import ep_overlap, moe_dispatcher, moe_router_groups, row_model, row_plan
from echosim.validation.run import validate_cases
from echosim.validation.stats import Validation

COLUMNS = [
    *REQUIRED,
    *("slices", "framework", "step_time_basis", "reported_metric", "reported_value", "notes"),
    *("experts", "top_k", "moe_ffn_hidden", "shared_experts"),
]
# A tiny GPT on the null backend compiles in well under a second: rows that exercise the pipeline.
TINY = {
    "case_id": "tiny-gpt",
    "source_id": "unit",
    "confidence": "A",
    "arch": "gpt",
    "layers": "2",
    "hidden": "64",
    "heads": "4",
    "kv_heads": "4",
    "head_dim": "16",
    "ffn_hidden": "256",
    "vocab": "128",
    "seq_len": "16",
    "device": "null",
    "devices": "1",
    "devices_per_node": "8",
    "dtype": "bf16",
    "tp": "1",
    "pp": "1",
    "dp": "1",
    "cp": "1",
    "ep": "",
    "vpp": "",
    "sp": "0",
    "zero": "0",
    "recompute": "none",
    "micro_batch": "1",
    "global_batch": "1",
    "step_time_s": "0.001",
    "slices": "1",
    "framework": "unit test",
}


def write(tmp_path: Path, *rows: dict[str, str], columns: list[str] = COLUMNS) -> Path:
    path = tmp_path / "cases.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, columns, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in columns})
    return path


def row(**changes: str) -> dict[str, str]:
    return {**TINY, **changes}


@pytest.fixture(scope="module")
def cli() -> click.Group:
    from echosim.cli import cli as group
    from echosim.plugins import get_registry

    if "validate" not in group.commands:
        get_registry().add_commands(group)
    return group


def run(cli: click.Group, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


# ---- bad input: one line naming row and column ---------------------------------------------------


def test_missing_column_is_one_line_naming_it(tmp_path, cli):
    path = write(tmp_path, row(), columns=[c for c in COLUMNS if c != "step_time_s"])
    code, out = run(cli, "validate", "--cases", str(path))
    assert code == 1
    assert out.strip().splitlines() == [f"Error: {path}: line 1 (header): missing column(s) 'step_time_s'"]


def test_unit_typo_names_line_case_and_column(tmp_path, cli):
    path = write(tmp_path, row(), row(case_id="typo", step_time_s="12s"))
    code, out = run(cli, "validate", "--cases", str(path))
    assert code == 1
    assert out.strip() == (
        f"Error: {path}: line 3 (typo): column 'step_time_s' is not a number: '12s' (a unit typed into the cell? "
        "write 12)"
    )


def test_unknown_device_is_an_error_a_known_one_without_backend_a_skip(tmp_path, cli):
    path = write(tmp_path, row(device="h100-pcie-x"))
    code, out = run(cli, "validate", "--cases", str(path))
    assert code == 1 and len(out.strip().splitlines()) == 1
    assert "line 2 (tiny-gpt): column 'device' names an unknown device 'h100-pcie-x' (known: " in out
    assert "h100-sxm" in out  # the near names are listed
    result = validate_cases(write(tmp_path, row(device="mi355x")))
    assert result.rows[0].skipped == "no backend for device 'mi355x' yet"


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("layers", "2.5", "column 'layers' must be a whole number >= 0, got '2.5'"),
        ("global_batch", "-4", "column 'global_batch' must be a whole number >= 0, got '-4'"),
        ("step_time_s", "0", "column 'step_time_s' must be positive, got '0'"),
        ("arch", "gtp", "column 'arch' is 'gtp'; known: gpt, llama, moe"),
        ("dtype", "fp4", "column 'dtype' is 'fp4'"),
        ("recompute", "some", "column 'recompute' is 'some'"),
        ("sp", "2", "column 'sp' is a flag (0 or 1), got '2'"),
        ("case_id", "", "column 'case_id' is empty"),
    ],
)
def test_other_bad_cells(tmp_path, column, value, message):
    with pytest.raises(CasesError, match=f"line 2 .*{message}".replace("(", r"\(").replace(")", r"\)")):
        read_cases(write(tmp_path, row(**{column: value})))


def test_duplicate_case_ids_and_unreadable_files(tmp_path):
    with pytest.raises(CasesError, match=r"line 3 \(tiny-gpt\): column 'case_id' repeats line 2"):
        read_cases(write(tmp_path, row(), row()))
    with pytest.raises(CasesError, match="cannot read"):
        read_cases(tmp_path / "nope.csv")
    (tmp_path / "bin.csv").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(CasesError, match="not a UTF-8 CSV file"):
        read_cases(tmp_path / "bin.csv")


# ---- skipped rows: counted, with the reason ---------------------------------------------------------


def test_skips_are_counted_with_reasons(tmp_path):
    rows = [
        row(case_id="moe", arch="moe"),
        row(case_id="mx", dtype="mxfp8"),
        row(case_id="blank-time", step_time_s=""),
        row(case_id="blank-vocab", vocab=""),
        row(case_id="gqa-gpt", kv_heads="2"),
        row(case_id="blank-dtype-h100", device="h100-sxm", dtype=""),
        row(case_id="ok"),
    ]
    result = validate_cases(write(tmp_path, *rows))
    reasons = {r.case_id: r.skipped for r in result.rows}
    assert reasons == {
        "moe": "column(s) 'experts', 'top_k' blank (a moe row needs its routed experts)",
        "mx": "--dtype mxfp8: backend 'null' cannot run mxfp8 (it has no block-scaled (MX/NV) tensor-core formats)",
        "blank-time": "no published step time",
        "blank-vocab": "column(s) 'vocab' blank (not given by the source)",
        "gqa-gpt": "",
        "blank-dtype-h100": (
            "dtype blank on an fp8-capable device (16-bit or fp8 is not stated; the framework has no default)"
        ),
        "ok": "",
    }
    d = result.as_dict()
    assert d["compiled"] == 2 and d["skipped"] == 5 and sum(d["skip_reasons"].values()) == 5


def test_blank_cells_take_the_framework_default_or_a_derivation(tmp_path):
    """Blank vocab: the framework's GPT tokenizer (GPT-2 BPE, 50,257) padded to 128 x tp; blank dtype:
    the framework's precision (NeMo / Megatron-Bridge: bf16); blank dp: devices / (tp*pp*cp)."""
    nemo = "Megatron-Bridge / Megatron-Core (NeMo 25.09)"
    cases = read_cases(
        write(
            tmp_path,
            row(case_id="vocab", vocab="", framework=nemo, tp="2", devices="2", dp="", sp="1"),
            row(case_id="dtype", device="h100-sxm", dtype="", framework=nemo),
            row(case_id="eager-vocab", vocab=""),
        )
    )
    vocab, dtype, _eager = cases
    assert row_model(vocab).vocab == 50432  # 50257 up to a multiple of 128 * 2
    plan, _cluster = row_plan(vocab)
    assert plan.dp == 1 and plan.tp == 2
    assert row_plan(dtype)[0].dtype == "bf16"
    result = validate_cases(write(tmp_path, row(case_id="v", vocab="", framework=nemo, dtype="")))
    assert result.rows[0].skipped == "" and result.rows[0].predicted_step_time_s
    assert "vocab" in validate_cases(write(tmp_path, row(vocab=""))).rows[0].skipped  # eager: no tokenizer


def test_layout_errors_become_skips_not_crashes(tmp_path):
    result = validate_cases(write(tmp_path, row(tp="2", devices="1")))
    assert "does not equal devices=1" in result.rows[0].skipped


# ---- published step time from the reported metric -------------------------------------------------------


def _case(tmp_path: Path, **changes: str):
    return read_cases(write(tmp_path, row(**changes)))[0]


def test_reported_metric_converts_only_with_a_known_convention(tmp_path):
    base = {"step_time_s": "", "devices": "8", "dp": "8", "global_batch": "64", "seq_len": "2048"}
    c = _case(tmp_path, **base, reported_metric="iteration_time_s", reported_value="2.5")
    assert published_step_time(c) == (2.5, "reported_metric iteration_time_s")
    c = _case(tmp_path, **base, reported_metric="tokens_per_s_per_gpu", reported_value="1024")
    assert published_step_time(c)[0] == pytest.approx(64 * 2048 / (1024 * 8))
    # Narayanan Eq. 3, named in the notes: F = 96 B s l h^2 (1 + s/6h + V/16lh)
    c = _case(tmp_path, **base, reported_metric="tflops_per_gpu", reported_value="100", notes="step from Eq. 3")
    flops = 96 * 64 * 2048 * 2 * 64**2 * (1 + 2048 / (6 * 64) + 128 / (16 * 2 * 64))
    assert published_step_time(c) == (
        pytest.approx(flops / (100e12 * 8)),
        "reported_metric tflops_per_gpu (narayanan-eq3 FLOPs)",
    )
    c = _case(tmp_path, **base, reported_metric="mfu_pct", reported_value="50", notes="6ND | peak_tflops_ref=312")
    six_nd = 6 * c.numbers["global_batch"] * 2048 * published._params(c)
    assert published_step_time(c)[0] == pytest.approx(six_nd / (0.5 * 312e12 * 8))
    c = _case(tmp_path, **base, reported_metric="mfu", reported_value="0.5", notes="6ND")
    assert published_step_time(c) == (None, "no published step time (mfu given, the peak it divides by not stated)")
    c = _case(tmp_path, **base, reported_metric="tflops_per_gpu", reported_value="100", notes="formula not stated")
    assert published_step_time(c) == (None, "no published step time (tflops_per_gpu given, FLOP convention not stated)")


# ---- row -> plan ---------------------------------------------------------------------------------------------


def test_tpu_rows_use_the_slice_as_the_node(tmp_path):
    c = _case(tmp_path, device="tpu-v5e", devices="512", devices_per_node="4", slices="2", dp="512")
    _, cluster = row_plan(c)
    assert cluster.backend == "tpu-v5e" and cluster.devices_per_node == 256  # host of 4 -> ICI slice of 256


def test_partial_nvlink_domains_spread_evenly(tmp_path):
    c = _case(tmp_path, device="gb200", devices="128", devices_per_node="72", dp="128")
    assert row_plan(c)[1].devices_per_node == 64  # two NVL72 racks, 64 GPUs each


def test_blank_cells_take_framework_defaults(tmp_path):
    plan, _ = row_plan(_case(tmp_path, recompute="", framework="MaxText (JAX/XLA)", micro_batch="", dtype=""))
    assert (plan.recompute, plan.micro_batch, plan.dtype) == ("full", 1, "bf16")
    plan, _ = row_plan(_case(tmp_path, recompute="", framework="NeMo 25.02", vpp="2", pp="2", devices="2"))
    assert (plan.recompute, plan.schedule, plan.vpp) == ("none", "interleaved", 2)
    assert plan.framework == "nemo-ce-native"  # NeMo 2.0: the nemo entry with its fused (native) loss
    plan, _ = row_plan(_case(tmp_path, zero="", framework="NeMo 25.02", dp="2", devices="2"))
    assert plan.zero == 1  # NeMo's distributed optimizer
    plan, _ = row_plan(_case(tmp_path, zero="0", framework="NeMo 25.02", dp="2", devices="2"))
    assert plan.zero == 0  # a stated cell wins
    assert row_plan(_case(tmp_path, framework="unit test"))[0].framework == "eager"


def test_blank_cells_take_what_the_sources_own_script_or_footnote_states(tmp_path):
    """Megatron-Bridge 25.09's table is FP8 (its footnote's quantization granularities); DGX Cloud
    v25.04's launch.sh runs Nemotron-4 340B with VP=12 where its table prints NA. A stated cell wins,
    and other sources and models keep the framework's defaults."""
    nemo, bridge = "NeMo 25.02.01 container", "Megatron-Bridge / Megatron-Core (NeMo 25.09)"
    common = {"device": "h100-sxm", "dtype": ""}
    assert row_plan(_case(tmp_path, **common, framework=bridge, source_id="megatron_bridge_25.09"))[0].dtype == "fp8"
    assert row_plan(_case(tmp_path, **common, framework=bridge, source_id="megatron_bridge_25.11"))[0].dtype == "bf16"
    stated = {**common, "dtype": "bf16"}
    assert row_plan(_case(tmp_path, **stated, framework=bridge, source_id="megatron_bridge_25.09"))[0].dtype == "bf16"
    nemotron = {"layers": "96", "hidden": "18432", "heads": "96", "pp": "8", "devices": "8", "dp": "1"}
    dgxc = {"source_id": "dgxc_benchmarking_v25.04", "framework": nemo, "vpp": ""}
    plan, _ = row_plan(_case(tmp_path, **nemotron, **dgxc))
    assert (plan.vpp, plan.schedule) == (12, "interleaved")
    plan, _ = row_plan(_case(tmp_path, **nemotron, **{**dgxc, "vpp": "4"}))
    assert plan.vpp == 4
    plan, _ = row_plan(_case(tmp_path, **{**nemotron, "hidden": "12288"}, **dgxc))
    assert (plan.vpp, plan.schedule) == (1, "1f1b")


def test_moe_dispatcher_follows_the_recipe_or_the_source(tmp_path):
    """DeepSeek-V3's H100 recipe and the B200 MXFP8 ep32 recipe run DeepEP; DeepSeek's own run says it
    dispatches that way; other MoE rows keep NCCL's all_to_all."""
    moe = {"arch": "moe", "experts": "256", "top_k": "8", "moe_ffn_hidden": "32", "kv_heads": "4"}
    bridge = "Megatron-Bridge / Megatron-Core (NeMo 25.09)"
    h100 = {**moe, "layers": "61", "hidden": "7168", "device": "h100-sxm", "tp": "2", "pp": "8", "vpp": "4",
            "ep": "64", "micro_batch": "1", "devices": "1024", "dp": "64", "framework": bridge}  # fmt: skip
    c = _case(tmp_path, **h100, source_id="megatron_bridge_25.09")
    assert moe_dispatcher(c) == "deepep"
    assert moe_dispatcher(_case(tmp_path, **{**h100, "ep": "32"}, source_id="megatron_bridge_25.09")) == ""
    assert moe_dispatcher(_case(tmp_path, **h100, source_id="unit")) == ""
    own = _case(tmp_path, **moe, source_id="deepseek_v3_2024", framework="HAI-LLM")
    assert row_plan(own)[0].moe_dispatcher == "deepep"
    assert row_plan(_case(tmp_path, **moe))[0].moe_dispatcher == "alltoall"


def test_ep_overlap_follows_the_releases_own_preset(tmp_path):
    """moe_a2a_overlap where the row's release sets it for the row's layout and batch: NeMo 25.11 (v0.2.0)
    QWEN3_235B_A22B_H100_FP8_CS at GBS 2048, 26.04.01 GPT-OSS GB200 V2 at GBS 1280; not the same
    layout at another batch, nor a 26.02.01 (r0.3.1) row whose preset has another layout."""
    moe = {"arch": "moe", "experts": "128", "top_k": "8", "moe_ffn_hidden": "32", "kv_heads": "4"}
    h100 = {**moe, "layers": "94", "hidden": "4096", "device": "h100-sxm", "tp": "2", "pp": "8", "vpp": "4",
            "ep": "32", "micro_batch": "1", "devices": "256", "dp": "16", "global_batch": "2048"}  # fmt: skip
    assert ep_overlap(_case(tmp_path, **h100, source_id="megatron_bridge_25.11"))
    assert not ep_overlap(_case(tmp_path, **h100, source_id="megatron_bridge_25.09"))
    assert not ep_overlap(_case(tmp_path, **{**h100, "global_batch": "1024"}, source_id="megatron_bridge_25.11"))
    gpt_oss = {**moe, "layers": "36", "hidden": "2880", "device": "gb200", "tp": "1", "pp": "1", "vpp": "",
               "ep": "64", "micro_batch": "4", "devices": "64", "dp": "64", "global_batch": "1280"}  # fmt: skip
    assert ep_overlap(_case(tmp_path, **gpt_oss, source_id="megatron_bridge_26.04.01"))
    assert not ep_overlap(_case(tmp_path, **{**gpt_oss, "device": "gb300"}, source_id="megatron_bridge_26.04.01"))
    qwen30 = {**moe, "layers": "48", "hidden": "2048", "device": "h100-sxm", "tp": "1", "pp": "2", "vpp": "12",
              "ep": "8", "micro_batch": "1", "devices": "16", "dp": "8", "global_batch": "1024"}  # fmt: skip
    assert not ep_overlap(_case(tmp_path, **qwen30, source_id="megatron_bridge_26.02.01"))


def test_attention_kernel_follows_the_framework_and_its_date(tmp_path):
    """Megatron-LM before its FlashAttention integration (Dec 2022) materialised scores; nothing keys on the source."""
    frameworks = ("Megatron-LM (2021)", "Megatron-LM (2022)", "Megatron-LM", "MegaScale (Megatron-LM based)", "NeMo")
    attention = [row_plan(_case(tmp_path, framework=f))[0].attention for f in frameworks]
    assert attention == ["math", "math", "flash", "flash", "flash"]
    assert row_plan(_case(tmp_path, source_id="narayanan2021", framework="NeMo 25.02"))[0].attention == "flash"


def test_no_prediction_reads_a_rows_identity_or_free_text(tmp_path):
    """case_id, source_id, confidence and notes never change what is compiled: the
    attention kernel, the capacity factor and MLA come from columns and framework defaults."""
    moe = {"arch": "moe", "experts": "8", "top_k": "2", "moe_ffn_hidden": "32", "kv_heads": "4"}
    plain = row(case_id="plain", **moe)
    loud = row(
        **moe,
        case_id="narayanan2021-tokendrop-mla",
        source_id="narayanan2021",
        confidence="C",
        notes="MLA attention (q_lora 1536); tokendrop capacity factor 1.25; Megatron-LM 2021 materialised attention",
    )
    a, b = validate_cases(write(tmp_path, plain, loud)).rows
    assert a.predicted_step_time_s == b.predicted_step_time_s and not a.skipped and not b.skipped
    ca, cb = read_cases(write(tmp_path, plain, loud))
    assert row_plan(ca) == row_plan(cb) and row_model(ca) == row_model(cb)


def test_moe_rows_read_expert_width_and_shared_experts(tmp_path):
    """Experts get moe_ffn_hidden, not ffn_hidden (the dense-layer width), and shared experts are kept."""
    moe = {"arch": "moe", "experts": "8", "top_k": "2", "moe_ffn_hidden": "32", "shared_experts": "1"}
    c = _case(tmp_path, **moe)
    cfg = row_model(c)
    assert (cfg.expert_ffn, cfg.shared_experts, cfg.ffn_hidden) == (32, 1, 256)
    result = validate_cases(write(tmp_path, row(**moe, kv_heads="4")))
    assert not result.rows[0].skipped and result.rows[0].predicted_step_time_s
    with pytest.raises(KeyError, match="not read as a number"):
        c.int("notes")


def test_maxtext_micro_batch_is_per_device(tmp_path):
    """MaxText's per_device_batch_size counts sequences per chip: a tp=4 replica runs 4x that, in one step."""
    cells = {"framework": "MaxText (JAX/XLA)", "devices": "8", "tp": "4", "dp": "2", "micro_batch": "3"}
    plan, _ = row_plan(_case(tmp_path, **cells, global_batch="24"))
    assert (plan.micro_batch, plan.microbatches) == (12, 1)
    plan, _ = row_plan(_case(tmp_path, **{**cells, "framework": "NeMo 25.02"}, global_batch="24"))
    assert (plan.micro_batch, plan.microbatches) == (3, 4)  # Megatron's micro-batch is per replica


# ---- features, groups, filters ------------------------------------------------------------------------------


def test_features_name_the_layout_and_each_feature(tmp_path):
    c = _case(tmp_path, tp="8", pp="4", dp="2", cp="2", vpp="3", sp="1", zero="3", dtype="fp8")
    assert c.features() == ["tp+pp+dp+cp", "cp", "sp", "vpp", "zero3", "fp8"]
    assert _case(tmp_path).features() == ["single device", "bf16"]


def test_filters_on_any_column_several_and_negated(tmp_path):
    rows = [
        row(case_id=f"r{i}", source_id=s, dtype=d)
        for i, (s, d) in enumerate([("a", "bf16"), ("b", "bf16"), ("b", "fp8"), ("c", "fp16")])
    ]
    path = write(tmp_path, *rows)

    def ids(*filters: str) -> list[str]:
        return [r.case_id for r in validate_cases(path, list(filters)).rows]

    assert ids("source_id=b") == ["r1", "r2"]
    assert ids("source_id=a", "source_id=c") == ["r0", "r3"]  # the same column twice: either
    assert ids("source_id=b", "dtype=fp8") == ["r2"]  # different columns: both
    assert ids("source_id!=b") == ["r0", "r3"]
    assert ids("case_id=r[12]") == ["r1", "r2"]  # shell wildcards
    assert ids("feature=fp8") == ["r2"]
    assert validate_cases(path, {"source_id": "a"}).selected_of == 4
    with pytest.raises(CasesError, match="unknown column 'sorce_id'"):
        validate_cases(path, ["sorce_id=a"])
    with pytest.raises(CasesError, match="expected COLUMN=VALUE"):
        validate_cases(path, ["nonsense"])


def test_json_has_rows_groups_and_targets(tmp_path, cli):
    path = write(
        tmp_path, row(), row(case_id="second", dtype="fp16", step_time_s="0.002"), row(case_id="x", arch="moe")
    )
    code, out = run(cli, "validate", "--cases", str(path), "--json")
    assert code == 0, out
    result = json.loads(out)
    first, _, skipped = result["rows"]
    assert {"case_id", "predicted_step_time_s", "measured_step_time_s", "error"} <= set(first)
    assert (
        skipped["skipped"] == "column(s) 'experts', 'top_k' blank (a moe row needs its routed experts)"
        and "error" not in skipped
    )
    groups = result["groups"]
    assert groups["overall"]["rows"] == 2
    assert {"device=null", "arch=gpt", "source_id=unit", "feature=bf16", "feature=fp16", "confidence=A"} <= set(groups)
    assert result["compiled"] == 2 and result["skipped"] == 1
    assert result["targets"]["mape_target"] == 0.06 and result["targets"]["row_target"] == 0.15


def test_text_output_lists_groups_skips_and_constants(tmp_path, cli):
    path = write(tmp_path, row(), row(case_id="x", arch="moe"))
    code, out = run(cli, "validate", "--cases", str(path))
    assert code == 0, out
    assert "mean absolute percentage error" in out and "1 cases compiled, 1 skipped" in out
    assert "column(s) 'experts', 'top_k' blank (a moe row needs its routed experts)" in out


def test_group_summary_is_signed_and_absolute():
    from echosim.validation.stats import RowResult

    rows = [
        RowResult(
            f"r{i}",
            {"device": "d", "arch": "gpt", "source_id": "s", "confidence": "A"},
            ["dp"],
            1.0,
            predicted_step_time_s=p,
        )
        for i, p in enumerate((0.9, 1.2))
    ]
    g = Validation(rows).groups()["overall"]
    assert (
        g["mape"] == pytest.approx(0.15) and g["mean_error"] == pytest.approx(0.05) and g["max"] == pytest.approx(0.2)
    )
    assert g["within_15pct"] == 1


def test_deepseek_v3_rows_route_to_four_of_eight_groups():
    """DeepSeek-V3's n_group 8 / topk_group 4 (its config, Megatron-Bridge's provider), by model shape."""
    from conftest import SHARED

    path = SHARED / "validation" / "cases.csv"
    if not path.exists():
        pytest.skip("validation data not found")
    cases = {c.case_id: c for c in read_cases(path)}
    dsv3 = [c for c in cases.values() if c["arch"] == "moe" and c.int("experts") == 256 and c.int("layers") == 61]
    assert dsv3 and all(moe_router_groups(c) == (8, 4) for c in dsv3)
    plan = row_plan(cases["mbridge2509-deepseekv3-dropless-h100-sxm-1024"])[0]
    assert (plan.moe_router_groups, plan.moe_router_group_topk, plan.moe_dispatcher) == (8, 4, "deepep")
    other = [c for c in cases.values() if c["arch"] == "moe" and c.int("experts") != 256]
    assert other and all(moe_router_groups(c) == (0, 0) for c in other)
    assert row_plan(other[0])[0].moe_router_groups == 0
