"""Hierarchical context parallelism (Megatron-Core's a2a+p2p): IR closed forms, placement, defaults, refusals,
configs, search and explain."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner
from conftest import TINY_LLAMA, capture

from echosim.cli import cli
from echosim.compiler import compile
from echosim.configs import read_source
from echosim.errors import EchosimError
from echosim.explain.whatif import neighbours
from echosim.ir import Graph, verify
from echosim.ir.ops import AttentionAttrs, CollectiveAttrs, OpKind, Phase
from echosim.layout import default_cp_a2a
from echosim.passes.autodiff import Autodiff
from echosim.passes.base import LayoutError, run_passes
from echosim.passes.context_parallel import ContextParallel, ContextParallelBackward
from echosim.passes.flops import graph_flops
from echosim.plan import Cluster, Plan
from echosim.timeline.placement import Degrees, axis_placements

#: Llama 3 8B's shape at two layers and 32k tokens: 32 heads, 8 key/value heads, as the CLI tests compile it
SMALL = ["llama3-8b", "--backend", "h100-sxm", "--seq-len", "32768", "--recompute", "full"]


def _collectives(g: Graph, phase: Phase, axis: str) -> list:
    return [n for n in g if n.phase is phase and isinstance(n.attrs, CollectiveAttrs) and n.attrs.axis.value == axis]


def _run(*args: str) -> object:
    return CliRunner().invoke(cli, list(args))


@pytest.mark.parametrize(("cp", "a2a"), [(4, 2), (8, 2), (8, 4)])
def test_all_to_alls_inside_groups_and_a_ring_across_them(cp: int, a2a: int) -> None:
    """Each attention: Q, K, V and the output all-to-all'ed inside a group of ``a2a`` ranks (the rank's tokens of
    every head), then a ring of ``cp / a2a - 1`` K/V exchanges on ``1/a2a`` of the heads over ``a2a`` times the
    tokens; backward runs the four all-to-alls' conjugates and the ring twice (K/V fetched again, dK/dV back)."""
    cfg = TINY_LLAMA.with_(seq_len=128, heads=8, kv_heads=4)
    g = run_passes(capture(cfg), [ContextParallel(cp, "a2a+p2p", a2a=a2a), Autodiff(), ContextParallelBackward()])
    verify(g)
    ring, d = cp // a2a, cfg.dim_head
    tokens = 128 // cp
    q, kv = tokens * cfg.heads * d * 2, tokens * cfg.kv_heads * d * 2  # fp16 bytes of the rank's tokens
    packed = (128 // ring) * 2 * (cfg.kv_heads // a2a) * d * 2  # K and V of a ring chunk, on the group's heads
    for phase in (Phase.FORWARD, Phase.BACKWARD):
        assert not _collectives(g, phase, "cp")
        exchanged = _collectives(g, phase, "cp_a2a")
        assert {(n.op, n.attrs.size) for n in exchanged} == {(OpKind.ALL_TO_ALL, a2a)}
        assert sorted(n.attrs.bytes for n in exchanged) == sorted([q, kv, kv, q])  # one block, repeated
        assert all(n.attrs.blocking for n in exchanged)
        steps = _collectives(g, phase, "cp_p2p")
        assert {(n.op, n.attrs.size, n.attrs.bytes) for n in steps} == {(OpKind.RECV, ring, packed)}
        assert len(steps) == (ring - 1) * (1 if phase is Phase.FORWARD else 2)
    attention = {n.attrs for n in g if n.phase is Phase.FORWARD and isinstance(n.attrs, AttentionAttrs)}
    assert {(a.heads, a.kv_heads, a.q_len, a.kv_len) for a in attention} == {
        (8 // a2a, 4 // a2a, 128 // ring, 128 // ring)
    }
    # the model's work is split, not changed: cp ranks together do the whole model's FLOPs
    whole = graph_flops(run_passes(capture(cfg), [Autodiff()]))
    assert graph_flops(g).model * cp == pytest.approx(whole.model, rel=1e-12)


def test_the_pass_names_what_it_cannot_split() -> None:
    with pytest.raises(LayoutError, match=r"all-to-all groups \(4 ranks\) must divide cp=4 into two tiers"):
        ContextParallel(4, "a2a+p2p", a2a=4)
    with pytest.raises(LayoutError, match=r"groups \(none ranks\)"):
        ContextParallel(8, "a2a+p2p")
    with pytest.raises(LayoutError, match="no head-parallel"):
        ContextParallel(4, "a2a+p2p", torch=True, a2a=2)
    with pytest.raises(LayoutError, match="groups of 4 ranks do not divide the heads 4 / key/value heads 2"):
        run_passes(capture(TINY_LLAMA.with_(seq_len=64)), [ContextParallel(8, "a2a+p2p", a2a=4)])


def test_groups_are_neighbours_and_the_ring_crosses_nodes() -> None:
    """Megatron-Core's create_hierarchical_groups: the all-to-all groups are neighbouring CP ranks (tp apart), the
    ring's members tp x a2a apart; on 8-GPU nodes with tp 2, groups of 4 fill a node and the ring spans 4 nodes."""
    where = axis_placements(Degrees(tp=2, cp=16, cp_a2a=4), 8)
    a2a, ring = (
        where[next(a for a in where if a.value == "cp_a2a")],
        where[next(a for a in where if a.value == "cp_p2p")],
    )
    assert (a2a.size, a2a.nodes, a2a.per_node) == (4, 1, 4)
    assert (ring.size, ring.nodes, ring.per_node) == (4, 4, 1)
    assert not any(a.value.startswith("cp_") for a in axis_placements(Degrees(tp=2, cp=16), 8))


@pytest.mark.parametrize(
    ("cp", "tp", "node", "want"),
    [(16, 2, 8, 4), (8, 1, 8, 4), (4, 8, 8, 2), (16, 1, 4, 4), (9, 1, 8, 3), (2, 1, 8, 0), (7, 1, 8, 0)],
)
def test_default_groups_are_the_largest_proper_divisor_inside_a_node(cp: int, tp: int, node: int, want: int) -> None:
    """tp 8 on 8-GPU nodes: no group of 2 fits in a node, so the smallest (2); cp 2 or a prime cp: no hierarchy."""
    assert default_cp_a2a(cp, tp, node) == want


def test_compile_defaults_the_groups_and_reports_them() -> None:
    result = _run("compile", *SMALL, "--tp", "2", "--cp", "16", "--devices", "32", "--cp-comm", "a2a+p2p", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert (report["plan"]["cp_comm"], report["plan"]["cp_a2a"]) == ("a2a+p2p", 4)
    assert report["breakdown"]["comm.cp_a2a"] > 0 and report["breakdown"]["comm.cp_p2p"] > 0
    assert "comm.cp" not in report["breakdown"]
    explicit = _run("compile", *SMALL, "--tp", "2", "--cp", "16", "--devices", "32", "--cp-comm", "a2a+p2p",
                    "--cp-a2a", "4", "--json")  # fmt: skip
    assert json.loads(explicit.output)["step_time_s"] == report["step_time_s"]
    # the same model FLOPs as the ring: the scheme moves the work, never changes it
    ring = json.loads(_run("compile", *SMALL, "--tp", "2", "--cp", "16", "--devices", "32", "--json").output)
    assert report["model_flops_per_step"] == pytest.approx(ring["model_flops_per_step"], rel=1e-12)
    assert "cp_a2a" not in ring["plan"]
    text = _run("compile", *SMALL, "--tp", "2", "--cp", "16", "--devices", "32", "--cp-comm", "a2a+p2p").output
    assert "CP 16 (a2a 4 x ring 4)" in text


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--cp", "2", "--devices", "2", "--cp-comm", "a2a+p2p"], "all-to-all groups (none ranks) must divide cp=2"),
        (["--cp", "8", "--devices", "8", "--cp-comm", "a2a+p2p", "--cp-a2a", "3"], "groups (3 ranks) must divide"),
        (["--cp", "8", "--devices", "8", "--cp-a2a", "2"], "--cp-a2a 2 sizes hierarchical context parallelism"),
        (["--cp", "8", "--devices", "8", "--cp-comm", "a2a+p2p", "--cp-a2a", "0"], "--cp-a2a must be at least 1"),
        (["--tp", "8", "--cp", "4", "--devices", "32", "--cp-comm", "a2a+p2p"], "tp*cp_a2a=16 does not divide"),
        (["--cp", "4", "--devices", "4", "--cp-comm", "a2a+p2p", "--framework", "torchtitan-2025"], "no head-parallel"),
    ],
)
def test_bad_hierarchies_are_one_line(flags: list[str], message: str) -> None:
    result = _run("compile", *SMALL, *flags)
    assert result.exit_code != 0
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_sliding_window_is_refused_as_under_the_ring() -> None:
    with pytest.raises(EchosimError, match=r"ring \(--cp-comm a2a\+p2p\) does not run sliding-window"):
        compile("mistral-7b", Plan(cp=4, cp_comm="a2a+p2p", seq_len=16384), Cluster("h100-sxm", 4, 8))


def test_megatron_and_bridge_configs(tmp_path: object) -> None:
    from pathlib import Path

    base = Path(str(tmp_path))
    args = ("--tensor-model-parallel-size 2 --context-parallel-size 8 --cp-comm-type a2a+p2p "
            "--hierarchical-context-parallel-sizes 4 2 --seq-length 65536 --bf16")  # fmt: skip
    (base / "run.sh").write_text(f"torchrun pretrain_gpt.py {args}\n")
    got = read_source(f"megatron:{base / 'run.sh'}")
    assert (got.options["cp_comm"], got.options["cp_a2a"]) == ("a2a+p2p", 4)
    for sizes, message in (("4 4", "multiply to 16, not the CP degree 8"), ("2 2 2", r"takes two sizes \(A P\)")):
        (base / "bad.sh").write_text(f"torchrun pretrain_gpt.py {args.replace('4 2', sizes)}\n")
        with pytest.raises(EchosimError, match=message):
            read_source(f"megatron:{base / 'bad.sh'}")
    (base / "none.sh").write_text(
        f"torchrun pretrain_gpt.py {args.replace('--hierarchical-context-parallel-sizes 4 2', '')}\n"
    )
    with pytest.raises(EchosimError, match="a2a\\+p2p needs --hierarchical-context-parallel-sizes"):
        read_source(f"megatron:{base / 'none.sh'}")
    (base / "ring.sh").write_text(f"torchrun pretrain_gpt.py {args.replace('a2a+p2p', 'p2p')}\n")
    ring = read_source(f"megatron:{base / 'ring.sh'}")
    assert "cp_a2a" not in ring.options and any("read only with --cp-comm-type a2a+p2p" in n for n in ring.notes)
    (base / "run_config.yaml").write_text(
        "model:\n  tensor_model_parallel_size: 2\n  context_parallel_size: 8\n  cp_comm_type: a2a+p2p\n"
        "  hierarchical_context_parallel_sizes: [2, 4]\n  seq_length: 65536\n"
    )
    bridge = read_source(f"mbridge:{base / 'run_config.yaml'}")
    assert (bridge.options["cp_comm"], bridge.options["cp_a2a"]) == ("a2a+p2p", 2)


def test_search_weighs_the_hierarchy_and_costs_it_as_compile_does() -> None:
    flags = ["llama3-8b", "--backend", "h100-sxm", "--devices", "32", "--seq-len", "32768", "--global-batch", "4",
             "--space", "tp=2", "--space", "pp=1", "--space", "cp=8,16", "--micro-batches", "1", "--recompute", "full",
             "--zero", "1", "--schedules", "1f1b", "--space", "sp=true", "--space", "tp_overlap=false"]  # fmt: skip
    result = _run("search", *flags, "--space", "cp_comm=p2p,a2a+p2p", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["layouts"]
    got = sorted((r["cp"], r["cp_comm"], r.get("cp_a2a", 0)) for r in rows if r["simulated"])
    assert got == [(8, "a2a+p2p", 4), (8, "p2p", 0), (16, "a2a+p2p", 4), (16, "p2p", 0)]
    for r in rows:
        compiled = _run("compile", "llama3-8b", "--backend", "h100-sxm", "--devices", "32", "--seq-len", "32768",
                        "--global-batch", "4", "--tp", "2", "--cp", str(r["cp"]), "--cp-comm", r["cp_comm"],
                        "--micro-batch", "1", "--recompute", "full", "--zero", "1", "--sp", "--json")  # fmt: skip
        assert compiled.exit_code == 0, compiled.output
        assert json.loads(compiled.output)["step_time_s"] == pytest.approx(r["step_time_s"], rel=1e-5)
    text = _run("search", *flags, "--space", "cp_comm=a2a+p2p").output
    assert "16 a2a4+p2p4" in text
    # --cp-a2a fixes the groups of every layout; one that cannot make two tiers is refused in one line
    fixed = json.loads(_run("search", *flags, "--space", "cp_comm=a2a+p2p", "--cp-a2a", "2", "--json").output)
    assert {(r["cp"], r["cp_a2a"]) for r in fixed["layouts"] if r["simulated"]} == {(8, 2), (16, 2)}
    refused = _run("search", *flags, "--cp-a2a", "1")
    assert refused.exit_code != 0 and "--cp-a2a must be at least 2" in refused.output


def test_explain_tries_the_other_schemes() -> None:
    plan = Plan(tp=2, cp=8, dp=2, seq_len=32768, global_batch=4)
    comms = {(p.cp_comm, p.cp_a2a) for p in neighbours(plan, Cluster("h100-sxm", 32, 8)) if p.cp_comm != "p2p"}
    assert comms == {("all_gather", 0), ("a2a", 0), ("a2a+p2p", 0)}
    torch = neighbours(Plan(cp=8, seq_len=32768, framework="torchtitan-2025"), Cluster("h100-sxm", 8, 8))
    assert {p.cp_comm for p in torch} == {"p2p", "all_gather"}
    # a hierarchy: its groups halved and doubled, as well as the other schemes
    hierarchical = replace(plan, cp=16, dp=1, cp_comm="a2a+p2p", cp_a2a=4)
    groups = {p.cp_a2a for p in neighbours(hierarchical, Cluster("h100-sxm", 32, 8)) if p.cp_comm == "a2a+p2p"}
    assert groups == {2, 4, 8}


def test_a_scheme_per_layer_is_read_when_every_layer_names_the_same() -> None:
    """Megatron-Core's cp_comm_type may list a scheme per layer: the same for all is that scheme, a mix is refused."""
    from echosim.configs import ConfigError, read_args

    base = "--num-layers 2 --hidden-size 256 --num-attention-heads 4 --micro-batch-size 1 --context-parallel-size 2"
    assert read_args(f"{base} --cp-comm-type a2a a2a").options["cp_comm"] == "a2a"
    with pytest.raises(ConfigError, match="--cp-comm-type p2p a2a: a scheme per layer is not modelled"):
        read_args(f"{base} --cp-comm-type p2p a2a")


def test_default_groups_match_every_divisor_and_an_absurd_cp_is_quick() -> None:
    """Divisors are found in sqrt(cp) steps: a fuzzed cp of 2^40 + 1 looped for minutes before its error."""
    for cp in range(1, 200):
        for tp, node in ((1, 8), (2, 8), (8, 8), (1, 4)):
            proper = [a for a in range(2, cp) if cp % a == 0]
            inside = [a for a in proper if node % (tp * a) == 0]
            assert default_cp_a2a(cp, tp, node) == (max(inside) if inside else min(proper, default=0))
    assert default_cp_a2a(2**40 + 1, 1, 8) == 257  # 257 x 4,278,255,361: no group fits a node, so the smaller
