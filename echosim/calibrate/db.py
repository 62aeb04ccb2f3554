"""Measured op and collective times that take precedence over the analytic models.

A calibration database is one SQLite file (stdlib ``sqlite3``) with a row per measured
(backend, op, shape, dtype): the shape is a canonical text key built from the op's
attributes (:func:`node_key`, :func:`collective_key`), so a measurement applies exactly
to the op it was taken on and nothing is interpolated. :class:`CalibratedBackend` wraps
any backend and answers from the table first.

Nothing here is applied behind the caller's back: a backend answers from a database only
when :func:`echosim.calibrate.apply_calibration` (``--calibration`` of ``echosim compile``)
or :func:`echosim.calibrate.apply_measurements` (its rows alone) wraps it.
:data:`ENV_VAR` is where the command line looks for a default database.
"""

from __future__ import annotations

import copy
import math
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from echosim.backends.base import Backend, OverlapModel, Placement
from echosim.errors import EchosimError
from echosim.ir.graph import Node
from echosim.ir.ops import AttentionAttrs, MatmulAttrs, OpKind, OptimizerAttrs, Phase

#: The default calibration database of the command line and of ``echosim calibrate --db``.
ENV_VAR = "ECHOSIM_CALIBRATION"
#: Start of the warning that an op was costed outside the sizes a calibration measured.
EXTRAPOLATED = "calibration extrapolated"
#: Start of the warning that a fitted parameter sits at the bound of its search.
CLAMPED = "calibration clamped"
#: The dtype column of collective rows (a collective is keyed by bytes, not element type).
COLLECTIVE_DTYPE = "-"

SCHEMA = """
CREATE TABLE IF NOT EXISTS measurements (
    backend TEXT NOT NULL,
    op TEXT NOT NULL,
    shape TEXT NOT NULL,
    dtype TEXT NOT NULL,
    seconds REAL NOT NULL CHECK (seconds > 0),
    source TEXT NOT NULL,
    PRIMARY KEY (backend, op, shape, dtype)
)
"""


class CalibrationError(EchosimError):
    """A calibration file that cannot be opened or holds impossible values."""


@dataclass(frozen=True, slots=True)
class Measurement:
    backend: str
    op: str
    shape: str
    dtype: str
    seconds: float
    source: str


def matmul_key(m: int, n: int, k: int, batch: int = 1) -> str:
    return f"m={m},n={n},k={k},batch={batch}"


def attention_key(a: AttentionAttrs, backward: bool) -> str:
    return (
        f"batch={a.batch},heads={a.heads},kv_heads={a.kv_heads},q={a.q_len},kv={a.kv_len},d={a.head_dim},"
        f"causal={int(a.causal)},flash={int(a.flash)},bwd={int(backward)}" + (f",window={a.window}" if a.window else "")
    )


def collective_key(nbytes: int, p: Placement) -> str:
    return f"bytes={nbytes},size={p.size},nodes={p.nodes},per_node={p.per_node},concurrent={p.concurrent_per_node}"


def node_key(node: Node, io_bytes: int) -> tuple[str, str, str]:
    """(op, shape, dtype) under which a compute node's measurement is stored."""
    dtype = node.out.dtype.value
    if isinstance(node.attrs, MatmulAttrs):
        a = node.attrs
        return "matmul", matmul_key(a.m, a.n, a.k, a.batch), dtype
    if isinstance(node.attrs, AttentionAttrs):
        return "attention", attention_key(node.attrs, node.phase is Phase.BACKWARD), dtype
    if isinstance(node.attrs, OptimizerAttrs) and node.attrs.host_ranks:  # the host's step: no device measurement of it
        return f"{node.op.value}_host", f"bytes={io_bytes}", dtype
    return node.op.value, f"bytes={io_bytes}", dtype


#: Every table an echosim calibration file may hold, with the columns each needs (``store.py`` adds two).
TABLES: dict[str, tuple[str, ...]] = {
    "measurements": ("backend", "op", "shape", "dtype", "seconds", "source"),
    "calibrations": ("name", "backend", "machine", "created", "source"),
    "parameters": ("name", "backend", "param", "value", "what"),
}


