"""What stands behind the accuracy figures: the fitted constants and how sensitive the errors are to them.

* :func:`fitted_constants` lists every constant of the backends' models that was fitted to
  a measurement (microbenchmarks, never a training-step row), so a reader can see that
  nothing was tuned per row.
* :func:`sensitivity` recomputes the group errors with each calibrated backend parameter
  moved by a fraction (+-10 % by default), through calibrations in a temporary database.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from echosim.validation.cases import backend_for
from echosim.validation.run import validate_cases
from echosim.validation.stats import Validation

# ---- constants fitted to measurements ---------------------------------------------------------------

#: Per-device fields of the GPU model set from a measurement (echosim/backends/devices.py).
GPU_FITTED = {
    "gemm_eff_16bit": "16-bit GEMM rate / peak at the best measured shape (MAMF, cuBLASLt rows of microbench.csv); "
    "also the rate of Hopper FP8 GEMMs with fast accumulation (XLA's FP8 dots, the forward GEMMs of TE and torchao)",
    "gemm_eff_fp8": "fp8 GEMM rate / peak at the best measured shape (MAMF, cuBLASLt rows); on Hopper the rate with "
    "the partial sums promoted (torch._scaled_mm's default, as mamf-finder calls it): backward FP8 GEMMs",
    "gemm_eff_fp4": "NVFP4 GEMM rate / peak: GB200's Azure cuBLASLt fp4 8192^3 row (a heuristic pick after 10,000 "
    "warmup iterations; no MAMF fp4 row); B200, B300 and GB300 take GB200's fraction",
    "sustained_16bit_tflops": "16-bit GEMM plateau of a sustained run (Azure cuBLASLt rows at >= 8192^3, "
    "10,000 warmup iterations); caps every GEMM of a training step",
    "sustained_fp8_tflops": "fp8 GEMM plateau of a sustained run (Azure cuBLASLt rows at >= 8192^3; B200: "
    "GB200's plateau / MAMF ratio on B200's MAMF rate)",
    "flash_fwd_eff": "flash-attention forward rate / peak at one measured shape (FA2/FA3 rows; B200: cuDNN from the "
    "FlashAttention-4 paper's 1613 TFLOP/s / 1.3; GB200, GB300: that rate x cuDNN 9.27's measured GB200 / B200, "
    "1.050, and GB300 / B200, 1.335; B300: H100's FA3 fraction, same MUFU:MMA balance)",
    "fa2_fwd_eff": "FlashAttention-2 forward rate / peak where it is not the part's own kernel (Azure FA2 rows)",
    "cudnn_fwd_eff": "cuDNN fused-attention forward rate / peak where it is not the part's own flash kernel (Hopper: "
    "cudnn-frontend's benchmark, cuDNN 9.4 on H200, 1 x 16 x 16384 x 128 non-causal): Transformer Engine's attention",
    "cudnn_bwd_over_fwd": "cuDNN fused-attention backward rate / its forward rate, the same measurement",
    "hbm_stream_GBps": "achievable HBM bandwidth (STREAM rows)",
    "kernel_overhead_us": "per-kernel launch gap (the smallest XLA GEMM rows)",
    "nccl_launch_us": "host time to launch one NCCL kernel: median time / N of the node's Azure nccl-tests "
    "-g N all_reduce rows of 1-32 KiB (4 per node type; no row: carried over)",
}
#: Module-level constants of the GPU model set from a measurement (name -> what, where).
GPU_MODULE_FITTED = {
    "compute.FLASH_CTA_FIXED_STEPS": "per-CTA fixed work of flash attention, from the FA3 sequence sweep",
    "compute.FLASH_SOFTMAX_HEAD_DIM": "softmax cost in flash attention, from FA2 with and without softmax",
    "compute.FLASH_BWD_RATE": "flash backward rate / forward rate where both passes are tensor-core bound, from "
    "the FlashAttention-2 paper's plots (Blackwell: times the FA4 paper's backward roofline, 2560 / 3328)",
    "compute.HEURISTIC_GEMM_FRACTION": "cuBLAS heuristic pick / autotuned rate (the 30 of 34 heuristic-library "
    "GEMMs of >= 100 GFLOP that the sustained plateau does not cap: Azure cuBLASLt sweeps, FP8 with fast "
    "accumulation as superbenchmark sets it; PyTorch on one H200)",
    "compute.GROUPED_GEMM_FRACTION": "MoE grouped-GEMM rate / the GEMM model's rate for its shapes (30 grouped "
    "kernels on one H200, benchmarks/moe_kernels_h200.json)",
    "compute.MXFP8_GEMM_FRACTION": "MXFP8 GEMM rate / per-tensor FP8 GEMM rate at the same shapes (Transformer "
    "Engine's GEMM profiling guide, pre-quantised operands on B300: 6.812 / 7.161 ms per layer)",
    "collectives.IB_EFFICIENCY": "achieved share of InfiniBand line rate (nccl-tests issues #290, #119)",
    "collectives.P2P_NVLINK_EFFICIENCY": "NCCL send/recv share of NVLink line rate (sendrecv, permute rows)",
    "collectives.NCCL_P2P_CALL_US": "host enqueue of one ncclSend/ncclRecv in a group, µs: slope per call of the "
    "XLA table's all-to-all floors (fit with microbench.XLA_A2A_ISSUE_US); also an all-to-all's launch floor",
}
#: How a benchmark harness issued its collectives, read from the harness's measurements rather
#: than its code (validation/microbench.py, ``harness_nccl``): discrete settings, fitted all the same.
HARNESS_FITTED = {
    "microbench.XLA_TABLE_NCCL": "XLA perf-table harness: NVLS for all-reduce only, no LL protocol, NVLS "
    "chunks paying NVLS's hop (inferred from the table's large-size bus bandwidth, its small-message floors "
    "and its NVLS all-reduce ramp on H100, B200 and GB200)",
    "microbench.XLA_TABLE_MULTIHOST_NCCL": "XLA perf-table harness on the GB200 NVL72 rows (a run over 16-18 compute "
    "trays): NCCL's tuner counting each 4-GPU tray as a node, LL allowed (inferred from the table's all-gather, "
    "reduce-scatter and all-reduce floors at 64 and 72 GPUs)",
    "microbench.XLA_A2A_ISSUE_US": "XLA perf-table harness: fixed host issue of an all-to-all that the table's host "
    "timer sees, µs (least squares with collectives.NCCL_P2P_CALL_US on the table's all-to-all floors: medians of "
    "its 2-64 KiB rows, H100 and B200 at 2/4/8 GPUs, GB200 at 64/72)",
}
#: TPU fields the model assumes (no TPU microbenchmark exists in the validation data).
TPU_ASSUMED = {
    "gemm_eff": "aligned-matmul rate / peak (assumed 0.85)",
    "hbm_stream_fraction": "streaming share of HBM bandwidth (assumed 0.85)",
}


def fitted_constants(backends: Iterable[str]) -> list[dict[str, Any]]:
    """Every fitted (or, for TPUs, assumed) efficiency constant the given backends use."""
    from echosim.backends import collectives, compute
    from echosim.backends.devices import DEVICES
    from echosim.backends.tpu import TPUS

    rows: list[dict[str, Any]] = []
    used = sorted(set(backends))
    gpus = [b for b in used if b in DEVICES]
    for field_name, what in GPU_FITTED.items():
        values = {b: getattr(DEVICES[b], field_name) for b in gpus if getattr(DEVICES[b], field_name) is not None}
        if values:
            rows.append({"parameter": field_name, "kind": "fitted", "what": what, "values": values})
    if gpus:
        for dotted, what in GPU_MODULE_FITTED.items():
            module, attr = dotted.split(".")
            value = getattr({"compute": compute, "collectives": collectives}[module], attr)
            rows.append({"parameter": dotted, "kind": "fitted", "what": what, "values": {"all GPUs": value}})
    if gpus:
        from echosim.validation import microbench

        for dotted, what in HARNESS_FITTED.items():
            cfg = getattr(microbench, dotted.split(".")[1])
            value = (
                cfg
                if isinstance(cfg, float)
                else f"nvls_gather={cfg.nvls_gather}, protocols={'/'.join(cfg.protocols)}, "
                f"nvls_chunk_hop={cfg.nvls_chunk_hop}" + (", host_nodes=True" if cfg.host_nodes else "")
            )
            rows.append({"parameter": dotted, "kind": "fitted (harness)", "what": what, "values": {"XLA table": value}})
    tpus = [b for b in used if b in TPUS]
    for field_name, what in TPU_ASSUMED.items():
        if tpus:
            values = {b: getattr(TPUS[b], field_name) for b in tpus}
            rows.append({"parameter": field_name, "kind": "assumed", "what": what, "values": values})
    return rows


def format_values(values: dict[str, Any]) -> str:
    """``device value, ...`` for a fitted constant's values (numbers to 4 significant digits)."""
    return ", ".join(f"{k} {v:.4g}" if isinstance(v, float | int) else f"{k} {v}" for k, v in values.items())


