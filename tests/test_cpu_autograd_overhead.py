"""Autograd's host time per op of a CPU training step (CPUSpec.autograd_op_us): charged to forward and backward
ops, measured by the calibration on a chain of tiny layers."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from conftest import cpu_llama_stage_graph

from echosim.backends import cpu
from echosim.calibrate import bench
from echosim.calibrate.bench import Sample
from echosim.calibrate.fit import CPU_KNOBS, fit_spec, fitted_knobs, predict_cpu
from echosim.compiler import lower
from echosim.ir.ops import OpKind, Phase
from echosim.plan import Cluster, Plan

SPEC = replace(cpu.CPU_X86, op_overhead_us=1.5, cache_bytes=2 * 2**20, cache_GBps=80.0)


def _graph() -> object:
    return cpu_llama_stage_graph(2, hidden=64, ffn=172, vocab=256, seq_len=32)


def test_forward_and_backward_ops_pay_autograd_time_optimizer_steps_and_views_do_not() -> None:
    g = _graph()
    bare, with_autograd = cpu.CPUBackend(SPEC), cpu.CPUBackend(replace(SPEC, autograd_op_us=4.0))
    seen = set()
    for node in g:
        if node.op.is_collective:
            continue
        delta = with_autograd.op_time_s(node, 4096) - bare.op_time_s(node, 4096)
        if node.op in (OpKind.VIEW, OpKind.INPUT, OpKind.PARAMETER) or node.phase is Phase.OPTIMIZER:
            assert delta == 0, node.name
        else:
            assert delta == pytest.approx(4e-6), node.name
        seen.add(node.phase)
    assert {Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER} <= seen
    assert cpu.CPU_X86.autograd_op_us == 0.0  # uncalibrated: nothing charged


def test_the_chain_sample_is_its_layer_ops_each_with_the_bare_and_the_autograd_time() -> None:
    spec = replace(SPEC, autograd_op_us=3.0)
    s = Sample("autograd", "linear_silu", "fp32", m=bench.AUTOGRAD_LAYER_OPS, nbytes=256)
    assert predict_cpu(spec, s) == pytest.approx(5 * (cpu.memory_bound_time_s(spec, 256) + 3e-6))


def test_fit_separates_the_bare_op_overhead_from_autograds_time() -> None:
    truth = replace(SPEC, op_overhead_us=1.4, autograd_op_us=4.2)
    samples = [
        Sample("overhead", "add", "fp32", nbytes=96),
        Sample("autograd", "linear_silu", "fp32", m=bench.AUTOGRAD_LAYER_OPS, nbytes=256),
    ]
    samples = [replace(s, seconds=predict_cpu(truth, s)) for s in samples]
    knobs = [k for k in fitted_knobs(CPU_KNOBS, samples)]
    assert {k.name for k in knobs} == {"op_overhead_us", "autograd_op_us"}
    fitted = fit_spec(SPEC, knobs, samples, predict_cpu)
    assert math.isclose(fitted.op_overhead_us, 1.4, rel_tol=0.02)
    assert math.isclose(fitted.autograd_op_us, 4.2, rel_tol=0.02)


def test_the_calibration_measures_a_layer_of_the_tiny_chain() -> None:
    s = bench.autograd_sample()
    assert (s.kind, s.m) == ("autograd", bench.AUTOGRAD_LAYER_OPS)
    # five ops through autograd: more than five bare ops' dispatch, far less than a millisecond
    assert 1e-6 < s.seconds < 1e-3


def test_the_time_steps_of_a_fused_recurrent_layer_pay_no_per_op_host_time() -> None:
    from echosim.frontend.zoo_torch import TorchZooModel, lstm_lm_module
    from echosim.ir.names import all_steps_name, is_recurrent_step, step_name, step_of

    assert is_recurrent_step(step_name("lstm.l0", 7, "h")) and is_recurrent_step("lstm.l1.step18.cell.grad_acc")
    # the recurrent weight's gradient over all steps is part of the same fused call
    assert is_recurrent_step(all_steps_name("lstm.l0", "h") + ".wgrad")
    assert step_of(step_name("a.lstm.l1", 12, "h")) == ("a.lstm.l1", "h") and step_of("lstm.l0.step3.h.dgrad") is None
    assert not is_recurrent_step("lstm.l0.h0") and not is_recurrent_step("layers.step.h")  # an initial state, a module
    model = TorchZooModel("lstm", lambda: lstm_lm_module(1, 32, 64, 6), ((("batch", "seq"), "int64"),), "", "")
    plan = Plan(micro_batch=2, global_batch=2, seq_len=6, dtype="fp32")
    g = lower(model, plan, Cluster("cpu-x86", 1, 2)).stages[0].graph
    bare, with_autograd = cpu.CPUBackend(SPEC), cpu.CPUBackend(replace(SPEC, autograd_op_us=4.0))
    charged = {n.name for n in g if not n.op.is_collective and with_autograd.op_time_s(n, 64) > bare.op_time_s(n, 64)}
    steps = [n.name for n in g if is_recurrent_step(n.name) and n.op is not OpKind.VIEW]
    assert len(steps) >= 6 * 3 and not charged & set(steps)
    assert "lstm.l0.lstm.steps.h.wgrad" in steps
    assert any("input_proj" in name for name in charged)  # the layer's own call still pays it


def test_op_costs_are_cached_apart_for_nodes_whose_names_the_cpu_backend_reads() -> None:
    """A recurrent step's matmul and a plain one of the same shape, or autograd's in-place gradient sum and a
    plain add, share shape and phase but not cost: the op-cost cache must not hand one the other's time."""
    from echosim.ir.graph import Graph
    from echosim.ir.names import GRAD_ACCUMULATE, step_name
    from echosim.ir.ops import ElementwiseAttrs, MatmulAttrs
    from echosim.ir.types import DType, TensorSpec
    from echosim.timeline.lower import _COSTS, Coster, io_bytes

    backend = cpu.CPUBackend(replace(SPEC, autograd_op_us=50.0))
    g = Graph("cache-keys")
    add = ElementwiseAttrs("add")
    x = g.add(OpKind.INPUT, (), TensorSpec((1024, 1024), DType.FP32), name="x")
    mm = MatmulAttrs(1024, 1024, 1024)
    out = TensorSpec((1024, 1024), DType.FP32)
    pairs = [
        (g.add(OpKind.MATMUL, (x, x), out, mm, phase=Phase.BACKWARD, name=step_name("lstm.l0", 3, "h") + ".dgrad"),
         g.add(OpKind.MATMUL, (x, x), out, mm, phase=Phase.BACKWARD, name="proj.dgrad")),
        (g.add(OpKind.ELEMENTWISE, (x, x), out, add, phase=Phase.BACKWARD, name=f"w.{GRAD_ACCUMULATE}"),
         g.add(OpKind.ELEMENTWISE, (x, x), out, add, phase=Phase.BACKWARD, name="w.add")),
    ]  # fmt: skip
    for order in (1, -1):
        _COSTS.clear()
        coster = Coster(g, backend, {})
        for pair in pairs:
            for nid in pair[::order]:  # whichever comes first, each gets its own time
                assert coster(g[nid]) == backend.op_time_s(g[nid], io_bytes(g, g[nid])), g[nid].name
    assert all(
        backend.op_time_s(g[a], io_bytes(g, g[a])) != backend.op_time_s(g[b], io_bytes(g, g[b])) for a, b in pairs
    )
