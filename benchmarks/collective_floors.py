"""How close any model can come on small collectives: the scatter of the measured floors themselves.

Usage::

    python benchmarks/collective_floors.py [--microbench ../shared/validation/microbench.csv] [--max-bytes 65536]
    python benchmarks/collective_floors.py --series   # one line per series: measured floor vs echosim's
    python benchmarks/collective_floors.py --monotone --max-bytes 1048575   # best curve rising with size
    python benchmarks/collective_floors.py --fit --min-bytes 1048576   # echosim's form, fitted per series

For every series of one harness (device, op, group size, pattern) the rows up to ``--max-bytes``
sit on the latency floor: NCCL's own bandwidth term there is a fraction of a microsecond. The best any
size-independent rule can do on them is one constant per series, chosen with hindsight to
minimise the series' error in the rows' own metric (bus bandwidth or time, as ``validate
--microbench`` scores them). The table prints, per (device, op, harness) group, that oracle's
MAPE next to echosim's: where the oracle itself misses the target, the rows' scatter (warm-up
spikes, timer quantisation, run-to-run noise) and not a missing rule sets the error.

``--monotone`` gives the oracle more freedom: per series any time that does not fall as the message
grows (the best such curve over the measured values), which is what every latency +
bandwidth model obeys. With ``--max-bytes 1048575`` it bounds what any such model can reach on the
``<1MiB`` groups of ``validate --microbench``.

``--fit --min-bytes 1048576`` asks the same of echosim's own functional form on the large messages: per
series the best ``t = a + S/b + 2 sqrt(S h / b)`` (``S`` the bytes one link carries, a floor ``a``, a bus
bandwidth ``b`` and a chunk handshake ``h``, each chosen per series with hindsight on a grid) and the
values it picks. Where that fit reaches the target and echosim does not, a rule is missing (the values
show which: how ``b`` moves with the group size, what floor ``a`` a group needs). Point-to-point rows
plateau where few channels carry a send, which this form lacks: their fit can be worse than echosim.

``--series`` prints each series instead: its median measured floor and echosim's median time on
the same rows, so a floor rule can be read against the group size (a rule that is right moves
with the series, one that is missing stays flat while the measured floor grows).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from echosim.validation.microbench import (  # noqa: E402
    COLLECTIVE_OPS,
    XLA_TABLE,
    _number,
    _size,
    read_rows,
    validate_microbench,
)

MICROBENCH = ROOT.parent / "shared" / "validation" / "microbench.csv"
MiB = 1 << 20


def _measured_us(row: dict[str, str], size: int) -> tuple[float, bool] | None:
    """(time in µs, scored on bus bandwidth) of a collective row; None when the metric is not one."""
    value, n = _number(row["value"]), int(_number(row["num_devices"]) or 1)
    if value is None or value <= 0:
        return None
    metric = row["metric"].split(" (")[0]
    if metric == "time_us":
        return value, False
    if metric == "time_ms":
        return value * 1e3, False
    if metric in ("busbw_GBps", "effective_collective_bw_GBps"):
        factor = 2 * (n - 1) / n if re.search(r"^all[_-]reduce", row["op"]) else (n - 1) / n
        if re.search(r"^collective-permute|^sendrecv", row["op"]):
            factor = 1.0
        return size * factor / value / 1e3, True
    return None


def _err(c: float, t: float, on_bw: bool) -> float:
    """A row's error when the model says ``c`` µs and the row measured ``t`` µs, in the row's own metric."""
    return abs(t / c - 1) if on_bw else abs(c / t - 1)


def _oracle_mape(points: list[tuple[float, bool]]) -> float:
    """MAPE of the best single time for a series, each row scored in its own metric."""
    return min(statistics.mean(_err(c, t, b) for t, b in points) for c, _ in points)


def _monotone_mape(points: list[tuple[int, float, bool]]) -> float:
    """MAPE of the best time that never falls as the size grows, over (size, time, on_bw) points.

    Dynamic programming over the sizes in order: ``best[j]`` is the least total error of the sizes so
    far with the current size predicted at the ``j``-th smallest measured time; candidates are the
    measured times, as for the constant oracle.
    """
    values = sorted({t for _, t, _ in points})
    best = [0.0] * len(values)
    for size in sorted({s for s, _, _ in points}):
        rows = [(t, b) for s, t, b in points if s == size]
        running = float("inf")
        for j, c in enumerate(values):
            running = min(running, best[j])
            best[j] = running + sum(_err(c, t, b) for t, b in rows)
    return min(best) / len(points)


def _series_key(row: dict[str, str]) -> tuple[str, ...]:
    """(device, op, devices, nodes, layout, harness): the rows one harness measured on one group."""
    harness = "XLA table" if XLA_TABLE in row["source"] else row["source"].split("/")[4]
    shape = row["shape"]
    layout = re.sub(r"^\[\d+\]\s*", "", shape) if shape.startswith(("[", "pattern")) else ""
    return (row["device"], row["op"].split(" (")[0], row["num_devices"], row["num_nodes"], layout, harness)


def _floor_rows(path: Path, max_bytes: int) -> Iterator[tuple[dict[str, str], Any, tuple[float, bool]]]:
    """Collective rows of at most ``max_bytes`` that echosim predicts: the row, its validation result and
    its measured point (µs, whether the row states bus bandwidth)."""
    result = validate_microbench(path)
    model = {r.line: r for r in result.rows if r.group and r.predicted is not None}
    for line, row in read_rows(path):
        if line not in model or not any(re.search(p, row["op"]) for p, _ in COLLECTIVE_OPS):
            continue
        size = _size(row)
        point = _measured_us(row, size) if size is not None and size <= max_bytes else None
        if point is not None:
            yield row, model[line], point


def series_floors(path: Path, max_bytes: int) -> dict[tuple[str, ...], dict[str, float]]:
    """Per series on the floor: rows, median measured time (µs) and echosim's median time on them."""
    measured: dict[tuple[str, ...], list[float]] = defaultdict(list)
    predicted: dict[tuple[str, ...], list[float]] = defaultdict(list)
    for row, r, (t, on_bw) in _floor_rows(path, max_bytes):
        # the model's time: its bus bandwidth turned back into time with the row's own factor
        key = _series_key(row)
        measured[key].append(t)
        predicted[key].append(t * r.measured / r.predicted if on_bw else r.predicted)
    return {
        k: {"rows": len(v), "measured_us": statistics.median(v), "echosim_us": statistics.median(predicted[k])}
        for k, v in sorted(measured.items())
    }


