"""Op-level simulation of one unit of work (a layer's forward, its backward, ...).

Compute kernels run on one stream and collectives on another, each in graph
order, each op starting when its inputs are ready and its stream is free (list
scheduling). Where the two streams overlap, both slow down by the backend's
:class:`~echosim.backends.base.OverlapModel`: a first pass finds the overlap, a
second pass re-times every op with its dilated duration.
"""

from __future__ import annotations

import bisect
import functools
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import chain, repeat
from types import ModuleType
from typing import TYPE_CHECKING, Any

from echosim.backends.base import OverlapModel
from echosim.ir.graph import Graph, Node
from echosim.ir.ops import COLLECTIVES, AttentionAttrs, Axis, CollectiveAttrs, MatmulAttrs, OpKind
from echosim.timeline import compiled

if TYPE_CHECKING:  # numpy is imported where the compiled path builds its arrays: a cached compile never imports it
    import numpy as np

COMPUTE, COMM = "compute", "comm"


@dataclass(frozen=True)
class OpEvent:
    """One op of a unit as lowered: when it starts (from the unit's start) and how long it runs.

    ``base`` is its duration alone; ``duration`` includes the slowdown of overlapping the
    other stream (and, for a chunked TP-overlap consumer, the wait for its producer's end).
    """

    node: int
    name: str
    stream: str
    start: float
    duration: float
    category: str
    base: float = 0.0


@dataclass
class UnitTiming:
    """One unit of work simulated op by op: its ops' events, and what repetition needs to know."""

    duration: float = 0.0
    busy: dict[str, float] = field(default_factory=dict)  # category -> seconds
    events: list[OpEvent] = field(default_factory=list)
    critical_end: float = 0.0  # end of the last op something in the unit waits on
    nodes: tuple[int, ...] = ()  # every IR node of the unit in order (views and placeholders included)
    chunked: frozenset[tuple[int, int]] = frozenset()  # producer -> consumer edges pipelined by TP overlap
    # seconds the next repetition's compute gains from running beside this one's spilled collectives
    # (:func:`carried_slowdown_s`); 0 where the backend's overlap slows nothing
    carry: float = 0.0

    def __getattr__(self, name: str) -> Any:
        """Its :attr:`events`, built when first read from the arrays of a compiled simulation
        (:func:`simulate_compiled`): a search reads only the durations and busy times of most of the units it
        times, while explain, the trace and the costed graph read the events."""
        lazy = self.__dict__.get("_lazy")
        if name != "events" or lazy is None:
            raise AttributeError(name)
        events = self.__dict__["events"] = _events(*lazy)
        del self.__dict__["_lazy"]
        return events

    @property
    def period(self) -> float:
        """Seconds between back-to-back repetitions of this unit (a repeated layer).

        Collectives that nothing in the unit waits on (FSDP prefetch, gradient
        reduce-scatter) run under the next repetition's compute, so the steady-state
        period is the longer of the critical path, slowed where those collectives run
        beside it (:attr:`carry`), and the communication stream's load.
        Kept once read (a search reads a unit's period millions of times); :meth:`add_busy` forgets it.
        """
        known = self.__dict__.get("_period")
        if known is None or known[0] != self.critical_end:
            comm = sum(v for k, v in self.busy.items() if k.startswith("comm."))
            known = self.__dict__["_period"] = (self.critical_end, max(self.critical_end + self.carry, comm))
        return known[1]

    def add_busy(self, category: str, seconds: float) -> None:
        self.busy[category] = self.busy.get(category, 0.0) + seconds
        self.__dict__.pop("_period", None)
        self.__dict__.pop("_split", None)

    @property
    def compute_busy(self) -> float:
        return sum(v for k, v in self.busy.items() if k.startswith("compute."))

    @property
    def comm_split(self) -> tuple[tuple[tuple[str, float], ...], float, float]:
        """Its ``comm.*`` busy seconds by category (in :attr:`busy`'s order), their sum and :attr:`compute_busy`,
        summed as those are; kept once read, as :attr:`period` is (a search's ranking reads them for every unit of
        every layout it ranks)."""
        known = self.__dict__.get("_split")
        if known is None:
            comm = tuple((k, v) for k, v in self.busy.items() if k.startswith("comm."))
            known = self.__dict__["_split"] = (comm, sum(v for _, v in comm), self.compute_busy)
        return known  # type: ignore[no-any-return]


