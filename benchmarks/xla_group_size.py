"""Where XLA's collective table misses at >= 1 MiB: the size of the group, not the message. An analysis.

Issue 16: five of the XLA-table collective groups of at least 1 MiB miss their 12 % target (H100 all-reduce and
reduce-scatter, B200 all-gather, all-reduce and reduce-scatter). Each of those groups mixes three layouts of the
same eight GPUs: one group of 8, two concurrent groups of 4 and four concurrent groups of 2 (the table's
``N group(s) of M devices``). This script splits every such group by its group size and prints

* the MAPE of each part and how many of its rows echosim predicts too fast (a bandwidth above the measured one,
  or a time below it), against the group's target;
* at the bandwidth plateau (>= 128 MiB), the median measured and predicted bus bandwidth per group size, their
  ratio, and ``shard GB/s``: the time the measurement takes beyond echosim's, per byte of one rank's shard (the
  message over the group size), as a rate. A cost paid once per byte of the shard, outside the ring's pipelined
  transfer, would keep that rate the same for every group size; a cost of the links would not show at all in
  the all-to-alls (NCCL point-to-point over the same NVLink, no ring).

echosim's bus bandwidth at these sizes does not depend on the group size, nor does NCCL's tuner (the ring
search of ``src/graph/search.cc`` picks a speed per GPU from ``sm90SpeedArrayIntra`` / ``sm100SpeedArrayIntra``
and the NVLink of that GPU; nothing in it counts the ranks). The measured rings do. Nothing here changes a
prediction.

    PYTHONPATH=. python benchmarks/xla_group_size.py [--microbench ../shared/validation/microbench.csv]
"""

from __future__ import annotations

import argparse
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from echosim.validation.microbench import XLA_TABLE, RowResult, read_rows, validate_microbench

MICROBENCH = Path(__file__).resolve().parents[2] / "shared" / "validation" / "microbench.csv"
PLATEAU_BYTES = 128 * 2**20
GROUP = re.compile(r"(\d+) group\(s\) of (\d+) devices")


def group_size(shape: str) -> int | None:
    """Devices in each of the row's concurrent groups (``[256] 4 group(s) of 2 devices (iota 8)`` -> 2)."""
    m = GROUP.search(shape)
    return int(m.group(2)) if m else None


def too_fast(r: RowResult) -> bool:
    """The prediction is faster than the measurement: a higher bandwidth or a shorter time."""
    assert r.error is not None
    return r.error > 0 if r.metric.startswith("busbw") else r.error < 0


Rows = list[tuple[RowResult, dict[str, str], int]]


def table_rows(results: list[RowResult], raw: dict[int, dict[str, str]]) -> Rows:
    """The predicted XLA-table rows of a collective over groups (not the permutes), with raw row and group size."""
    out = []
    for r in results:
        row = raw.get(r.line)
        if r.error is None or row is None or XLA_TABLE not in row["source"]:
            continue
        n = group_size(row["shape"])
        if n is not None:
            out.append((r, row, n))
    return out


def split_by_size(rows: Rows) -> dict[str, dict[int, dict[str, Any]]]:
    """Per >= 1 MiB group: MAPE, row count and rows predicted too fast, per group size."""
    errs: dict[str, dict[int, list[RowResult]]] = defaultdict(lambda: defaultdict(list))
    for r, _, n in rows:
        if ">=1MiB" in r.group:
            errs[r.group][n].append(r)
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for group, by_n in sorted(errs.items()):
        out[group] = {
            n: {
                "rows": len(rs),
                "mape": statistics.mean(abs(r.error or 0.0) for r in rs),
                "too_fast": sum(too_fast(r) for r in rs),
            }
            for n, rs in sorted(by_n.items())
        }
    return out


def shard_rate_GBps(op: str, n: int, size_bytes: int, measured_busbw: float, predicted_busbw: float) -> float | None:
    """The measured step's time beyond echosim's, per byte of one rank's shard (``size_bytes / n``), as GB/s;
    None where the measurement is not slower. Bus bandwidth converts to time with nccl-tests' factors."""
    factor = 2 * (n - 1) / n if op == "all-reduce" else (n - 1) / n
    extra_s = size_bytes * factor / 1e9 * (1 / measured_busbw - 1 / predicted_busbw)
    return size_bytes / n / extra_s / 1e9 if extra_s > 0 else None


def plateau(rows: Rows) -> dict[tuple[str, str, int], dict[str, Any]]:
    """Per (device, op, n), over the busbw rows >= PLATEAU_BYTES: median measured and predicted bus bandwidth
    (GB/s), their ratio and the median :func:`shard_rate_GBps` of the rows slower than predicted (None unless
    the median row is: a rate read off a few slow rows among faster ones says nothing)."""
    acc: dict[tuple[str, str, int], list[tuple[float, float, int]]] = defaultdict(list)
    for r, row, n in rows:
        if r.metric.startswith("busbw") and int(row["size_bytes"]) >= PLATEAU_BYTES:
            assert r.measured is not None and r.predicted is not None
            acc[(r.device, row["op"], n)].append((r.measured, r.predicted, int(row["size_bytes"])))
    out: dict[tuple[str, str, int], dict[str, Any]] = {}
    for (device, op, n), v in sorted(acc.items()):
        ratio = statistics.median(m / p for m, p, _ in v)
        rates = [x for m, p, size in v if (x := shard_rate_GBps(op, n, size, m, p)) is not None]
        out[(device, op, n)] = {
            "rows": len(v),
            "measured": statistics.median(m for m, _, _ in v),
            "predicted": statistics.median(p for _, p, _ in v),
            "ratio": ratio,
            "shard_GBps": statistics.median(rates) if rates and ratio < 1 else None,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--microbench", default=str(MICROBENCH))
    args = ap.parse_args()
    raw = dict(read_rows(args.microbench))
    validation = validate_microbench(args.microbench)
    groups = validation.groups()
    rows = table_rows(validation.rows, raw)

    print("XLA-table collectives >= 1 MiB, split by group size (MAPE, rows, rows echosim predicts too fast)\n")
    print(f"{'group':62s} {'target':>6s}  {'all':>17s}  by group size")
    for group, by_n in split_by_size(rows).items():
        g = groups[group]
        parts = "  ".join(f"{n}: {d['mape']:5.1%} ({d['rows']}, {d['too_fast']} fast)" for n, d in by_n.items())
        label = group.replace(" | XLA table", "")
        print(f"{label:62s} {g['target'] or 0:6.0%}  {g['mape']:6.1%} ({g['rows']} rows)  {parts}")

    print(f"\nBus bandwidth at >= {PLATEAU_BYTES >> 20} MiB, medians, GB/s (measured / echosim = ratio)\n")
    head = f"{'device':24s} {'op':16s} {'n':>3s} {'rows':>4s} {'measured':>9s} {'echosim':>8s} {'ratio':>6s}"
    print(f"{head} {'shard GB/s':>10s}")
    for (device, op, n), d in plateau(rows).items():
        shard = "-" if d["shard_GBps"] is None else f"{d['shard_GBps']:.0f}"
        rates = f"{d['measured']:9.0f} {d['predicted']:8.0f} {d['ratio']:6.2f} {shard:>10s}"
        print(f"{device:24s} {op:16s} {n:3d} {d['rows']:4d} {rates}")


if __name__ == "__main__":
    main()
