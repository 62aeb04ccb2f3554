"""Pass infrastructure: a pass is a named frozen dataclass; a pipeline verifies between passes."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import ClassVar, Protocol

from echosim.ir.graph import Graph
from echosim.ir.verify import VerifyError, verify


class LayoutError(ValueError):
    """A parallel layout that cannot work; the message names the broken constraint."""


class Pass(Protocol):
    name: ClassVar[str]

    def run(self, graph: Graph) -> Graph: ...


def run_passes(graph: Graph, passes: Sequence[Pass], *, check: bool | Collection[str] = True) -> Graph:
    """Apply ``passes`` in order, verifying the graph after each and naming the culprit.

    ``check`` is ``True`` (verify after every pass), ``False`` (never), or the names of the
    passes to verify after: the compiler checks third-party passes always and its own,
    which the test suite verifies, only in debug mode (``ECHOSIM_VERIFY=1``).
    """
    done: list[str] = []
    for p in passes:
        graph = p.run(graph)
        done.append(p.name)
        if check is True or (check and p.name in check):
            try:
                verify(graph, after=p.name)
            except VerifyError as exc:
                raise VerifyError(f"{exc} (passes so far: {', '.join(done)})") from None
    return graph