#: A collective's category by its axis, built once (a search asks for the category of every op of every unit it times).
_COMM_CATEGORY = {axis: f"comm.{axis.value}" for axis in Axis}


def category(node: Node) -> str:
    if isinstance(node.attrs, CollectiveAttrs) and node.op in COLLECTIVES:  # OpKind.is_collective, inlined
        return _COMM_CATEGORY[node.attrs.axis]
    if isinstance(node.attrs, MatmulAttrs):
        return "compute.matmul"
    if isinstance(node.attrs, AttentionAttrs):
        return "compute.attention"
    if node.op is OpKind.OPTIMIZER_UPDATE:
        return "compute.optimizer"
    return "compute.memory_bound"


def pipelined_edges(nodes: Sequence[Node], axis: Axis = Axis.TP) -> set[tuple[int, int]]:
    """Producer -> consumer edges between a matmul and an ``axis`` collective.

    With communication overlap (Megatron's ``--tp-comm-overlap``), the GEMM is split
    into chunks and each chunk's collective runs while the next chunk computes: the
    consumer may start with the producer and cannot end before it.
    """
    # a pair qualifies when one end is a matmul and the other an ``axis`` collective (no node is both: its
    # attributes are one class), so only those two kinds of node are looked at, each reading the ids of the
    # other kind; the edges are added in the order of a walk over every node's inputs, as before
    matmuls = {n.id for n in nodes if isinstance(n.attrs, MatmulAttrs)}
    if not matmuls:
        return set()
    colls = {n.id for n in nodes if isinstance(n.attrs, CollectiveAttrs) and n.attrs.axis is axis}
    edges: set[tuple[int, int]] = set()
    if not colls:
        return edges
    for n in nodes:
        a = n.attrs
        if isinstance(a, MatmulAttrs):
            other = colls
        elif isinstance(a, CollectiveAttrs) and a.axis is axis:
            other = matmuls
        else:
            continue
        nid = n.id
        for i in n.inputs:
            if i in other:
                edges.add((i, nid))
    return edges


class FirstPass:
    """The first list-scheduling pass over a unit's ops, resumable: each op's undilated seconds, its
    (start, seconds), and the streams' state after the last op.

    List scheduling in graph order times an op from the ops before it only, so a unit that appends ops
    to another's (ZeRO-3 / FSDP's per-layer gathers and reduce-scatters after a layer's ops) begins with
    that unit's first pass unchanged to the bit: :meth:`extended` resumes it instead of starting over.
    """

    __slots__ = ("base", "begin", "end", "free", "times")

    def __init__(self) -> None:
        self.base: dict[int, float] = {}
        self.times: list[tuple[float, float]] = []
        self.begin: dict[int, float] = {}
        self.end: dict[int, float] = {}
        self.free = {COMPUTE: 0.0, COMM: 0.0}

    @classmethod
    def of(
        cls,
        nodes: Sequence[Node],
        cost: Callable[[Node], float],
        pipelined: set[tuple[int, int]],
        base: dict[int, float] | None = None,
    ) -> FirstPass:
        return cls().extended(nodes, cost, pipelined, base)

    def extended(
        self,
        more: Sequence[Node],
        cost: Callable[[Node], float],
        pipelined: set[tuple[int, int]],
        base: dict[int, float] | None = None,
    ) -> FirstPass:
        """This pass continued over ``more`` (the ops appended after this pass's), on copies of its state.

        ``base``: every op's undilated seconds (this pass's and ``more``'s, as ``cost`` gives them), when the caller
        keeps them (a unit is timed again with and without TP overlap, which change none of them); read, not copied."""
        p = FirstPass()
        if base is None:
            p.base = dict(self.base)
            p.base.update({n.id: cost(n) for n in more})
        else:
            p.base = base
        p.begin, p.end, p.free, p.times = dict(self.begin), dict(self.end), dict(self.free), list(self.times)
        _advance(more, p.base, pipelined, p.begin, p.end, p.free, p.times)
        return p


