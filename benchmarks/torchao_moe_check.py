"""echosim's MoE kernels on PyTorch's published B200 MXFP8 kernel breakdown (issue 16): a check, not a fit.

torchao's MXFP8 MoE training README (``torchao/prototype/moe_training/README.md``, pytorch/ao commit 36027d8,
section "Kernel Microbenchmarks: Breakdown by Pass") times every kernel of one expert layer's forward and
backward at DeepSeek-V3's expert shapes (dim 7168, expert hidden 2048, 131,072 routed tokens over 8 local
experts, MXFP8 with 1 x 32 blocks) on "NVIDIA B200, 1000W limit" (torch 2.11.0.dev20260101+cu128, torchao
0.16.0+gitaa38ae104): the casts to MXFP8 and ``torch._scaled_grouped_mm``. Its "Autograd function" table times
forward + backward of the whole op on B200 in BF16 (``torch._grouped_mm``) and MXFP8 at DeepSeek-V3 and
Llama 4 Scout shapes (torch 2.10.0a0+gitf6de195, torchao 0.14.0+gitc7b8e13da;
``benchmarks/prototype/moe_training/benchmark_scaled_grouped_mm_dq.py --compile``: ``triton.testing.do_bench``
of a compiled forward, MSE loss and backward; group sizes random, ``generate_jagged_offs``).

echosim prices each kernel as a training step would (``compute.matmul_time_s(grouped=True)``: the grouped-kernel
fraction of the GEMM model, the sustained cap, the launch; a cast: its bytes at STREAM rate,
``compute.memory_bound_time_s``) and, for the GEMMs, also as a short benchmark (autotuned, no cap), since the
README's figures are short ``do_bench`` runs. Groups are taken as equal. Nothing in echosim was fitted to these rows.

    PYTHONPATH=. python benchmarks/torchao_moe_check.py
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from echosim.backends import compute
from echosim.backends.devices import get_device

SOURCE = (
    "https://github.com/pytorch/ao/blob/36027d82d1ad9949597ea16002ff4940374b1b94/"
    "torchao/prototype/moe_training/README.md"
)
BLOCK = 32  # MXFP8: one E8M0 scale byte per 32 elements


@dataclass(frozen=True)
class Kernel:
    """One row of the README's per-kernel table: what it does, its shape, its measured time."""

    passname: str
    kernel: str
    kind: str  # "cast" (bf16 -> mxfp8 + scales), "gemm" (grouped MXFP8 GEMM), "scales" (scale-layout shuffle)
    shape: tuple[int, ...]  # cast / scales: the input; gemm: (m, n, k, groups) of each group's product
    measured_us: float


M, DIM, HIDDEN, G = 131072, 7168, 2048, 8

