"""End-to-end accuracy on the published Megatron-LM runs (../shared/validation/cases.csv)."""

from __future__ import annotations

import pytest
from conftest import SHARED

from echosim.validation.run import validate_cases

CASES = SHARED / "validation" / "cases.csv"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not CASES.exists(), reason="shared/validation not present")]


@pytest.mark.parametrize("source", ["narayanan2021", "korthikanti2022"])
def test_megatron_rows_within_fifteen_percent(source: str) -> None:
    """Tensor/pipeline/data-parallel rows of the Megatron-LM papers (the foundation's target)."""
    result = validate_cases(CASES, {"source_id": source, "zero": "0"})
    errors = [abs(r.error) for r in result.rows if r.error is not None]
    skipped = [r for r in result.rows if r.skipped]
    assert errors, "no row compiled"
    assert all(r.skipped.startswith("needs ") or r.skipped == "no published step time" for r in skipped)
    assert sum(errors) / len(errors) <= 0.15
    assert max(errors) <= 0.25


def test_torchtitan_h100_96gb_rows_at_the_500_watt_clock() -> None:
    """torchtitan's 2024-12 runs on 500 W H100s: compute peaks at the cube-law clock (0.894 of the SXM's).
    Before the rule the group sat at MAPE 22.4%, mean -21.0%; the rows that miss most are the eager
    (no torch.compile, before the reference-norm rule) and the long-context ones (docs/accuracy.md)."""
    result = validate_cases(CASES, {"source_id": "torchtitan_2412"})
    errors = {r.case_id: r.error for r in result.rows if r.error is not None}
    assert len(errors) == 18
    assert sum(abs(e) for e in errors.values()) / len(errors) == pytest.approx(0.150, abs=0.005)
    assert sum(errors.values()) / len(errors) == pytest.approx(-0.127, abs=0.005)
    # eager rows price torchtitan's reference RMSNorm (-24.0 / -26.3% without it), as close as their compile twins
    assert errors["torchtitan2412-t1-llama-3p1-8b-bf16-h100-96gb-8"] == pytest.approx(-0.135, abs=0.01)
    assert errors["torchtitan2412-t1-llama-3p1-8b-compile-bf16-h100-96gb-8"] == pytest.approx(-0.121, abs=0.01)
    # its fp8 casts also write the transposed copy Hopper's TN-only fp8 GEMMs need (+1%)
    assert errors["torchtitan2412-t4-llama-3p1-70b-asynctp-fp8-h100-96gb-256"] == pytest.approx(0.012, abs=0.01)


def test_deepseek_v3_deepep_rows_with_group_limited_routing() -> None:
    """DeepEP's network leg under DeepSeek-V3's 4-of-8 group routing: +37..+44% before, +17..+30% after;
    the fp8 cast copies and Blackwell attention backward (issue16c) add 1-4 points. The H100 rows run
    the recipe's expert tensor parallelism 1 under tp 2 (experts whole, no tp all_gather / reduce_scatter
    of the routed rows): +31.7% -> -5.4%, and they fit (82.9 -> 76.8 GiB of 80)."""
    result = validate_cases(CASES, {"arch": "moe", "experts": "256"})
    errors = {r.case_id: r.error for r in result.rows if r.error is not None}
    assert errors["deepseekv3-2024-t1-deepseek-v3-671b-fp8-h800-2048"] == pytest.approx(
        0.177, abs=0.01
    )  # +1%: Hopper fp8 transposes
    assert errors["mbridge2509-deepseekv3-dropless-h100-sxm-1024"] == pytest.approx(-0.054, abs=0.01)
    fits = {r.case_id: r.fits for r in result.rows if r.error is not None}
    assert (
        fits["mbridge2509-deepseekv3-dropless-h100-sxm-1024"]
        and fits["mbridge2509-deepseekv3-dropless-fp8-h100-sxm-1024"]
    )
    # its recipe (B200_FP8_MX_V2) overlaps the EP all-to-alls with the adjacent micro-batch (combined 1F1B):
    # +34.0% without that rule
    assert errors["mbridge260401-deepseekv3-mxfp8-b200-256"] == pytest.approx(-0.110, abs=0.01)


def test_megatron_bridge_moe_rows_fold_expert_parallelism_over_tensor_parallel_ranks() -> None:
    """Qwen3-235B with tp 2 and ep = 2 x dp (H100 ep 32 over dp 16; GB200 ep 64 over dp 32) runs expert
    tensor parallelism 1 (the recipes' etp: 1): skipped before ("ep does not divide dp"), compiled now.
    The H100 rows whose recipe overlaps the EP all-to-all with the other micro-batch (moe_a2a_overlap)
    are the ones that stay slow here."""
    result = validate_cases(CASES, {"source_id": "megatron_bridge*", "experts": "128", "tp": "2"})
    errors = {r.case_id: r.error for r in result.rows if r.error is not None}
    assert len(errors) == 5 and not [r for r in result.rows if r.skipped]
    assert errors["mbridge2509-qwen3-235b-a22b-tokendrop-gb200-64"] == pytest.approx(-0.142, abs=0.01)
    assert errors["mbridge2509-qwen3-235b-a22b-tokendrop-h100-sxm-256"] == pytest.approx(-0.078, abs=0.01)
    assert errors["mbridge2511-qwen3-235b-a22b-fp8-h100-sxm-256"] == pytest.approx(0.207, abs=0.01)
    # the 26.04.01 preset (H100_FP8_CS_V2) runs combined 1F1B: +30.1% without the overlap rule
    assert errors["mbridge260401-qwen3-235b-a22b-fp8-h100-sxm-256"] == pytest.approx(-0.158, abs=0.01)
