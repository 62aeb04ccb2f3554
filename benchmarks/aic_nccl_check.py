"""echosim's collective model on NVIDIA's own nccl-tests sweeps (issue 16): a check, not a fit.

NVIDIA's aiconfigurator ships the NCCL latencies it was built on, one table per system and NCCL version
(``aic-core/src/aiconfigurator_core/systems/data/<system>/comm/nccl/<version>/nccl_perf.parquet``, commit
095f58a). Its collector (``collector/network/collect_nccl.py``) runs the nccl-tests binaries on one node,
``<op>_perf -b S -e S -t <gpus> -d half|int8 -w 40 -n 100 -c 0`` (60 iterations above 16 MiB), one thread per GPU,
and keeps the out-of-place time; it logs ``message_size`` as S over the element size. So each row is one nccl-tests
measurement of all_gather, reduce_scatter, all_reduce or alltoall on 2, 4 or 8 GPUs (GB200: 2 and 4 of a compute
tray), 512 B to 512 MiB, in nccl-tests' buffer convention, the same as ``microbench.csv``'s nccl-tests rows. The
half rows are kept (the int8 ones measure the same byte sizes again); each row's source names its table. Neither
``microbench.csv`` nor anything echosim was fitted to holds these tables.

``--build`` converts the newest table of each system (A100 SXM: NCCL 2.27.3; H100 SXM, H200 SXM, B200, GB200:
2.29.2) into ``benchmarks/data/aic_nccl_perf.csv`` in ``microbench.csv``'s columns; it needs pyarrow and a
checkout of the repository, the check itself neither:

    PYTHONPATH=. python benchmarks/aic_nccl_check.py
    PYTHONPATH=. python benchmarks/aic_nccl_check.py --build /path/to/aiconfigurator   # rewrite the CSV
"""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from pathlib import Path

from aic_tables import DATA, read_table, source
from aic_tables import main as run_check

from echosim.validation.microbench import MiB, validate_microbench

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "data" / "aic_nccl_perf.csv"
#: system directory -> the NCCL version directory read (the newest that holds one version only).
TABLES = {"a100_sxm": "2.27.3", "h100_sxm": "2.29.2", "h200_sxm": "2.29.2", "b200_sxm": "2.29.2", "gb200": "2.29.2"}


def build(repo: Path) -> list[dict[str, str]]:
    """The CSV rows of every table in :data:`TABLES` (needs pyarrow)."""
    rows: list[dict[str, str]] = []
    for system, version in TABLES.items():
        path = f"{DATA}/{system}/comm/nccl/{version}/nccl_perf.parquet"
        for r in read_table(repo, path):
            if r["kernel_source"] != "NCCL" or r["version"] != version or r["nccl_dtype"] != "half":
                continue  # int8 rows repeat the half rows' byte sizes
            size = int(r["message_size"]) * 2  # half: 2 bytes an element
            n = int(r["num_gpus"])
            rows.append(
                {
                    "source": source(path),
                    "device": r["device"],
                    "system": f"1 node NVLink, NCCL {version}",
                    "op": f"{r['op_name']} (nccl-tests {r['op_name']}_perf -t {n})",
                    "dtype": r["nccl_dtype"],
                    "shape": f"{size} B",
                    "size_bytes": str(size),
                    "num_devices": str(n),
                    "num_nodes": "1",
                    "metric": "time_us",
                    "value": f"{float(r['latency']) * 1e3:.3f}",
                    "notes": "",
                }
            )
    rows.sort(key=lambda r: (r["device"], r["op"], r["dtype"], int(r["num_devices"]), int(r["size_bytes"])))
    return rows


def report(path: Path = OUT) -> dict[str, tuple[int, float, float]]:
    """Print echosim's error per (device, op, size regime, GPUs) and return {group: (rows, MAPE, mean)}."""
    result = validate_microbench(path)
    with path.open() as f:
        source = list(csv.DictReader(f))
    groups: dict[str, list[float]] = defaultdict(list)
    for r in result.rows:
        if r.skipped or r.predicted is None or not r.measured:
            continue
        row = source[r.line - 2]
        size = int(row["size_bytes"])
        regime = "<64KiB" if size < 64 * 1024 else "<1MiB" if size < MiB else ">=1MiB"
        op = row["op"].split()[0]
        err = r.predicted / r.measured - 1
        for key in (
            f"{row['device']} | {op} | {regime}",
            f"{row['device']} | {regime}",
            f"all | {regime}",
            "all",
        ):
            groups[key].append(err)
    out = {}
    print(f"{'group':48s} {'rows':>5s} {'MAPE':>7s} {'mean':>7s}")
    for key in sorted(groups, key=lambda k: (k.startswith("all"), k)):
        errs = groups[key]
        mape = statistics.fmean(abs(e) for e in errs)
        mean = statistics.fmean(errs)
        out[key] = (len(errs), mape, mean)
        print(f"{key:48s} {len(errs):5d} {100 * mape:6.1f}% {100 * mean:+6.1f}%")
    skipped = sum(1 for r in result.rows if r.skipped)
    print(f"{len(result.rows) - skipped} rows predicted, {skipped} skipped")
    return out


def main() -> None:
    run_check(__doc__, build, report, OUT)


if __name__ == "__main__":
    main()
