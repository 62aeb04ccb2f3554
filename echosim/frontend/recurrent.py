"""Recurrent layers in IR, shared by the export and ONNX frontends.

A recurrent layer (LSTM, GRU, Elman RNN) is costed the way cuDNN runs it: one GEMM projects the inputs of
every step at once, then the recurrence runs step by step, each step a small
(batch x h) @ (h x gates*h) GEMM plus one fused gate kernel (``cudnnRNNForward``
with CUDNN_LSTM, CUDNN_GRU, CUDNN_RNN_TANH or CUDNN_RNN_RELU: four, three and one
gates). The gate kernel itself adds
the step's slice of the input projection to the recurrent GEMM's output (no add
kernel between them): Appleyard et al. 2016, "Optimizing Performance of Recurrent
Neural Networks on GPUs" (arXiv:1604.01946), sec. 3.1 optimization 3, fusing the
element-wise operations into one kernel per step, as cuDNN's RNN does; PyTorch's own
fused cell reads ``input_gates`` and ``hidden_gates`` separately in one kernel too
(aten/src/ATen/native/cuda/RNN.cu, ``lstm_cell_forward``). The steps are unrolled
because they are sequential: a batched GEMM would hide that latency. In backward
only the data gradients run step by step; autodiff gives the recurrent weight one
gradient GEMM over all steps (k = batch x steps), as oneDNN and cuDNN compute it,
and sums a step's two state gradients inside its gate-gradient kernel
(echosim.passes.autodiff).
"""

from __future__ import annotations

from dataclasses import dataclass

from echosim.ir.graph import Graph
from echosim.ir.names import RECURRENT_CELLS, cell_kernel, input_proj_name, recurrent_layer_name, step_name
from echosim.ir.ops import ElementwiseAttrs, MatmulAttrs, OpKind
from echosim.ir.types import DType, TensorSpec


@dataclass(frozen=True, slots=True)
class Cell:
    """One recurrent cell kind: how many gate blocks its weights stack, and its gate kernel's FLOPs per hidden
    unit (each add, product and activation counted once)."""

    gates: int
    flops: int


#: PyTorch's (and cuDNN's) cells, keyed as ``aten`` names them. LSTM: sigmoid x3, tanh x2, the cell update
#: c = f*c + i*g and h = o*tanh(c). GRU (PyTorch's form, which is cuDNN's and ONNX's ``linear_before_reset``: the
#: reset gate scales the recurrent GEMM's n-block, so one GEMM serves all three gates): sigmoid x2, tanh,
#: r * (W_hn h + b_hn) plus the input's n-block, h' = n + z * (h - n). Elman RNN: the sum of the two projections
#: and the activation. (The torch.nn.LSTM, GRU and RNN docs give the equations.)
CELLS = {
    "lstm": Cell(gates=4, flops=10),
    "gru": Cell(gates=3, flops=8),
    "rnn_tanh": Cell(gates=1, flops=2),
    "rnn_relu": Cell(gates=1, flops=2),
}
assert tuple(CELLS) == RECURRENT_CELLS


def rnn_layer(
    g: Graph,
    cell: str,
    x: int,
    w_ih: int,
    w_hh: int,
    biases: list[int],
    *,
    batch: int,
    steps: int,
    in_dim: int,
    hidden: int,
    dtype: DType,
    batch_first: bool,
    scope: str,
    name: str,
    h0: int | None = None,
) -> int:
    """Append one unidirectional recurrent layer of ``cell`` (a :data:`CELLS` key) reading ``x``; returns its
    output sequence.

    With an initial state ``h0`` (PyTorch passes zeros) the first step multiplies it too,
    as the kernel does; without one the first step has no recurrent GEMM.
    """
    kind = CELLS[cell]
    layer = recurrent_layer_name(name, cell)
    width = kind.gates * hidden
    gates_x = g.add(
        OpKind.MATMUL,
        [x, w_ih, *biases],
        TensorSpec((batch * steps, width), dtype),
        MatmulAttrs(m=batch * steps, n=width, k=in_dim),
        scope=scope,
        name=input_proj_name(layer),
    )
    gate_spec = TensorSpec((batch, width), dtype)
    state = h0
    outs: list[int] = []
    for t in range(steps):
        gates = [g.add(OpKind.VIEW, [gates_x], gate_spec, scope=scope, name=step_name(layer, t, "x"))]
        if state is not None:
            gates.append(
                g.add(
                    OpKind.MATMUL,
                    [state, w_hh],
                    gate_spec,
                    MatmulAttrs(m=batch, n=width, k=hidden),
                    scope=scope,
                    name=step_name(layer, t, "h"),
                )
            )
        state = g.add(  # one kernel: input-projection slice + recurrent GEMM output, biases, gates, cell update
            OpKind.ELEMENTWISE,
            gates,
            TensorSpec((batch, hidden), dtype),
            ElementwiseAttrs(cell_kernel(cell), kind.flops),
            scope=scope,
            name=step_name(layer, t, "cell"),
        )
        outs.append(state)
    shape = (batch, steps, hidden) if batch_first else (steps, batch, hidden)
    return g.add(
        OpKind.ELEMENTWISE, outs, TensorSpec(shape, dtype), ElementwiseAttrs("cat", 0), scope=scope, name=f"{name}.out"
    )
