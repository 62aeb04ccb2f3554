"""Fold layers a file stores N times (ONNX) back to one copy with a repeat count.

A layer is the set of nodes whose scope starts with ``<list>.<i>`` (``layers.3``,
``model.layers.3``, ``h.3``). Consecutive layers are the same when their node
sequences match: op, attributes, output type, and where each input comes from
(inside the layer by position, or outside by type). The longest run of
identical layers is kept once, its first copy stands for all, and readers of the
run's last layer read the first copy's matching value instead. Other layers stay
as they are. Models with a repeat already (captured before folding) are left alone.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from echosim.ir.graph import Graph, Node

_LAYER = re.compile(r"^(?P<list>(?:[\w-]+\.)*?[A-Za-z_][\w-]*)\.(?P<index>\d+)(?=\.|$)")


def layer_of(scope: str) -> tuple[str, int] | None:
    match = _LAYER.match(scope)
    return (match.group("list"), int(match.group("index"))) if match else None


def _signature(graph: Graph, nodes: list[Node]) -> tuple[Any, ...]:
    position = {n.id: i for i, n in enumerate(nodes)}
    sig = []
    for n in nodes:
        ins = tuple(("in", position[i]) if i in position else ("out", str(graph[i].out)) for i in n.inputs)
        sig.append((n.op.value, str(n.attrs), str(n.out), n.phase.value, ins))
    return tuple(sig)


def fold_layers(graph: Graph, notes: list[str]) -> Graph:
    """A copy of ``graph`` with its longest run of identical layers folded (or ``graph`` itself)."""
    if graph.repeats:
        return graph
    layers: dict[tuple[str, int], list[Node]] = defaultdict(list)
    for n in graph:
        key = layer_of(n.scope)
        if key is not None:
            layers[key].append(n)
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
            ):
                end += 1
            count = end - start
            if count >= 2 and (best is None or count > best[2]):
                best = (lst, indices[start], count)
            start = end
    if best is None:
        return graph
    lst, first, count = best
    keep = layers[(lst, first)]
    stand_in = {
        old.id: kept.id
        for i in range(first + 1, first + count)
        for old, kept in zip(layers[(lst, i)], keep, strict=True)
    }
    dropped = set(stand_in)
    out = Graph(graph.name, {f"{lst}.{first}": count})
    new: dict[int, int] = {}
    for n in graph:
        if n.id in dropped:
            continue
        ins = [new[stand_in.get(i, i)] for i in n.inputs]
        new[n.id] = out.add(n.op, ins, n.out, n.attrs, phase=n.phase, scope=n.scope, name=n.name, origin=n.origin)
    out.inputs = [new[i] for i in graph.inputs]
    out.outputs = [new[stand_in.get(o, o)] for o in graph.outputs]
    notes.append(f"layers {lst}.{first}..{first + count - 1} are identical: folded to one with a repeat of {count}")
    return out
