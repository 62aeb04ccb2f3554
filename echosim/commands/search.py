"""``echosim search``: the output side of :mod:`echosim.layout_search` (tables, JSON, progress, the Pareto chart).

The command in :mod:`echosim.cli` parses its options and calls :func:`run`; every figure shown is
one that :func:`echosim.layout_search.search` read from a full compile.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import click

from echosim.layout_search import Evaluated, SearchError, SearchResult, why_better
from echosim.plan import Cluster, Plan

_COLUMNS = ["#", "tp", "pp", "dp", "cp", "ep", "vpp", "sp", "zero", "mb", "recompute", "schedule", "tp_ovl"]


def parse_devices(text: str) -> list[int]:
    """``"256,512,1024"`` -> ``[256, 512, 1024]``; anything else is one line naming --devices."""
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SearchError(f"--devices: expected an integer or a comma-separated list, got {text!r}") from None
    if not counts or any(n < 1 for n in counts):
        raise SearchError(f"--devices: counts must be positive, got {text!r}")
    return list(dict.fromkeys(counts))


@contextmanager
def progress_bar(enabled: bool, label: str) -> Iterator[Callable[[int, int], None]]:
    """A progress bar on stderr with layouts/s and the time left; on a pipe, a line now and then."""
    if not enabled:
        yield lambda done, total: None
        return
    if not sys.stderr.isatty():
        from echosim.terminal import progress

        with progress("compiling layouts", None) as line:
            yield lambda done, total: line(done, total)
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]} layouts/s"),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=None, rate="-")

        def advance(done: int, total: int) -> None:
            speed = bar.tasks[0].speed
            bar.update(task, completed=done, total=total, rate=f"{speed:,.0f}" if speed else "-")

        yield advance


def _degrees(c: Evaluated) -> list[str]:
    p = c.plan
    cp = f"{p.cp} {p.cp_comm}" if p.cp > 1 and p.cp_comm != "p2p" else p.cp  # the ring unless said otherwise
    if p.cp > 1 and p.cp_a2a:  # hierarchical: the all-to-all groups' size x the ring's
        cp = f"{p.cp} a2a{p.cp_a2a}+p2p{p.cp // p.cp_a2a}"
    zero = f"{p.zero} offload" if p.offload_optimizer else p.zero  # the optimizer on the host
    dp = f"{p.dp} {p.embedding_sharding}" if p.embedding_sharding != "none" else p.dp  # and its tables' sharding
    return [str(x) for x in (p.tp, p.pp, dp, cp, p.ep, p.vpp, "on" if p.sp else "-", zero, p.micro_batch,
                             p.recompute, p.schedule, "on" if p.tp_overlap else "-")]  # fmt: skip


def _table(columns: Sequence[str], rows: Sequence[Sequence[str]], title: str = "") -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(*columns, title=title or None)
    for row in rows:
        table.add_row(*row)
    Console(width=200).print(table)


def print_result(
    result: SearchResult,
    top: int,
    rejected: int = 10,
    accuracy: dict[str, Any] | None = None,
    warnings: Sequence[str] = (),
) -> None:
    """The ranked table, why the best beats the runner-up, the best's likely step (``accuracy``) and its compile's
    ``warnings``, rejected layouts with their reasons, the counts."""
    c = result.counts()
    head = (
        f"{result.model} on {result.cluster.devices} x {result.cluster.backend}: space of "
        f"{c['combinations']:,} combinations; {c['not_applicable']:,} not applicable, {c['duplicates']:,} "
        f"equivalent, {c['pruned']:,} pruned before simulation, {c['simulated']:,} simulated, {c['fit']:,} fit"
    )
    click.echo(head)
    rows = []
    for i, e in enumerate(result.ranked[:top], 1):
        rows.append([
            str(i), *_degrees(e), _seconds(e.step_time_s), _rate(e), f"{e.mfu * 100:.1f}%",
            f"{e.peak_bytes / 2**30:.1f}", f"{e.bubble_fraction * 100:.1f}%", _seconds(e.exposed_comm_s),
        ])  # fmt: skip
    rate_name = "tokens/s" if result.ranked and result.ranked[0].tokens_per_s else "samples/s"
    cols = [*_COLUMNS, "step s", rate_name, "MFU", "mem GiB", "bubble", "exp. comm s"]
    _table(cols, rows, f"best {len(rows)} by {result.objective}")
    if result.hint:
        click.echo(f"no layout fits: {result.hint}")
    if len(result.ranked) > 1:
        click.echo("why: " + why_better(result.ranked[0], result.ranked[1]))
    if accuracy is not None:
        from echosim.bands import accuracy_line

        click.echo("likely step of #1: " + accuracy_line(accuracy))
    for w in warnings:
        click.echo(f"warning (#1): {w}")
    shown = _rejected_sample(result.others, rejected)
    if shown:
        _table([*_COLUMNS[1:], "reason"], [[*_degrees(e), e.reason] for e in shown],
               f"rejected ({len(result.others):,}; a few of each kind)")  # fmt: skip
    if c["pruned_by"]:
        click.echo("pruned before simulation: " + ", ".join(f"{n:,} by {k}" for k, n in c["pruned_by"].items()))
    if result.interrupted:
        click.echo(f"interrupted: the best of the {c['simulated']:,} layouts simulated so far")


def _rate(e: Evaluated) -> str:
    value = e.tokens_per_s if e.tokens_per_s else e.samples_per_s
    return f"{value:,.0f}" if value else "-"


def _rejected_sample(others: list[Evaluated], count: int) -> list[Evaluated]:
    """Up to ``count`` rejected layouts, spread over the kinds of reason (the first of each kind first)."""
    kinds: dict[str, list[Evaluated]] = {}
    for e in others:
        kinds.setdefault(" ".join(e.reason.split()[:2]), []).append(e)
    out: list[Evaluated] = []
    while len(out) < count and any(kinds.values()):
        for key in list(kinds):
            if kinds[key] and len(out) < count:
                out.append(kinds[key].pop(0))
    return out


def scale_out_rows(results: Sequence[SearchResult], tokens: float | None, price: float | None) -> list[dict[str, Any]]:
    """Per device count: its best layout's throughput, per device, and (with ``tokens``) time and cost to train."""
    rows = []
    for r in results:
        best = r.best
        row: dict[str, Any] = {"devices": r.cluster.devices, "best": best.degrees() if best else None}
        if best is not None:
            rate = best.tokens_per_s or best.samples_per_s or 0.0
            row.update(step_time_s=best.step_time_s, throughput_per_s=rate, per_device_per_s=rate / r.cluster.devices,
                       mfu=best.mfu)  # fmt: skip
            if tokens:
                _check_tokens(r, tokens)
                hours = tokens / rate / 3600.0
                row["hours_to_train"] = hours
                if price is not None:
                    row["cost_to_train"] = hours * r.cluster.devices * price
        rows.append(row)
    return rows


