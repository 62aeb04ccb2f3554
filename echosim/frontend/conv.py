"""A convolution as the GEMM it runs, shared by the export, fx and ONNX frontends.

cuDNN runs a convolution as an implicit GEMM: (N * output pixels) x (C_in / g * kernel) @ (.. x C_out / g), once
per group g. A transposed convolution is the data gradient of one: each input pixel's C_in / g channels times the
(C_in / g x C_out / g * kernel) weight, the same FLOPs as the convolution it transposes. ``conv_io`` records the
activation elements cuDNN transposes when the tensors are NCHW and the product runs on tensor cores (see
:class:`~echosim.ir.ops.MatmulAttrs`); the parallelism passes also read it to tell a convolution from a linear.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from echosim.ir.ops import MatmulAttrs


def conv_matmul(
    x: Sequence[int], w: Sequence[int], out: Sequence[int], groups: int = 1, transposed: bool = False
) -> MatmulAttrs:
    """The product of a convolution with input shape ``x`` (N, C, spatial...), weight ``w`` and output ``out``;
    the weight is (C_out, C_in / g, k...) or, ``transposed``, (C_in, C_out / g, k...) as PyTorch and ONNX hold it."""
    kernel = math.prod(w[2:])
    io = math.prod(x) + math.prod(out)
    if transposed:
        return MatmulAttrs(m=x[0] * math.prod(x[2:]), n=w[1], k=w[0] // groups * kernel, batch=groups, conv_io=io)
    return MatmulAttrs(m=out[0] * math.prod(out[2:]), n=w[0] // groups, k=w[1] * kernel, batch=groups, conv_io=io)
