"""The MoE settings of the Megatron-Bridge performance recipes behind the published rows: their token
dispatcher (HybridEP where the release's presets set it) and NeMo 25.09's token dropping."""

from __future__ import annotations

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
