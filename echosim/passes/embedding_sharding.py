"""Embedding-table parallelism in TorchRec's terms: table-, row-, column-wise and data-parallel.

Recommendation models keep most of their parameters in embedding tables that no single
device holds, read a few rows of each per sample (pooled ``embedding_bag`` lookups), and
update only those rows. TorchRec shards each table one of four ways and moves the pooled
lookups between ranks (``torchrec/distributed/sharding/{tw,rw,cw,dp}_sharding.py``,
github.com/pytorch/torchrec, read at a48cef7):

* ``table`` (TW): a whole table on one rank. Ids travel to their table's owner (``KJTAllToAll``),
  the owner looks them up for the global batch, and the pooled rows come back with
  ``PooledEmbeddingsAllToAll``; in backward their gradients take the reverse all_to_all.
* ``row`` (RW): every rank holds ``ceil(rows / world)`` rows of each table. Ids are bucketised
  to the rank that holds their row; each rank pools its rows for the global batch into partial
  sums that ``PooledEmbeddingsReduceScatter`` adds up; backward all-gathers the gradients.
* ``column`` (CW): a table cut into column shards placed table-wise, with the TW all_to_all
  (``CwPooledEmbeddingSharding`` uses ``TwPooledEmbeddingDist``).
* ``data`` (DP): replicated; local lookups, the dense table gradient is all-reduced with the
  rest of the data-parallel gradients.

TW, RW and CW tables train with FBGEMM's fused backward-and-optimizer kernel (row-wise Adagrad:
one fp32 accumulator per row; the gradient never exists as a dense tensor): they are marked
``sparse`` so the data-parallel and optimizer passes leave them alone.

``auto`` picks per table the cheapest option that fits, as TorchRec's ``EmbeddingShardingPlanner``
does (enumerate options, estimate each with ``EmbeddingPerfEstimator`` and
``EmbeddingStorageEstimator``, propose the cheapest, partition greedily). The estimate here is
TorchRec's own closed form (``planner/shard_estimators.py``: input read + row lookup + output
write over HBM bandwidth, output over the collective's bandwidth, backward compute twice
forward) with TorchRec's default topology constants (``planner/constants.py``).

One representative rank is modelled, as everywhere in echosim: the busiest after the greedy
partition (TorchRec's ``GreedyPerfPartitioner`` places the most expensive shard first on the
least loaded rank with room).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from echosim.errors import EchosimError
from echosim.ir.graph import Graph, Node
from echosim.ir.ops import Axis, CollectiveAttrs, EmbeddingAttrs, OpKind, ParamAttrs, Phase, Role
from echosim.ir.types import TensorSpec
from echosim.passes.flops import ROWWISE_ADAGRAD_BYTES_PER_ROW

SHARDING_TYPES = ("none", "table", "row", "column", "data", "auto")

# TorchRec planner defaults (torchrec/distributed/planner/constants.py at a48cef7), bytes per second.
HBM_MEM_BW_BPS = 897 * 2**30
INTRA_NODE_BW_BPS = 600 * 2**30
CROSS_NODE_BW_BPS = 12.5 * 2**30
BWD_COMPUTE_MULTIPLIER = 2.0
HBM_CAP_BYTES = 32 * 2**30  # TorchRec's Topology default, used when no device capacity is given
# A data-parallel table trains under the dense optimizer: fp32 weight, gradient and Adam's two moments.
DENSE_TABLE_BYTES_PER_ELEMENT = 16


class ShardingError(EchosimError):
    """A sharding that cannot be done (unknown type, a table that fits on no device)."""


@dataclass(frozen=True)
class Table:
    """One pooled lookup of one table on one rank's micro-batch, as captured."""

    node: int  # the forward EMBEDDING node
    param: int
    name: str
    rows: int
    dim: int
    itemsize: int
    lookups: int  # rows gathered for the local micro-batch (batch x pooling factor)
    batch: int  # pooled outputs (samples) of the local micro-batch
    id_bytes: int  # bytes of one index

    @property
    def bytes(self) -> int:
        return self.rows * self.dim * self.itemsize


@dataclass(frozen=True)
class Shard:
    """A piece of a table placed on a rank: ``rows x cols`` of it."""

    table: int  # index into the table list
    kind: str  # table | row | column | data
    rows: int
    cols: int

    def storage(self, t: Table) -> int:
        """Bytes on its device: the rows and their row-wise Adagrad state (dense state for DP)."""
        if self.kind == "data":
            return self.rows * self.cols * DENSE_TABLE_BYTES_PER_ELEMENT
        return self.rows * self.cols * t.itemsize + self.rows * ROWWISE_ADAGRAD_BYTES_PER_ROW


