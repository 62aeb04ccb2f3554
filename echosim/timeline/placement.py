"""Where each parallel axis's communication groups sit on the machine, in Megatron-Core's rank order.

The backend prices a collective from its :class:`~echosim.backends.base.Placement` (nodes
spanned, members per node, sibling groups sharing a node's links); this module derives one
placement per :class:`~echosim.ir.ops.Axis` from the parallel degrees, in closed form, so
it costs the same at 8 devices as at 16,384.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from echosim.backends.base import Placement
from echosim.backends.topology import megatron_placement
from echosim.ir.ops import Axis


@dataclass(frozen=True)
class Degrees:
    """The parallel degrees of a layout (expert parallelism is folded over ``tp * cp * dp``)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 0  # the routed experts' tensor-parallel degree; 0: tp
    cp_a2a: int = 0  # hierarchical CP: the all_to_all groups' size (their CP ranks neighbours); 0: not hierarchical


def axis_placements(d: Degrees, devices_per_node: int) -> dict[Axis, Placement]:
    """A placement for every axis a collective can name (a fresh dict; the placements are kept per degrees).

    Dense layers order ranks tp, cp, dp, pp and reduce gradients over the dp x cp ranks of a
    stage. Expert layers order them etp, ep, edp, pp (Megatron-Core's MoE parallel folding: tp, cp
    and dp fold into etp x ep x edp): an EP group is ``ep`` ranks ``etp`` apart, its experts'
    data-parallel peers ``etp * ep`` apart. Tied embeddings synchronise the first and the last
    pipeline stage. Hierarchical context parallelism splits each CP group into all-to-all groups of
    ``cp_a2a`` neighbouring CP ranks and rings over the ranks ``tp * cp_a2a`` apart. Table-wise-row-wise
    embedding tables reduce over a node's data-parallel ranks, then exchange over the ranks a node apart.
    """
    return dict(_placements(d, devices_per_node))


@lru_cache(maxsize=4096)
def _placements(d: Degrees, devices_per_node: int) -> dict[Axis, Placement]:
    """:func:`axis_placements`, computed once per degrees and node size (a search checks each layout's)."""
    sizes = {"tp": d.tp, "dp": d.dp, "pp": d.pp}
    out = {Axis(axis): megatron_placement(axis, sizes, devices_per_node) for axis in sizes}
    pp = out[Axis.PP]
    out[Axis.EMBED] = Placement(2, min(2, pp.nodes), 1 if pp.nodes > 1 else 2, pp.concurrent_per_node)
    if d.cp > 1 or d.ep > 1 or d.etp not in (0, d.tp):
        dense = {"tp": d.tp, "cp": d.cp, "dp": d.dp, "pp": d.pp}
        out.update({Axis(axis): megatron_placement(axis, dense, devices_per_node) for axis in dense})
        out[Axis.DP] = megatron_placement("dp", {"tp": d.tp, "dp": d.dp * d.cp, "pp": d.pp}, devices_per_node)
        etp = d.etp or d.tp
        expert = {"tp": etp, "ep": d.ep, "edp": max(1, d.tp * d.dp * d.cp // (etp * d.ep)), "pp": d.pp}
        out[Axis.EP] = megatron_placement("ep", expert, devices_per_node)
        out[Axis.EDP] = out[Axis.EFSDP] = megatron_placement("edp", expert, devices_per_node)
    if 1 < d.cp_a2a < d.cp:  # Megatron-Core's create_hierarchical_groups: the first level's ranks are neighbours
        tiers = {"tp": d.tp, "cp_a2a": d.cp_a2a, "cp_p2p": d.cp // d.cp_a2a, "dp": d.dp, "pp": d.pp}
        out[Axis.CP_A2A] = megatron_placement("cp_a2a", tiers, devices_per_node)
        out[Axis.CP_P2P] = megatron_placement("cp_p2p", tiers, devices_per_node)
    out[Axis.FSDP] = out[Axis.DP]  # ZeRO-3 / FSDP shards over the data-parallel group
    # table-wise-row-wise embedding sharding (data-parallel layouts only): the dp ranks of one node, and
    # those with the same local rank on every node (TorchRec's intra_and_cross_node_pg). A job within one node is
    # one host of all its ranks, as the pass groups them (embedding_sharding.host_size); over nodes that do not
    # divide it (which table_row refuses) any common divisor keeps the tiers whole
    local = max(1, devices_per_node // d.tp)
    host = d.dp if d.dp <= local else math.gcd(d.dp, local)
    tiers = {"tp": d.tp, "dp_intra": host, "dp_cross": d.dp // host, "pp": d.pp}
    out[Axis.DP_INTRA] = megatron_placement("dp_intra", tiers, devices_per_node)
    out[Axis.DP_CROSS] = megatron_placement("dp_cross", tiers, devices_per_node)
    return out
