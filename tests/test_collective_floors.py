"""benchmarks/collective_floors.py: the hindsight-constant oracle that bounds what any floor rule can reach."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

import pytest

from echosim.validation.microbench import COLUMNS

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("collective_floors", ROOT / "benchmarks" / "collective_floors.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("collective_floors", module)
    spec.loader.exec_module(module)
    return module


def _row(size: int, value: float, metric: str = "time_us") -> dict[str, str]:
    return {
        "source": "https://github.com/openxla/xla/blob/x/default_collective_perf_table.txtpb",
        "device": "H100-SXM (sm_90)",
        "system": "single node NVLink",
        "op": "all-reduce",
        "dtype": "f32",
        "shape": f"[{size // 4}] 1 group(s) of 8 devices (iota 8)",
        "size_bytes": str(size),
        "num_devices": "8",
        "num_nodes": "1",
        "metric": metric,
        "value": str(value),
        "notes": "",
    }


def test_the_oracle_is_the_best_constant_in_each_rows_own_metric():
    oracle = _module()._oracle_mape
    assert oracle([(20.0, False), (20.0, False), (40.0, False)]) == pytest.approx(0.5 / 3)
    # on bus bandwidth a row twice as slow as the constant is 50% off, one twice as fast 100%
    assert oracle([(20.0, True), (40.0, True)]) == pytest.approx(0.5 / 2)


def test_floors_scores_echosim_and_the_oracle_per_group(tmp_path):
    path = tmp_path / "mb.csv"
    rows = [_row(1024, 30.0), _row(4096, 30.0), _row(8192, 60.0), _row(2**30, 4700.0)]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    groups = _module().floors(path, 64 * 1024)
    g = groups["H100-SXM (sm_90) | all-reduce | XLA table"]
    assert g["rows"] == 3  # the 1 GiB row is off the floor
    assert g["oracle"] == pytest.approx(0.5 / 3) and g["echosim"] > 0
