"""The MoE settings of the Megatron-Bridge performance recipes behind the published rows: their token
dispatcher (HybridEP where the release's presets set it) and NeMo 25.09's token dropping."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import SHARED

CASES = SHARED / "validation" / "cases.csv"


@pytest.mark.skipif(not CASES.exists(), reason="shared/validation not present")
def test_megatron_bridge_rows_name_their_release_dispatcher() -> None:
    """Rows whose release's presets set moe_flex_dispatcher_backend="hybridep" for that model and system take
    HybridEP; 25.09 (v0.1.0rc4, no HybridEP) and the B200 presets of 25.11 keep alltoall; the layout table's
    DeepEP recipes stay DeepEP."""
    from echosim.validation.cases import read_cases
    from echosim.validation.rows import moe_dispatcher

    rows = {c["case_id"]: c for c in read_cases(CASES)}
    assert moe_dispatcher(rows["mbridge2511-deepseekv3-w-o-mtp-mxfp8-gb200-256"]) == "hybridep"
    assert moe_dispatcher(rows["mbridge2511-qwen3-30b-a3b-mxfp8-gb300-8"]) == "hybridep"
    assert moe_dispatcher(rows["mbridge2604-deepseekv3-mxfp8-b200-256"]) == "hybridep"
    assert moe_dispatcher(rows["mbridge2509-deepseekv3-tokendrop-fp8-gb200-256"]) == ""
    assert moe_dispatcher(rows["mbridge2511-qwen3-30b-a3b-mxfp8-b200-8"]) == ""
    assert moe_dispatcher(rows["mbridge2509-deepseekv3-dropless-fp8-h100-sxm-1024"]) == "deepep"
    assert moe_dispatcher(rows["mbridge260401-deepseekv3-mxfp8-b200-256"]) == "deepep"


@pytest.mark.skipif(not CASES.exists(), reason="shared/validation not present")
def test_nemo_2509_token_drop_rows_pad_to_capacity_one() -> None:
    """NeMo 25.09's Qwen3 runs and its B200 / GB200 DeepSeek-V3 runs drop tokens (apply_moe_token_drop:
    capacity factor 1.0, padded to capacity); its H100 DeepSeek-V3 run is dropless (DeepEP)."""
    from echosim.validation.cases import read_cases
    from echosim.validation.rows import row_plan

    rows = {c["case_id"]: c for c in read_cases(CASES)}
    for case, want in (
        ("mbridge2509-qwen3-30b-a3b-tokendrop-h100-sxm-16", (1.0, True)),
        ("mbridge2509-deepseekv3-tokendrop-gb200-256", (1.0, True)),
        ("mbridge2509-deepseekv3-dropless-h100-sxm-1024", (0.0, False)),
        ("mbridge2511-qwen3-30b-a3b-mxfp8-b200-8", (0.0, False)),
    ):
        plan, _ = row_plan(rows[case])
        assert (plan.moe_capacity_factor, plan.moe_pad_to_capacity) == want, case


NEWER = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "mbridge_newer_releases.csv"


def _newer_rows() -> dict[str, Any]:
    from echosim.validation.cases import read_cases

    return {c["case_id"]: c for c in read_cases(NEWER)}


@pytest.mark.parametrize(
    ("case", "dispatcher", "overlap", "recompute"),
    [
        # v0.5.0 / v0.6.0 DEEPSEEK_V3_..._GB300_FP8_MX_V2: recompute_modules=[] (nothing recomputed)
        ("mbridge2606-deepseekv3-mxfp8-gb300-256", "hybridep", True, "none"),
        ("mbridge2608-deepseekv3-mxfp8-gb300-256", "hybridep", True, "none"),
        ("mbridge260601-deepseekv3-mxfp8-gb200-256", "hybridep", True, "selective:mla_up_proj"),
        # B300_V2: HybridEP over NVL8, no a2a overlap (and no vpp, which the overlap would need)
        ("mbridge2606-deepseekv3-mxfp8-b300-256", "hybridep", False, "selective:mla_up_proj"),
        # the GB200 MXFP8 preset clears the BF16 presets' layernorm / moe_act recompute
        ("mbridge2606-gpt-oss-120b-mxfp8-gb200-64", "hybridep", True, "none"),
        ("mbridge2606-qwen3-30b-a3b-fp8-h100-sxm-16", "hybridep", False, "none"),
        ("mbridge2608-qwen3-235b-a22b-mxfp8-gb200-256", "hybridep", True, "none"),
    ],
)
def test_newer_megatron_bridge_releases_take_their_presets(
    case: str, dispatcher: str, overlap: bool, recompute: str
) -> None:
    """NeMo 26.06, 26.06.01 and 26.08 rows take their release's preset (MEGATRON_BRIDGE_MOE_PRESETS), not the
    release-independent recompute table nor the earlier releases' dispatcher and overlap sets."""
    from echosim.validation.rows import row_plan

    plan, _ = row_plan(_newer_rows()[case])
    assert (plan.moe_dispatcher, plan.moe_ep_overlap, plan.recompute) == (dispatcher, overlap, recompute)
    # every preset with the a2a overlap sets fp8_dot_product_attention, but DeepSeek-V3's on GB200
    assert plan.fp8_attention == (overlap and "deepseekv3-mxfp8-gb200" not in case)
    assert plan.moe_fused_mlp == overlap  # cutedsl_fused_grouped_mlp: every preset with the a2a overlap


