"""Smoke test of benchmarks/cpu_reality.py's pieces (the full run is a benchmark, not a test)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from script_loader import load_script

from echosim.calibrate.store import CalibrationStore
from echosim.frontend.zoo import ArchConfig

ROOT = Path(__file__).resolve().parents[1]
TINY = ArchConfig("llama", layers=2, hidden=32, heads=2, kv_heads=1, ffn=64, vocab=64, seq_len=16)


@pytest.fixture(scope="module")
def reality():
    return load_script("benchmarks/cpu_reality.py")


def test_layouts_map_to_plans(reality):
    plans = {layout: reality.plan_for(TINY, layout) for layout in reality.LAYOUTS}
    assert plans["1 process"][0].dp == 1 and plans["1 process"][1] == 1
    assert plans["DDP x2 (gloo)"][0].dp == 2 and plans["DDP x2 (gloo)"][0].global_batch == 2 * reality.BATCH
    pipeline, devices = plans["pipeline x2 (gloo)"]
    assert (pipeline.pp, pipeline.schedule, devices) == (2, "1f1b", 2)
    assert pipeline.microbatches == reality.PIPELINE_MICROBATCHES
    assert not reality.applicable(TINY.with_(arch="gpt"), "pipeline x2 (gloo)")
    all_cores, devices = plans[reality.ALL_CORES]
    assert (all_cores.dp, all_cores.global_batch, devices) == (1, reality.BATCH, 1)


def test_each_layout_runs_and_is_predicted_with_its_own_ranks_and_threads(reality):
    cores = len(os.sched_getaffinity(0))
    assert [reality.threads_of(x) for x in reality.LAYOUTS] == [1, cores, 1, 1]
    assert [reality.ranks_of(x) for x in reality.LAYOUTS] == [1, 1, 2, 2]
    assert [reality.calibration_key(x) for x in reality.LAYOUTS] == [1, "all", 2, 2]
    assert not any("," in x for x in reality.LAYOUTS)  # --layouts is comma-separated
    # issue 16's shapes beside the first four: wider, deeper and a longer sequence, none with a tensor at glibc's
    # 32 MiB mmap threshold (the logits are the largest)
    shapes = reality.MODELS
    assert shapes["gpt-4L-512"].hidden == 2 * shapes["gpt-4L-256"].hidden
    assert shapes["llama-8L-256"].layers == 2 * shapes["llama-4L-256"].layers
    assert shapes["llama-4L-256-s1024"].seq_len == 4 * shapes["llama-4L-256"].seq_len
    for cfg in shapes.values():
        assert reality.BATCH * cfg.seq_len * cfg.vocab * 4 < 32 * 2**20


def test_prediction_uses_the_calibration(reality, tmp_path):
    db = tmp_path / "c.sqlite"
    store = CalibrationStore(db, create=True)
    store.save("slow", "cpu-x86", {}, {"op_overhead_us": (50.0, "test")}, "test")
    store.save("fast", "cpu-x86", {}, {"op_overhead_us": (1.0, "test")}, "test")
    store.close()
    slow = reality.predict(TINY, "DDP x2 (gloo)", f"{db}#slow")["step_time_s"]
    fast = reality.predict(TINY, "DDP x2 (gloo)", f"{db}#fast")["step_time_s"]
    assert slow > 5 * fast > 0


@pytest.mark.parametrize("layout", ["1 process", "1 process (all cores)"])
def test_one_real_training_step(reality, monkeypatch, layout):
    import torch

    monkeypatch.setitem(reality.MODELS, "tiny", TINY)
    monkeypatch.setattr(reality, "BATCH", 2)
    before = torch.get_num_threads()
    try:
        result = reality.worker("tiny", layout, 0, 1, 0, steps=2)
        assert torch.get_num_threads() == reality.threads_of(layout)
    finally:
        torch.set_num_threads(before)
    assert len(result["steps"]) == 2 and all(s > 0 for s in result["steps"])
    assert 0 < result["cpu_share"] <= 1.5 * reality.threads_of(layout)


def _run_main(monkeypatch, script, argv: list[str], **fakes: object) -> None:
    """Run a reality script's ``main`` with ``argv`` and its calibrate / measure / predict steps faked."""
    for name, fake in fakes.items():
        monkeypatch.setattr(script, name, fake)
    monkeypatch.setattr(sys, "argv", argv)
    script.main()


