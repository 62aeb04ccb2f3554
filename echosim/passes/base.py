"""Pass infrastructure: a pass is a named frozen dataclass; a pipeline verifies between passes."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import ClassVar, Protocol

from echosim.ir.graph import Graph
from echosim.ir.verify import VerifyError, verify
from echosim.memo import Memo


class LayoutError(ValueError):
    """A parallel layout that cannot work; the message names the broken constraint."""


class Pass(Protocol):
    name: ClassVar[str]

    def run(self, graph: Graph) -> Graph: ...


#: (input graph, pass) -> (output graph, verified): a pass is a function of the graph and its options.
#: A search runs the graph-level passes of one (tp, cp, sp, recompute, micro-batch) for layouts that lie far
#: apart once its batches are ordered by schedule shape; an evicted result is a new graph object, and every
#: stage cache keyed by it misses (a full-space GPT-3 search inserts about 70k results).
_RESULTS: Memo[tuple[Graph, bool]] = Memo("pass results", maxsize=1 << 16)


def run_passes(
    graph: Graph,
    passes: Sequence[Pass],
    *,
    check: bool | Collection[str] = True,
    reuse: Collection[str] = (),
) -> Graph:
    """Apply ``passes`` in order, verifying the graph after each and naming the culprit.

    ``check`` is ``True`` (verify after every pass), ``False`` (never), or the names of the
    passes to verify after: the compiler checks third-party passes always and its own,
    which the test suite verifies, only in debug mode (``ECHOSIM_VERIFY=1``).

    ``reuse`` names the passes whose result may be taken from an earlier run on the same
    graph object with equal options (echosim's own: they never modify their input and
    depend on nothing else); a layout search runs the same pass on the same graph for
    many layouts.
    """
    done: list[str] = []
    for p in passes:
        wanted = check is True or bool(check and p.name in check)
        key = _key(graph, p) if p.name in reuse else None
        hit = _RESULTS.lookup(key) if key is not None else None
        if hit is not None and (hit[1] or not wanted):
            graph = hit[0]
            done.append(p.name)
            continue
        graph = p.run(graph) if hit is None else hit[0]
        done.append(p.name)
        if wanted:
            try:
                verify(graph, after=p.name)
            except VerifyError as exc:
                raise VerifyError(f"{exc} (passes so far: {', '.join(done)})") from None
        if key is not None:
            _RESULTS.put(key, (graph, wanted))
    return graph


def output_key(p: Pass) -> object:
    """``p`` as a cache key: its ``output_key()`` where it has one (a pass whose options include some its
    graph does not read gives the options that build the same graph one key), else the pass itself."""
    key = getattr(p, "output_key", None)
    return key() if key is not None else p


def _key(graph: Graph, p: Pass) -> tuple[Graph, object] | None:
    try:
        hash(p)
    except TypeError:  # options that cannot be hashed: the pass runs
        return None
    return (graph, output_key(p))
