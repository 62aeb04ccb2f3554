"""Mamba's selective scan: the fused op computes transformers' loop, and a capture holds one scan per layer."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from echosim.compiler import lower  # noqa: E402
from echosim.frontend.ssm_ops import SCAN_FLOPS_PER_STATE, fused_scan, selective_scan  # noqa: E402
from echosim.ir.ops import OpKind, Phase  # noqa: E402
from echosim.plan import Cluster, Plan, PlanError  # noqa: E402

TINY_MAMBA = Path(__file__).parent / "configs" / "tiny-mamba.json"


def _inputs(batch: int = 2, d: int = 6, steps: int = 9, state: int = 4) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "u": torch.randn(batch, d, steps, generator=g),
        "delta": torch.randn(batch, d, steps, generator=g),
        "A": -torch.rand(d, state, generator=g),
        "B": torch.randn(batch, state, steps, generator=g),
        "C": torch.randn(batch, state, steps, generator=g),
        "D": torch.randn(d, generator=g),
        "z": torch.randn(batch, d, steps, generator=g),
        "delta_bias": torch.randn(d, generator=g),
    }


def _logits(config_path: Path, tokens: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A model from ``config_path`` on CPU in fp32: its logits as transformers computes them, with echosim's ops in
    place (:func:`fused_scan`), and how many transformers modules were patched."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(config_path)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).float()
    ids = torch.randint(0, config.vocab_size, (2, tokens))
    with torch.no_grad():
        want = model(input_ids=ids, use_cache=False).logits
        with fused_scan() as patched:
            got = model(input_ids=ids, use_cache=False).logits
    return want, got, patched


@pytest.mark.parametrize("softplus", [True, False])
def test_the_op_computes_what_transformers_loop_computes(softplus: bool) -> None:
    from transformers.models.mamba import modeling_mamba

    x = _inputs()
    first = [x[k] for k in ("u", "delta", "A", "B", "C")]  # transformers names u and delta otherwise
    rest = {"D": x["D"], "z": x["z"], "delta_bias": x["delta_bias"], "delta_softplus": softplus}
    torch.testing.assert_close(selective_scan(*first, **rest), modeling_mamba.mamba_selective_scan(*first, **rest))
    # no skip, gate or bias
    torch.testing.assert_close(selective_scan(*first), modeling_mamba.mamba_selective_scan(*first))


def test_a_mamba_model_computes_the_same_logits_with_the_fused_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    """The substitution passes transformers' arguments in the kernel's order: the model's output is unchanged."""
    from echosim.frontend import ssm_ops

    calls: list[int] = []

    def counted(*args: object) -> torch.Tensor:
        calls.append(1)
        return selective_scan(*args)

    monkeypatch.setattr(ssm_ops, "selective_scan", counted)
    want, got, patched = _logits(TINY_MAMBA, 12)
    assert patched >= 1 and len(calls) == 2  # two layers
    torch.testing.assert_close(got, want)


def test_a_capture_holds_one_scan_per_layer_whatever_the_sequence() -> None:
    """The loop over tokens is gone: the graph does not grow with the sequence, each layer scans once forward
    and once backward, and the forward scan's FLOPs per element are 9 per state dimension (+ D and the gate)."""
    graphs = [lower(f"hf:{TINY_MAMBA}", Plan(seq_len=s), Cluster("null", devices=1)).graph for s in (16, 64)]
    assert len(list(graphs[0])) == len(list(graphs[1]))
    fns = Counter((getattr(n.attrs, "fn", ""), n.phase) for n in graphs[1] if n.op is OpKind.ELEMENTWISE)
    assert graphs[1].repeats == {"backbone.layers.0": 2}  # tiny-mamba's two layers, folded to one
    assert fns[("selective_scan", Phase.FORWARD)] == 1
    assert fns[("selective_scan_grad", Phase.BACKWARD)] == 1
    scan = next(n for n in graphs[1] if getattr(n.attrs, "fn", "") == "selective_scan")
    assert scan.out.shape == (1, 128, 64)  # (batch, d_inner = expand * hidden, seq)
    assert scan.attrs.flops_per_element == SCAN_FLOPS_PER_STATE * 16 + 2


