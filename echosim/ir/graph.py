"""The IR graph: SSA nodes in a networkx DAG, with repeated layers held once.

A node produces exactly one tensor. ``Graph.repeats`` maps a scope prefix (for
example ``layers.0``) to how many identical copies of that block the model has;
nodes under the prefix stand for all of them. Analyses multiply by
:meth:`Graph.multiplicity`, so compile time does not grow with depth.

The node table is the truth; the networkx view (:attr:`Graph.dag`) and the readers of
each value (:meth:`Graph.users`) are derived from it on first use, so that the copies
every transform makes cost a dict copy, not a networkx graph copy.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

from echosim.ir.ops import Attrs, ElementwiseAttrs, NoAttrs, OpKind, Phase
from echosim.ir.types import TensorSpec

if TYPE_CHECKING:
    import networkx as nx

T = TypeVar("T")

#: :meth:`Graph.derived` key of a graph holding the very node objects of another (and its inputs, outputs,
#: gradients and block layers) under other repeat counts: analyses that read no repeat count are kept on that
#: one (:func:`echosim.timeline.lower.share_nodes` sets it).
SAME_NODES = "same-nodes-as"


@dataclass(frozen=True, slots=True)
class Node:
    id: int
    op: OpKind
    inputs: tuple[int, ...]
    out: TensorSpec
    attrs: Attrs = field(default_factory=NoAttrs)
    phase: Phase = Phase.FORWARD
    scope: str = ""
    name: str = ""
    origin: int | None = None  # the forward node a backward/recompute node derives from


def elementwise_fn(node: Node) -> str:
    """The map an elementwise node runs (``ElementwiseAttrs.fn``: "silu", "moe_dispatch", "fp8_cast", ...); "" else."""
    return node.attrs.fn if isinstance(node.attrs, ElementwiseAttrs) else ""


def is_cast(node: Node) -> bool:
    """A quantising cast (:class:`echosim.passes.precision.Fp8Linears`): an FP8 (or finer) copy of a value."""
    return elementwise_fn(node).endswith("_cast")


def twin_of(prev: Node | None, n: Node) -> bool:
    """Whether ``n`` repeats ``prev`` but for its id and name: the same op, the same attribute and output objects,
    the same inputs. A pass that adds equal nodes in a row shares those objects among them (a scope's gradient
    buckets, :mod:`echosim.passes.data_parallel`), so an analysis can reuse the previous node's terms after this
    identity test instead of hashing the node again."""
    return (
        prev is not None and n.attrs is prev.attrs and n.out is prev.out and n.op is prev.op and n.inputs == prev.inputs
    )


class Graph:
    """A DAG of :class:`Node`; insertion order is a valid topological order."""

    def __init__(
        self, name: str, repeats: dict[str, int] | None = None, block_layers: dict[str, int] | None = None
    ) -> None:
        self.name = name
        self._nodes: dict[int, Node] = {}
        self._dag: nx.DiGraph | None = None
        self._users: dict[int, list[int]] | None = None
        self._derived: dict[Hashable, tuple[tuple[int, ...], Any, Any]] = {}
        self._shape: tuple[dict[str, int], dict[str, int]] | None = None  # see :meth:`derived`
        # the PARAMETER nodes in table order once asked for (:meth:`params`), kept by adds and copies; never
        # changed in place (copies share it). A search's stage passes copy a stage graph three times and the
        # optimizer pass, the parameter count and the sparse tables each read its parameters
        self._params: list[Node] | None = None
        self.repeats: dict[str, int] = dict(repeats or {})
        # Layers one repetition of a repeated block holds, where more than one: the zoo's interleaved
        # blocks (five local layers then a global one, dense then MoE) run their layers in turn, each a
        # numbered child ``<prefix>.<j>`` (:meth:`layer_of`). Absent: the block is one layer.
        self.block_layers: dict[str, int] = {k: v for k, v in (block_layers or {}).items() if v > 1}
        # The list whose entries are the model's layers (``layers``) where no repeated block names it: a pipeline
        # stage that holds only layers outside the block (DeepSeek-V3's first dense ones) (:meth:`checkpoint_layer`)
        self.layer_list = ""
        # Megatron's ``--recompute-method block --recompute-num-layers N``: only the first N layers of a (virtual)
        # pipeline stage replay their forward; 0: every checkpointed layer does. Set by the recompute pass (before
        # any analysis reads the graph) and kept by copies and pipeline stages (:meth:`replayed`)
        self.replay_layers = 0
        self.replay_every = 0  # torchtitan's layer-wise AC: every N-th layer replays (``full:every-N``); 0: unset
        # Megatron's ``--recompute-method uniform --recompute-num-layers N`` (``full:uniform-N``): every layer replays,
        # one checkpoint per chunk of N layers of a stage (:meth:`replay_chunk`); 0: one per layer
        self.replay_group = 0
        # Samples one captured micro-batch holds where the model's inputs fix them (a .py file's example tensors or
        # shapes with no "batch" dimension, an ONNX file's fixed batch): throughput counts these, not --micro-batch,
        # which binds nothing then. 0: the capture's micro-batch is its batch
        self.samples = 0
        # Modules the model's own forward hands to torch.utils.checkpoint (a .py file), as patterns (``blocks.*``):
        # recompute it declares in code, which only --recompute turns into a policy. Empty: none
        self.checkpointed: tuple[str, ...] = ()
        self.inputs: list[int] = []  # per-sample inputs (token ids, labels); buffers are not here
        self.outputs: list[int] = []
        self.grads: dict[int, int] = {}  # parameter node -> its gradient value (after autodiff)
        self._next = 0

    # -- building ---------------------------------------------------------------
    def add(
        self,
        op: OpKind,
        inputs: Iterable[int],
        out: TensorSpec,
        attrs: Attrs | None = None,
        *,
        phase: Phase = Phase.FORWARD,
        scope: str = "",
        name: str = "",
        origin: int | None = None,
    ) -> int:
        nid = self._next
        self._next += 1
        ins = tuple(inputs)
        node = Node(nid, op, ins, out, attrs if attrs is not None else NoAttrs(), phase, scope, name, origin)
        self._nodes[nid] = node
        self._derived.clear()
        if op is OpKind.PARAMETER and self._params is not None:
            self._params = [*self._params, node]
        if self._dag is not None:
            self._dag.add_node(nid)
            self._dag.add_edges_from((i, nid) for i in ins)
        if self._users is not None:
            for i in dict.fromkeys(ins):
                self._users.setdefault(i, []).append(nid)  # the newest id: the list stays sorted
        return nid

    def replace(self, nid: int, **changes: object) -> None:
        """Swap a node for a modified copy (shapes or attrs); edges change only via inputs."""
        old = self.nodes[nid]
        new = replace(old, **changes)  # type: ignore[arg-type]
        self._nodes[nid] = new
        self._derived.clear()
        if OpKind.PARAMETER in (old.op, new.op):
            self._params = None
        if new.inputs != old.inputs:
            self._changed()

    def copy(self, name: str | None = None) -> Graph:
        g = Graph(name or self.name, self.repeats, self.block_layers)
        g.layer_list = self.layer_list
        g.replay_layers = self.replay_layers
        g.replay_every = self.replay_every
        g.replay_group = self.replay_group
        g.samples = self.samples
        g.checkpointed = self.checkpointed
        g._nodes = dict(self._nodes)
        g._params = self._param_nodes()  # the copy begins with the same parameters
        g.inputs = list(self.inputs)
        g.outputs = list(self.outputs)
        g.grads = dict(self.grads)
        g._next = self._next
        return g

    @property
    def nodes(self) -> dict[int, Node]:
        """Node id -> node, in a topological order (insertion order, or the order a pass set)."""
        return self._nodes

    @nodes.setter
    def nodes(self, table: dict[int, Node]) -> None:
        self._nodes = table
        self._params = None
        self._changed()

    def move_before(self, before: dict[int, list[int]]) -> None:
        """Put each node listed in ``before[nid]`` right ahead of ``nid``, in list order: a pass that appends
        nodes feeding an existing one (a cast before its consumer) keeps the order topological and readable."""
        placed = {c for cs in before.values() for c in cs}
        order: list[int] = []
        for nid in self._nodes:
            if nid in placed:
                continue
            order += before.get(nid, [])
            order.append(nid)
        self.nodes = {nid: self._nodes[nid] for nid in order}

    def _changed(self) -> None:
        """The structure changed: the derived views are rebuilt on next use."""
        self._dag = None
        self._users = None
        self._derived.clear()

    def derived(self, key: Hashable, compute: Callable[[], T]) -> T:
        """A value computed from this graph once (an analysis: FLOPs, saved bytes, lowering units).

        Dropped when a node is added or replaced or the node table, repeats, inputs,
        outputs or gradients change, so a cached analysis never describes an older graph.
        """
        # the repeats and block layers each value was computed under: one copy shared by the values computed while
        # they stay equal (in order), compared with them, not rebuilt, on each call (a search makes ~10^6 calls)
        shape, rep, layers = self._shape, self.repeats, self.block_layers
        if (
            shape is None
            or shape[0] != rep
            or shape[1] != layers
            or (  # equal, and in the same order (as tuples)
                (len(rep) > 1 and list(shape[0]) != list(rep)) or (len(layers) > 1 and list(shape[1]) != list(layers))
            )
        ):
            shape = self._shape = (dict(rep), dict(layers))
        sizes = (len(self._nodes), self._next, len(self.inputs), len(self.outputs), len(self.grads))
        hit = self._derived.get(key)
        if hit is not None and hit[1] is shape and hit[0] == sizes:
            return hit[2]  # type: ignore[no-any-return]
        value = compute()
        self._derived[key] = (sizes, shape, value)
        return value

    # -- reading ----------------------------------------------------------------
    @property
    def dag(self) -> nx.DiGraph:
        """The structure as a networkx ``DiGraph`` of node ids (built from the node table on first use)."""
        if self._dag is None:
            import networkx as nx  # not on the compile path: only graph algorithms and exports need it

            dag = nx.DiGraph()
            dag.add_nodes_from(self._nodes)
            dag.add_edges_from((i, n.id) for n in self._nodes.values() for i in n.inputs)
            self._dag = dag
        return self._dag

    # the readers below go to the node table itself, not through :attr:`nodes`: analyses read nodes by id
    # millions of times in a layout search
    def __iter__(self) -> Iterator[Node]:
        return iter(self._nodes.values())

    def __len__(self) -> int:
        return len(self._nodes)

    def __getitem__(self, nid: int) -> Node:
        return self._nodes[nid]

    def users(self, nid: int) -> list[int]:
        """Ids of the nodes that read ``nid``, ascending."""
        if self._users is None:
            users: dict[int, list[int]] = {}
            for n in self._nodes.values():
                for i in dict.fromkeys(n.inputs):
                    users.setdefault(i, []).append(n.id)
            self._users = {k: sorted(v) for k, v in users.items()}
        return list(self._users.get(nid, ()))

    def block_of(self, node: Node) -> str | None:
        """The repeated-block prefix a node belongs to, if any."""
        scope = node.scope
        for prefix in self.repeats:
            # ``scope == prefix or scope.startswith(prefix + ".")``, without building the string
            if scope.startswith(prefix) and (len(scope) == len(prefix) or scope[len(prefix)] == "."):
                return prefix
        return None

    def multiplicity(self, node: Node) -> int:
        prefix = self.block_of(node)
        if prefix is None:
            return 1
        if (self.replay_layers or self.replay_every) and node.phase is Phase.RECOMPUTE:
            return self.replayed(prefix)
        return self.repeats[prefix]

    def replayed(self, prefix: str) -> int:
        """Repetitions of block ``prefix`` whose recompute nodes run: all of them, or with :attr:`replay_layers`
        those holding the first that many layers of this stage, with :attr:`replay_every` every N-th layer's (the
        plan check asks whole repetitions); 0 where none does."""
        return self.replayed_of(prefix, self.repeats[prefix])

    def replayed_of(self, prefix: str, count: int) -> int:
        """:meth:`replayed` for a stage holding ``count`` repetitions of block ``prefix`` (a split that moves them)."""
        if self.replay_layers:
            return min(count, self.replay_layers // self.layers_per_block(prefix))
        if self.replay_every:  # every N-th layer: every (N / layers per repetition)-th repetition
            return count // (self.replay_every // self.layers_per_block(prefix))
        return count

    def replay_chunk(self, prefix: str) -> int:
        """Repetitions of block ``prefix`` one checkpoint covers: with :attr:`replay_group` the chunk of N layers
        (no more than the stage holds; the plan check asks whole repetitions), else 1."""
        if not self.replay_group:
            return 1
        return max(1, min(self.repeats[prefix], self.replay_group // self.layers_per_block(prefix)))

    def partial_replay(self) -> bool:
        """Whether some repetitions of the repeated block keep their activations (the others, maybe none, replay)."""
        if not (self.replay_layers or self.replay_every):
            return False
        if not any(self.replayed(p) < k for p, k in self.repeats.items()):
            return False
        return self.derived("replays-in-block", lambda: any(
            n.phase is Phase.RECOMPUTE and self.block_of(n) is not None for n in self._nodes.values()
        ))  # fmt: skip

    def layers_per_block(self, prefix: str) -> int:
        """Layers one repetition of block ``prefix`` holds (:attr:`block_layers`; 1 unless declared)."""
        return self.block_layers.get(prefix, 1)

    def layer_of(self, node: Node) -> str | None:
        """The scope of the layer a node belongs to: its block's prefix, or inside a block of several
        layers the numbered child (``layers.0.3``) that holds it; ``None`` outside the repeated blocks.
        A node of such a block outside every child (a collective a pass put on the block) is the block's."""
        prefix = self.block_of(node)
        if prefix is None or prefix not in self.block_layers:
            return prefix
        head = node.scope[len(prefix) + 1 :].partition(".")[0]
        return f"{prefix}.{head}" if head.isdigit() else prefix

    def checkpoint_layer(self, node: Node) -> str | None:
        """The layer an activation checkpoint covers: :meth:`layer_of` inside the repeated block, and for a
        layer of the same list left unfolded (DeepSeek-V3's three dense layers before its MoE run, a layer
        after it) that layer's own scope, ``layers.<k>``; ``None`` outside every layer.

        Frameworks checkpoint every transformer layer alike (Megatron-Core's ``_checkpointed_forward``
        walks all of a stage's layers; MaxText remats the dense and the MoE scans with one policy), so a
        recompute policy must reach the layers the fold left as they are."""
        layer = self.layer_of(node)
        if layer is not None:
            return layer
        if node.op in (OpKind.SEND, OpKind.RECV):  # a pipeline transfer keeps its producer's scope: no layer's
            return None
        scope = node.scope
        for lst in self.layer_lists():
            if lst and scope.startswith(lst) and len(scope) > len(lst) + 1 and scope[len(lst)] == ".":
                head = scope[len(lst) + 1 :].partition(".")[0]
                if head.isdigit():
                    return f"{lst}.{head}"
        return None

    def layer_lists(self) -> list[str]:
        """The lists whose numbered entries are layers: the repeated blocks' (``layers`` of ``layers.3``)."""
        return [prefix.rpartition(".")[0] for prefix in self.repeats] or [self.layer_list]

    def unfolded_layers(self) -> int:
        """Layers of the repeated blocks' list that the fold left as they are (:meth:`checkpoint_layer`); counted
        once per graph (a report asks for every stage it lists)."""
        return self.derived("unfolded-layers", lambda: len(
            {layer for n in self._nodes.values() if self.block_of(n) is None and (layer := self.checkpoint_layer(n))}
        ))  # fmt: skip

    def layer_count(self) -> int:
        """Layers the graph's repeated blocks stand for (repetitions times layers per repetition)."""
        return sum(count * self.layers_per_block(prefix) for prefix, count in self.repeats.items())

    def by_phase(self, phase: Phase) -> list[Node]:
        return [n for n in self._nodes.values() if n.phase is phase]

    def params(self) -> list[Node]:
        """The parameter nodes, in table order."""
        return list(self._param_nodes())

    def _param_nodes(self) -> list[Node]:
        if self._params is None:
            self._params = [n for n in self._nodes.values() if n.op is OpKind.PARAMETER]
        return self._params

    def param_count(self) -> int:
        """Parameter elements this graph holds, repeats included (after sharding: this rank's shards only).

        A property of the graph, not an analysis pass: frontends report it for what they capture.
        """
        return sum(n.out.numel * self.multiplicity(n) for n in self._param_nodes())
