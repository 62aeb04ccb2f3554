"""PyTorch automatic mixed precision (``torch.autocast``) over fp32 parameters, as eager PyTorch runs it.

A model trained under ``torch.autocast(device_type="cuda", dtype=torch.bfloat16)`` keeps its parameters
in fp32 and lets autocast pick each op's dtype (https://pytorch.org/docs/stable/amp.html, "Autocast Op
Reference"; the lists are ``KERNEL_CUDA(..., lower_precision_fp)`` / ``KERNEL_CUDA(..., fp32)`` in
aten/src/ATen/autocast_mode.cpp):

* ops that autocast to the lower precision (``linear``, ``matmul``, ``bmm``, ``conv*``, ``addmm``,
  ``scaled_dot_product_attention``, the RNN cells) cast each fp32 floating input to bf16 and return bf16;
* ops that autocast to float32 (``layer_norm``, ``group_norm``, ``softmax``, ``log_softmax``,
  ``cross_entropy``, ``nll_loss``, ``sum``, ...) cast each 16-bit input to fp32 and return fp32;
* every other op runs in the dtype of its inputs; binary ops on mixed dtypes promote to the widest
  (``add``, ``cat``: the docs' "ops that promote to the widest input type" and torch's type promotion).

So the residual stream of a pre-LN transformer whose embedding adds an fp32 parameter (ViT's class token
and position embedding) stays fp32 through every layer, while the linears see bf16 copies.

Each cast is a ``to(dtype)`` copy kernel (reads one dtype, writes the other). autocast caches the cast of
a leaf tensor that requires grad (a parameter) for the rest of the autocast region, and casts any other
tensor anew at every op that needs it (``cached_cast``: ``can_try_cache = ... arg.is_leaf() &&
arg.requires_grad()``, autocast_mode.h): one cast per parameter per forward, one per activation and
consumer. The backward of a cast is the opposite cast of the gradient (``_to_copy``'s derivative,
tools/autograd/derivatives.yaml); the gradients of fp32 values are fp32. The autograd engine casts a
gradient whose dtype differs from its input's (``validate_outputs``, torch/csrc/autograd/engine.cpp):
:class:`echosim.passes.autodiff.Autodiff` with ``cast_grads`` emits those casts.

``batch_norm`` is on neither list: cuDNN's batch norm takes a bf16 input with fp32 weights and returns
the input's dtype. The optimizer updates the fp32 parameters in place (no master copy).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from echosim.ir.graph import Graph, Node
from echosim.ir.ops import CollectiveAttrs, ElementwiseAttrs, NormAttrs, OpKind, Phase
from echosim.ir.types import DType, TensorSpec

#: The elementwise fn of an autocast cast (aten ``_to_copy``), forward and (``_grad``) backward.
CAST = "autocast_cast"

#: Floating dtypes autocast casts between.
_FLOAT = frozenset({DType.FP32, DType.BF16, DType.FP16})

#: IR ops on autocast's lower-precision list (linear/matmul/bmm/conv are MATMUL; SDPA is ATTENTION).
_LOWER = frozenset({OpKind.MATMUL, OpKind.ATTENTION})

#: IR ops on autocast's float32 list: softmax, log_softmax/cross_entropy; layer_norm and group_norm are
#: NORM nodes of those kinds (batch norm is on neither list).
_FP32 = frozenset({OpKind.SOFTMAX, OpKind.CROSS_ENTROPY})
_FP32_NORMS = frozenset({"layernorm", "groupnorm"})


@dataclass(frozen=True)
class Autocast:
    """Rewrite a forward graph captured in one 16-bit dtype into autocast's dtypes over fp32 parameters."""

    dtype: DType = DType.BF16  # autocast's lower-precision dtype
    name: ClassVar[str] = "autocast"

    def run(self, graph: Graph) -> Graph:
        g = graph.copy()
        param_casts: dict[int, int] = {}  # parameter -> its cast, cached for the forward
        before: dict[int, list[int]] = {}  # consumer -> casts placed right before it
        for n in [n for n in g if n.phase is Phase.FORWARD]:
            if n.op in (OpKind.PARAMETER, OpKind.INPUT):
                if n.out.dtype in _FLOAT:  # fp32 parameters; fp32 data from the loader
                    g.replace(n.id, out=TensorSpec(n.out.shape, DType.FP32))
                continue
            target = self._target(g, n)
            if target is None and n.op is OpKind.NORM:  # batch norm: its input's dtype, whatever its weights'
                x = g[n.inputs[0]].out.dtype
                if n.out.dtype in _FLOAT and x in _FLOAT:
                    g.replace(n.id, out=TensorSpec(n.out.shape, x))
                continue
            if target is None:  # runs in its inputs' dtype, promoted to the widest
                floats = [g[i].out.dtype for i in n.inputs if g[i].out.dtype in _FLOAT]
                if n.out.dtype in _FLOAT and floats:
                    widest = DType.FP32 if DType.FP32 in floats else floats[0]
                    attrs = n.attrs
                    if isinstance(attrs, CollectiveAttrs):  # a collective moves its value's bytes (tp/sp gathers)
                        attrs = replace(attrs, bytes=attrs.bytes * widest.itemsize // n.out.dtype.itemsize)
                    g.replace(n.id, out=TensorSpec(n.out.shape, widest), attrs=attrs)
                continue
            inputs = list(n.inputs)
            for k, i in enumerate(n.inputs):
                src = g[i]
                if src.out.dtype not in _FLOAT or src.out.dtype is target:
                    continue
                if src.op is OpKind.PARAMETER and i in param_casts:
                    inputs[k] = param_casts[i]
                    continue
                cast = g.add(
                    OpKind.ELEMENTWISE, [i], TensorSpec(src.out.shape, target), ElementwiseAttrs(CAST, 0),
                    phase=n.phase, scope=n.scope, name=f"{src.name}.to_{target.value}",
                )  # fmt: skip
                before.setdefault(n.id, []).append(cast)
                if src.op is OpKind.PARAMETER:
                    param_casts[i] = cast
                inputs[k] = cast
            out = TensorSpec(n.out.shape, target) if n.out.dtype in _FLOAT else n.out
            g.replace(n.id, inputs=tuple(inputs), out=out)
        g.move_before(before)
        return g

    def _target(self, g: Graph, n: Node) -> DType | None:
        """The dtype autocast runs ``n`` in, or None where it leaves the op to its inputs' dtypes."""
        if n.op in _LOWER:
            return self.dtype
        if n.op in _FP32 or (isinstance(n.attrs, NormAttrs) and n.attrs.kind in _FP32_NORMS):
            return DType.FP32
        return None


__all__ = ["CAST", "Autocast"]
