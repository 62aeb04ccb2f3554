"""oneDNN's weight reorders around a CPU LSTM layer's calls (cpu.rnn_weight_reorder_bytes): PyTorch hands the RNN
primitive plain weights, and each call reorders them into its blocked layout (and, backward, the weight gradients
back out of it)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from echosim.backends import cpu
from echosim.compiler import lower
from echosim.frontend.zoo_torch import TorchZooModel, lstm_lm_module
from echosim.ir.names import input_proj_name, recurrent_weight_use
from echosim.ir.ops import OpKind
from echosim.plan import Cluster, Plan

SPEC = replace(cpu.CPU_X86, op_overhead_us=1.5, cache_bytes=2**14, cache_GBps=80.0)
LAYERS, HIDDEN, VOCAB, STEPS, BATCH = 2, 32, 64, 6, 2


def _graph() -> object:
    model = TorchZooModel(
        "lstm-2-layers", lambda: lstm_lm_module(LAYERS, HIDDEN, VOCAB, STEPS), ((("batch", "seq"), "int64"),), "", ""
    )
    plan = Plan(micro_batch=BATCH, global_batch=BATCH, seq_len=STEPS, dtype="fp32")
    return lower(model, plan, Cluster("cpu-x86", 1, 2)).stages[0].graph


def test_recurrent_weight_use_names_the_layer_calls_nodes_only() -> None:
    assert recurrent_weight_use(input_proj_name("lstm.l0")) == "forward"
    assert recurrent_weight_use("lstm.l0.input_proj.wgrad") == "wgrad"
    assert recurrent_weight_use("lstm.l1.steps.h.wgrad") == "wgrad"
    for other in ("lstm.l0.input_proj.dgrad", "lstm.l0.step3.h", "lstm.l0.step3.h.dgrad", "decoder", "input_proj_x"):
        assert recurrent_weight_use(other) == "", other


def test_each_layer_reorders_its_two_weights_once_forward_and_twice_backward() -> None:
    """Per layer (input dim = hidden here): forward the input and recurrent weights (4h x h each) into the
    primitive's layout; backward both into the backward layout and both gradients back: 3 x 2 weights in all."""
    g = _graph()
    weight = 4 * HIDDEN * HIDDEN * 4  # fp32, 4 gates
    per_node = {n.name: cpu.rnn_weight_reorder_bytes(n) for n in g if not n.op.is_collective}
    moved = {name: b for name, b in per_node.items() if b}
    assert sum(sum(b) for b in moved.values()) == LAYERS * 3 * 2 * weight
    for layer in range(LAYERS):
        assert moved[f"lstm.l{layer}.input_proj"] == [weight, weight]
        assert moved[f"lstm.l{layer}.input_proj.wgrad"] == [weight, weight]
        assert moved[f"lstm.l{layer}.steps.h.wgrad"] == [weight, weight]
    assert len(moved) == 3 * LAYERS


def test_the_reorders_add_out_of_place_copies_to_those_nodes_and_nothing_elsewhere(monkeypatch) -> None:
    g = _graph()
    backend = cpu.CPUBackend(SPEC)
    weight = 4 * HIDDEN * HIDDEN * 4
    # one reorder: read the weight, write it out of place (write-allocate), beyond the 16 KiB cache here
    stream = SPEC.ddr_GBps * 1e9 * SPEC.stream_fraction
    reorder = (2 * weight + weight) / stream + SPEC.op_overhead_us * 1e-6
    assert 2 * weight > SPEC.cache_bytes
    assert cpu.reorder_time_s(SPEC, weight) == pytest.approx(reorder)
    nodes = [n for n in g if not n.op.is_collective]
    with_reorders = {n.name: backend.op_time_s(n, 4096) for n in nodes}
    monkeypatch.setattr(cpu, "rnn_weight_reorder_bytes", lambda node: [])
    without = {n.name: backend.op_time_s(n, 4096) for n in nodes}
    extra = {name: with_reorders[name] - without[name] for name in without if with_reorders[name] != without[name]}
    assert set(extra) == {f"lstm.l{i}.{part}" for i in range(LAYERS) for part in
                          ("input_proj", "input_proj.wgrad", "steps.h.wgrad")}  # fmt: skip
    assert all(v == pytest.approx(2 * reorder) for v in extra.values())


def test_op_costs_are_cached_apart_for_an_input_projection_and_a_plain_matmul_of_its_shape() -> None:
    from echosim.ir.graph import Graph
    from echosim.ir.ops import MatmulAttrs
    from echosim.ir.types import DType, TensorSpec
    from echosim.timeline.lower import _COSTS, Coster, io_bytes

    backend = cpu.CPUBackend(SPEC)
    g = Graph("rnn-cache-keys")
    x = g.add(OpKind.INPUT, (), TensorSpec((12, 32), DType.FP32), name="x")
    w = g.add(OpKind.INPUT, (), TensorSpec((128, 32), DType.FP32), name="w")
    mm, out = MatmulAttrs(12, 128, 32), TensorSpec((12, 128), DType.FP32)
    a = g.add(OpKind.MATMUL, (x, w), out, mm, name=input_proj_name("lstm.l0"))
    b = g.add(OpKind.MATMUL, (x, w), out, mm, name="proj")
    for order in ((a, b), (b, a)):
        _COSTS.clear()
        coster = Coster(g, backend, {})
        for nid in order:
            assert coster(g[nid]) == backend.op_time_s(g[nid], io_bytes(g, g[nid])), g[nid].name
    assert backend.op_time_s(g[a], 0) > backend.op_time_s(g[b], 0)


def test_a_gpu_backend_prices_the_same_nodes_without_reorders() -> None:
    from echosim.backends.devices import DEVICES
    from echosim.backends.gpu import GPUBackend

    g = _graph()
    gpu = GPUBackend(DEVICES["h200"])
    for n in g:
        if cpu.rnn_weight_reorder_bytes(n):
            assert gpu.op_time_s(n, 4096) == gpu.op_time_s(replace(n, name=f"{n.name}_plain"), 4096)
