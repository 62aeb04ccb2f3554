"""benchmarks/tpu_generations.py: the TPU rows' HFU both ways and the two counterfactuals hold their identities."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from script_loader import load_script

from echosim.validation.cases import read_cases

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT.parent / "shared" / "validation" / "cases.csv"


def _module():
    return load_script("benchmarks/tpu_generations.py")


@pytest.mark.skipif(not CASES.exists(), reason="needs ../shared/validation/cases.csv")
def test_attribution_identities() -> None:
    m = _module()
    case = next(c for c in read_cases(str(CASES)) if c["case_id"] == "tpurecipes-llama3-8b-bf16-v6e-16")
    a = m.attribution(case)
    assert a is not None and a["device"] == "tpu-v6e" and not a["moe"] and a["dtype"] == "bf16"
    # HFU is FLOPs over time: the two readings differ by exactly the ratio of the two steps
    assert math.isclose(a["hfu_predicted"] / a["hfu_measured"], 1 / (1 + a["error"]), rel_tol=1e-9)
    # exposing every collective can only lengthen the step; 16 chips of v6e (4 x 4) have no wrapped axis
    assert a["serial_error"] >= a["error"]
    assert math.isclose(a["serial_one_way_error"], a["serial_error"])
    # scaling the MXU time by mxu_factor meets the published step: predicted - mxu + mxu * f = measured
    predicted, measured = 1 + a["error"], 1.0  # in units of the published step
    mxu = a["mxu_share"] * predicted
    assert math.isclose(predicted - mxu + mxu * a["mxu_factor"], measured, rel_tol=1e-9)
    assert 0 < a["mxu_share"] + a["memory_share"] + a["comm_share"] <= 1 + 1e-9


def test_wrap_factor() -> None:
    m = _module()
    # v6e wraps only its full 16-chip axes: 16 x 16 both (x2), 8 x 16 one (x1.5), 8 x 8 none
    assert m.wrap_factor("tpu-v6e", 256) == 2.0
    assert m.wrap_factor("tpu-v6e", 128) == 1.5
    assert m.wrap_factor("tpu-v6e", 64) == 1.0
    # v5p wraps axes that are multiples of 4: 4 x 4 x 4 all three; one chip has no axis
    assert m.wrap_factor("tpu-v5p", 64) == 2.0
    assert m.wrap_factor("tpu-v5p", 1) == 1.0


def test_generations_keep_dense_16_bit_rows() -> None:
    m = _module()
    row = {"moe": False, "dtype": "bf16", "error": -0.1, "hfu_measured": 0.5, "hfu_predicted": 0.55,
           "serial_error": 0.05, "serial_one_way_error": 0.1, "mxu_factor": 1.2}  # fmt: skip
    rows = [
        {**row, "device": "tpu-v6e"},
        {**row, "device": "tpu-v6e", "error": -0.3, "mxu_factor": 1.4},
        {**row, "device": "tpu-v6e", "moe": True, "error": -0.9},  # MoE rows have their own cause
        {**row, "device": "tpu-v5p", "dtype": "int8", "error": 0.9},  # AQT int8 rows are not 16-bit
    ]
    g = m.generations(rows)
    assert list(g) == ["tpu-v6e"]
    assert g["tpu-v6e"]["rows"] == 2
    assert math.isclose(g["tpu-v6e"]["mape"], 0.2) and math.isclose(g["tpu-v6e"]["bias"], -0.2)
    assert (g["tpu-v6e"]["mxu_factor_min"], g["tpu-v6e"]["mxu_factor_max"]) == (1.2, 1.4)
