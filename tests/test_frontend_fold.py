"""Folding repeated layers: FLOPs and parameters are invariant, chains fold, side-by-side copies do not.

One mechanism serves every frontend (``frontend/fold.py``): torch.export and torch.fx
capture two copies of the run and prove they chain; ONNX files prove it over all copies.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from echosim.frontend import CaptureSpec, capture_named
from echosim.frontend.irfold import fold_layers
from echosim.ir import verify
from echosim.ir.graph import Graph
from echosim.ir.ops import MatmulAttrs, OpKind, ParamAttrs
from echosim.ir.types import DType, TensorSpec
from echosim.passes.autodiff import Autodiff
from echosim.passes.base import run_passes
from echosim.passes.flops import graph_flops


def stack(depth: int, width: int, chained: bool, head: int = 0) -> Graph:
    """``depth`` linear layers ``layers.i``: a chain, or all reading the input side by side."""
    g = Graph("stack")
    x = g.add(OpKind.INPUT, (), TensorSpec((4, width), DType.BF16), name="x")
    g.inputs.append(x)
    h, outs = x, []
    for i in range(depth):
        w = g.add(OpKind.PARAMETER, (), TensorSpec((width, width), DType.BF16), ParamAttrs(), scope=f"layers.{i}")
        src = h if chained else x
        h = g.add(
            OpKind.MATMUL,
            (src, w),
            TensorSpec((4, width), DType.BF16),
            MatmulAttrs(4, width, width),
            scope=f"layers.{i}",
        )
        outs.append(h)
    if head:
        w = g.add(OpKind.PARAMETER, (), TensorSpec((head, width), DType.BF16), ParamAttrs(), scope="head")
        h = g.add(OpKind.MATMUL, (h, w), TensorSpec((4, head), DType.BF16), MatmulAttrs(4, head, width), scope="head")
    loss = g.add(OpKind.REDUCTION, (h if chained else outs[-1],), TensorSpec((1,), DType.BF16), name="loss")
    g.outputs = [loss]
    return g


@settings(max_examples=25, deadline=None)
@given(depth=st.integers(2, 40), width=st.sampled_from([8, 16, 64]), head=st.sampled_from([0, 10]))
def test_folding_a_chain_keeps_flops_and_parameters(depth: int, width: int, head: int) -> None:
    """The stack reads the raw input, so its first layer has no input gradient: the run starts after it."""
    g = stack(depth, width, chained=True, head=head)
    folded = fold_layers(g, [])
    verify(folded)
    assert folded.repeats == ({"layers.1": depth - 1} if depth > 2 else {})
    assert folded.param_count() == g.param_count()
    assert graph_flops(run_passes(folded, [Autodiff()])) == graph_flops(run_passes(g, [Autodiff()]))


@given(depth=st.integers(2, 12))
def test_identical_layers_side_by_side_are_not_folded(depth: int) -> None:
    g = stack(depth, 8, chained=False)
    assert fold_layers(g, []) is g


CHAIN = """
import torch
from torch import nn


def block(i, o):
    return nn.Sequential(nn.Linear(i, o), nn.ReLU())


