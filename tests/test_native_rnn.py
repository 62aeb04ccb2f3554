"""GRU and Elman RNN layers (issue 15: recurrent layers costed per time step).

The frontends unroll them as they unroll an LSTM (one input-projection GEMM, then a small recurrent GEMM and one
gate kernel a step: cuDNN's form, which a GPU runs); on a CPU PyTorch runs them natively, one aten call at a time
(echosim.backends.cpu.NATIVE_CELLS), and only the LSTM through oneDNN's RNN primitive.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import replace
from functools import partial
from pathlib import Path

import networkx as nx
import pytest
from onnx import TensorProto, helper

from echosim.backends import cpu
from echosim.backends.compute import matmul_time_s
from echosim.backends.devices import DEVICES
from echosim.compiler import lower
from echosim.errors import EchosimError
from echosim.frontend import onnx as onnx_frontend
from echosim.frontend.recurrent import CELLS
from echosim.frontend.spec import CaptureSpec
from echosim.frontend.zoo_torch import TorchZooModel, lstm_lm_module
from echosim.ir.names import (
    RECURRENT_CELLS,
    cost_traits,
    is_cell_call,
    recurrent_cell,
    recurrent_layer_name,
    step_name,
)
from echosim.ir.ops import ElementwiseAttrs, MatmulAttrs, OpKind, Phase
from echosim.plan import Cluster, Plan

SPEC = replace(cpu.CPU_X86, op_overhead_us=2.0, autograd_op_us=4.0)


def _lm(cell: str, layers: int, hidden: int, vocab: int, steps: int) -> TorchZooModel:
    build = partial(lstm_lm_module, layers, hidden, vocab, steps, cell=cell)
    return TorchZooModel(f"{cell}-test", build, ((("batch", "seq"), "int64"),), "", "sequences")


def _graph(cell: str, backend: str = "cpu-x86", layers: int = 2, hidden: int = 32, steps: int = 6, batch: int = 4):
    model = _lm(cell, layers, hidden, 50, steps)
    plan = Plan(micro_batch=batch, global_batch=batch, seq_len=steps, dtype="fp32")
    return lower(model, plan, Cluster(backend, 1, 2)).stages[0].graph


def test_the_cell_table_and_the_names_agree() -> None:
    assert tuple(CELLS) == RECURRENT_CELLS
    assert [CELLS[c].gates for c in RECURRENT_CELLS] == [4, 3, 1, 1]
    layer = recurrent_layer_name("gru.l1", "gru")
    assert recurrent_cell(step_name(layer, 3, "h") + ".dgrad") == "gru"
    assert recurrent_cell(f"{layer}.input_proj.wgrad") == "gru"
    assert recurrent_cell(f"{layer}.steps.h.wgrad") == "gru"
    assert recurrent_cell("model.gru.proj") == "" and recurrent_cell("lstm.l0.h0") == ""
    # two nodes of one shape in layers of different cells may cost differently: their cache keys differ
    assert cost_traits(step_name("a.lstm", 0, "h")) != cost_traits(step_name("a.gru", 0, "h"))


@pytest.mark.parametrize(("cell", "torch_cell", "gates"), [("gru", "gru", 3), ("rnn", "rnn_tanh", 1)])
def test_a_gru_or_rnn_runs_its_time_steps_one_after_another(cell: str, torch_cell: str, gates: int) -> None:
    layers, hidden, steps, batch = 2, 64, 7, 8
    g = _graph(cell, "h100-sxm", layers, hidden, steps, batch)
    fwd = [n for n in g if n.phase is Phase.FORWARD]
    step = MatmulAttrs(m=batch, n=gates * hidden, k=hidden)
    rec = [n for n in fwd if n.attrs == step]
    assert len(rec) == layers * steps  # h0 (zeros) is multiplied too
    kernels = [n for n in fwd if isinstance(n.attrs, ElementwiseAttrs) and n.attrs.fn == f"{torch_cell}_cell"]
    assert len(kernels) == layers * steps
    assert {n.attrs.flops_per_element for n in kernels} == {CELLS[torch_cell].flops}
    proj = [n for n in fwd if n.name.endswith(".input_proj")]
    assert [n.attrs for n in proj] == [MatmulAttrs(m=batch * steps, n=gates * hidden, k=hidden)] * layers
    dag = g.dag
    first = [n for n in rec if ".l0." in n.name]
    assert all(nx.has_path(dag, a.id, b.id) for a, b in itertools.pairwise(first))
    # backward: one gate-gradient kernel a step, summing the state's two gradients itself; one wgrad over all steps
    grads = [n for n in g if n.phase is Phase.BACKWARD and isinstance(n.attrs, ElementwiseAttrs)]
    assert sum(n.attrs.fn == f"{torch_cell}_cell_grad" for n in grads) == layers * steps
    assert not [n for n in g if n.name.endswith("grad_acc") and ".step" in n.name]
    merged = [n.attrs for n in g if n.name.endswith(".steps.h.wgrad")]
    assert merged == [MatmulAttrs(m=gates * hidden, n=hidden, k=batch * steps, grad_of="wgrad")] * layers


def test_a_bidirectional_relu_rnn_and_a_gru_with_a_given_state() -> None:
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = nn.RNN(8, 16, num_layers=2, nonlinearity="relu", bidirectional=True, batch_first=True)
            self.gru = nn.GRU(32, 16, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y, h = self.rnn(x)
            return self.gru(y, h[-1:])[0]

    model = TorchZooModel("net", Net, ((("batch", "seq", 8), "float32"),), "", "sequences")
    g, _, _ = model.capture(CaptureSpec(micro_batch=3, seq_len=5, dtype="fp32"))
    cells = Counter(n.attrs.fn for n in g if isinstance(n.attrs, ElementwiseAttrs) and n.attrs.fn.endswith("_cell"))
    assert cells == {"rnn_relu_cell": 2 * 2 * 5, "gru_cell": 5}
    layers = {n.name.split(".step")[0] for n in g if ".step" in n.name}
    assert sum(name.endswith(".rev.rnn_relu") for name in layers) == 2
    # the second relu layer reads both directions of the first (2 x 16 features); the GRU starts from h
    assert [n.attrs.k for n in g if n.name.endswith("input_proj")] == [8, 8, 32, 32, 32]
    gru_steps = [n for n in g if n.op is OpKind.MATMUL and recurrent_cell(n.name) == "gru" and ".step" in n.name]
    assert len(gru_steps) == 5
    assert not [w for w in model.capture(CaptureSpec(micro_batch=3, seq_len=5))[1] if "no rule" in w]


def _onnx(tmp_path: Path, op: str, gates: int, **attrs: object) -> Path:
    seq, hidden, inp = 5, 8, 4
    shapes = {"W": [1, gates * hidden, inp], "R": [1, gates * hidden, hidden], "B": [1, 2 * gates * hidden]}
    weights = [helper.make_tensor(k, TensorProto.FLOAT, v, [0.0] * math.prod(v)) for k, v in shapes.items()]
    node = helper.make_node(op, ["x", "W", "R", "B"], ["y"], hidden_size=hidden, **attrs)
    graph = helper.make_graph(
        [node],
        op.lower(),
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, "batch", inp])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=weights,
    )
    path = tmp_path / f"{op}.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return path


@pytest.mark.parametrize(
    ("op", "gates", "attrs", "cell"),
    [
        ("GRU", 3, {"linear_before_reset": 1}, "gru_cell"),  # what torch.onnx.export writes for nn.GRU
        ("RNN", 1, {}, "rnn_tanh_cell"),
        ("RNN", 1, {"activations": ["Relu"]}, "rnn_relu_cell"),
    ],
)
def test_onnx_gru_and_rnn_unroll_their_steps(tmp_path: Path, op: str, gates: int, attrs: dict, cell: str) -> None:
    g, warnings, _ = onnx_frontend.load(str(_onnx(tmp_path, op, gates, **attrs))).capture(
        CaptureSpec(micro_batch=3, seq_len=5)
    )
    matmuls = [n.attrs for n in g if n.op is OpKind.MATMUL]
    assert matmuls[0] == MatmulAttrs(m=15, n=gates * 8, k=4)
    assert matmuls[1:] == [MatmulAttrs(m=3, n=gates * 8, k=8)] * 4  # no initial state given
    assert sum(isinstance(n.attrs, ElementwiseAttrs) and n.attrs.fn == cell for n in g) == 5
    # the input is time-major (5 steps, then a symbolic batch): --micro-batch binds the batch, the file fixes the steps
    assert not [w for w in warnings if "no rule" in w or "does not apply" in w]
    seq7 = onnx_frontend.load(str(_onnx(tmp_path, op, gates, **attrs))).capture(CaptureSpec(micro_batch=3, seq_len=7))
    assert [w for w in seq7[1] if "does not apply" in w] == [
        f"--seq-len 7 does not apply: {op}.onnx fixes the sequence at 5"
    ]


def test_an_onnx_gru_that_resets_before_its_recurrent_gemm_is_left_unruled(tmp_path: Path) -> None:
    """linear_before_reset = 0 (ONNX's default) multiplies r * h by the n-block: a second GEMM a step, not this form."""
    g, warnings, _ = onnx_frontend.load(str(_onnx(tmp_path, "GRU", 3))).capture(CaptureSpec(micro_batch=3, seq_len=5))
    assert [w for w in warnings if w.startswith("no rule for ONNX op GRU")]
    assert not [n for n in g if ".step" in n.name]


def test_a_cpu_prices_a_gru_step_as_its_aten_calls_and_an_lstm_step_as_one_fused_kernel() -> None:
    batch, hidden, steps = 4, 32, 6
    backend = cpu.CPUBackend(SPEC)
    g = _graph("gru", batch=batch, hidden=hidden, steps=steps)
    state = batch * hidden * 4
    cells = [n for n in g if isinstance(n.attrs, ElementwiseAttrs) and n.attrs.fn.startswith("gru_cell")]
    native = cpu.NATIVE_CELLS["gru"]
    for n in cells:
        fwd = n.phase is Phase.FORWARD
        kernels = native.forward_kernels if fwd else native.backward_kernels
        tensors = native.forward_tensors if fwd else native.backward_tensors
        expected = (
            cpu.memory_bound_time_s(SPEC, tensors * state, True, written=kernels * state)
            + (kernels - 1) * SPEC.op_overhead_us * 1e-6
            + kernels * SPEC.autograd_op_us * 1e-6
        )
        assert backend.op_time_s(n, 0) == pytest.approx(expected), n.name
    # the step's GEMMs pay autograd's host time like any op; no oneDNN weight reorders anywhere
    gemm = next(n for n in g if n.name.endswith(".step3.h"))
    a = gemm.attrs
    assert backend.op_time_s(gemm, 0) == pytest.approx(
        cpu.matmul_time_s(SPEC, a.m, a.n, a.k) + SPEC.autograd_op_us * 1e-6
    )
    assert not [n for n in g if cpu.rnn_weight_reorder_bytes(n)]
    # the recurrent weight's gradient: a GEMM of k = batch each step, then the step's gradient added in place
    wgrad = next(n for n in g if n.name.endswith(".steps.h.wgrad"))
    weight = 3 * hidden * hidden * 4
    add = cpu.memory_bound_time_s(SPEC, 3 * weight, written=weight, inplace=True)
    assert backend.op_time_s(wgrad, 0) == pytest.approx(
        steps * cpu.matmul_time_s(SPEC, 3 * hidden, hidden, batch) + (steps - 1) * add
    )
    # an LSTM of the same size: fused, no host time for its steps, its weights reordered
    lstm = _graph("lstm", batch=batch, hidden=hidden, steps=steps)
    step = next(n for n in lstm if n.name.endswith(".step3.cell"))
    assert backend.op_time_s(step, 1000) == pytest.approx(
        cpu.memory_bound_time_s(SPEC, 1000, True, written=step.out.nbytes)
    )
    assert [n for n in lstm if cpu.rnn_weight_reorder_bytes(n)]


def test_a_gpu_runs_a_gru_fused_as_cudnn_does() -> None:
    """cuDNN's GRU: the step's GEMM and one gate kernel, no per-call host time, one wgrad GEMM (k = batch x steps)."""
    layers, hidden, steps, batch = 2, 256, 12, 32
    model = _lm("gru", layers, hidden, 100, steps)
    compiled = lower(model, Plan(micro_batch=batch, seq_len=steps), Cluster(backend="h100-sxm", devices=1))
    dev = DEVICES["h100-sxm"]
    serial = layers * steps * matmul_time_s(dev, batch, 3 * hidden, hidden)
    assert compiled.report.stages[0]["fwd_s"] > serial
    assert not [w for w in compiled.report.warnings if "no rule" in w]


def test_the_native_cells_step_counts_are_what_pytorch_dispatches() -> None:
    """Per time step, from torch.profiler: the aten calls of the gate math forward and of autograd's backward
    nodes beyond the step's GEMMs and views (the difference of a 10-step and a 20-step layer, so per-layer work
    cancels); the weight gradient's step-by-step sum is priced with the weight-gradient GEMM."""
    import torch
    from torch import nn

    not_kernels = {"aten::linear", "aten::mm", "aten::addmm", "aten::t", "aten::unsafe_chunk", "aten::select",
                   "aten::view", "aten::reshape", "aten::transpose", "aten::transpose_", "aten::unbind",
                   "aten::detach", "aten::cudnn_is_acceptable", "aten::sum"}  # fmt: skip

    def calls(layer: nn.Module, steps: int) -> tuple[int, int]:
        layer.zero_grad(set_to_none=True)
        weight = list(layer.weight_hh_l0.shape)
        x = torch.randn(2, steps, 8)
        with torch.profiler.profile(record_shapes=True) as fwd:
            y = layer(x)[0].sum()
        with torch.profiler.profile(record_shapes=True) as bwd:
            y.backward()

        def count(prof: torch.profiler.profile) -> int:
            n = 0
            for e in prof.events():
                parent = e.cpu_parent
                while parent is not None and not parent.name.startswith("aten::"):
                    parent = parent.cpu_parent
                outermost = parent is None or parent.name in ("aten::gru", "aten::rnn_tanh")
                shape = e.input_shapes[0] if e.input_shapes else []
                step_sum = e.name == "aten::sum" and len(shape) == 2  # the recurrent bias's gradient of one step
                if e.name.startswith("aten::") and outermost and (e.name not in not_kernels or step_sum):
                    n += shape != weight
            return n

        return count(fwd), count(bwd)

    torch.set_num_threads(1)
    for cell, layer in (("gru", nn.GRU(8, 8, batch_first=True)), ("rnn_tanh", nn.RNN(8, 8, batch_first=True))):
        (f10, b10), (f20, b20) = calls(layer, 10), calls(layer, 20)
        native = cpu.NATIVE_CELLS[cell]
        assert ((f20 - f10) / 10, (b20 - b10) / 10) == (native.forward_kernels, native.backward_kernels), cell


def test_an_onnx_recurrent_weight_of_the_wrong_shape_is_one_line(tmp_path: Path) -> None:
    """W holds gates x hidden rows (ONNX operator docs); a file whose W does not is refused, not costed."""
    path = _onnx(tmp_path, "GRU", 3, linear_before_reset=1)
    import onnx

    model = onnx.load(str(path))
    w = next(t for t in model.graph.initializer if t.name == "W")
    w.dims[1] = 20
    del w.float_data[20 * 4 :]
    onnx.save(model, str(path))
    with pytest.raises(
        EchosimError, match=r"GRU 'y' with hidden_size 8 needs 'W' of shape \[1, 24, 4\] .*not \[1, 20, 4\]"
    ):
        onnx_frontend.load(str(path)).capture(CaptureSpec(micro_batch=3, seq_len=5))


@pytest.mark.parametrize(("kind", "cell", "gates"), [("gru", "gru", 3), ("lstm", "lstm", 4), ("rnn", "rnn_tanh", 1)])
def test_a_cell_called_in_the_models_own_loop_is_two_gemms_and_one_gate_kernel(kind: str, cell: str, gates: int):
    """nn.GRUCell / LSTMCell / RNNCell in a Python loop over the steps (a decoder's usual form), with its initial
    state made by torch.zeros without a device: it captured before only by chance (a CPU tensor beside meta ones
    failed torch.export) and its cells were memory-bound ops with a "no rule" warning."""
    import torch
    from torch import nn

    steps, batch, inp, hidden = 5, 4, 6, 8

    class Loop(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cell = {"gru": nn.GRUCell, "lstm": nn.LSTMCell, "rnn": nn.RNNCell}[kind](inp, hidden)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.zeros(x.shape[0], hidden)
            state = (h, torch.zeros(x.shape[0], hidden)) if kind == "lstm" else h
            for t in range(steps):
                state = self.cell(x[:, t], state)
            return state[0] if kind == "lstm" else state

    model = TorchZooModel(f"loop-{kind}", Loop, ((("batch", steps, inp), "float32"),), "", "sequences")
    g, warnings, _ = model.capture(CaptureSpec(micro_batch=batch, seq_len=steps, dtype="fp32"))
    assert not [w for w in warnings if "no rule" in w]
    mm = [n.attrs for n in g if n.op is OpKind.MATMUL]
    assert mm == [MatmulAttrs(m=batch, n=gates * hidden, k=inp), MatmulAttrs(m=batch, n=gates * hidden, k=hidden)] * 5
    kernels = [n for n in g if isinstance(n.attrs, ElementwiseAttrs) and n.attrs.fn == f"{cell}_cell"]
    assert len(kernels) == steps
    # the gate kernel is a cell call (priced as the native cell's calls on a CPU, an LSTM's too: oneDNN runs only
    # whole layers); each step's GEMMs keep their own weight gradients (summed by autograd), not one over the steps
    assert all(recurrent_cell(n.name) == cell and is_cell_call(n.name) for n in kernels)
    dag = g.dag
    assert all(nx.has_path(dag, a.id, b.id) for a, b in itertools.pairwise(kernels))
    trained = lower(model, Plan(micro_batch=batch, global_batch=batch, seq_len=steps), Cluster("h100-sxm", 1))
    wgrads = [n for n in trained.stages[0].graph if isinstance(n.attrs, MatmulAttrs) and n.attrs.grad_of == "wgrad"]
    assert len(wgrads) == 2 * steps and {n.attrs.k for n in wgrads} == {batch}


def test_nn_transformer_with_a_mask_is_captured_by_torch_export() -> None:
    """nn.Transformer compares an explicit mask with a causal one (a read of values meta tensors lack): torch.export
    failed, and the torch.fx fallback costed the whole nn.Transformer as one memory-bound op."""
    import torch
    from torch import nn

    class Seq2Seq(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.t = nn.Transformer(d_model=32, nhead=4, num_encoder_layers=1, num_decoder_layers=1,
                                    dim_feedforward=64, batch_first=True)  # fmt: skip

        def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
            mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
            return self.t(src, tgt, tgt_mask=mask)

    model = TorchZooModel("s2s", Seq2Seq, ((("batch", 12, 32), "float32"), (("batch", 6, 32), "float32")), "", "x")
    g, warnings, _ = model.capture(CaptureSpec(micro_batch=2, seq_len=12, dtype="fp32"))
    assert not [w for w in warnings if "no rule" in w or "could not capture" in w]
    attention = [n.attrs for n in g if n.op is OpKind.ATTENTION]
    assert len(attention) == 3  # encoder self, decoder self (masked), decoder cross


def test_a_cell_calls_step_counts_are_what_pytorch_dispatches() -> None:
    """Per call of nn.LSTMCell / GRUCell / RNNCell in a loop, from torch.profiler: the gate math's aten calls forward
    and autograd's backward, beyond the two projections' GEMMs and their bias and weight gradients (IR nodes of their
    own for a cell call); a 20-call loop against a 10-call one."""
    import torch
    from torch import nn

    own_nodes = {"aten::linear", "aten::mm", "aten::addmm", "aten::t", "aten::unsafe_chunk", "aten::select",
                 "aten::view", "aten::reshape", "aten::transpose", "aten::detach", "aten::zeros", "aten::sum",
                 "aten::expand", "aten::slice", "aten::lstm_cell", "aten::gru_cell", "aten::rnn_tanh_cell"}  # fmt: skip

    def calls(cell: nn.Module, steps: int, lstm: bool) -> tuple[int, int]:
        cell.zero_grad(set_to_none=True)
        x = torch.randn(2, steps, 8)
        with torch.profiler.profile(record_shapes=True) as fwd:
            h = c = torch.zeros(2, 8)
            for t in range(steps):
                if lstm:
                    h, c = cell(x[:, t], (h, c))
                else:
                    h = cell(x[:, t], h)
            y = h.sum()
        with torch.profiler.profile(record_shapes=True) as bwd:
            y.backward()
        params = [list(p.shape) for p in cell.parameters()]

        def count(prof: torch.profiler.profile, outer: tuple[str, ...]) -> int:
            n = 0
            for e in prof.events():
                parent = e.cpu_parent
                while parent is not None and not parent.name.startswith("aten::"):
                    parent = parent.cpu_parent
                shape = e.input_shapes[0] if e.input_shapes else []
                if e.name.startswith("aten::") and (parent is None or parent.name in outer):
                    n += e.name not in own_nodes and shape not in params  # a parameter's gradient sum is its own
            return n

        return count(fwd, ("aten::lstm_cell", "aten::gru_cell", "aten::rnn_tanh_cell")), count(bwd, ())

    torch.set_num_threads(1)
    for name, cell, lstm in (("lstm", nn.LSTMCell(8, 8), True), ("gru", nn.GRUCell(8, 8), False),
                             ("rnn_tanh", nn.RNNCell(8, 8), False)):  # fmt: skip
        (f10, b10), (f20, b20) = calls(cell, 10, lstm), calls(cell, 20, lstm)
        native = cpu.NATIVE_CELL_CALLS[name]
        assert ((f20 - f10) / 10, (b20 - b10) / 10) == (native.forward_kernels, native.backward_kernels), name
