"""Structural checks run between passes; a failure names the pass that broke the graph."""

from __future__ import annotations

from echosim.ir.graph import Graph
from echosim.ir.ops import ATTRS_FOR, OpKind, ViewAttrs


class VerifyError(ValueError):
    pass


def verify(graph: Graph, after: str = "") -> None:
    """Raise :class:`VerifyError` if the graph is not a well-formed SSA DAG."""
    import networkx as nx  # debug mode and plugin passes only: kept off the compile path

    where = f" after pass {after!r}" if after else ""
    if not nx.is_directed_acyclic_graph(graph.dag):
        raise VerifyError(f"graph {graph.name!r} has a cycle{where}")
    seen: set[int] = set()
    for node in graph:
        for i in node.inputs:
            if i not in graph.nodes:
                raise VerifyError(f"node {node.id} ({node.name}) reads missing value %{i}{where}")
            if i not in seen:
                raise VerifyError(f"node {node.id} ({node.name}) reads %{i} before it is defined{where}")
        if not isinstance(node.attrs, ATTRS_FOR[node.op]):
            raise VerifyError(
                f"node {node.id} ({node.name}): {node.op.value} cannot carry {type(node.attrs).__name__}{where}"
            )
        if isinstance(node.attrs, ViewAttrs) and node.attrs.perm:
            # a permutation of the input's axes; sizes are the frontend's check: a pass that shards a weight leaves
            # the views of it as they were (they cost nothing), and their sizes with it
            src = graph.nodes[node.inputs[0]].out.shape if node.inputs else ()
            perm = node.attrs.perm
            if sorted(perm) != list(range(len(src))) or len(node.out.shape) != len(src):
                raise VerifyError(
                    f"node {node.id} ({node.name}): perm {perm} is no permutation of {src} to {node.out.shape}{where}"
                )
        if any(d <= 0 for d in node.out.shape):
            raise VerifyError(f"node {node.id} ({node.name}) has a non-positive dim {node.out}{where}")
        if node.op.is_placeholder and node.inputs:
            raise VerifyError(f"placeholder {node.id} ({node.name}) has inputs{where}")
        seen.add(node.id)
    for inp in graph.inputs:
        if inp not in graph.nodes or graph.nodes[inp].op is not OpKind.INPUT:
            raise VerifyError(f"graph input %{inp} is not an input node{where}")
    for out in graph.outputs:
        if out not in graph.nodes:
            raise VerifyError(f"graph output %{out} does not exist{where}")
    for prefix, count in graph.repeats.items():
        if count < 0:
            raise VerifyError(f"repeat count of {prefix!r} is negative{where}")
    if set(graph.dag.nodes) != set(graph.nodes):
        raise VerifyError(f"networkx structure and node table disagree{where}")
    for node in graph:
        if node.op is OpKind.PARAMETER and node.out.numel == 0:
            raise VerifyError(f"parameter {node.name} is empty{where}")
