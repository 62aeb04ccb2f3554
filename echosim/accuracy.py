"""How far echosim is from published runs: tables for the CLI, constants, sensitivity.

* :func:`print_cases` renders a :class:`~echosim.validate.Validation` (as ``as_dict()``) for
  ``echosim validate --cases``: rows, groups, skip reasons, targets, fitted constants.
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

from echosim.validate import TARGET_GROUP, TARGET_MAPE, TARGET_ROW, Validation, validate_cases

# ---- constants fitted to measurements ---------------------------------------------------------------

#: Per-device fields of the GPU model set from a measurement (echosim/backends/devices.py).
GPU_FITTED = {
    "gemm_eff_16bit": "16-bit GEMM rate / peak at the best measured shape (MAMF, cuBLASLt rows of microbench.csv)",
    "gemm_eff_fp8": "fp8 GEMM rate / peak at the best measured shape (MAMF, cuBLASLt rows)",
    "flash_fwd_eff": "flash-attention forward rate / peak at one measured shape (FA2/FA3 rows)",
    "hbm_stream_GBps": "achievable HBM bandwidth (STREAM rows)",
    "kernel_overhead_us": "per-kernel launch gap (the smallest XLA GEMM rows)",
}
#: Module-level constants of the GPU model set from a measurement (name -> what, where).
GPU_MODULE_FITTED = {
    "compute.FLASH_CTA_FIXED_STEPS": "per-CTA fixed work of flash attention, from the FA3 sequence sweep",
    "compute.FLASH_SOFTMAX_HEAD_DIM": "softmax cost in flash attention, from FA2 with and without softmax",
    "compute.FLASH_BWD_RATE": "flash backward rate / forward rate, from the FlashAttention-2 paper's plots",
    "collectives.IB_EFFICIENCY": "achieved share of InfiniBand line rate (nccl-tests issues #290, #119)",
    "collectives.P2P_NVLINK_EFFICIENCY": "NCCL send/recv share of NVLink line rate (sendrecv, permute rows)",
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
    tpus = [b for b in used if b in TPUS]
    for field_name, what in TPU_ASSUMED.items():
        if tpus:
            values = {b: getattr(TPUS[b], field_name) for b in tpus}
            rows.append({"parameter": field_name, "kind": "assumed", "what": what, "values": values})
    return rows


def count_constants(rows: list[dict[str, Any]]) -> int:
    """Distinct fitted values (a value shared by several devices, carried over, counts once)."""
    return sum(len({round(v, 9) for v in r["values"].values()}) for r in rows if r["kind"] == "fitted")


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
        1.0 if name in ("gemm_eff_16bit", "gemm_eff_fp8", "flash_fwd_eff", "gemm_eff", "hbm_stream_fraction") else None
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
    from echosim.validate import backend_for

    return backend_for(r.group["device"]) or ""


# ---- CLI rendering --------------------------------------------------------------------------------------


def _pct(x: float | None, signed: bool = True) -> str:
    if x is None:
        return ""
    return f"{100 * x:+.1f}%" if signed else f"{100 * x:.1f}%"


def print_cases(result: dict[str, Any], groups_only: bool = False, console: Any = None) -> None:
    """Rows, groups per key, targets, skip reasons and fitted constants of ``echosim validate --cases``."""
    import click
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    if not groups_only:
        rows = Table("case", "device", "feature", "measured s", "predicted s", "error", "skipped", title="cases")
        for r in result["rows"]:
            measured, predicted = r.get("measured_step_time_s"), r.get("predicted_step_time_s")
            rows.add_row(
                r["case_id"],
                r["device"],
                ",".join(r["feature"]),
                "" if measured is None else f"{measured:.4g}",
                "" if predicted is None else f"{predicted:.4g}",
                _pct(r.get("error")),
                r.get("skipped", ""),
            )
        console.print(rows)
    groups = Table("group", "rows", "MAPE", "mean error", "max", "within 15%", title="mean absolute percentage error")
    for name, g in result["groups"].items():
        groups.add_row(
            name,
            str(g["rows"]),
            _pct(g["mape"], False),
            _pct(g["mean_error"]),
            _pct(g["max"], False),
            f"{g['within_15pct']}/{g['rows']}",
        )
    console.print(groups)
    t = result["targets"]
    if t["target_group_mape"] is not None:
        met = "met" if t["target_group_mape"] <= TARGET_MAPE else "NOT met"
        click.echo(f"{TARGET_GROUP}: MAPE {_pct(t['target_group_mape'], False)} (target {TARGET_MAPE:.0%}: {met})")
    over = t["rows_over_row_target"]
    click.echo(f"rows over {TARGET_ROW:.0%}: {len(over)} of {result['compiled']}")
    click.echo(
        f"{result['compiled']} cases compiled, {result['skipped']} skipped"
        f" ({result['selected']} selected of {result['in_file']} in the file):"
    )
    for reason, count in result["skip_reasons"].items():
        click.echo(f"  {count:4d}  {reason}")
    backends = {r["device"] for r in result["rows"] if "error" in r}
    from echosim.validate import backend_for

    constants = fitted_constants(b for d in backends if (b := backend_for(d)))
    if constants:
        click.echo(f"{count_constants(constants)} constants fitted to microbenchmarks (none to these rows):")
        for c in constants:
            values = ", ".join(f"{k} {v:.4g}" for k, v in c["values"].items())
            click.echo(f"  {c['parameter']} ({c['kind']}): {c['what']} [{values}]")