def test_a_release_without_a_preset_keeps_the_older_tables() -> None:
    """A row of a release the preset table does not hold (26.06's dense Llama rows, or a MoE row relabelled to
    25.09) falls through to the release-independent tables, as before."""
    from echosim.validation.cases import Case
    from echosim.validation.rows import moe_preset, row_plan

    row = _newer_rows()["mbridge2606-gpt-oss-120b-mxfp8-gb200-64"]
    older = Case(row.line, {**row.cells, "source_id": "megatron_bridge_25.09"}, row.numbers)
    assert moe_preset(older) is None
    plan, _ = row_plan(older)
    assert (plan.moe_dispatcher, plan.moe_ep_overlap) == ("alltoall", False)
    assert plan.recompute == "selective:layernorm,moe_act"
    assert moe_preset(_newer_rows()["mbridge2606-llama3p1-405b-fp8-gb300-256"]) is None


@pytest.mark.slow
def test_every_newer_release_row_compiles_and_the_check_holds_its_figure() -> None:
    """benchmarks/mbridge_newer_releases.md quotes 9.0 % over the 36 rows: every row compiles, and a change that
    moves the check past 10 % (or skips a row) shows here before the note goes stale."""
    from statistics import mean

    from echosim.validation.run import validate_cases

    errors = [r.error for r in validate_cases(NEWER).rows]
    assert len(errors) == 36 and None not in errors
    assert mean(abs(e) for e in errors if e is not None) < 0.10


@pytest.mark.skipif(not CASES.exists(), reason="shared/validation not present")
def test_megatron_bridge_nvfp4_llama_rows_do_not_overlap_tp_communication() -> None:
    """The Llama 3 / 3.1 performance scripts set tp_comm_overlap = False for NVFP4 (v0.3.0 to v0.5.0); the FP8
    and MXFP8 rows of the same scripts keep the dense recipes' overlap."""
    from echosim.validation.cases import read_cases
    from echosim.validation.rows import row_plan

    rows = {c["case_id"]: c for c in read_cases(CASES)}
    nvfp4, _ = row_plan(rows["mbridge260201-llama3p1-405b-nvfp4-gb200-256"])
    fp8, _ = row_plan(rows["mbridge2511-llama3p1-405b-fp8-gb200-256"])
    assert nvfp4.tp == fp8.tp == 4
    assert (nvfp4.tp_overlap, fp8.tp_overlap) == (False, True)
    newer, _ = row_plan(_newer_rows()["mbridge2606-llama3p1-405b-nvfp4-gb300-256"])
    assert newer.tp_overlap is False
