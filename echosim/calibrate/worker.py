"""One rank of the collective microbenchmark: ``python -m echosim.calibrate.worker --rank R ...``.

A separate interpreter per rank (not ``multiprocessing``) so that the benchmark works from
any caller, a CLI or a notebook; rank 0 prints its results as JSON on stdout.
"""

from __future__ import annotations

import argparse
import json

from echosim.calibrate.bench import collective_worker


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--sizes", required=True)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results = collective_worker(args.rank, args.world, args.port, sizes, args.backend)
    if args.rank == 0:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