def estimate_s(t: Table, kind: str, world: int, local_world: int) -> float:
    """TorchRec's per-table cost (``EmbeddingPerfEstimator``) of one sharding type, in seconds per step.

    Forward: read the ids, look up the rows, write the pooled outputs (HBM bandwidth), send the
    outputs (all_to_all for TW/CW, reduce-scatter for RW). Backward: twice the forward compute
    and the outputs' gradients back. DP: local lookups and an all-reduce of the table gradient.
    """
    comm_bw = INTRA_NODE_BW_BPS if world <= local_world else CROSS_NODE_BW_BPS
    ids = t.lookups * t.id_bytes
    lookup = t.lookups * t.dim * t.itemsize
    out = t.batch * t.dim * t.itemsize
    if kind == "data":
        nodes = min(world / local_world, 2)
        allreduce = t.rows * t.dim * 4 * (2 * nodes - 1) / nodes
        return (ids + lookup + out) / HBM_MEM_BW_BPS * (1 + BWD_COMPUTE_MULTIPLIER) + allreduce / comm_bw
    # TW / CW / RW: the shards together look up the global batch and write it once per shard
    compute = (ids + lookup + out) * world / HBM_MEM_BW_BPS
    return compute * (1 + BWD_COMPUTE_MULTIPLIER) + 2 * out * world / comm_bw


def shards_of(t: Table, index: int, kind: str, world: int) -> list[Shard]:
    if kind == "table":
        return [Shard(index, kind, t.rows, t.dim)]
    if kind == "row":
        return [Shard(index, kind, math.ceil(t.rows / world), t.dim) for _ in range(world)]
    if kind == "column":
        pieces = min(world, t.dim)
        return [Shard(index, kind, t.rows, math.ceil(t.dim / pieces)) for _ in range(pieces)]
    return [Shard(index, kind, t.rows, t.dim) for _ in range(world)]


@dataclass
class Placement:
    """Every rank's shards, the sharding type of each table and the representative (busiest) rank."""

    kinds: list[str]
    ranks: list[list[Shard]] = field(default_factory=list)
    rank: int = 0

    def mine(self, kind: str) -> list[Shard]:
        return [s for s in self.ranks[self.rank] if s.kind == kind]


def place(tables: list[Table], mode: str, world: int, local_world: int, capacity: int) -> Placement:
    """Choose each table's sharding and place its shards on ranks (greedy, most expensive first)."""
    kinds = []
    for t in tables:
        kind = mode if mode != "auto" else _cheapest(t, world, local_world, capacity)
        kinds.append(kind)
    ranks: list[list[Shard]] = [[] for _ in range(world)]
    load = [0.0] * world
    used = [0] * world
    shards: list[tuple[float, int, Shard]] = []
    for i, (t, kind) in enumerate(zip(tables, kinds, strict=True)):
        pieces = shards_of(t, i, kind, world)
        cost = estimate_s(t, kind, world, local_world) / len(pieces)
        if kind in ("row", "data"):  # one shard on every rank
            for r, s in enumerate(pieces):
                ranks[r].append(s)
                load[r] += cost
                used[r] += s.storage(t)
            continue
        shards += [(cost, i, s) for s in pieces]
    for r in range(world):
        if used[r] > capacity:
            _no_room(tables, kinds, used[r], capacity, world, mode)
    shards.sort(key=lambda x: (-x[0], x[1]))
    for cost, i, s in shards:
        need = s.storage(tables[i])
        room = [r for r in range(world) if used[r] + need <= capacity]
        if not room:
            raise ShardingError(
                f"embedding table {tables[i].name} ({tables[i].rows:,} x {tables[i].dim}): its {kinds[i]}-wise "
                f"shard of {need / 2**30:.1f} GiB fits on none of the {world} devices "
                f"({capacity / 2**30:.1f} GiB each, with the shards already placed); "
                + ("use more devices" if mode == "auto" else "use --embedding-sharding row or auto, or more devices")
            )
        best = min(room, key=lambda r: (load[r], r))
        ranks[best].append(s)
        load[best] += cost
        used[best] += need
    busiest = max(range(world), key=lambda r: (load[r], -r))
    return Placement(kinds, ranks, busiest)


