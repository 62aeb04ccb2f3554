"""Where a parallel axis's communication groups land on nodes, Megatron rank order.

Megatron-LM numbers ranks with tensor parallel fastest, then context, expert, data and
pipeline parallel (``tp, cp, ep, dp, pp``): the TP ranks of a stage are consecutive GPUs
of one node, DP peers are ``tp * cp * ep`` ranks apart, and pipeline stages are furthest
apart. The collective model needs, for one group, how many nodes it spans, how many of
its members share a node, and how many sibling groups share that node's NICs.
"""

from __future__ import annotations

import math

from echosim.backends.base import Placement

MEGATRON_ORDER = ("tp", "cp", "ep", "dp", "pp")


def fill_domains(devices: int, domain: int) -> int:
    """Devices per node for a job of ``devices`` on machines whose fast domain holds ``domain``.

    A job that fills whole domains gets the domain; one that does not (128 GPUs of NVL72 racks)
    spreads evenly over as few domains as hold it (two racks of 64), when that divides.
    """
    if devices <= domain or devices % domain == 0:
        return domain
    domains = -(-devices // domain)
    return devices // domains if devices % domains == 0 else domain


def megatron_placement(axis: str, sizes: dict[str, int], devices_per_node: int) -> Placement:
    """Placement of the ``axis`` group that contains rank 0.

    ``sizes`` lists the parallel degrees with the fastest-varying axis first, e.g.
    ``{"tp": 8, "dp": 8, "pp": 16}``; its product is the world size.
    """
    if axis not in sizes:
        raise ValueError(f"axis {axis!r} is not one of the parallel axes {list(sizes)}")
    for name, size in sizes.items():
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"parallel degree {name}={size!r} must be a positive integer")
    if devices_per_node < 1:
        raise ValueError(f"devices_per_node must be >= 1, got {devices_per_node}")
    world = math.prod(sizes.values())
    if world > devices_per_node and world % devices_per_node:
        layout = " x ".join(f"{k}{v}" for k, v in sizes.items())
        raise ValueError(f"world size {world} ({layout}) does not divide into nodes of {devices_per_node} devices")
    stride = math.prod(list(sizes.values())[: list(sizes).index(axis)])
    nodes, per_node = _group_shape(sizes[axis], stride, world, devices_per_node, axis)
    return Placement(
        size=sizes[axis],
        nodes=nodes,
        per_node=per_node,
        concurrent_per_node=min(world, devices_per_node) // per_node,
    )


def _group_shape(size: int, stride: int, world: int, per_node_devices: int, axis: str) -> tuple[int, int]:
    """(nodes spanned, members per node) of a group of ``size`` ranks ``stride`` apart.

    Closed form, so placement costs the same at 8 devices as at 16,384: members that are
    a node or more apart never share one; closer members pack ``node / stride`` to a node.
    """
    if world <= per_node_devices or size == 1:
        return 1, size
    if stride >= per_node_devices:
        return size, 1
    span = size * stride
    if per_node_devices % stride == 0 and (span % per_node_devices == 0 or per_node_devices % span == 0):
        per_node = min(size, per_node_devices // stride)
        return size // per_node, per_node
    raise ValueError(
        f"{axis} groups ({size} ranks {stride} apart) straddle nodes of {per_node_devices} devices unevenly"
    )
