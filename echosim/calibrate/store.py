"""Named calibrations in the calibration database: fitted parameters with the machine they came from.

The database is the SQLite file of :mod:`echosim.calibrate.db` (its ``measurements``
table holds measured kernel times); this module adds two tables:

* ``calibrations``: one row per (name, backend) with the machine's identity (JSON), when
  it was made and how (``source``);
* ``parameters``: the fitted values, one row per (name, backend, parameter), each with a
  sentence saying what it is.

Measured kernels of a calibration live in ``measurements`` under the backend key
``NAME@BACKEND``, so that they never mix with another calibration's or with the rows
stored under a backend's own name (which a whole database file applies to that backend).

A calibration is referred to as ``NAME`` (in the default database: ``$ECHOSIM_CALIBRATION``
or ``~/.local/share/echosim/calibration.sqlite``), ``PATH`` (an existing database file: its
most recent calibration, and its measured rows) or ``PATH#NAME``.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from echosim.calibrate.db import ENV_VAR, CalibrationDB, CalibrationError, Measurement

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS calibrations (
        name TEXT NOT NULL,
        backend TEXT NOT NULL,
        machine TEXT NOT NULL,
        created TEXT NOT NULL,
        source TEXT NOT NULL,
        PRIMARY KEY (name, backend)
    )""",
    """CREATE TABLE IF NOT EXISTS parameters (
        name TEXT NOT NULL,
        backend TEXT NOT NULL,
        param TEXT NOT NULL,
        value REAL NOT NULL,
        what TEXT NOT NULL,
        PRIMARY KEY (name, backend, param)
    )""",
)


def default_path() -> Path:
    """``$ECHOSIM_CALIBRATION`` if set, else the per-user data directory."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env)
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "echosim" / "calibration.sqlite"


def measurement_key(name: str, backend: str) -> str:
    """The ``backend`` column under which a calibration's measured kernels are stored."""
    return f"{name}@{backend}"


@dataclass
class Calibration:
    """One named calibration: per backend, its fitted parameters and the machine it was made on."""

    name: str
    path: Path
    parameters: dict[str, dict[str, float]] = field(default_factory=dict)  # backend -> param -> value
    what: dict[str, dict[str, str]] = field(default_factory=dict)  # backend -> param -> description
    machine: dict[str, dict[str, Any]] = field(default_factory=dict)  # backend -> identity
    created: dict[str, str] = field(default_factory=dict)
    source: dict[str, str] = field(default_factory=dict)
    measured: dict[str, int] = field(default_factory=dict)  # backend -> measured kernels

    @property
    def backends(self) -> list[str]:
        return sorted(self.parameters)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": str(self.path),
            "backends": {
                b: {
                    "parameters": self.parameters[b],
                    "what": self.what[b],
                    "machine": self.machine[b],
                    "created": self.created[b],
                    "source": self.source[b],
                    "measured_kernels": self.measured.get(b, 0),
                }
                for b in self.backends
            },
        }


