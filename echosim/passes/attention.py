"""Choose the kernels a framework calls: fused flash attention or materialised scores, which flash
kernel, and whether its RMSNorm is one kernel.

``generation`` names the flash kernel a framework calls where it is not the device's best:
``"fa2"`` for FlashAttention-2 (PyTorch's SDPA flash backend, the flash-attn 2 package), whose
sm80 kernels run on Hopper and Blackwell too (:mod:`echosim.frameworks`), ``"fa1"`` for FlashAttention v1
and ``"triton"`` for FlashAttention's Triton kernel (each at FA1's published rate next to FA2), ``"te"`` for
Transformer Engine's DotProductAttention (cuDNN's fused attention from Hopper on:
:func:`echosim.backends.compute.te_view`).
``reference_norms``: the framework's RMSNorm is the Llama reference module run op by op in eager autograd
(:attr:`echosim.frameworks.Framework.norm_kernels`); every other framework runs one fused kernel.
``padded``: the framework calls a varlen flash kernel on padded tensors, with copies each way
(:attr:`echosim.frameworks.Framework.attention_unpad`).
``loss``: the cross-entropy kernels the framework calls (:attr:`echosim.frameworks.Framework.loss_kernel`, a key
of :data:`echosim.ir.ops.LOSS_KERNEL_BYTES`; '' = one pass over the logits).
``fp8``: the fused kernel runs in FP8 (:attr:`echosim.plan.Plan.fp8_attention`; priced by
:mod:`echosim.backends.fp8_attention`).
``blocks``: TPU splash attention's block sizes a run sets (:attr:`echosim.plan.Plan.splash_blocks`), which fix
the causal mask's granularity (:func:`echosim.backends.tpu.splash_blocks`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from echosim.ir.graph import Graph
from echosim.ir.ops import AttentionAttrs, CrossEntropyAttrs, NormAttrs


@dataclass(frozen=True)
class AttentionKernel:
    flash: bool = True
    generation: str = ""
    reference_norms: bool = False
    padded: bool = False  # the framework unpads q, k, v into the varlen layout and pads the output back
    loss: str = ""
    repeat_kv: bool = False  # K and V copied out to the query heads before the kernel (Framework.attention_repeat_kv)
    blocks: tuple[int, ...] = ()  # splash attention's block sizes (Plan.splash_blocks; (): MaxText's defaults)
    fp8: bool = False  # FP8 attention (Plan.fp8_attention): a fused kernel's operands in FP8
    name: ClassVar[str] = "attention-kernel"

    def run(self, graph: Graph) -> Graph:
        g = graph.copy()
        kernel = self.generation if self.flash else ""
        blocks = self.blocks if self.flash else ()
        want = (self.flash, kernel, self.padded and self.flash, self.repeat_kv, blocks, self.fp8 and self.flash)
        for n in list(g):
            a = n.attrs
            if isinstance(a, AttentionAttrs) and (a.flash, a.kernel, a.padded, a.repeat_kv, a.blocks, a.fp8) != want:
                g.replace(n.id, attrs=replace(a, flash=want[0], kernel=want[1], padded=want[2], repeat_kv=want[3],
                                              blocks=want[4], fp8=want[5]))  # fmt: skip
            elif (
                isinstance(n.attrs, NormAttrs)
                and n.attrs.kind == "rmsnorm"
                and n.attrs.reference != self.reference_norms
            ):
                g.replace(n.id, attrs=replace(n.attrs, reference=self.reference_norms))
            elif isinstance(n.attrs, CrossEntropyAttrs) and n.attrs.kernel != self.loss:
                g.replace(n.id, attrs=replace(n.attrs, kernel=self.loss))
        return g
