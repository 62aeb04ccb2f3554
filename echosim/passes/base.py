"""Pass infrastructure: a pass is a named frozen dataclass; a pipeline verifies between passes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Protocol

from echosim.ir.graph import Graph
from echosim.ir.verify import VerifyError, verify


class LayoutError(ValueError):
    """A parallel layout that cannot work; the message names the broken constraint."""


class Pass(Protocol):
    name: ClassVar[str]

    def run(self, graph: Graph) -> Graph: ...


def run_passes(graph: Graph, passes: Sequence[Pass], *, check: bool = True) -> Graph:
    """Apply ``passes`` in order; with ``check`` verify after each and name the culprit."""
    done: list[str] = []
    for p in passes:
        graph = p.run(graph)
        done.append(p.name)
        if check:
            try:
                verify(graph, after=p.name)
            except VerifyError as exc:
                raise VerifyError(f"{exc} (passes so far: {', '.join(done)})") from None
    return graph