#: README "Kernel Microbenchmarks: Breakdown by Pass", DeepSeek-V3 shapes, in its order.
KERNELS: tuple[Kernel, ...] = (
    Kernel("forward", "triton_to_mxfp8_dim0 (A along K)", "cast", (M, DIM), 525.3),
    Kernel("forward", "triton_to_mxfp8_dim0 (B along K)", "cast", (G, HIDDEN, DIM), 65.4),
    Kernel("forward", "mx_block_rearrange_2d_M_groups_cuda", "scales", (M, DIM // BLOCK), 29.7),
    Kernel("forward", "triton_mx_block_rearrange_per_group_3d", "scales", (G, HIDDEN, DIM // BLOCK), 13.3),
    Kernel("forward", "_scaled_grouped_mm 2D-3D", "gemm", (M // G, HIDDEN, DIM, G), 1671.2),
    Kernel("backward dA", "triton_to_mxfp8_dim0 (grad_out along N)", "cast", (M, HIDDEN), 144.4),
    Kernel("backward dA", "mxfp8_quantize_cuda_3d (B along N)", "cast", (G, HIDDEN, DIM), 70.7),
    Kernel("backward dA", "mx_block_rearrange_2d_M_groups_cuda", "scales", (M, HIDDEN // BLOCK), 19.4),
    Kernel("backward dA", "triton_mx_block_rearrange_per_group_3d", "scales", (G, DIM, HIDDEN // BLOCK), 12.9),
    Kernel("backward dA", "_scaled_grouped_mm 2D-3D", "gemm", (M // G, DIM, HIDDEN, G), 1683.4),
    Kernel("backward dB", "to_mxfp8_dim1_cuda (grad_out along M)", "cast", (M, HIDDEN), 141.5),
    Kernel("backward dB", "to_mxfp8_dim1_cuda (A along M)", "cast", (M, DIM), 472.2),
    Kernel("backward dB", "triton_mx_block_rearrange_2d_K_groups", "scales", (HIDDEN, M // BLOCK), 199.8),
    Kernel("backward dB", "triton_mx_block_rearrange_2d_K_groups", "scales", (DIM, M // BLOCK), 207.9),
    Kernel("backward dB", "_scaled_grouped_mm 2D-2D", "gemm", (HIDDEN, DIM, M // G, G), 2103.3),
)

#: README "Autograd function": (model, total M, N, K, G) -> (bf16 fwd+bwd µs, MXFP8 fwd+bwd µs).
AUTOGRAD: dict[tuple[str, int, int, int, int], tuple[float, float]] = {
    ("llama4-scout", 128000, 8192, 5120, 1): (43140.20, 23867.00),
    ("llama4-scout", 128000, 8192, 5120, 2): (39487.60, 23359.00),
    ("llama4-scout", 128000, 8192, 5120, 4): (39189.20, 23945.50),
    ("llama4-scout", 128000, 8192, 5120, 8): (37700.70, 22170.60),
    ("deepseek-v3", 128000, 2048, 7168, 1): (13064.80, 10996.00),
    ("deepseek-v3", 128000, 2048, 7168, 2): (14900.20, 11283.40),
    ("deepseek-v3", 128000, 2048, 7168, 4): (15823.60, 9919.36),
    ("deepseek-v3", 128000, 2048, 7168, 8): (14966.80, 10397.20),
}


def cast_bytes(shape: tuple[int, ...]) -> int:
    """A cast to MXFP8: reads the bf16 input (2 B), writes one fp8 byte and one scale byte per 32 elements."""
    n = math.prod(shape)
    return 2 * n + n + n // BLOCK


def kernel_us(k: Kernel, short: bool) -> float | None:
    """echosim's time of one README kernel; ``short``: the GEMM as a short benchmark (autotuned, no cap)."""
    dev = get_device("b200")
    if k.kind == "cast":
        return compute.memory_bound_time_s(dev, cast_bytes(k.shape)) * 1e6
    if k.kind == "gemm":
        m, n, kk, g = k.shape
        seconds = compute.matmul_time_s(dev, m, n, kk, g, "mxfp8", autotuned=short, grouped=True, sustained=not short)
        return seconds * 1e6
    return None  # scale-layout shuffles: echosim has no such kernel (their bytes are 1/32 of a cast's)


def autograd_us(m: int, n: int, k: int, g: int, dtype: str, short: bool = True) -> float:
    """echosim's forward + backward of one grouped op as the README's benchmark runs it.

    Three grouped GEMMs (out = A @ B, dA, dB over each group's tokens), the compiled MSE loss (reads the output
    and the labels, writes the output's gradient) and, for MXFP8, the six casts of the per-kernel table
    (A, B and grad_out, each along both of its GEMM dimensions).
    """
    dev = get_device("b200")
    mg = m // g

    def gemm(mm: int, nn: int, kk: int) -> float:
        return compute.matmul_time_s(dev, mm, nn, kk, g, dtype, autotuned=short, grouped=True, sustained=not short)

    seconds = gemm(mg, n, k) + gemm(mg, k, n) + gemm(n, k, mg)
    seconds += compute.memory_bound_time_s(dev, 3 * 2 * m * n, kernels=2)
    if dtype == "mxfp8":
        casts = [(m, k), (g, n, k), (m, n), (g, n, k), (m, n), (m, k)]
        seconds += sum(compute.memory_bound_time_s(dev, cast_bytes(s)) for s in casts)
    return seconds * 1e6


def _row(*cells: object, widths: tuple[int, ...]) -> str:
    """One table line: the first two cells left-aligned, the rest right-aligned, to ``widths``; a float in a
    narrow (ratio) column takes two decimals, elsewhere one."""
    out = []
    for i, (cell, width) in enumerate(zip(cells, widths, strict=True)):
        text = f"{cell:.{2 if width <= 6 else 1}f}" if isinstance(cell, float) else str(cell)
        out.append(text.ljust(width) if i < 2 else text.rjust(width))
    return " ".join(out)


def report() -> dict[str, float]:
    """Print both tables; return the headline ratios (measured / echosim) the test pins."""
    print(f"B200 MXFP8 MoE kernels, DeepSeek-V3 expert shapes ({SOURCE})\n")
    widths = (11, 42, 9, 9, 9, 6)
    print(_row("pass", "kernel", "measured", "step", "short", "ratio", widths=widths))
    out: dict[str, float] = {}
    measured = {"cast": 0.0, "gemm": 0.0, "scales": 0.0}
    modelled = {"cast": 0.0, "gemm": 0.0, "gemm short": 0.0}
    for k in KERNELS:
        step, short = kernel_us(k, short=False), kernel_us(k, short=True)
        measured[k.kind] += k.measured_us
        if step is None or short is None:
            print(_row(k.passname, k.kernel, k.measured_us, "-", "-", "-", widths=widths))
            continue
        modelled[k.kind] += step
        if k.kind == "gemm":
            modelled["gemm short"] += short
        print(_row(k.passname, k.kernel, k.measured_us, step, short, k.measured_us / step, widths=widths))
    total = sum(measured.values())
    out["casts"] = measured["cast"] / modelled["cast"]
    out["gemms_step"] = measured["gemm"] / modelled["gemm"]
    out["gemms_short"] = measured["gemm"] / modelled["gemm short"]
    out["scales_share"] = measured["scales"] / total
    out["kernels_total_us"] = total
    print("(ratio: measured / echosim as priced in a training step; '-': no such kernel in echosim)")
    print(
        f"\ncasts: measured / echosim {out['casts']:.2f}; grouped GEMMs {out['gemms_step']:.2f} as priced in a step,"
        f" {out['gemms_short']:.2f} as a short run; scale-layout shuffles: {100 * out['scales_share']:.1f} % of the"
        f" measured {total:.0f} µs\n"
    )
    print("forward + backward of one grouped op (README 'Autograd function'), µs; echosim as a short run")
    widths = (12, 24, 8, 8, 6, 8, 8, 6)
    print(_row("model", "M,N,K,G", "bf16", "echosim", "ratio", "mxfp8", "echosim", "ratio", widths=widths))
    ratios: dict[str, list[float]] = {"bf16": [], "mxfp8": []}
    for (model, m, n, k, g), (bf16, mx) in AUTOGRAD.items():
        eb, em = autograd_us(m, n, k, g, "bf16"), autograd_us(m, n, k, g, "mxfp8")
        ratios["bf16"].append(bf16 / eb)
        ratios["mxfp8"].append(mx / em)
        print(
            _row(
                model,
                f"{m},{n},{k},{g}",
                f"{bf16:.0f}",
                f"{eb:.0f}",
                bf16 / eb,
                f"{mx:.0f}",
                f"{em:.0f}",
                mx / em,
                widths=widths,
            )
        )
    for dtype, values in ratios.items():
        out[f"autograd_{dtype}"] = math.exp(sum(map(math.log, values)) / len(values))
    same = AUTOGRAD[("deepseek-v3", 128000, 2048, 7168, 8)][1]
    out["autograd_over_kernels"] = same / total * M / 128000
    print(
        f"\ngeometric mean of measured / echosim: bf16 {out['autograd_bf16']:.2f}, mxfp8 {out['autograd_mxfp8']:.2f}."
        f" The same op at the per-kernel table's shape, scaled to its 131,072 tokens, takes"
        f" {out['autograd_over_kernels']:.2f}x the sum of that table's kernels."
    )
    return out


if __name__ == "__main__":
    report()