def simulate_unit(
    graph: Graph,
    nodes: Sequence[Node],
    cost: Callable[[Node], float],
    overlap: OverlapModel,
    pipelined: set[tuple[int, int]] | None = None,
    first_pass: FirstPass | None = None,
    categories: list[str] | None = None,
) -> UnitTiming:
    """``first_pass``: the unit's first pass (:class:`FirstPass`, over ``nodes`` with these costs and edges), when
    the caller has it; ``categories``: each node's :func:`category`, when the caller keeps them (read only)."""
    pipelined = pipelined or set()
    done = first_pass or FirstPass.of(nodes, cost, pipelined)
    base, first = done.base, done.times
    cats = categories if categories is not None else [category(n) for n in nodes]
    if not _slows(overlap):
        return _timing(nodes, first, base, pipelined, cats)
    colls = [n.op in COLLECTIVES for n in nodes]  # OpKind.is_collective, read once per node
    comm = [(s, s + d) for c, (s, d) in zip(colls, first, strict=False) if c and d > 0]
    comp = [(s, s + d) for c, (s, d) in zip(colls, first, strict=False) if not c and d > 0]
    spans = {True: _Spans(comp), False: _Spans(comm)}
    factors = {c: overlap.slowdown(c) for c in set(cats)}  # one factor per category, as each op would read it
    dilated = {}
    for n, (s, d), cat, coll in zip(nodes, first, cats, colls, strict=False):
        if d <= 0:
            dilated[n.id] = d
            continue
        shared = spans[coll].overlap(s, s + d)
        # an op beside nothing keeps its seconds: d * (1.0 + 0.0 * (factor - 1.0)) is d to the bit (finite factors)
        dilated[n.id] = d * (1.0 + min(shared / d, 1.0) * (factors[cat] - 1.0)) if shared else d
    timing = _timing(nodes, _schedule(nodes, dilated, pipelined), base, pipelined, cats)
    timing.carry = carried_slowdown_s(timing, factors)
    return timing


def _slows(overlap: OverlapModel) -> bool:
    """Whether the overlap model slows any op (else a unit needs one list-scheduling pass and carries nothing)."""
    return not all(overlap.slowdown(c) == 1.0 for c in ("compute.matmul", "compute.memory_bound", "comm"))


def carried_slowdown_s(unit: UnitTiming, factors: dict[str, float]) -> float:
    """Seconds a repetition of ``unit`` adds to the next one's critical path: the next repetition's compute runs
    beside this one's collectives that outlast its critical path, and slows as the overlap model says.

    The collectives nothing in the unit waits on (FSDP's prefetch of the next layer's parameters, its gradient
    reduce-scatter) are issued after the layer's compute and keep the communication stream busy for
    ``duration - critical_end`` seconds into the next repetition (:attr:`UnitTiming.period`); the next
    repetition's compute ops in that window (:func:`carried_window`) are slowed by their category's factor (the SM
    and HBM share the collective kernels hold, :class:`~echosim.backends.base.OverlapModel`), as the overlap
    inside one unit is (:func:`simulate_unit`).
    """
    window = carried_window(unit)
    if not window:  # most units: nothing spills past the critical path
        return 0.0
    category_of = {e.node: e.category for e in unit.events}
    return sum(sec * (factors.get(category_of[node], 1.0) - 1.0) for node, sec in window)


