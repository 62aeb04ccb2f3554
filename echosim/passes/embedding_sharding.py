"""Embedding-table parallelism in TorchRec's terms: table-, row-, column-, table-row-wise and data-parallel.

Recommendation models keep most of their parameters in embedding tables that no single
device holds, read a few rows of each per sample (pooled ``embedding_bag`` lookups), and
update only those rows. TorchRec shards each table one of five ways and moves the pooled
lookups between ranks (``torchrec/distributed/sharding/{tw,rw,cw,twrw,dp}_sharding.py``,
github.com/pytorch/torchrec, read at a48cef7):

* ``table`` (TW): a whole table on one rank. Ids travel to their table's owner (``KJTAllToAll``),
  the owner looks them up for the global batch, and the pooled rows come back with
  ``PooledEmbeddingsAllToAll``; in backward their gradients take the reverse all_to_all.
* ``row`` (RW): every rank holds ``ceil(rows / world)`` rows of each table. Ids are bucketised
  to the rank that holds their row; each rank pools its rows for the global batch into partial
  sums that ``PooledEmbeddingsReduceScatter`` adds up; backward all-gathers the gradients.
* ``column`` (CW): a table cut into column shards placed table-wise, with the TW all_to_all
  (``CwPooledEmbeddingSharding`` uses ``TwPooledEmbeddingDist``). The planner's shards are
  128 columns or more (:func:`column_block`), so a table of 128 columns or fewer is one shard.
* ``table_row`` (TWRW): a table on one node, its rows spread over that node's ranks. Ids go to
  their row's owner; the node's partial sums of the global batch are reduce-scattered within the
  node, then an all_to_all over the ranks with the same local rank on every node hands each rank
  its own samples (``TwRwPooledEmbeddingDist``: ``intra_pg`` then ``cross_pg``). Backward runs the
  all_to_all and then an all-gather within the node. It keeps the reduce-scatter on NVLink where
  row-wise sharding over several nodes runs it across them.
* ``data`` (DP): replicated; local lookups, the dense table gradient is all-reduced with the
  rest of the data-parallel gradients.

TW, RW, CW and TWRW tables train with FBGEMM's fused backward-and-optimizer kernel (row-wise Adagrad:
one fp32 accumulator per row; the gradient never exists as a dense tensor): they are marked
``sparse`` so the data-parallel and optimizer passes leave them alone.

``auto`` picks per table the cheapest type that fits, as TorchRec's ``EmbeddingShardingPlanner``
does (enumerate options, estimate each with ``EmbeddingPerfEstimator`` and
``EmbeddingStorageEstimator``, propose the cheapest, partition greedily). The estimate here is
TorchRec's own closed form per shard (``planner/shard_estimators.py``: input read + row lookup +
output write over HBM bandwidth, backward compute twice forward, the outputs over the collective's
bandwidth, :func:`shard_cost_s`) with TorchRec's default topology constants (``planner/constants.py``),
and shards are placed as ``GreedyPerfPartitioner`` places them (:func:`place`).

One representative rank is modelled, as everywhere in echosim: the busiest after that placement.
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

SHARDING_TYPES = ("none", "table", "row", "column", "data", "table_row", "auto")
#: The types ``auto`` weighs, in the order TorchRec's ``EmbeddingBagCollectionSharder.sharding_types`` lists them
#: (embedding_types.py); of two equally cheap types the first is kept, as the planner's stable sort keeps it.
AUTO_TYPES = ("data", "table", "column", "row", "table_row")
#: How the report names each type.
LABELS = {"table": "table-wise", "row": "row-wise", "column": "column-wise", "data": "data-parallel",
          "table_row": "table-wise-row-wise"}  # fmt: skip
#: Types whose shards sit one on every rank (TorchRec's ``PartitionByType.UNIFORM``), placed before the rest.
UNIFORM_TYPES = ("row", "data")

# TorchRec planner defaults (torchrec/distributed/planner/constants.py at a48cef7), bytes per second; the
# multipliers and penalties are the file's "empirical studies" of FBGEMM's kernels.
HBM_MEM_BW_BPS = 897 * 2**30
INTRA_NODE_BW_BPS = 600 * 2**30
CROSS_NODE_BW_BPS = 12.5 * 2**30
BWD_COMPUTE_MULTIPLIER = 2.0
BATCHED_COPY_PERF_FACTOR = 2.455  # the row-wise output gradient's copy before its all-gather
FULL_BLOCK_EMB_DIM = 128  # a lookup kernel's 32 threads x 4-wide vectors fill a block at 128 columns
HALF_BLOCK_PENALTY = 1.15  # 64 <= columns < 128
QUARTER_BLOCK_PENALTY = 1.75  # columns < 64
MIN_LOOKUP_DIM = 32  # "minimum embedding dim is set to 32 due to kernel usage" (table-wise lookups)
DP_ELEMENTWISE_KERNELS_PERF_FACTOR = 9.22  # a replicated table's optimizer: SGD + fill + unary kernels
MIN_CW_DIM = 128  # column-wise shards are at least this wide
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

    @property
    def held_bytes(self) -> int:
        """The rows and their row-wise Adagrad state: what the ranks hold of it together, sharded."""
        return self.bytes + self.rows * ROWWISE_ADAGRAD_BYTES_PER_ROW


@dataclass(frozen=True)
class Shard:
    """A piece of a table placed on a rank: ``rows x cols`` of it."""

    table: int  # index into the table list
    kind: str  # table | row | column | data | table_row
    rows: int
    cols: int

    def storage(self, t: Table) -> int:
        """Bytes on its device: the rows and their row-wise Adagrad state (dense state for DP)."""
        if self.kind == "data":
            return self.rows * self.cols * DENSE_TABLE_BYTES_PER_ELEMENT
        return self.rows * self.cols * t.itemsize + self.rows * ROWWISE_ADAGRAD_BYTES_PER_ROW


def host_size(world: int, local_world: int) -> int:
    """Ranks of one host that a table-wise-row-wise table's rows are spread over."""
    return max(1, min(local_world, world))