def _check_tokens(result: SearchResult, tokens: float | None) -> None:
    """As compile --tokens: time to train counts tokens, and images or queries are none."""
    if tokens and result.best is not None and not result.best.tokens_per_s:
        raise SearchError("--tokens: this model reads no token ids; time to train needs tokens per second")


def _seconds(s: float) -> str:
    """Seconds to the millisecond, and to three significant digits below 0.1 s: a recommendation model's 3 ms steps
    would otherwise all read 0.003."""
    if s >= 0.1 or s <= 0:
        return f"{s:.3f}"
    return f"{s:.{min(6, 2 - math.floor(math.log10(s)))}f}"


def print_scale_out(rows: list[dict[str, Any]], tokens: float | None, price: float | None) -> None:
    cols = ["devices", "best layout", "step s", "throughput/s", "per device/s", "MFU"]
    if tokens:
        cols.append("days to train")
        if price is not None:
            cols.append("cost to train")
    out = []
    for row in rows:
        if row["best"] is None:
            out.append([str(row["devices"]), "no layout fits", *["-"] * (len(cols) - 2)])
            continue
        b = row["best"]
        layout = f"tp{b['tp']} pp{b['pp']} dp{b['dp']} cp{b['cp']} mb{b['micro_batch']} {b['recompute']}"
        line = [str(row["devices"]), layout, _seconds(row["step_time_s"]), f"{row['throughput_per_s']:,.0f}",
                f"{row['per_device_per_s']:,.1f}", f"{row['mfu'] * 100:.1f}%"]  # fmt: skip
        if tokens:
            line.append(f"{row['hours_to_train'] / 24:.1f}")
            if price is not None:
                line.append(f"{row['cost_to_train']:,.0f}")
        out.append(line)
    _table(cols, out, "scale-out: the best layout of each cluster size")


