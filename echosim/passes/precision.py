"""FP8 (and block-scaled MXFP8 / NVFP4) training of the linear layers, as Transformer Engine does it.

Every matmul of a linear layer (forward, recompute, input gradient and weight
gradient) runs with fp8 operands and keeps a 16-bit output. Each activation operand
is quantised once by a cast kernel that also computes its amax (reads 2 bytes,
writes 1 per element); the weight gradient reuses the forward's fp8 copy of the
input, so that copy (1 byte per element) is what backward keeps. Weights are cast
once per step and their cost is not counted. The output layer stays in 16-bit
(Transformer Engine's recipes exclude it); attention stays in 16-bit.

Under sequence parallelism a linear's input is all-gathered over the tensor-parallel ranks first.
Transformer Engine quantises the local shard and gathers the quantised copy (forward, and again for
the weight gradient: ``gather_along_first_dim(inputmat, tp_group, quantizer=...)`` after
``inputmat = input_quantizer(inputmat)`` in transformer_engine/pytorch/module/linear.py, commit
d0067d0), so the cast reads the shard and the gather moves fp8 bytes. Backward does the same with the
output gradient of a row-parallel linear, which it gathers for its dgrad and wgrad: ``grad_output =
quantizer(grad_output)`` before the userbuffers copy, or ``gather_along_first_dim(grad_output, tp_group,
quantizer=quantizer)`` (TransformerEngineBaseModule.grad_output_preprocess, transformer_engine/pytorch/
module/base.py, TE 2.x); a bias gradient is summed from the local 16-bit shard before the cast (there,
or in Megatron-Core's bias-dropout-add when the layer skips its bias add). torchao's float8 tensor
parallelism, which torchtitan applies to its fp8 linears (Float8RowwiseParallel for wo and w2,
torchtitan/parallelisms/parallelize_llama.py, commit 9dec370), likewise casts the output gradient before
the redistribute's backward gathers it (``_prepare_output_fn``: redistribute, then
``NoopFwToFloat8BwDynamic``, a forward no-op whose backward casts; torchao/float8/float8_tensor_parallel.py,
torchao commit 46b8796).
Done so here when every reader of the gathered value, bias gradients aside, is a linear that quantises it.

``mxfp8`` (Transformer Engine's MXFP8BlockScaling: e4m3 elements, one power-of-two scale per
32) and ``nvfp4`` (NVFP4BlockScaling: e2m1 elements, one e4m3 scale per 16) take the same
place: the same GEMMs quantised, the copy kept for the weight gradient half a byte per element
for nvfp4. The GEMMs run at the rate the backend gives the format.

``dispatch``: DeepSeek-V3 quantises "the activation before MoE up-projections into FP8 and then appl[ies] dispatch
components", and the "activation gradient before MoE down-projections" likewise, while "both the forward and
backward combine components" stay BF16 (arXiv:2412.19437 sec. 3.3.3, "Low-Precision Communication"). Those two
all_to_alls then move FP8 rows with their 1x128-tile scales (:data:`FP8_TILE_BYTES` an element). The values keep
their 16-bit type in the IR, and fc1's input is still cast after the dispatch, on the rows received (DeepSeek
casts the sender's tokens, fewer rows: not modelled).

``int8`` is MaxText's ``quantization: int8`` on TPUs: AQT dynamic-range quantisation of the forward, the
input gradient and the weight gradient (``fwd_bits=8, dlhs_bits=8``, and ``drhs_bits=8`` since
``quantization_local_shard_count`` defaults to -1), each with int32 accumulation
(``_get_int8_quant_config``, MaxText/layers/quantizations.py, commit e7292a3; base.yml). The same GEMMs
take the same place at the chip's int8 rate, and, since AQT quantises both operands of every dot
(``DotGeneral`` with an lhs and an rhs quantizer, aqt/jax/aqt_dot_general.py), each copy of a weight a
dot reads is cast too (once per forward gather and once per backward re-gather under FSDP). Not costed:
the stochastic-rounding noise (``rng_type="jax.uniform"``) of the gradient operands.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, replace
from typing import ClassVar

from echosim.ir.graph import Graph, Node, elementwise_fn
from echosim.ir.ops import Axis, CollectiveAttrs, ElementwiseAttrs, MatmulAttrs, OpKind, Phase
from echosim.ir.types import DType, TensorSpec

#: The element type a quantised operand is stored in, per format.
FORMATS = {"fp8": DType.FP8, "mxfp8": DType.FP8, "nvfp4": DType.FP4, "int8": DType.INT8}

#: Bytes per element of an activation quantised to FP8 with one fp32 scale per 1x128 tile, DeepSeek-V3's
#: fine-grained quantization of activations ("per token per 128 channels", arXiv:2412.19437 sec. 3.3.2): 1 + 4 / 128.
FP8_TILE_BYTES = 1 + 4 / 128


@dataclass(frozen=True)
class Fp8Linears:
    fmt: str = "fp8"  # fp8 | mxfp8 | nvfp4 | int8
    exclude: tuple[str, ...] = ("lm_head", "*.lm_head", "output", "*.output")
    # the MoE exchanges that feed an FP8 GEMM move FP8 rows (module docstring; DeepSeek-V3's, framework hai-llm)
    dispatch: bool = False
    name: ClassVar[str] = "fp8-linears"

    def run(self, graph: Graph) -> Graph:
        g = graph.copy()
        casts: dict[int, int] = {}  # 16-bit value -> its fp8 copy
        weight_casts: dict[tuple[int, Phase], int] = {}  # int8: (weight, phase) -> that phase's copy
        before: dict[int, list[int]] = {}  # consumer -> casts to place right before it
        linears = {n.id for n in graph if self._linear(graph, n)}  # before any weight operand becomes a cast
        for n in list(g):
            if n.id not in linears:
                continue
            # AQT quantises both operands of every dot, the weight too (its rhs quantizer)
            operands = list(n.inputs) if self.fmt == "int8" else quantised_operands(n)
            new_inputs = list(n.inputs)
            for i in operands:
                if i not in quantised_operands(n):
                    # the weight: AQT quantises it inside each dot (forward, recomputed forward, dlhs), so each
                    # phase casts its own copy and none is held from the forward to the backward
                    key = (i, n.phase)
                    if key not in weight_casts:
                        weight_casts[key] = self._cast(g, i, n.phase, n.scope)
                        before.setdefault(n.id, []).append(weight_casts[key])
                    new_inputs[n.inputs.index(i)] = weight_casts[key]
                    continue
                if i not in casts and self._quantised_gather(graph, i):
                    gather = g[i]
                    local = gather.inputs[0]
                    if local not in casts:
                        casts[local] = self._cast(g, local, gather.phase, gather.scope)
                        before.setdefault(i, []).append(casts[local])
                    out = TensorSpec(gather.out.shape, FORMATS[self.fmt])
                    assert isinstance(gather.attrs, CollectiveAttrs)
                    g.replace(i, inputs=(casts[local],), out=out, attrs=replace(gather.attrs, bytes=out.nbytes))
                    casts[i] = i  # the gathered value is the fp8 copy
                    for r in graph.users(i):  # a bias gradient sums the local 16-bit shard before the cast
                        if _bias_grad(graph[r]):
                            g.replace(r, inputs=(local,))
                if i not in casts:
                    casts[i] = self._cast(g, i, n.phase, n.scope)
                    before.setdefault(n.id, []).append(casts[i])
                new_inputs[n.inputs.index(i)] = casts[i]
            g.replace(n.id, inputs=tuple(new_inputs), attrs=replace(n.attrs, precision=self.fmt))
        g.move_before(before)
        if self.dispatch:
            for n in graph:
                if _fp8_exchange(graph, n):
                    assert isinstance(n.attrs, CollectiveAttrs)
                    g.replace(n.id, attrs=replace(n.attrs, bytes=math.ceil(n.out.numel * FP8_TILE_BYTES)))
        return g

    def _cast(self, g: Graph, value: int, phase: Phase, scope: str) -> int:
        """A quantising cast of ``value`` (reads 2 bytes, writes 1 per element, and the amax)."""
        src = g[value]
        return g.add(
            OpKind.ELEMENTWISE, [value], TensorSpec(src.out.shape, FORMATS[self.fmt]),
            ElementwiseAttrs(f"{self.fmt}_cast", 2), phase=phase, scope=scope, name=f"{src.name}.{self.fmt}",
        )  # fmt: skip

    def _quantised_gather(self, graph: Graph, value: int) -> bool:
        """``value`` is a sequence-parallel all_gather whose every reader is a linear in the format that
        quantises it: the forward's gathered input, or backward's gathered output gradient of a row-parallel
        linear, which its dgrad and wgrad both read."""
        node = graph[value]
        if node.op is not OpKind.ALL_GATHER or not isinstance(node.attrs, CollectiveAttrs):
            return False
        if node.attrs.axis is not Axis.TP or len(node.inputs) != 1:
            return False
        linears = [r for r in graph.users(value) if not _bias_grad(graph[r])]
        return bool(linears) and all(
            self._linear(graph, graph[r]) and value in quantised_operands(graph[r]) for r in linears
        )

    def _linear(self, g: Graph, n: Node) -> bool:
        if not isinstance(n.attrs, MatmulAttrs) or any(fnmatch.fnmatchcase(n.scope, p) for p in self.exclude):
            return False
        fwd = n if n.phase in (Phase.FORWARD, Phase.RECOMPUTE) else (g[n.origin] if n.origin is not None else None)
        return fwd is not None and len(fwd.inputs) > 1 and g[fwd.inputs[1]].op is OpKind.PARAMETER


def _fp8_exchange(graph: Graph, node: Node) -> bool:
    """An all_to_all whose rows an FP8 GEMM reads next: a MoE dispatch (fc1's input), and in backward the combine's
    gradient on its way to the experts (fc2's output gradient)."""
    if node.op is not OpKind.ALL_TO_ALL:
        return False
    if node.phase is Phase.FORWARD:
        return any(elementwise_fn(graph[i]) == "moe_dispatch" for i in node.inputs)
    origin = graph[node.origin] if node.origin is not None else None
    return (
        node.phase is Phase.BACKWARD
        and origin is not None
        and origin.op is OpKind.ALL_TO_ALL
        and any(elementwise_fn(graph[u]) == "moe_combine" for u in graph.users(origin.id))
    )


def _bias_grad(node: Node) -> bool:
    """A bias gradient (the sum of dy over the tokens): Transformer Engine takes it from the local output
    gradient before quantising and gathering it (grad_output_preprocess: ``grad_output.view(-1, n).sum(0)``)."""
    return node.op is OpKind.REDUCTION and isinstance(node.attrs, ElementwiseAttrs) and node.attrs.fn == "bias_grad"


def quantised_operands(node: Node) -> list[int]:
    """The inputs of the linear ``node`` that run in the format: a wgrad's all (x of every step, and dy),
    a forward's or dgrad's first (x, dy), never the weight."""
    assert isinstance(node.attrs, MatmulAttrs)
    return list(node.inputs) if node.attrs.grad_of == "wgrad" else list(node.inputs[:1])