def _comm_bw(group: int, local_world: int) -> float:
    """TorchRec's ``BasicCommsBandwidths.get_bw``: intra-node while the group fits in one host."""
    return INTRA_NODE_BW_BPS if group <= local_world else CROSS_NODE_BW_BPS


def shard_cost_s(t: Table, kind: str, cols: int, world: int, local_world: int) -> float:
    """TorchRec's estimate of one shard (``EmbeddingPerfEstimator``, ``Perf.total``), in seconds per step.

    ``planner/shard_estimators.py`` (``_get_{tw,rw,twrw,dp}_sharding_perf``; CW shards are costed as TW
    shards of their columns): forward compute is the ids read, the rows looked up and the pooled outputs
    written over HBM bandwidth; backward compute is twice that; communication is the outputs over the
    collective's bandwidth each way. A row-wise shard writes partial sums for the global batch and copies
    their gradients once more; a table-wise-row-wise one reduce-scatters them within its host and sends
    its host's samples across hosts; a replicated table all-reduces its gradient and runs the dense
    optimizer's elementwise kernels over it. A job smaller than a node is its own host (TorchRec's
    ``Topology`` takes the world size when no local size is given).
    """
    hbm, s = HBM_MEM_BW_BPS, t.itemsize
    local_world = host_size(world, local_world)
    if kind == "data":
        lookup = (t.lookups * t.id_bytes + t.lookups * cols * s + t.batch * cols * s) / hbm
        nodes = min(world / local_world, 2)
        table = t.rows * cols * s
        allreduce = table * (2 * nodes - 1) / nodes / (CROSS_NODE_BW_BPS * local_world)  # one NIC per GPU
        if world > 2 * local_world:
            allreduce *= 2
        return lookup * (1 + BWD_COMPUTE_MULTIPLIER) + allreduce + table * DP_ELEMENTWISE_KERNELS_PERF_FACTOR / hbm
    out = t.batch * world * cols * s  # pooled rows (or partial sums) of the global batch
    if kind in ("table", "column"):
        penalty = 1.0 if cols >= FULL_BLOCK_EMB_DIM else HALF_BLOCK_PENALTY if cols >= 64 else QUARTER_BLOCK_PENALTY
        ids = t.lookups * world
        fwd = (ids * t.id_bytes + ids * max(cols, MIN_LOOKUP_DIM) * s + out) * penalty / hbm
        return fwd * (1 + BWD_COMPUTE_MULTIPLIER) + 2 * out / _comm_bw(world, local_world)
    if kind == "row":
        ids, comm = t.lookups, 2 * out / _comm_bw(world, local_world)
    else:  # table_row: over the host's ranks, then across hosts
        ids, comm = t.lookups * world / local_world, 2 * out / INTRA_NODE_BW_BPS
        if world > local_world:
            comm += 2 * t.batch * (world / local_world) * cols * s / CROSS_NODE_BW_BPS
    fwd = (ids * t.id_bytes + ids * cols * s + out) / hbm
    return fwd * (1 + BWD_COMPUTE_MULTIPLIER) + comm + out * BATCHED_COPY_PERF_FACTOR / hbm


