"""Caches shared between compiles return what a fresh computation returns, and forget a graph that changed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest

from echosim.compiler import lower
from echosim.ir.graph import Graph
from echosim.ir.ops import OpKind
from echosim.ir.types import DType, TensorSpec
from echosim.memo import Memo, clear_all
from echosim.passes.base import run_passes
from echosim.passes.pipeline import PipelineParallel
from echosim.passes.tensor_parallel import TensorParallel
from echosim.plan import Cluster, Plan


def test_derived_values_are_dropped_when_the_graph_changes() -> None:
    g = Graph("g")
    x = g.add(OpKind.INPUT, [], TensorSpec((4,), DType.FP32))
    assert g.derived("n", lambda: len(g)) == 1
    g.add(OpKind.ELEMENTWISE, [x], TensorSpec((4,), DType.FP32))
    assert g.derived("n", lambda: len(g)) == 2
    g.repeats["layers.0"] = 3
    assert g.derived("r", lambda: dict(g.repeats)) == {"layers.0": 3}
    g.repeats["layers.0"] = 4
    assert g.derived("r", lambda: dict(g.repeats)) == {"layers.0": 4}


def test_users_and_dag_follow_the_node_table() -> None:
    g = Graph("g")
    a = g.add(OpKind.INPUT, [], TensorSpec((4,), DType.FP32))
    assert g.users(a) == []
    b = g.add(OpKind.ELEMENTWISE, [a, a], TensorSpec((4,), DType.FP32))
    c = g.add(OpKind.ELEMENTWISE, [a], TensorSpec((4,), DType.FP32))
    assert g.users(a) == [b, c] and set(g.dag.successors(a)) == {b, c}
    g.replace(c, inputs=(b,))
    assert g.users(a) == [b] and g.users(b) == [c] and set(g.dag.successors(b)) == {c}
    copy = g.copy()
    copy.add(OpKind.ELEMENTWISE, [c], TensorSpec((4,), DType.FP32))
    assert g.users(c) == [] and len(copy.users(c)) == 1


@dataclass(frozen=True)
class _Counting:
    """A pass that counts its runs (class-level, since the dataclass is frozen)."""

    runs: ClassVar[list[int]] = []
    name: ClassVar[str] = "counting"

    def run(self, graph: Graph) -> Graph:
        self.runs.append(1)
        return graph.copy()


def test_a_reused_pass_runs_once_per_graph_and_is_verified_when_asked(tiny_gpt: Graph) -> None:
    _Counting.runs.clear()
    first = run_passes(tiny_gpt, [_Counting()], check=False, reuse={"counting"})
    again = run_passes(tiny_gpt, [_Counting()], check=True, reuse={"counting"})
    assert again is first and len(_Counting.runs) == 1
    fresh = run_passes(tiny_gpt, [_Counting()], check=False)  # not named in reuse: it runs
    assert fresh is not first and len(_Counting.runs) == 2


def test_middle_pipeline_stages_share_one_graph(tiny_gpt: Graph) -> None:
    joint = run_passes(tiny_gpt, [TensorParallel(2)], check=False)
    joint.repeats = {k: 8 for k in joint.repeats}
    stages = PipelineParallel(4).split(joint)
    assert [s.layers for s in stages] == [2, 2, 2, 2]
    assert stages[1].graph is stages[2].graph
    assert stages[0].graph is not stages[1].graph and stages[3].graph is not stages[2].graph
    assert PipelineParallel(4).split(joint) is stages


def test_memo_keeps_its_bound() -> None:
    memo: Memo[int] = Memo("test", maxsize=4)
    for i in range(10):
        memo.put(i, i)
    assert len(memo) <= 4 and memo.lookup(9) == 9


@pytest.mark.parametrize("plan", [Plan(tp=2, pp=2, dp=2, global_batch=8), Plan(pp=4, dp=2, zero=1, global_batch=16)])
def test_a_compile_from_warm_caches_equals_a_cold_one(plan: Plan) -> None:
    cluster = Cluster("a100-80gb", plan.world)
    clear_all()
    cold = lower("gpt3-125m", plan, cluster).report.to_dict()
    warm = lower("gpt3-125m", plan, cluster).report.to_dict()
    assert warm == cold
