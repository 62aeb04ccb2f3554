"""Fuzzing in the suite: a few inputs of each kind benchmarks/fuzz.py feeds by the thousand.

Each input (a mutated or truncated cases/microbench CSV, [tool.echosim] table, calibration
database, ONNX model, transformers config, Megatron-LM launch line, a random or legal layout, or a
small DLRM's tables sharded a random way)
must end in a result or a one-line error: never a traceback, a hang or a report that breaks a
physical invariant.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("echosim_fuzz", ROOT / "benchmarks" / "fuzz.py")
assert _spec is not None and _spec.loader is not None
fuzz = importlib.util.module_from_spec(_spec)
sys.modules["echosim_fuzz"] = fuzz
_spec.loader.exec_module(fuzz)

CHEAP = [
    "cases",
    "microbench",
    "tool-echosim",
    "calibration-db",
    "onnx",
    "megatron-config",
    "maxtext-config",
    "deepspeed-config",
    "nemo-config",
    "valid-layouts",
]
FAST = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


def ends_cleanly(target: str, seed: int, limit_s: float = 30.0) -> None:
    outcome, detail = fuzz.fuzz_one(target, seed, limit_s)
    assert outcome in ("result", "error"), f"{target} seed {seed}: {outcome}: {detail}"


@pytest.mark.parametrize("target", CHEAP)
@FAST
@given(seed=st.integers(0, 2**32))
def test_mutated_inputs_end_in_a_result_or_one_line(target: str, seed: int) -> None:
    ends_cleanly(target, seed)


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(seed=st.integers(0, 2**32))
def test_mutated_transformers_configs_end_in_a_config_or_one_line(seed: int) -> None:
    pytest.importorskip("transformers")
    ends_cleanly("hf-config", seed)


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(seed=st.integers(0, 2**32))
def test_sharded_embedding_tables_end_in_a_sound_report_or_one_line(seed: int) -> None:
    ends_cleanly("embeddings", seed)


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(seed=st.integers(0, 2**32))
def test_random_layouts_end_in_a_sound_report_or_one_line(seed: int) -> None:
    ends_cleanly("layouts", seed, limit_s=120.0)


def test_the_fuzzer_tells_a_traceback_from_a_one_line_error() -> None:
    from echosim.errors import EchosimError

    def fail() -> None:
        raise KeyError("x")

    def refuse() -> None:
        raise EchosimError("one line")

    assert fuzz.attempt(fail, 5)[0] == "traceback"
    assert fuzz.attempt(refuse, 5) == ("error", "one line")
    assert fuzz.attempt(lambda: None, 5) == ("result", "")


@pytest.mark.parametrize(
    ("target", "seed"),
    [
        ("calibration-db", 141),
        ("onnx", 323),
        ("onnx", 546),
        ("hf-config", 58),
        ("hf-config", 386),
        ("microbench", 2000354),
        ("layouts", 4000812),
        ("calibration-db", 4001367),
        ("tool-echosim", 11000051),
    ],
)
def test_inputs_the_fuzzer_once_broke_end_cleanly(target: str, seed: int) -> None:
    """Found by ``benchmarks/fuzz.py --n 1500``: a parameter row without a name (AttributeError), an ONNX
    Gather of a weight by ids no node defines (an embedding with one input broke autodiff), a transformers
    config whose model_type is a list or an object (TypeError: unhashable), a collective row of 0 bytes
    (ZeroDivisionError), a layout whose meta shapes overflow torch's storage size (ShapeProp's error
    spans lines and its traceback was printed), a [tool.echosim] table load_config accepts (the fuzzer's
    own unpacking), a measured row whose shape is NULL (the extrapolation check's size parser)."""
    ends_cleanly(target, seed, limit_s=120.0)
