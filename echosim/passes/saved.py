"""Names of the forward values a checkpoint policy keeps, read from the IR's structure.

Checkpoint policies name tensors, not ops: MaxText's ``jax.checkpoint_policies.save_only_these_names``
lists ``query_proj``, ``key_proj``, ``value_proj``, ``context``, ``out_proj``, ``mlpwi``, ``mlpwo``
and ``decoder_layer_input`` (``src/maxtext/layers/decoders.py``, commit e591f30); torchtitan's
per-op policy keeps every other matmul output and the attention output. The IR has no such
names, so they are derived from where a value sits in a repeated layer, the same for every
frontend: a weight matmul that feeds attention is a projection (``qkv_proj``), one that reads
attention's output is ``out_proj``, the MLP's first matmuls (``mlpwi``) read a norm or the
expert dispatch and its last (``mlpwo``) reads the activation.
"""

from __future__ import annotations

from echosim.ir.graph import Graph, Node
from echosim.ir.ops import AttentionAttrs, Axis, CollectiveAttrs, OpKind, Phase

#: The tensor names a policy can keep, offload or recompute.
TENSOR_NAMES = ("decoder_layer_input", "qkv_proj", "context", "out_proj", "mlpwi", "mlpwo")
_PASS_THROUGH = (OpKind.VIEW, OpKind.ELEMENTWISE)


def base(graph: Graph, nid: int) -> int:
    """Follow views to the value that owns the storage."""
    while graph[nid].op is OpKind.VIEW and graph[nid].inputs:
        nid = graph[nid].inputs[0]
    return nid


def is_weight_matmul(graph: Graph, n: Node) -> bool:
    """A forward product of an activation with a parameter (a linear layer, an expert's GEMM)."""
    return n.op is OpKind.MATMUL and len(n.inputs) > 1 and graph[base(graph, n.inputs[1])].op is OpKind.PARAMETER


def _feeds_attention(graph: Graph, nid: int, depth: int = 8) -> bool:
    """Whether ``nid`` reaches an attention op through views and elementwise maps (RoPE) only."""
    frontier = [nid]
    for _ in range(depth):
        nxt = []
        for i in frontier:
            for u in graph.users(i):
                user = graph[u]
                if isinstance(user.attrs, AttentionAttrs) and user.phase is graph[nid].phase:
                    return True
                if user.op in _PASS_THROUGH and user.phase is graph[nid].phase:
                    nxt.append(u)
        if not nxt:
            return False
        frontier = nxt
    return False


def tensor_name(graph: Graph, n: Node) -> str:
    """The checkpoint name of forward value ``n`` ('' when policies have no name for it)."""
    if isinstance(n.attrs, AttentionAttrs):
        return "context"
    if not is_weight_matmul(graph, n):
        return ""
    src = graph[base(graph, n.inputs[0])]
    if isinstance(src.attrs, AttentionAttrs):
        return "out_proj"
    if _feeds_attention(graph, n.id):
        return "qkv_proj"
    if (
        src.op is OpKind.ELEMENTWISE
        and src.inputs
        and any(graph[base(graph, i)].op is OpKind.MATMUL for i in src.inputs)
    ):
        return "mlpwo"  # reads the activation of earlier products: the MLP's output projection
    return "mlpwi"


def names_in_block(graph: Graph) -> dict[int, str]:
    """The checkpoint name of every named forward value inside a repeated layer.

    A name tags the logical tensor, stored with its activation sharding: under tensor parallelism a
    row-parallel projection's partial sums are reduced (all-reduce, or reduce-scatter with sequence
    parallelism) before anything reads them, so the name sits on the reduction's output
    (:func:`reduced`). MaxText names ``out_proj`` after the projection returns, whose output sharding
    puts ``activation_embed`` on the ``tensor`` axis (src/maxtext/layers/attentions.py line 1366,
    src/maxtext/configs/base.yml line 598, commit e591f30); GSPMD partitions the dot into the partial
    product and its reduce-scatter, and the checkpoint keeps the sharded array.
    """
    out: dict[int, str] = {}
    for n in graph:
        if n.phase is Phase.FORWARD and graph.checkpoint_layer(n) is not None and (name := tensor_name(graph, n)):
            out[reduced(graph, n)] = name
    return out


def reduced(graph: Graph, n: Node) -> int:
    """``n``, or the tensor-parallel reduction that is its only forward reader (through views)."""
    nid = n.id
    while True:
        users = [graph[u] for u in graph.users(nid) if graph[u].phase is n.phase]
        if len(users) != 1:
            return n.id
        user = users[0]
        if user.op is OpKind.VIEW:
            nid = user.id
            continue
        reduces = user.op in (OpKind.REDUCE_SCATTER, OpKind.ALL_REDUCE)
        tp = isinstance(user.attrs, CollectiveAttrs) and user.attrs.axis is Axis.TP
        return user.id if reduces and tp else n.id


def alternate_matmuls(graph: Graph) -> set[int]:
    """torchtitan's per-op policy: of a layer's weight matmuls in forward order, the 1st, 3rd, ...

    (``torchtitan/distributed/activation_checkpoint.py``, commit b5bcd76: "Save all compute/comm
    ops, except every second mm/linear").
    """
    counts: dict[str, int] = {}
    out: set[int] = set()
    for n in graph:
        block = graph.checkpoint_layer(n)  # the counter restarts in each checkpointed layer
        if n.phase is not Phase.FORWARD or block is None or not is_weight_matmul(graph, n):
            continue
        counts[block] = counts.get(block, 0) + 1
        if counts[block] % 2 == 1:
            out.add(n.id)
    return out
