"""Data parallelism and the optimizer step.

DDP-style gradient all_reduce over ``dp`` replicas, bucketed the way PyTorch DDP
and Megatron-LM group gradients (buckets fill in backward order, one repeated
layer at a time), so the timeline can overlap each bucket with the backward of
the layers still to come. Gradients are reduced in ``reduce_dtype`` (Megatron's
fp32 main-grad buffer by default).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from echosim.ir.graph import Graph
from echosim.ir.ops import CollectiveAttrs, OpKind, OptimizerAttrs, Phase
from echosim.ir.types import DType, TensorSpec
from echosim.passes.flops import param_count


@dataclass(frozen=True)
class DataParallel:
    dp: int
    bucket_bytes: int = 40_000_000 * 4  # Megatron-LM's default bucket: 40M fp32 elements
    reduce_dtype: DType = DType.FP32
    name: ClassVar[str] = "data-parallel"

    def run(self, graph: Graph) -> Graph:
        if self.dp == 1:
            return graph
        g = graph.copy()
        groups: dict[str, list[int]] = {}
        for param, grad in graph.grads.items():
            attrs = g[grad].attrs
            if isinstance(attrs, CollectiveAttrs) and attrs.axis == "embed":  # tied weight: synced at step end
                groups.setdefault("", []).append(param)
                continue
            groups.setdefault(g.block_of(g[param]) or "", []).append(param)
        # later layers' gradients are ready first: reduce the block's buckets before the rest
        for scope in sorted(groups, key=lambda s: (s == "", s)):
            params = groups[scope]
            elems = sum(g[p].out.numel for p in params)
            nbytes = elems * self.reduce_dtype.itemsize
            buckets = max(1, math.ceil(nbytes / self.bucket_bytes))
            grads = [graph.grads[p] for p in params]
            for b in range(buckets):
                size = nbytes // buckets
                spec = TensorSpec((size // self.reduce_dtype.itemsize,), self.reduce_dtype)
                g.add(
                    OpKind.ALL_REDUCE,
                    grads,
                    spec,
                    CollectiveAttrs("dp", self.dp, size),
                    phase=Phase.BACKWARD,
                    scope=scope,
                    name=f"dp.grad_all_reduce.{scope or 'rest'}.{b}",
                )
        return g


# Bytes an Adam(W) step moves per parameter with fp32 master weights (Megatron mixed
# precision): read fp32 grad, master, m, v (16) + write master, m, v (12) + write
# the 16-bit model copy (2) + read the grad again for the global-norm clip (4).
ADAM_BYTES_PER_PARAM = 34


@dataclass(frozen=True)
class Optimizer:
    kind: str = "adam"
    name: ClassVar[str] = "optimizer"

    def run(self, graph: Graph) -> Graph:
        if self.kind not in ("adam", "adamw"):
            raise ValueError(f"unknown optimizer {self.kind!r} (known: adam, adamw)")
        g = graph.copy()
        n = param_count(g)
        grads = list(g.grads.values())
        g.add(
            OpKind.OPTIMIZER_UPDATE,
            grads,
            TensorSpec((max(n, 1),), DType.FP32),
            OptimizerAttrs(self.kind, n, ADAM_BYTES_PER_PARAM),
            phase=Phase.OPTIMIZER,
            name="optimizer.step",
        )
        return g