def open_read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection (SQLite URI ``mode=ro``): reading a calibration never changes the file."""
    return sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)


def check_schema(conn: sqlite3.Connection, path: Path) -> set[str]:
    """The echosim tables ``conn`` holds; a file with any other table, or ours without a column, is refused."""
    try:
        names = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        foreign = sorted(n for n in names if n not in TABLES and not n.startswith("sqlite_"))
        if foreign:
            raise CalibrationError(
                f"{path} is not an echosim calibration database (it holds table(s) {', '.join(foreign[:5])})"
            )
        for name in names:
            if name in TABLES:
                columns = {row[1] for row in conn.execute(f"PRAGMA table_info({name})")}
                missing = [c for c in TABLES[name] if c not in columns]
                if missing:
                    raise CalibrationError(
                        f"{path} is not an echosim calibration database (table {name!r} lacks {', '.join(missing)})"
                    )
    except sqlite3.Error as exc:
        raise CalibrationError(f"calibration database {path}: {exc}") from None
    return {n for n in names if n in TABLES}


class CalibrationDB:
    """One SQLite calibration file; reads are served from memory after the first query.

    An existing file is opened read-only (``mode=ro``) and its schema checked, so reading
    never writes (no ``CREATE TABLE`` on someone else's database); the first :meth:`put`
    opens it for writing. A path that does not exist yet is created with the schema.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            if self.path.exists():
                self._conn = open_read_only(self.path)
                self._tables = check_schema(self._conn, self.path)
                self._writable = False
            else:
                self._conn = sqlite3.connect(self.path)
                self._conn.execute(SCHEMA)
                self._conn.commit()
                self._tables, self._writable = {"measurements"}, True
        except sqlite3.Error as exc:
            raise CalibrationError(f"calibration database {self.path}: {exc}") from None
        self._cache: dict[str, dict[tuple[str, str, str], float]] = {}

    def writable(self) -> sqlite3.Connection:
        """The connection, reopened for writing (the schema created) the first time a caller writes."""
        if not self._writable:
            self._conn.close()
            try:
                self._conn = sqlite3.connect(self.path)
                self._conn.execute(SCHEMA)
                self._conn.commit()
            except sqlite3.Error as exc:
                raise CalibrationError(f"calibration database {self.path}: {exc}") from None
            self._tables.add("measurements")
            self._writable = True
        return self._conn

    def has_table(self, name: str) -> bool:
        return name in self._tables

    def close(self) -> None:
        self._conn.close()

    def put(self, backend: str, op: str, shape: str, dtype: str, seconds: float, source: str) -> None:
        """Store (or replace) one measurement; ``source`` says where it came from."""
        if not (seconds > 0) or not math.isfinite(seconds):
            raise CalibrationError(f"calibration {backend}/{op}/{shape}: seconds must be positive, got {seconds!r}")
        if not source.strip():
            raise CalibrationError(f"calibration {backend}/{op}/{shape}: a source is required")
        row = (backend, op, shape, dtype, seconds, source)
        conn = self.writable()
        conn.execute("INSERT OR REPLACE INTO measurements VALUES (?, ?, ?, ?, ?, ?)", row)
        conn.commit()
        self._cache.pop(backend, None)

    def put_many(self, rows: Iterable[Measurement]) -> int:
        count = 0
        for r in rows:
            self.put(r.backend, r.op, r.shape, r.dtype, r.seconds, r.source)
            count += 1
        return count

    def table(self, backend: str) -> dict[tuple[str, str, str], float]:
        """Every measurement of ``backend`` keyed by (op, shape, dtype)."""
        if backend not in self._cache:
            rows = self._select("SELECT op, shape, dtype, seconds FROM measurements WHERE backend = ?", (backend,))
            for op, shape, dtype, seconds in rows:
                _check_seconds(self.path, f"{backend}/{op}/{shape}/{dtype}", seconds)
            self._cache[backend] = {(op, shape, dtype): seconds for op, shape, dtype, seconds in rows}
        return self._cache[backend]

    def _select(self, query: str, args: tuple[str, ...] = ()) -> list[tuple[Any, ...]]:
        """Rows of a query on the measurements table; none when the file has no such table yet."""
        if "measurements" not in self._tables:
            return []
        try:
            return self._conn.execute(query, args).fetchall()
        except sqlite3.Error as exc:
            raise CalibrationError(f"calibration database {self.path}: {exc}") from None

    def backends(self) -> list[str]:
        """Every backend key that has a measurement (a calibration's ``NAME@BACKEND`` keys included)."""
        return [str(row[0]) for row in self._select("SELECT DISTINCT backend FROM measurements ORDER BY 1")]

    def get(self, backend: str, op: str, shape: str, dtype: str) -> float | None:
        return self.table(backend).get((op, shape, dtype))

    def entries(self, backend: str | None = None) -> list[Measurement]:
        query = "SELECT backend, op, shape, dtype, seconds, source FROM measurements"
        args: tuple[str, ...] = ()
        if backend is not None:
            query += " WHERE backend = ?"
            args = (backend,)
        rows = self._select(query + " ORDER BY backend, op, shape, dtype", args)
        for row in rows:
            _check_seconds(self.path, "/".join(map(str, row[:4])), row[4])
        return [Measurement(*row) for row in rows]


def _check_seconds(path: Path, what: str, seconds: Any) -> None:
    """A measured time must be a positive finite number (a file written by hand may hold text)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not (0 < seconds < math.inf):
        raise CalibrationError(f"calibration database {path}: {what}: seconds must be positive, got {seconds!r}")


def _numbers(shape: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in shape.split(","):
        key, _, value = part.partition("=")
        if value.lstrip("-").isdigit():
            out[key] = int(value)
    return out


def _kind_and_size(op: object, shape: object) -> tuple[str, float, str] | None:
    """(kind, size, unit) of a measurement key: FLOPs of a matmul or attention, bytes of anything else;
    ``None`` for a key that names no size (a file written by hand may hold anything)."""
    if not isinstance(op, str) or not isinstance(shape, str):
        return None
    x = _numbers(shape)
    if op == "matmul" and {"m", "n", "k"} <= x.keys():
        return "matmul", 2.0 * x["m"] * x["n"] * x["k"] * x.get("batch", 1), "FLOPs"
    if op == "attention" and {"batch", "heads", "q", "kv", "d"} <= x.keys():
        return (
            f"attention{' backward' if x.get('bwd') else ''}",
            4.0 * x["batch"] * x["heads"] * x["q"] * x["kv"] * x["d"],
            "FLOPs",
        )
    if "bytes" in x:
        collective = op in {k.value for k in OpKind if k.is_collective}
        return (op if collective else "memory-bound op"), float(x["bytes"]), "bytes"
    return None


class CalibratedBackend:
    """Any backend, with measured times from a :class:`CalibrationDB` taking precedence.

    An op no row measured is answered by the wrapped (fitted) model; when its size lies outside
    the sizes measured for its kind, that answer is an extrapolation, counted for the report's
    warning (:meth:`extrapolations`).
    """

    def __init__(self, inner: Backend, db: CalibrationDB, name: str | None = None) -> None:
        self.inner = inner
        self.db = db
        self.name = name or inner.name
        self._table = db.table(self.name)
        self.hits = 0
        self._measured: dict[str, tuple[float, float, str]] = {}  # kind -> (smallest, largest, unit)
        for op, shape, _dtype in self._table:
            found = _kind_and_size(op, shape)
            if found:
                kind, size, unit = found
                lo, hi, _ = self._measured.get(kind, (size, size, unit))
                self._measured[kind] = (min(lo, size), max(hi, size), unit)
        self._outside: dict[str, tuple[int, float]] = {}  # kind -> (count, furthest size)

    def _fallback(self, op: str, shape: str) -> None:
        found = _kind_and_size(op, shape)
        if not found or found[0] not in self._measured:
            return
        kind, size, _ = found
        lo, hi, _ = self._measured[kind]
        if lo <= size <= hi:
            return
        count, furthest = self._outside.get(kind, (0, size))
        ratio = max(size / hi, lo / size)  # how far outside, as a factor
        if ratio < max(furthest / hi, lo / furthest):
            size = furthest
        self._outside[kind] = (count + 1, size)

    def extrapolations(self) -> list[str]:
        """One line per kind of op costed outside the measured sizes (``--strict`` makes them errors)."""
        out = []
        for kind, (count, furthest) in sorted(self._outside.items()):
            lo, hi, unit = self._measured[kind]
            out.append(
                f"{EXTRAPOLATED} for backend {self.name!r}: {count} {kind} shape(s) outside the measured "
                f"{lo:.3g}..{hi:.3g} {unit} (furthest {furthest:.3g}) were costed by the fitted model"
            )
        return out

    def __repr__(self) -> str:
        return f"CalibratedBackend({self.inner!r}, {str(self.db.path)!r})"

    def __getattr__(self, attr: str) -> Any:
        """The wrapped backend's other methods and attributes (``node_devices``, ``formats``,
        ``supports_dtype``, ``static_buffers``, plugin extras): measurements change times only, so a
        calibrated TPU keeps its slice as one node and its static buffer assignment."""
        if attr.startswith("__") or attr == "inner":  # no recursion before __init__ sets inner
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    def for_program(self, graph: Any) -> Any:
        """The wrapped backend's variant for one rank's program (:func:`~echosim.backends.base.for_program`),
        with the same measurements answering first (and the same record of extrapolations)."""
        method = getattr(self.inner, "for_program", None)
        inner = method(graph) if callable(method) else self.inner
        if inner is self.inner:
            return self
        known = self.__dict__.setdefault("_programs", {})
        if id(inner) not in known:
            variant = copy.copy(self)  # shares the measured table and the extrapolation record
            variant.__dict__.pop("_programs", None)
            variant.inner = inner
            known[id(inner)] = (inner, variant)
        return known[id(inner)][1]

    def op_time_s(self, node: Node, io_bytes: int) -> float:
        key = node_key(node, io_bytes)
        measured = self._table.get(key)
        if measured is not None:
            self.hits += 1
            return measured
        self._fallback(key[0], key[1])
        return self.inner.op_time_s(node, io_bytes)

    def collective_time_s(self, kind: OpKind, nbytes: int, placement: Placement) -> float:
        shape = collective_key(nbytes, placement)
        measured = self._table.get((kind.value, shape, COLLECTIVE_DTYPE))
        if measured is not None:
            self.hits += 1
            return measured
        self._fallback(kind.value, shape)
        return self.inner.collective_time_s(kind, nbytes, placement)

    def overlap(self) -> OverlapModel:
        return self.inner.overlap()

    def memory_bytes(self) -> int:
        return self.inner.memory_bytes()

    def peak_flops(self, dtype: str) -> float:
        return self.inner.peak_flops(dtype)

    def describe(self) -> dict[str, Any]:
        describe = getattr(self.inner, "describe", None)
        out: dict[str, Any] = dict(describe()) if callable(describe) else {}
        out["calibration"] = {"path": str(self.db.path), "entries": len(self._table)}
        return out
