"""Rows of a ``cases.csv``-shaped file, read and checked cell by cell.

Bad input (a missing column, a unit typed into a number, a device nobody knows, a
repeated ``case_id``) is one :class:`CasesError` that names the line, the case and the
column, so that whoever edits the file can fix it without reading code. A row that is
valid but needs something echosim does not model yet is *not* an error here: that is
judged later (:func:`echosim.validation.rows.unsupported`) and reported as a skip.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
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
# Read when present; a file without them is still valid (blank everywhere).
OPTIONAL = (
    "slices",
    "step_time_basis",
    "reported_metric",
    "reported_value",
    "notes",
    "experts",
    "top_k",
    "moe_ffn_hidden",
    "shared_experts",
    "framework",
)
INTEGER_COLUMNS = (
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "head_dim",
    "ffn_hidden",
    "vocab",
    "seq_len",
    "experts",
    "top_k",
    "moe_ffn_hidden",
    "shared_experts",
    "devices",
    "devices_per_node",
    "slices",
    "tp",
    "pp",
    "dp",
    "cp",
    "ep",
    "vpp",
    "sp",
    "zero",
    "micro_batch",
    "global_batch",
)
POSITIVE_COLUMNS = ("step_time_s", "reported_value")
ARCHES = {"gpt": "", "llama": "", "moe": ""}
DTYPES = {"": "", "fp32": "", "bf16": "", "fp16": "", "fp8": "", "mxfp8": "", "nvfp4": ""}
RECOMPUTE = ("", "none", "selective", "full")

#: Device names of cases.csv -> the backend that costs them. ``None``: a real device that
#: echosim has no backend for yet (rows on it are skipped, not rejected). Any registered
#: backend name (a plugin's included) is also accepted as a device name.
DEVICE_BACKENDS: dict[str, str | None] = {
    "a100-40gb": "a100-40gb",
    "a100-80gb": "a100-80gb",
    "h100-sxm": "h100-sxm",
    "h800": "h800",
    "h200": "h200",
    "b200": "b200",
    "gb200": "gb200",
    "tpu-v4": "tpu-v4",
    "tpu-v5e": "tpu-v5e",
    "tpu-v5p": "tpu-v5p",
    "tpu-v6e": "tpu-v6e",
    "mi300x": "mi300x",  # the example plugin (examples/echosim-mi300x)
    "h100-96gb": "h100-96gb",  # Meta Grand Teton H100 96 GB HBM2e (torchtitan rows)
    "b300": "b300",
    "gb300": "gb300",
    "tpu-v3": None,
    "mi325x": None,
    "mi355x": None,
}


class CasesError(EchosimError):
    """A cases file that cannot be read as written; the message names line, case and column."""


@dataclass(frozen=True)
class Case:
    """One parsed row: its text cells and their numeric values (``None`` where blank)."""

    line: int
    cells: dict[str, str]
    numbers: dict[str, float | None]

    def __getitem__(self, column: str) -> str:
        return (self.cells.get(column) or "").strip()

    def int(self, column: str, default: int | None = None) -> int | None:
        """The whole number in ``column`` (``default`` where blank); a column that is not parsed as
        a number is a programming error, never a silent ``default``."""
        if column not in self.numbers:
            raise KeyError(f"column {column!r} is not read as a number (add it to INTEGER_COLUMNS)")
        value = self.numbers[column]
        return default if value is None else int(value)

    @property
    def case_id(self) -> str:
        return self["case_id"]

    @property
    def where(self) -> str:
        return f"line {self.line} ({self.case_id or 'no case_id'})"

    def features(self) -> list[str]:
        """The layout (e.g. ``tp+pp+dp``) and each parallelism/precision feature of the row."""
        degrees = {name: self.int(name, 1) or 1 for name in ("tp", "pp", "dp", "cp", "ep")}
        layout = "+".join(name for name, d in degrees.items() if d > 1) or "single device"
        out = [layout]
        out += [name for name in ("cp", "ep") if degrees[name] > 1]
        if self.int("sp", 0):
            out.append("sp")
        if (self.int("vpp", 1) or 1) > 1:
            out.append("vpp")
        if zero := self.int("zero", 0):
            out.append(f"zero{zero}")
        out.append(self["dtype"] or "16-bit (unstated)")
        return out

    def group(self) -> dict[str, str]:
        return {
            "device": self["device"],
            "arch": self["arch"],
            "source_id": self["source_id"],
            "confidence": self["confidence"],
        }


def _number(text: str, column: str, where: str) -> float | None:
    text = text.strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        unit = re.fullmatch(r"([-+0-9.eE]+)\s*([A-Za-z%/]+)", text)
        hint = f" (a unit typed into the cell? write {unit.group(1)})" if unit else ""
        raise CasesError(f"{where}: column {column!r} is not a number: {text!r}{hint}") from None
    if not math.isfinite(value):
        raise CasesError(f"{where}: column {column!r} must be finite, got {text!r}")
    if column in INTEGER_COLUMNS:
        if value < 0 or value != int(value):
            raise CasesError(f"{where}: column {column!r} must be a whole number >= 0, got {text!r}")
    elif value <= 0:
        raise CasesError(f"{where}: column {column!r} must be positive, got {text!r}")
    return value


def parse_row(line: int, cells: dict[str, str], known_devices: Iterable[str]) -> Case:
    """Check every cell of a row; the first bad one raises :class:`CasesError`."""
    where = f"line {line} ({(cells.get('case_id') or '').strip() or 'no case_id'})"
    if not (cells.get("case_id") or "").strip():
        raise CasesError(f"{where}: column 'case_id' is empty")
    numbers = {col: _number(cells.get(col) or "", col, where) for col in (*INTEGER_COLUMNS, *POSITIVE_COLUMNS)}
    case = Case(line, cells, numbers)
    arch, dtype, recompute, device = case["arch"], case["dtype"], case["recompute"], case["device"]
    if arch not in ARCHES:
        raise CasesError(f"{where}: column 'arch' is {arch!r}; known: {', '.join(ARCHES)}")
    if dtype not in DTYPES:
        raise CasesError(f"{where}: column 'dtype' is {dtype!r}; known: {', '.join(d for d in DTYPES if d)} or blank")
    if recompute not in RECOMPUTE:
        raise CasesError(f"{where}: column 'recompute' is {recompute!r}; known: none, selective, full or blank")
    known = set(known_devices)
    if device not in known:
        near = [d for d in sorted(known) if d.split("-")[0] == device.split("-")[0]] or sorted(known)
        raise CasesError(f"{where}: column 'device' names an unknown device {device!r} (known: {', '.join(near)})")
    for col in ("sp",):
        if case.int(col, 0) not in (0, 1):
            raise CasesError(f"{where}: column {col!r} is a flag (0 or 1), got {case[col]!r}")
    if case.int("zero", 0) not in (0, 1, 2, 3):
        raise CasesError(f"{where}: column 'zero' is a ZeRO stage (0-3), got {case['zero']!r}")
    return case


def read_cases(path: str | Path, known_devices: Iterable[str] | None = None) -> list[Case]:
    """Every row of a cases file, checked; the first bad cell raises :class:`CasesError`."""
    devices = list(known_devices) if known_devices is not None else known_device_names()
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            missing = [c for c in REQUIRED if c not in header]
            if missing:
                raise CasesError(f"{path}: line 1 (header): missing column(s) {', '.join(map(repr, missing))}")
            cases: list[Case] = []
            seen: dict[str, int] = {}
            for cells in reader:
                if not any((v or "").strip() for v in cells.values() if isinstance(v, str)):
                    continue  # a blank line
                if None in cells:
                    raise CasesError(f"{path}: line {reader.line_num}: more cells than the header has columns")
                if None in cells.values():
                    raise CasesError(f"{path}: line {reader.line_num}: fewer cells than the header has columns")
                try:
                    case = parse_row(reader.line_num, cells, devices)
                except CasesError as exc:
                    raise CasesError(f"{path}: {exc}") from None
                if case.case_id in seen:
                    raise CasesError(f"{path}: {case.where}: column 'case_id' repeats line {seen[case.case_id]}")
                seen[case.case_id] = case.line
                cases.append(case)
            return cases
    except OSError as exc:
        raise CasesError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise CasesError(f"{path}: not a UTF-8 CSV file") from None
    except csv.Error as exc:
        raise CasesError(f"{path}: not a CSV file: {exc}") from None


def known_device_names(registry: Any = None) -> list[str]:
    """Device names a cases file may use: the table above plus every registered backend."""
    if registry is None:
        from echosim.plugins import get_registry

        registry = get_registry()
    return sorted(set(DEVICE_BACKENDS) | set(registry.backends))


def backend_for(device: str) -> str | None:
    """The backend that costs a device of the file (``None``: no backend for it yet)."""
    return DEVICE_BACKENDS.get(device, device)
