"""Sliding-window (local) attention: the band's pair count, the kernels' block skipping, the frontends."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from conftest import TINY_LLAMA, capture, masked_attention_flops

from echosim.backends import compute, tpu
from echosim.backends.devices import DEVICES
from echosim.frontend.zoo import ZOO
from echosim.ir.ops import AttentionAttrs, OpKind, Phase, band_fraction, band_pairs, causal_fraction
from echosim.passes.autodiff import Autodiff
from echosim.passes.base import run_passes
from echosim.passes.flops import graph_flops

H100 = DEVICES["h100-sxm"]


def brute_pairs(q: int, kv: int, window: int | None) -> int:
    off = kv - q
    return sum(1 for i in range(q) for k in range(kv) if k <= i + off and (window is None or k > i + off - window))


@pytest.mark.parametrize("q", [1, 5, 16, 33])
@pytest.mark.parametrize("kv", [1, 7, 16, 40])
@pytest.mark.parametrize("window", [None, 1, 3, 8, 64])
def test_band_pairs_count_every_visible_pair(q: int, kv: int, window: int | None) -> None:
    assert band_pairs(q, kv, window) == brute_pairs(q, kv, window)


def test_band_closed_form_and_full_causal_limit() -> None:
    # q = kv >= W: every row sees W keys but the first W - 1 rows, which see 1 .. W - 1
    for s, w in [(32768, 1024), (4096, 128), (8192, 4096)]:
        assert band_pairs(s, s, w) == s * w - w * (w - 1) // 2
    assert band_pairs(4096, 4096, None) == 4096 * 4097 // 2
    assert band_fraction(4096, 4096, 4096) == band_fraction(4096, 4096) == pytest.approx(causal_fraction(4096, 4096))
    assert band_fraction(1024, 4096, None) == pytest.approx(causal_fraction(1024, 4096))


def test_attention_attrs_count_the_band_and_print_the_window() -> None:
    a = AttentionAttrs(2, 16, 8, 32768, 32768, 256, window=1024)
    assert a.model_flops == 4 * 2 * 16 * 256 * (32768 * 1024 - 1024 * 1023 // 2)
    assert "causal window=1024 flash" in str(a)
    assert "window" not in str(AttentionAttrs(2, 16, 8, 32768, 32768, 256))
    with pytest.raises(ValueError, match="sliding window"):
        AttentionAttrs(1, 1, 1, 8, 8, 8, causal=False, window=4)
    with pytest.raises(ValueError, match="sliding window"):
        AttentionAttrs(1, 1, 1, 8, 8, 8, window=-1)


@pytest.mark.parametrize(
    ("q", "kv", "bq", "bkv", "window"),
    [(4096, 4096, 128, 128, 128), (1000, 1300, 128, 64, 300), (8192, 8192, 512, 512, 1024), (512, 512, 128, 128, None)],
)
def test_flash_visits_exactly_the_blocks_the_band_touches(
    q: int, kv: int, bq: int, bkv: int, window: int | None
) -> None:
    off = kv - q
    expected = []
    for i in range(math.ceil(q / bq)):
        touched = 0
        for j in range(math.ceil(kv / bkv)):
            first, last = j * bkv, min((j + 1) * bkv, kv) - 1
            for r in range(i * bq, min((i + 1) * bq, q)):
                lo, hi = (0 if window is None else max(0, r + off + 1 - window)), min(kv, r + off + 1) - 1
                if max(lo, first) <= min(hi, last):
                    touched += 1
                    break
        expected.append(touched)
    assert compute.band_kv_blocks(q, kv, bq, bkv, window) == expected


def test_flash_time_follows_the_band_and_math_attention_does_not() -> None:
    causal = AttentionAttrs(1, 64, 8, 8192, 8192, 64)
    local = AttentionAttrs(1, 64, 8, 8192, 8192, 64, window=128)
    t_causal, t_local = (compute.attention_time_s(H100, a, "bf16") for a in (causal, local))
    # FA3 on H100: 128 x 128 blocks; the 128-key band touches 2 blocks per query block, causal 32.5 on average
    assert sum(compute.band_kv_blocks(8192, 8192, 128, 128, 128)) == 2 * 64 - 1
    assert 0.05 < t_local / t_causal < 0.15
    for backward in (False, True):
        math_causal = AttentionAttrs(1, 64, 8, 8192, 8192, 64, flash=False)
        math_local = AttentionAttrs(1, 64, 8, 8192, 8192, 64, flash=False, window=128)
        assert compute.attention_time_s(H100, math_local, "bf16", backward) == compute.attention_time_s(
            H100, math_causal, "bf16", backward
        )


def test_splash_attention_computes_the_512_blocks_the_band_touches() -> None:
    chip = tpu.TPUS["tpu-v6e"]
    local = AttentionAttrs(1, 16, 8, 32768, 32768, 256, window=1024)
    # a 1024-key band touches 3 of the 512 x 512 blocks of every query block but the first two (1, 2)
    assert tpu.attention_keep(local) == pytest.approx((3 * 64 - 3) / 64**2)
    causal = AttentionAttrs(1, 16, 8, 32768, 32768, 256)
    launch = 2 * tpu.FUSION_OVERHEAD_US * 1e-6  # the two products' launch gaps do not shrink with the mask
    ratio = (tpu.attention_time_s(chip, local, "bf16") - launch) / (tpu.attention_time_s(chip, causal, "bf16") - launch)
    assert ratio == pytest.approx(tpu.attention_keep(local) / (64 * 65 / 2 / 64**2))  # causal: 64 * 65 / 2 blocks
    unfused = [AttentionAttrs(1, 16, 8, 4096, 4096, 256, flash=False, window=w) for w in (0, 1024)]
    assert tpu.attention_time_s(chip, unfused[0], "bf16") == tpu.attention_time_s(chip, unfused[1], "bf16")


def test_local_attention_computes_the_band() -> None:
    import torch

    from echosim.frontend.attention_ops import local_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 9, 4) for _ in range(3))
    out = local_attention(q, k, v, 3)
    scores = q @ k.transpose(-1, -2) / 2.0
    i, j = torch.arange(9).unsqueeze(1), torch.arange(9).unsqueeze(0)
    scores = scores.masked_fill(~((j <= i) & (j > i - 3)), float("-inf"))
    assert torch.allclose(out, scores.softmax(-1) @ v, atol=1e-6)


def test_zoo_pattern_keeps_params_and_counts_local_layers_by_the_band() -> None:
    cfg = TINY_LLAMA.with_(layers=4, seq_len=32, sliding_window=8, global_layer_step=2)
    assert [cfg.attention_window(i) for i in range(4)] == [8, None, 8, None]
    assert cfg.layers_per_block == 2 and cfg.param_count() == TINY_LLAMA.with_(layers=4, seq_len=32).param_count()
    g = capture(cfg, batch=2)
    windows = sorted((n.attrs.window, g.multiplicity(n)) for n in g if n.op is OpKind.ATTENTION)
    assert windows == [(0, 2), (8, 2)]  # one block of (local, global) repeated twice
    full = run_passes(capture(cfg.with_(sliding_window=0, global_layer_step=0), batch=2), [Autodiff()])
    local = run_passes(g, [Autodiff()])
    d, h, s = cfg.dim_head, cfg.heads, 32
    dropped = 2 * 3 * 4 * 2 * h * d * (band_pairs(s, s) - band_pairs(s, s, 8))  # 2 local layers, fwd + 2x bwd
    assert graph_flops(full).model - graph_flops(local).model == dropped
    # PyTorch's counter sees SDPA with a mask and counts every score: ours plus what the masks drop
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from echosim.frontend.zoo_modules import build_module

    ids = torch.zeros(2, s, dtype=torch.long, device="meta")
    counter = FlopCounterMode(display=False)
    with counter:
        build_module(cfg)(ids, ids).backward()
    assert counter.get_total_flops() == graph_flops(local).model + masked_attention_flops(local)


def test_zoo_gpt_oss_alternates_and_keeps_its_published_size() -> None:
    oss = ZOO["gpt-oss-120b"]
    assert (oss.sliding_window, oss.global_layer_step, oss.layers_per_block) == (128, 2, 2)
    assert oss.attention_window(0) == 128 and oss.attention_window(1) is None
    # unchanged by the attention pattern; + 36 x 128 x 2880 for the experts' fc2 biases (ArchConfig.expert_bias)
    assert oss.param_count() == 116_789_048_640 + 36 * 128 * 2880
    mav = ZOO["llama4-maverick"].with_(sliding_window=8192, global_layer_step=4)
    assert mav.layers_per_block == 4  # lcm of the MoE step 2 and the global step 4


def test_hf_config_windows() -> None:
    from echosim.frontend.hf import layer_windows

    gemma = SimpleNamespace(sliding_window=1024, num_hidden_layers=12, sliding_window_pattern=6)
    assert sorted(layer_windows(gemma)) == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10]
    types = ["sliding_attention", "full_attention"] * 2
    assert layer_windows(SimpleNamespace(sliding_window=128, num_hidden_layers=4, layer_types=types)) == {
        0: 128,
        2: 128,
    }
    assert layer_windows(SimpleNamespace(sliding_window=4096, num_hidden_layers=2)) == {0: 4096, 1: 4096}
    assert layer_windows(SimpleNamespace(sliding_window=4096, num_hidden_layers=2, use_sliding_window=False)) == {}
    assert layer_windows(SimpleNamespace(sliding_window=None, num_hidden_layers=2)) == {}


def test_hf_mistral_keeps_its_window_past_4096_tokens() -> None:
    pytest.importorskip("transformers")
    from echosim.frontend import hf
    from echosim.frontend.spec import CaptureSpec

    config = hf.build_config(hf.config_path("hf:mistral-7b"))
    cap, _ = hf.capture_config(config, CaptureSpec(1, 8192), "mistral")
    attn = [n for n in cap.graph if n.op is OpKind.ATTENTION]
    assert [n.attrs.window for n in attn] == [4096] and cap.graph.multiplicity(attn[0]) == 32
    short, _ = hf.capture_config(config, CaptureSpec(1, 4096), "mistral")  # a window as long as the sequence
    assert [n.attrs.window for n in short.graph if n.op is OpKind.ATTENTION] == [0]


def test_validation_rows_take_the_models_patterns() -> None:
    from pathlib import Path

    from echosim.validation.cases import read_cases
    from echosim.validation.rows import row_model

    path = Path(__file__).resolve().parents[1].parent / "shared" / "validation" / "cases.csv"
    if not path.is_file():
        pytest.skip("../shared/validation/cases.csv is not here")
    cases = {c["case_id"]: c for c in read_cases(path)}
    gemma = row_model(cases["tpurecipes-gemma3-12b-bf16-v6e-512-x2"])
    assert (gemma.sliding_window, gemma.global_layer_step) == (1024, 6)  # five local layers to one global
    oss = row_model(cases["mbridge2511-gpt-oss-120b-bf16-h100-sxm-64"])
    assert (oss.sliding_window, oss.global_layer_step) == (128, 2)
    llama = row_model(next(c for c in cases.values() if c["arch"] == "llama" and c.int("hidden") == 8192))
    assert llama.sliding_window == 0


def test_context_parallel_ring_refuses_a_window_and_names_the_schemes_that_run_one() -> None:
    """Transformer Engine's ring has no sliding window (Megatron-LM PR 1160), nor has PyTorch's maskless ring."""
    from echosim.passes.base import LayoutError
    from echosim.passes.context_parallel import ContextParallel

    g = capture(TINY_LLAMA.with_(sliding_window=8, seq_len=32))
    with pytest.raises(LayoutError, match=r"ring \(--cp-comm p2p\) does not run sliding-window .* all_gather or a2a"):
        run_passes(g, [ContextParallel(2)])
    with pytest.raises(LayoutError, match=r"PyTorch's context_parallel .* needs one"):
        run_passes(g, [ContextParallel(2, "all_gather", torch=True)])


def _cp_attention(window: int, seq: int, cp: int, comm: str, balance: bool = True) -> tuple[list[AttentionAttrs], int]:
    """The forward attention calls of the first layer on the simulated rank, and the split graph's model FLOPs x cp."""
    from echosim.passes.context_parallel import ContextParallel, ContextParallelBackward

    cfg = TINY_LLAMA.with_(layers=1, sliding_window=window, global_layer_step=0, seq_len=seq)
    g = run_passes(capture(cfg), [ContextParallel(cp, comm, balance), Autodiff(), ContextParallelBackward()])
    calls = [n.attrs for n in g if n.phase is Phase.FORWARD and isinstance(n.attrs, AttentionAttrs)]
    return calls, graph_flops(g).model * cp


