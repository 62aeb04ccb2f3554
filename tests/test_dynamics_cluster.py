"""Mixed device pools: the cluster file's checks, the balanced split, and one example end to end."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import TINY_RWKV, check_whole_warning_carried
from hypothesis import given, settings
from hypothesis import strategies as st

from echosim.cli import cli
from echosim.dynamics.cluster import (
    ClusterFileError,
    Link,
    MixedCluster,
    Pool,
    cross_pool_sync_s,
    read_cluster,
    water_fill,
)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "clusters" / "h100-a100.toml"
KNOWN = ["a100-80gb", "h100-sxm"]

POOLS = """
[[pools]]
name = "h100"
device = "h100-sxm"
devices = 16

[[pools]]
name = "a100"
device = "a100-80gb"
devices = 16
"""
LINK = """
[[links]]
pools = ["h100", "a100"]
GBps = 100.0
latency_us = 20.0
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    return str(path)


def test_reads_pools_and_links(tmp_path: Path) -> None:
    c = read_cluster(write(tmp_path, POOLS + LINK), KNOWN)
    assert [p.name for p in c.pools] == ["h100", "a100"] and c.devices == 32
    assert c.links[0].GBps == 100.0 and c.links[0].latency_s == pytest.approx(20e-6)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (POOLS.replace("a100-80gb", "a100-120gb") + LINK, "pool 'a100': unknown device 'a100-120gb' (known:"),
        (POOLS, "no link between pools 'h100' and 'a100'"),
        (POOLS + LINK.replace('"a100"]', '"b200"]'), "link 1 names pool 'b200', which no [[pools]] defines"),
        (POOLS.replace("devices = 16\n\n", "devices = 0\n\n", 1) + LINK, "pool 'h100': devices must be a whole"),
        (POOLS + LINK.replace("100.0", "-1.0"), "GBps must be a positive number"),
        (POOLS.replace('"a100"', '"h100"') + LINK, "two pools named 'h100'"),
        ("[[pools]]\nname = 'x'\n", "pool 1 has no 'device'"),
        ("pools = [", "not valid TOML"),
        ("", "no [[pools]]"),
    ],
)
def test_bad_cluster_files_are_one_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ClusterFileError, match=None) as err:
        read_cluster(write(tmp_path, text), KNOWN)
    assert message in str(err.value) and "\n" not in str(err.value)


@settings(max_examples=60, deadline=None)
@given(
    r1=st.integers(1, 4),
    r2=st.integers(1, 4),
    t1=st.floats(0.1, 10),
    t2=st.floats(0.1, 10),
    extra=st.integers(0, 30),
)
def test_water_fill_is_the_best_split_of_two_pools(r1: int, r2: int, t1: float, t2: float, extra: int) -> None:
    """Against brute force over every split of whole micro-batches (linear times per micro-batch)."""
    total = r1 + r2 + extra
    times = [t1, t2]

    def time_of(i: int, m: int) -> float:
        return times[i] * m

    got = water_fill(total, [r1, r2], time_of)
    splits = [(a, b) for a, b in itertools.product(range(1, total + 1), repeat=2) if r1 * a + r2 * b == total]
    if not splits:
        assert got is None
        return
    assert got is not None and r1 * got[0] + r2 * got[1] == total
    best = min(max(t1 * a, t2 * b) for a, b in splits)
    assert max(t1 * got[0], t2 * got[1]) == pytest.approx(best)


def test_cross_pool_sync_is_a_ring_over_the_slowest_link() -> None:
    from echosim.dynamics.cluster import Link

    c = MixedCluster((Pool("a", "h100-sxm", 8), Pool("b", "a100-80gb", 8)), (Link("a", "b", 10.0, 1e-3),))
    assert cross_pool_sync_s(c, 1e9) == pytest.approx(2 * 1 / 2 * 1e9 / 10e9 + 2 * 1e-3)