def carried_window(unit: UnitTiming) -> list[tuple[int, float]]:
    """(node, seconds) of the unit's compute ops that run beside the previous repetition's spilled collectives.

    The window is the first ``duration - critical_end`` seconds of the repetition; an op already overlapped by
    a collective of its own unit counts only the seconds no such collective covers (it is slowed once).
    """
    spill = unit.duration - unit.critical_end
    if spill <= 0.0:
        return []
    own = _Spans([(e.start, e.start + e.duration) for e in unit.events if e.stream == COMM])
    out = []
    for e in unit.events:
        if e.stream != COMPUTE or e.start >= spill:
            continue
        end = min(e.start + e.duration, spill)
        beside = end - e.start - own.overlap(e.start, end)
        if beside > 0.0:
            out.append((e.node, beside))
    return out


class _Spans:
    """One stream's busy intervals, and the seconds of them inside a window.

    The sum runs over the intervals in order, as a plain sum over all of them would, but where they are
    sorted and disjoint (one stream's ops run one after another) it skips, by bisection, those that end
    before the window or start after it: their terms are ``0.0``, which leave a sum of non-negative terms
    unchanged to the bit. A unit of n ops costs n log n instead of n^2."""

    __slots__ = ("begins", "ends", "spans")

    def __init__(self, spans: list[tuple[float, float]]) -> None:
        self.spans = spans
        ordered = all(spans[k][1] <= spans[k + 1][0] for k in range(len(spans) - 1))
        self.begins = [b for b, _ in spans] if ordered else None
        self.ends = [e for _, e in spans] if ordered else None

    def overlap(self, start: float, end: float) -> float:
        spans = self.spans
        if self.begins is not None and self.ends is not None:
            lo, hi = bisect.bisect_right(self.ends, start), bisect.bisect_left(self.begins, end)
            if hi - lo <= 1:  # most ops meet none or one of the other stream's: the sum of that one term, or 0
                if hi <= lo:
                    return 0
                b, e = spans[lo]
                return max(0.0, min(end, e) - max(start, b))
            spans = spans[lo:hi]
        return sum(max(0.0, min(end, e) - max(start, b)) for b, e in spans)


def _side(nodes: Sequence[Node]) -> set[int]:
    """Collectives with no reader inside the unit (a blocking one is waited on by whatever follows it)."""
    read = {i for n in nodes for i in n.inputs}
    return {n.id for n in nodes if n.op in COLLECTIVES and n.id not in read and not _blocking(n)}


def _blocking(n: Node) -> bool:
    return isinstance(n.attrs, CollectiveAttrs) and n.attrs.blocking


def _stream(n: Node) -> str:
    """The stream a node runs on: a blocking collective holds the compute stream (the host waits for it)."""
    return COMM if n.op.is_collective and not _blocking(n) else COMPUTE


def _schedule(
    nodes: Sequence[Node], dur: dict[int, float], pipelined: set[tuple[int, int]] | None = None
) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    _advance(nodes, dur, pipelined or set(), {}, {}, {COMPUTE: 0.0, COMM: 0.0}, out)
    return out