def best_band_and_warnings(model: Any, result: SearchResult) -> tuple[dict[str, Any] | None, list[str]]:
    """The accuracy band of the best layout and the warnings of its compile, as ``compile`` reports them
    (``echosim.bands.accuracy_section`` of one compile of that layout, whose figures a search reproduces exactly;
    a search's batched costing reads no warnings); ``(None, [])`` when nothing fits."""
    if not result.ranked:
        return None, []
    from echosim.bands import accuracy_section
    from echosim.compiler import lower

    compiled = lower(model, result.ranked[0].plan, result.cluster)
    return accuracy_section(compiled), list(compiled.report.warnings)


def result_json(
    result: SearchResult, top: int, accuracy: dict[str, Any] | None = None, warnings: Sequence[str] = ()
) -> dict[str, Any]:
    """Every evaluated layout with its degrees, figures and rejection reason, and the counts (byte-stable);
    ``accuracy`` and ``warnings``: the best layout's band and its compile's warnings
    (:func:`best_band_and_warnings`)."""
    layouts = [e.as_dict() for e in result.evaluated]
    return {
        "accuracy": accuracy,
        "warnings": list(warnings),
        "model": result.model,
        "backend": result.cluster.backend,
        "devices": result.cluster.devices,
        "objective": result.objective,
        "space": result.enumeration.space.as_dict(),
        "counts": result.counts(),
        "count": len(layouts),
        "candidates": len(layouts),
        "best": layouts[:top],
        "layouts": layouts,
        "interrupted": result.interrupted,
        **({"hint": result.hint} if result.hint else {}),
    }


_SCALARS = frozenset((str, int, float, bool, type(None)))
_ENCODE = json.JSONEncoder().encode
_ENCODE_NUL = json.JSONEncoder(separators=("\0", ":")).encode


def dumps_indented(obj: Any) -> str:
    """``json.dumps(obj, indent=2, sort_keys=True)``, the same text, in a fraction of the time.

    ``json`` writes indented output with its pure-Python encoder (its C encoder takes no indent), and a search
    writes tens of thousands of layout rows. A list of flat rows with the same keys is encoded by the C
    encoder in one call, its values joined by NUL (which ``json`` escapes inside strings, so the text splits
    exactly there), and laid out as the indented encoder lays it out; anything else as ``json`` does
    (tests/test_search_json.py: equal to ``json.dumps`` on every kind of value)."""
    return _indented(obj, "\n")


def _indented(obj: Any, newline: str) -> str:
    inner = newline + "  "
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        if not all(type(k) is str for k in obj):
            return json.dumps(obj, indent=2, sort_keys=True).replace("\n", newline)
        parts = [f"{_ENCODE(k)}: {_indented(obj[k], inner)}" for k in sorted(obj)]
        return "{" + inner + ("," + inner).join(parts) + newline + "}"
    if isinstance(obj, list | tuple):
        if not obj:
            return "[]"
        rows = _flat_rows(obj, inner)
        items = rows if rows is not None else [_indented(v, inner) for v in obj]
        return "[" + inner + ("," + inner).join(items) + newline + "]"
    return _ENCODE(obj)


