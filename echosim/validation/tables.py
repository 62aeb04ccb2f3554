"""The terminal tables of ``echosim validate``, drawn from the results' ``as_dict()``.

Both commands print from the same dictionaries ``--json`` writes, so a table can never
show a number the JSON does not hold.
"""

from __future__ import annotations

from typing import Any

import click

from echosim.validation.accuracy import count_constants, fitted_constants, format_values
from echosim.validation.cases import backend_for
from echosim.validation.stats import TARGET_GROUP, TARGET_MAPE, TARGET_ROW


def _pct(x: float | None, signed: bool = True) -> str:
    if x is None:
        return ""
    return f"{100 * x:+.1f}%" if signed else f"{100 * x:.1f}%"


def print_cases(result: dict[str, Any], groups_only: bool = False, console: Any = None) -> None:
    """Rows, groups per key, targets, skip reasons and fitted constants of ``echosim validate --cases``."""
    from rich.table import Table

    from echosim.terminal import console as terminal_console

    console = console or terminal_console()
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
    by_source = ", ".join(f"{k} {v}" for k, v in result.get("not_fitting_by_source", {}).items())
    click.echo(
        f"predicted not to fit: {result.get('not_fitting', 0)} of {result['compiled']} compiled rows"
        + (f" ({by_source})" if by_source else "")
    )
    click.echo(
        f"{result['compiled']} cases compiled, {result['skipped']} skipped"
        f" ({result['selected']} selected of {result['in_file']} in the file):"
    )
    for reason, count in result["skip_reasons"].items():
        click.echo(f"  {count:4d}  {reason}")
    backends = {r["device"] for r in result["rows"] if "error" in r}
    constants = fitted_constants(b for d in backends if (b := backend_for(d)))
    if constants:
        click.echo(f"{count_constants(constants)} constants fitted to microbenchmarks (none to these rows):")
        for c in constants:
            values = format_values(c["values"])
            click.echo(f"  {c['parameter']} ({c['kind']}): {c['what']} [{values}]")


def print_microbench(result: dict[str, Any], groups_only: bool = False) -> None:
    """Rows, per-group errors against their targets and skip reasons of ``echosim validate --microbench``."""
    from rich.table import Table

    from echosim.terminal import console as terminal_console

    console = terminal_console()
    if not groups_only:
        rows = Table("line", "device", "op", "metric", "measured", "predicted", "error", title="microbench rows")
        for r in result["rows"]:
            if "skipped" in r:
                continue
            rows.add_row(
                str(r["line"]),
                r["device"],
                r["op"],
                r["metric"],
                f"{r['measured']:.4g}",
                f"{r['predicted']:.4g}",
                _pct(r["error"]),
            )
        console.print(rows)
    groups = Table("group (device, op, scope, regime)", "rows", "MAPE", "max", "target", "meets", title="per group")
    for name, g in result["groups"].items():
        target = "" if g["target"] is None else f"{100 * g['target']:.0f}%"
        meets = "" if g["meets"] is None else ("yes" if g["meets"] else "NO")
        groups.add_row(name, str(g["rows"]), f"{100 * g['mape']:.1f}%", f"{100 * g['max']:.1f}%", target, meets)
    console.print(groups)
    reasons: dict[str, int] = {}
    for r in result["rows"]:
        if "skipped" in r:
            reasons[r["skipped"]] = reasons.get(r["skipped"], 0) + 1
    click.echo(f"{result['predicted']} rows predicted, {result['skipped']} skipped:")
    for reason, count in sorted(reasons.items(), key=lambda kv: -kv[1]):
        click.echo(f"  {count:4d}  {reason}")
