"""What the checks on NVIDIA aiconfigurator's measured tables share (``aic_nccl_check.py``, ``aic_gemm_check.py``).

aiconfigurator (github.com/ai-dynamo/aiconfigurator) ships the kernel and collective latencies its performance model
is built on as parquet tables. Each check converts the tables it reads into ``microbench.csv``'s columns once
(``--build``, which needs pyarrow and a checkout) and prices the committed CSV with ``validate_microbench``.
"""

from __future__ import annotations

import argparse
import csv
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
COMMIT = "095f58a51c4ca8e61b66ec108d86f223f8d559ce"
DATA = "aic-core/src/aiconfigurator_core/systems/data"
COLUMNS = ("source", "device", "system", "op", "dtype", "shape", "size_bytes", "num_devices", "num_nodes")
COLUMNS += ("metric", "value", "notes")


def source(path: str) -> str:
    """A row's source: the repository at the commit read and the table's path under the systems data."""
    return f"github.com/ai-dynamo/aiconfigurator@{COMMIT[:7]} {path.removeprefix(DATA + '/')}"


def read_table(repo: Path, path: str) -> list[dict[str, Any]]:
    """The rows of one parquet table of a checkout (needs pyarrow, only for ``--build``)."""
    import pyarrow.parquet as pq

    return pq.read_table(repo / path).to_pylist()


def main(doc: str, build: Callable[[Path], list[dict[str, str]]], report: Callable[[], Any], out: Path) -> None:
    """The command line both checks share: ``--build CHECKOUT`` rewrites ``out``; the check then runs."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--build", type=Path, metavar="AICONFIGURATOR", help="rewrite the CSV from a checkout")
    args = parser.parse_args()
    if args.build:
        rows = build(args.build)
        with out.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {out.relative_to(ROOT)}: {len(rows)} rows")
    report()