def _advance(
    nodes: Sequence[Node],
    dur: dict[int, float],
    pipelined: set[tuple[int, int]],
    begin: dict[int, float],
    end: dict[int, float],
    free: dict[str, float],
    out: list[tuple[float, float]],
) -> None:
    """List-schedule ``nodes`` after the ops already in the state (``begin``, ``end``, ``free``), onto ``out``.

    A node with no pipelined input edge (every node without TP overlap) takes the short path: its ready time
    is the latest end of its inputs and it ends ``d`` after it starts, as the general path computes them."""
    compute, comm = free[COMPUTE], free[COMM]
    ended = end.get
    for n in nodes:
        nid, inputs = n.id, n.inputs
        if pipelined and any((i, nid) in pipelined for i in inputs):
            free[COMPUTE], free[COMM] = compute, comm
            _advance_chunked(n, dur, pipelined, begin, end, free, out)
            compute, comm = free[COMPUTE], free[COMM]
            continue
        # the latest end of its inputs in the unit (max(..., default=0.0): ends are >= 0, so the same float)
        ready = 0.0
        for i in inputs:
            e = ended(i)
            if e is not None and e > ready:
                ready = e
        d = dur[nid]
        if d <= 0:  # views and placeholders: free, no stream
            begin[nid] = end[nid] = ready
            out.append((ready, 0.0))
            continue
        # a collective on the comm stream (_stream: is_collective and not _blocking, inlined in this hot loop)
        if n.op in COLLECTIVES and not (isinstance(n.attrs, CollectiveAttrs) and n.attrs.blocking):
            start = comm if comm > ready else ready  # max(ready, comm), ties to ready as max() does
            end[nid] = comm = finish = start + d
        else:
            start = compute if compute > ready else ready
            end[nid] = compute = finish = start + d
        begin[nid] = start
        out.append((start, finish - start))
    free[COMPUTE], free[COMM] = compute, comm


def _advance_chunked(
    n: Node,
    dur: dict[int, float],
    pipelined: set[tuple[int, int]],
    begin: dict[int, float],
    end: dict[int, float],
    free: dict[str, float],
    out: list[tuple[float, float]],
) -> None:
    """:func:`_advance` of one node that has a pipelined input edge (TP overlap's chunked GEMM and collective)."""
    chunked = [i for i in n.inputs if (i, n.id) in pipelined and i in begin]
    ready = max((end[i] for i in n.inputs if i in end and i not in chunked), default=0.0)
    ready = max([ready] + [begin[i] for i in chunked])
    d = dur[n.id]
    if d <= 0:  # views and placeholders: free, no stream
        begin[n.id] = end[n.id] = ready
        out.append((ready, 0.0))
        return
    stream = _stream(n)
    start = max(ready, free[stream])
    finish = max([start + d] + [end[i] for i in chunked])  # the last chunk follows the producer
    begin[n.id] = start
    end[n.id] = free[stream] = finish
    out.append((start, finish - start))


def _timing(
    nodes: Sequence[Node],
    times: list[tuple[float, float]],
    base: dict[int, float],
    chunked: set[tuple[int, int]],
    cats: list[str] | None = None,
) -> UnitTiming:
    """``cats``: each node's :func:`category`, when the caller has them."""
    t = UnitTiming(nodes=tuple(n.id for n in nodes), chunked=frozenset(chunked))
    side = _side(nodes)
    events, busy = t.events, t.busy
    critical_end = duration = 0.0
    new, append = object.__new__, events.append
    for n, (s, d), cat in zip(nodes, times, cats or [category(n) for n in nodes], strict=False):
        if d <= 0:
            continue
        end = s + d
        nid = n.id
        if nid not in side and end > critical_end:  # max(critical_end, end), as UnitTiming kept it
            critical_end = end
        # OpEvent(...) without the frozen dataclass's __init__ (one object.__setattr__ per field): a search
        # simulates thousands of units of hundreds of ops
        # _stream(n), inlined: a collective runs on the comm stream unless it blocks the host
        a = n.attrs
        stream = COMM if n.op in COLLECTIVES and not (isinstance(a, CollectiveAttrs) and a.blocking) else COMPUTE
        e = new(OpEvent)
        e.__dict__.update(node=nid, name=n.name or n.op.value, stream=stream, start=s, duration=d, category=cat,
                          base=base[nid])  # fmt: skip
        append(e)
        busy[cat] = busy.get(cat, 0.0) + d
        if end > duration:
            duration = end
    t.critical_end, t.duration = critical_end, duration
    return t


