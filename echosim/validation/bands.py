"""Build the accuracy bands a compile reports (:mod:`echosim.bands`) from the validation table, and check them.

``runs_from_cases`` validates the table's rows and gives each compiled one's group traits and signed error;
``held_out_coverage`` measures what a band holds on a source the table has not seen.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from echosim.bands import MIN_RUNS, PERCENTILES, Traits, band_for, summarise, traits


def runs_from_cases(path: Any, rows: Iterable[Any] | None = None) -> list[tuple[str, Traits, float]]:
    """(source, traits, error) of a cases file's compiled rows; ``rows``: its ``validate`` results, if already run
    (otherwise every row is validated now: about 10 s)."""
    from echosim.validation.cases import read_cases
    from echosim.validation.rows import row_plan
    from echosim.validation.run import validate_cases

    cases = {c.case_id: c for c in read_cases(path)}
    runs = []
    for r in rows if rows is not None else validate_cases(path).rows:
        if r.error is None:
            continue
        c = cases[r.case_id]
        plan, cluster = row_plan(c)
        kind = "moe" if c["arch"] == "moe" else "dense"
        runs.append((c["source_id"], traits(kind, cluster.backend, plan.dtype, plan.tp, plan.pp, plan.cp), r.error))
    return runs


def table_from_cases(path: Any, rows: Iterable[Any] | None = None) -> dict[str, Any]:
    """The stored table, from a cases file (:func:`runs_from_cases`)."""
    return summarise((t, e) for _, t, e in runs_from_cases(path, rows))


def held_out(
    runs: list[tuple[str, Traits, float]], percentiles: tuple[int, int] = PERCENTILES, min_runs: int = MIN_RUNS
) -> list[tuple[Traits, bool]]:
    """Each run that gets a band from the other sources' runs, and whether it lies inside it."""
    out = []
    for source in sorted({s for s, _, _ in runs}):
        table = summarise(((t, e) for s, t, e in runs if s != source), percentiles, min_runs)
        for s, t, e in runs:
            band = band_for(t, table) if s == source else None
            if band is not None:
                out.append((t, band.low <= e <= band.high))
    return out


def held_out_coverage(
    runs: list[tuple[str, Traits, float]], percentiles: tuple[int, int] = PERCENTILES, min_runs: int = MIN_RUNS
) -> tuple[int, int]:
    """How many runs lie inside the band built without their source, of those that get one: what a band holds on
    a source the table has not seen."""
    checked = held_out(runs, percentiles, min_runs)
    return sum(inside for _, inside in checked), len(checked)


def held_out_by_generation(runs: list[tuple[str, Traits, float]]) -> dict[str, tuple[int, int]]:
    """:func:`held_out_coverage` per model kind and device generation ("dense, hopper": (inside, of))."""
    by: dict[str, list[int]] = {}
    for t, inside in held_out(runs):
        counts = by.setdefault(f"{t.kind}, {t.family}", [0, 0])
        counts[0] += inside
        counts[1] += 1
    return {key: (c[0], c[1]) for key, c in sorted(by.items())}


def coverage_on(runs: list[tuple[str, Traits, float]], table: dict[str, Any] | None = None) -> tuple[int, int]:
    """How many of ``runs`` (published runs the bands were not built from) lie inside the band a compile would
    report for them (the stored table by default), of those that get one."""
    checked = [(band, e) for _, t, e in runs if (band := band_for(t, table)) is not None]
    return sum(band.low <= e <= band.high for band, e in checked), len(checked)
