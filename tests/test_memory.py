"""Memory analysis against closed forms (Korthikanti et al. 2022; Megatron mixed precision)."""

from __future__ import annotations

import pytest
from conftest import capture

from echosim.frontend.zoo import ArchConfig
from echosim.passes.attention import AttentionKernel
from echosim.passes.autodiff import Autodiff
from echosim.passes.base import run_passes
from echosim.passes.memory import activation_bytes, stage_memory
from echosim.passes.pipeline import PipelineParallel
from echosim.passes.recompute import Recompute
from echosim.passes.tensor_parallel import TensorParallel

CFG = ArchConfig("gpt", layers=4, hidden=1024, heads=16, vocab=1024, seq_len=512, dropout=0.1, tied_embeddings=True)
S, B, H, A = 512, 2, 1024, 16


@pytest.fixture(scope="module")
def graph():  # type: ignore[no-untyped-def]
    return capture(CFG, batch=B)


def first_stage(graph, passes):  # type: ignore[no-untyped-def]
    """Stage 0 of a 2-stage split holds the embedding and two layers."""
    return PipelineParallel(2).split(run_passes(graph, passes))[0].graph


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_activations_per_layer_match_korthikanti(graph, tp: int) -> None:  # type: ignore[no-untyped-def]
    """Korthikanti et al. 2022, Eq. 2 with TP and no SP: s*b*h*(10 + 24/t + 5*a*s/(h*t)) bytes per layer."""
    stage = first_stage(graph, [AttentionKernel(flash=False), TensorParallel(tp), Autodiff()])
    per_layer = S * B * H * (10 + 24 / tp + 5 * A * S / (H * tp))
    assert activation_bytes(stage) == pytest.approx(2 * per_layer, rel=1e-9)


def test_flash_attention_drops_the_score_matrices(graph) -> None:  # type: ignore[no-untyped-def]
    stage = first_stage(graph, [AttentionKernel(flash=True), Autodiff()])
    per_layer = S * B * H * 34  # plus fp32 softmax statistics b*a*s*4
    assert activation_bytes(stage) == pytest.approx(2 * (per_layer + B * A * S * 4), rel=1e-9)


def test_full_recompute_keeps_only_layer_inputs(graph) -> None:  # type: ignore[no-untyped-def]
    stage = first_stage(graph, [Autodiff(), Recompute("full")])
    assert activation_bytes(stage) == 2 * S * B * H * 2  # one fp16 [s, b, h] checkpoint per layer


def test_static_state_is_eighteen_bytes_per_parameter(graph) -> None:  # type: ignore[no-untyped-def]
    stage = first_stage(graph, [Autodiff()])
    n = stage.param_count()
    mem = stage_memory(stage, in_flight=2, capacity=80 * 2**30, local_params=n)
    assert (mem.params, mem.grads, mem.optimizer) == (2 * n, 4 * n, 12 * n)
    assert mem.activations == 2 * activation_bytes(stage)
    assert mem.fits


def test_does_not_fit_is_reported(graph) -> None:  # type: ignore[no-untyped-def]
    stage = first_stage(graph, [Autodiff()])
    mem = stage_memory(stage, in_flight=1, capacity=2**20, local_params=stage.param_count())
    assert not mem.fits and mem.peak > mem.capacity


@pytest.mark.parametrize("dp", [1, 8, 64])
def test_zero_stages_match_the_zero_paper(dp: int) -> None:
    """Rajbhandari et al. 2020, Fig. 1: (2 + 2 + K) * psi with K = 12, sharded stage by stage."""
    from echosim.passes.memory import StatePolicy

    psi, k = 7_500_000_000, 12

    def total(stage: int) -> float:
        p = StatePolicy.for_training("fp16", zero=stage, dp=dp, fp32_grads=False)
        return psi * (p.weight_bytes + p.grad_bytes + p.optimizer_bytes)

    assert total(0) == pytest.approx((2 + 2 + k) * psi)
    assert total(1) == pytest.approx(2 * psi + 2 * psi + k * psi / dp)
    assert total(2) == pytest.approx(2 * psi + (2 + k) * psi / dp)
    assert total(3) == pytest.approx((2 + 2 + k) * psi / dp)


def test_fp32_training_keeps_no_master_copy() -> None:
    from echosim.passes.memory import StatePolicy

    p = StatePolicy.for_training("fp32")
    assert (p.weight_bytes, p.grad_bytes, p.optimizer_bytes) == (4, 4, 8)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_selective_recompute_drops_the_attention_scores(graph, tp: int) -> None:  # type: ignore[no-untyped-def]
    """Korthikanti et al. 2022, Table 2, tensor parallel + selective recompute: s*b*h*(10 + 24/t)."""
    passes = [AttentionKernel(flash=False), TensorParallel(tp), Autodiff(), Recompute("selective")]
    stage = first_stage(graph, passes)
    assert activation_bytes(stage) == pytest.approx(2 * S * B * H * (10 + 24 / tp), rel=1e-9)


def test_added_nodes_are_those_appended_to_the_very_nodes_of_the_base_in_order() -> None:
    """:func:`added_nodes` (whole-list comparisons): the appended nodes when ``graph`` begins with ``base``'s node
    objects, ids and order; None when a node of ``base`` was replaced (an equal copy is not the same node), the
    order changed, or ``graph`` has fewer nodes."""
    from echosim.ir import DType, Graph, OpKind, TensorSpec
    from echosim.passes.memory import added_nodes

    base = Graph("base")
    spec = TensorSpec((8,), DType.BF16)
    x = base.add(OpKind.INPUT, (), spec)
    y = base.add(OpKind.ELEMENTWISE, (x,), spec)
    g = base.copy()
    z = g.add(OpKind.ELEMENTWISE, (y,), spec)
    assert added_nodes(g, base) == [g[z]]
    assert added_nodes(base.copy(), base) == []
    assert added_nodes(base, g) is None  # fewer nodes
    swapped = g.copy()
    swapped.replace(y, name="same op, another node object")
    assert added_nodes(swapped, base) is None
    reordered = g.copy()
    reordered.nodes = {y: g[y], x: g[x], z: g[z]}
    assert added_nodes(reordered, base) is None
    assert added_nodes(g, None) is None


def test_saved_policy_hash_kept_once_and_not_pickled() -> None:
    """SavedPolicy keeps its hash once computed (a search looks analyses up by it): equal policies hash alike, the
    value is the hash of its compared fields, and a pickled copy carries no hash (another process seeds strings
    differently) yet hashes and compares as the original."""
    import copy
    import pickle
    from dataclasses import fields, replace

    from echosim.passes.memory import SavedPolicy

    a = SavedPolicy()
    b = SavedPolicy()
    assert a == b and hash(a) == hash(b)
    assert hash(a) == hash(tuple(getattr(a, f.name) for f in fields(a)))
    assert "_hash" in a.__dict__
    c = pickle.loads(pickle.dumps(a))
    assert "_hash" not in c.__dict__ and c == a and hash(c) == hash(a)
    assert "_hash" not in copy.deepcopy(a).__dict__
    other = replace(a, fused_gated=not a.fused_gated)  # a changed copy is hashed anew, not with a's kept hash
    assert other != a and "_hash" not in other.__dict__
    assert hash(other) == hash(tuple(getattr(other, f.name) for f in fields(other)))