#: Units a process simulates in Python before it loads the compiled kernel, unless numba is imported already (a
#: search's schedule timer, :mod:`echosim.timeline._jit`). Loading costs ~0.3 s wall with numba's import, ~0.2 s
#: without (its on-disk cache filled, ``benchmarks/schedule_replay.py --startup``), and the kernel saves ~0.3 ms a
#: unit (GPT-3's full-space search: 13,462 units, ~4 CPU-s less): one ``echosim compile`` (tens of units) keeps the
#: Python path and never imports numba, a search or a validation of hundreds of layouts pays the load once.
PYTHON_UNITS = 1000
_python_units = [0]


def compiled_unit() -> ModuleType | None:
    """The compiled unit simulation (:mod:`echosim.timeline._jit_unit`) for the next unit, or None: numba is not
    installed (the ``echosim[fast]`` extra), ``ECHOSIM_JIT=0`` asks for the Python path (the same numbers, slower),
    or this process has simulated too few units yet to pay for loading it (:data:`PYTHON_UNITS`)."""
    if not compiled.wanted():
        return None
    if _python_units[0] < PYTHON_UNITS and "numba" not in sys.modules:
        _python_units[0] += 1
        return None
    return _load_compiled_unit()


@functools.cache
def _load_compiled_unit() -> ModuleType | None:
    # numba and llvmlite: imported by the first unit a process simulates past PYTHON_UNITS, never by ``import echosim``
    return compiled.load("echosim.timeline._jit_unit")