def test_balanced_split_beats_the_naive_one() -> None:
    """512 H100 + 512 A100: the H100 pool takes more micro-batches and the step shortens."""
    args = ["cluster", str(EXAMPLE), "llama3-8b", "--tp", "8", "--global-batch", "1024", "--json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    r = json.loads(result.output)
    naive, balanced = r["naive"], r["balanced"]
    assert [p["microbatches_per_replica"] for p in naive["pools"]] == [8, 8]
    h100, a100 = balanced["pools"]
    assert h100["microbatches_per_replica"] > 8 > a100["microbatches_per_replica"]
    assert h100["microbatches_per_replica"] * 64 + a100["microbatches_per_replica"] * 64 == 1024
    assert balanced["step_s"] < naive["step_s"] and r["speedup"] > 1.3
    # the JSON rounds each figure to 6 significant digits: the sum of two rounded ones may differ by a few 1e-6
    slowest = max(p["step_s"] for p in naive["pools"])
    assert naive["step_s"] == pytest.approx(slowest + r["cross_pool_sync_s"], rel=1e-5)
    assert CliRunner().invoke(cli, args).output == result.output  # byte-identical


def test_a_whole_batch_a_replica_is_balanced_by_its_samples(tmp_path: Path) -> None:
    """ResNet-50 at 256 images a replica runs one micro-batch: none can move between pools, and the balanced split
    was the naive one (H100 idle 47% of the A100 pool's step). Its samples move instead, each pool compiled at its
    share."""
    args = ["cluster", write(tmp_path, POOLS + LINK), "resnet50", "--global-batch", "8192", "--micro-batch", "256"]
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    r = json.loads(result.output)
    naive, balanced = r["naive"]["pools"], r["balanced"]["pools"]
    assert [(p["micro_batch"], p["microbatches_per_replica"]) for p in naive] == [(256, 1), (256, 1)]
    h100, a100 = balanced
    assert h100["micro_batch"] > 256 > a100["micro_batch"] and h100["microbatches_per_replica"] == 1
    assert (h100["micro_batch"] + a100["micro_batch"]) * 16 == 8192
    assert r["balanced"]["step_s"] < r["naive"]["step_s"] and r["speedup"] > 1.2
    # compiled at its share, not extrapolated: the pool's own compile gives its figure
    again = CliRunner().invoke(cli, ["compile", "resnet50", "--backend", "h100-sxm", "--dp", "16", "--micro-batch",
                                     str(h100["micro_batch"]), "--json"])  # fmt: skip
    assert json.loads(again.output)["step_time_s"] == h100["step_s"]
    text = CliRunner().invoke(cli, args).output
    assert f"{h100['micro_batch']} samples x 16 replicas" in text and "256 samples x 16 replicas" in text


def test_a_sample_split_the_layout_cannot_compile_keeps_the_naive_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A size the layout refuses (any but the naive one here) leaves the naive split standing, the command whole."""
    from echosim.dynamics import cluster as mixed
    from echosim.errors import EchosimError
    from echosim.plan import Plan

    compile_pool = mixed._compile_pool

    def refusing(model, plan, pool, replicas, microbatches, micro_batch=0):  # type: ignore[no-untyped-def]
        if micro_batch not in (0, plan.micro_batch):
            raise EchosimError("refused")
        return compile_pool(model, plan, pool, replicas, microbatches, micro_batch)

    monkeypatch.setattr(mixed, "_compile_pool", refusing)
    c = MixedCluster((Pool("h100", "h100-sxm", 8), Pool("a100", "a100-80gb", 8)), (Link("h100", "a100", 50.0, 2e-5),))
    r = mixed.mixed_step("resnet50", Plan(micro_batch=64, global_batch=1024), c)
    assert r["balanced"] == r["naive"] and r["speedup"] == 1.0


def test_a_sample_split_stays_within_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """ResNet-50 at 1,280 images a replica fits both pools (72 GiB). The H100 pool's share by speed alone would not
    (1,680 images, 94 GiB): the split takes the largest share whose peak, affine in the micro-batch as its step is,
    fits, and every pool's compile at its share fits. A proposal that runs a pool out of memory all the same is no
    split: the naive one stands."""
    from echosim.dynamics import cluster as mixed
    from echosim.plan import Plan

    c = MixedCluster((Pool("h100", "h100-sxm", 8), Pool("a100", "a100-80gb", 8)), (Link("h100", "a100", 50.0, 2e-5),))
    plan = Plan(micro_batch=1280, global_batch=16 * 1280)
    r = mixed.mixed_step("resnet50", plan, c)
    assert all(p["fits"] for p in r["naive"]["pools"]) and r["fits"]
    h100, a100 = r["balanced"]["pools"]
    assert 1280 < h100["micro_batch"] < 1600 and h100["micro_batch"] + a100["micro_batch"] == 2 * 1280
    assert r["speedup"] > 1.05
    too_big = [replace(run, fits=False) for run in mixed._balance_samples(
        "resnet50", plan, [mixed._compile_pool("resnet50", plan, pool, 8, 1) for pool in c.pools], [8, 8])]  # fmt: skip
    monkeypatch.setattr(mixed, "_balance_samples", lambda *args: too_big)
    r = mixed.mixed_step("resnet50", plan, c)
    assert r["balanced"] == r["naive"] and r["fits"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [(["--backend", "h100-sxm"], "--backend: the cluster file gives the devices"),
     (["--dp", "4"], "--dp: the cluster file gives the devices"),
     (["--embedding-sharding", "row"], "tables sharded over every rank of the job are not modelled here")],
)  # fmt: skip
def test_cluster_command_bad_flags(extra: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["cluster", str(EXAMPLE), "llama3-8b", "--tp", "8", *extra])
    assert result.exit_code == 1 and message in result.output and result.output.count("\n") == 1


@pytest.mark.parametrize("split", ["data", "pipeline"])
def test_cluster_carries_the_compiles_warnings(tmp_path: Path, split: str) -> None:
    """What compile warns of for the pools' layout is printed once (RWKV's receptance linears run whole at tp=2)."""
    path = write(tmp_path, SAME.replace("devices = 8", "devices = 4"))
    pp = ["--pp", "2"] if split == "pipeline" else []  # dp from the devices
    args = ("cluster", path, TINY_RWKV, "--tp", "2", *pp, "--global-batch", "4", "--seq-len", "16", "--split", split)

    def invoke(*a: str) -> tuple[int, str]:
        result = CliRunner().invoke(cli, list(a))
        return result.exit_code, result.output

    check_whole_warning_carried(invoke, args, "warning: ")
    assert invoke(*args)[1].count("run whole on all 2 tensor-parallel ranks") == 1


def test_cluster_command_bad_file_is_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, POOLS)
    result = CliRunner().invoke(cli, ["cluster", path, "llama3-8b", "--tp", "8"])
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert "no link between pools 'h100' and 'a100'" in result.output


SAME = """
[[pools]]
name = "a"
device = "h100-sxm"
devices = 8

