"""How PyTorch's CPU flash attention spends its time by sequence length, against echosim's block rule.

Usage::

    python benchmarks/cpu_attention_blocks.py [--repeats 5] [--out benchmarks/data/cpu_attention_blocks.json]

For 256 to 2,048 queries (one thread, fp32, head_dim 64, about the same number of scores each), it
times ``F.scaled_dot_product_attention`` forward and forward + backward, causal and full, in turn
(full, causal, full, causal, ...: a change of the machine's speed hits both), by the process's CPU
time. Two ratios test :func:`echosim.backends.cpu.flash_blocks`:

* causal over full: the share of the scores the causal kernel computes (it skips only whole
  512-key blocks past the diagonal, so nothing below 512 keys);
* full attention's time per score against 512 queries: the blocks' shape (64 query rows under
  768 queries, 256 from there) changes the cost of a score only through the block GEMMs'
  packing (:func:`echosim.backends.cpu.gemm_shape_factor`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = [(8, 256), (4, 512), (2, 1024), (1, 2048)]  # (batch x heads, queries): scores grow 2x a step
HEAD_DIM = 64


def cpu_time(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        c0 = time.process_time()
        fn()
        times.append(time.process_time() - c0)
    return statistics.median(times)


def main() -> None:
    import torch
    import torch.nn.functional as F

    from echosim.backends.cpu import flash_blocks

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="Rounds of (full, causal) per shape.")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for bh, s in SHAPES:
        q, k, v = (torch.randn(1, bh, s, HEAD_DIM, requires_grad=True) for _ in range(3))
        g = torch.randn(1, bh, s, HEAD_DIM)
        times: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for _ in range(args.repeats):
            for causal in (False, True):

                def fwd(causal: bool = causal, q: object = q, k: object = k, v: object = v) -> object:
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                def both(causal: bool = causal, q: object = q, k: object = k, v: object = v, g: object = g) -> None:
                    torch.autograd.grad(fwd(causal), (q, k, v), g)

                times[causal].append((cpu_time(fwd, 3), cpu_time(both, 2)))
        med = {c: [statistics.median(t[i] for t in times[c]) for i in (0, 1)] for c in times}
        rows.append({"bh": bh, "seq": s, "full_fwd_s": med[False][0], "full_fwd_bwd_s": med[False][1],
                     "causal_fwd_s": med[True][0], "causal_fwd_bwd_s": med[True][1],
                     "causal_over_full_fwd": med[True][0] / med[False][0],
                     "causal_over_full_fwd_bwd": med[True][1] / med[False][1],
                     "model_computed_share": flash_blocks(s, s, True)[0]})  # fmt: skip
    base = next(r for r in rows if r["seq"] == 512)
    head = "full per score vs 512: fwd"
    print(f"{'seq':>6}{'causal/full fwd':>17}{'fwd+bwd':>9}{'model':>7}{head:>28}{'fwd+bwd':>9}")
    for r in rows:
        scores = r["bh"] * r["seq"] ** 2
        per = [r[key] / scores / (base[key] / (base["bh"] * 512**2)) for key in ("full_fwd_s", "full_fwd_bwd_s")]
        r["full_per_score_vs_512"] = per
        print(f"{r['seq']:>6}{r['causal_over_full_fwd']:>17.2f}{r['causal_over_full_fwd_bwd']:>9.2f}"
              f"{r['model_computed_share']:>7.3f}{per[0]:>28.2f}{per[1]:>9.2f}")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps({"command": " ".join(sys.argv), "torch": torch.__version__, "rows": rows},
                                       indent=1, sort_keys=True))  # fmt: skip


if __name__ == "__main__":
    main()