def test_order_row_calibrates_each_row_just_before_it(reality, monkeypatch, tmp_path):
    """``--order row``: every row's layout is calibrated again right before the row is measured, and the row is
    predicted with that calibration (this VM's speed drifts by tens of percent within the minutes of a run)."""
    db = tmp_path / "c.sqlite"
    events: list[str] = []

    def fake_calibrate(database, sweep, tag="", keys=(1, 2)):
        store = CalibrationStore(db, create=True)
        name = f"cal{tag}"
        store.save(name, "cpu-x86", {}, {"op_overhead_us": (1.0 + len(events), "test")}, "test")
        store.close()
        events.append(f"calibrate {name}")
        return {key: f"{db}#{name}" for key in keys}

    def fake_measure(name, layout, steps):
        events.append(f"measure {name}")
        return reality.Measured(1.0, 1.0, [1.0], 0.0, 0.0, 0.0)

    def fake_predict(cfg, layout, calibration):
        events.append(f"predict {calibration.split('#')[1]}")
        return {"step_time_s": 1.0, "breakdown": {}}

    monkeypatch.setitem(reality.MODELS, "tiny", TINY)
    monkeypatch.setitem(reality.MODELS, "tiny2", TINY.with_(layers=4))
    out = tmp_path / "rows.json"
    argv = ["cpu_reality.py", "--models", "tiny,tiny2", "--layouts", "1 process", "--order", "row", "--out", str(out)]
    _run_main(monkeypatch, reality, argv, calibrate=fake_calibrate, measure=fake_measure, predict=fake_predict)
    assert events == [
        "calibrate cal-row0", "measure tiny", "predict cal-row0",
        "calibrate cal-row1", "measure tiny2", "predict cal-row1",
    ]  # fmt: skip
    rows = json.loads(out.read_text())["rows"]
    assert [r["calibration"].split("#")[1] for r in rows] == ["cal-row0", "cal-row1"]


def _nonllm_script() -> Any:
    """benchmarks/cpu_reality_nonllm.py as a module (it imports cpu_reality from benchmarks/)."""
    return load_script("benchmarks/cpu_reality_nonllm.py")


def test_nonllm_order_row_calibrates_each_rows_ranks_just_before_it(monkeypatch, tmp_path):
    """cpu_reality_nonllm.py ``--order row``: the row's calibrations (its layout's ranks only) are made just
    before its runs and predict it."""
    nonllm = _nonllm_script()
    events: list[str] = []

    def fake_calibrate(database, sweep, tag="", keys=(1, 2)):
        events.append(f"calibrate{tag} {keys}")
        return {key: f"cal{tag}" for key in keys}

    def fake_measure(name, layout, steps, optimizer):
        events.append(f"measure {layout}")
        return nonllm.Measured(1.0, 1.0, [1.0, 1.0], 0.0, 0.0, 0.0)

    def fake_predict(name, layout, calibration):
        events.append(f"predict {calibration}")
        return {"step_time_s": 1.0, "breakdown": {}}

    out = tmp_path / "rows.json"
    argv = ["x", "--order", "row", "--calibrations", "1", "--repeats", "1", "--out", str(out)]
    _run_main(monkeypatch, nonllm, argv, MODELS={"m": None}, calibrate=fake_calibrate, measure=fake_measure,
              predict=fake_predict, calibration_probe=lambda ref: None, drift_of=lambda ref, probe: None)  # fmt: skip
    assert events == [
        "calibrate-row0-0 (1,)", "measure 1 process", "predict cal-row0-0",
        "calibrate-row1-0 (2,)", "measure DDP x2 (gloo)", "predict cal-row1-0",
    ]  # fmt: skip
    rows = json.loads(out.read_text())["rows"]
    assert [r["calibrations"] for r in rows] == [["cal-row0-0"], ["cal-row1-0"]]


def test_nonllm_models_and_layouts_pick_the_rows_run(monkeypatch, tmp_path):
    """cpu_reality_nonllm.py ``--models`` / ``--layouts``: only the named rows are calibrated, run and predicted."""
    nonllm = _nonllm_script()
    events: list[str] = []

    def fake_calibrate(database, sweep, tag="", keys=(1, 2)):
        return {key: f"cal{tag}" for key in keys}

    def fake_measure(name, layout, steps, optimizer):
        events.append(f"measure {name} / {layout}")
        return nonllm.Measured(1.0, 1.0, [1.0, 1.0], 0.0, 0.0, 0.0)

    out = tmp_path / "rows.json"
    argv = ["x", "--order", "row", "--calibrations", "1", "--repeats", "1", "--models", "b",
            "--layouts", "1 process", "--out", str(out)]  # fmt: skip
    _run_main(monkeypatch, nonllm, argv, MODELS={"a": None, "b": None}, calibrate=fake_calibrate,
              measure=fake_measure, predict=lambda name, layout, calibration: {"step_time_s": 1.0, "breakdown": {}},
              calibration_probe=lambda ref: None, drift_of=lambda ref, probe: None)  # fmt: skip
    assert events == ["measure b / 1 process"]
    assert [(r["model"], r["layout"]) for r in json.loads(out.read_text())["rows"]] == [("b", "1 process")]


def test_a_dead_worker_is_measured_again_then_skipped(reality, monkeypatch, capsys):
    """A worker that dies is run again once; a second death skips the row with one line, not a traceback."""
    calls: list[str] = []

    def flaky(name, layout, steps):
        calls.append(name)
        if name == "dead" or len(calls) == 1:
            raise RuntimeError(f"{name} / {layout}: a worker failed")
        return reality.Measured(1.0, 1.0, [1.0], 0.0, 0.0, 0.0)

    monkeypatch.setattr(reality, "measure", flaky)
    assert reality.measure_or_retry("ok", "pipeline x2 (gloo)", 1) is not None
    assert calls == ["ok", "ok"]
    assert reality.measure_or_retry("dead", "pipeline x2 (gloo)", 1) is None
    err = capsys.readouterr().err
    assert "measuring it again" in err and "row skipped" in err and "Traceback" not in err
