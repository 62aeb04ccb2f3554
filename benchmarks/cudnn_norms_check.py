"""echosim's memory-bound pricing against cuDNN's published normalization benchmark (issue 16).

``benchmarks/data/cudnn_norms.csv`` holds the cuDNN rows of NVIDIA's cudnn-frontend norm benchmark
(``benchmark/norms/results/{h200,gb200,gb300}/all_models_*.csv``, each with its file at a commit): cuDNN 9.19.1,
bf16, the RMSNorm and LayerNorm shapes of 13 LLM training configurations (tokens x hidden), forward and backward
times of one call. The benchmark times each call as the sum of its kernels' device times under the profiler, with
L2 flushed before it; so the times hold no launch gap.

Why it matters: echosim has no STREAM measurement for GB200 or GB300 and gives them H200's measured fraction of
peak (``devices.py``: 4158 / 4800). The same kernels, on the same cuDNN and the same harness, measure what fraction
each part reaches. The script prints, per row, the bytes the benchmark counts, the measured time and bandwidth, and
echosim's price of one fused kernel moving those bytes (:func:`echosim.backends.compute.memory_bound_time_s`: bytes
at the STREAM rate plus one kernel overhead); then per device, over the rows whose forward moves at least 100 MB
(where a kernel runs at its plateau), the median fraction of peak reached and the mean error of both passes, and
the slope and intercept of a line through the forward times (:func:`streaming_fit`), which read the streaming rate
apart from a kernel's fixed cost. Nothing here changes a prediction.

    PYTHONPATH=. python benchmarks/cudnn_norms_check.py [--csv benchmarks/data/cudnn_norms.csv]
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from echosim.backends.compute import memory_bound_time_s
from echosim.backends.devices import DEVICES

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cudnn_prefill_check import cli_results  # noqa: E402
from cudnn_prefill_check import read_rows as _read_rows  # noqa: E402

DATA = HERE / "data" / "cudnn_norms.csv"
# forwards that move at least this much (8 of the 15 shapes, the same on every part): 20 us or more on each, so the
# ramp at the start and the tail wave are a small share of the kernel
PLATEAU_BYTES = 100e6
FIT_MIN_ROW, FIT_MIN_BYTES = 2048, 30e6
BF16_BYTES = 2
FP32_BYTES = 4  # the saved statistics (inverse RMS; LayerNorm's mean too) are fp32


def read_rows(path: Path = DATA) -> list[dict[str, str]]:
    return _read_rows(path)


def traffic_bytes(row: dict[str, str], backward: bool) -> int:
    """Bytes one call reads and writes, counted as the benchmark counts them (``compute_bandwidth_bytes`` in
    ``benchmark_single_norm.py``): the activations, the scale (and LayerNorm's bias) and the fp32 statistics.

    Forward: x and the scale in, y and the statistics out. Backward: dy, x, the scale and the statistics in; dx
    and the scale's gradient (and the bias's) out.
    """
    n, c = int(row["N"]), int(row["C"])
    layer, bias = row["norm_type"] == "layer_norm", row["has_bias"] == "yes"
    stats = (2 if layer else 1) * n * FP32_BYTES
    params = c * (2 if layer and bias else 1)
    if not backward:
        return (2 * n * c + params) * BF16_BYTES + stats
    return (3 * n * c + c + params) * BF16_BYTES + stats


def compare(row: dict[str, str]) -> dict[str, Any]:
    """One row: per pass, the bytes, the measured seconds (bytes over the benchmark's GB/s, which carries more
    digits than its milliseconds) and echosim's price of one fused kernel moving them."""
    dev = DEVICES[row["backend"]]
    out: dict[str, Any] = {"backend": row["backend"], "model": row["model"], "N": int(row["N"]), "C": int(row["C"])}
    for p in ("fwd", "bwd"):
        nbytes = traffic_bytes(row, p == "bwd")
        out[f"{p}_bytes"] = nbytes
        out[f"{p}_s"] = nbytes / (float(row[f"{p}_gbps"]) * 1e9)
        out[f"{p}_pred_s"] = memory_bound_time_s(dev, nbytes)
    return out