def count_constants(rows: list[dict[str, Any]]) -> int:
    """Distinct fitted values (a value shared by several devices, carried over, counts once)."""

    def key(v: Any) -> Any:
        return round(v, 9) if isinstance(v, float | int) else v

    return sum(len({key(v) for v in r["values"].values()}) for r in rows if r["kind"].startswith("fitted"))


# ---- sensitivity ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Knob:
    """A backend parameter varied in the sensitivity table, on every backend that has it."""

    name: str
    family: str  # "gpu" | "tpu"


SENSITIVITY_KNOBS = (
    Knob("gemm_eff_16bit", "gpu"),
    Knob("gemm_eff_fp8", "gpu"),
    Knob("flash_fwd_eff", "gpu"),
    Knob("hbm_stream_GBps", "gpu"),
    Knob("kernel_overhead_us", "gpu"),
    Knob("nccl_launch_us", "gpu"),
    Knob("fa2_fwd_eff", "gpu"),
    Knob("cudnn_fwd_eff", "gpu"),
    Knob("gemm_eff", "tpu"),
    Knob("hbm_stream_fraction", "tpu"),
)


def _specs(family: str) -> dict[str, Any]:
    from echosim.backends.devices import DEVICES
    from echosim.backends.tpu import TPUS

    return dict(DEVICES) if family == "gpu" else dict(TPUS)


