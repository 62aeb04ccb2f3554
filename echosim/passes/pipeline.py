"""Pipeline parallelism: cut the graph into stages of whole repeated layers.

The first stage also holds what comes before the repeated block (embeddings),
the last what comes after it (final norm, output layer, loss). Values that cross
a cut become ``send``/``recv`` pairs. Layers are split evenly as Megatron-LM does
(``balance="uniform"``) or by estimated cost (``balance="cost"``), which moves
layers off the stages that carry the embedding and the output layer.

More (virtual) stages than layers is possible only the way Megatron-Core does it with
``--account-for-embedding-in-pipeline-split`` and ``--account-for-loss-in-pipeline-split``
(megatron/core/transformer/transformer_config.py; NeMo's Llama 3.1 405B recipes set both): the
embedding, then the loss, count as one layer each, so with ``layers + 1`` or ``layers + 2``
stages the first holds only the embedding and the last only the output layer and loss.

``balance="layout:STRING"`` takes the layers per stage from a Megatron-Core pipeline layout
(``pipeline_model_parallel_layout``, :func:`layout_counts`), as Megatron-Bridge's DeepSeek-V3
recipes set it.

Stages of one shape (the same layer count, neither first nor last) are the same program,
so they share one graph, named after the first of them; a split is kept per graph and
pipeline degree, since a layout search splits the same graph for many layouts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from echosim.ir.graph import Graph, Node
from echosim.ir.ops import Axis, CollectiveAttrs, OpKind, Phase, Role
from echosim.memo import Memo
from echosim.passes.base import LayoutError
from echosim.passes.flops import io_bytes, node_flops

_SPLITS: Memo[list[Stage]] = Memo("pipeline splits", maxsize=2048)


@dataclass(frozen=True)
class Stage:
    index: int
    graph: Graph
    layers: int
    # The stage graph before the stage-level passes (data parallelism, optimizer, gradient groups): where
    # they add no work to a micro-batch's forward and backward, its timing is kept on this graph and
    # shared by the layouts that differ only in ZeRO stage (see timeline/lower.py).
    base: Graph | None = None


def _static(graph: Graph) -> set[int]:
    """Values that depend on no per-sample input (weights, buffers, their views)."""
    dynamic: set[int] = set(graph.inputs)
    static: set[int] = set()
    for n in graph:
        if n.id in dynamic or n.phase is not Phase.FORWARD:
            continue
        if any(i in dynamic for i in n.inputs):
            dynamic.add(n.id)
        else:
            static.add(n.id)
    return static


def _classify(graph: Graph, block: str) -> dict[int, str]:
    """'pre', 'block' or 'post' for every non-static node."""
    cls: dict[int, str] = {}
    after: set[int] = set()
    for n in graph:
        if n.phase is Phase.FORWARD:
            if graph.block_of(n) == block:
                cls[n.id] = "block"
                after.add(n.id)
            elif any(i in after for i in n.inputs):
                cls[n.id] = "post"
                after.add(n.id)
            else:
                cls[n.id] = "pre"
    own: list[Node] = []  # a pass's own nodes (an fp8 cast of a gradient): where their readers are
    for n in graph:
        if n.phase is not Phase.FORWARD:
            if graph.block_of(n) == block:
                cls[n.id] = "block"
            elif n.origin is not None and n.origin in cls and graph[n.origin].op is not OpKind.PARAMETER:
                cls[n.id] = cls[n.origin]
            elif n.origin is None and n.inputs:
                own.append(n)
            else:  # loss seed, tied-weight gradient sums: decided by their readers/writers
                cls[n.id] = "post"
    for n in reversed(own):
        readers = [cls[u] for u in graph.users(n.id) if u in cls]
        cls[n.id] = readers[0] if readers else "post"
    return cls


def _work(graph: Graph, ids: list[int]) -> float:
    """A hardware-free cost proxy: FLOPs plus bytes weighted at 100 FLOP/byte."""
    return float(sum(node_flops(graph[i]) + 100 * io_bytes(graph, graph[i]) for i in ids))


#: ``balance`` that names a Megatron-Core pipeline layout (``pipeline_model_parallel_layout``).
LAYOUT_PREFIX = "layout:"
_LAYOUT_CHARS = "EtmL"
_GROUP = re.compile(r"\(([^()]*)\)\*(\d+)")
_SINGLE = re.compile(r"([EtmL|])\*(\d+)")


def layout_counts(text: str) -> list[int]:
    """Decoder layers per (virtual) pipeline stage of a Megatron-Core layout string.

    The grammar of ``pipeline_model_parallel_layout`` (megatron/core/transformer/
    pipeline_parallel_layer_layout.py, ``parse_str_to_list``): ``|`` ends a stage, ``E`` is the
    embedding, ``t`` a transformer layer, ``m`` a multi-token-prediction layer (no decoder layer of the
    repeated block: a model's MTP modules follow the decoder, so they run where the loss does), ``L`` the
    loss; ``(...)*n`` and ``x*n`` repeat, commas are
    cosmetic. Stages are listed in layer order, virtual stage ``v`` of rank ``r`` at ``v * pp + r``
    (echosim's order too). The embedding opens the first stage and the loss closes the last, as
    Megatron-Core's ``validate_layer_layout`` requires.
    """
    body = text.replace(",", "").replace(" ", "")
    for _ in range(len(body)):  # unroll nested repeats from the inside out
        unrolled = _GROUP.sub(lambda m: m.group(1) * int(m.group(2)), body)
        if unrolled == body:
            break
        body = unrolled
    body = _SINGLE.sub(lambda m: m.group(1) * int(m.group(2)), body)
    bad = sorted(set(body) - set(_LAYOUT_CHARS + "|"))
    if bad:
        raise LayoutError(
            f"pipeline layout {text!r}: unknown character(s) {' '.join(bad)} (known: E t m L | ( ) *n and commas)"
        )
    stages = body.split("|")
    if body.count("E") != 1 or not stages[0].startswith("E") or body.count("L") != 1 or not stages[-1].endswith("L"):
        raise LayoutError(
            f"pipeline layout {text!r}: the embedding E must open the first stage and the loss L close the "
            "last, once each"
        )
    return [stage.count("t") for stage in stages]


def leading_layers(block: str) -> int:
    """Decoder layers before a graph's repeated block: a capture names the block after its first layer
    (``layers.3`` when DeepSeek-V3's three dense layers come first), and the layers before it are the first
    stage's (its ``pre``, with the embedding), unless the balance places them (:func:`decoder_counts`)."""
    index = block.rsplit(".", 1)[-1]
    return int(index) if index.isdigit() else 0


def decoder_counts(graph: Graph, pp: int, balance: str) -> list[int] | None:
    """Decoder layers per stage with the leading layers (before the repeated block) counted, where the balance
    places them: a Megatron-Core layout that counts them, or the uniform split of all the model's layers; ``None``
    where they stay on the first stage (the ``cost`` balance weighs them as the first stage's ``pre``).

    A Megatron-Core layout counts every decoder layer: DeepSeek-V3's ``Et|tt|...`` runs dense layer 0 with the
    embedding and dense layers 1 and 2 on the second stage. Without one, Megatron-Core splits the decoder's layers
    evenly (``get_num_layers_to_build``: num_layers / pp, uneven splits only where a run asks for them), the
    dense ones among them."""
    ((block, layers),) = graph.repeats.items()
    lead = leading_layers(block)
    if balance.startswith(LAYOUT_PREFIX):
        counts = layout_counts(balance.removeprefix(LAYOUT_PREFIX))
        return counts if lead and sum(counts) == layers + lead else None
    if balance != "uniform" or not lead or pp > layers:
        return None
    base, extra = divmod(layers + lead, pp)
    return [base + (1 if i < extra else 0) for i in range(pp)]


def leading_spill(graph: Graph, pp: int, balance: str) -> bool:
    """Whether the split puts a leading layer on a stage after the first (:func:`decoder_counts`)."""
    counts = decoder_counts(graph, pp, balance)
    return counts is not None and counts[0] < leading_layers(next(iter(graph.repeats)))


def _moved_leading_layers(graph: Graph, block: str, pp: int, balance: str, cls: dict[int, str]) -> dict[int, int]:
    """The stage of each node of a leading layer placed after the first stage (node -> stage)."""
    counts = decoder_counts(graph, pp, balance)
    if counts is None:
        return {}
    lead = leading_layers(block)
    stage_of: dict[str, int] = {}
    layer = 0
    for i, count in enumerate(counts):
        for _ in range(count):
            if layer < lead and i > 0:
                stage_of[f"{block.rpartition('.')[0]}.{layer}"] = i
            layer += 1
    return {
        nid: stage_of[name] for nid, c in cls.items()
        if c == "pre" and (name := graph.checkpoint_layer(graph[nid]) or "") in stage_of
    }  # fmt: skip


def _without_leading(counts: list[int], lead: int) -> list[int]:
    """Repeated layers per stage: the leading layers leave the stages that hold them, first to last."""
    out = list(counts)
    for i in range(len(out)):
        taken = min(lead, out[i])
        out[i], lead = out[i] - taken, lead - taken
    return out


def layer_split(graph: Graph, pp: int, balance: str, cls: dict[int, str]) -> list[int]:
    ((block, layers),) = graph.repeats.items()
    if balance.startswith(LAYOUT_PREFIX):
        counts = layout_counts(balance.removeprefix(LAYOUT_PREFIX))
        # a layout counts every decoder layer, or only the repeated ones (the leading layers then run first)
        lead = leading_layers(block) if sum(counts) != layers else 0
        if len(counts) != pp or sum(counts) != layers + lead:
            raise LayoutError(
                f"pipeline layout {balance.removeprefix(LAYOUT_PREFIX)!r} has {len(counts)} stages and "
                f"{sum(counts)} layers; the layout needs pp x vpp = {pp} stages and the model's {layers + lead} "
                "layers"
            )
        return _without_leading(counts, lead)
    if pp > layers + 2:
        raise LayoutError(f"pp={pp} exceeds the number of layers ({layers}) plus the embedding and loss stages")
    if pp > layers:  # the embedding (and the loss) take a stage of their own (module docstring)
        return [0] + [1] * layers + [0] * (pp - layers - 1)
    if balance == "uniform":
        full = decoder_counts(graph, pp, balance)
        if full is not None:
            return _without_leading(full, leading_layers(block))
        base, extra = divmod(layers, pp)
        return [base + (1 if i < extra else 0) for i in range(pp)]
    if balance != "cost":
        raise LayoutError(f"unknown pipeline balance {balance!r} (known: uniform, cost, {LAYOUT_PREFIX}STRING)")
    layer = _work(graph, [i for i, c in cls.items() if c == "block"])
    pre = _work(graph, [i for i, c in cls.items() if c == "pre"]) / layer
    post = _work(graph, [i for i, c in cls.items() if c == "post"]) / layer
    counts = [1] * pp
    for _ in range(layers - pp):  # give the next layer to the stage with least work
        load = [c + (pre if i == 0 else 0) + (post if i == pp - 1 else 0) for i, c in enumerate(counts)]
        counts[min(range(pp), key=lambda i: (load[i], i))] += 1
    return counts


@dataclass(frozen=True)
class PipelineParallel:
    pp: int
    balance: str = "uniform"
    name: ClassVar[str] = "pipeline-parallel"

    def split(self, graph: Graph) -> list[Stage]:
        """The stages, first to last (a list shared by every caller with the same graph: do not modify it)."""
        return _SPLITS.get((graph, self), lambda: self._split(graph))

    def _split(self, graph: Graph) -> list[Stage]:
        if self.pp == 1:
            return [Stage(0, graph, next(iter(graph.repeats.values()), 1))]
        if len(graph.repeats) != 1:
            raise LayoutError("pipeline parallelism needs a model with one repeated block of layers")
        ((block, _layers),) = graph.repeats.items()
        cls = _classify(graph, block)
        counts = layer_split(graph, self.pp, self.balance, cls)
        moved = _moved_leading_layers(graph, block, self.pp, self.balance, cls)
        static = _static(graph)
        stages = []
        shapes: dict[tuple[bool, bool, int, frozenset[int]], Graph] = {}
        for i, count in enumerate(counts):
            mine = frozenset(nid for nid, at in moved.items() if at == i)
            shape = (i == 0, i == self.pp - 1, count, mine)
            if shape not in shapes:
                keep = ({"block"} if count else set()) | ({"pre"} if i == 0 else set())
                keep |= {"post"} if i == self.pp - 1 else set()
                members = {nid for nid, c in cls.items() if c in keep and nid not in static and nid not in moved}
                members |= mine
                shapes[shape] = _stage_graph(graph, members, static, i, self.pp, {block: count} if count else {})
            stages.append(Stage(i, shapes[shape], count))
        return stages

    def run(self, graph: Graph) -> Graph:  # as a pass: the first stage, for golden tests
        return self.split(graph)[0].graph


def _stage_graph(
    graph: Graph, members: set[int], static: set[int], index: int, pp: int, repeats: dict[str, int]
) -> Graph:
    g = Graph(f"{graph.name}.stage{index}", repeats, graph.block_layers)
    g.layer_list = graph.layer_lists()[0]  # a stage without the block still knows which scopes are layers
    g.replay_layers = graph.replay_layers  # full:N recomputes the first N layers of each stage
    g.replay_every = graph.replay_every  # full:every-N every N-th layer
    g.replay_group = graph.replay_group  # full:uniform-N one checkpoint per N layers
    new: dict[int, int] = {}
    tied: dict[int, list[int]] = {}

    def copyable(i: int) -> bool:
        """Weights, buffers, per-sample inputs and their views: every stage loads its own."""
        src = graph[i]
        return (
            i in static
            or src.op.is_placeholder
            or (src.op is OpKind.VIEW and src.phase is Phase.FORWARD and all(copyable(j) for j in src.inputs))
        )

    def bring(i: int, reader: Node) -> int:
        if i in new:
            return new[i]
        src = graph[i]
        if copyable(i):
            new[i] = g.add(
                src.op,
                [bring(j, reader) for j in src.inputs],
                src.out,
                src.attrs,
                phase=src.phase,
                scope=src.scope,
                name=src.name,
            )
        else:  # produced on another stage: receive it
            new[i] = g.add(
                OpKind.RECV,
                [],
                src.out,
                CollectiveAttrs(Axis.PP, pp, src.out.nbytes, Role.PIPELINE),
                phase=reader.phase,
                scope=src.scope,
                name=f"{src.name}.recv",
            )
        return new[i]

    for n in graph:
        if n.op is OpKind.ELEMENTWISE and n.origin is not None and graph[n.origin].op is OpKind.PARAMETER:
            parts = [i for i in n.inputs if i in new]
            if parts and len(parts) < len(n.inputs):  # a tied weight used on several stages
                tied.setdefault(n.origin, []).extend(parts)
                continue
        if n.id not in members:
            continue
        origin = new.get(n.origin) if n.origin is not None else None
        new[n.id] = g.add(
            n.op,
            [bring(i, n) for i in n.inputs],
            n.out,
            n.attrs,
            phase=n.phase,
            scope=n.scope,
            name=n.name,
            origin=origin,
        )

    def consumer_elsewhere(u: int) -> bool:
        node = graph[u]
        tied_sum = node.origin is not None and graph[node.origin].op is OpKind.PARAMETER
        return u not in members and not tied_sum

    for n in graph:
        if n.id not in members or n.id not in new or copyable(n.id):
            continue
        if any(consumer_elsewhere(u) for u in graph.users(n.id)):
            spec = n.out
            g.add(OpKind.SEND, [new[n.id]], spec, CollectiveAttrs(Axis.PP, pp, spec.nbytes, Role.PIPELINE),
                  phase=n.phase, scope=n.scope, name=f"{n.name}.send")  # fmt: skip
    for param, grad in graph.grads.items():
        if param in new and grad in new:
            g.grads[new[param]] = new[grad]
    for param, parts in tied.items():  # Megatron all-reduces tied embedding grads across stages
        p = bring(param, graph[param])
        spec = graph[param].out
        sync = g.add(
            OpKind.ALL_REDUCE,
            [new[i] for i in parts],
            spec,
            CollectiveAttrs(Axis.EMBED, 2, spec.nbytes, Role.STEP_END),
            phase=Phase.OPTIMIZER,
            scope="",
            name=f"{graph[param].name}.tied_grad_all_reduce",
        )
        g.grads[p] = sync
    if any(o in new for o in graph.outputs):
        g.outputs = [new[o] for o in graph.outputs if o in new]
    g.inputs = [new[i] for i in graph.inputs if i in new]
    return g
