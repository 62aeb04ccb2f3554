"""echosim's GEMM model on NVIDIA's own short-run PyTorch GEMM sweeps (issue 16): a check, not a fit.

NVIDIA's aiconfigurator ships the GEMM latencies it was built on
(``aic-core/src/aiconfigurator_core/systems/data/<system>/gemm/trtllm/<version>/gemm_perf.parquet``, commit
095f58a). Its collector (``collector/trtllm/collect_gemm.py``) times TensorRT-LLM's ``Linear`` (bf16: PyTorch's
``F.linear``, cuBLAS's heuristic pick) in a CUDA graph after 3 warmups, over 6 replays (``collector/helper.py``
``benchmark_with_power``), with up to 5 weight copies to keep the weights out of L2. The bf16 rows of
TensorRT-LLM 1.0.0 (A100 SXM) and 1.3.0rc20 (H100 SXM, H200, B200, GB200) with m in {512, 2048, 8192, 32768},
n and k powers of two from 256 to 65536 and at least 1 GFLOP are written to ``benchmarks/data/aic_gemm_bf16.csv``
in ``microbench.csv``'s columns (1,076 rows). Nothing in echosim was fitted to them.

Two figures per part and size: measured time over echosim's autotuned GEMM time with no launch overhead and no
sustained-rate cap (``compute.gemm_plan(autotuned=True, sustained=False)``), and over the time echosim gives the
same GEMM inside a training step (``validate --microbench``'s pricing: the heuristic fraction, the sustained cap and
the kernel overhead).

    PYTHONPATH=. python benchmarks/aic_gemm_check.py
    PYTHONPATH=. python benchmarks/aic_gemm_check.py --build /path/to/aiconfigurator   # rewrite the CSV (pyarrow)
"""

from __future__ import annotations

import csv
import re
import statistics
from collections import defaultdict
from pathlib import Path

from aic_tables import DATA, read_table, source
from aic_tables import main as run_check

from echosim.backends import compute
from echosim.backends.device_names import backend_for_device
from echosim.backends.devices import get_device
from echosim.validation.microbench import validate_microbench

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "data" / "aic_gemm_bf16.csv"
TABLES = {
    "a100_sxm": "1.0.0",
    "h100_sxm": "1.3.0rc20",
    "h200_sxm": "1.3.0rc20",
    "b200_sxm": "1.3.0rc20",
    "gb200": "1.3.0rc20",
}
M_VALUES = (512, 2048, 8192, 32768)
NK_VALUES = tuple(2**i for i in range(8, 17))


def build(repo: Path) -> list[dict[str, str]]:
    """The CSV rows of every table in :data:`TABLES` (needs pyarrow)."""
    rows: list[dict[str, str]] = []
    for system, version in TABLES.items():
        path = f"{DATA}/{system}/gemm/trtllm/{version}/gemm_perf.parquet"
        for r in read_table(repo, path):
            m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
            if r["gemm_dtype"] != "bfloat16" or m not in M_VALUES or n not in NK_VALUES or k not in NK_VALUES:
                continue
            flops = 2 * m * n * k
            if flops < 1e9:
                continue
            rows.append(
                {
                    "source": source(path),
                    "device": r["device"],
                    "system": f"TRT-LLM {version} Linear, CUDA graph",
                    "op": "GEMM (PyTorch, short run)",
                    "dtype": "bf16",
                    "shape": f"m={m} n={n} k={k}",
                    "size_bytes": "",
                    "num_devices": "1",
                    "num_nodes": "1",
                    "metric": "TFLOPS",
                    "value": f"{flops / (float(r['latency']) * 1e-3) / 1e12:.2f}",
                    "notes": "",
                }
            )
    rows.sort(key=lambda r: (r["device"], [int(x) for x in re.findall(r"\d+", r["shape"])]))
    return rows


def _band(flops: float) -> str:
    return ">=100GF" if flops >= 1e11 else "10-100GF" if flops >= 1e10 else "1-10GF"


def report(path: Path = OUT) -> dict[str, tuple[int, float, float, float]]:
    """Print, per part and size band: rows, median measured / autotuned rate, median measured / as-priced rate,
    and the MAPE of the as-priced rate; return them by ``"<backend> | <band>"``."""
    result = validate_microbench(path)
    with path.open() as f:
        source = list(csv.DictReader(f))
    groups: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in result.rows:
        if r.skipped or r.predicted is None or not r.measured:
            continue
        row = source[r.line - 2]
        m, n, k = (int(x) for x in re.findall(r"\d+", row["shape"]))
        dev = get_device(backend_for_device(row["device"]) or "")
        autotuned = 2 * m * n * k / compute.gemm_plan(dev, m, n, k, 1, "bf16", True, False).time_s / 1e12
        for key in (f"{dev.name} | {_band(2 * m * n * k)}", f"{dev.name} | all"):
            groups[key].append((r.measured / autotuned, r.measured / r.predicted))
    out = {}
    print(f"{'part | GEMM size':24s} {'rows':>5s} {'meas/autotuned':>15s} {'meas/as priced':>15s} {'MAPE':>7s}")
    for key in sorted(groups):
        pairs = groups[key]
        auto = statistics.median(a for a, _ in pairs)
        priced = statistics.median(p for _, p in pairs)
        mape = statistics.fmean(abs(1 / p - 1) for _, p in pairs)
        out[key] = (len(pairs), auto, priced, mape)
        print(f"{key:24s} {len(pairs):5d} {auto:15.3f} {priced:15.3f} {100 * mape:6.1f}%")
    return out


def main() -> None:
    run_check(__doc__, build, report, OUT)


if __name__ == "__main__":
    main()
