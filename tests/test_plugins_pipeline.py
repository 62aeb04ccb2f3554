"""The pass pipeline and the schedules come from the registry: an installed plugin changes the result.

``examples/echosim-pipeline-demo`` is a real package (CI installs it) that registers an
optional graph pass (``no-dropout``) and a schedule (``2f2b``) through the same hooks as
the built-ins.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from typing import ClassVar

import pytest
from click.testing import CliRunner

from echosim.cli import cli
from echosim.compiler import lower
from echosim.errors import EchosimError, PluginError
from echosim.ir.ops import ElementwiseAttrs
from echosim.plan import Cluster, Plan
from echosim.plugins import get_registry, hookimpl, load_registry

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("echosim_pipeline_demo") is None,
    reason="examples/echosim-pipeline-demo is not installed (the README's test install does it)",
)

PLAN = Plan(pp=2, dp=2, global_batch=16, seq_len=256)
CLUSTER = Cluster("a100-80gb", 4)


def test_built_in_passes_run_in_their_registered_order_and_the_plugin_slots_in() -> None:
    reg = get_registry()
    graph_level = [e.name for e in reg.pass_pipeline("graph")]
    assert graph_level.index("no-dropout") < graph_level.index("autodiff")
    assert graph_level[0] == "attention-kernel" and graph_level[-1] == "fused-expert-mlp"
    assert [e.name for e in reg.pass_pipeline("stage")] == ["data-parallel", "optimizer", "gradient-groups"]
    assert reg.passes["no-dropout"].owner == "pipeline-demo"
    assert reg.passes["autodiff"].owner == "echosim.passes.plugin"
    assert set(reg.schedules) >= {"1f1b", "gpipe", "interleaved", "zb-h1", "2f2b"}


def test_an_optional_plugin_pass_runs_only_when_asked_and_changes_the_result() -> None:
    plain = lower("gpt3-125m", PLAN, CLUSTER)
    asked = lower("gpt3-125m", Plan(**{**PLAN.as_dict(), "passes": ("no-dropout",)}), CLUSTER)
    dropouts = [n for n in plain.graph if isinstance(n.attrs, ElementwiseAttrs) and n.attrs.fn == "dropout"]
    assert dropouts
    assert not [n for n in asked.graph if isinstance(n.attrs, ElementwiseAttrs) and n.attrs.fn == "dropout"]
    a, b = plain.report, asked.report
    assert b.step_time_s < a.step_time_s
    assert b.memory[0]["activations"] < a.memory[0]["activations"]
    assert b.model_flops_per_step == a.model_flops_per_step  # dropout is no matmul


def test_a_plugin_schedule_is_selected_by_name_and_changes_the_result() -> None:
    base = lower("gpt3-125m", PLAN, CLUSTER)
    paired = lower("gpt3-125m", Plan(**{**PLAN.as_dict(), "schedule": "2f2b"}), CLUSTER)
    kinds = "".join(b.kind for b in paired.costed.rank_blocks(1))
    assert "FFBB" in kinds and "FFBB" not in "".join(b.kind for b in base.costed.rank_blocks(1))
    assert paired.report.step_time_s != base.report.step_time_s
    assert paired.report.memory[0]["activations"] > base.report.memory[0]["activations"]  # one more in flight
    assert paired.costed.longest_path_s() == pytest.approx(paired.report.step_time_s, rel=1e-9)


def test_the_cli_takes_plugin_passes_and_schedules() -> None:
    args = ["compile", "gpt3-125m", "--pp", "2", "--dp", "2", "--global-batch", "16", "--seq-len", "256", "--json"]
    result = CliRunner().invoke(cli, [*args, "--pass", "no-dropout", "--schedule", "2f2b"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)["plan"]
    assert plan["passes"] == ["no-dropout"] and plan["schedule"] == "2f2b"


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        (["--pass", "nope"], "Error: --pass nope: unknown pass optional passes: no-dropout"),
        (
            ["--pass", "autodiff"],
            "Error: --pass autodiff: pass always runs when it applies; optional passes: no-dropout",
        ),
        (
            ["--schedule", "nope"],
            "Error: unknown schedule 'nope' (known: 1f1b, 2f2b, dualpipe, gpipe, interleaved, zb-h1)",
        ),
    ],
)
def test_unknown_passes_and_schedules_are_one_line(flag: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["compile", "gpt3-125m", "--dp", "2", *flag])
    assert result.exit_code == 1
    assert result.output.strip() == message


@dataclass(frozen=True)
class _Noop:
    name: ClassVar[str] = "noop"

    def run(self, graph: object) -> object:
        return graph


class _Misordered:
    __name__ = "misordered"

    def __init__(self, **kwargs: object) -> None:
        self.kwargs = kwargs

    @hookimpl
    def register_passes(self, register) -> None:  # type: ignore[no-untyped-def]
        register("noop", _Noop, **self.kwargs)


def test_ordering_against_a_pass_that_does_not_exist_names_the_plugin() -> None:
    reg = load_registry(include_entrypoints=False, extra_plugins=[_Misordered(after="nope")])
    with pytest.raises(PluginError, match=r"^plugin 'misordered': pass 'noop' is ordered against 'nope'"):
        reg.pass_pipeline("graph")


def test_contradicting_orders_are_an_error() -> None:
    reg = load_registry(include_entrypoints=False, extra_plugins=[_Misordered(after="recompute", before="autodiff")])
    with pytest.raises(PluginError, match="contradicting after/before orders"):
        reg.pass_pipeline("graph")


def test_a_stage_level_plugin_pass_runs_after_the_split() -> None:
    reg = load_registry(
        include_entrypoints=False,
        extra_plugins=[_Misordered(level="stage", after="optimizer", before="gradient-groups")],
    )
    assert [e.name for e in reg.pass_pipeline("stage")] == ["data-parallel", "optimizer", "noop", "gradient-groups"]


def test_an_unknown_level_is_refused_naming_the_plugin() -> None:
    reg = load_registry(include_entrypoints=False, extra_plugins=[_Misordered(level="model")])
    assert any(e.startswith("plugin 'misordered': pass 'noop' level 'model' is unknown") for e in reg.errors)
    assert "noop" not in reg.passes


@dataclass(frozen=True)
class _Breaker:
    """Reads a value that does not exist: the kind of bug a plugin pass can ship."""

    name: ClassVar[str] = "breaker"

    def run(self, graph):  # type: ignore[no-untyped-def]
        from echosim.ir.ops import OpKind
        from echosim.ir.types import DType, TensorSpec

        g = graph.copy()
        g.add(OpKind.VIEW, [10**9], TensorSpec((1,), DType.BF16), name="dangling")
        return g


class _Breaking:
    __name__ = "breaking"

    @hookimpl
    def register_passes(self, register) -> None:  # type: ignore[no-untyped-def]
        register("breaker", _Breaker, after="autodiff")


def test_a_plugin_pass_that_breaks_the_graph_is_caught_and_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ECHOSIM_VERIFY", raising=False)  # production: built-ins unchecked, plugins checked
    reg = load_registry(include_entrypoints=False, extra_plugins=[_Breaking()])
    with pytest.raises(EchosimError, match=r"^a pass broke the graph: .*after pass 'breaker'"):
        lower("gpt3-125m", Plan(dp=2, seq_len=128), Cluster("a100-80gb", 2), registry=reg)
