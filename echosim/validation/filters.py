"""``--filter COLUMN=VALUE``: which rows of a cases file to run.

Kept apart from reading so that a filter can name any column of the file, or ``feature``
(the row's layout and parallelism/precision features), with shell wildcards.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable

from echosim.validation.cases import Case, CasesError


def parse_filters(specs: Iterable[str], columns: Iterable[str]) -> list[tuple[str, bool, list[str]]]:
    """``COLUMN=VALUE`` / ``COLUMN!=VALUE`` (shell wildcards allowed); the same column twice means either."""
    known = set(columns) | {"feature"}
    merged: dict[tuple[str, bool], list[str]] = {}
    for spec in specs:
        m = re.fullmatch(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(!=|=)(.*)", spec)
        if not m:
            raise CasesError(f"--filter {spec!r}: expected COLUMN=VALUE or COLUMN!=VALUE")
        column, op, value = m.group(1), m.group(2), m.group(3).strip()
        if column not in known:
            raise CasesError(f"--filter {spec!r}: unknown column {column!r} (columns: {', '.join(sorted(known))})")
        merged.setdefault((column, op == "!="), []).append(value)
    return [(col, negate, values) for (col, negate), values in merged.items()]


def matches(c: Case, filters: list[tuple[str, bool, list[str]]]) -> bool:
    for column, negate, patterns in filters:
        values = c.features() if column == "feature" else [c[column]]
        hit = any(fnmatch.fnmatchcase(v, p) for v in values for p in patterns)
        if hit == negate:
            return False
    return True
