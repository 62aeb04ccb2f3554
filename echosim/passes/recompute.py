"""Activation recomputation: forward work replayed in backward to save memory, by policy name.

``full`` (Megatron's full recompute) checkpoints each repeated layer's input and
replays the whole layer, its tensor-parallel all_reduces included, before the
layer's backward. A layer is a transformer layer: a repeated block of several
(:attr:`echosim.ir.graph.Graph.block_layers`) checkpoints each of its layers, as
Megatron-Core's ``--recompute-method uniform`` does with its default
``--recompute-num-layers 1`` (megatron/training/arguments.py; megatron/core/recompute.py
``checkpointed_forward``, Megatron-LM commit d98e8a6). ``full:uniform-N`` is that method with N > 1: one
checkpoint per chunk of N layers of a (virtual) pipeline stage, the chunk replayed together before its
backward. The replay and its time are ``full``'s; what changes is memory: fewer checkpointed inputs, and N
layers' replayed activations live at once (:attr:`~echosim.ir.graph.Graph.replay_group`). ``full:N`` is its
``--recompute-method block --recompute-num-layers N``: only the first N layers of each
(virtual) pipeline stage are checkpointed, the others keep their activations
(:attr:`echosim.ir.graph.Graph.replay_layers`: the replay runs for that many repetitions).
``full:every-N`` checkpoints every N-th layer, torchtitan's layer-wise selective AC
(``activation_checkpoint.selective_ac_option = "N"``, the job config of commit 038d5fd; its
``_apply_ac_to_transformer_block`` wraps a layer when a per-process count of layers ``% N == 0``):
a stage of k layers replays k // N (:attr:`~echosim.ir.graph.Graph.replay_every`). ``selective`` (Korthikanti
et al. 2022) replays only the attention core; with a fused (flash) kernel that replay
already lives inside the attention backward, so only materialised attention gains
recompute nodes.

The other policies name the tensors a layer keeps (:mod:`echosim.passes.saved`); every
other value the layer's backward reads is replayed from them, and only what backward
needs is replayed (XLA and ``torch.utils.checkpoint`` drop dead recompute). Offloaded
tensors are kept too, in host memory: the memory analysis leaves them out of the device.
Their transfers over the host link are not timed: at the scaling-book's PCIe rates they fit
under the layer's compute in every TPU row measured (benchmarks/tpu_recipes_other_rows.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from echosim.errors import EchosimError
from echosim.ir.graph import Graph, Node, is_cast
from echosim.ir.ops import AttentionAttrs, MatmulAttrs, OpKind, Phase
from echosim.passes.saved import (
    TENSOR_NAMES,
    alternate_matmuls,
    base,
    is_weight_matmul,
    names_in_block,
    reduced,
    tensor_name,
)

_MAXTEXT = "MaxText src/maxtext/layers/decoders.py get_remat_policy (commit e591f30)"
_DOTS = frozenset({"qkv_proj", "out_proj", "mlpwi", "mlpwo"})


class RecomputeError(EchosimError):
    """An unknown recompute policy; the message names the known ones."""


@dataclass(frozen=True)
class Policy:
    """What a checkpointed layer keeps on the device (``keep``) and in host memory (``offload``)."""

    name: str
    keep: frozenset[str] = frozenset()
    offload: frozenset[str] = frozenset()
    source: str = ""
    alternate: bool = False  # torchtitan per-op SAC: keep every other weight matmul's output


#: Named policies beyond none/selective/full, each with where it comes from.
POLICIES: dict[str, Policy] = {
    p.name: p
    for p in (
        Policy("minimal", _DOTS, source=f"save_only_these_names(projections and MLP dots), {_MAXTEXT}"),
        Policy("minimal_with_context", _DOTS | {"context"}, source=_MAXTEXT),
        Policy("minimal_flash", _DOTS | {"context"}, source=f"deprecated alias of minimal_with_context, {_MAXTEXT}"),
        Policy("save_dot_with_context_except_mlp", frozenset({"qkv_proj", "context", "out_proj"}), source=_MAXTEXT),
        Policy("save_dot_except_mlpwi", frozenset({"qkv_proj", "out_proj", "mlpwo"}), source=_MAXTEXT),
        Policy("save_dot_except_mlp", frozenset({"qkv_proj", "out_proj"}), source=_MAXTEXT),
        Policy("save_qkv_proj", frozenset({"qkv_proj"}), source=_MAXTEXT),
        Policy("save_out_proj", frozenset({"out_proj"}), source=_MAXTEXT),
        Policy(
            "qkv_proj_offloaded",
            offload=frozenset({"qkv_proj"}),
            source="MaxText src/maxtext/utils/maxtext_utils.py get_save_and_offload_names (commit e591f30)",
        ),
        Policy(
            "minimal_offloaded",
            offload=_DOTS,
            source="MaxText src/maxtext/utils/maxtext_utils.py get_save_and_offload_names (commit e591f30)",
        ),
        Policy(
            "custom",
            source="MaxText remat_policy=custom with base.yml's per-tensor defaults: decoder_layer_input on "
            "device, every other tensor rematerialised (src/maxtext/configs/base.yml, commit e591f30)",
        ),
        Policy(
            "op",
            frozenset({"context"}),
            source="torchtitan per-op selective AC: every other mm and SDPA kept "
            "(torchtitan/distributed/activation_checkpoint.py, commit b5bcd76)",
            alternate=True,
        ),
    )
}
MODES = ("none", "selective", "full", *POLICIES)
_PLACES = ("device", "offload", "remat")

#: Megatron-Core's ``--recompute-modules`` (with ``--recompute-granularity selective``): the parts of a
#: layer whose outputs are dropped after forward and replayed before backward
#: (megatron/core/transformer/transformer_config.py recompute_modules, Megatron-LM commit d98e8a6).
#: ``core_attn``: materialised attention (a fused kernel already replays it); ``layernorm``: the norms
#: not fused into the following linear (TE's LayerNormLinear keeps the attention's input norm fused);
#: ``moe_act``: the experts' activation between fc1 and fc2; ``mla_up_proj``: MLA's up-projections of
#: the latent query and key/value and the RoPE applied to them.
MEGATRON_MODULES = ("core_attn", "layernorm", "moe_act", "mla_up_proj", "mlp", "moe", "shared_experts")


def policy_named(name: str) -> Policy | None:
    """The policy a plan names (``None`` for none/selective/full); an unknown name is one line.

    ``custom:TENSOR=device|offload|remat,...`` sets MaxText's per-tensor choices (``custom`` alone
    keeps only the layer input, base.yml's defaults).
    """
    if name in ("none", "selective", "full"):
        return None
    if name.startswith("full:"):
        replay_layers(name)
        replay_every(name)
        replay_group(name)
        return None
    if name.startswith("selective:"):
        megatron_modules(name)
        return None
    if name in POLICIES:
        return POLICIES[name]
    if name.startswith("custom:"):
        keep, offload = set(), set()
        for item in filter(None, name.removeprefix("custom:").split(",")):
            tensor, _, place = item.partition("=")
            if tensor not in TENSOR_NAMES or place not in _PLACES:
                raise RecomputeError(
                    f"recompute {name!r}: {item!r} is not TENSOR=PLACE (tensors: {', '.join(TENSOR_NAMES)}; "
                    f"places: {', '.join(_PLACES)})"
                )
            if place == "remat" and tensor == "decoder_layer_input":
                raise RecomputeError("recompute custom: decoder_layer_input is device or offload, never remat")
            (keep if place == "device" else offload if place == "offload" else set()).add(tensor)
        return Policy(name, frozenset(keep), frozenset(offload), POLICIES["custom"].source)
    raise RecomputeError(
        f"unknown recompute policy {name!r} (known: {', '.join(MODES)}, full:N, full:every-N, full:uniform-N, "
        f"custom:TENSOR=device|offload|remat,..., selective:MODULE,... over {', '.join(MEGATRON_MODULES)})"
    )


def replay_layers(name: str) -> int:
    """N of ``full:N`` (the layers per pipeline stage whose activations are checkpointed), 0 for any other policy;
    an N that is not a positive whole number is one line."""
    if name.startswith(("full:every-", "full:uniform-")):
        return 0
    hint = (
        "the layers of each pipeline stage to recompute (Megatron's --recompute-method block), full:every-N or "
        "full:uniform-N"
    )
    return _count_after(name, "full:", 1, hint)


def replay_every(name: str) -> int:
    """N of ``full:every-N`` (every N-th layer checkpointed), 0 for any other policy; an N that is not a whole
    number >= 2 is one line (every layer is ``full``)."""
    return _count_after(name, "full:every-", 2, "every N-th layer recomputed; every layer is full")


def replay_group(name: str) -> int:
    """N of ``full:uniform-N`` (one checkpoint per chunk of N layers), 0 for any other policy; an N that is not a
    whole number >= 2 is one line (one checkpoint per layer is ``full``)."""
    return _count_after(name, "full:uniform-", 2, "one checkpoint per N layers; one per layer is full")


def _count_after(name: str, prefix: str, least: int, hint: str) -> int:
    """The whole number after ``prefix`` in ``name`` (0 where the name does not start with it), at least ``least``."""
    if not name.startswith(prefix):
        return 0
    text = name.removeprefix(prefix)
    if not text.isdigit() or int(text) < least:
        raise RecomputeError(f"recompute {name!r}: N of {prefix}N is a whole number >= {least} ({hint})")
    return int(text)


def partial(name: str) -> bool:
    """Whether the policy recomputes some layers only (``full:N``, ``full:every-N``)."""
    return bool(replay_layers(name) or replay_every(name))


def megatron_modules(name: str) -> tuple[str, ...]:
    """The modules of ``selective:MOD,MOD`` (Megatron's recompute_modules); an unknown one is one line."""
    if not name.startswith("selective:"):
        return ("core_attn",) if name == "selective" else ()
    mods = tuple(m for m in name.removeprefix("selective:").split(",") if m)
    bad = [m for m in mods if m not in MEGATRON_MODULES]
    if bad or not mods:
        raise RecomputeError(
            f"recompute {name!r}: unknown module {(bad or [''])[0]!r} (Megatron's recompute_modules: "
            f"{', '.join(MEGATRON_MODULES)})"
        )
    return mods


def offloaded(name: str) -> frozenset[str]:
    """Tensor names a policy moves to host memory."""
    policy = policy_named(name)
    return policy.offload if policy is not None else frozenset()


@dataclass(frozen=True)
class Recompute:
    mode: str = "none"
    loss_chunks: int = 1  # the loss over token chunks whose logits backward recomputes (MaxText vocab tiling)
    name: ClassVar[str] = "recompute"

    def __post_init__(self) -> None:
        policy_named(self.mode)

    def run(self, graph: Graph) -> Graph:
        graph = self._layers(graph)
        return _replay_logits(graph) if self.loss_chunks > 1 else graph

    def _layers(self, graph: Graph) -> Graph:
        if self.mode == "none":
            return graph
        g = graph.copy()
        policy = policy_named(self.mode)
        g.replay_layers, g.replay_every = replay_layers(self.mode), replay_every(self.mode)
        g.replay_group = replay_group(self.mode)
        if self.mode.startswith("selective:"):
            chosen = _module_nodes(graph, megatron_modules(self.mode))
        elif policy is None:
            chosen = [n for n in graph if n.phase is Phase.FORWARD and self._replays(g, n)]
        else:
            chosen = _needed(graph, _kept(graph, policy))
        copies: dict[int, int] = {}
        for n in chosen:
            # a layer's replay starts from its own input: an earlier layer's output (inside a block of
            # several layers) is that checkpoint, kept from forward, not replayed with this layer
            layer = graph.checkpoint_layer(n)
            ins = [copies.get(i, i) if graph.checkpoint_layer(graph[i]) == layer else i for i in n.inputs]
            copies[n.id] = g.add(
                n.op, ins, n.out, n.attrs, phase=Phase.RECOMPUTE, scope=n.scope, name=f"{n.name}.recompute", origin=n.id
            )
        first_bwd: dict[str, int] = {}  # where each unit's replay goes: before its first backward node
        for n in list(g):
            if n.phase is Phase.BACKWARD and (layer := g.checkpoint_layer(n)) is not None:
                first_bwd.setdefault(_unit(g, n), n.id)
                # an earlier layer's output is read as kept: this layer's input
                ins = tuple(copies.get(i, i) if g.checkpoint_layer(g[i]) == layer else i for i in n.inputs)
                if ins != n.inputs:
                    g.replace(n.id, inputs=ins)
        # replay just before the layer's backward (the repeated block's layers before the block's first):
        # move the copies there in graph order
        replay = set(copies.values())
        order = [nid for nid in g.nodes if nid not in replay]
        by_unit: dict[str, list[int]] = {}
        for n in chosen:
            by_unit.setdefault(_unit(graph, n), []).append(copies[n.id])
        for unit in sorted(by_unit, key=lambda u: order.index(first_bwd[u]) if u in first_bwd else len(order)):
            at = order.index(first_bwd[unit]) if unit in first_bwd else len(order)
            order[at:at] = by_unit[unit]
        g.nodes = {nid: g.nodes[nid] for nid in order}
        return g

    def _replays(self, g: Graph, n: Node) -> bool:
        if n.op.is_placeholder or g.checkpoint_layer(n) is None:
            return False
        if self.mode == "full" or self.mode.startswith("full:"):
            return True
        return _core_attention(g, n)


def selective_replays(graph: Graph) -> bool:
    """Whether Megatron's ``selective`` (``core_attn``) replays any op of ``graph``: else it equals ``none``."""
    return any(
        n.phase is Phase.FORWARD and graph.checkpoint_layer(n) is not None and _core_attention(graph, n) for n in graph
    )


def _core_attention(graph: Graph, n: Node) -> bool:
    """Materialised attention: an unfused attention op, or a softmax of scores; a MoE router's softmax reads
    the router's weight matmul and is the router's, not the attention's."""
    if isinstance(n.attrs, AttentionAttrs):
        return not n.attrs.flash
    return n.op is OpKind.SOFTMAX and not is_weight_matmul(graph, graph[base(graph, n.inputs[0])])


def _unit(graph: Graph, n: Node) -> str:
    """Where a replayed node goes: the repeated block's layers replay before the block's backward
    (one copy stands for every repetition), a layer outside it before its own backward."""
    return graph.block_of(n) or graph.checkpoint_layer(n) or ""


def _replay_logits(graph: Graph) -> Graph:
    """The output layer's logits recomputed just before the loss's backward, which reads them there.

    MaxText's vocabulary tiling (``num_vocab_tiling``, src/maxtext/utils/vocabulary_tiling.py, commit
    e591f30) runs the output layer and the loss chunk by chunk under a ``lax.scan`` whose custom VJP
    keeps the hidden states and recomputes each chunk's logits in backward: no logits are kept between
    forward and backward, and one chunk's exist at a time (the memory analysis divides their working
    set by the chunk count).
    """
    g = graph.copy()
    for ce in [n for n in graph if n.phase is Phase.FORWARD and n.op is OpKind.CROSS_ENTROPY]:
        chain = [graph[ce.inputs[0]]]
        while chain[-1].op is OpKind.VIEW and chain[-1].inputs:
            chain.append(graph[chain[-1].inputs[0]])
        if not is_weight_matmul(graph, chain[-1]):
            continue
        readers = [n for n in g if n.phase is Phase.BACKWARD and n.origin == ce.id and ce.inputs[0] in n.inputs]
        if not readers:
            continue
        copies: dict[int, int] = {}
        for n in reversed(chain):
            ins = [copies.get(i, i) for i in n.inputs]
            copies[n.id] = g.add(
                n.op, ins, n.out, n.attrs, phase=Phase.RECOMPUTE, scope=n.scope, name=f"{n.name}.recompute", origin=n.id
            )
        for r in readers:
            g.replace(r.id, inputs=tuple(copies.get(i, i) for i in r.inputs))
        replay = [copies[n.id] for n in reversed(chain)]
        order = [nid for nid in g.nodes if nid not in set(replay)]
        at = order.index(readers[0].id)
        order[at:at] = replay
        g.nodes = {nid: g.nodes[nid] for nid in order}
    return g


def _module_nodes(graph: Graph, modules: tuple[str, ...]) -> list[Node]:
    """The forward nodes of a layer that Megatron's recompute_modules replay, with the casts they feed."""
    names = names_in_block(graph)
    chosen: set[int] = set()
    for n in graph:
        if n.phase is not Phase.FORWARD or graph.checkpoint_layer(n) is None or n.op.is_placeholder:
            continue
        if "core_attn" in modules and _core_attention(graph, n):
            chosen.add(n.id)
        if "layernorm" in modules and n.op is OpKind.NORM and not _fused_into_qkv(graph, n, names):
            chosen.add(n.id)
        if "moe_act" in modules and expert_activation(graph, n):
            chosen.add(n.id)
    if "mla_up_proj" in modules:
        chosen |= _mla_up(graph, names)
    if {"mlp", "moe", "shared_experts"} & set(modules):
        chosen |= _mlp_modules(graph, modules)
    # views and quantised copies (fp8 casts) of a replayed value are replayed with it: backward reads them
    for n in graph:
        if n.phase is Phase.FORWARD and (n.op is OpKind.VIEW or is_cast(n)) and any(i in chosen for i in n.inputs):
            chosen.add(n.id)
    return [n for n in graph if n.id in chosen]


def _mlp_modules(graph: Graph, modules: tuple[str, ...]) -> set[int]:
    """The nodes of the MLP modules ``mlp``, ``moe`` and ``shared_experts`` replay, layer by layer.

    Megatron-Core checkpoints a module from its input, the pre-MLP norm's output, and replays the module's
    whole forward, its tensor-parallel gathers and reductions and its expert all-to-alls included
    (transformer_layer.py ``_forward_mlp``: ``tensor_parallel.checkpoint(self.mlp, ...)`` on a dense layer
    only; moe_layer.py ``custom_forward`` under ``moe_layer_recompute``: shared experts, router, dispatch,
    experts, combine; ``shared_experts_recompute`` the shared experts alone; Megatron-LM commit d98e8a6).
    A module is the forward nodes after that norm that read only the norm's output, each other and
    parameters: the residual add, which reads the stream before the norm, is the layer's, not the module's.
    """
    layers: dict[str, list[Node]] = {}
    for n in graph:
        if n.phase is Phase.FORWARD and (layer := graph.checkpoint_layer(n)) is not None:
            layers.setdefault(layer, []).append(n)
    out: set[int] = set()
    for nodes in layers.values():
        experts = [n for n in nodes if _is_expert_gemm(graph, n)]
        if not ({"moe", "shared_experts"} & set(modules) if experts else "mlp" in modules):
            continue
        before = nodes[: nodes.index(experts[0])] if experts else nodes
        norms = [n for n in before if n.op is OpKind.NORM]
        if not norms:
            continue
        inside = _module_after(graph, nodes, norms[-1].id)
        if not experts or "moe" in modules:
            out |= inside
        else:
            out |= _shared_experts(graph, [n.id for n in nodes if n.id in inside], {n.id for n in experts})
    return out


def _module_after(graph: Graph, nodes: list[Node], norm: int) -> set[int]:
    """The forward nodes of a layer after ``norm`` that read its output, each other and parameters only."""
    inside: set[int] = set()
    ok = {norm}
    after = False
    for n in nodes:
        after = after or n.id == norm
        if not after or n.id == norm or n.op.is_placeholder:
            continue
        ins = [i for i in n.inputs if not graph[i].op.is_placeholder]
        if ins and all(i in ok for i in ins):
            inside.add(n.id)
            ok.add(n.id)
    return inside


def _shared_experts(graph: Graph, inside: list[int], experts: set[int]) -> set[int]:
    """Of a MoE module's nodes (in graph order), the shared experts': those that lead to a shared
    down-projection (an unbatched ``mlpwo``) and to no routed expert GEMM."""
    downs = [nid for nid in inside if nid not in experts and tensor_name(graph, graph[nid]) == "mlpwo"]
    if not downs:
        return set()
    ends = {reduced(graph, graph[d]) for d in downs}  # with tensor parallelism: the reduction after it
    lead: dict[int, tuple[bool, bool]] = {}  # node -> (reaches a shared end, reaches an expert GEMM)
    for nid in reversed(inside):
        below = [lead[u] for u in graph.users(nid) if u in lead]
        lead[nid] = (nid in ends or any(a for a, _ in below), nid in experts or any(b for _, b in below))
    return {nid for nid, (shared, routed) in lead.items() if shared and not routed}


def _users(graph: Graph, nid: int) -> list[Node]:
    return [graph[u] for u in graph.users(nid) if graph[u].phase is Phase.FORWARD]


def forward_readers(graph: Graph, nid: int) -> list[Node]:
    """The forward ops that read ``nid``, looking through views and quantising casts."""
    out: list[Node] = []
    for u in _users(graph, nid):
        out += forward_readers(graph, u.id) if u.op is OpKind.VIEW or is_cast(u) else [u]
    return out


def _fused_into_qkv(graph: Graph, norm: Node, names: dict[int, str]) -> bool:
    """A norm whose output only feeds the attention's input projections (TE's fused LayerNormLinear)."""
    readers = forward_readers(graph, norm.id)
    return bool(readers) and all(names.get(r.id) == "qkv_proj" for r in readers)


def _is_expert_gemm(graph: Graph, n: Node) -> bool:
    # ``grouped``: one expert per rank (expert parallelism as wide as the experts) leaves batch 1
    return isinstance(n.attrs, MatmulAttrs) and (n.attrs.grouped or n.attrs.batch > 1) and is_weight_matmul(graph, n)


def expert_activation(graph: Graph, n: Node) -> bool:
    """An elementwise op between an expert's fc1 and fc2 (its gated activation and product)."""
    if n.op is not OpKind.ELEMENTWISE or is_cast(n):
        return False
    reads_fc1 = any(
        _is_expert_gemm(graph, graph[base(graph, i)]) or _expert_activation_input(graph, i) for i in n.inputs
    )
    return reads_fc1 and _feeds_expert_gemm(graph, n.id)


def _expert_activation_input(graph: Graph, nid: int, depth: int = 2) -> bool:
    """Whether ``nid`` is an elementwise result of fc1's output, directly or through ``depth`` elementwise ops
    (gpt-oss's clamped halves and their concatenation before the activation: ArchConfig.expert_clamp)."""
    src = graph[base(graph, nid)]
    if src.op is not OpKind.ELEMENTWISE:
        return False
    return any(
        _is_expert_gemm(graph, graph[base(graph, i)]) or (depth > 0 and _expert_activation_input(graph, i, depth - 1))
        for i in src.inputs
    )


def _feeds_expert_gemm(graph: Graph, nid: int, depth: int = 4) -> bool:
    frontier = [nid]
    for _ in range(depth):
        nxt = []
        for i in frontier:
            for u in _users(graph, i):
                if _is_expert_gemm(graph, u):
                    return True
                if u.op in (OpKind.VIEW, OpKind.ELEMENTWISE):
                    nxt.append(u.id)
        frontier = nxt
    return False


def _mla_up(graph: Graph, names: dict[int, str]) -> set[int]:
    """MLA's up-projections (a projection into attention that reads a normalised latent, itself a
    projection's output) and the views and elementwise ops (RoPE, concatenation) up to attention."""
    ups = set()
    for nid, name in names.items():
        n = graph[nid]
        src = graph[base(graph, n.inputs[0])]
        if name == "qkv_proj" and src.op is OpKind.NORM and src.inputs:
            latent = graph[base(graph, src.inputs[0])]
            if latent.op is OpKind.MATMUL or (latent.op is OpKind.VIEW and latent.inputs):
                ups.add(nid)
    out = set(ups)
    frontier = list(ups)
    while frontier:
        nxt = []
        for i in frontier:
            for u in _users(graph, i):
                passes = u.op in (OpKind.VIEW, OpKind.ELEMENTWISE)
                if passes and u.id not in out and graph.checkpoint_layer(u) is not None:
                    out.add(u.id)
                    nxt.append(u.id)
        frontier = nxt
    return out


def _kept(graph: Graph, policy: Policy) -> set[int]:
    """Forward values inside a layer that the policy keeps (on the device or offloaded)."""
    wanted = policy.keep | policy.offload
    kept = {nid for nid, name in names_in_block(graph).items() if name in wanted}
    if policy.alternate:
        kept |= alternate_matmuls(graph)
    return kept


def _needed(graph: Graph, kept: set[int]) -> list[Node]:
    """The layer's forward nodes its backward reads, and what they are rebuilt from, up to kept values.

    The walk stops at the layer's input: outside the repeated blocks, or another layer's value inside a
    block of several (``decoder_layer_input`` is named on every decoder layer's input, so a block of
    several layers keeps each one's: MaxText's Gemma 3 and Llama 4 scannable blocks call one decoder
    layer per entry, src/maxtext/models/gemma3.py, commit e591f30)."""
    need: set[int] = set()
    stack = [
        (i, layer) for n in graph if n.phase is Phase.BACKWARD and (layer := graph.checkpoint_layer(n)) is not None
        for i in n.inputs
    ]  # fmt: skip
    while stack:
        nid, layer = stack.pop()
        src = graph[nid]
        if nid in need or nid in kept or src.phase is not Phase.FORWARD:
            continue
        if src.op.is_placeholder or graph.checkpoint_layer(src) != layer:
            continue
        need.add(nid)
        stack.extend((i, layer) for i in src.inputs)
    return [n for n in graph if n.id in need]