class Chain(nn.Module):
    def __init__(self, glue):
        super().__init__()
        self.glue = glue
        self.layers = nn.ModuleList([block(8, 16), *[block(16, 16) for _ in range(3)], block(16, 4)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x) * 2 if self.glue else layer(x)
        return x


def model():
    return Chain(False), [(("batch", 8), torch.float32)]


def glued():
    return Chain(True), [(("batch", 8), torch.float32)]
"""


def test_layers_after_the_run_keep_their_real_index(tmp_path: Path) -> None:
    """[8->16, 16->16 x3, 16->4]: the run is folded and the last layer is still layers.4."""
    (tmp_path / "chain.py").write_text(CHAIN)
    graph, _, params = capture_named(f"{tmp_path}/chain.py:model", CaptureSpec(micro_batch=2))
    assert graph.repeats == {"layers.1": 3}
    assert {n.scope for n in graph if n.op is OpKind.MATMUL} == {"layers.0.0", "layers.1.0", "layers.4.0"}
    assert graph.param_count() == params == 8 * 16 + 16 + 3 * (16 * 16 + 16) + 16 * 4 + 4


def test_work_between_layers_outside_them_prevents_folding(tmp_path: Path) -> None:
    """Code between the layers (here a scale in the parent's loop) would not repeat with them."""
    (tmp_path / "chain.py").write_text(CHAIN)
    graph, _, _ = capture_named(f"{tmp_path}/chain.py:glued", CaptureSpec(micro_batch=2))
    assert graph.repeats == {}
    assert sum(1 for n in graph if n.op is OpKind.MATMUL) == 5


@pytest.mark.parametrize("depth", [2, 3, 4])
def test_a_chain_behind_a_differentiable_value_folds_from_its_first_layer(depth: int) -> None:
    g = stack(depth, 8, chained=True)
    embed = g.add(OpKind.PARAMETER, (), TensorSpec((4, 8), DType.BF16), ParamAttrs(), scope="embed")
    first = next(n for n in g if n.op is OpKind.MATMUL)
    g.replace(first.id, inputs=(embed, first.inputs[1]))
    g.nodes = {k: g.nodes[k] for k in sorted(g.nodes, key=lambda k: (k != embed, k))}
    folded = fold_layers(g, [])
    assert folded.repeats == {"layers.0": depth}
    assert graph_flops(run_passes(folded, [Autodiff()])) == graph_flops(run_passes(g, [Autodiff()]))


class _Stack(torch.nn.Module):
    """[8->16, 16->16 x3, 16->4] as a chain of layers, or the three 16->16 ones side by side."""

    def __init__(self, chained: bool) -> None:
        super().__init__()
        self.chained = chained

        def block(i: int, o: int) -> torch.nn.Module:
            return torch.nn.Sequential(torch.nn.Linear(i, o), torch.nn.ReLU())

        self.layers = torch.nn.ModuleList([block(8, 16), *[block(16, 16) for _ in range(3)], block(16, 4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.chained:
            for layer in self.layers:
                x = layer(x)
            return x.sum()
        x = self.layers[0](x)
        x = sum(layer(x) for layer in self.layers[1:-1])
        return self.layers[-1](x).sum()


class _Indexed(_Stack):
    """A forward that names its layers by index: the shortened list cannot run it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(5):
            x = self.layers[i](x)
        return x.sum()


@pytest.mark.parametrize("chained", [True, False])
def test_torch_fx_folds_through_the_same_chain_proof(chained: bool) -> None:
    """torch.fx folds as torch.export does: a chain folds with its real indices kept; copies side by side stay."""
    from echosim.frontend.fx import capture_module

    with torch.device("meta"):
        module = _Stack(chained)
    x = torch.zeros(2, 8, device="meta")
    folded = capture_module(module, (x,)).graph
    whole = capture_module(module, (x,), fold=False).graph
    assert folded.repeats == ({"layers.1": 3} if chained else {})
    assert "layers.4.0" in {n.scope for n in folded if n.op is OpKind.MATMUL}
    assert folded.param_count() == whole.param_count() == sum(p.numel() for p in module.parameters())
    assert graph_flops(run_passes(folded, [Autodiff()])) == graph_flops(run_passes(whole, [Autodiff()]))


def test_a_module_that_indexes_its_layers_is_captured_unfolded() -> None:
    from echosim.frontend.fx import capture_module

    with torch.device("meta"):
        module = _Indexed(chained=True)
    cap = capture_module(module, (torch.zeros(2, 8, device="meta"),))
    assert cap.graph.repeats == {}
    assert sum(1 for n in cap.graph if n.op is OpKind.MATMUL) == 5
    # said, since --pp then refuses a model whose layers visibly repeat
    [note] = [n for n in cap.notes if "not folded" in n]
    assert note.startswith("layers (3 identical entries from entry 1) captured as they are, not folded: the model does")


@pytest.mark.parametrize(("dropout_p", "positional"), [(0.1, False), (0.1, True), (0.0, False)])
def test_fx_keeps_sdpa_dropout(dropout_p: float, positional: bool) -> None:
    """F.scaled_dot_product_attention's dropout_p reaches the IR (keyword or 5th argument): an
    unfused kernel then keeps and moves the score-sized mask."""
    import torch.nn.functional as F

    from echosim.frontend.fx import capture_module
    from echosim.ir.ops import AttentionAttrs

    class Attend(torch.nn.Module):
        def forward(self, q: torch.Tensor) -> torch.Tensor:
            if positional:
                return F.scaled_dot_product_attention(q, q, q, None, dropout_p, True)
            return F.scaled_dot_product_attention(q, q, q, dropout_p=dropout_p, is_causal=True)

    q = torch.zeros(2, 4, 16, 8, device="meta")
    attention = [n.attrs for n in capture_module(Attend(), (q,)).graph if isinstance(n.attrs, AttentionAttrs)]
    assert [(a.dropout, a.causal) for a in attention] == [(dropout_p > 0, True)]


@pytest.mark.parametrize(("layers", "dense"), [(4, 2), (5, 3), (5, 2), (6, 3), (3, 2)])
def test_a_zoo_moe_model_with_dense_first_layers_captures_every_layer(layers: int, dense: int) -> None:
    """No more MoE layers than dense ones: the dense run may be the longer, the one the fold picks; it folds to
    its own count (a count meant for the MoE run once gave 5 layers with 3 dense the parameters of 4)."""
    from echosim.frontend.capture import _capture_arch_now
    from echosim.frontend.zoo import ArchConfig

    cfg = ArchConfig(
        "moe", layers=layers, hidden=64, heads=4, kv_heads=2, vocab=256, ffn=176, seq_len=16, experts=4, top_k=2,
        moe_ffn=64, dense_layers=dense,
    )  # fmt: skip
    graph, _, params = _capture_arch_now(cfg, CaptureSpec(seq_len=16), "moe")
    assert params == graph.param_count() == cfg.param_count()
    assert graph.layer_count() + graph.unfolded_layers() == layers


def _kinds(*kinds: int) -> torch.nn.ModuleList:
    """A ModuleList whose entries are layers of the given kinds (kind k: a linear of width 8 + k)."""
    return torch.nn.ModuleList(torch.nn.Linear(8 + k, 8 + k) for k in kinds)


@pytest.mark.parametrize(
    ("kinds", "run"),
    [
        ((0, 0, 0, 1), (0, 3, 1)),  # identical entries: period 1
        ((0, 1, 0, 1, 0, 1), (0, 3, 2)),  # sliding and full attention alternating
        ((2, 0, 0, 0, 1, 0, 0, 0, 1), (1, 2, 4)),  # a different first layer, then three of one kind and one other
        ((0, 0, 0, 0, 1, 0, 0, 0, 0, 1), (0, 2, 5)),  # Gemma 3's 4 + 1 covers more than the four alike
        ((0, 1, 2, 3), None),
    ],
)
def test_longest_run_finds_interleaved_kinds_as_a_period(kinds: tuple[int, ...], run: tuple[int, int, int]) -> None:
    """(start, count, period): the run covering the most layers, then the shortest period."""
    from echosim.frontend.fold import longest_run

    root = torch.nn.Module()
    root.layers = _kinds(*kinds)
    found = longest_run(root)
    assert (found and (found.start, found.count, found.period)) == run


@pytest.mark.parametrize(
    ("settings", "same"),
    [
        ({"lambda_init": 0.2}, {"lambda_init": 0.36}),  # DiffLlama: a depth-dependent scale, the same cost
        ({"seed": 0}, {"seed": 1}),  # BigBird: its random-block seed is its layer's index
        ({"drop_prob": 0.0}, None),  # code branches on a rate being zero: a zero rate is another structure
        ({"window": 8}, None),  # an integer setting stays whole
    ],
)
def test_a_layers_float_magnitude_and_seed_are_not_its_structure(
    settings: dict[str, object], same: dict[str, object] | None
) -> None:
    from echosim.frontend.fold import signature

    def layer(**kw: object) -> torch.nn.Module:
        m = torch.nn.Linear(4, 4)
        vars(m).update(kw)
        return m

    other = same or {k: (0.1 if isinstance(v, float) else 16) for k, v in settings.items()}
    assert (signature(layer(**settings)) == signature(layer(**other))) == (same is not None)


class _Block(torch.nn.Module):
    def __init__(self, shifted: bool) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.shifted = shifted

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.roll(x, 1, 0) if self.shifted else x
        return x + self.lin(y)


class _Staged(torch.nn.Module):
    """A hierarchical model (Swin, ConvNeXt, a U-Net's levels): a list of stages, each a list of blocks, the
    deepest stage alternating two kinds of block (Swin's plain and shifted windows)."""

    def __init__(self) -> None:
        super().__init__()
        stages = [[_Block(False)], [_Block(i % 2 == 1) for i in range(6)]]
        self.stages = torch.nn.ModuleList(torch.nn.ModuleList(blocks) for blocks in stages)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage in self.stages:
            for block in stage:
                x = block(x)
        return x.sum()


def test_a_run_in_a_list_inside_a_list_folds() -> None:
    """The run is ``stages.1``'s six blocks (3 groups of 2); before, the fold read ``stages.1.0`` as entry 1 of
    ``stages``, compared the whole stage with the next, and captured every block unfolded with a note."""
    from echosim.frontend.aten import capture_export

    with torch.device("meta"):
        model, x = _Staged(), torch.zeros(4, 16)
    folded = capture_export(model, model, (x,), dtype=DType.FP32, name="m")
    whole = capture_export(model, model, (x,), dtype=DType.FP32, name="m", fold=False)
    assert folded.graph.repeats == {"stages.1.0": 3} and folded.graph.block_layers == {"stages.1.0": 2}
    assert not [n for n in folded.notes if "not folded" in n]
    trained = [run_passes(g, [Autodiff()]) for g in (folded.graph, whole.graph)]
    assert graph_flops(trained[0]).model == graph_flops(trained[1]).model
    assert trained[0].param_count() == trained[1].param_count()