def test_mamba_layers_fold_and_split_into_pipeline_stages() -> None:
    """The first block reads bf16 embeddings and the next the fp32 residual stream, so their casts view different
    values; views cost nothing, the blocks fold (they did not), and pipeline parallelism splits them."""
    compiled = lower(f"hf:{TINY_MAMBA}", Plan(pp=2, seq_len=16, global_batch=4), Cluster("h100-sxm", devices=2))
    assert len(compiled.report.memory) == 2 and compiled.report.step_time_s > 0


def test_the_scan_costs_its_reads_and_writes_not_a_launch_per_token() -> None:
    """On a GPU the step of a tiny Mamba is a few milliseconds at 2,048 tokens (it was 0.58 s of per-token
    launches), and a longer sequence costs more bytes, not more kernels."""
    steps = [
        lower(f"hf:{TINY_MAMBA}", Plan(seq_len=s, global_batch=8, micro_batch=1), Cluster("h100-sxm", devices=1))
        for s in (2048, 4096)
    ]
    assert steps[0].report.step_time_s < 0.02
    assert steps[1].report.step_time_s > steps[0].report.step_time_s


TINY_QWEN3_NEXT = Path(__file__).parent / "configs" / "tiny-qwen3-next.json"


@pytest.mark.parametrize(("steps", "l2", "kda"), [(100, True, False), (128, False, False), (90, True, True)])
def test_the_delta_rule_op_computes_what_transformers_chunks_compute(steps: int, l2: bool, kda: bool) -> None:
    """Grouped value heads (two key heads, four value heads), a last chunk that is not whole, with and without
    the in-kernel L2 norm of queries and keys; Kimi Delta Attention (``kda``: a decay per key channel, as many key
    heads as value heads)."""
    from transformers.models.kimi_linear import modeling_kimi_linear
    from transformers.models.qwen3_next import modeling_qwen3_next

    from echosim.frontend.ssm_ops import gated_delta_rule

    g = torch.Generator().manual_seed(1)
    batch, heads, dk, dv = 2, 4, 16, 8
    kv_heads = heads if kda else 2
    q, k = (torch.randn(batch, steps, kv_heads, dk, generator=g) for _ in range(2))
    if not l2:  # keys of unit length keep the recurrence stable, as the kernel's own L2 norm does
        q, k = (x / x.norm(dim=-1, keepdim=True) for x in (q, k))
    v = torch.randn(batch, steps, heads, dv, generator=g)
    decay = -torch.rand(batch, steps, heads, *((dk,) if kda else ()), generator=g)
    beta = torch.rand(batch, steps, heads, generator=g)
    chunked = (
        modeling_kimi_linear.chunk_kimi_delta_attention if kda else modeling_qwen3_next.torch_chunk_gated_delta_rule
    )
    want, _ = chunked(q, k, v, g=decay, beta=beta, chunk_size=64, use_qk_l2norm_in_kernel=l2)
    torch.testing.assert_close(gated_delta_rule(q, k, v, decay, beta, 64, l2), want, rtol=1e-4, atol=1e-5)


