"""Give a captured graph exactly one training loss, the shape autodiff starts from.

Zoo models return their loss. A model that returns logits (an HF causal LM, an
ONNX file exported for inference, a CNN) gets the loss every frontend adds the same
way: cross-entropy over the last axis of the first floating output against integer
labels, which become a per-sample graph input. A 1-D output (a click-through
score, say) gets a mean. Adding the loss in one place keeps the frontends
comparable: the same model through fx, export or ONNX ends in the same loss.
"""

from __future__ import annotations

from echosim.ir.graph import Graph
from echosim.ir.ops import CrossEntropyAttrs, ElementwiseAttrs, OpKind
from echosim.ir.types import DType, TensorSpec

_FLOATS = (DType.FP32, DType.TF32, DType.FP16, DType.BF16, DType.FP8)


def ensure_loss(graph: Graph, notes: list[str]) -> None:
    """Make ``graph.outputs`` a single scalar loss, adding one if the model has none."""
    outs = [o for o in graph.outputs if graph[o].out.dtype in _FLOATS]
    if not outs:
        raise ValueError(f"model {graph.name!r} has no floating-point output to train on")
    first = graph[outs[0]]
    if first.out.numel == 1 and len(outs) == 1:
        graph.outputs = [first.id]
        return
    if len(outs) > 1:
        notes.append(f"the model returns {len(outs)} floating outputs: the loss is taken on the first ({first.out})")
    if len(first.out.shape) >= 2 and first.out.shape[-1] > 1:
        labels = graph.add(OpKind.INPUT, (), TensorSpec(first.out.shape[:-1], DType.INT64), name="labels")
        graph.inputs.append(labels)
        loss = graph.add(
            OpKind.CROSS_ENTROPY,
            (first.id, labels),
            TensorSpec((1,), first.out.dtype),
            CrossEntropyAttrs(first.out.shape[-1]),
            name="loss",
        )
        notes.append(f"no loss in the model: echosim adds cross-entropy over the last axis of its output {first.out}")
    else:
        loss = graph.add(
            OpKind.REDUCTION, (first.id,), TensorSpec((1,), first.out.dtype), ElementwiseAttrs("loss_mean"), name="loss"
        )
        notes.append(f"no loss in the model: echosim adds the mean of its output {first.out}")
    graph.outputs = [loss]
