"""Terminal output shared by the commands: full-width tables when piped, progress on stderr.

rich draws for 80 columns when stdout is not a terminal, which cuts names and URLs to "micr…";
a pipe or a file gets the table's natural width instead. Progress goes to stderr: a bar on a
terminal, otherwise a plain line now and then, so that a long ``validate`` piped to a file
still shows it is alive, and stdout holds only the result.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# When stderr is not a terminal, at most one progress line per this many seconds.
PROGRESS_LINE_INTERVAL_S = 10.0
_PIPE_WIDTH = 10_000  # wide enough for any row; rich never pads a table past its natural width
_GIB = 2**30


def console(stderr: bool = False) -> Any:
    """A rich Console: the terminal's width on a terminal, the content's when piped ($COLUMNS wins)."""
    from rich.console import Console

    out = Console(stderr=stderr)
    if out.is_terminal or os.environ.get("COLUMNS"):
        return out
    return Console(stderr=stderr, width=_PIPE_WIDTH)


@contextmanager
def progress(what: str, total: int | None, quiet: bool = False) -> Iterator[Callable[..., None]]:
    """Yield ``advance(completed=None, total=None, description=None)``; shown on stderr unless ``quiet``.

    ``completed`` absent means one more. On a terminal a transient bar; otherwise one line
    (``what: done/total, elapsed``) at most every :data:`PROGRESS_LINE_INTERVAL_S` seconds.
    """
    err = console(stderr=True)
    if quiet:
        yield lambda *a, **k: None
        return
    if err.is_terminal:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        columns = (TextColumn("{task.description:<34}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=err, transient=True) as bar:
            task = bar.add_task(what, total=total)

            def advance(completed: int | None = None, total: int | None = None, description: str | None = None) -> None:
                fields: dict[str, Any] = {"advance": 1} if completed is None else {"completed": completed}
                if total is not None:
                    fields["total"] = total
                if description:
                    fields["description"] = description[:34]
                bar.update(task, **fields)

            yield advance
        return
    start = time.monotonic()
    state: dict[str, Any] = {"done": 0, "total": total, "last": start}

    def advance_line(completed: int | None = None, total: int | None = None, description: str | None = None) -> None:
        state["done"] = state["done"] + 1 if completed is None else completed
        if total is not None:
            state["total"] = total
        now = time.monotonic()
        if now - state["last"] >= PROGRESS_LINE_INTERVAL_S:
            state["last"] = now
            of = f"/{state['total']}" if state["total"] else ""
            step = f" ({description})" if description else ""
            print(f"{what}: {state['done']}{of}{step}, {now - start:.0f} s", file=sys.stderr, flush=True)

    yield advance_line


_PARTS = ("params", "grads", "optimizer", "activations", "transient", "comm_buffers", "fragmentation")


def does_not_fit(report: Any) -> str:
    """One line: the first stage over capacity, its need and largest parts, how many more stages are over.

    The compiler's own warning for that stage is used when it has one (it names the parts).
    """
    over = [m for m in report.memory if not m["fits"]]
    if not over:
        return "every stage fits"
    m = over[0]
    prefix = f"stage {m['stage']} does not fit"
    line = next((w for w in report.warnings if w.startswith(prefix)), "")
    if not line:
        parts = sorted(((k, m[k]) for k in _PARTS if m.get(k)), key=lambda kv: -kv[1])[:3]
        top = ", ".join(f"{k} {v / _GIB:.1f} GiB" for k, v in parts)
        line = f"{prefix}: needs {m['peak'] / _GIB:.1f} GiB of {m['capacity'] / _GIB:.1f} GiB (largest: {top})"
    more = len(over) - 1
    return line + (f"; {more} more stage(s) do not fit" if more else "")
