"""An IR graph as plain JSON data, and back: what the capture cache stores.

Data, never code: every value is a number, a string, a list or an object, decoded
against the IR's own tables (op kinds, dtypes, phases, the attribute classes of
:mod:`echosim.ir.ops`). Anything else (an unknown op, attribute or field, a wrong
type, an input that names no earlier node) is a :class:`GraphDataError`, so a damaged
or foreign file can be treated as absent rather than trusted.
"""

from __future__ import annotations

import dataclasses
from enum import Enum
from typing import Any

from echosim.ir import ops
from echosim.ir.graph import Graph, Node
from echosim.ir.ops import ATTRS_FOR, OpKind, Phase
from echosim.ir.types import DType, TensorSpec

#: Bump when the layout of the data below changes; older data is then refused.
FORMAT = 1

_ATTR_CLASSES: dict[str, type] = {cls.__name__: cls for classes in ATTRS_FOR.values() for cls in classes}
_ENUMS: dict[str, type[Enum]] = {"Axis": ops.Axis, "Role": ops.Role}


class GraphDataError(ValueError):
    """The data does not describe an IR graph of this format."""


def graph_to_data(graph: Graph) -> dict[str, Any]:
    """The graph as JSON-ready data (nodes in their topological insertion order)."""
    return {
        "format": FORMAT,
        "name": graph.name,
        "repeats": dict(graph.repeats),
        "block_layers": dict(graph.block_layers),
        # only where the recompute pass set it (full:N and kin): graphs without it keep their data as before
        **({"replay_layers": graph.replay_layers} if graph.replay_layers else {}),
        **({"replay_every": graph.replay_every} if graph.replay_every else {}),
        **({"replay_group": graph.replay_group} if graph.replay_group else {}),
        **({"samples": graph.samples} if graph.samples else {}),  # only where the inputs fix the batch
        **({"checkpointed": list(graph.checkpointed)} if graph.checkpointed else {}),
        "inputs": list(graph.inputs),
        "outputs": list(graph.outputs),
        "grads": [[p, g] for p, g in graph.grads.items()],
        "next": graph._next,
        "nodes": [_node_to_data(n) for n in graph],
    }


def _node_to_data(n: Node) -> list[Any]:
    attrs = {f.name: _plain(getattr(n.attrs, f.name)) for f in dataclasses.fields(n.attrs)}
    return [
        n.id, n.op.value, list(n.inputs), list(n.out.shape), n.out.dtype.value, type(n.attrs).__name__, attrs,
        n.phase.value, n.scope, n.name, n.origin,
    ]  # fmt: skip


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):  # a tuple of integers (CollectiveAttrs.pieces): a JSON list
        return list(value)
    return value.value if isinstance(value, Enum) else value


def graph_from_data(data: Any) -> Graph:
    """Rebuild a graph from :func:`graph_to_data`'s output; :class:`GraphDataError` if it is not one."""
    try:
        return _graph_from_data(data)
    except GraphDataError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise GraphDataError(f"not an IR graph: {type(exc).__name__}: {exc}") from None


def _graph_from_data(data: Any) -> Graph:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise GraphDataError(f"not an IR graph of format {FORMAT}")
    repeats = data["repeats"]
    if not isinstance(repeats, dict) or not all(_is_int(v) and v >= 0 for v in repeats.values()):
        raise GraphDataError("repeats must map scope prefixes to counts")
    layers = data.get("block_layers", {})  # absent: every block is one layer
    if not isinstance(layers, dict) or not all(_is_int(v) and v >= 1 for v in layers.values()):
        raise GraphDataError("block_layers must map scope prefixes to layer counts")
    graph = Graph(_str(data["name"]), {_str(k): v for k, v in repeats.items()}, {_str(k): v for k, v in layers.items()})
    for key in ("replay_layers", "replay_every", "replay_group"):  # absent: every layer replays, checkpointed alone
        value = data.get(key, 0)
        if not _is_int(value) or value < 0:
            raise GraphDataError(f"{key} must be a layer count")
        setattr(graph, key, value)
    samples = data.get("samples", 0)  # absent: the micro-batch binds the batch
    if not _is_int(samples) or samples < 0:
        raise GraphDataError("samples must be a count of samples")
    graph.samples = samples
    checkpointed = data.get("checkpointed", [])
    if not isinstance(checkpointed, list) or not all(isinstance(c, str) for c in checkpointed):
        raise GraphDataError("checkpointed must list module paths")
    graph.checkpointed = tuple(checkpointed)
    table: dict[int, Node] = {}
    for item in data["nodes"]:
        node = _node_from_data(item)
        if any(i not in table for i in node.inputs):
            raise GraphDataError(f"node {node.id} reads a value no earlier node defines")
        if node.id in table:
            raise GraphDataError(f"node {node.id} is defined twice")
        table[node.id] = node
    graph.nodes = table
    graph.inputs = [_known(graph, i) for i in data["inputs"]]
    graph.outputs = [_known(graph, i) for i in data["outputs"]]
    graph.grads = {_known(graph, p): _known(graph, g) for p, g in data["grads"]}
    graph._next = _int(data["next"])
    if graph.nodes and graph._next <= max(graph.nodes):
        raise GraphDataError("the next node id is not past every node")
    return graph


def _node_from_data(item: Any) -> Node:
    nid, op, inputs, shape, dtype, attrs_name, attrs, phase, scope, name, origin = item
    kind = OpKind(op)
    cls = _ATTR_CLASSES.get(attrs_name)
    if cls is None or cls not in ATTRS_FOR[kind]:
        raise GraphDataError(f"node {nid}: {kind.value} cannot carry {attrs_name!r}")
    if not isinstance(attrs, dict):
        raise GraphDataError(f"node {nid}: attributes must be an object")
    known = {f.name: f for f in dataclasses.fields(cls)}
    if set(attrs) - set(known):
        raise GraphDataError(f"node {nid}: unknown attribute(s) {sorted(set(attrs) - set(known))}")
    values = {k: _value(str(known[k].type), v) for k, v in attrs.items()}
    dims = tuple(_int(d) for d in shape)
    return Node(
        _int(nid),
        kind,
        tuple(_int(i) for i in inputs),
        TensorSpec(dims, DType(dtype)),
        cls(**values),
        Phase(phase),
        _str(scope),
        _str(name),
        None if origin is None else _int(origin),
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(value: Any) -> int:
    if not _is_int(value):
        raise GraphDataError(f"expected an integer, got {type(value).__name__}")
    return value


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise GraphDataError(f"expected a string, got {type(value).__name__}")
    return value


def _value(annotation: str, value: Any) -> Any:
    if annotation == "tuple[int, ...]":
        if not isinstance(value, list):
            raise GraphDataError(f"expected a list of integers, got {type(value).__name__}")
        return tuple(_int(v) for v in value)
    return _ENUMS[annotation](value) if annotation in _ENUMS else _scalar(value)


def _scalar(value: Any) -> Any:
    if isinstance(value, (bool, int, float, str)):
        return value
    raise GraphDataError(f"attribute values are numbers or strings, got {type(value).__name__}")


def _known(graph: Graph, nid: Any) -> int:
    if _int(nid) not in graph.nodes:
        raise GraphDataError(f"%{nid} names no node")
    return nid
