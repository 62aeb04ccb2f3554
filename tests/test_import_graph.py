"""No import cycle anywhere inside echosim/: import-linter checks layers and siblings, this checks modules."""

from __future__ import annotations

import pytest


def test_no_module_of_echosim_is_on_an_import_cycle() -> None:
    grimp = pytest.importorskip("grimp")
    nx = pytest.importorskip("networkx")
    # as import-linter reads it (pyproject: exclude_type_checking_imports): imports that run, function-level included
    graph = grimp.build_graph("echosim", exclude_type_checking_imports=True)
    edges = [(m, d) for m in graph.modules for d in graph.find_modules_directly_imported_by(m)]
    assert len(graph.modules) > 50 and len(edges) > 200  # the whole package was read
    cycles = [sorted(c) for c in nx.strongly_connected_components(nx.DiGraph(edges)) if len(c) > 1]
    assert cycles == []
