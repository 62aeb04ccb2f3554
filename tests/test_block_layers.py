"""Repeated blocks of several layers: the memory model counts per layer inside the block.

The zoo folds interleaved layers (Gemma 3's five local layers then a global one, gpt-oss's local/global
pairs, Llama 4 Maverick's dense/MoE pairs) into one repeated block of several layers. A layer boundary is
what full recompute checkpoints and what a remat policy's ``decoder_layer_input`` names, so a model of N
identical layers folded as N/k blocks of k must give the same memory terms as the same model unfolded.
Identical layers: a sliding window as long as the sequence is full causal attention (same FLOPs, same
saved values), and ``global_layer_step`` k folds the layers into blocks of k.
"""

from __future__ import annotations

import pytest

from echosim import Cluster, Plan, compile
from echosim.frontend.zoo import ArchConfig
from echosim.ir.graph import Graph, Node
from echosim.ir.ops import OpKind
from echosim.ir.serialize import graph_from_data, graph_to_data
from echosim.ir.types import DType, TensorSpec

LAYERS = 12
FLAT = ArchConfig("llama", layers=LAYERS, hidden=256, heads=8, kv_heads=4, vocab=512, ffn=768, seq_len=128)


def _folded(k: int) -> ArchConfig:
    """The same model, its layers marked local with a window the length of the sequence, every k-th global."""
    return FLAT.with_(sliding_window=FLAT.seq_len, global_layer_step=k)


def _memory(cfg: ArchConfig, **plan: object) -> dict[str, object]:
    report = compile(cfg, Plan(**{"micro_batch": 2, "global_batch": 16, **plan}), Cluster("h100-sxm", 8, 8))
    (row,) = [m for m in report.memory if m["stage"] == 0][:1]
    return dict(row)


PLANS = [
    {"dp": 8},
    {"dp": 8, "recompute": "full"},
    {"dp": 8, "recompute": "selective"},
    {"dp": 8, "recompute": "custom"},  # MaxText: decoder_layer_input kept, the rest replayed
    {"dp": 8, "recompute": "minimal"},
    {"dp": 8, "recompute": "op"},  # torchtitan per-op SAC: every other mm, counted per layer
    {"dp": 8, "zero": 3, "recompute": "full"},  # FSDP gathers each layer's weights
    {"dp": 4, "tp": 2, "sp": True, "recompute": "full"},
    {"dp": 8, "recompute": "full", "offload_layers": 5},  # Megatron CPU offloading counts layers
    {"dp": 2, "pp": 4, "recompute": "full"},
]


@pytest.mark.parametrize("k", [2, 3, 6])
@pytest.mark.parametrize("plan", PLANS, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_blocks_of_k_identical_layers_have_the_unfolded_memory(k: int, plan: dict[str, object]) -> None:
    if plan.get("pp") and (LAYERS // k) % plan["pp"]:
        pytest.skip("blocks do not divide into the stages")
    flat, folded = _memory(FLAT, **plan), _memory(_folded(k), **plan)
    for term in ("activations", "transient", "params", "grads", "optimizer", "fragmentation", "peak"):
        assert folded[term] == flat[term], term
    assert folded["layers"] == flat["layers"]  # layers, not blocks


def test_full_recompute_of_a_six_layer_block_keeps_six_layer_inputs() -> None:
    """Closed form: full recompute keeps one hidden-state tensor per layer (bf16 [micro_batch, seq, hidden])
    plus what the layers outside keep; with blocks of six the count stays the layers', not the blocks'."""
    plan = {"dp": 8, "recompute": "full"}
    none_flat = _memory(FLAT.with_(layers=6), **plan)["activations"]
    per_layer = 2 * FLAT.seq_len * FLAT.hidden * 2  # micro_batch 2, bf16
    assert _memory(_folded(6), **plan)["activations"] == none_flat + (LAYERS - 6) * per_layer


def _node(nid: int, scope: str) -> Node:
    return Node(nid, OpKind.ELEMENTWISE, (), TensorSpec((4,), DType.BF16), scope=scope)


def test_layer_of_names_the_numbered_child_of_a_block_of_several_layers() -> None:
    g = Graph("g", {"layers.0": 8}, {"layers.0": 6})
    assert g.layer_of(_node(0, "layers.0.3.attn.q_proj")) == "layers.0.3"
    assert g.layer_of(_node(1, "layers.0")) == "layers.0"  # a collective put on the block
    assert g.layer_of(_node(2, "lm_head")) is None
    assert g.layer_count() == 48
    one = Graph("g", {"layers.0": 8})
    assert one.layer_of(_node(0, "layers.0.3.attn")) == "layers.0"  # a one-layer block: the block
    assert one.layer_count() == 8


def test_block_layers_survive_copy_and_serialisation() -> None:
    g = Graph("g", {"layers.0": 8}, {"layers.0": 6})
    assert g.copy().block_layers == {"layers.0": 6}
    assert graph_from_data(graph_to_data(g)).block_layers == {"layers.0": 6}
    data = graph_to_data(Graph("g", {"layers.0": 8}))
    del data["block_layers"]  # written before the field existed: every block is one layer
    assert graph_from_data(data).block_layers == {}


def test_the_zoo_declares_its_interleaved_blocks() -> None:
    from echosim.frontend.capture import _capture_arch_now
    from echosim.frontend.spec import CaptureSpec

    graph = _capture_arch_now(_folded(6), CaptureSpec(micro_batch=1, seq_len=FLAT.seq_len, dtype="bf16"), "g")[0]
    assert graph.repeats == {"layers.0": 2} and graph.block_layers == {"layers.0": 6}
