"""Modules that training stacks run as one kernel, whatever ops they are written in.

transformers writes ``LlamaRMSNorm`` as pow, mean, add, rsqrt, mul, mul and GPT-2's
GELU as its tanh formula; Megatron, Liger or torch.compile run each as one fused
kernel, and the zoo's ``F.rms_norm`` is one op. Both the export and the ONNX
frontends collapse a call of such a module (found by class-name suffix in
``nn_module_stack`` or in the exporter's ``class_hierarchy`` metadata) into one IR
node, so the same model costs the same through every frontend.
"""

from __future__ import annotations

from dataclasses import dataclass

from echosim.ir.ops import Attrs, ElementwiseAttrs, NormAttrs, OpKind


@dataclass(frozen=True)
class FusedKind:
    """The IR op a fused module becomes; ``data_inputs`` caps the activations it reads (params always kept)."""

    op: OpKind
    attrs: Attrs
    data_inputs: int = 1


FUSED_MODULES: tuple[tuple[str, FusedKind], ...] = (
    ("RMSNorm", FusedKind(OpKind.NORM, NormAttrs("rmsnorm"))),
    ("LayerNorm", FusedKind(OpKind.NORM, NormAttrs("layernorm"))),
    ("GELUActivation", FusedKind(OpKind.ELEMENTWISE, ElementwiseAttrs("gelu", 8))),
    ("GELUTanh", FusedKind(OpKind.ELEMENTWISE, ElementwiseAttrs("gelu", 8))),
    ("SiLUActivation", FusedKind(OpKind.ELEMENTWISE, ElementwiseAttrs("silu", 4))),
)


def fused_kind(class_name: str) -> FusedKind | None:
    """The fused op for a module class (a dotted or bare name), if it is one of ``FUSED_MODULES``."""
    name = class_name.rsplit(".", 1)[-1]
    for suffix, kind in FUSED_MODULES:
        if name.endswith(suffix):
            return kind
    return None