def test_a_qwen3_next_model_computes_the_same_logits_with_the_chunked_kernel() -> None:
    want, got, patched = _logits(TINY_QWEN3_NEXT, 70)
    assert patched >= 1
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_the_delta_rule_is_the_chunked_kernels_gemms_whatever_the_sequence() -> None:
    """No loop over chunks or rows of the triangular solve: the graph does not grow with the sequence, and the
    forward GEMMs of one linear-attention layer do 6 C^2 dk + 4 C^2 dv + 6 C dk dv FLOPs per chunk and value
    head (C = 64; dk = 16, dv = 8, 4 value heads in the test config)."""
    graphs = [lower(f"hf:{TINY_QWEN3_NEXT}", Plan(seq_len=s), Cluster("null", devices=1)).graph for s in (128, 512)]
    assert len(list(graphs[0])) == len(list(graphs[1]))
    layer = "model.layers.0.linear_attn"
    forward = [n for n in graphs[1] if n.op is OpKind.MATMUL and n.phase is Phase.FORWARD]
    gemms = [n for n in forward if n.name.startswith("gated_delta_rule.")]
    assert {n.scope for n in gemms} == {layer}
    c, dk, dv, chunks = 64, 16, 8, 512 // 64
    per_chunk = 6 * c * c * dk + 4 * c * c * dv + 6 * c * dk * dv
    assert sum(n.attrs.flops for n in gemms) == per_chunk * 4 * chunks


TINY_RWKV = Path(__file__).parent / "configs" / "tiny-rwkv.json"


def test_the_wkv_op_computes_what_transformers_loop_computes() -> None:
    from transformers.models.rwkv import modeling_rwkv

    from echosim.frontend.ssm_ops import wkv

    g = torch.Generator().manual_seed(2)
    decay, first = torch.randn(6, generator=g), torch.randn(6, generator=g)
    key, value = 3 * torch.randn(2, 40, 6, generator=g), torch.randn(2, 40, 6, generator=g)  # large keys: the max trick
    want, _ = modeling_rwkv.rwkv_linear_attention_cpu(decay, first, key, value)
    torch.testing.assert_close(wkv(decay, first, key, value), want)


def test_an_rwkv_model_computes_the_same_logits_and_captures_one_wkv_per_layer() -> None:
    want, got, _ = _logits(TINY_RWKV, 20)
    torch.testing.assert_close(got, want)
    graphs = [lower(f"hf:{TINY_RWKV}", Plan(seq_len=s), Cluster("null", devices=1)).graph for s in (16, 64)]
    assert len(list(graphs[0])) == len(list(graphs[1]))  # no loop over the tokens
    fns = Counter(getattr(n.attrs, "fn", "") for n in graphs[1])
    # the first block (its own pre-norm) and one folded block for the other two
    assert fns["wkv"] == 2 and fns["wkv_grad"] == 2


def test_rwkv_under_tp_splits_by_channels_and_its_output_layers_are_row_parallel() -> None:
    """RWKV's ``attention.key``/``value`` match BERT's column-parallel rules, and its ``feed_forward.value`` (4h to
    h) does too: a linear that reads split features is row-parallel whatever its name, so ``attention.output``
    (no rule) and ``feed_forward.value`` split their inputs and all-reduce. It was refused."""
    compiled = lower(f"hf:{TINY_MAMBA.parent}/tiny-rwkv.json", Plan(tp=2, seq_len=16), Cluster("null", devices=2))
    styles = {
        n.scope.split(".", 3)[-1]: n.attrs.tp
        for n in compiled.graph
        if n.op is OpKind.MATMUL and n.phase is Phase.FORWARD and n.scope.startswith("rwkv.blocks.0.")
    }
    assert styles == {
        "attention.key": "colwise",
        "attention.value": "colwise",
        "attention.receptance": "",
        "attention.output": "rowwise",
        "feed_forward.key": "colwise",
        "feed_forward.value": "rowwise",
        "feed_forward.receptance": "",
    }


