"""benchmarks/collective_floors.py: the hindsight-constant oracle that bounds what any floor rule can reach."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest
from script_loader import load_script

from echosim.validation.microbench import COLUMNS

ROOT = Path(__file__).resolve().parents[1]


def _module():
    return load_script("benchmarks/collective_floors.py")


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


def test_series_floors_gives_each_series_its_median_floor_and_the_models(tmp_path):
    path = tmp_path / "mb.csv"
    # one series scored on time (8 ranks), one on bus bandwidth (4 ranks)
    rows = [_row(1024, 30.0), _row(4096, 50.0), _row(8192, 40.0), _row(2**30, 4700.0)]
    bw = _row(1024, 1.0, "busbw_GBps")
    bw["shape"] = "[256] 2 group(s) of 4 devices (iota 8)"
    bw["num_devices"] = "4"
    bw["value"] = str(1024 * 2 * 3 / 4 / 40.0 / 1e3)  # 40 µs on 4 ranks: busbw = size x 2(n-1)/n / time
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows([*rows, bw])
    series = _module().series_floors(path, 64 * 1024)
    assert len(series) == 2
    by_devices = {key[2]: g for key, g in series.items()}
    eight, four = by_devices["8"], by_devices["4"]
    assert eight["rows"] == 3 and eight["measured_us"] == pytest.approx(40.0)  # median of 30, 50, 40
    assert four["rows"] == 1 and four["measured_us"] == pytest.approx(40.0)
    # the model's floor for the same rows, its bus bandwidth turned back into time: a few tens of µs
    assert 5.0 < eight["echosim_us"] < 100.0 and 5.0 < four["echosim_us"] < 100.0
    assert eight["echosim_us"] > four["echosim_us"]  # a longer ring has the higher floor


def test_series_flag_prints_one_line_per_series(tmp_path, capsys, monkeypatch):
    path = tmp_path / "mb.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows([_row(1024, 30.0), _row(4096, 50.0)])
    module = _module()
    monkeypatch.setattr(sys, "argv", ["collective_floors.py", "--microbench", str(path), "--series"])
    module.main()
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and "H100-SXM (sm_90) | all-reduce | 8 x 1" in out[2] and "40.0" in out[2]


def test_the_monotone_oracle_follows_a_rising_floor_but_not_noise():
    monotone = _module()._monotone_mape
    # a floor that rises with size is fitted exactly; a constant could not
    assert monotone([(1024, 10.0, False), (4096, 20.0, False), (8192, 40.0, False)]) == pytest.approx(0.0)
    # a spike among flat rows stays an error: 60 µs between two 30 µs rows costs 50% on that row
    assert monotone([(1024, 30.0, False), (4096, 60.0, False), (8192, 30.0, False)]) == pytest.approx(0.5 / 3)
    # rows of one size share one prediction
    assert monotone([(1024, 20.0, False), (1024, 40.0, False)]) == pytest.approx(0.5 / 2)


def test_floors_can_score_the_monotone_oracle(tmp_path):
    path = tmp_path / "mb.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows([_row(1024, 30.0), _row(4096, 30.0), _row(8192, 60.0)])
    module = _module()
    constant = module.floors(path, 64 * 1024)["H100-SXM (sm_90) | all-reduce | XLA table"]["oracle"]
    rising = module.floors(path, 64 * 1024, monotone=True)["H100-SXM (sm_90) | all-reduce | XLA table"]["oracle"]
    assert constant == pytest.approx(0.5 / 3) and rising == pytest.approx(0.0)


def test_the_form_fit_recovers_a_series_built_from_its_own_form(tmp_path):
    """Rows made from a + S/b + 2 sqrt(S h / b) with grid values come back with those values and no error."""
    a, b, h = 25.0, 369.0, 2.0
    rows = []
    for size in (2**20, 2**24, 2**28, 2**31):
        link = size * 7 / 4  # all-reduce over 8 ranks: 2 (n-1)/n of the buffer per link
        rows.append(_row(size, a + link / (b * 1e3) + 2 * (link * h / (b * 1e3)) ** 0.5))
    rows.append(_row(1024, 30.0))  # under --min-bytes: left out
    path = tmp_path / "mb.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    groups, fits = _module().form_fits(path, 2**20)
    (fit,) = fits.values()
    assert fit["rows"] == 4 and fit["mape"] < 0.01
    assert fit["a_us"] == a and fit["h_us"] == h and fit["b_GBps"] == pytest.approx(b, rel=0.05)
    g = groups["H100-SXM (sm_90) | all-reduce | XLA table"]
    assert g["rows"] == 4 and g["oracle"] < 0.01 and g["echosim"] > 0
