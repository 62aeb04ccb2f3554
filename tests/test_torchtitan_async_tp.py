"""torchtitan's async tensor parallelism (``parallelism.enable_async_tensor_parallel``) is priced as ``tp_overlap``,
for published rows whose source says they ran it as for TOML configs that set it; and float8 recipes other than
tensorwise are named in the config reader's notes, not passed over."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SHARED, case_with

from echosim.configs import read_source
from echosim.validation.cases import Case, read_cases
from echosim.validation.rows import row_plan, torchtitan_async_tp

CASES = SHARED / "validation" / "cases.csv"
NEWER = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "torchtitan_newer.csv"
pytestmark = pytest.mark.skipif(not CASES.exists(), reason="shared/validation not present")

T4 = "torchtitan2412-t4-llama-3p1-70b-{}fp8-h100-96gb-256"


def _cases() -> dict[str, Case]:
    return {c.case_id: c for c in read_cases(CASES)}


def test_the_async_tp_row_overlaps_and_its_vanilla_twin_does_not() -> None:
    cases = _cases()
    async_tp, vanilla = cases[T4.format("asynctp-")], cases[T4.format("")]
    assert torchtitan_async_tp(async_tp) is True and torchtitan_async_tp(vanilla) is None
    assert row_plan(async_tp)[0].tp_overlap and not row_plan(vanilla)[0].tp_overlap


def test_async_tp_needs_tensor_parallelism_and_torchtitan() -> None:
    async_tp = _cases()[T4.format("asynctp-")]
    assert torchtitan_async_tp(case_with(async_tp, tp="1")) is None
    assert torchtitan_async_tp(case_with(async_tp, framework="Megatron-LM")) is None


def test_every_newer_async_row_is_priced_faster_than_its_twin() -> None:
    """benchmarks/data/torchtitan_newer.csv: 6 async / vanilla pairs on the same layout."""
    from echosim.validation.run import validate_cases

    rows = {r.case_id: r for r in validate_cases(NEWER).rows}
    pairs = [(k, k.replace("-asynctp", "")) for k in rows if "-asynctp" in k]
    assert len(pairs) == 6
    for fast, slow in pairs:
        speedup = rows[slow].predicted_step_time_s / rows[fast].predicted_step_time_s
        assert 1.03 < speedup < 1.2, (fast, speedup)


def test_a_rowwise_float8_recipe_is_named_in_the_notes(tmp_path: Path) -> None:
    toml = tmp_path / "rowwise.toml"
    toml.write_text('[model]\nname = "llama3"\nflavor = "8B"\nconverters = ["float8"]\n'
                    '[float8]\nrecipe_name = "rowwise"\n')  # fmt: skip
    cfg = read_source(f"torchtitan:{toml}")
    assert "float8.recipe_name" not in cfg.unknown
    assert any("'rowwise': priced as tensorwise" in n for n in cfg.notes)
    toml.write_text(toml.read_text().replace("rowwise", "tensorwise"))
    assert not any("recipe_name" in n for n in read_source(f"torchtitan:{toml}").notes)
