"""``prepare_joint`` keeps a registered model's capture and its graph-level passes by the plan fields they read:
a layout search prepares thousands of layouts that differ only in fields no graph-level pass reads."""

from __future__ import annotations

import contextlib
import pickle
from dataclasses import fields
from typing import Any

import pytest

from echosim import compiler
from echosim.compiler import GRAPH_PASS_FIELDS, prepare_joint
from echosim.memo import clear_all
from echosim.passes.plugin import BUILTIN_PASSES
from echosim.plan import Cluster, Plan

PLAN_FIELDS = {f.name for f in fields(Plan)}


class _Reads:
    """A plan that records which of its fields are read (through its properties too)."""

    def __init__(self, plan: Plan) -> None:
        self._plan = plan
        self.read: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        prop = getattr(type(self._plan), name, None)
        if isinstance(prop, property):
            return prop.fget(self)  # type: ignore[misc]
        self.read.add(name)
        return getattr(self._plan, name)


@pytest.mark.parametrize(
    "plan",
    [
        Plan(),
        Plan(tp=1, pp=1, dp=8, embedding_sharding="row"),
        Plan(dtype="fp8", ep=2, etp=1, cp=2),
        Plan(framework="eager-amp", dtype="bf16", recompute="full"),
        Plan(embedding_sharding="bogus"),
    ],
)
def test_graph_pass_fields_cover_what_the_builtin_configures_read(plan: Plan) -> None:
    """The key of the graph-level cache: a field a built-in graph-level configure reads but the key left out
    would hand one layout another's passes."""
    for _, configure, level in BUILTIN_PASSES:
        if level != "graph":
            continue
        reads = _Reads(plan)
        with contextlib.suppress(Exception):  # a branch that refuses the plan: what it read before still counts
            configure(reads)
        assert reads.read & PLAN_FIELDS <= set(GRAPH_PASS_FIELDS), configure.__name__


def _dump(joint: Any) -> bytes:
    g = joint.graph
    return pickle.dumps(
        (joint.plan, tuple(g.nodes.items()), dict(g.repeats), g.inputs, g.outputs, g.grads, joint.stage_passes,
         joint.where, joint.options, joint.facts, joint.own_passes_only)
    )  # fmt: skip


PLANS = [
    Plan(tp=8, pp=4, dp=2, zero=0, global_batch=64),
    Plan(tp=8, pp=4, dp=2, zero=1, global_batch=64),  # differs in a field no graph-level pass reads
    Plan(tp=8, pp=4, dp=2, zero=3, vpp=2, global_batch=64),
    Plan(tp=4, pp=8, dp=2, zero=1, global_batch=64),  # another tp: other graph-level passes
]


def test_graph_level_configured_once_per_fields_and_same_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """Layouts that differ only in the ZeRO stage and virtual stages configure (and capture) once, and each
    prepared layout is the one an empty cache gives."""
    model, cluster = "gpt3-175b", Cluster("a100-80gb", 64)
    fresh = []
    for plan in PLANS:
        clear_all()
        fresh.append(_dump(prepare_joint(model, plan, cluster)))
    clear_all()
    configured: list[str] = []
    loads: list[str] = []
    configure, load = compiler._configured, compiler.load_model
    monkeypatch.setattr(compiler, "_configured", lambda r, level, p: configured.append(level) or configure(r, level, p))
    monkeypatch.setattr(compiler, "load_model", lambda m, p: loads.append(m) or load(m, p))
    kept = [_dump(prepare_joint(model, plan, cluster)) for plan in PLANS]
    assert kept == fresh
    assert configured.count("graph") == 2  # tp 8 and tp 4 (4 without the cache)
    assert configured.count("stage") == len(PLANS)
    assert loads == [model]  # one capture spec (4 loads without the cache)


def test_a_plugin_graph_pass_is_configured_for_each_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """A graph-level configure that is not a built-in may read any field: no cache then."""
    from echosim.plugins import get_registry

    registry = get_registry()
    entry = registry.pass_pipeline("graph")[0]
    monkeypatch.setattr(compiler, "_BUILTIN_GRAPH_CONFIGURES", frozenset())  # as if none of them were built in
    clear_all()
    configured: list[str] = []
    configure = compiler._configured
    monkeypatch.setattr(compiler, "_configured", lambda r, level, p: configured.append(level) or configure(r, level, p))
    for plan in PLANS[:2]:
        prepare_joint("gpt3-175b", plan, Cluster("a100-80gb", 64))
    assert configured.count("graph") == 2 and entry.value.configure is not None