def _flat_rows(rows: Sequence[Any], newline: str) -> list[str] | None:
    """Each of ``rows`` as :func:`_indented` writes it, when all are dicts with the same string keys and scalar
    values (a search's layouts), else None."""
    first = rows[0]
    if type(first) is not dict or not first or not all(type(k) is str for k in first):
        return None
    keys = sorted(first)
    if not all(type(r) is dict and r.keys() == first.keys() for r in rows):
        return None
    values = [r[k] for r in rows for k in keys]
    if not set(map(type, values)) <= _SCALARS:
        return None
    text = _ENCODE_NUL(values)[1:-1].split("\0")
    field = newline + "  "
    template = "{" + ",".join(field + _ENCODE(k).replace("%", "%%") + ": %s" for k in keys) + newline + "}"
    n = len(keys)
    return [template % tuple(text[i : i + n]) for i in range(0, len(text), n)]


def write_plot(results: Sequence[SearchResult], path: str) -> None:
    """Step time against memory per device; the Pareto front (no layout both faster and smaller) is drawn."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SearchError("--plot needs matplotlib: pip install 'echosim[report]'") from None
    fig, ax = plt.subplots(figsize=(8, 5))
    for r in results:
        pts = sorted((e.peak_bytes / 2**30, e.step_time_s or 0.0) for e in r.ranked)
        if not pts:
            continue
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=6, alpha=0.3)
        front, best = [], float("inf")
        for mem, step in pts:
            if step < best:
                front.append((mem, step))
                best = step
        ax.step([p[0] for p in front], [p[1] for p in front], where="post", label=f"{r.cluster.devices} devices")
    ax.set_xlabel("peak memory per device (GiB)")
    ax.set_ylabel("step time (s)")
    ax.set_title(f"{results[0].model}: layouts that fit, and the Pareto front")
    ax.legend()
    try:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    except OSError as exc:
        raise SearchError(f"--plot {path}: cannot write ({exc.strerror or exc})") from None
    finally:
        plt.close(fig)


def run(
    model: str,
    base: Plan,
    clusters: list[Cluster],
    *,
    space: dict[str, tuple[Any, ...]],
    objective: str,
    memory_fraction: float,
    workers: int,
    executor: str,
    ray_address: str | None,
    top: int,
    tokens: float | None,
    price: float | None,
    plot: str | None,
    as_json: bool,
) -> None:
    """Search each cluster size, then print (or write) what the options ask for."""
    from echosim.layout_search import search

    results = []
    for cluster in clusters:
        with progress_bar(not as_json, f"{cluster.devices} devices") as advance:
            results.append(
                search(model, base, cluster, space=space, objective=objective, memory_fraction=memory_fraction,
                       workers=workers, executor=executor, ray_address=ray_address,
                       price_per_device_hour=price if price is not None else 1.0, progress=advance)
            )  # fmt: skip
        if results[-1].interrupted:
            break
        _check_tokens(results[-1], tokens)  # said before the other sizes are searched
    if plot:
        write_plot(results, plot)
    scale = scale_out_rows(results, tokens, price) if len(results) > 1 or tokens else []
    best = [best_band_and_warnings(model, r) for r in results]
    if as_json:
        if len(results) == 1 and not scale:
            data: dict[str, Any] = result_json(results[0], top, *best[0])
        else:
            searches = [result_json(r, top, *b) for r, b in zip(results, best, strict=True)]
            data = {"scale_out": scale, "searches": searches}
        click.echo(dumps_indented(data))
    else:
        for r, (a, w) in zip(results, best, strict=True):
            print_result(r, top, accuracy=a, warnings=w)
        if scale:
            print_scale_out(scale, tokens, price)
    SKIP_TEARDOWN[0] = executor == "local"  # a Ray session's own shutdown hooks must still run


#: Set when a finished local search leaves nothing but its caches to free: :func:`echosim.cli.main` then
#: ends the process without the interpreter's teardown, which frees millions of cached graphs, nodes and
#: timings one by one (a full-space Llama-3 70B search on 512 H100: 28 of 112 CPU-seconds, measured with
#: ``os._exit`` after the search against a normal exit, 2026-12-04).
SKIP_TEARDOWN = [False]
