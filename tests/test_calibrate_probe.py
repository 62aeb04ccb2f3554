"""The machine-speed probe: stored with a calibration, compared later (`echosim calibrate --check`)."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from echosim.calibrate import probe
from echosim.calibrate.db import CalibrationError
from echosim.calibrate.store import CalibrationStore

THEN = {"matmul_s": 0.004, "stream_s": 0.006, "wall": {"matmul_s": 0.004, "stream_s": 0.006}, "repeats": 9}


@pytest.fixture(scope="module")
def cli() -> click.Group:
    from echosim.cli import cli as group
    from echosim.plugins import get_registry

    if "calibrate" not in group.commands:
        get_registry().add_commands(group)
    return group


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "cal.sqlite"
    store = CalibrationStore(path, create=True)
    store.save("probed", "cpu-x86", {"hostname": "box", "probe": THEN}, {"op_overhead_us": (3.0, "x")}, "test")
    store.save("old", "cpu-x86", {"hostname": "box"}, {"op_overhead_us": (3.0, "x")}, "test")
    store.close()
    return path


def test_the_probe_times_both_parts_on_one_thread_and_restores_the_threads() -> None:
    import torch

    before = torch.get_num_threads()
    result = probe.run_probe(repeats=3)
    assert torch.get_num_threads() == before
    assert result["repeats"] == 3
    for part in probe.PARTS:
        assert 0 < result[part] < 1.0 and 0 < result["wall"][part] < 1.0
    # one thread: the matmul's CPU time is at least its FLOPs at an implausible 1 TFLOP/s
    assert result["matmul_s"] > 2 * probe.MATMUL_DIM**3 / 1e12


def test_drift_is_each_parts_time_now_over_then_and_the_sum_of_both() -> None:
    now = {"matmul_s": 0.0044, "stream_s": 0.006}
    drift = probe.probe_drift(THEN, now)
    assert drift["matmul_s"] == pytest.approx(0.10)
    assert drift["stream_s"] == pytest.approx(0.0)
    assert drift["total"] == pytest.approx(0.0104 / 0.010 - 1)
    with pytest.raises(ValueError, match="lacks stream_s"):
        probe.probe_drift(THEN, {"matmul_s": 0.004})


def test_a_warning_only_beyond_the_limit_naming_the_part_and_its_sign() -> None:
    assert probe.drift_warning({"matmul_s": 0.09, "stream_s": -0.1, "total": 0.0}, "c") is None
    slow = probe.drift_warning({"matmul_s": 0.05, "stream_s": 0.25, "total": 0.2}, "c")
    assert slow and "memory (stream copy) 25% slower" in slow and "'c'" in slow
    fast = probe.drift_warning({"matmul_s": -0.3, "stream_s": 0.25, "total": 0.0}, "c")
    assert fast and "compute (matmul) 30% faster" in fast


def test_check_compares_with_the_stored_probe(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "run_probe", lambda **_: {"matmul_s": 0.005, "stream_s": 0.006})
    result = probe.check_calibration(f"{db}#probed")
    assert result["drift"]["matmul_s"] == pytest.approx(0.25)
    assert result["warning"] and "25% slower" in result["warning"]
    with pytest.raises(CalibrationError, match="stored no machine-speed probe"):
        probe.check_calibration(f"{db}#old")
    with pytest.raises(CalibrationError, match="not 'a100-sxm'"):
        probe.check_calibration(f"{db}#probed", "a100-sxm")


def test_the_check_command(db: Path, cli: click.Group, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "run_probe", lambda **_: {"matmul_s": 0.004, "stream_s": 0.0063})
    result = CliRunner().invoke(cli, ["calibrate", "--db", str(db), "--check", "probed"])
    assert result.exit_code == 0, result.output
    assert "stream_s" in result.output and "+5.0%" in result.output and "warning" not in result.output
    result = CliRunner().invoke(cli, ["calibrate", "--db", str(db), "--check", "probed", "--json"])
    assert json.loads(result.output)["drift"]["stream_s"] == pytest.approx(0.05)
    result = CliRunner().invoke(cli, ["calibrate", "--db", str(db), "--check", "old"])
    assert result.exit_code == 1 and result.output.count("\n") == 1 and "calibrate again" in result.output
    result = CliRunner().invoke(cli, ["calibrate", "--db", str(db), "--check", "nope"])
    assert result.exit_code == 1 and "no calibration named 'nope'" in result.output


def test_a_calibrations_probe_is_the_mean_of_one_at_its_start_and_one_at_its_end() -> None:
    end = {"matmul_s": 0.006, "stream_s": 0.008, "wall": {"matmul_s": 0.007, "stream_s": 0.009}, "repeats": 9}
    both = probe.bracket(THEN, end)
    assert both["matmul_s"] == pytest.approx(0.005) and both["stream_s"] == pytest.approx(0.007)
    assert both["wall"]["matmul_s"] == pytest.approx(0.0055) and both["repeats"] == 18
    assert both["start"] is THEN and both["end"] is end
    assert probe.probe_drift(both, {"matmul_s": 0.005, "stream_s": 0.007}) == pytest.approx(
        {"matmul_s": 0.0, "stream_s": 0.0, "total": 0.0}
    )


def test_the_probe_runs_on_the_threads_it_is_given_timed_by_the_wall_clock_on_several() -> None:
    import torch

    before = torch.get_num_threads()
    result = probe.run_probe(repeats=3, threads=2)
    assert torch.get_num_threads() == before and result["threads"] == 2
    for part in probe.PARTS:  # several threads: the part's time is its wall time (CPU time adds up over them)
        assert result[part] == result["wall"][part]
    assert probe.run_probe(repeats=3)["threads"] == 1
    with pytest.raises(ValueError, match="at least one thread"):
        probe.run_probe(threads=0)


def test_probes_on_different_thread_counts_are_not_compared(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="on 1 and 2 thread"):
        probe.probe_drift(THEN, {"matmul_s": 0.004, "stream_s": 0.006, "threads": 2})
    # --check times the probe on the threads the calibration's probe ran on
    store = CalibrationStore(db)
    store.save("two", "cpu-x86", {"probe": {**THEN, "threads": 2}}, {"op_overhead_us": (3.0, "x")}, "test")
    store.close()
    asked: list[int] = []

    def fake(threads: int = 1, **_: object) -> dict[str, object]:
        asked.append(threads)
        return {"matmul_s": 0.004, "stream_s": 0.006, "threads": threads}

    monkeypatch.setattr(probe, "run_probe", fake)
    assert probe.check_calibration(f"{db}#two")["drift"]["matmul_s"] == pytest.approx(0.0)
    assert asked == [2]
    assert probe.bracket({**THEN, "threads": 2}, {**THEN, "threads": 2})["threads"] == 2
