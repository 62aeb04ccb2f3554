"""DeepEP's cross-node expert dispatch, priced from two all_to_alls the backend already costs.

DeepEP's normal (training) kernels move a dispatched token across the network once per
destination *node*, to the GPU with the same local index there (its RDMA "rail"), and that
GPU forwards it over NVLink to every local GPU whose experts the token chose; the combine
runs the same path backwards (deepseek-ai/DeepEP README, "Normal kernels with NVLink and RDMA
forwarding"; DeepSeek-V3 technical report, arXiv:2412.19437 sec. 3.2.2). The two legs are
chunked and pipelined by the kernels, so the slower one sets the time.

NCCL's all_to_all instead sends each (token, expert) copy to its rank: a token routed to
``k`` experts on one remote node crosses the network ``k`` times. The rule below counts the
network copies under the routing NVIDIA's benchmarks force (each token's ``k`` experts drawn
evenly, without repetition, from all ``experts``): a token reaches a given other node with
probability ``1 - C(experts - experts/nodes, k) / C(experts, k)``.

Group-limited routing narrows that: DeepSeek-V3 splits its 256 routed experts into 8 groups and
draws a token's 8 experts from the 4 groups it scores highest ("each token will be sent to at most
M = 4 nodes", arXiv:2412.19437 sec. 2.1.2; ``n_group: 8, topk_group: 4`` in its config.json;
Megatron-Core's ``--moe-router-num-groups`` / ``--moe-router-group-topk``, set to 8 and 4 by
Megatron-Bridge's DeepSeekV3ModelProvider). Under forced balance the groups a token takes are an
even draw of ``group_topk`` of ``groups``, and its experts an even draw from those groups' experts.
No constant is fitted.
"""

from __future__ import annotations

from collections.abc import Callable
from math import comb

from echosim.backends.base import Placement
from echosim.ir.ops import OpKind

Collective = Callable[[OpKind, int, Placement], float]


def _none_of(pool: int, avoid: int, draws: int) -> float:
    """Probability that ``draws`` distinct picks from ``pool`` miss ``avoid`` given members of it."""
    if draws > pool:
        return 0.0
    return comb(pool - avoid, draws) / comb(pool, draws)


def node_reach(experts: int, top_k: int, nodes: int, groups: int = 0, group_topk: int = 0) -> float:
    """Probability that a token's ``top_k`` distinct experts include one on a given node of ``nodes``.

    ``groups`` / ``group_topk``: group-limited routing (module docstring); the experts of a group, like
    those of a node, are a contiguous range, so a node lies inside one group or holds whole groups.
    """
    if nodes <= 1 or experts <= 0 or top_k <= 0:
        return 1.0
    per_node = experts // nodes
    if per_node <= 0 or top_k > experts:
        return 1.0
    if groups <= 1 or group_topk >= groups or experts % groups:
        return 1.0 - _none_of(experts, per_node, top_k)
    per_group = experts // groups
    chosen = group_topk * per_group  # the experts a token may take
    if groups % nodes == 0:  # whole groups per node: how many of the node's groups the token took
        node_groups = groups // nodes
        miss = sum(
            comb(node_groups, j) * comb(groups - node_groups, group_topk - j) / comb(groups, group_topk)
            * _none_of(chosen, j * per_group, top_k)
            for j in range(min(node_groups, group_topk) + 1)
        )  # fmt: skip
        return 1.0 - miss
    if nodes % groups == 0:  # a node inside one group: that group taken, then one of the node's experts
        return group_topk / groups * (1.0 - _none_of(chosen, per_node, top_k))
    return 1.0 - _none_of(experts, per_node, top_k)  # groups straddle nodes: not modelled, no limit


def rdma_buffer(nbytes: int, experts: int, top_k: int, nodes: int, groups: int = 0, group_topk: int = 0) -> int:
    """The nccl-tests buffer of the network leg: an all_to_all among the ``nodes`` same-index GPUs.

    ``nbytes`` is the flat all_to_all's buffer (every (token, expert) copy, ``top_k`` per token);
    a token's bytes leave for each other node it reaches once, and an ``n``-rank buffer sends
    ``(n - 1) / n`` of itself away, so the buffer is ``nbytes * nodes * reach / top_k``.
    """
    return round(nbytes * nodes * node_reach(experts, top_k, nodes, groups, group_topk) / top_k)


def deepep_time_s(
    cost: Collective, nbytes: int, where: Placement, experts: int, top_k: int, groups: int = 0, group_topk: int = 0
) -> float:
    """Seconds of one DeepEP dispatch (or combine) of the expert-parallel group placed at ``where``.

    ``cost`` prices a collective on the backend. Within one node there is no network leg and the
    flat all_to_all is the NVLink exchange itself.
    """
    if where.nodes <= 1 or top_k <= 0:
        return cost(OpKind.ALL_TO_ALL, nbytes, where)
    rails = Placement(where.nodes, where.nodes, 1, where.per_node * where.concurrent_per_node)
    buffer = rdma_buffer(nbytes, experts, top_k, where.nodes, groups, group_topk)
    network = cost(OpKind.ALL_TO_ALL, buffer, rails)
    if where.per_node <= 1:
        return network
    local = Placement(where.per_node, 1, where.per_node, where.concurrent_per_node)
    return max(network, cost(OpKind.ALL_TO_ALL, nbytes, local))
