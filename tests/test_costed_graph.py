"""The costed execution graph: one object every output reads, whose longest path is the step time."""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx
import pytest
from click.testing import CliRunner
from conftest import COSTED_LAYOUTS

from echosim.cli import cli
from echosim.compiler import Compiled, lower
from echosim.errors import EchosimError
from echosim.plan import Cluster, Plan
from echosim.plugins import get_registry
from echosim.timeline.costed import write_graph
from echosim.timeline.report import breakdown

LAYOUTS = COSTED_LAYOUTS


def _lower(name: str) -> Compiled:
    model, plan, devices = LAYOUTS[name]
    return lower(model, plan, Cluster("h100-sxm", devices))


def _distances(g: nx.DiGraph) -> dict[str, float]:
    """Longest-path distance from a source to every node (edge weight: the time one task imposes on the next)."""
    dist: dict[str, float] = {}
    for n in nx.topological_sort(g):
        dist[n] = max((dist[u] + d["weight"] for u, _, d in g.in_edges(n, data=True)), default=0.0)
    return dist


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_the_longest_path_is_the_step_time_and_every_task_starts_when_its_dependencies_allow(name: str) -> None:
    c = _lower(name)
    g = c.costed.dag()
    assert nx.is_directed_acyclic_graph(g)
    step = c.report.step_time_s
    assert c.costed.longest_path_s() == pytest.approx(step, rel=1e-9)
    assert g.graph["step_time_s"] == step
    dist = _distances(g)
    for node, data in g.nodes(data=True):
        # ops start within their unit (their own component), tasks within the step
        assert dist[node] == pytest.approx(data["start_s"], rel=1e-9, abs=1e-12), node
        assert data["duration_s"] >= 0


def test_report_breakdown_and_tail_read_the_same_costed_graph() -> None:
    c = _lower("1f1b")
    r, costed = c.report, c.costed
    assert r.step_time_s == costed.step_time_s and r.critical_stage == costed.critical_rank
    assert r.breakdown == breakdown(costed, costed.critical_rank)
    assert sum(r.breakdown.values()) == pytest.approx(r.step_time_s, rel=1e-9)
    tail = costed.rank_tail(costed.critical_rank)
    # tp 2 x pp 4 eager stands for Megatron-Core's DDP (gradients are views of its buffer, no bucket copies): the
    # exposed reduction first (tests/test_ddp_bucket_copies.py has the pure data-parallel tail's copies)
    assert tail[0].task == "dp" and "dp_copies" not in {t.task for t in tail} and tail[-1].task == "optimizer"
    assert tail[-1].end == pytest.approx(r.step_time_s, rel=1e-12)


def test_memory_timeline_peaks_where_the_report_counts_activations() -> None:
    c = _lower("1f1b")
    for rank in range(4):
        timeline = c.costed.memory_timeline(rank)
        peak = max(live[rank] for _, live in timeline)
        assert peak == c.costed.in_flight(rank)[rank] == 4 - rank  # 1F1B: pp - rank micro-batches in flight
        assert timeline[-1][1][rank] == 0


def test_size_does_not_grow_with_layers_or_devices() -> None:
    gpt3 = get_registry().model("gpt3-175b")()

    def size(layers: int, dp: int) -> tuple[int, int]:
        plan = Plan(tp=8, pp=16, dp=dp, global_batch=32 * dp, seq_len=2048, dtype="fp16")
        g = lower(gpt3.with_(layers=layers), plan, Cluster("a100-80gb", 8 * 16 * dp)).costed.dag()
        return g.number_of_nodes(), g.number_of_edges()

    base = size(96, 8)
    assert size(96, 64) == base  # 8x the devices
    assert size(192, 8) == base  # twice the layers fold into the same block nodes


@pytest.mark.parametrize("suffix", [".graphml", ".json"])
def test_graph_files_are_written_by_networkx_and_read_back(tmp_path: Path, suffix: str) -> None:
    c = _lower("interleaved")
    path = tmp_path / f"step{suffix}"
    write_graph(c.costed, path)
    if suffix == ".graphml":
        back = nx.read_graphml(path)
    else:
        back = nx.node_link_graph(json.loads(path.read_text()), edges="edges")
    assert back.number_of_nodes() == c.costed.dag().number_of_nodes()
    assert nx.dag_longest_path_length(back, weight="weight") == pytest.approx(c.report.step_time_s, rel=1e-9)
    ops = [d for _, d in back.nodes(data=True) if d["kind"] in ("op", "collective")]
    needed = {"stream", "start_s", "duration_s", "flops", "bytes", "scope", "slowdown"}
    assert ops and all(needed <= set(d) for d in ops)


@pytest.mark.slow
def test_the_default_compiles_graphml_longest_path_is_its_step_time(tmp_path: Path) -> None:
    """What a user gets from ``echosim compile --graph step.graphml``, read back by networkx alone."""
    path = tmp_path / "step.graphml"
    result = CliRunner().invoke(cli, ["compile", "--graph", str(path), "--json"])
    assert result.exit_code == 0, result.output
    step = json.loads(result.output)["step_time_s"]
    g = nx.read_graphml(path)
    assert nx.is_directed_acyclic_graph(g) and 1000 < g.number_of_nodes() < 20_000
    assert nx.dag_longest_path_length(g, weight="weight") == pytest.approx(step, rel=1e-3)
    assert g.graph["step_time_s"] == pytest.approx(step, rel=1e-5)  # the report rounds to 6 digits


def test_graph_export_is_deterministic(tmp_path: Path) -> None:
    for i in range(2):
        write_graph(_lower("zb-h1").costed, tmp_path / f"{i}.json")
    assert (tmp_path / "0.json").read_bytes() == (tmp_path / "1.json").read_bytes()


def test_bad_graph_paths_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(EchosimError, match=r"unknown format '\.png' \(known: \.graphml, \.json\)"):
        write_graph(_lower("1f1b").costed, tmp_path / "g.png")
    runner = CliRunner()
    for args, message in (
        (["--graph", str(tmp_path / "g.dot")], "unknown format '.dot'"),
        (["--graph", "/nonexistent/dir/g.graphml"], "--graph /nonexistent/dir/g.graphml: cannot write"),
        (["--trace", "/nonexistent/dir/t.json"], "--trace /nonexistent/dir/t.json: cannot write"),
        (["--out", "/nonexistent/dir/r.json"], "--out /nonexistent/dir/r.json: cannot write"),
        (["--graph", str(tmp_path / "d.graphml")], f"--graph {tmp_path / 'd.graphml'}: cannot write (Is a directory)"),
        (["--trace", str(tmp_path)], f"--trace {tmp_path}: cannot write (Is a directory)"),
    ):
        (tmp_path / "d.graphml").mkdir(exist_ok=True)
        result = runner.invoke(cli, ["compile", "gpt3-125m", "--dp", "2", *args])
        assert result.exit_code == 1 and "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) == 1 and message in result.output


def test_an_unwritable_output_is_refused_before_the_compile_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_compile(*args: object) -> None:
        raise AssertionError("compiled although the output cannot be written")

    monkeypatch.setattr("echosim.compiler.lower", no_compile)
    for option, path in (("--graph", "/nonexistent/g.graphml"), ("--report", "/nonexistent/r.html"),
                         ("--trace", "/nonexistent/t.json"), ("--out", "/nonexistent/r.json")):  # fmt: skip
        result = CliRunner().invoke(cli, ["compile", "gpt3-125m", option, path])
        assert result.exit_code == 1
        assert result.output.strip() == f"Error: {option} {path}: cannot write (No such file or directory)"