[[pools]]
name = "b"
device = "h100-sxm"
devices = 8

[[links]]
pools = ["a", "b"]
GBps = 1.0e6
"""


def test_pipeline_split_of_one_device_kind_is_the_compilers_step(tmp_path: Path) -> None:
    """Two pools of the same device, a link as fast as the node's: the stitched pipeline is the compiled step."""
    from echosim import compile
    from echosim.plan import Cluster, Plan

    path = write(tmp_path, SAME)
    result = CliRunner().invoke(cli, ["cluster", path, "gpt3-1.3b", "--tp", "2", "--pp", "4", "--global-batch", "32",
                                      "--split", "pipeline", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    r = json.loads(result.output)
    report = compile("gpt3-1.3b", Plan(tp=2, pp=4, dp=2, global_batch=32), Cluster("h100-sxm", 16))
    assert r["naive"]["step_s"] == pytest.approx(report.step_time_s, rel=1e-5)
    assert [s["layers"] for s in r["naive"]["stages"]] == [row["layers"] for row in report.stages]
    assert [s["pool"] for s in r["naive"]["stages"]] == ["a", "a", "b", "b"]
    assert r["balanced"]["step_s"] <= r["naive"]["step_s"] * (1 + 1e-9)


@pytest.mark.parametrize("recompute", ["full:2", "full:every-3"])
def test_a_pipeline_split_recomputing_some_layers_is_the_compilers_step(tmp_path: Path, recompute: str) -> None:
    """Partial recompute's two backward units move with the split: a stage of n layers replays min(N, n) (full:N)
    or n // N (full:every-N); at the compiler's own split the stitched step is the compiled one."""
    from echosim import compile
    from echosim.compiler import lower
    from echosim.dynamics.cluster import _stage_time
    from echosim.plan import Cluster, Plan

    path = write(tmp_path, SAME)
    result = CliRunner().invoke(cli, ["cluster", path, "gpt3-1.3b", "--tp", "2", "--pp", "4", "--global-batch", "32",
                                      "--split", "pipeline", "--recompute", recompute, "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    r = json.loads(result.output)
    plan = Plan(tp=2, pp=4, dp=2, global_batch=32, recompute=recompute)
    report = compile("gpt3-1.3b", plan, Cluster("h100-sxm", 16))
    assert r["naive"]["step_s"] == pytest.approx(report.step_time_s, rel=1e-5)
    stage = lower("gpt3-1.3b", plan, Cluster("h100-sxm", 16)).costed.stages[1]  # 6 layers, 2 of them replayed
    assert stage.b_units == 4
    again = _stage_time(stage.bwd_units, stage.bwd, stage.layers, stage.layers, stage.graph, stage.b_units)
    assert again == pytest.approx(stage.bwd, rel=1e-12)
    # one layer fewer (full:2 replays 2 of 5, full:every-3 1 of 5): a shorter backward
    kept = _stage_time(stage.bwd_units, stage.bwd, stage.layers, 5, stage.graph, stage.b_units)
    assert kept < stage.bwd


def test_pipeline_split_balanced_to_device_speed() -> None:
    """Stage 0 on 512 H100, stage 1 on 512 A100: the H100 stage takes more layers and the step shortens."""
    args = ["cluster", str(EXAMPLE), "llama3-8b", "--tp", "8", "--pp", "2", "--global-batch", "1024", "--split",
            "pipeline", "--json"]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    r = json.loads(result.output)
    naive, balanced = r["naive"]["stages"], r["balanced"]["stages"]
    assert [s["layers"] for s in naive] == [16, 16]
    assert balanced[0]["layers"] > 16 > balanced[1]["layers"] and sum(s["layers"] for s in balanced) == 32
    assert r["balanced"]["step_s"] < r["naive"]["step_s"] and r["speedup"] > 1.3 and r["fits"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [(["--pp", "1"], "--split pipeline needs --pp 2 or more"),
     (["--pp", "2", "--schedule", "zb-h1"], "defers weight gradients"),
     (["--pp", "2", "--schedule", "dualpipe"], "every stage on two ranks"),
     (["--pp", "2", "--vpp", "2", "--schedule", "interleaved"], "interleaved stages")],
)  # fmt: skip
def test_pipeline_split_bad_layouts(tmp_path: Path, extra: list[str], message: str) -> None:
    path = write(tmp_path, SAME)
    result = CliRunner().invoke(cli, ["cluster", path, "gpt3-1.3b", "--tp", "2", "--global-batch", "32",
                                      "--split", "pipeline", *extra])  # fmt: skip
    assert result.exit_code == 1 and message in result.output and result.output.count("\n") == 1


def test_pipeline_split_reports_layers_of_interleaved_blocks(tmp_path: Path) -> None:
    """gpt-oss-120b folds its 36 layers as 18 (local, global) blocks: stages move whole blocks but report
    layers, as the compiled report does."""
    from echosim import compile
    from echosim.plan import Cluster, Plan

    path = write(tmp_path, SAME)
    result = CliRunner().invoke(cli, ["cluster", path, "gpt-oss-120b", "--tp", "2", "--pp", "2", "--global-batch",
                                      "32", "--split", "pipeline", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    naive = json.loads(result.output)["naive"]["stages"]
    report = compile("gpt-oss-120b", Plan(tp=2, pp=2, dp=4, global_batch=32), Cluster("h100-sxm", 16))
    assert [s["layers"] for s in naive] == [row["layers"] for row in report.stages] == [18, 18]
