"""Strides of row-major tensors and of their views: which reshapes of a strided tensor are views.

Eager PyTorch holds a view's elements where its base put them; a later ``reshape`` is a view only if the
new shape can be expressed with strides over the same memory, and a copy otherwise (torch.reshape docs,
https://pytorch.org/docs/stable/generated/torch.reshape.html). :func:`view_strides` is that test, the
rule of ``computeStride`` in aten/src/ATen/TensorUtils.cpp restated: each run of old dimensions that are
contiguous with one another in memory may be split or merged freely, and a new dimension may not span two runs.
"""

from __future__ import annotations

import math


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides, in elements."""
    out, step = [], 1
    for size in reversed(shape):
        out.append(step)
        step *= max(size, 1)
    return tuple(reversed(out))


def permuted_strides(shape: tuple[int, ...], order: tuple[int, ...]) -> tuple[int, ...]:
    """Strides of a ``shape`` tensor whose dimensions lie in memory in ``order`` (outermost first): a dense
    tensor allocated in another layout and viewed in this one."""
    held = contiguous_strides(tuple(shape[d] for d in order))
    out = [0] * len(shape)
    for pos, d in enumerate(order):
        out[d] = held[pos]
    return tuple(out)


def permutation(base: tuple[int, ...], permuted: tuple[int, ...]) -> tuple[int, ...] | None:
    """``perm`` with ``permuted == tuple(base[p] for p in perm)`` when that is all a view of ``base`` can be (a
    permute or transpose); None when the shapes are no such pair, or when a repeated size > 1 leaves the
    pairing ambiguous (then the caller cannot tell the layout, and assumes the view keeps it)."""
    if len(base) != len(permuted) or tuple(base) == tuple(permuted) or sorted(base) != sorted(permuted):
        return None
    if any(base.count(s) > 1 for s in base if s > 1):
        return None
    free = list(range(len(base)))
    perm = []
    for size in permuted:
        j = next(j for j in free if base[j] == size)
        free.remove(j)
        perm.append(j)
    return tuple(perm)


def view_strides(shape: tuple[int, ...], strides: tuple[int, ...], new: tuple[int, ...]) -> tuple[int, ...] | None:
    """Strides of ``new`` as a view of a ``shape`` tensor with ``strides``; None where only a copy can give it."""
    if math.prod(shape) != math.prod(new):
        raise ValueError(f"cannot view {shape} as {new}: {math.prod(shape)} != {math.prod(new)} elements")
    if math.prod(shape) == 0:
        return contiguous_strides(new)
    dims = [(size, stride) for size, stride in zip(shape, strides, strict=True) if size != 1]  # size 1: any stride
    runs: list[tuple[int, int]] = []  # (elements, stride of the innermost dim), innermost run first
    for size, stride in reversed(dims):
        if runs and runs[-1][1] * runs[-1][0] == stride:  # continues the run below it in memory
            runs[-1] = (runs[-1][0] * size, runs[-1][1])
        else:
            runs.append((size, stride))
    out = [0] * len(new)
    j = len(new) - 1
    for elements, stride in runs:
        filled = 1
        while j >= 0 and filled < elements:
            out[j] = stride * filled
            filled *= new[j]
            j -= 1
        if filled != elements:  # a new dimension would span two runs
            return None
    for k in range(j, -1, -1):  # the outer size-1 dimensions left
        out[k] = out[k + 1] * new[k + 1] if k + 1 < len(new) else 1
    return tuple(out)