def _cheapest(t: Table, world: int, local_world: int, capacity: int) -> str:
    fitting = []
    for kind in ("data", "table", "column", "row"):
        largest = max(s.storage(t) for s in shards_of(t, 0, kind, world))
        if largest <= capacity:
            fitting.append((estimate_s(t, kind, world, local_world), kind))
    if not fitting:
        rows = shards_of(t, 0, "row", world)[0].storage(t)
        raise ShardingError(
            f"embedding table {t.name} ({t.rows:,} x {t.dim}, {t.bytes / 2**30:.1f} GiB) fits on no device under any "
            f"sharding: even row-wise over {world} devices each holds {rows / 2**30:.1f} GiB of "
            f"{capacity / 2**30:.1f} GiB; use more devices"
        )
    return min(fitting)[1]


def _no_room(tables: list[Table], kinds: list[str], used: int, capacity: int, world: int, mode: str) -> None:
    biggest = max(range(len(tables)), key=lambda i: tables[i].bytes)
    t = tables[biggest]
    raise ShardingError(
        f"embedding tables need {used / 2**30:.1f} GiB per device under {kinds[biggest]}-wise sharding over {world} "
        f"devices ({capacity / 2**30:.1f} GiB each; largest {t.name}: {t.rows:,} x {t.dim}); "
        + ("use more devices" if mode == "auto" else "use --embedding-sharding row or auto, or more devices")
    )


def find_tables(graph: Graph) -> list[Table]:
    """The pooled lookups (``embedding_bag``) of the forward graph, in graph order."""
    out = []
    for n in graph:
        if n.op is not OpKind.EMBEDDING or n.phase is not Phase.FORWARD or not isinstance(n.attrs, EmbeddingAttrs):
            continue
        if not n.attrs.lookups or len(n.inputs) < 2 or graph[n.inputs[1]].op is not OpKind.PARAMETER:
            continue
        w = graph[n.inputs[1]]
        batch = n.out.numel // max(1, n.attrs.dim)
        name = n.scope or n.name
        out.append(
            Table(n.id, w.id, name, w.out.shape[0], w.out.shape[1], w.out.dtype.itemsize, n.attrs.lookups, batch,
                  graph[n.inputs[0]].out.dtype.itemsize)
        )  # fmt: skip
    return out


@dataclass(frozen=True)
class EmbeddingSharding:
    """Shard the pooled embedding tables of a model over its ``world`` data-parallel ranks."""

    mode: str
    world: int
    local_world: int = 8
    capacity_bytes: int = HBM_CAP_BYTES
    name: ClassVar[str] = "embedding-sharding"

    def __post_init__(self) -> None:
        if self.mode not in SHARDING_TYPES:
            raise ShardingError(f"--embedding-sharding {self.mode!r}: unknown (known: {', '.join(SHARDING_TYPES)})")

    def run(self, graph: Graph) -> Graph:
        tables = find_tables(graph)
        if self.mode == "none" or not tables:
            return graph
        placement = place(tables, self.mode, self.world, self.local_world, self.capacity_bytes)
        return _Rewrite(graph, tables, placement, self.world).run()


