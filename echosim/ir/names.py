"""Node-name conventions that a frontend writes and a backend reads.

They live in the IR because the layers contract keeps backends from importing frontends.
"""

from __future__ import annotations

import re

#: The per-step nodes of a recurrent layer (and the gradients autodiff derives from them, named after them):
#: parts of one fused kernel call (``aten::lstm``: oneDNN's RNN primitive on a CPU, cuDNN's on a GPU), not ops
#: the framework dispatches one by one, so no per-op host time is theirs
#: (echosim.backends.cpu.CPUBackend.op_time_s). ``steps`` names a node that serves all the steps of a layer at
#: once (the recurrent weight's gradient, :func:`all_steps_name`).
_STEP_NODE = re.compile(r"\.step(?:\d+|s)\.(?:x|h|pre|cell)(?:\.|$)")
_STEP_OF = re.compile(r"^(?P<layer>.+)\.step\d+\.(?P<part>x|h|pre|cell)$")


def cell_kernel(cell: str) -> str:
    """The ElementwiseAttrs.fn of a time step's gate kernel of recurrent cell ``cell`` (:data:`RECURRENT_CELLS`)."""
    return f"{cell}_cell"


def cell_of(fn: str) -> str:
    """The recurrent cell whose gate kernel is ElementwiseAttrs.fn ``fn`` (:func:`cell_kernel`), else ``""``."""
    return fn.removesuffix("_cell") if fn in _CELL_KERNELS else ""


#: The recurrent cells a frontend writes (echosim.frontend.recurrent.CELLS holds their gates and FLOPs).
RECURRENT_CELLS = ("lstm", "gru", "rnn_tanh", "rnn_relu")
_CELL_KERNELS = frozenset(cell_kernel(c) for c in RECURRENT_CELLS)
#: A recurrent layer's nodes (and the gradients named after them): LAYER.CELL.(input_proj|stepT|steps)...
_LAYER_CELL = re.compile(rf"\.({'|'.join(RECURRENT_CELLS)})\.(?:call\.)?(?:input_proj|step\d+|steps)(?:\.|$)")
#: A cell the model's own loop calls (nn.GRUCell, ...): its gate kernel, named as the one step of a layer of its own.
_CELL_CALL = re.compile(r"\.call\.step0\.cell(?:\.|$)")


def recurrent_layer_name(name: str, cell: str) -> str:
    """The name a recurrent layer's nodes start with: the frontend's ``name`` and the cell, so that a backend can
    tell which cell a node of the layer belongs to (:func:`recurrent_cell`) where frameworks run cells apart
    (on a CPU PyTorch hands only the LSTM to oneDNN: echosim.backends.cpu)."""
    return f"{name}.{cell}"


def cell_call_name(name: str, cell: str) -> str:
    """The name of the gate kernel of one call of a cell by the model's own loop (``aten.gru_cell``, ...): a time
    step of its cell (:func:`recurrent_cell` names it) that :func:`is_cell_call` tells from a layer's steps, which a
    framework may run otherwise (oneDNN's RNN primitive runs an LSTM layer, never an ``LSTMCell`` call)."""
    return step_name(f"{recurrent_layer_name(name, cell)}.call", 0, "cell")


def is_cell_call(name: str) -> bool:
    """Whether a node (or a gradient named after one) is the gate kernel of a cell call (:func:`cell_call_name`)."""
    return _CELL_CALL.search(name) is not None


def recurrent_cell(name: str) -> str:
    """The cell of the recurrent layer a node named ``name`` belongs to (:func:`recurrent_layer_name`), else ``""``."""
    m = _LAYER_CELL.search(name)
    return m[1] if m else ""


def step_name(layer: str, t: int, part: str) -> str:
    """The name of time step ``t``'s ``part`` (x, h, pre, cell) of recurrent layer ``layer``."""
    return f"{layer}.step{t}.{part}"


def all_steps_name(layer: str, part: str) -> str:
    """The name of a node that does ``part``'s work of every time step of ``layer`` in one kernel."""
    return f"{layer}.steps.{part}"


def input_proj_name(layer: str) -> str:
    """The name of recurrent layer ``layer``'s input projection: one GEMM over the inputs of all its time steps."""
    return f"{layer}.input_proj"


#: A recurrent layer's weight passes through these nodes once a kernel call: its input projection (the forward
#: call, :func:`input_proj_name`) and the gradient GEMMs of its two weights (the backward call). A CPU backend
#: prices oneDNN's weight reorders there (echosim.backends.cpu.rnn_weight_reorder_bytes).
#: Their name suffixes, built by the functions that name them (so the two cannot drift apart).
_RECURRENT_FORWARD = input_proj_name("")
_RECURRENT_WGRAD = (f"{input_proj_name('')}.wgrad", f"{all_steps_name('', 'h')}.wgrad")


def recurrent_weight_use(name: str) -> str:
    """``forward`` for a recurrent layer's input projection, ``wgrad`` for the gradient of one of its two weights
    (input and recurrent), else ``""``: the nodes that stand for the layer's kernel calls' weight handling."""
    if name.endswith(_RECURRENT_FORWARD):
        return "forward"
    return "wgrad" if name.endswith(_RECURRENT_WGRAD) else ""


def step_of(name: str) -> tuple[str, str] | None:
    """The (layer, part) of a time step's node named by :func:`step_name`, else None."""
    m = _STEP_OF.match(name)
    return (m["layer"], m["part"]) if m else None


def is_recurrent_step(name: str) -> bool:
    """Whether a node (or a gradient named after one) is a time step inside a fused recurrent layer."""
    return _STEP_NODE.search(name) is not None


#: The last name part of autograd's sum into a parameter's ``.grad`` (``AccumulateGrad``, accumulate_grad.h):
#: the IR's gradient sums are named so (echosim.passes.autodiff), and a CPU backend prices it as in place.
GRAD_ACCUMULATE = "grad_acc"


def is_grad_accumulate(name: str) -> bool:
    """Whether a node is autograd's gradient sum (named by :data:`GRAD_ACCUMULATE`)."""
    return name.rsplit(".", 1)[-1] == GRAD_ACCUMULATE


def cost_traits(name: str) -> tuple[bool, bool, str, str, bool]:
    """The facts of a node's name that a backend's op cost may read (a time step of a recurrent layer, a gradient
    sum, a recurrent layer's weight handling, its cell, a cell called on its own). Op-cost caches key by these, not
    by the name itself, which differs from layer to layer: two nodes of one shape whose names differ in them may
    cost differently."""
    step, use = is_recurrent_step(name), recurrent_weight_use(name)
    recurrent = step or bool(use)  # a cell is named only on a recurrent layer's nodes: no more regexes on the rest
    cell = recurrent_cell(name) if recurrent else ""
    return step, is_grad_accumulate(name), use, cell, step and is_cell_call(name)