def _moved(spec: Any, name: str, factor: float) -> float | None:
    value = getattr(spec, name, None)
    if value is None:
        return None
    moved = value * factor
    limit = (
        1.0
        if name
        in (
            "gemm_eff_16bit",
            "gemm_eff_fp8",
            "flash_fwd_eff",
            "fa2_fwd_eff",
            "cudnn_fwd_eff",
            "gemm_eff",
            "hbm_stream_fraction",
        )
        else None
    )
    if name == "hbm_stream_GBps":
        limit = spec.hbm_GBps
    return min(moved, limit) if limit is not None else moved


def sensitivity(
    cases: str | Path,
    baseline: Validation,
    step: float = 0.10,
    knobs: Iterable[Knob] = SENSITIVITY_KNOBS,
    progress: Callable[[str], None] | None = None,
) -> dict[str, dict[str, dict[str, Any]]]:
    """{knob: {"-10%": groups, "+10%": groups}}: the group errors with that knob moved on every backend."""
    from echosim.calibrate.store import CalibrationStore

    base_rows = {r.case_id: r for r in baseline.rows}
    out: dict[str, dict[str, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "sensitivity.sqlite"
        store = CalibrationStore(db, create=True)
        try:
            for knob in knobs:
                for sign, factor in ((f"-{step:.0%}", 1 - step), (f"+{step:.0%}", 1 + step)):
                    name = f"{knob.name}{'-' if factor < 1 else '+'}"
                    moved = {b: _moved(s, knob.name, factor) for b, s in _specs(knob.family).items()}
                    for backend, value in moved.items():
                        if value is not None:
                            what = f"{knob.name} x {factor:g}"
                            store.save(name, backend, {}, {knob.name: (value, what)}, "sensitivity")
                    devices = sorted({r.group["device"] for r in baseline.rows if _backend(r) in moved})
                    if progress:
                        progress(f"{knob.name} {sign}")
                    if not devices:
                        continue
                    moved_rows = validate_cases(cases, [f"device={d}" for d in devices], calibration=f"{db}#{name}")
                    by_id = {r.case_id: r for r in moved_rows.rows}
                    merged = Validation([by_id.get(cid, r) for cid, r in base_rows.items()], baseline.selected_of)
                    out.setdefault(knob.name, {})[sign] = merged.groups()
        finally:
            store.close()
    return out


def _backend(r: Any) -> str:
    return backend_for(r.group["device"]) or ""