def streaming_fit(results: list[dict[str, Any]], device: str) -> tuple[float, float]:
    """Least-squares line through a device's forward times against their bytes, over the shapes whose rows hold at
    least 2,048 elements and which move at least 30 MB (11 of 15): the slope's bandwidth (GB/s) and the intercept
    (us), the fixed device time of a kernel. It reads the streaming rate apart from the fixed cost, which the median
    of the largest rows folds in."""
    rs = [r for r in results if r["backend"] == device and r["C"] >= FIT_MIN_ROW and r["fwd_bytes"] >= FIT_MIN_BYTES]
    x = np.array([r["fwd_bytes"] for r in rs], dtype=np.float64)
    y = np.array([r["fwd_s"] for r in rs], dtype=np.float64)
    (slope, intercept), *_ = np.linalg.lstsq(np.vstack([x, np.ones_like(x)]).T, y, rcond=None)
    return 1.0 / slope / 1e9, intercept * 1e6


def summary(results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per device over its plateau rows: the median fraction of the device's peak bandwidth the forward kernels
    reach, the same against echosim's STREAM rate, and the mean error of echosim's forward and backward prices."""
    by_device: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        if r["fwd_bytes"] >= PLATEAU_BYTES:
            by_device[r["backend"]].append(r)
    out = {}
    for device, rs in sorted(by_device.items()):
        dev = DEVICES[device]
        reached = [r["fwd_bytes"] / r["fwd_s"] / 1e9 for r in rs]
        slope_GBps, intercept_us = streaming_fit(results, device)
        out[device] = {
            "rows": len(rs),
            "of_peak": statistics.median(reached) / dev.hbm_GBps,
            "of_stream": statistics.median(reached) / dev.hbm_stream_GBps,
            "fit_of_peak": slope_GBps / dev.hbm_GBps,
            "fit_of_stream": slope_GBps / dev.hbm_stream_GBps,
            "fit_intercept_us": intercept_us,
            "fwd_mean": statistics.mean(r["fwd_pred_s"] / r["fwd_s"] - 1 for r in rs),
            "bwd_mean": statistics.mean(r["bwd_pred_s"] / r["bwd_s"] - 1 for r in rs),
        }
    return out


def main() -> None:
    results = cli_results(__doc__, DATA, compare)
    cols = f"{'MB':>5s} {'us':>6s} {'GB/s':>5s} {'echosim':>7s} {'err':>6s}"
    print(f"{'device':7s} {'model':24s} {'N':>6s} {'C':>5s}   fwd: {cols}   bwd: {cols}")
    for r in results:
        cells = []
        for p in ("fwd", "bwd"):
            b, s, pred = r[f"{p}_bytes"], r[f"{p}_s"], r[f"{p}_pred_s"]
            cells.append(f"{b / 1e6:5.0f} {s * 1e6:6.1f} {b / s / 1e9:5.0f} {pred * 1e6:7.1f} {pred / s - 1:+6.1%}")
        print(f"{r['backend']:7s} {r['model'][:24]:24s} {r['N']:6d} {r['C']:5d}   fwd: {cells[0]}   bwd: {cells[1]}")
    s = summary(results)
    print(f"\nper device, rows whose forward moves >= {PLATEAU_BYTES / 1e6:.0f} MB: median bandwidth the forward "
          "reaches, mean error of echosim's prices,")  # fmt: skip
    print("and the line through the forward times of the rows of >= 2,048 elements and >= 30 MB (slope, intercept)")
    print(f"{'device':7s} {'rows':>4s} {'of peak':>8s} {'/ H200':>7s} {'of STREAM':>9s} {'fwd':>7s} {'bwd':>7s}"
          f" {'slope: of peak':>14s} {'/ H200':>7s} {'of STREAM':>9s} {'intercept us':>12s}")  # fmt: skip
    h200 = s.get("h200")
    for device, d in s.items():
        rel = f"{d['of_peak'] / h200['of_peak']:7.3f}" if h200 else f"{'':7s}"
        fit_rel = f"{d['fit_of_peak'] / h200['fit_of_peak']:7.3f}" if h200 else f"{'':7s}"
        print(f"{device:7s} {d['rows']:4d} {d['of_peak']:8.3f} {rel} {d['of_stream']:9.3f} "
              f"{d['fwd_mean']:+7.1%} {d['bwd_mean']:+7.1%} {d['fit_of_peak']:14.3f} {fit_rel} "
              f"{d['fit_of_stream']:9.3f} {d['fit_intercept_us']:12.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
