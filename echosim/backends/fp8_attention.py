"""FP8 attention (Transformer Engine's ``fp8_dot_product_attention``: cuDNN's FP8 fused attention), priced as
its BF16 kernel over the speed-up cuDNN's own benchmark measures between the two.

cuDNN's training benchmark (NVIDIA/cudnn-frontend ``benchmark/sdpa_benchmark_training``, results of 2026-04-24,
cuDNN frontend 1.21.1 with cuDNN 9.22) times the BF16 and the FP8 kernels of the same attention shapes on a GB200
and a GB300: DeepSeek-V3's (head dims 192 / 128), Llama 3.1's (128, grouped-query) and gpt-oss's (64, a
128-token window), causal and not, at 2k to 32k tokens, forward and backward. ``data/cudnn_fp8_sdpa.csv`` holds
each pair as published. Without a window the FP8 forward runs 1.26-1.79x as fast as its BF16 twin and the
backward 0.94-2.06x; the windowed 64-dim shape's forward 1.07-1.95x, and its backward 0.04-0.49x (8-89 TFLOP/s).

A kernel of a measured class (the device's silicon, head dimension, window or none, mask) takes the measured
speed-up at its sequence length, interpolated in log2 of the length between the measured ones and held at the
ends; batch and heads are taken not to move the ratio. A shape is matched by the mean of its query-key and value
head dimensions, the one head dimension :class:`~echosim.ir.ops.AttentionAttrs` keeps (DeepSeek-V3's MLA: 160).
B200 takes GB200's figures and B300 GB300's (the same GPU; the Grace host does not run the kernel). A class with
no measurement is not priced at another's ratio: it stays at the BF16 kernel's time, and the compile says so
(:func:`unmeasured`). Not priced: the casts of Q, K, V and the output gradient to FP8 around the kernel (each
moves 3 bytes an element of a tensor the size of the layer's input, against the kernel's work that grows with
the sequence length squared).
"""

from __future__ import annotations

import bisect
import csv
import math
from functools import cache
from importlib import resources

from echosim.ir.ops import AttentionAttrs

#: The benchmark's device whose figures a backend takes (the same GPU silicon).
MEASURED_ON: dict[str, str] = {"gb200": "gb200", "b200": "gb200", "gb300": "gb300", "b300": "gb300"}
DATA_FILE = "cudnn_fp8_sdpa.csv"

# (device, head_dim_qk, windowed, causal, backward) -> sorted (log2 q_len, bf16 time / fp8 time)
_Table = dict[tuple[str, int, bool, bool, bool], list[tuple[float, float]]]


@cache
def _table() -> _Table:
    text = resources.files("echosim").joinpath("data", DATA_FILE).read_text(encoding="utf-8")
    table: _Table = {}
    for row in csv.DictReader(text.splitlines()):
        head_dim = (int(row["head_dim_qk"]) + int(row["head_dim_v"])) // 2  # as AttentionAttrs holds it
        key = (row["device"], head_dim, int(row["window"]) > 0, row["causal"] == "yes", row["pass"] == "bwd")
        ratio = float(row["bf16_time_ms"]) / float(row["fp8_time_ms"])
        table.setdefault(key, []).append((math.log2(int(row["q_len"])), ratio))
    return {key: sorted(points) for key, points in table.items()}


def _key(backend: str, a: AttentionAttrs, backward: bool) -> tuple[str, int, bool, bool, bool] | None:
    device = MEASURED_ON.get(backend)
    return None if device is None else (device, a.head_dim, a.window > 0, a.causal, backward)


def speedup(backend: str, a: AttentionAttrs, backward: bool) -> float | None:
    """The measured FP8 / BF16 speed-up of the attention kernel ``a`` on ``backend`` (None: not measured)."""
    key = _key(backend, a, backward)
    points = _table().get(key) if key is not None else None
    if not points:
        return None
    x = math.log2(max(a.q_len, 1))
    xs = [p[0] for p in points]
    i = bisect.bisect_left(xs, x)
    if i == 0:
        return points[0][1]
    if i == len(points):
        return points[-1][1]
    (x0, r0), (x1, r1) = points[i - 1], points[i]
    return r0 + (r1 - r0) * (x - x0) / (x1 - x0)


def refusal(backend: str) -> str:
    """Why FP8 attention is not priced on ``backend`` at all ('' where it is)."""
    if backend in MEASURED_ON:
        return ""
    known = ", ".join(sorted(MEASURED_ON))
    return (
        f"--fp8-attention: no published FP8 attention measurement for backend {backend!r} "
        f"(cuDNN's FP8 / BF16 attention benchmark covers {known})"
    )


def unmeasured(backend: str, attention: list[AttentionAttrs]) -> list[str]:
    """One line per attention shape class of a model that has no measured FP8 speed-up on ``backend``."""
    out = []
    for a in attention:
        if speedup(backend, a, False) is None or speedup(backend, a, True) is None:
            window = f", a {a.window}-token window" if a.window else ""
            mask = "causal" if a.causal else "non-causal"
            line = (
                f"FP8 attention: no measured FP8 / BF16 speed-up on {backend} for head_dim {a.head_dim} "
                f"({mask}{window}): those kernels are priced at their BF16 time"
            )
            if line not in out:
                out.append(line)
    return out