@pytest.mark.parametrize("window", [8, 24, 100])
@pytest.mark.parametrize(("cp", "balance"), [(2, True), (4, True), (4, False)])
def test_all_gathered_context_parallel_attends_the_busiest_ranks_band(window: int, cp: int, balance: bool) -> None:
    """All-gathered K/V under a window: the simulated rank is the one with the most (query, key) pairs (a middle
    rank of the balanced layout, the last one without it), and cp ranks count the model's FLOPs exactly."""
    seq = 64
    cfg = TINY_LLAMA.with_(layers=1, sliding_window=window, global_layer_step=0, seq_len=seq)
    base = graph_flops(run_passes(capture(cfg), [Autodiff()])).model
    calls, model = _cp_attention(window, seq, cp, "all_gather", balance)
    assert model == pytest.approx(base, rel=1e-9)
    if balance:
        c = seq // (2 * cp)
        ranks = [[(c, (j + 1) * c) for j in (r, 2 * cp - 1 - r)] for r in range(cp)]
        busiest = max(ranks, key=lambda chunks: sum(brute_pairs(q, kv, window) for q, kv in chunks))
    else:
        busiest = [(seq // cp, seq)]
    assert [(a.q_len, a.kv_len, a.window) for a in calls] == [(q, kv, window) for q, kv in busiest]
    simulated = sum(band_pairs(a.q_len, a.kv_len, window) for a in calls)
    assert simulated == max(
        sum(brute_pairs(q, kv, window) for q, kv in chunks)
        for chunks in (ranks if balance else [busiest])  # every rank's pairs; the simulated one's are the most
    )
    assert simulated * cp >= brute_pairs(seq, seq, window)


@pytest.mark.parametrize("window", [8, 100])
def test_head_parallel_context_parallel_runs_the_window_whole_on_a_share_of_the_heads(window: int) -> None:
    """a2a (Ulysses): the attention sees every token of 1/cp of the heads, its window as without cp."""
    calls, model = _cp_attention(window, 64, 2, "a2a")
    cfg = TINY_LLAMA.with_(layers=1, sliding_window=window, global_layer_step=0, seq_len=64)
    assert model == graph_flops(run_passes(capture(cfg), [Autodiff()])).model
    (a,) = calls
    assert (a.heads, a.kv_heads, a.q_len, a.kv_len, a.window) == (2, 1, 64, 64, window)


def test_golden_local_global_block_through_tp_autodiff_and_pipeline() -> None:
    """Golden IR of a (local, global) block: the window survives tensor parallelism and autodiff, and
    pipeline stages hold whole blocks."""
    from conftest import check_golden

    from echosim.ir import print_graph, verify
    from echosim.passes.pipeline import PipelineParallel
    from echosim.passes.tensor_parallel import TensorParallel

    g = capture(TINY_LLAMA.with_(layers=4, seq_len=32, sliding_window=8, global_layer_step=2))
    joint = run_passes(g, [TensorParallel(2), Autodiff()])
    text = print_graph(joint)
    assert text.count("causal window=8") == 2  # forward and backward of the local layer
    check_golden("tp2_autodiff_local_global_llama.txt", text)
    import json

    from echosim.ir.serialize import graph_from_data, graph_to_data

    assert print_graph(graph_from_data(json.loads(json.dumps(graph_to_data(joint))))) == text  # the capture cache
    stages = PipelineParallel(2).split(joint)
    assert [s.layers for s in stages] == [1, 1]
    for s in stages:
        verify(s.graph)
        assert print_graph(s.graph).count("causal window=8") == 2


def test_hf_gemma3_layer_types_give_five_local_layers_to_one_global(tmp_path) -> None:
    pytest.importorskip("transformers")
    import json

    from echosim.frontend import hf
    from echosim.frontend.spec import CaptureSpec

    config = {"model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 12,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256,
              "sliding_window": 32, "sliding_window_pattern": 6, "max_position_embeddings": 256}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    cap, _ = hf.capture_config(hf.build_config(tmp_path / "config.json"), CaptureSpec(1, 128), "g3")
    layers = [(n.attrs.window, cap.graph.multiplicity(n)) for n in cap.graph if n.op is OpKind.ATTENTION]
    # the first five local layers fold; the global ones (5, 11) have no window
    assert sum(m for w, m in layers if w == 32) == 10 and sum(m for w, m in layers if w == 0) == 2