class _Rewrite:
    """Rebuild the graph with the representative rank's lookups and the collectives between ranks."""

    def __init__(self, src: Graph, tables: list[Table], placement: Placement, world: int) -> None:
        self.src, self.tables, self.placement, self.world = src, tables, placement, world
        self.out = Graph(src.name, src.repeats, src.block_layers)
        self.map: dict[int, int] = {}
        self.sharded = {t.node: i for i, t in enumerate(tables) if placement.kinds[i] != "data"}
        self.params = {tables[i].param: i for i in self.sharded.values()}

    def run(self) -> Graph:
        deferred: set[int] = set()
        for n in self.src:
            if n.id in self.sharded or any(i in deferred for i in n.inputs):
                deferred.add(n.id)
            elif n.id in self.params:
                self._param(n)
            else:
                self._copy(n)
        for kind in ("table", "column", "row"):
            self._group(kind)
        for n in self.src:
            if n.id in deferred and n.id not in self.sharded:
                self._copy(n)
        self.out.inputs = [self.map[i] for i in self.src.inputs]
        self.out.outputs = [self.map[o] for o in self.src.outputs]
        return self.out

    def _copy(self, n: Node) -> None:
        self.map[n.id] = self.out.add(n.op, [self.map[i] for i in n.inputs], n.out, n.attrs, phase=n.phase,
                                      scope=n.scope, name=n.name)  # fmt: skip

    def _param(self, n: Node) -> None:
        """The representative rank's share of a table: its rows (RW), columns (CW), the whole (TW), or none."""
        i = self.params[n.id]
        mine = [s for s in self.placement.ranks[self.placement.rank] if s.table == i]
        if not mine:
            return
        rows, cols = mine[0].rows, sum(s.cols for s in mine)
        attrs = n.attrs if isinstance(n.attrs, ParamAttrs) else ParamAttrs()
        shard = max(1, round(self.tables[i].rows * self.tables[i].dim / (rows * cols)))
        self.map[n.id] = self.out.add(
            OpKind.PARAMETER, [], n.out.with_shape((rows, cols)),
            ParamAttrs(attrs.shard * shard, attrs.expert, sparse=True), scope=n.scope, name=n.name,
        )  # fmt: skip

    def _group(self, kind: str) -> None:
        """One sharding type's input dist, local lookups, output dist and a slice per table."""
        members = [i for i, k in enumerate(self.placement.kinds) if k == kind]
        if not members:
            return
        g, w = self.out, self.world
        mine: dict[int, int] = {}  # table -> columns this rank looks up
        for s in self.placement.mine(kind):
            mine[s.table] = mine.get(s.table, 0) + s.cols
        first = self.src[self.tables[members[0]].node]
        scope = f"embedding_sharding.{kind}"
        ids = [self.map[self.src[self.tables[i].node].inputs[0]] for i in members]
        id_dtype = g[ids[0]].out.dtype
        # input dist: a rank sends every id of its micro-batch once per shard holding its table (RW:
        # to the row's owner) and receives the global batch's ids of the shards it holds
        send = sum(self.tables[i].lookups * (1 if kind == "row" else len(self._shards(i))) for i in members)
        recv = sum(self.tables[i].lookups * (1 if kind == "row" else w) for i in mine)
        count = max(send, recv)
        dist = g.add(OpKind.ALL_TO_ALL, ids, TensorSpec((max(1, count),), id_dtype),
                     CollectiveAttrs(Axis.DP, w, count * id_dtype.itemsize), scope=scope,
                     name=f"{scope}.input_dist")  # fmt: skip
        looked: list[int] = []
        for i in members:
            t = self.tables[i]
            if i not in mine:
                continue
            n = self.src[t.node]
            lookups = t.lookups if kind == "row" else t.lookups * w  # RW: 1/w of the global batch's ids
            idv = g.add(OpKind.VIEW, [dist], TensorSpec((lookups,), id_dtype), scope=n.scope, name=f"{n.name}.ids")
            cols = mine[i]
            attrs = EmbeddingAttrs(t.rows, cols, lookups=lookups, sparse=True)
            looked.append(g.add(OpKind.EMBEDDING, [idv, self.map[t.param]], n.out.with_shape((t.batch * w, cols)),
                                attrs, scope=n.scope, name=n.name))  # fmt: skip
        width = sum(self.tables[i].dim for i in members)
        batch = self.tables[members[0]].batch
        itemsize = first.out.dtype.itemsize
        out_spec = first.out.with_shape((batch, width))
        if kind == "row":  # partial sums of the global batch, reduced and scattered
            nbytes = w * batch * width * itemsize
            op = OpKind.REDUCE_SCATTER
        else:  # pooled rows of the global batch out, this rank's samples of every table in
            sent = w * batch * sum(mine.values()) * itemsize
            nbytes = max(sent, batch * width * itemsize)
            op = OpKind.ALL_TO_ALL
        outd = g.add(op, looked, out_spec, CollectiveAttrs(Axis.DP, w, nbytes, Role.LAYER), scope=scope,
                     name=f"{scope}.output_dist")  # fmt: skip
        for i in members:
            n = self.src[self.tables[i].node]
            self.map[n.id] = g.add(OpKind.VIEW, [outd], n.out, scope=n.scope, name=f"{n.name}.pooled")

    def _shards(self, i: int) -> list[Shard]:
        return [s for r in self.placement.ranks for s in r if s.table == i]


def table_state_bytes(graph: Graph) -> tuple[int, tuple[int, int]]:
    """Elements of the sparse (sharded) tables on this rank and their (weight, row-wise Adagrad) bytes."""
    elements = weights = state = 0
    for p in graph.params():
        if isinstance(p.attrs, ParamAttrs) and p.attrs.sparse:
            n = p.out.numel * graph.multiplicity(p)
            elements += n
            weights += p.out.nbytes * graph.multiplicity(p)
            state += p.out.shape[0] * ROWWISE_ADAGRAD_BYTES_PER_ROW * graph.multiplicity(p)
    return elements, (weights, state)