class CalibrationStore:
    """The calibration database file, read and written."""

    def __init__(self, path: str | Path, create: bool = False) -> None:
        self.path = Path(path)
        if not create and not self.path.exists():
            raise CalibrationError(f"calibration database {self.path}: no such file (run `echosim calibrate`)")
        if create:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = CalibrationDB(self.path)  # an existing file: read-only until something is saved
        if create:
            self._writable()

    def _writable(self) -> sqlite3.Connection:
        conn = self.db.writable()
        try:
            for statement in SCHEMA:
                conn.execute(statement)
            conn.commit()
        except sqlite3.Error as exc:
            raise CalibrationError(f"calibration database {self.path}: {exc}") from None
        self.db._tables |= {"calibrations", "parameters"}
        return conn

    def _select(self, table: str, query: str, args: tuple[str, ...] = ()) -> list[tuple[Any, ...]]:
        if not self.db.has_table(table):
            return []
        try:
            return self._conn.execute(query, args).fetchall()
        except sqlite3.Error as exc:
            raise CalibrationError(f"calibration database {self.path}: {exc}") from None

    @property
    def _conn(self) -> sqlite3.Connection:
        return self.db._conn

    def close(self) -> None:
        self.db.close()

    def save(
        self,
        name: str,
        backend: str,
        machine: dict[str, Any],
        parameters: dict[str, tuple[float, str]],
        source: str,
        measurements: list[Measurement] = (),  # type: ignore[assignment]
    ) -> None:
        """Store (or replace) calibration ``name`` for ``backend``: parameters as {param: (value, what)}."""
        if not name or "#" in name or "@" in name:
            raise CalibrationError(f"calibration name {name!r} must be non-empty without '#' or '@'")
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self._writable()
        with self._conn:
            self._conn.execute("DELETE FROM parameters WHERE name = ? AND backend = ?", (name, backend))
            self._conn.execute(
                "INSERT OR REPLACE INTO calibrations VALUES (?, ?, ?, ?, ?)",
                (name, backend, json.dumps(machine, sort_keys=True), now, source),
            )
            for param, (value, what) in sorted(parameters.items()):
                self._conn.execute(
                    "INSERT INTO parameters VALUES (?, ?, ?, ?, ?)", (name, backend, param, float(value), what)
                )
        key = measurement_key(name, backend)
        self.db.put_many(Measurement(key, m.op, m.shape, m.dtype, m.seconds, m.source) for m in measurements)

    def names(self) -> list[str]:
        """Calibration names, most recent first."""
        query = "SELECT name, MAX(created) FROM calibrations GROUP BY name ORDER BY 2 DESC, 1"
        rows = self._select("calibrations", query)
        return [str(r[0]) for r in rows]

    def load(self, name: str) -> Calibration:
        rows = self._select(
            "calibrations", "SELECT backend, machine, created, source FROM calibrations WHERE name = ?", (name,)
        )
        if not rows:
            known = ", ".join(self.names()) or "none"
            raise CalibrationError(f"no calibration named {name!r} in {self.path} (known: {known})")
        cal = Calibration(name, self.path)
        for backend, machine, created, source in rows:
            cal.parameters[backend], cal.what[backend] = {}, {}
            try:
                cal.machine[backend] = json.loads(machine)
            except (TypeError, ValueError):
                raise CalibrationError(
                    f"calibration database {self.path}: calibration {name!r} ({backend}): machine is not JSON"
                ) from None
            cal.created[backend], cal.source[backend] = created, source
            cal.measured[backend] = len(self.db.table(measurement_key(name, backend)))
        for backend, param, value, what in self._select(
            "parameters", "SELECT backend, param, value, what FROM parameters WHERE name = ? ORDER BY param", (name,)
        ):
            if (
                backend not in cal.parameters
                or not isinstance(param, str)
                or isinstance(value, bool)
                or not isinstance(value, (int, float))
            ):
                raise CalibrationError(
                    f"calibration database {self.path}: parameter {param!r} of {name!r} ({backend}) "
                    f"is not a number of a listed backend: {value!r}"
                )
            if not math.isfinite(value):
                raise CalibrationError(f"calibration database {self.path}: parameter {param!r} is {value!r}")
            cal.parameters[backend][param] = value
            cal.what[backend][param] = what
        return cal


def is_database(ref: str) -> bool:
    """Whether ``ref`` names a whole database file (``PATH``), not one calibration in it."""
    return "#" not in ref and Path(ref).is_file()


def resolve(ref: str) -> tuple[Path, str]:
    """``NAME``, ``PATH`` or ``PATH#NAME`` -> (database file, calibration name).

    A database file that holds measured rows but no named calibration gives the name ``""``.
    """
    if "#" in ref:
        path_text, name = ref.rsplit("#", 1)
        return Path(path_text), name
    if is_database(ref):
        store = CalibrationStore(ref)
        try:
            names, measured = store.names(), store.db.backends()
        finally:
            store.close()
        if not names and not measured:
            raise CalibrationError(f"calibration database {ref} holds no calibration")
        return Path(ref), names[0] if names else ""
    if os.sep in ref or ref.endswith((".sqlite", ".db")):
        raise CalibrationError(f"--calibration {ref}: no such file")
    return default_path(), ref


def load_calibration(ref: str) -> Calibration:
    """The calibration ``ref`` names; for a database of measured rows only, an empty one."""
    path, name = resolve(ref)
    store = CalibrationStore(path)
    try:
        return store.load(name) if name else Calibration(name, path)
    finally:
        store.close()
