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
    assert recurrent_weight_use(input_proj_name("lstm.l0.lstm")) == "forward"
    assert recurrent_weight_use("lstm.l0.lstm.input_proj.wgrad") == "wgrad"
    assert recurrent_weight_use("lstm.l1.lstm.steps.h.wgrad") == "wgrad"
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
        assert moved[f"lstm.l{layer}.lstm.input_proj"] == [weight, weight]
        assert moved[f"lstm.l{layer}.lstm.input_proj.wgrad"] == [weight, weight]
        assert moved[f"lstm.l{layer}.lstm.steps.h.wgrad"] == [weight, weight]
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
    assert set(extra) == {f"lstm.l{i}.lstm.{part}" for i in range(LAYERS) for part in
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
    a = g.add(OpKind.MATMUL, (x, w), out, mm, name=input_proj_name("lstm.l0.lstm"))
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


def test_cpu_nonllm_ops_reads_onednn_verbose_reorders_around_each_rnn_primitive() -> None:
    """benchmarks/cpu_nonllm_ops.py: reorders before a forward primitive, before a backward one, and as many after
    the backward as went in (the weight gradients back); the bias copy and other primitives apart."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "cpu_nonllm_ops.py"
    spec = importlib.util.spec_from_file_location("cpu_nonllm_ops", path)
    assert spec and spec.loader
    ops = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ops)

    def line(kind: str, impl: str, prop: str, ms: float) -> str:
        return (
            f"onednn_verbose,v1,primitive,exec,cpu,{kind},{impl},{prop},src:f32 dst:f32,attr-scratchpad:user,,1x4,{ms}"
        )

    layer = [line("reorder", "jit:uni", "undef", 0.3), line("reorder", "jit:uni", "undef", 0.2),
             line("rnn", "ref", "forward_training", 5.0)]  # fmt: skip
    bias_copy = line("reorder", "jit_direct_copy:uni", "undef", 0.01)
    back = [line("reorder", "jit:uni", "undef", 0.1), line("reorder", "jit:uni", "undef", 0.1),
            line("rnn", "ref", "backward", 9.0), line("reorder", "jit:uni", "undef", 0.25),
            line("reorder", "jit:uni", "undef", 0.15), bias_copy]  # fmt: skip
    log = "\n".join([*layer, *layer, *back, *back, "some other output"])
    got = ops.onednn_per_step(log, steps=2)
    assert got["rnn_forward_s"] == pytest.approx(2 * 5.0e-3 / 2)
    assert got["rnn_backward_s"] == pytest.approx(2 * 9.0e-3 / 2)
    assert got["reorders_before_forward_s"] == pytest.approx(2 * 0.5e-3 / 2)
    assert got["reorders_before_backward_s"] == pytest.approx(2 * 0.2e-3 / 2)
    assert got["gradient_reorders_after_backward_s"] == pytest.approx(2 * 0.4e-3 / 2)
    assert got["other_s"] == pytest.approx(2 * 0.01e-3 / 2)
