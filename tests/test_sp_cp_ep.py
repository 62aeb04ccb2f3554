"""Sequence and context parallelism: golden IR, closed forms, memory, overlap and layout errors."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner
from conftest import TINY_LLAMA, capture, check_golden

from echosim.backends.compute import attention_flops
from echosim.backends.devices import DEVICES
from echosim.backends.gpu import GPUBackend
from echosim.cli import cli
from echosim.frontend.zoo import ArchConfig
from echosim.ir import Graph, print_graph, verify
from echosim.ir.ops import AttentionAttrs, Axis, CollectiveAttrs, OpKind, Phase
from echosim.ir.types import DType
from echosim.passes.attention import AttentionKernel
from echosim.passes.autodiff import Autodiff
from echosim.passes.base import LayoutError, run_passes
from echosim.passes.context_parallel import ContextParallel, ContextParallelBackward
from echosim.passes.flops import graph_flops
from echosim.passes.memory import activation_bytes
from echosim.passes.pipeline import Stage
from echosim.passes.tensor_parallel import TensorParallel, _permuted
from echosim.plan import Cluster, Plan
from echosim.timeline.lower import StepOptions, lower_stage
from echosim.timeline.placement import Degrees, axis_placements
from echosim.timeline.schedule import BUILTIN_SCHEDULES


def per_layer_activations(graph: Graph) -> int:
    """Bytes one more repetition of the block adds to the saved activations."""
    (block,) = graph.repeats
    count = graph.repeats[block]
    graph.repeats[block] = count + 1
    more = activation_bytes(graph)
    graph.repeats[block] = count
    return more - activation_bytes(graph)


def collectives(g: Graph, phase: Phase, axis: str, block: bool = True) -> list:
    return [
        n
        for n in g
        if n.phase is phase
        and isinstance(n.attrs, CollectiveAttrs)
        and n.attrs.axis.value == axis
        and (g.block_of(n) is not None) == block
    ]


# ---- sequence parallelism -------------------------------------------------------------------


def test_sequence_parallel_golden(tiny_gpt: Graph) -> None:
    g = run_passes(tiny_gpt, [TensorParallel(2, sequence_parallel=True), Autodiff()])
    check_golden("sp_tp2_autodiff_gpt.txt", print_graph(g))


def test_sequence_parallel_swaps_each_all_reduce_for_reduce_scatter_plus_all_gather(tiny_llama: Graph) -> None:
    """Same volume as TP (an all_reduce is a reduce_scatter plus an all_gather), now visible as two ops."""
    tp = run_passes(tiny_llama, [TensorParallel(2)])
    sp = run_passes(tiny_llama, [TensorParallel(2, sequence_parallel=True)])
    ar = [n for n in collectives(tp, Phase.FORWARD, "tp") if n.op is OpKind.ALL_REDUCE]
    rs = [n for n in collectives(sp, Phase.FORWARD, "tp") if n.op is OpKind.REDUCE_SCATTER]
    ag = [n for n in collectives(sp, Phase.FORWARD, "tp") if n.op is OpKind.ALL_GATHER]
    assert not [n for n in collectives(sp, Phase.FORWARD, "tp") if n.op is OpKind.ALL_REDUCE]
    assert len(ar) == len(rs) == len(ag) == 2  # attention and MLP of the layer
    assert sorted(n.attrs.bytes for n in ar) == sorted(n.attrs.bytes for n in rs) == sorted(n.attrs.bytes for n in ag)


def test_sequence_parallel_backward_reduce_scatters_and_regathers_for_weight_gradients(tiny_llama: Graph) -> None:
    g = run_passes(tiny_llama, [TensorParallel(2, sequence_parallel=True), Autodiff()])
    bwd = collectives(g, Phase.BACKWARD, "tp")
    kinds = sorted(n.op.value for n in bwd)
    # per layer: conjugates of 2 RS (2 AG) and 2 AG (2 RS), plus one re-gather per gathered input
    assert kinds == ["all_gather"] * 4 + ["reduce_scatter"] * 2
    regathers = [n for n in bwd if n.name.endswith("regather")]
    assert len(regathers) == 2
    assert not any(n.op is OpKind.ALL_REDUCE for n in bwd)


def test_sequence_parallel_keeps_flops(tiny_gpt: Graph) -> None:
    tp = graph_flops(run_passes(tiny_gpt, [TensorParallel(2), Autodiff()]))
    sp = graph_flops(run_passes(tiny_gpt, [TensorParallel(2, sequence_parallel=True), Autodiff()]))
    assert sp == tp


@pytest.mark.parametrize(("sp", "closed_form"), [(False, "tp"), (True, "tp+sp")])
def test_activation_memory_matches_korthikanti(sp: bool, closed_form: str) -> None:
    """Per-layer activations of a GPT layer, Korthikanti et al. 2022 Table 2 (16-bit, math attention):
    TP: sbh(10 + 24/t + 5as/ht); TP+SP: sbh(34/t + 5as/ht)."""
    s, h, a, t = 2048, 1024, 16, 4
    cfg = ArchConfig("gpt", layers=2, hidden=h, heads=a, vocab=1024, seq_len=s, dropout=0.1, tied_embeddings=True)
    g = run_passes(
        capture(cfg, dtype=DType.FP16),
        [AttentionKernel(flash=False), TensorParallel(t, sequence_parallel=sp), Autodiff()],
    )
    expected = {"tp": 10 + 24 / t + 5 * a * s / (h * t), "tp+sp": 34 / t + 5 * a * s / (h * t)}[closed_form]
    assert per_layer_activations(g) / (s * h) == pytest.approx(expected, rel=0.04)


def test_sequence_parallel_needs_divisible_tokens() -> None:
    cfg = TINY_LLAMA.with_(seq_len=18)
    with pytest.raises(LayoutError, match=r"tp=4 does not divide the sequence"):
        run_passes(capture(cfg), [TensorParallel(4, sequence_parallel=True)])


# ---- context parallelism --------------------------------------------------------------------


def test_ring_attention_golden(tiny_llama: Graph) -> None:
    g = run_passes(tiny_llama, [ContextParallel(2), Autodiff(), ContextParallelBackward()])
    check_golden("cp2_ring_autodiff_llama.txt", print_graph(g))


def test_all_gather_context_parallel_golden(tiny_gpt: Graph) -> None:
    g = run_passes(tiny_gpt, [ContextParallel(2, "all_gather"), TensorParallel(2, sequence_parallel=True)])
    check_golden("cp2_allgather_tp2_sp_gpt.txt", print_graph(g))


def _fwd_attention(g: Graph) -> list[AttentionAttrs]:
    return [n.attrs for n in g if n.phase is Phase.FORWARD and isinstance(n.attrs, AttentionAttrs)]


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_ring_exchanges_cp_minus_one_kv_chunks(cp: int) -> None:
    cfg = TINY_LLAMA.with_(seq_len=64)
    g = run_passes(capture(cfg), [ContextParallel(cp), Autodiff(), ContextParallelBackward()])
    fwd = collectives(g, Phase.FORWARD, "cp")
    bwd = collectives(g, Phase.BACKWARD, "cp")
    kv = TINY_LLAMA.n_kv_heads * TINY_LLAMA.dim_head * 2 * (64 // cp) * 2  # K and V, fp16, local tokens
    assert [n.op for n in fwd] == [OpKind.RECV] * (cp - 1)
    assert all(n.attrs.bytes == kv for n in fwd)
    # backward: the K/V chunks again (other direction) and their gradients
    assert len(bwd) == 2 * (cp - 1) and all(n.attrs.bytes == kv for n in bwd)
    assert len(_fwd_attention(g)) == cp


@pytest.mark.parametrize("cp", [2, 4, 8])
@pytest.mark.parametrize("balance", [True, False])
def test_ring_keeps_model_flops(cp: int, balance: bool) -> None:
    cfg = TINY_LLAMA.with_(seq_len=64)
    base = graph_flops(run_passes(capture(cfg), [Autodiff()]))
    split = graph_flops(run_passes(capture(cfg), [ContextParallel(cp, balance=balance), Autodiff()]))
    assert split.model * cp == base.model


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_load_balancing_splits_causal_work_evenly(cp: int) -> None:
    """Balanced: every rank does 1/cp of the causal work; unbalanced, the last rank does (2cp-1)/cp of a share."""
    s = 4096
    cfg = TINY_LLAMA.with_(seq_len=s)
    full = sum(attention_flops(a) for a in _fwd_attention(capture(cfg)))
    for comm in ("p2p", "all_gather"):
        balanced = sum(
            attention_flops(a) for a in _fwd_attention(run_passes(capture(cfg), [ContextParallel(cp, comm)]))
        )
        assert balanced * cp == pytest.approx(full, rel=0.01)
        worst = sum(
            attention_flops(a)
            for a in _fwd_attention(run_passes(capture(cfg), [ContextParallel(cp, comm, balance=False)]))
        )
        assert worst / balanced == pytest.approx((2 * cp - 1) / cp, rel=0.01)


@pytest.mark.parametrize("cp", [2, 4])
def test_context_parallel_divides_activations(cp: int) -> None:
    """Each rank keeps 1/cp of the activations: only its own K/V, re-fetched in backward."""
    cfg = TINY_LLAMA.with_(seq_len=256, hidden=128, heads=8, kv_heads=2, ffn=256)
    one = per_layer_activations(run_passes(capture(cfg), [Autodiff()]))
    ring = run_passes(capture(cfg), [ContextParallel(cp), Autodiff(), ContextParallelBackward()])
    assert per_layer_activations(ring) * cp == pytest.approx(one, rel=0.01)
    saved = run_passes(capture(cfg), [ContextParallel(cp), Autodiff()])  # without the re-fetch
    assert per_layer_activations(saved) > per_layer_activations(ring)


def test_context_parallel_verifies_with_tp_sp_and_recompute() -> None:
    from echosim.passes.recompute import Recompute

    g = run_passes(
        capture(TINY_LLAMA.with_(seq_len=32)),
        [
            ContextParallel(2),
            TensorParallel(2, sequence_parallel=True),
            Autodiff(),
            ContextParallelBackward(),
            Recompute("full"),
        ],
    )
    verify(g)
    heads = [a.heads for a in _fwd_attention(g)]
    assert heads == [TINY_LLAMA.heads // 2] * 2


def test_cp_layout_errors_name_the_constraint() -> None:
    cfg = TINY_LLAMA.with_(seq_len=18)
    with pytest.raises(LayoutError, match=r"cp=4 does not divide seq_len 18"):
        run_passes(capture(cfg), [ContextParallel(4)])
    odd = TINY_LLAMA.with_(seq_len=21)
    with pytest.raises(LayoutError, match=r"2\*cp=6"):
        run_passes(capture(odd), [ContextParallel(3)])
    run_passes(capture(odd), [ContextParallel(3, balance=False)])  # 21 tokens in 3 contiguous chunks


def test_ring_hides_its_transfers_behind_attention() -> None:
    """Long sequences: the K/V exchange of each ring step runs while the previous step computes."""
    cfg = ArchConfig("llama", layers=2, hidden=4096, heads=32, kv_heads=8, vocab=32000, ffn=14336, seq_len=16384)
    backend = GPUBackend(DEVICES["h100-sxm"])
    exposed = {}
    for comm in ("p2p", "all_gather"):
        g = run_passes(
            capture(cfg, dtype=DType.BF16), [ContextParallel(4, comm), Autodiff(), ContextParallelBackward()]
        )
        where = axis_placements(Degrees(cp=4), 8)
        t = lower_stage(Stage(0, g, 2), backend, where, StepOptions(BUILTIN_SCHEDULES[0]), (0,))
        unit = t.fwd_units[1][0]
        assert unit.busy["comm.cp"] > 0
        exposed[comm] = unit.duration - unit.compute_busy
    assert exposed["p2p"] < 0.01 * unit.duration
    assert exposed["all_gather"] > exposed["p2p"]


def test_placements_follow_megatron_rank_order() -> None:
    where = axis_placements(Degrees(tp=4, cp=2, dp=8, ep=8, pp=2), 8)
    cp, dp, ep, edp = (where[a] for a in (Axis.CP, Axis.DP, Axis.EP, Axis.EDP))
    assert (cp.size, cp.nodes, cp.per_node) == (2, 1, 2)  # ranks 4 apart, one node
    assert dp.size == 16 and where[Axis.FSDP] == dp  # gradients over dp x cp
    assert (ep.size, ep.nodes, ep.per_node) == (8, 4, 2)  # 4 apart: two per node
    assert edp.size == 2 and edp.per_node == 1
    assert Axis.CP not in axis_placements(Degrees(tp=8, dp=4), 8)


def _grad_syncs(dp: int, cp: int, zero: int, tp: int = 1) -> tuple[Graph, list, dict]:
    """The stage graph of a small Llama under (tp, dp, cp, zero), its data-parallel collectives, its placements."""
    from echosim.compiler import prepare

    cfg = ArchConfig("llama", layers=2, hidden=256, heads=8, kv_heads=8, vocab=512, ffn=512, seq_len=64)
    step = prepare(cfg, Plan(tp=tp, dp=dp, cp=cp, zero=zero, seq_len=64), Cluster("h100-sxm", tp * dp * cp, 8))
    (stage,) = step.stages
    g = stage.graph
    syncs = [n for n in g if isinstance(n.attrs, CollectiveAttrs) and n.attrs.axis in (Axis.DP, Axis.FSDP)]
    return g, syncs, step.where


@pytest.mark.parametrize(("dp", "cp"), [(1, 2), (2, 2), (1, 4), (2, 1)])
def test_gradients_reduce_over_dp_times_cp_ranks(dp: int, cp: int) -> None:
    """Every CP rank holds the same weights and computes partial gradients from its part of the sequence, so
    gradients are reduced over dp x cp ranks (Megatron-Core's dp_cp_group), with dp = 1 too: all the fp32
    gradients of the stage once, over dp * cp ranks."""
    g, syncs, _ = _grad_syncs(dp, cp, zero=0)
    grads_fp32 = sum(p.out.numel * g.multiplicity(p) for p in g.params()) * 4
    assert syncs and {n.op for n in syncs} == {OpKind.ALL_REDUCE}
    assert {n.attrs.size for n in syncs} == {dp * cp}
    assert sum(n.attrs.bytes * g.multiplicity(n) for n in syncs) == pytest.approx(grads_fp32, rel=1e-6)


@pytest.mark.parametrize(("dp", "cp"), [(1, 2), (2, 2)])
def test_distributed_optimizer_shards_over_dp_times_cp_ranks(dp: int, cp: int) -> None:
    """ZeRO-1 (Megatron's distributed optimizer on intra_dp_cp_group): gradients reduce-scattered over dp x cp
    ranks, each updates 1/(dp*cp) of the parameters and all-gathers the 16-bit weights back over the same ranks."""
    g, syncs, _ = _grad_syncs(dp, cp, zero=1)
    params = sum(p.out.numel * g.multiplicity(p) for p in g.params())
    scatter = [n for n in syncs if n.op is OpKind.REDUCE_SCATTER]
    (gather,) = [n for n in syncs if n.op is OpKind.ALL_GATHER]
    assert {n.attrs.size for n in syncs} == {dp * cp}
    assert sum(n.attrs.bytes * g.multiplicity(n) for n in scatter) == pytest.approx(params * 4, rel=1e-6)
    assert gather.attrs.bytes == params * 2  # fp16 weights
    (step,) = [n for n in g if n.op is OpKind.OPTIMIZER_UPDATE]
    assert step.attrs.params == math.ceil(params / (dp * cp))


def test_fsdp_shards_over_cp_ranks_with_one_data_parallel_rank() -> None:
    """ZeRO-3 / FSDP with dp = 1, cp = 2 (torchtitan's fsdp mesh is dp_shard x cp, on whenever cp > 1):
    each layer's weights gathered before forward and backward and its gradients reduce-scattered over 2 ranks."""
    _, syncs, _ = _grad_syncs(1, 2, zero=3)
    assert syncs and {n.attrs.size for n in syncs} == {2} and {n.attrs.axis for n in syncs} == {Axis.FSDP}
    assert {n.op for n in syncs} == {OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER}


def test_cp_gradient_group_spans_nodes_in_megatron_rank_order() -> None:
    """tp 8, dp 1, cp 2 on 8-GPU nodes: the two CP ranks are 8 apart (order tp-cp-ep-dp-pp), so the gradient
    reduction crosses two nodes, one member on each."""
    _, syncs, where = _grad_syncs(1, 2, zero=0, tp=8)
    assert syncs and {n.attrs.size for n in syncs} == {2}
    dp = where[Axis.DP]
    assert (dp.size, dp.nodes, dp.per_node) == (2, 2, 1)


# ---- plan and CLI --------------------------------------------------------------------------


def _run(*args: str) -> object:
    return CliRunner().invoke(cli, ["compile", *args])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["llama3-8b", "--cp", "3", "--devices", "3"], "cp=3 does not divide seq_len 8192"),
        (["mixtral-8x7b", "--ep", "16", "--dp", "16"], "ep=16 does not divide experts 8"),
        (["llama3-8b", "--ep", "2", "--dp", "2"], "ep=2 needs a mixture-of-experts model"),
        (["llama3-8b", "--sp", "--devices", "1"], "sequence parallelism needs tp > 1"),
        (["llama3-8b", "--tp", "8", "--sp", "--seq-len", "8196"], "tp=8 does not divide the 8196 tokens"),
        (["mixtral-8x7b", "--ep", "2", "--dp", "2", "--moe-imbalance", "3"], "must lie between 1 (balanced) and ep=2"),
        (["mixtral-8x7b", "--moe-capacity-factor", "-1"], "--moe-capacity-factor must be >= 0"),
        (["llama3-8b", "--cp", "2", "--dp", "1", "--devices", "4"], "does not equal devices=4"),
        (["mistral-7b", "--cp", "2", "--devices", "2"], "ring (--cp-comm p2p) does not run sliding-window attention"),
        (["llama3-8b", "--cp", "2", "--cp-comm", "a2a", "--tp", "8", "--devices", "16"], "tp*cp=16 does not divide"),
        (["llama3-8b", "--cp", "2", "--cp-comm", "a2a", "--framework", "torchtitan-2025"], "no head-parallel"),
    ],
)
def test_cli_layout_errors_are_one_line(args: list[str], message: str) -> None:
    result = _run(*args)
    assert result.exit_code == 1
    assert message in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_cli_compiles_cp_and_reports_it() -> None:
    cfg_args = ["llama3-8b", "--cp", "2", "--cp-comm", "all_gather", "--backend", "h100-sxm", "--seq-len", "4096"]
    result = _run(*cfg_args, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["devices"] == 2
    assert report["plan"]["cp"] == 2 and report["plan"]["cp_comm"] == "all_gather"
    # both ranks of the CP group together process whole sequences
    assert report["tokens_per_s"] == pytest.approx(4096 / report["step_time_s"], rel=1e-4)
    assert 0 < report["mfu"] < 1
    text = _run(*cfg_args).output
    assert "CP 2" in text


@pytest.mark.parametrize("cp", [2, 4])
def test_head_parallel_context_parallel_trades_tokens_for_heads_around_each_attention(cp: int) -> None:
    """--cp-comm a2a (DeepSpeed-Ulysses, Transformer Engine's QKVO all-to-all): inside each attention call one
    all_to_all for each of Q, K and V and one for the output, each of the rank's tokens of every head; the attention
    runs on 1/cp of the heads over the whole sequence, and backward exchanges the four gradients."""
    cfg = TINY_LLAMA.with_(seq_len=64, heads=8, kv_heads=4)
    g = run_passes(capture(cfg), [ContextParallel(cp, "a2a"), Autodiff(), ContextParallelBackward()])
    verify(g)
    fwd, bwd = collectives(g, Phase.FORWARD, "cp"), collectives(g, Phase.BACKWARD, "cp")
    tokens, d = 64 // cp, cfg.dim_head
    q, kv = tokens * cfg.heads * d * 2, tokens * cfg.kv_heads * d * 2  # fp16 bytes of the rank's tokens
    assert [(n.op, n.attrs.bytes) for n in fwd] == [(OpKind.ALL_TO_ALL, b) for b in (q, kv, kv, q)]
    assert sorted(n.attrs.bytes for n in bwd) == sorted([q, kv, kv, q]) and {n.op for n in bwd} == {OpKind.ALL_TO_ALL}
    # in line with compute: TE exchanges inside the attention call, after every projection has run
    assert all(n.attrs.blocking for n in fwd + bwd)
    (a,) = {(x.heads, x.kv_heads, x.q_len, x.kv_len) for x in _fwd_attention(g)}
    assert a == (8 // cp, 4 // cp, 64, 64)
    base = graph_flops(run_passes(capture(cfg), [Autodiff()]))
    assert graph_flops(g).model * cp == base.model
    # each rank keeps 1/cp of the activations, and the attention's output twice: on its heads (saved by the
    # kernel for its backward) and, exchanged, on its tokens (saved by o_proj)
    whole = per_layer_activations(run_passes(capture(cfg), [Autodiff()]))
    assert per_layer_activations(g) == whole // cp + q


def test_head_parallel_context_parallel_composes_with_tensor_parallelism_and_needs_whole_heads() -> None:
    cfg = TINY_LLAMA.with_(seq_len=32, heads=8, kv_heads=4)
    g = run_passes(
        capture(cfg), [ContextParallel(2, "a2a", tp=2), TensorParallel(2, sequence_parallel=True), Autodiff()]
    )
    verify(g)
    assert {(a.heads, a.kv_heads, a.q_len) for a in _fwd_attention(g)} == {(2, 1, 32)}
    with pytest.raises(LayoutError, match="cp=4 does not divide the heads 4 / key/value heads 2"):
        run_passes(capture(TINY_LLAMA.with_(seq_len=32)), [ContextParallel(4, "a2a")])
    with pytest.raises(LayoutError, match="no head-parallel"):
        ContextParallel(2, "a2a", torch=True)


def test_cli_compiles_head_parallel_context_parallelism_without_a_note_for_the_layers_it_was_asked_for() -> None:
    args = ["llama3-8b", "--cp", "2", "--cp-comm", "a2a", "--backend", "h100-sxm", "--seq-len", "4096", "--json"]
    result = _run(*args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["plan"]["cp_comm"] == "a2a"
    assert not any("head-parallel" in n for n in report["notes"])
    ring = json.loads(_run(*args[:4], "p2p", *args[5:]).output)
    assert report["model_flops_per_step"] == ring["model_flops_per_step"]


def test_context_parallel_scales_mfu_consistently() -> None:
    """The same model and global batch on twice the devices via CP: MFU stays comparable, not halved."""
    from echosim.compiler import compile

    cfg = ArchConfig("llama", layers=2, hidden=2048, heads=16, kv_heads=4, vocab=32000, ffn=5632, seq_len=8192)
    one = compile(cfg, Plan(dp=1, seq_len=8192), Cluster("h100-sxm", 1, 8))
    two = compile(cfg, Plan(dp=1, cp=2, seq_len=8192), Cluster("h100-sxm", 2, 8))
    assert two.model_flops_per_step == pytest.approx(one.model_flops_per_step, rel=1e-9)
    assert two.step_time_s < one.step_time_s
    assert math.isclose(two.tokens_per_s * two.step_time_s, one.tokens_per_s * one.step_time_s)


@pytest.mark.parametrize(
    ("src", "dst", "want"),
    [
        ((2, 64, 8, 16), (2, 8, 64, 16), [0, 2, 1, 3]),  # [b, T, h, d] -> [b, h, T, d]
        ((2, 64, 8, 8), (2, 8, 64, 8), [0, 2, 1, 3]),  # head_dim = heads: d stays, h moves
        ((8, 8, 64, 16), (8, 64, 8, 16), [0, 2, 1, 3]),  # batch = heads: the batch stays
        ((4, 8, 4), (4, 4, 8), [0, 2, 1]),
    ],
)
def test_a_permutation_is_followed_axis_by_axis_where_sizes_repeat(
    src: tuple[int, ...], dst: tuple[int, ...], want: list[int]
) -> None:
    """Sizes alone do not say which of two equal axes moved: an axis whose size is the same in both places stays
    (the split of a transposed [b, T, h, d] followed the head_dim, or the batch, when either equals the heads)."""
    assert _permuted(src, dst) == want


def test_a_capture_records_each_transposes_permutation_and_verify_checks_it() -> None:
    """torch.export's transposes become views that say which input axis each output axis is (sizes alone cannot
    when two are equal); a permutation that is not one of the input's axes is refused."""
    from echosim.frontend.capture import capture_named
    from echosim.frontend.spec import CaptureSpec
    from echosim.ir.ops import ViewAttrs
    from echosim.ir.types import TensorSpec
    from echosim.ir.verify import VerifyError

    graph = capture_named("gpt3-125m", CaptureSpec(seq_len=16))[0]
    perms = {n.attrs.perm for n in graph if n.op is OpKind.VIEW and isinstance(n.attrs, ViewAttrs)}
    assert (0, 2, 1, 3) in perms  # [b, s, heads, d] <-> [b, heads, s, d]
    g = Graph("t")
    x = g.add(OpKind.INPUT, [], TensorSpec((2, 3, 4), DType.BF16))
    g.add(OpKind.VIEW, [x], TensorSpec((2, 4, 3), DType.BF16), ViewAttrs((0, 2, 1)))
    verify(g)
    g.add(OpKind.VIEW, [x], TensorSpec((24,), DType.BF16), ViewAttrs((0, 2, 1)))
    with pytest.raises(VerifyError, match="perm"):
        verify(g)
