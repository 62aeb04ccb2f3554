"""benchmarks/cpu_reality_runs.py: every stored row-order run of the CPU reality check, summarised."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from script_loader import load_script

runs_script = load_script("benchmarks/cpu_reality_runs.py")


def _run(path: Path, order: str, errors: list[float]) -> None:
    rows = [{"model": f"m{i}", "layout": "DDP x2 (gloo)" if i % 2 else "1 process", "error": e}
            for i, e in enumerate(errors)]  # fmt: skip
    path.write_text(json.dumps({"order": order, "rows": [*rows, {"model": "x", "layout": "1 process", "error": None}]}))


def test_runs_are_the_row_order_ones_in_the_order_taken(tmp_path: Path) -> None:
    _run(tmp_path / "cpu_reality_s9.json", "row", [0.05])
    _run(tmp_path / "cpu_reality_s13b.json", "row", [0.1])
    _run(tmp_path / "cpu_reality_s13.json", "row", [-0.2])
    _run(tmp_path / "cpu_reality_s12.json", "model", [0.3])  # one calibration for every row: not this method
    stored = runs_script.runs(tmp_path)
    assert [name for name, _ in stored] == ["cpu_reality_s9.json", "cpu_reality_s13.json", "cpu_reality_s13b.json"]
    assert all(len(rows) == 1 for _, rows in stored)  # a row without an error (not measured) is left out


def test_summary_counts_the_errors() -> None:
    rows = [{"error": e} for e in (-0.3, 0.1, 0.05, -0.02)]
    n, mae, mean, worst, within = runs_script.summary(rows)
    assert (n, worst, within) == (4, -0.3, 3)
    assert mae == pytest.approx(0.1175) and mean == pytest.approx(-0.0425)
    assert runs_script.kind("DDP x2 (gloo)") == "DDP x2" and runs_script.kind("1 process (all cores)") == (
        "1 process (all cores)"
    )


def test_the_stored_runs_are_the_readmes() -> None:
    """The README quotes the script's figures over the runs kept in benchmarks/data."""
    stored = runs_script.runs(runs_script.DATA)
    every = [r for _, rows in stored for r in rows]
    n, mae, mean, _, within = runs_script.summary(every)
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert f"| all {len(stored)} runs | {n} | {mae * 100:.1f}% | {mean * 100:+.1f}% |" in readme
    assert f"{within} ({within / n:.0%}) |" in readme