def floors(path: Path, max_bytes: int, monotone: bool = False) -> dict[str, dict[str, float]]:
    """Per (device, op, harness) group: rows on the floor, echosim's MAPE on them and the oracle's
    (one constant per series, or with ``monotone`` the best curve that never falls with size)."""
    series: dict[tuple[str, ...], list[tuple[int, float, bool]]] = defaultdict(list)
    group_of: dict[tuple[str, ...], str] = {}
    errors: dict[str, list[float]] = defaultdict(list)
    for row, r, point in _floor_rows(path, max_bytes):
        key = _series_key(row)
        series[key].append((_size(row) or 0, *point))
        group = f"{row['device']} | {key[1]} | {key[5]}"
        group_of[key] = group
        errors[group].append(abs(r.predicted - r.measured) / r.measured)
    oracle: dict[str, list[float]] = defaultdict(list)
    for key, points in series.items():
        mape = _monotone_mape(points) if monotone else _oracle_mape([(t, b) for _, t, b in points])
        oracle[group_of[key]] += [mape] * len(points)
    return {
        g: {"rows": len(errors[g]), "echosim": statistics.mean(errors[g]), "oracle": statistics.mean(oracle[g])}
        for g in sorted(errors)
    }


FIT_FLOORS_US = (0, 5, 10, 15, 20, 25, 30, 40, 50, 60, 80, 100, 125, 150)
FIT_HANDSHAKES_US = (0, 0.5, 1, 2, 3.4, 5, 8, 12, 18, 25, 40)


def _link_bytes(row: dict[str, str], size: int) -> float:
    """Bytes one link carries: the bus-bandwidth factor times the buffer (a permute's buffer itself)."""
    n = int(_number(row["num_devices"]) or 1)
    if re.search(r"^collective-permute|^sendrecv", row["op"]):
        return float(size)
    return size * (2 * (n - 1) / n if re.search(r"^all[_-]reduce", row["op"]) else (n - 1) / n)


Fits = dict[tuple[str, ...], dict[str, float]]


