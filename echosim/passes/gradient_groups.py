"""Which ranks share a gradient, once expert parallelism is in the layout.

Runs after the data-parallel pass, whatever collectives it chose (all_reduce,
reduce_scatter, ZeRO/FSDP all_gathers), and splits off the routed experts' share:

* The data-parallel pass already reduces over the ``dp * cp`` ranks of a stage
  (Megatron-Core's data-parallel group "with context parallel"; every rank of a CP group
  computes partial weight gradients of the same weights from its part of the sequence).
* Expert parallelism: a routed expert lives on ``tp * dp * cp / (etp * ep)`` ranks
  only (Megatron-Core's MoE parallel folding lays etp x ep x edp over a stage's
  tp x cp x dp ranks; with etp = tp that is ``dp * cp / ep``), so the expert share of
  each collective moves to the expert-data-parallel group: axis ``edp`` for gradient reductions and ZeRO
  all_gathers, ``efsdp`` for the per-layer FSDP traffic. The share is the expert
  weights' part of the bytes the collective carries (per layer, or per model for the
  step-end all_gather).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from echosim.ir.graph import Graph, Node
from echosim.ir.ops import Axis, CollectiveAttrs, ParamAttrs, Phase

_EXPERT_AXIS = {Axis.DP: Axis.EDP, Axis.FSDP: Axis.EFSDP}


def _expert(node: Node) -> bool:
    return isinstance(node.attrs, ParamAttrs) and node.attrs.expert


@dataclass(frozen=True)
class GradientGroups:
    ep: int = 1
    expert_fold: int = 1  # tp / etp: tensor-parallel ranks that hold the same (unsplit) experts
    name: ClassVar[str] = "gradient-groups"

    def run(self, graph: Graph) -> Graph:
        if self.ep == 1 and self.expert_fold == 1:  # no collective has an expert share to split off
            return graph
        g = graph.copy()
        share = self._expert_share(g)
        clones: dict[int, int] = {}
        resized: dict[tuple[CollectiveAttrs, int], CollectiveAttrs] = {}  # a scope's buckets share their attrs
        for n in list(g):
            a = n.attrs
            if not isinstance(a, CollectiveAttrs) or a.axis not in _EXPERT_AXIS:
                continue
            key = "*" if n.phase is Phase.OPTIMIZER else n.scope or "-"
            expert_bytes = round(a.bytes * share.get(key, 0.0))
            if not expert_bytes:
                continue
            new = resized.get((a, expert_bytes))
            if new is None:
                new = resized[(a, expert_bytes)] = replace(a, bytes=a.bytes - expert_bytes)
            g.replace(n.id, attrs=new)
            spec = n.out.with_shape((max(1, n.out.numel * expert_bytes // max(1, a.bytes)),))
            clones[n.id] = g.add(
                n.op,
                n.inputs,
                spec,
                CollectiveAttrs(_EXPERT_AXIS[a.axis], a.size * self.expert_fold // self.ep, expert_bytes, a.role),
                phase=n.phase,
                scope=n.scope,
                name=f"{n.name}.experts",
            )
        if clones:  # each expert share runs right after the collective it was split from
            order: list[int] = []
            placed = set(clones.values())
            for nid in g.nodes:
                if nid in placed:
                    continue
                order.append(nid)
                if nid in clones:
                    order.append(clones[nid])
            g.nodes = {nid: g.nodes[nid] for nid in order}
        return g

    def _expert_share(self, g: Graph) -> dict[str, float]:
        """Expert weights' share of the gradient bytes, per repeated block and ("*") per model."""
        total: dict[str, float] = {}
        expert: dict[str, float] = {}
        for p in g.grads:
            node = g[p]
            size = node.out.numel
            scope = g.layer_of(node) or "-"  # gradient reductions sit on each layer (passes/data_parallel.py)
            for key, weight in ((scope, 1), ("*", g.multiplicity(node))):
                total[key] = total.get(key, 0.0) + size * weight
                if _expert(node):
                    expert[key] = expert.get(key, 0.0) + size * weight
        share = {k: expert.get(k, 0.0) / v for k, v in total.items() if v}
        share.pop("-", None)  # collectives outside the repeated block carry no experts
        return share