@pytest.mark.parametrize("sp", [False, True])
def test_a_gated_delta_rule_layer_splits_by_heads_under_tp(sp: bool) -> None:
    """Qwen3-Next's linear-attention layer as Megatron-Core's GatedDeltaNet splits it: the fused input projections
    column-parallel (each rank holds its key heads with their value heads), the chunked kernel's GEMMs on half
    the heads, out_proj row-parallel. It ran whole on every rank (under --sp on the gathered sequence)."""
    one = lower(f"hf:{TINY_QWEN3_NEXT}", Plan(seq_len=128), Cluster("null", 1)).graph
    compiled = lower(f"hf:{TINY_QWEN3_NEXT}", Plan(tp=2, sp=sp, seq_len=128), Cluster("null", 2))
    g = compiled.graph

    def mixer(graph: Any) -> list[Any]:
        return [n for n in graph if n.op is OpKind.MATMUL and n.phase is Phase.FORWARD and ".linear_attn" in n.scope]

    styles = {n.scope.rsplit(".", 1)[-1]: n.attrs.tp for n in mixer(g) if g[n.inputs[1]].op is OpKind.PARAMETER}
    assert styles == {"in_proj_qkvz": "colwise", "in_proj_ba": "colwise", "out_proj": "rowwise"}
    assert all(n.attrs.useful == 1.0 for n in mixer(g))  # no rank repeats another's work
    kernel = {n.name: n.attrs.batch for n in mixer(g) if n.name.startswith("gated_delta_rule.")}
    assert kernel and kernel == {n.name: n.attrs.batch // 2 for n in mixer(one) if n.name in kernel}
    assert not any("linear_attn" in w for w in compiled.report.warnings)


def test_a_transpose_of_as_many_tokens_as_channels_keeps_the_split_on_the_channels() -> None:
    """The delta rule's short convolution transposes ``[b, T, C]`` to ``[b, C, T]``; at 96 tokens, as many as its 96
    channels, sizes could not tell the axes apart and tp=2 was refused ("contracts a tensor-parallel split axis"):
    the capture now records the transpose's permutation, and the convolution runs on each rank's 48 channels."""
    compiled = lower(f"hf:{TINY_QWEN3_NEXT}", Plan(tp=2, seq_len=96), Cluster("null", 2))
    [conv] = [
        n
        for n in compiled.graph
        if n.op is OpKind.MATMUL and n.phase is Phase.FORWARD and n.name == "conv1d" and "layers.0." in n.scope
    ]
    assert conv.attrs.batch == 96 // 2 and conv.out.shape[1] == 48


TINY_MAMBA2 = Path(__file__).parent / "configs" / "tiny-mamba2.json"


def test_the_ssd_op_computes_what_transformers_chunked_scan_computes() -> None:
    """Mamba-2's scan, token by token, against transformers' chunked reference: 37 tokens in chunks of 8 (the last
    one partial), 4 heads sharing 2 groups of B and C, with the time-step bias, softplus and the D skip."""
    from transformers.models.mamba2 import modeling_mamba2

    from echosim.frontend.ssm_ops import ssd_scan

    g = torch.Generator().manual_seed(3)
    batch, steps, heads, p, groups, n = 2, 37, 4, 8, 2, 16
    x, dt = torch.randn(batch, steps, heads, p, generator=g), torch.randn(batch, steps, heads, generator=g)
    a, d, bias = -torch.rand(heads, generator=g), torch.randn(heads, generator=g), torch.randn(heads, generator=g)
    b, c = (torch.randn(batch, steps, groups, n, generator=g) for _ in range(2))
    want = modeling_mamba2.mamba2_chunk_scan(x, dt, a, b, c, 8, D=d, dt_bias=bias, dt_softplus=True)
    got = ssd_scan(x, dt, a, b, c, d, bias, 8, True, 0.0, float("inf"))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_mamba2_model_computes_the_same_logits_with_the_ssd_op() -> None:
    want, got, patched = _logits(TINY_MAMBA2, 70)
    assert patched >= 1
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_the_ssd_scan_is_the_chunked_kernels_gemms_whatever_the_sequence() -> None:
    """One ``C B^T`` per chunk and group, and per chunk and head the diagonal block's output, the chunk's state
    and the off-diagonal output: 2 L^2 N per group and 2 L^2 P + 4 L N P per head, chunk by chunk (L = 32, N = 16,
    P = 16; 8 heads in 2 groups). transformers' chunked reference is gone: no einsum is left."""
    graphs = [lower(f"hf:{TINY_MAMBA2}", Plan(seq_len=s), Cluster("null", devices=1)).graph for s in (256, 512)]
    assert len(list(graphs[0])) == len(list(graphs[1]))
    gemms = [n for n in graphs[1] if n.op is OpKind.MATMUL and n.phase is Phase.FORWARD and "ssd_scan" in n.name]
    assert {n.scope for n in gemms} == {"backbone.layers.0.mixer"}
    big_l, big_n, p, chunks = 32, 16, 16, 512 // 32
    per_chunk = 2 * (2 * big_l * big_l * big_n) + 8 * (2 * big_l * big_l * p + 4 * big_l * big_n * p)
    assert sum(n.attrs.flops for n in gemms) == per_chunk * chunks
    assert not any("einsum" in n.name for n in graphs[1])


def test_a_mamba2_model_splits_by_heads_and_groups_under_tp() -> None:
    """Megatron-Core's MambaMixer: in_proj column-parallel (z, x, B, C and dt each split), the depthwise
    convolution and the scan on each rank's heads and groups, out_proj row-parallel. Every product is split, so
    the hardware does the model's FLOPs once; tp=4 does not divide the 2 groups and is refused, as Megatron-Core
    refuses it."""
    plan = {"seq_len": 128, "micro_batch": 2, "global_batch": 2}
    one = lower(f"hf:{TINY_MAMBA2}", Plan(**plan), Cluster("null", devices=1)).report
    two = lower(f"hf:{TINY_MAMBA2}", Plan(tp=2, **plan), Cluster("null", devices=2))
    styles = {
        n.scope.rsplit(".", 1)[-1]: n.attrs.tp
        for n in two.graph
        if n.op is OpKind.MATMUL and n.phase is Phase.FORWARD and two.graph[n.inputs[1]].op is OpKind.PARAMETER
    }
    assert styles == {"in_proj": "colwise", "out_proj": "rowwise", "lm_head": "vocab"}
    assert two.report.hardware_flops_per_step == pytest.approx(one.hardware_flops_per_step, rel=1e-9)
    assert not two.report.warnings
    with pytest.raises(PlanError, match=r"tp=4 does not divide the axis of size 2 .* needs whole on each rank"):
        lower(f"hf:{TINY_MAMBA2}", Plan(tp=4, **plan), Cluster("null", devices=4))


def test_sequence_parallelism_refuses_the_groups_tensor_parallelism_refuses(tmp_path: Path) -> None:
    """One group of B and C (Bamba's, Falcon-H1's, Granite 4.0-H's n_groups) at tp=2: refused with or without
    --sp, as Megatron-Core asserts ngroups % tp == 0. Under --sp the layer ran whole on every rank instead (1.9x
    the model's FLOPs), with a warning that blamed a product over the tokens."""
    config = {**json.loads(TINY_MAMBA2.read_text()), "n_groups": 1}
    path = tmp_path / "one-group.json"
    path.write_text(json.dumps(config))
    plan = {"seq_len": 128, "micro_batch": 2, "global_batch": 2}
    for sp in (False, True):
        with pytest.raises(PlanError, match=r"ssd_scan.cb .* tp=2 \(with cp\) does not divide the heads \(or groups\)"):
            lower(f"hf:{path}", Plan(tp=2, sp=sp, **plan), Cluster("null", devices=2))


def _forward_collectives(graph: Any, layer: str) -> list[Any]:
    return [n for n in graph if n.phase is Phase.FORWARD and n.op.is_collective and n.scope.startswith(layer)]


def test_context_parallel_mamba2_exchanges_tokens_for_heads_around_the_scan() -> None:
    """Megatron-Core's Mamba context parallelism: the input projection runs on the rank's 128 of 256 tokens, one
    all_to_all trades them for every token of half the heads (z, x, B, C and dt: 2 x 128 + 2 x 2 x 16 + 8 = 328
    channels, sent as the rank's 128 tokens x 328 in bf16), the convolution and the scan run on those heads over
    the whole sequence, and a second all_to_all brings the 128 channels of the scan's output back to the rank's
    tokens before out_proj. It was refused ("context parallelism splits scaled-dot-product attention")."""
    one = lower(f"hf:{TINY_MAMBA2}", Plan(seq_len=256), Cluster("null", 1))
    two = lower(f"hf:{TINY_MAMBA2}", Plan(cp=2, seq_len=256), Cluster("null", 2))
    exchanged = _forward_collectives(two.graph, "backbone.layers.0.")
    assert [(n.op, n.attrs.bytes) for n in exchanged] == [
        (OpKind.ALL_TO_ALL, 128 * 328 * 2),
        (OpKind.ALL_TO_ALL, 128 * 128 * 2),
    ]
    assert two.report.hardware_flops_per_step == pytest.approx(one.report.model_flops_per_step, rel=1e-9)
    assert any(note.startswith("cp=2: backbone.layers.0.mixer runs head-parallel") for note in two.report.notes)
    kernel = {n.name: n.attrs.batch for n in two.graph if n.phase is Phase.FORWARD and "ssd_scan." in n.name
              and n.op is OpKind.MATMUL}  # fmt: skip
    whole = {n.name: n.attrs.batch for n in one.graph if n.phase is Phase.FORWARD and n.name in kernel}
    assert kernel == {name: batch // 2 for name, batch in whole.items()}  # half the heads (and groups) each


def test_context_parallel_beyond_the_groups_repeats_b_and_c_on_every_rank() -> None:
    """cp=4 over 2 groups of B and C: each group serves heads on two ranks, so every rank gathers B and C (Megatron-
    Core repeats each group before its all_to_all) and computes C B^T whole, which counts once in the model FLOPs;
    the heads still split four ways."""
    four = lower(f"hf:{TINY_MAMBA2}", Plan(cp=4, seq_len=256), Cluster("null", 4))
    ops = [(n.op, n.name) for n in _forward_collectives(four.graph, "backbone.layers.0.")]
    assert ops[0] == (OpKind.ALL_TO_ALL, "linear.cp_to_heads") and ops[-1][0] is OpKind.ALL_TO_ALL
    assert {name for op, name in ops if op is OpKind.ALL_GATHER} == {
        "ssd_scan.B_t.cp_all_gather",
        "ssd_scan.C_chunks.cp_all_gather",
    }
    [cb] = [n for n in four.graph if n.phase is Phase.FORWARD and n.name == "ssd_scan.cb" and "layers.0." in n.scope]
    assert cb.out.shape[1] == 2 * 256 // 32  # both groups, every chunk, on each of the 4 ranks
    assert cb.attrs.useful == 0.25  # the model's work once, the others' hardware FLOPs only
    one = lower(f"hf:{TINY_MAMBA2}", Plan(seq_len=256), Cluster("null", 1)).report
    assert four.report.model_flops_per_step == pytest.approx(one.model_flops_per_step, rel=1e-9)
    assert four.report.hardware_flops_per_step > one.model_flops_per_step


@pytest.mark.parametrize("config", ["tiny-qwen3-next.json", "tiny-rwkv.json"])
def test_context_parallel_runs_the_delta_rule_and_the_wkv_on_each_ranks_heads(config: str) -> None:
    """The gated delta rule (after its short convolution) and RWKV's WKV run along the tokens: under cp=2 their layer
    trades tokens for heads (channels) and back, and the step does the model's FLOPs once."""
    path = f"hf:{TINY_MAMBA.parent / config}"
    one = lower(path, Plan(seq_len=256), Cluster("null", 1))
    two = lower(path, Plan(cp=2, seq_len=256), Cluster("null", 2))
    a2a = [n for n in two.graph if n.phase is Phase.FORWARD and n.op is OpKind.ALL_TO_ALL]
    assert {n.name.rsplit(".", 1)[-1] for n in a2a} == {"cp_to_heads", "cp_to_tokens"}
    assert two.report.hardware_flops_per_step == pytest.approx(one.report.model_flops_per_step, rel=1e-9)
