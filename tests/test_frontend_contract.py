"""The frontend contract: a loader's ``capture(spec)`` gets a CaptureSpec (never the Plan), and the
frontend layer is acyclic and depends only on the IR, the errors and the plugin registry."""

from __future__ import annotations

import dataclasses

import pytest

from echosim.compiler import lower
from echosim.frontend import CaptureSpec, capture_object
from echosim.ir.graph import Graph
from echosim.plan import Cluster, Plan


class Recorder:
    """A third-party frontend's model object: remembers what it was asked to capture."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.specs: list[object] = []

    def capture(self, spec: CaptureSpec) -> tuple[Graph, list[str], int]:
        self.specs.append(spec)
        return self.graph, [], self.graph.param_count()


def test_a_loaders_capture_receives_the_micro_batch_sequence_and_dtype_of_the_plan(tiny_gpt: Graph) -> None:
    model = Recorder(tiny_gpt)
    plan = Plan(dp=2, micro_batch=1, seq_len=16, dtype="fp16", recompute="full")
    lower(model, plan, Cluster("null", devices=2))
    assert model.specs == [CaptureSpec(micro_batch=1, seq_len=16, dtype="fp16")]
    assert type(model.specs[0]) is CaptureSpec


def test_a_capture_spec_is_frozen_and_defaults_to_the_plans_defaults() -> None:
    plan = Plan()
    assert CaptureSpec() == CaptureSpec(plan.micro_batch, plan.seq_len, plan.dtype)
    with pytest.raises(dataclasses.FrozenInstanceError):
        CaptureSpec().micro_batch = 2  # type: ignore[misc]


def test_an_ir_graph_is_captured_as_it_is(tiny_gpt: Graph) -> None:
    graph, messages, params = capture_object(tiny_gpt, CaptureSpec(), "g")
    assert graph is tiny_gpt and messages == [] and params == tiny_gpt.param_count()


# echosim.dists: a stdlib-only reader of installed versions (the capture cache key), below every layer
ALLOWED = ("echosim.frontend", "echosim.ir", "echosim.errors", "echosim.plugins", "echosim.dists")


def _frontend_imports() -> dict[str, set[str]]:
    """Direct imports (function-level and TYPE_CHECKING ones included) of each echosim.frontend module."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("echosim")
    mods = {m for m in graph.modules if m == "echosim.frontend" or m.startswith("echosim.frontend.")}
    return {m: {d for d in graph.find_modules_directly_imported_by(m) if d.startswith("echosim")} for m in mods}


def test_the_frontend_has_no_import_cycle() -> None:
    nx = pytest.importorskip("networkx")
    imports = _frontend_imports()
    g = nx.DiGraph([(m, d) for m, ds in imports.items() for d in ds if d in imports])
    cycles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    assert cycles == []


def test_the_frontend_imports_only_the_ir_the_errors_and_the_plugin_registry() -> None:
    outside = sorted(
        (m, d)
        for m, ds in _frontend_imports().items()
        for d in ds
        if not any(d == a or d.startswith(a + ".") for a in ALLOWED)
    )
    assert outside == []  # echosim.plan and echosim.passes above all
