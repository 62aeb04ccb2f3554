"""benchmarks/xla_group_size.py: group sizes parse, the split adds up to validate's groups, the shard rate is a rate."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
from script_loader import load_script

from echosim.validation.microbench import XLA_TABLE, read_rows, validate_microbench

MICROBENCH = Path(__file__).resolve().parents[2] / "shared" / "validation" / "microbench.csv"


def _module():
    return load_script("benchmarks/xla_group_size.py")


def test_group_size() -> None:
    m = _module()
    assert m.group_size("[256] 4 group(s) of 2 devices (iota 8)") == 2
    assert m.group_size("[268435456] 1 group(s) of 72 devices (iota 72)") == 72
    assert m.group_size("[134217728] pattern pairs[target: 1;source: 1 target: 2]") is None


def test_shard_rate() -> None:
    m = _module()
    # all-gather over 2 ranks moves half the output: 1 GB at 500 GB/s busbw takes 1 ms, at 250 GB/s 2 ms;
    # the extra millisecond over a 0.5 GB shard is 500 GB/s
    assert math.isclose(m.shard_rate_GBps("all-gather", 2, 10**9, 250.0, 500.0), 500.0)
    # all-reduce over 4 ranks: bus factor 2 x 3/4; 4 GB at 600 -> 10 ms, at 400 -> 15 ms; 1 GB shard in 5 ms
    assert math.isclose(m.shard_rate_GBps("all-reduce", 4, 4 * 10**9, 400.0, 600.0), 200.0)
    assert m.shard_rate_GBps("all-gather", 8, 10**9, 600.0, 500.0) is None  # measured faster: no extra time


@pytest.mark.skipif(not MICROBENCH.exists(), reason="needs ../shared/validation/microbench.csv")
def test_split_adds_up_to_validate_groups(tmp_path: Path) -> None:
    m = _module()
    # the B200 XLA-table all-gathers (every group size, both regimes): a file of their own keeps the test short
    with MICROBENCH.open(newline="") as f:
        reader = csv.DictReader(f)
        keep = [r for r in reader if XLA_TABLE in r["source"] and r["device"].startswith("B200")]
        keep = [r for r in keep if r["op"] == "all-gather"]
        assert keep, "the table's B200 all-gather rows are gone"
        path = tmp_path / "ag.csv"
        with path.open("w", newline="") as out:
            w = csv.DictWriter(out, fieldnames=reader.fieldnames or [])
            w.writeheader()
            w.writerows(keep)
    v = validate_microbench(path)
    rows = m.table_rows(v.rows, dict(read_rows(path)))
    assert {n for _, _, n in rows} == {2, 4, 8}
    split = m.split_by_size(rows)
    groups = v.groups()
    assert split and all(">=1MiB" in g for g in split)
    for group, by_n in split.items():
        total = sum(d["rows"] for d in by_n.values())
        assert total == groups[group]["rows"]
        mape = sum(d["mape"] * d["rows"] for d in by_n.values()) / total
        assert math.isclose(mape, groups[group]["mape"], rel_tol=1e-12)
        assert all(0 <= d["too_fast"] <= d["rows"] for d in by_n.values())
    for (device, op, n), d in m.plateau(rows).items():
        assert device.startswith("B200") and op == "all-gather" and n in (2, 4, 8)
        assert d["rows"] >= 1 and math.isclose(d["ratio"], d["measured"] / d["predicted"], rel_tol=0.2)
        assert d["shard_GBps"] is None or (d["ratio"] < 1 and d["shard_GBps"] > 0)