class UnitArrays:
    """A unit's ops as the arrays :mod:`~echosim.timeline._jit_unit` reads: a function of its nodes (and their
    categories) alone, so built once per unit and shared by every placement and TP-overlap setting it is timed on.

    ``in_idx[in_ptr[k]:in_ptr[k + 1]]``: the unit positions of op ``k``'s inputs that run before it in the unit, in
    input order (list scheduling reads no other: an input outside the unit has no end in it). Built with one Python
    pass over the nodes and numpy over their inputs: a search builds them for ~10^4 units of tens of ops."""

    __slots__ = ("_pipes", "cat", "coll", "comm_stream", "ids", "in_idx", "in_ptr", "names", "no_pipes", "position",
                 "side")  # fmt: skip

    def __init__(self, nodes: Sequence[Node], categories: list[str], position: dict[int, int]) -> None:
        import numpy as np

        n = len(nodes)
        self.ids, self.position = tuple(position), position
        inputs = [x.inputs for x in nodes]
        counts = np.fromiter(map(len, inputs), np.int64, n)
        flat = list(chain.from_iterable(inputs))
        # each input's unit position (n: outside the unit), kept where it runs before its reader
        where = np.fromiter(map(position.get, flat, repeat(n)), np.int64, len(flat))
        reader = np.repeat(np.arange(n, dtype=np.int64), counts)
        before = where < reader
        self.in_idx = where[before]
        self.in_ptr = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(reader[before], minlength=n), out=self.in_ptr[1:])
        # a collective (n.op in COLLECTIVES), and one on the comm stream (_stream: not blocking the host)
        coll = [x.op in COLLECTIVES for x in nodes]
        self.coll = np.array(coll, np.bool_)
        self.comm_stream = np.array([c and not _blocking(x) for c, x in zip(coll, nodes, strict=True)], np.bool_)
        read = set(flat)  # _side: the collectives nothing in the unit reads, and that do not block
        self.side = self.comm_stream & np.fromiter((i not in read for i in self.ids), np.bool_, n)
        self.names = list(dict.fromkeys(categories))
        number = {c: k for k, c in enumerate(self.names)}
        self.cat = np.fromiter(map(number.__getitem__, categories), np.int64, n)
        self.no_pipes = (np.zeros(n, np.bool_), np.zeros(len(self.in_idx), np.bool_))
        self._pipes: tuple[set[tuple[int, int]], tuple[np.ndarray, np.ndarray]] | None = None

    @classmethod
    def of(
        cls, nodes: Sequence[Node], categories: list[str], position: dict[int, int] | None = None
    ) -> UnitArrays | None:
        """The arrays of ``nodes``, or None where a node id repeats (positions would not name the ops).

        ``position``: each node id's position in ``nodes`` (the last, where an id repeats), when the caller keeps it;
        read, not copied."""
        if position is None:
            position = {x.id: k for k, x in enumerate(nodes)}
        return cls(nodes, categories, position) if len(position) == len(nodes) else None

    def pipes(self, pipelined: set[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
        """(op ``k`` has a pipelined input edge, which ``in_idx`` entries are one) for ``pipelined``: edges between
        the unit's nodes, as :func:`pipelined_edges` gives them (each its consumer's input). The last set asked for
        is kept (a unit is timed on its own edges or none)."""
        if not pipelined:
            return self.no_pipes
        known = self._pipes
        if known is None or known[0] is not pipelined:
            has, flags = self.no_pipes[0].copy(), self.no_pipes[1].copy()
            position, ptr, idx = self.position, self.in_ptr, self.in_idx
            for i, nid in pipelined:  # a few edges a layer: each sets its consumer and its entries of the producer
                k, j = position[nid], position[i]
                has[k] = True
                lo, hi = ptr[k], ptr[k + 1]
                flags[lo:hi] |= idx[lo:hi] == j
            known = self._pipes = (pipelined, (has, flags))
        return known[1]


def simulate_compiled(
    kernel: ModuleType,
    arrays: UnitArrays,
    nodes: Sequence[Node],
    base: dict[int, float],
    overlap: OverlapModel,
    pipelined: set[tuple[int, int]],
) -> UnitTiming:
    """:func:`simulate_unit` by the compiled kernel (:mod:`~echosim.timeline._jit_unit`), equal to the bit; its
    events are built when first read (:meth:`UnitTiming.__getattr__`)."""
    import numpy as np

    n = len(arrays.ids)
    costs = np.fromiter(map(base.__getitem__, arrays.ids), np.float64, n)
    slowed = _slows(overlap)
    factor = np.array([overlap.slowdown(c) for c in arrays.names], np.float64)
    has_pipe, in_pipe = arrays.pipes(pipelined)
    starts, secs = np.empty(n), np.empty(n)
    busy, seen = np.zeros(len(arrays.names)), np.zeros(len(arrays.names), np.int64)
    met, critical_end, duration, carry = kernel.simulate(
        costs, arrays.comm_stream, arrays.coll, arrays.side, arrays.cat, factor, has_pipe, arrays.in_ptr,
        arrays.in_idx, in_pipe, slowed, starts, secs, busy, seen,
    )  # fmt: skip
    names, seconds = arrays.names, busy.tolist()
    t = object.__new__(UnitTiming)
    t.__dict__.update(duration=duration, busy={names[c]: seconds[c] for c in seen[:met].tolist()},
                      critical_end=critical_end, nodes=arrays.ids, chunked=frozenset(pipelined), carry=carry,
                      _lazy=(nodes, arrays, starts, secs, costs))  # fmt: skip
    return t


def _events(
    nodes: Sequence[Node], arrays: UnitArrays, starts: np.ndarray, secs: np.ndarray, costs: np.ndarray
) -> list[OpEvent]:
    """The events :func:`_timing` lists, from a compiled simulation's arrays: the ops of positive seconds, in order."""
    out = []
    names, cat, comm = arrays.names, arrays.cat.tolist(), arrays.comm_stream.tolist()
    for n, s, d, b, c, on_comm in zip(nodes, starts.tolist(), secs.tolist(), costs.tolist(), cat, comm, strict=True):
        if d <= 0:
            continue
        out.append(OpEvent(n.id, n.name or n.op.value, COMM if on_comm else COMPUTE, s, d, names[c], b))
    return out