def estimate_s(t: Table, kind: str, world: int, local_world: int) -> float:
    """TorchRec's cost of one sharding type for a table: the sum over its shards (``ShardingOption.total_perf``)."""
    return sum(shard_cost_s(t, kind, s.cols, world, local_world) for s in shards_of(t, 0, kind, world, local_world))


def column_block(dim: int) -> int:
    """Columns of one column-wise shard: the smallest multiple of 4 from :data:`MIN_CW_DIM` up that divides
    ``dim``, or the whole table (sharding_plan.py ``_get_block_size_for_cw_shard``, the planner's enumerator)."""
    block = next((i for i in range(MIN_CW_DIM, dim) if dim % i == 0 and i % 4 == 0), dim)
    return min(block, dim)


def shards_of(t: Table, index: int, kind: str, world: int, local_world: int = 8) -> list[Shard]:
    """The shards TorchRec's enumerator cuts a table into (``calculate_shard_sizes_and_offsets``)."""
    if kind == "table":
        return [Shard(index, kind, t.rows, t.dim)]
    if kind == "row":
        return [Shard(index, kind, math.ceil(t.rows / world), t.dim) for _ in range(world)]
    if kind == "table_row":
        host = host_size(world, local_world)
        return [Shard(index, kind, math.ceil(t.rows / host), t.dim) for _ in range(host)]
    if kind == "column":
        block = column_block(t.dim)
        return [Shard(index, kind, t.rows, block) for _ in range(t.dim // block)]
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
    """Choose each table's sharding and place its shards on ranks as TorchRec's ``GreedyPerfPartitioner`` does.

    Uniform types first (a row-wise or replicated shard on every rank), then the other tables largest first
    (its default ``SortBy.STORAGE``): a table-wise-row-wise table on the least loaded host whose ranks all
    have room (``_cohost_partition``), each table- or column-wise shard on the least loaded rank with room
    (``_device_partition``; ties to the lowest local rank, then the lowest rank).
    """
    kinds = [mode if mode != "auto" else _cheapest(t, world, local_world, capacity) for t in tables]
    host = host_size(world, local_world)
    if "table_row" in kinds and world % host:
        raise ShardingError(
            f"--embedding-sharding table_row spreads a table's rows over one host's {host} devices and needs "
            f"whole hosts: {world} data-parallel ranks are not a multiple of {host}"
        )
    ranks: list[list[Shard]] = [[] for _ in range(world)]
    load = [0.0] * world
    used = [0] * world
    groups: list[tuple[int, int, list[Shard], float]] = []
    for i, (t, kind) in enumerate(zip(tables, kinds, strict=True)):
        pieces = shards_of(t, i, kind, world, local_world)
        cost = shard_cost_s(t, kind, pieces[0].cols, world, local_world)
        if kind in UNIFORM_TYPES:  # one shard on every rank
            for r, s in enumerate(pieces):
                ranks[r].append(s)
                load[r] += cost
                used[r] += s.storage(t)
            continue
        groups.append((sum(s.storage(t) for s in pieces), i, pieces, cost))
    for r in range(world):
        if used[r] > capacity:
            _no_room(tables, kinds, used[r], capacity, world, mode)
    groups.sort(key=lambda x: (-x[0], x[1]))
    for _, i, pieces, cost in groups:
        t, kind = tables[i], kinds[i]
        # a TWRW table's shard j on local rank j of one host; a TW / CW shard on the least loaded rank with room
        cohost = _host_ranks(t, pieces[0].storage(t), host, load, used, capacity, mode) if kind == "table_row" else []
        for j, s in enumerate(pieces):
            need = s.storage(t)
            if cohost:
                r = cohost[j]
            else:
                room = [r for r in range(world) if used[r] + need <= capacity]
                if not room:
                    raise ShardingError(_no_fit(t, kind, need, f"none of the {_devices(world)}", capacity, mode))
                r = min(room, key=lambda r: (load[r], r % host, r))
            ranks[r].append(s)
            load[r] += cost
            used[r] += need
    busiest = max(range(world), key=lambda r: (load[r], -r))
    return Placement(kinds, ranks, busiest)


def _host_ranks(
    t: Table, need: int, host: int, load: list[float], used: list[int], capacity: int, mode: str
) -> list[int]:
    """The ranks of the least loaded host whose every rank has room for one shard (``_cohost_partition``)."""
    world = len(load)
    for h in sorted(range(world // host), key=lambda h: (sum(load[h * host : (h + 1) * host]), h)):
        ranks = list(range(h * host, (h + 1) * host))
        if all(used[r] + need <= capacity for r in ranks):
            return ranks
    raise ShardingError(_no_fit(t, "table_row", need, f"no host of {host} of the {_devices(world)}", capacity, mode))


def _devices(n: int) -> str:
    return f"{n} device{'s' if n != 1 else ''}"


def _no_fit(t: Table, kind: str, need: int, where: str, capacity: int, mode: str) -> str:
    return (
        f"embedding table {t.name} ({t.rows:,} x {t.dim}): its {LABELS[kind]} shard of {need / 2**30:.1f} GiB fits on "
        f"{where} ({capacity / 2**30:.1f} GiB each, with the shards already placed); "
        + ("use more devices" if mode == "auto" else "use --embedding-sharding row or auto, or more devices")
    )


def _cheapest(t: Table, world: int, local_world: int, capacity: int) -> str:
    """The cheapest type whose largest shard fits a device (the planner's first proposal, by total cost)."""
    fitting = []
    for order, kind in enumerate(AUTO_TYPES):
        if kind == "table_row" and world % host_size(world, local_world):
            continue  # needs whole hosts
        largest = max(s.storage(t) for s in shards_of(t, 0, kind, world, local_world))
        if largest <= capacity:
            fitting.append((estimate_s(t, kind, world, local_world), order, kind))
    if not fitting:
        rows = shards_of(t, 0, "row", world)[0].storage(t)
        raise ShardingError(
            f"embedding table {t.name} ({t.rows:,} x {t.dim}, {t.bytes / 2**30:.1f} GiB) fits on no device under any "
            f"sharding: even row-wise over {world} devices each holds {rows / 2**30:.1f} GiB of "
            f"{capacity / 2**30:.1f} GiB; use more devices"
        )
    return min(fitting)[2]


def _no_room(tables: list[Table], kinds: list[str], used: int, capacity: int, world: int, mode: str) -> None:
    biggest = max(range(len(tables)), key=lambda i: tables[i].bytes)
    t = tables[biggest]
    raise ShardingError(
        f"embedding tables need {used / 2**30:.1f} GiB per device under {LABELS[kinds[biggest]]} sharding over {world} "
        f"devices ({capacity / 2**30:.1f} GiB each; largest {t.name}: {t.rows:,} x {t.dim}); "
        + ("use more devices" if mode == "auto" else "use --embedding-sharding row or auto, or more devices")
    )


def embedding_plan(graph: Graph, passes: list[object]) -> tuple[list[str], dict[str, int]]:
    """What the report says of the embedding plan, read off the captured graph with the configured pass (placing
    is deterministic and cheap, and done once here for both); nothing without the pass or tables.

    * A note: how many tables took each type, and what the modelled (busiest) rank holds, as TorchRec's planner
      prints its plan.
    * The totals of the sharded tables, every rank's shards together: their elements, the rows' bytes and the
      row-wise Adagrad state's (what a checkpoint holds of them, once), and the modelled rank's rows
      (``rank_weight_bytes``: what of its weights has no dense gradient to reduce). Tables placed data-parallel
      are left out: they train as dense parameters and are counted with those.
    """
    es = next((p for p in passes if isinstance(p, EmbeddingSharding)), None)
    tables = find_tables(graph) if es is not None and es.mode != "none" else []
    if es is None or not tables:
        return [], {}
    placement = place(tables, es.mode, es.world, es.local_world, es.capacity_bytes)
    counts = [(placement.kinds.count(k), LABELS[k]) for k in AUTO_TYPES if k in placement.kinds]
    held = placement.ranks[placement.rank]
    nbytes = sum(s.storage(tables[s.table]) for s in held)
    how = "per table by TorchRec's planner rule" if es.mode == "auto" else "as asked"
    note = (
        f"embedding sharding ({how}): "
        + ", ".join(f"{n} {label}" for n, label in counts)
        + f"; the busiest rank, modelled, holds {len(held)} shard{'s' if len(held) != 1 else ''} "
        f"({nbytes / 2**30:.2f} GiB with their optimizer state)"
    )
    sparse = [t for t, kind in zip(tables, placement.kinds, strict=True) if kind != "data"]
    if not sparse:
        return [note], {}
    totals = {
        "params": sum(t.rows * t.dim for t in sparse),
        "weight_bytes": sum(t.bytes for t in sparse),
        "optimizer_bytes": sum(t.rows * ROWWISE_ADAGRAD_BYTES_PER_ROW for t in sparse),
        "rank_weight_bytes": sum(s.rows * s.cols * tables[s.table].itemsize for s in held if s.kind != "data"),
    }
    return [note], totals


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
        return _Rewrite(graph, tables, placement, self.world, self.local_world).run()


class _Rewrite:
    """Rebuild the graph with the representative rank's lookups and the collectives between ranks."""

    def __init__(self, src: Graph, tables: list[Table], placement: Placement, world: int, local_world: int) -> None:
        self.src, self.tables, self.placement, self.world = src, tables, placement, world
        self.host = host_size(world, local_world)
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
        for kind in ("table", "column", "row", "table_row"):
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
        # input dist: a rank sends every id of its micro-batch once per shard holding its table (RW, TWRW: to
        # the row's owner) and receives the ids of the shards it holds: the global batch's (TW, CW), or the
        # share of them that falls in its rows (RW: 1/w, TWRW: 1/host)
        by_row = kind in ("row", "table_row")
        send = sum(self.tables[i].lookups * (1 if by_row else len(self._shards(i))) for i in members)
        recv = sum(self._received(i, kind) for i in mine)
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
            lookups = self._received(i, kind)
            idv = g.add(OpKind.VIEW, [dist], TensorSpec((lookups,), id_dtype), scope=n.scope, name=f"{n.name}.ids")
            cols = mine[i]
            attrs = EmbeddingAttrs(t.rows, cols, lookups=lookups, sparse=True)
            looked.append(g.add(OpKind.EMBEDDING, [idv, self.map[t.param]], n.out.with_shape((t.batch * w, cols)),
                                attrs, scope=n.scope, name=n.name))  # fmt: skip
        width = sum(self.tables[i].dim for i in members)
        batch = self.tables[members[0]].batch
        itemsize = first.out.dtype.itemsize
        out_spec = first.out.with_shape((batch, width))
        if kind == "table_row":
            outd = self._host_then_cross(looked, sum(mine.values()), width, batch, first.out, scope)
        else:
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

    def _received(self, i: int, kind: str) -> int:
        """Ids of table ``i`` this rank looks up: the global batch's, or its rows' share of them."""
        t, w = self.tables[i], self.world
        return t.lookups if kind == "row" else t.lookups * w // self.host if kind == "table_row" else t.lookups * w

    def _host_then_cross(
        self, looked: list[int], mine: int, width: int, batch: int, spec: TensorSpec, scope: str
    ) -> int:
        """TorchRec's ``TwRwPooledEmbeddingDist``: the host's partial sums of the global batch reduce-scattered
        over its ranks (each keeps the samples of the ranks with its local rank on every host), then an
        all_to_all over those ranks, one a host, hands every rank its own samples of every table."""
        g, w, host = self.out, self.world, self.host
        cross, itemsize = w // host, spec.dtype.itemsize
        if mine:  # the rank's host holds tables: ``mine`` of their columns
            looked = [g.add(OpKind.REDUCE_SCATTER, looked, spec.with_shape((batch * cross, mine)),
                            CollectiveAttrs(Axis.DP_INTRA, host, w * batch * mine * itemsize, Role.LAYER),
                            scope=scope, name=f"{scope}.intra_dist")]  # fmt: skip
        if cross == 1:
            return looked[0]
        nbytes = max(cross * batch * mine * itemsize, batch * width * itemsize)
        return g.add(OpKind.ALL_TO_ALL, looked, spec.with_shape((batch, width)),
                     CollectiveAttrs(Axis.DP_CROSS, cross, nbytes, Role.LAYER), scope=scope,
                     name=f"{scope}.cross_dist")  # fmt: skip

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
