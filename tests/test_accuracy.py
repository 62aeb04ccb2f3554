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
