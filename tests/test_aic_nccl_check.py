"""NVIDIA aiconfigurator's nccl-tests tables (benchmarks/data/aic_nccl_perf.csv) through echosim's collective model:
the rows are read as their collector ran them, and the check's figures are the ones benchmarks/aic_nccl_check.md
quotes, so a change to the collective model shows here."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from script_loader import load_check

from echosim.validation.microbench import harness_nccl, probe

ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT / "benchmarks" / "data" / "aic_nccl_perf.csv"


def _rows() -> list[dict[str, str]]:
    with CSV.open() as f:
        return list(csv.DictReader(f))


def test_rows_are_one_thread_per_gpu_nccl_tests_on_one_node() -> None:
    rows = _rows()
    assert len(rows) == 1176  # 5 systems x 4 ops x 21 sizes x (3 GPU counts; GB200: 2)
    devices = {r["device"] for r in rows}
    assert devices == {"NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA B200", "NVIDIA GB200"}
    for r in rows[:: len(rows) // 40]:
        p = probe(r)
        assert not isinstance(p, str), (r, p)
        assert p.scope == "intra-node"
        nccl = harness_nccl(r)
        assert nccl.devices_per_thread == 1 and nccl.algo == "" and nccl.nvls  # -t: the tuner's own choice
    gb200 = next(r for r in rows if r["device"] == "NVIDIA GB200")
    assert probe(gb200).backend == "gb200"  # not the B200 its name contains


def test_check_figures() -> None:
    """The note's table: all 1,176 rows 18.8 % / -3.3 %; under 64 KiB 23.7 % / -13.3 %; from 1 MiB 14.0 % / +3.1 %."""
    out = load_check("benchmarks/aic_nccl_check.py").report()
    assert out["all"][0] == 1176
    assert out["all"][1] == pytest.approx(0.188, abs=0.002) and out["all"][2] == pytest.approx(-0.033, abs=0.002)
    assert out["all | <64KiB"][1] == pytest.approx(0.237, abs=0.002)
    assert out["all | >=1MiB"][1] == pytest.approx(0.140, abs=0.002)
