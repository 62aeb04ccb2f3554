"""Recurrent layers in IR, shared by the export and ONNX frontends.

An LSTM layer is costed the way cuDNN runs it: one GEMM projects the inputs of
every step at once, then the recurrence runs step by step, each step a small
(batch x h) @ (h x 4h) GEMM plus one fused gate kernel. The gate kernel itself adds
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

from echosim.ir.graph import Graph
from echosim.ir.names import input_proj_name, step_name
from echosim.ir.ops import ElementwiseAttrs, MatmulAttrs, OpKind
from echosim.ir.types import DType, TensorSpec

# sigmoid x3, tanh x2, the cell update c = f*c + i*g and h = o*tanh(c), per hidden unit
GATE_FLOPS = 10


def lstm_layer(
    g: Graph,
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
    """Append one unidirectional LSTM layer reading ``x``; returns its output sequence.

    With an initial state ``h0`` (PyTorch passes zeros) the first step multiplies it too,
    as the kernel does; without one the first step has no recurrent GEMM.
    """
    gates_x = g.add(
        OpKind.MATMUL,
        [x, w_ih, *biases],
        TensorSpec((batch * steps, 4 * hidden), dtype),
        MatmulAttrs(m=batch * steps, n=4 * hidden, k=in_dim),
        scope=scope,
        name=input_proj_name(name),
    )
    gate_spec = TensorSpec((batch, 4 * hidden), dtype)
    state = h0
    outs: list[int] = []
    for t in range(steps):
        gates = [g.add(OpKind.VIEW, [gates_x], gate_spec, scope=scope, name=step_name(name, t, "x"))]
        if state is not None:
            gates.append(
                g.add(
                    OpKind.MATMUL,
                    [state, w_hh],
                    gate_spec,
                    MatmulAttrs(m=batch, n=4 * hidden, k=hidden),
                    scope=scope,
                    name=step_name(name, t, "h"),
                )
            )
        state = g.add(  # one kernel: input-projection slice + recurrent GEMM output, biases, gates, cell update
            OpKind.ELEMENTWISE,
            gates,
            TensorSpec((batch, hidden), dtype),
            ElementwiseAttrs("lstm_cell", GATE_FLOPS),
            scope=scope,
            name=step_name(name, t, "cell"),
        )
        outs.append(state)
    shape = (batch, steps, hidden) if batch_first else (steps, batch, hidden)
    return g.add(
        OpKind.ELEMENTWISE, outs, TensorSpec(shape, dtype), ElementwiseAttrs("cat", 0), scope=scope, name=f"{name}.out"
    )
