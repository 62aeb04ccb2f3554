"""One rank of a calibration benchmark: ``python -m echosim.calibrate.worker --rank R ...``.

A separate interpreter per rank (not ``multiprocessing``) so that the benchmarks work from
any caller, a CLI or a notebook. Rank 0 prints ``P <what>`` lines as it goes and its result
as ``R <json>`` last.

* ``--mode collectives``: all-reduce, all-gather, broadcast over ``--sizes`` bytes;
* ``--mode compute``: the CPU compute sweep, every rank at once (a rank's rates when
  ``--world`` ranks share the machine).
"""

from __future__ import annotations

import argparse
import json

from echosim.calibrate.bench import bench_cpu, collective_worker


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--mode", choices=("collectives", "compute"), default="collectives")
    parser.add_argument("--sizes", default="")
    parser.add_argument("--sweep", default="standard")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtypes", default="fp32")
    args = parser.parse_args()
    if args.mode == "collectives":
        sizes = [int(s) for s in args.sizes.split(",")]
        result: object = collective_worker(args.rank, args.world, args.port, sizes, args.backend)
    else:
        import torch.distributed as dist

        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank, world_size=args.world
        )

        def progress(text: str) -> None:
            if args.rank == 0:
                print(f"P {text}", flush=True)

        samples = bench_cpu(args.sweep, tuple(args.dtypes.split(",")), args.threads, progress, dist.barrier)
        dist.destroy_process_group()
        result = [s.as_dict() for s in samples]
    if args.rank == 0:
        print(f"R {json.dumps(result)}", flush=True)


if __name__ == "__main__":
    main()
