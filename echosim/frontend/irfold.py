"""The IR half of folding (see ``fold.py``): prove consecutive layers are one chain, keep one copy.

A layer is the set of nodes whose scope starts with ``<list>.<i>`` (``layers.3``,
``model.layers.3``, ``h.3``). Consecutive layers fold when

* their node sequences match: op, attributes, output type, and where each input
  comes from (inside the layer by position, or outside by type), and
* they form a chain: each layer reads something the layer before it produced.
  Identical modules used side by side (DLRM's embedding tables) are not a chain,
  and folding them would change the computation.

The first copy stands for all; readers of later copies read the first copy's
matching value instead. A first copy that reads no value that needs a gradient
(a stack applied straight to the input) has a cheaper backward than the copies
after it, so then the run starts at the second copy.

The torch frontends capture two copies of the run and fold the second away
(:func:`fold_run`, called by :func:`fold.capture_folded`), which proves the run is
a chain at the cost of one layer; ONNX files store every layer, so there
:func:`fold_layers` finds the run and proves it over all its copies.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from echosim.frontend.messages import Note
from echosim.ir.graph import Graph, Node
from echosim.ir.ops import OpKind

_LAYER = re.compile(r"^(?P<list>(?:[\w-]+\.)*?[A-Za-z_][\w-]*)\.(?P<index>\d+)(?=\.|$)")


Layers = dict[tuple[str, int], list[Node]]


def layer_of(scope: str) -> tuple[str, int] | None:
    match = _LAYER.match(scope)
    return (match.group("list"), int(match.group("index"))) if match else None


def _entry_of(scope: str, lst: str) -> tuple[str, int] | None:
    """``(lst, i)`` for a scope inside entry ``i`` of the list at path ``lst`` (which may itself sit in a list:
    ``stages.2``, a Swin or U-Net stage's blocks), else ``None``."""
    if not scope.startswith(lst + "."):
        return None
    head = scope[len(lst) + 1 :].partition(".")[0]
    return (lst, int(head)) if head.isdigit() else None


def _layers(graph: Graph, lst: str | None = None) -> Layers:
    """Nodes by layer: of the list at path ``lst``, or of whichever list each scope names (:func:`layer_of`)."""
    layers: dict[tuple[str, int], list[Node]] = defaultdict(list)
    for n in graph:
        key = layer_of(n.scope) if lst is None else _entry_of(n.scope, lst)
        if key is not None:
            layers[key].append(n)
    return layers


def _signature(graph: Graph, nodes: list[Node]) -> tuple[Any, ...]:
    """Each node's op, attributes, type and inputs; an input read through views of the layer's own is read
    where those views start. Views cost nothing, and a layer's casts can differ in what they view: Mamba's
    first block gets bf16 embeddings where the blocks after it get the fp32 residual stream, so its
    ``residual.to(float32)`` views the ``hidden_states.to(bf16)`` view where theirs view the stream."""
    position = {n.id: i for i, n in enumerate(nodes)}

    def source(i: int) -> int:
        while i in position and graph[i].op is OpKind.VIEW and graph[i].inputs:
            i = graph[i].inputs[0]
        return i

    sig = []
    for n in nodes:
        ins = tuple(("in", position[j]) if j in position else ("out", str(graph[j].out)) for j in map(source, n.inputs))
        sig.append((n.op.value, str(n.attrs), str(n.out), n.phase.value, ins))
    return tuple(sig)


def _chained(before: list[Node], after: list[Node]) -> bool:
    produced = {n.id for n in before}
    return any(i in produced for n in after for i in n.inputs)


def _same_chain(graph: Graph, layers: Layers, lst: str, first: int, count: int) -> bool:
    base = _signature(graph, layers[(lst, first)])
    return all(
        (lst, i) in layers
        and _signature(graph, layers[(lst, i)]) == base
        and _chained(layers[(lst, i - 1)], layers[(lst, i)])
        for i in range(first + 1, first + count)
    )


def _differentiable(graph: Graph) -> set[int]:
    """Forward values that depend on a parameter: the ones a backward pass differentiates."""
    dep: set[int] = set()
    for n in graph:
        if n.op is OpKind.PARAMETER or any(i in dep for i in n.inputs):
            dep.add(n.id)
    return dep


def _reads_differentiable(layer: list[Node], dep: set[int]) -> bool:
    inside = {n.id for n in layer}
    return any(i in dep and i not in inside for n in layer for i in n.inputs)


def _drop(
    graph: Graph, layers: dict[tuple[str, int], list[Node]], lst: str, first: int, count: int, repeat: int
) -> Graph:
    keep = layers[(lst, first)]
    stand_in = {
        old.id: kept.id
        for i in range(first + 1, first + count)
        for old, kept in zip(layers[(lst, i)], keep, strict=True)
    }
    out = Graph(graph.name, {f"{lst}.{first}": repeat})
    new: dict[int, int] = {}
    for n in graph:
        if n.id in stand_in:
            continue
        ins = [new[stand_in.get(i, i)] for i in n.inputs]
        new[n.id] = out.add(n.op, ins, n.out, n.attrs, phase=n.phase, scope=n.scope, name=n.name, origin=n.origin)
    out.inputs = [new[i] for i in graph.inputs]
    out.outputs = [new[stand_in.get(o, o)] for o in graph.outputs]
    return out


def fold_run(graph: Graph, prefix: str, repeat: int) -> Graph | None:
    """Fold the two captured copies ``<list>.<i>`` and ``<list>.<i+1>`` into a repeat of ``repeat``;
    ``None`` if they are not identical links of a chain."""
    lst, _, index = prefix.rpartition(".")  # the list's own path may hold indices (a list in a list)
    if not lst or not index.isdigit():
        return None
    first = int(index)
    layers = _layers(graph, lst)
    if (lst, first) not in layers or not _same_chain(graph, layers, lst, first, 2):
        return None
    if not _reads_differentiable(layers[(lst, first)], _differentiable(graph)):
        out = graph.copy()  # keep the first copy as it is; the second stands for the rest
        out.repeats = {f"{lst}.{first + 1}": repeat - 1} if repeat > 2 else {}
        return out
    return _drop(graph, layers, lst, first, 2, repeat)


def fold_layers(graph: Graph, notes: list[str]) -> Graph:
    """A copy of ``graph`` with its longest chain of identical layers folded (or ``graph`` itself)."""
    if graph.repeats:
        return graph
    layers = _layers(graph)
    by_list: dict[str, list[int]] = defaultdict(list)
    for lst, idx in layers:
        by_list[lst].append(idx)
    best: tuple[str, int, int] | None = None  # (list, first index, count)
    for lst, indices in by_list.items():
        indices.sort()
        sigs = {i: _signature(graph, layers[(lst, i)]) for i in indices}
        start = 0
        while start < len(indices):
            end = start + 1
            while (
                end < len(indices)
                and indices[end] == indices[end - 1] + 1
                and sigs[indices[end]] == sigs[indices[start]]
                and _chained(layers[(lst, indices[end - 1])], layers[(lst, indices[end])])
            ):
                end += 1
            count = end - start
            if count >= 2 and (best is None or count > best[2]):
                best = (lst, indices[start], count)
            start = end
    if best is None:
        return graph
    lst, first, count = best
    if not _reads_differentiable(layers[(lst, first)], _differentiable(graph)):
        first, count = first + 1, count - 1
        if count < 2:
            return graph
    last = first + count - 1
    notes.append(Note(f"layers {lst}.{first}..{last} are identical: folded to one with a repeat of {count}"))
    return _drop(graph, layers, lst, first, count, count)
