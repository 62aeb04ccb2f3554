"""Eager autograd's layout copies: a gradient reshaped across its strides is copied (Framework.layout_copies)."""

from __future__ import annotations

import random
from functools import cache
from pathlib import Path

import pytest

from echosim.backends.devices import DEVICES
from echosim.backends.gpu import GPUBackend
from echosim.compiler import lower
from echosim.frameworks import FRAMEWORKS
from echosim.ir.graph import Graph, Node
from echosim.ir.ops import ElementwiseAttrs, Phase
from echosim.ir.strides import contiguous_strides, permutation, permuted_strides, view_strides
from echosim.passes.flops import io_bytes
from echosim.plan import Cluster, Plan

BATCH, HIDDEN, HEADS, LAYERS = 2, 64, 4, 2
TOKENS = (224 // 16) ** 2 + 1
FACTORY = """
import torch
from echosim.frontend.zoo_torch import vit_module


def fused():
    return vit_module({layers}, {hidden}, {heads}, 128), [(("batch", 3, 224, 224), torch.float32)]


def separate():
    return vit_module({layers}, {hidden}, {heads}, 128, separate_qkv=True), [(("batch", 3, 224, 224), torch.float32)]
"""


@cache
def _graph(tmp: Path, factory: str, framework: str) -> tuple[Graph, object]:
    src = tmp / "tiny_vit.py"
    src.write_text(FACTORY.format(layers=LAYERS, hidden=HIDDEN, heads=HEADS))
    plan = Plan(micro_batch=BATCH, global_batch=BATCH, dtype="bf16", framework=framework, attention="flash")
    compiled = lower(f"{src}:{factory}", plan, Cluster(backend="h200", devices=1))
    return compiled.graph, compiled


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("layout_copies")


def _copies(g: Graph) -> list[Node]:
    return [n for n in g if isinstance(n.attrs, ElementwiseAttrs) and n.name.endswith(".grad_copy")]


def test_view_strides_agree_with_torch_view() -> None:
    """Whether a reshape of a permuted tensor is a view, and its strides, as torch.Tensor.view decides."""
    torch = pytest.importorskip("torch")
    rng = random.Random(0)
    for _ in range(2000):
        shape = tuple(rng.choice([1, 2, 3, 4, 6]) for _ in range(rng.randint(1, 4)))
        perm = list(range(len(shape)))
        rng.shuffle(perm)
        t = torch.empty(shape, device="meta").permute(perm)
        sizes, rest = [], t.numel()
        while rest > 1:
            d = rng.choice([d for d in range(2, rest + 1) if rest % d == 0])
            sizes.append(d)
            rest //= d
        new = tuple(sizes) or (1,)
        try:
            want: tuple[int, ...] | None = tuple(t.view(new).stride())
        except RuntimeError:
            want = None
        got = view_strides(tuple(t.shape), tuple(t.stride()), new)
        assert (got is None) == (want is None), (t.shape, t.stride(), new)
        if got is not None and want is not None:
            kept = [s != 1 for s in new]  # a size-1 dimension's stride is free
            assert [g for g, k in zip(got, kept, strict=True) if k] == [w for w, k in zip(want, kept, strict=True) if k]


def test_permutation_and_held_strides() -> None:
    assert permutation((2, 5, 3, 4, 7), (3, 2, 4, 5, 7)) == (2, 0, 3, 1, 4)
    assert permutation((2, 4, 4), (4, 2, 4)) is None  # two dims of 4: which went where is not known
    assert permuted_strides((2, 3, 4, 5), (0, 2, 1, 3)) == (60, 5, 15, 1)  # (b, h, s, d) held as (b, s, h, d)
    assert contiguous_strides((2, 3, 4)) == (12, 4, 1)


def test_fused_qkv_gradient_is_copied_once_per_layer_under_eager(tmp: Path) -> None:
    """q, k, v = qkv(x).view(b, s, 3, h, d).permute(2, 0, 3, 1, 4): backward stacks dq, dk, dv (3, b, h, s, d),
    permutes back to (b, s, 3, h, d) and reshapes to (b, s, 3 * hidden): not a view, so one copy a layer, one
    read and one write of the qkv gradient at STREAM bandwidth."""
    g, _ = _graph(tmp, "fused", "eager")
    copies = _copies(g)
    stacks = [n for n in g if n.name.endswith("permute.grad_cat")]
    assert copies and len(copies) == len(stacks)  # one per (folded) layer
    backend = GPUBackend(DEVICES["h200"])
    for n in copies:
        assert n.phase is Phase.BACKWARD and n.out.shape == (BATCH, TOKENS, 3, HEADS, HIDDEN // HEADS)
        assert g[g[n.inputs[0]].inputs[0]].name.endswith("permute.grad_cat")
        nbytes = 2 * BATCH * TOKENS * 3 * HIDDEN * 2  # bf16, read once and written once
        assert io_bytes(g, n) == nbytes
        dev = backend.device
        assert backend.op_time_s(n, nbytes) == pytest.approx(
            nbytes / (dev.hbm_stream_GBps * 1e9) + dev.kernel_overhead_us * 1e-6
        )


def test_separate_projections_need_no_copy(tmp: Path) -> None:
    """p(x).view(b, s, h, d).transpose(1, 2): the attention kernel writes dq in q's (b, s, h, d) order, so the
    transpose back is row-major and the reshape a view."""
    g, _ = _graph(tmp, "separate", "eager")
    assert not _copies(g)


def test_only_eager_pytorch_frameworks_copy(tmp: Path) -> None:
    """Megatron / TE, torchtitan, MaxText (compiled or fused kernels) keep the graph as it was."""
    assert {name for name, f in FRAMEWORKS.items() if f.layout_copies} >= {"eager", "eager-amp"}
    assert not FRAMEWORKS["megatron"].layout_copies and not FRAMEWORKS["torchtitan-2025-compile"].layout_copies
    eager, c_eager = _graph(tmp, "fused", "eager")
    mega, c_mega = _graph(tmp, "fused", "megatron")
    assert not _copies(mega)
    assert len(_copies(_graph(tmp, "fused", "eager-amp")[0])) == len(_copies(eager))
    assert c_eager.report.step_time_s > c_mega.report.step_time_s  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("arch", "attention", "copies"), [("llama", "flash", 0), ("gpt", "flash", 0), ("gpt", "math", 3)]
)
def test_llm_attention_copies_follow_the_kernels_layout(arch: str, attention: str, copies: int) -> None:
    """``q.view(b, s, h, d).transpose(1, 2)``: a fused kernel's dq is laid out as q, (b, s, h, d), so the gradient
    views straight back (Llama's RoPE in between keeps that layout: elementwise outputs follow their input); the
    math path's dq comes out of a batched GEMM head-major, and reshaping it into (b, s, h * d) copies, once for each
    of q, k and v."""
    from echosim.frontend.zoo import ArchConfig

    kv = {"kv_heads": 2} if arch == "llama" else {}
    cfg = ArchConfig(arch, layers=2, hidden=256, heads=4, vocab=1000, seq_len=96, **kv)  # type: ignore[arg-type]
    plan = Plan(micro_batch=2, global_batch=2, seq_len=96, framework="eager", attention=attention, dtype="bf16")
    g = lower(cfg, plan, Cluster(backend="h100-sxm", devices=1)).graph
    assert len(_copies(g)) == copies
