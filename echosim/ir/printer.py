"""A stable text form of a graph, for golden-file tests and ``--dump-ir``."""

from __future__ import annotations

from echosim.ir.graph import Graph


def print_graph(graph: Graph) -> str:
    lines = [f"graph {graph.name}"]
    for prefix, count in sorted(graph.repeats.items()):
        layers = graph.layers_per_block(prefix)
        lines.append(f"  repeat {prefix} x{count}" + (f" ({layers} layers each)" if layers > 1 else ""))
    for node in graph:
        args = ", ".join(f"%{i}" for i in node.inputs)
        attrs = str(node.attrs)
        text = f"  %{node.id} = {node.op.value}({args}) : {node.out}"
        if attrs:
            text += f" {{{attrs}}}"
        text += f"  [{node.phase.value}] {node.scope or '-'}"
        if node.name:
            text += f" ({node.name})"
        lines.append(text)
    if graph.outputs:
        lines.append("  return " + ", ".join(f"%{o}" for o in graph.outputs))
    return "\n".join(lines) + "\n"