def form_fits(path: Path, min_bytes: int) -> tuple[dict[str, dict[str, float]], Fits]:
    """Per group and per series of rows from ``min_bytes`` up: echosim's MAPE and that of the best
    ``a + S/b + 2 sqrt(S h / b)`` per series (a in µs, b in GB/s, h in µs, on a grid), with its values."""
    import numpy as np

    series: dict[tuple[str, ...], list[tuple[float, float, bool]]] = defaultdict(list)
    group_of: dict[tuple[str, ...], str] = {}
    errors: dict[str, list[float]] = defaultdict(list)
    for row, r, (t, on_bw) in _floor_rows(path, 1 << 62):
        size = _size(row) or 0
        if size < min_bytes:
            continue
        key = _series_key(row)
        series[key].append((_link_bytes(row, size), t, on_bw))
        group_of[key] = f"{row['device']} | {key[1]} | {key[5]}"
        errors[group_of[key]].append(abs(r.predicted - r.measured) / r.measured)
    a = np.array(FIT_FLOORS_US, dtype=float)[:, None, None, None]
    b = np.geomspace(5.0, 1500.0, 120)[None, :, None, None]
    h = np.array(FIT_HANDSHAKES_US, dtype=float)[None, None, :, None]
    fits: Fits = {}
    fitted: dict[str, list[float]] = defaultdict(list)
    for key, points in sorted(series.items()):
        link, t, on_bw = (np.array(x) for x in zip(*points, strict=True))
        pred = a + link / (b * 1e3) + 2 * np.sqrt(link * h / (b * 1e3))
        mape = np.where(on_bw, np.abs(t / pred - 1), np.abs(pred / t - 1)).mean(axis=-1)
        i, j, k = np.unravel_index(int(mape.argmin()), mape.shape)
        fits[key] = {"rows": len(points), "mape": float(mape.min()), "a_us": float(a[i, 0, 0, 0]),
                     "b_GBps": float(b[0, j, 0, 0]), "h_us": float(h[0, 0, k, 0])}  # fmt: skip
        fitted[group_of[key]] += [float(mape.min())] * len(points)
    groups = {
        g: {"rows": len(errors[g]), "echosim": statistics.mean(errors[g]), "oracle": statistics.mean(fitted[g])}
        for g in sorted(errors)
    }
    return groups, fits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--microbench", type=Path, default=MICROBENCH)
    parser.add_argument("--max-bytes", type=int, default=64 * 1024)
    parser.add_argument("--series", action="store_true", help="one line per series: measured floor vs echosim's")
    parser.add_argument("--monotone", action="store_true", help="oracle: the best time that never falls with size")
    parser.add_argument("--fit", action="store_true", help="echosim's latency + bandwidth + pipeline form per series")
    parser.add_argument("--min-bytes", type=int, default=MiB, help="with --fit: the smallest message")
    args = parser.parse_args()
    if not args.microbench.exists():
        sys.exit(f"error: {args.microbench} not found")
    if args.fit:
        groups, fits = form_fits(args.microbench, args.min_bytes)
        print(f"collective rows of at least {args.min_bytes} bytes: echosim's MAPE, best a + S/b + 2 sqrt(S h/b)")
        print(f"{'group':70s} {'rows':>4s} {'echosim':>8s} {'fitted':>8s}")
        for group, g in groups.items():
            print(f"{group:70s} {g['rows']:4d} {100 * g['echosim']:7.1f}% {100 * g['oracle']:7.1f}%")
        print(f"{'series: device | op | devices x nodes | layout':70s} {'rows':>4s} {'fitted':>8s} a_us b_GBps h_us")
        for key, f in fits.items():
            name = f"{key[0]} | {key[1]} | {key[2]} x {key[3] or 1} | {key[4][:24]}"
            values = f"{f['a_us']:4.0f} {f['b_GBps']:6.0f} {f['h_us']:4.1f}"
            print(f"{name:70s} {f['rows']:4d} {100 * f['mape']:7.1f}% {values}")
        return
    if args.series:
        print(f"collective series, rows of at most {args.max_bytes} bytes: median floor in µs")
        print(f"{'device | op | devices x nodes | layout | harness':96s} {'rows':>4s} {'measured':>9s} {'echosim':>8s}")
        for key, g in series_floors(args.microbench, args.max_bytes).items():
            device, op, n, nodes, layout, harness = key
            name = f"{device} | {op} | {n} x {nodes or 1} | {layout[:30]} | {harness}"
            print(f"{name:96s} {g['rows']:4d} {g['measured_us']:9.1f} {g['echosim_us']:8.1f}")
        return
    oracle = "the best curve rising with size" if args.monotone else "the best constant"
    print(f"collective rows of at most {args.max_bytes} bytes: echosim's MAPE and {oracle} per series")
    print(f"{'group':70s} {'rows':>4s} {'echosim':>8s} {'oracle':>8s}")
    for group, g in floors(args.microbench, args.max_bytes, args.monotone).items():
        print(f"{group:70s} {g['rows']:4d} {100 * g['echosim']:7.1f}% {100 * g['oracle']:7.1f}%")


if __name__ == "__main__":
    main()
