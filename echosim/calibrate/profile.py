"""Import kernel times from a PyTorch profiler (Kineto) trace recorded with shapes.

``torch.profiler.profile(record_shapes=True)`` followed by ``export_chrome_trace`` writes
a JSON trace whose ``cpu_op`` events carry ``Input Dims`` and ``Input type``. Matmuls
(``aten::mm``, ``aten::addmm``, ``aten::bmm``, ``aten::matmul`` leaves) become calibration
rows keyed exactly as echosim keys a matmul node, with the median duration over their
occurrences. On a GPU trace the time is that of the ``kernel`` events launched by the op
(linked by ``External id``), else the op's own CPU duration (a CPU trace).

Only ops echosim can key exactly are imported; everything else is counted and reported.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from echosim.calibrate.db import CalibrationError, Measurement, matmul_key

_DTYPES = {"float": "fp32", "c10::BFloat16": "bf16", "c10::Half": "fp16", "c10::Float8_e4m3fn": "fp8"}


def _matmul_dims(name: str, dims: list[list[int]]) -> tuple[int, int, int, int] | None:
    """(m, n, k, batch) of a matmul op from its input shapes, or None."""
    shapes = [d for d in dims if isinstance(d, list)]
    if name == "aten::addmm" and len(shapes) >= 3:
        (m, k), (k2, n) = shapes[1], shapes[2]
        return (m, n, k, 1) if k == k2 else None
    if name == "aten::mm" and len(shapes) >= 2 and len(shapes[0]) == 2 and len(shapes[1]) == 2:
        (m, k), (k2, n) = shapes[0], shapes[1]
        return (m, n, k, 1) if k == k2 else None
    if name in ("aten::bmm", "aten::baddbmm") and len(shapes) >= 2:
        a, b = (shapes[1], shapes[2]) if name == "aten::baddbmm" else (shapes[0], shapes[1])
        if len(a) == 3 and len(b) == 3 and a[0] == b[0] and a[2] == b[1]:
            return a[1], b[2], a[2], a[0]
    return None


def read_trace(path: str | Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise CalibrationError(f"--from-profile {path}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CalibrationError(f"--from-profile {path}: not a JSON trace ({exc})") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise CalibrationError(f"--from-profile {path}: no 'traceEvents' list (not a Kineto trace)")
    return [e for e in events if isinstance(e, dict)]


def import_profile(path: str | Path, backend_key: str) -> tuple[list[Measurement], dict[str, int]]:
    """Measurements keyed for ``backend_key`` and a count of what was imported and skipped."""
    events = read_trace(path)
    kernels: dict[Any, float] = defaultdict(float)
    for e in events:
        if e.get("cat") == "kernel" and "dur" in e:
            ext = (e.get("args") or {}).get("External id")
            if ext is not None:
                kernels[ext] += float(e["dur"])
    times: dict[tuple[str, str], list[float]] = defaultdict(list)
    counts = {"imported_ops": 0, "skipped_ops": 0, "without_shapes": 0}
    saw_shapes = False
    for e in events:
        if e.get("cat") != "cpu_op" or e.get("ph") != "X":
            continue
        args = e.get("args") or {}
        name = str(e.get("name", ""))
        if "Input Dims" not in args:
            counts["without_shapes"] += 1
            continue
        saw_shapes = True
        dims = _matmul_dims(name, args["Input Dims"])
        types = args.get("Input type") or []
        dtype = next((_DTYPES[t] for t in types if t in _DTYPES), None)
        if dims is None or dtype is None:
            counts["skipped_ops"] += 1
            continue
        ext = args.get("External id")
        micros = kernels.get(ext) if ext in kernels else float(e.get("dur", 0.0))
        if not micros:
            counts["skipped_ops"] += 1
            continue
        m, n, k, b = dims
        times[(matmul_key(m, n, k, b), dtype)].append(micros * 1e-6)
        counts["imported_ops"] += 1
    if not saw_shapes:
        raise CalibrationError(
            f"--from-profile {path}: no op carries 'Input Dims' (record the trace with record_shapes=True)"
        )
    rows = [
        Measurement(backend_key, "matmul", key, dtype, statistics.median(v), f"profile {Path(path).name} ({len(v)}x)")
        for (key, dtype), v in sorted(times.items())
    ]
    counts["kernels"] = len(rows)
    return rows, counts
