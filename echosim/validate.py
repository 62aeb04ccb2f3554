"""Predicted vs published step time, row by row, for files shaped like ``cases.csv``.

Each row's model is rebuilt from its architecture fields, compiled with the row's
device, layout, batch and precision, and compared with the published step time.
Rows that need a feature echosim does not model yet are skipped with the reason
and counted, never silently dropped.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from echosim.errors import EchosimError

REQUIRED = (
    "case_id",
    "source_id",
    "confidence",
    "arch",
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "head_dim",
    "ffn_hidden",
    "vocab",
    "seq_len",
    "device",
    "devices",
    "devices_per_node",
    "dtype",
    "tp",
    "pp",
    "dp",
    "cp",
    "ep",
    "vpp",
    "sp",
    "zero",
    "recompute",
    "micro_batch",
    "global_batch",
    "step_time_s",
)

# cases.csv device names -> backend names (identical where the backend exists)
DEVICE_BACKENDS = {name: name for name in ("a100-40gb", "a100-80gb", "h100-sxm", "h800", "h200", "b200")}


class CasesError(EchosimError):
    pass


@dataclass
class RowResult:
    case_id: str
    group: dict[str, str]
    measured_step_time_s: float | None
    predicted_step_time_s: float | None = None
    skipped: str = ""

    @property
    def error(self) -> float | None:
        if self.predicted_step_time_s is None or not self.measured_step_time_s:
            return None
        return self.predicted_step_time_s / self.measured_step_time_s - 1.0

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"case_id": self.case_id, **self.group, "measured_step_time_s": self.measured_step_time_s}
        if self.skipped:
            d["skipped"] = self.skipped
        else:
            d["predicted_step_time_s"] = self.predicted_step_time_s
            d["error"] = self.error
        return d


@dataclass
class Validation:
    rows: list[RowResult] = field(default_factory=list)

    def groups(self, keys: Iterable[str] = ("device", "arch", "source_id")) -> dict[str, dict[str, Any]]:
        out: dict[str, list[float]] = {}
        for r in self.rows:
            if r.error is None:
                continue
            for key in keys:
                out.setdefault(f"{key}={r.group[key]}", []).append(abs(r.error))
            out.setdefault("overall", []).append(abs(r.error))
        return {k: {"rows": len(v), "mape": sum(v) / len(v)} for k, v in sorted(out.items())}

    def as_dict(self) -> dict[str, Any]:
        compiled = sum(1 for r in self.rows if not r.skipped)
        return {
            "rows": [r.as_dict() for r in self.rows],
            "groups": self.groups(),
            "compiled": compiled,
            "skipped": len(self.rows) - compiled,
        }


def _int(row: dict[str, str], col: str, line: int, default: int | None = None) -> int:
    text = row[col].strip()
    if not text:
        if default is None:
            raise CasesError(f"row {line} ({row.get('case_id', '?')}): column {col!r} is empty")
        return default
    try:
        return int(float(text))
    except ValueError:
        raise CasesError(f"row {line} ({row.get('case_id', '?')}): column {col!r} is not a number: {text!r}") from None


def _float(row: dict[str, str], col: str, line: int) -> float | None:
    text = row[col].strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise CasesError(f"row {line} ({row.get('case_id', '?')}): column {col!r} is not a number: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise CasesError(f"row {line} ({row.get('case_id', '?')}): column {col!r} must be positive: {text!r}")
    return value


def read_cases(path: str | Path) -> list[tuple[int, dict[str, str]]]:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
            if missing:
                raise CasesError(f"{path}: missing column(s) {', '.join(missing)}")
            return [(i + 2, row) for i, row in enumerate(reader)]
    except OSError as exc:
        raise CasesError(f"cannot read {path}: {exc.strerror}") from None


def unsupported(row: dict[str, str]) -> str:
    """Why a row cannot be expressed yet ('' if it can); layout features are judged by Plan."""
    if row["arch"] not in ("gpt", "llama", "moe"):
        return f"architecture {row['arch']!r} is not modelled yet"
    if "MLA attention" in row["notes"]:
        return "multi-head latent attention (MLA) and dense first layers are not modelled yet"
    if row["dtype"].strip() in ("mxfp8", "nvfp4"):
        return f"needs {row['dtype']} training"
    if row["device"] not in DEVICE_BACKENDS:
        return f"no backend for device {row['device']!r} yet"
    if row["step_time_s"].strip() == "":
        return "no published step time"
    return ""


def row_model(row: dict[str, str], line: int) -> Any:
    from echosim.frontend.zoo import ArchConfig

    gpt = row["arch"] == "gpt"
    return ArchConfig(
        arch=row["arch"],
        layers=_int(row, "layers", line),
        hidden=_int(row, "hidden", line),
        heads=_int(row, "heads", line),
        vocab=_int(row, "vocab", line),
        ffn=_int(row, "ffn_hidden", line, 0),
        kv_heads=_int(row, "kv_heads", line, 0),
        head_dim=_int(row, "head_dim", line, 0),
        seq_len=_int(row, "seq_len", line),
        dropout=0.1 if gpt else 0.0,
        tied_embeddings=gpt,
        experts=_int(row, "experts", line, 0) if row["arch"] == "moe" else 0,
        top_k=_int(row, "top_k", line, 0) if row["arch"] == "moe" else 0,
        moe_ffn=_int(row, "moe_ffn_hidden", line, 0) if row["arch"] == "moe" else 0,
        shared_experts=_int(row, "shared_experts", line, 0) if row["arch"] == "moe" else 0,
    )


def row_plan(row: dict[str, str], line: int) -> tuple[Any, Any]:
    from echosim.plan import Cluster, Plan

    dtype = row["dtype"].strip() or "fp16"  # Megatron papers: "16-bit mixed precision"
    recompute = row["recompute"].strip() or "none"
    plan = Plan(
        sp=_int(row, "sp", line, 0) == 1,
        cp=_int(row, "cp", line, 1),
        ep=_int(row, "ep", line, 1),
        zero=_int(row, "zero", line, 0),
        vpp=_int(row, "vpp", line, 1),
        tp=_int(row, "tp", line, 1),
        pp=_int(row, "pp", line, 1),
        dp=_int(row, "dp", line, 1),
        micro_batch=_int(row, "micro_batch", line, 1),
        global_batch=_int(row, "global_batch", line),
        seq_len=_int(row, "seq_len", line),
        dtype=dtype,
        recompute=recompute,
        attention="math" if row["source_id"] in ("narayanan2021", "korthikanti2022") else "flash",
    )
    cluster = Cluster(
        DEVICE_BACKENDS[row["device"]], _int(row, "devices", line), _int(row, "devices_per_node", line, 8)
    )
    if row["arch"] == "moe" and "tokendrop" in row["case_id"]:  # NeMo's token-dropping recipes
        plan = replace(plan, moe_capacity_factor=1.0)
    return plan, cluster


def validate_cases(path: str | Path, filters: dict[str, str] | None = None, progress: Any = None) -> Validation:
    from echosim.compiler import compile as compile_model
    from echosim.plan import PlanError

    rows = read_cases(path)
    for key in filters or {}:
        if rows and key not in rows[0][1]:
            raise CasesError(f"--filter: unknown column {key!r}")
    result = Validation()
    for line, row in rows:
        if filters and any(row.get(k, "") != v for k, v in filters.items()):
            continue
        group = {
            "device": row["device"],
            "arch": row["arch"],
            "source_id": row["source_id"],
            "confidence": row["confidence"],
        }
        measured = _float(row, "step_time_s", line)
        reason = unsupported(row)
        r = RowResult(row["case_id"], group, measured, skipped=reason)
        if not reason:
            plan, cluster = row_plan(row, line)
            try:
                r.predicted_step_time_s = _compile_cfg(compile_model, row_model(row, line), plan, cluster)
            except PlanError as exc:
                text = str(exc)
                r.skipped = f"needs {text.removesuffix(' is not modelled yet')}" if "not modelled" in text else text
            except EchosimError as exc:
                r.skipped = f"does not compile: {exc}"
        result.rows.append(r)
        if progress is not None:
            progress()
    return result


def _compile_cfg(compile_model: Any, cfg: Any, plan: Any, cluster: Any) -> float:
    return float(compile_model(cfg, plan, cluster).step_time_s)
