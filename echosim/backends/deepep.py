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
probability ``1 - C(experts - experts/nodes, k) / C(experts, k)``. No constant is fitted.
"""

from __future__ import annotations

from collections.abc import Callable
from math import comb

from echosim.backends.base import Placement
from echosim.ir.ops import OpKind

Collective = Callable[[OpKind, int, Placement], float]


def node_reach(experts: int, top_k: int, nodes: int) -> float:
    """Probability that a token's ``top_k`` distinct experts include one on a given node of ``nodes``."""
    if nodes <= 1 or experts <= 0 or top_k <= 0:
        return 1.0
    per_node = experts // nodes
    if per_node <= 0 or top_k > experts:
        return 1.0
    return 1.0 - comb(experts - per_node, top_k) / comb(experts, top_k)


def rdma_buffer(nbytes: int, experts: int, top_k: int, nodes: int) -> int:
    """The nccl-tests buffer of the network leg: an all_to_all among the ``nodes`` same-index GPUs.

    ``nbytes`` is the flat all_to_all's buffer (every (token, expert) copy, ``top_k`` per token);
    a token's bytes leave for each other node it reaches once, and an ``n``-rank buffer sends
    ``(n - 1) / n`` of itself away, so the buffer is ``nbytes * nodes * reach / top_k``.
    """
    return round(nbytes * nodes * node_reach(experts, top_k, nodes) / top_k)


def deepep_time_s(cost: Collective, nbytes: int, where: Placement, experts: int, top_k: int) -> float:
    """Seconds of one DeepEP dispatch (or combine) of the expert-parallel group placed at ``where``.

    ``cost`` prices a collective on the backend. Within one node there is no network leg and the
    flat all_to_all is the NVLink exchange itself.
    """
    if where.nodes <= 1 or top_k <= 0:
        return cost(OpKind.ALL_TO_ALL, nbytes, where)
    rails = Placement(where.nodes, where.nodes, 1, where.per_node * where.concurrent_per_node)
    network = cost(OpKind.ALL_TO_ALL, rdma_buffer(nbytes, experts, top_k, where.nodes), rails)
    if where.per_node <= 1:
        return network
    local = Placement(where.per_node, 1, where.per_node, where.concurrent_per_node)
    return max(network, cost(OpKind.ALL_TO_ALL, nbytes, local))
