"""Data parallelism, ZeRO / FSDP sharding, and the optimizer step.

The gradient replicas of a stage are its dp x cp ranks: every context-parallel rank computes partial
weight gradients of the same weights from its part of the sequence, so Megatron-Core reduces (and its
distributed optimizer shards) over the data-parallel group with context parallel, and torchtitan's FSDP
over dp_shard x cp (echosim/passes/plugin.py cites both). ``dp`` below is that product.

``zero=0``: DDP-style gradient all_reduce, bucketed the way Megatron-LM groups gradients
(buckets fill in backward order, one repeated layer at a time) so the timeline can overlap
each bucket with the backward of the layers still to come. Under PyTorch DDP (``torch_ddp``)
the buckets are its reducer's: capped by bytes over the gradients in the order they become
ready, so one bucket may span layers (:func:`ddp_bucket_assignment`).

``zero=1/2`` (ZeRO stages 1-2, Megatron's distributed optimizer): the buckets are
reduce-scattered instead, each rank updates its 1/dp shard, and the updated 16-bit
weights are all-gathered after the optimizer step (Rajbhandari et al. 2020).

``zero=3`` (ZeRO-3 / FSDP): weights are sharded too. Every micro-batch all-gathers each
layer's weights before its forward and again before its backward, and reduce-scatters
its gradients after; the all-gathers have no inputs in the IR, so the timeline runs
them ahead on the communication stream (prefetch). These use the ``fsdp`` axis, which
is placed like ``dp``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from echosim.ir.graph import Graph, Node
from echosim.ir.ops import Axis, CollectiveAttrs, ElementwiseAttrs, OpKind, OptimizerAttrs, ParamAttrs, Phase, Role
from echosim.ir.types import DType, TensorSpec
from echosim.passes.memory import optimizer_state_bytes

#: Megatron-LM's gradient bucket, in parameters (``DistributedDataParallel(bucket_size=40000000)`` before
#: core_v0.7.0; the floor of :func:`megatron_bucket_params` since).
MEGATRON_BUCKET_PARAMS = 40_000_000


def megatron_bucket_params(replicas: int) -> int:
    """Megatron-Core's default gradient bucket, in parameters: max(40M, 1M x the dp x cp ranks that reduce it).

    Larger data-parallel groups get larger buckets "to ensure that chunks used in NCCL ring-reduce implementations
    are large enough to remain bandwidth-bound rather than latency-bound" (Megatron-LM commit 0fda386, 2024-04-11,
    "Tune DDP bucket size to improve speed at large DP counts", first in core_v0.7.0). At commit d98e8a6:
    ``resolve_ddp_bucket_size`` in megatron/training/training.py and Megatron-Bridge's dist_utils take
    ``max(40000000, 1000000 * dp_cp size)`` when ``DistributedDataParallelConfig.bucket_size`` is None, its default
    (distributed_data_parallel_config.py)."""
    return max(MEGATRON_BUCKET_PARAMS, 1_000_000 * replicas)


@dataclass(frozen=True)
class DataParallel:
    dp: int  # ranks of a stage holding the same weights: dp x cp (context-parallel ranks reduce together)
    # parameters per gradient bucket: Megatron-LM's 40M (megatron_bucket_params scales it with dp, as
    # Megatron-Core does since core_v0.7.0); a bucket holds that many gradients in reduce_dtype
    bucket_params: int = MEGATRON_BUCKET_PARAMS
    reduce_dtype: DType = DType.FP32
    zero: int = 0
    # ZeRO-3 / FSDP: the dtype gradients are reduce-scattered in (None: the parameters' own dtype,
    # FSDP's MixedPrecision(reduce_dtype=None) with 16-bit parameters); a framework that casts the
    # gradients up before the collective (Composer's 'DEFAULT' mixed precision) sets fp32.
    fsdp_reduce_dtype: DType | None = None
    # PyTorch DDP's reducer copies each gradient into its bucket and back (``CollectiveAttrs.bucket_copy``)
    bucket_copies: bool = False
    # ZeRO-3 as DeepSpeed ran it in 2021 (echosim.frameworks, ``zero3_per_param``): one all_gather and one
    # reduce_scatter per parameter tensor instead of per layer, each waited for before the next kernel
    # (``CollectiveAttrs.blocking``) and each through PyTorch's list collectives (``rank_copies``)
    per_param: bool = False
    # ... and with full recompute, the parameters it gathers again for the recompute forward and once more
    # for backward: a parameter stays gathered between the two only when the parameters the sub-modules
    # in between use number fewer than this (0: no recompute re-gathers; DEEPSPEED_MAX_REUSE_DISTANCE)
    reuse_distance: int = 0
    # FSDP1's FlatParameter (ZeRO-2/3 as Composer runs them; echosim.frameworks, ``fsdp_flat_grads``): before
    # each unit's reduce-scatter the device concatenates its gradients into one flat gradient, casts that to
    # the reduce dtype and divides it by the pre-divide factor, three memory-bound kernels per micro-batch
    flat_grads: bool = False
    # FSDP2 (torchtitan; echosim.frameworks, ``fsdp2_copies``): each all-gather's output is copied out into the
    # unsharded parameters, and each unit's gradients are copied into the reduce-scatter input (in its dtype)
    fsdp2_copies: bool = False
    # PyTorch DDP's reducer (echosim.frameworks, ``ddp_bucket_copies``; TorchRec's DDP wrap): ZeRO 0's
    # buckets are its own (:func:`ddp_bucket_assignment`), not one repeated layer at a time
    torch_ddp: bool = False
    # ZeRO-3's weight shards in host memory (Plan.offload_params): each all-gather's shard crosses the host link first
    offload_params: bool = False
    name: ClassVar[str] = "data-parallel"

    def output_key(self) -> DataParallel:
        """This pass with ZeRO 2 read as ZeRO 1, which builds the same graph (:func:`echosim.passes.base.output_key`).

        :meth:`run` tells the stages apart as 0 (all-reduce buckets), 1 or 2 (reduce-scatter buckets and the
        step-end all-gather of the updated weights, Megatron's distributed optimizer) and 3 (FSDP): ZeRO-2's
        sharding of the gradients is memory only (:class:`~echosim.passes.memory.StatePolicy`; Rajbhandari
        et al. 2020, section 7: P_os+g communicates as much as P_os). FSDP1's flat gradients are their own field."""
        return replace(self, zero=1) if self.zero == 2 else self

    def bucket_buffers(self) -> bool:
        """Whether a rank keeps PyTorch DDP's flat gradient buckets besides its gradients, for the whole run:
        its reducer (``torch_ddp``, ZeRO 0 over more than one replica) with ``gradient_as_bucket_view=False``,
        whose gradients are copied into the buckets (``bucket_copies``) rather than being views of them.
        The memory model counts them (``StatePolicy.bucket_bytes``)."""
        return self.torch_ddp and self.bucket_copies and self.zero == 0 and self.dp > 1

    def run(self, graph: Graph) -> Graph:
        if self.dp == 1:
            return graph
        g = graph.copy()
        # kept on the input graph: a search runs this pass on one stage graph for every dp and ZeRO stage
        groups = graph.derived("dp-grad-groups", lambda: _grad_groups(graph))
        if self.torch_ddp and self.zero == 0:
            self._ddp_buckets(g, graph, [p for ps in groups.values() for p in ps])
            return g
        # later layers' gradients are ready first: reduce the block's buckets before the rest
        for scope in sorted(groups, key=lambda s: (s == "", s)):
            params = groups[scope]
            if self.zero == 3:
                self._fsdp(g, graph, scope, params)
            else:
                self._buckets(g, graph, scope, params)
        if self.zero in (1, 2):  # the updated shards back to every replica; a sparse table's owner updated it
            weights = sum(g[p].out.nbytes * g.multiplicity(g[p]) for p in graph.grads if not sparse_table(g[p]))
            dtype = next(iter(g[p].out.dtype for p in graph.grads), DType.BF16)
            spec = TensorSpec((max(1, weights // dtype.itemsize),), dtype)
            g.add(OpKind.ALL_GATHER, [], spec, CollectiveAttrs(Axis.DP, self.dp, weights, Role.STEP_END),
                  phase=Phase.OPTIMIZER, name="zero.param_all_gather")  # fmt: skip
        return g

    def _buckets(self, g: Graph, graph: Graph, scope: str, params: list[int]) -> None:
        kind = OpKind.ALL_REDUCE if self.zero == 0 else OpKind.REDUCE_SCATTER
        elems = sum(g[p].out.numel for p in params)
        nbytes = elems * self.reduce_dtype.itemsize
        buckets = min(MAX_BUCKETS, max(1, math.ceil(elems / self.bucket_params)))
        grads = [graph.grads[p] for p in params]
        if self.flat_grads and kind is OpKind.REDUCE_SCATTER:
            grads = self._flattened(g, grads, self.reduce_dtype, scope)
        # the buckets of a scope are equal but for their names: one output and one set of attributes for all (a
        # search runs this pass on ~17k stage graphs of GPT-3 175B, up to MAX_BUCKETS buckets per scope)
        size = nbytes // buckets
        spec = TensorSpec((size // self.reduce_dtype.itemsize,), self.reduce_dtype)
        copy = self.bucket_copies and kind is OpKind.ALL_REDUCE
        attrs = CollectiveAttrs(Axis.DP, self.dp, size, Role.GRAD_SYNC, bucket_copy=copy)
        # one inputs tuple for all (Graph.add keeps a tuple as given): not copied per bucket, and the analyses that
        # compare a bucket's inputs with the one before's (twin_of) find them equal at once
        ins, prefix = tuple(grads), f"dp.grad_{kind.value}.{scope or 'rest'}."
        for b in range(buckets):
            g.add(kind, ins, spec, attrs, phase=Phase.BACKWARD, scope=scope, name=f"{prefix}{b}")

    def _ddp_buckets(self, g: Graph, graph: Graph, params: list[int]) -> None:
        """PyTorch DDP's buckets (:func:`ddp_buckets`), each one all_reduce in its gradients' dtype with one
        input per gradient it holds (a repeated layer's once per repetition, for its copies) and ``ready`` at
        its last gradient; they run in their order."""
        reps = max(1, next(iter(graph.repeats.values()), 1))
        for b, bucket in enumerate(ddp_buckets(graph, frozenset(params), reps, self.reduce_dtype)):
            spec = TensorSpec((max(1, bucket.nbytes // bucket.dtype.itemsize),), bucket.dtype)
            attrs = CollectiveAttrs(Axis.DP, self.dp, bucket.nbytes, Role.GRAD_SYNC, bucket_copy=self.bucket_copies,
                                    ready=bucket.ready)  # fmt: skip
            g.add(OpKind.ALL_REDUCE, list(bucket.grads), spec, attrs, phase=Phase.BACKWARD,
                  name=f"dp.grad_all_reduce.ddp.{b}")  # fmt: skip

    def _fsdp(self, g: Graph, graph: Graph, scope: str, params: list[int]) -> None:
        weights = sum(g[p].out.nbytes for p in params)
        wspec = TensorSpec((max(1, weights // 2),), g[params[0]].out.dtype)
        tag = scope or "rest"
        rdtype = self.fsdp_reduce_dtype or g[params[0]].out.dtype
        grad_bytes = sum(g[p].out.numel for p in params) * rdtype.itemsize
        gspec = TensorSpec((max(1, grad_bytes // rdtype.itemsize),), rdtype)
        gathers = [(Phase.FORWARD, weights, ()), (Phase.BACKWARD, weights, ())]
        scatter: tuple[int, ...] = ()
        if self.per_param:  # DeepSpeed 2021: one collective per tensor, blocking, through the list form
            gathers = [(ph, weights, tuple(g[p].out.nbytes for p in params)) for ph, _, _ in gathers]
            scatter = tuple(g[p].out.numel * rdtype.itemsize for p in params)
            again = self._regathered(g, scope, params)
            if again:
                gathers.insert(1, (Phase.RECOMPUTE, sum(again), tuple(again)))
        sync = self.per_param
        for phase, nbytes, pieces in gathers:
            spec = wspec if nbytes == weights else TensorSpec((max(1, nbytes // 2),), wspec.dtype)
            host = nbytes // self.dp if self.offload_params else 0
            attrs = CollectiveAttrs(Axis.FSDP, self.dp, nbytes, blocking=sync, rank_copies=sync, pieces=pieces,
                                    host_bytes=host)  # fmt: skip
            gathered = g.add(OpKind.ALL_GATHER, [], spec, attrs, phase=phase, scope=scope,
                             name=f"fsdp.param_all_gather.{tag}.{phase.value}")  # fmt: skip
            if self.fsdp2_copies:  # split_with_sizes_copy into the unsharded parameters, on the compute stream
                g.add(OpKind.ELEMENTWISE, [gathered], spec, ElementwiseAttrs("copy", 0), phase=phase, scope=scope,
                      name=f"fsdp.param_copy_out.{tag}.{phase.value}")  # fmt: skip
        attrs = CollectiveAttrs(Axis.FSDP, self.dp, grad_bytes, blocking=sync, rank_copies=sync, pieces=scatter)
        grads = [graph.grads[p] for p in params]
        if self.flat_grads:
            grads = self._flattened(g, grads, rdtype, scope)
        elif self.fsdp2_copies:  # chunk_cat of the gradients into the reduce-scatter input, cast on the way
            grads = [g.add(OpKind.ELEMENTWISE, grads, gspec, ElementwiseAttrs("chunk_cat", 0), phase=Phase.BACKWARD,
                           scope=scope, name=f"fsdp.grad_copy_in.{tag}")]  # fmt: skip
        g.add(OpKind.REDUCE_SCATTER, grads, gspec, attrs, phase=Phase.BACKWARD,
              scope=scope, name=f"fsdp.grad_reduce_scatter.{tag}")  # fmt: skip

    def _flattened(self, g: Graph, grads: list[int], reduce_dtype: DType, scope: str) -> list[int]:
        """FSDP1's kernels between one unit's gradients and their reduce-scatter (``flat_grads``): autograd's
        concatenation into the flat gradient (SplitWithSizesBackward of the parameter views), the cast to the
        reduce dtype when it differs, and the in-place division by the pre-divide factor (>= 2 on any group
        of two or more ranks). They read and write the whole unsharded gradient of the unit. The concatenation
        runs on the compute stream; the cast and the division on FSDP's post-backward stream, but a
        memory-bound kernel fills every SM it is given, so beside the next layer's GEMMs it takes their SMs
        rather than idle ones: the nodes are compute nodes, in line with the backward."""
        numel = sum(g[i].out.numel for i in grads)
        dtype = g[grads[0]].out.dtype
        tag = scope or "rest"
        steps = [("cat", dtype)] + ([("cast", reduce_dtype)] if reduce_dtype != dtype else []) + [("div", reduce_dtype)]
        last = grads
        for fn, out_dtype in steps:
            spec = TensorSpec((max(1, numel),), out_dtype)
            last = [g.add(OpKind.ELEMENTWISE, last, spec, ElementwiseAttrs(fn, 0 if fn != "div" else 1),
                          phase=Phase.BACKWARD, scope=scope, name=f"fsdp.grad_{fn}.{tag}")]  # fmt: skip
        return last

    def _regathered(self, g: Graph, scope: str, params: list[int]) -> list[int]:
        """Bytes of each parameter gathered again under full recompute (``reuse_distance``): the recompute
        forward's hooks fetch every parameter of a checkpointed layer, and backward fetches it once more
        unless the sub-modules recomputed after it and back-propagated before it (each counted twice) hold
        fewer parameters than the reuse distance. ``params`` come in backward order."""
        if not (scope and self.reuse_distance):  # only the layers are checkpointed (Megatron's checkpoint)
            return []
        out, between, seen, module = [], 0, 0, None
        for p in params:
            if g[p].scope != module:
                module, between = g[p].scope, seen
            seen += 2 * g[p].out.numel
            if between >= self.reuse_distance:
                out.append(g[p].out.nbytes)
        return out


#: PyTorch DDP's bucket caps in bytes (torch 2.13): ``bucket_cap_mb`` 25 MiB (torch/nn/parallel/distributed.py
#: ``_DEFAULT_BUCKET_CAP_MB``; torch/csrc/distributed/c10d/reducer.hpp ``kDefaultBucketBytesCap``) and, when
#: ``bucket_cap_mb`` is left at its default, 1 MiB for the first bucket, the gradients ready first
#: (``dist._DEFAULT_FIRST_BUCKET_BYTES``, ``kDefaultFirstBucketBytes``; ``_BucketCapacityConfig.create``).
DDP_FIRST_BUCKET_BYTES = 1024 * 1024
DDP_BUCKET_CAP_BYTES = 25 * 1024 * 1024


def ddp_bucket_assignment(
    sizes: Sequence[tuple[int, Hashable]], limits: Sequence[int] = (DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_CAP_BYTES)
) -> list[list[int]]:
    """PyTorch DDP's buckets of tensors of ``sizes`` (bytes, dtype) given in the order their gradients become
    ready: indices into ``sizes``, buckets in the order they are reduced.

    ``compute_bucket_assignment_by_size`` (torch/csrc/distributed/c10d/reducer.cpp) as ``Reducer::
    rebuild_buckets`` calls it after the first iteration, with the parameters in the order their gradients
    were ready and limits ``{first_bucket_bytes_cap_, bucket_bytes_cap_}``: one open bucket per dtype (and
    device) takes each tensor in turn and closes once its bytes reach its limit; the limit then moves to the
    next (and stays at the last); the open buckets close at the end. With the ready order given, nothing is
    sorted. (The first iteration runs one bucket, ``[sys.maxsize]`` without ``find_unused_parameters``:
    torch/nn/parallel/distributed.py ``_BucketCapacityConfig.compute_bucket_size_limits``; a step time is
    measured after it.) tests/test_ddp_buckets.py checks this against torch's own
    ``_compute_bucket_assignment_by_size``."""
    out: list[list[int]] = []
    open_: dict[Hashable, tuple[list[int], int, int]] = {}  # dtype -> (indices, bytes, limit index)
    for i, (nbytes, key) in enumerate(sizes):
        indices, total, at = open_.get(key, ([], 0, 0))
        indices.append(i)
        total += nbytes
        if total >= limits[at]:
            out.append(indices)
            indices, total, at = [], 0, min(at + 1, len(limits) - 1)
        open_[key] = (indices, total, at)
    out += [indices for indices, _, _ in open_.values() if indices]
    return out


@dataclass(frozen=True)
class DdpBucket:
    """One of PyTorch DDP's gradient buckets: its bytes and dtype, when it is ready (``CollectiveAttrs.ready``)
    and the gradients it holds (node ids, a repeated layer's once per repetition)."""

    nbytes: int
    dtype: DType
    ready: int
    grads: tuple[int, ...]


def ddp_buckets(graph: Graph, params: frozenset[int], reps: int, dtype: DType) -> list[DdpBucket]:
    """PyTorch DDP's buckets of the gradients of ``params`` with the repeated block run ``reps`` times:
    :func:`ddp_bucket_assignment` over them in the order they become ready (:func:`ddp_ready_order`), the
    block's once per repetition. The gradients
    are in ``dtype``, the data-parallel pass's reduce dtype: fp32, the parameters' under torch.autocast and in
    fp32 training (the IR's parameter nodes carry the compute dtype)."""
    before, block, after = graph.derived("ddp-ready-order", lambda: ddp_ready_order(graph))
    seq = [(p, 0) for p in before if p in params]
    seq += [(p, j) for j in range(1, reps + 1) for p in block if p in params]
    seq += [(p, reps + 1) for p in after if p in params]
    sizes = [(graph[p].out.numel * dtype.itemsize, dtype) for p, _ in seq]
    return [
        DdpBucket(
            sum(sizes[i][0] for i in bucket),
            sizes[bucket[0]][1],
            max(seq[i][1] for i in bucket),
            tuple(graph.grads[seq[i][0]] for i in bucket),
        )
        for bucket in ddp_bucket_assignment(sizes)
    ]


def ddp_ready_order(graph: Graph) -> tuple[list[int], list[int], list[int]]:
    """The parameters in the order the backward makes their gradients ready (graph order of the gradients):
    those before the repeated block's backward (the output layer's), one repetition of the block's, and those
    after it (the embedding's), the units the timeline splits a backward into (timeline.lower._split_units).
    PyTorch's autograd engine runs the same order (DDP rebuilds its buckets from it; ``Reducer::
    autograd_hook`` records ``rebuilt_params_`` as each gradient is marked ready)."""
    later = {n.id for n in graph if n.phase in (Phase.BACKWARD, Phase.RECOMPUTE) and graph.block_of(n) is not None}
    for n in graph:  # graph order is topological: one sweep finds every descendant
        if n.id not in later and not later.isdisjoint(n.inputs):
            later.add(n.id)
    at = {nid: i for i, nid in enumerate(graph.nodes)}
    by_grad = sorted(graph.grads, key=lambda p: at[graph.grads[p]])
    before, block, after = [], [], []
    for p in by_grad:
        grad = graph[graph.grads[p]]
        if graph.block_of(grad) is not None:
            block.append(p)
        else:
            (after if grad.id in later else before).append(p)
    return before, block, after


#: DeepSpeed's ``stage3_max_reuse_distance`` default, in parameters: a sub-module's gathered parameters are
#: released after use unless the parameters used before their next use number fewer (deepspeed/runtime/zero/
#: constants.py ZERO_OPTIMIZATION_MAX_REUSE_DISTANCE_DEFAULT = 1e9; stage3.py _keep_for_later, commit c83e49f).
DEEPSPEED_MAX_REUSE_DISTANCE = 1_000_000_000


#: Bytes PyTorch DDP's reducer moves per byte of a bucket it all-reduces (``gradient_as_bucket_view=False``):
#: ``mul_out(bucket_view, grad, 1/world)`` reads the gradient and writes the bucket as the gradient becomes
#: ready, and ``grad.copy_(bucket_view)`` reads the bucket and writes the gradient after the all-reduce
#: (torch/csrc/distributed/c10d/reducer.cpp, torch 2.13). Two passes over the bucket each way.
DDP_COPY_BYTES_PER_BYTE = 2


def bucket_copy_bytes(node: Node) -> tuple[int, int]:
    """Bytes of DDP's copy of a gradient bucket into it before its all-reduce and back after: (in, out)."""
    a = node.attrs
    if not isinstance(a, CollectiveAttrs) or not a.bucket_copy:
        return 0, 0
    return DDP_COPY_BYTES_PER_BYTE * a.bytes, DDP_COPY_BYTES_PER_BYTE * a.bytes


def sparse_table(node: Node) -> bool:
    """An embedding table a fused sparse optimizer updates (set by the embedding-sharding pass)."""
    return isinstance(node.attrs, ParamAttrs) and node.attrs.sparse


#: Gradient buckets of one block: beyond it the buckets grow instead (a 10^14-parameter layer would
#: otherwise add tens of millions of collectives; 1,024 of Megatron's 160 MB buckets hold a 40 B-parameter block).
MAX_BUCKETS = 1024


# Bytes an Adam(W) step moves per parameter with fp32 master weights (Megatron mixed
# precision): read fp32 grad, master, m, v (16) + write master, m, v (12) + write
# the 16-bit model copy (2) + read the grad again for the global-norm clip (4).
ADAM_BYTES_PER_PARAM = 34
# Plain fp32 AdamW: read param, grad, m, v (16) + write param, m, v (12) + clip read (4).
ADAM_FP32_BYTES_PER_PARAM = 32


def optimizer_step_bytes(dtype: str, spec: str, te: bool = True) -> int:
    """:data:`ADAM_BYTES_PER_PARAM`'s traffic with the states in the dtypes ``spec`` names
    (:func:`echosim.passes.memory.optimizer_state_bytes`): the main gradient read twice (step and clip), the master
    and moments read and written, the 16-bit weight written, and where only the master's low 16 bits are kept
    (``store_param_remainders``) the weight read too, to rebuild it."""
    s = optimizer_state_bytes(dtype, spec, te=te)
    return int(2 * s.grad + 2 * (s.master + s.moments) + 2 + (2 if s.remainders else 0))


def _grad_groups(graph: Graph) -> dict[str, list[int]]:
    """The parameters whose gradients the data-parallel ranks reduce, by layer ("" outside the layers and tied)."""
    groups: dict[str, list[int]] = {}
    for param, grad in graph.grads.items():
        if sparse_table(graph[param]):  # updated in backward by its owner; its all_to_all carried the gradients
            continue
        attrs = graph[grad].attrs
        if isinstance(attrs, CollectiveAttrs) and attrs.axis is Axis.EMBED:  # tied weight: synced at step end
            groups.setdefault("", []).append(param)
            continue
        # each layer's gradients (a repeated block of several layers: each of them), as in the unfolded model
        groups.setdefault(graph.layer_of(graph[param]) or "", []).append(param)
    return groups


def _routed_expert(node: Node) -> bool:
    return isinstance(node.attrs, ParamAttrs) and node.attrs.expert


@dataclass(frozen=True)
class Optimizer:
    kind: str = "adam"
    shard: int = 1  # ZeRO: each rank updates 1/shard of the parameters
    mixed_precision: bool = True
    # ZeRO: routed experts' share, sharded over their expert-data-parallel ranks (0: ``shard``), as their state is
    expert_shard: int = 0
    bytes_per_param: int = 0  # the framework's own optimizer kernels (0: a fused Adam, the two constants above)
    # the step runs on the host CPU over fp32 state in host memory (DeepSpeed's CPU Adam, Megatron-Core's hybrid
    # device optimizer with param_update_in_fp32): plain fp32 AdamW's traffic there, whatever the device keeps.
    # The job's rank count (OptimizerAttrs.host_ranks); 0: the device steps it
    host_ranks: int = 0
    overlapped: bool = False  # the host step's copies and update pipelined (OptimizerAttrs.overlapped)
    name: ClassVar[str] = "optimizer"

    def run(self, graph: Graph) -> Graph:
        if self.kind not in ("adam", "adamw"):
            raise ValueError(f"unknown optimizer {self.kind!r} (known: adam, adamw)")
        g = graph.copy()
        sparse = experts = total = 0  # one walk over the parameters (Graph.param_count's sum among them)
        for p in g.params():
            numel = p.out.numel * g.multiplicity(p)
            total += numel
            if sparse_table(p):
                sparse += numel
            if _routed_expert(p):
                experts += numel
        dense = total - sparse - experts  # sparse tables: updated inside backward
        n = math.ceil(dense / self.shard) + math.ceil(experts / (self.expert_shard or self.shard))
        per_param = self.bytes_per_param or (
            ADAM_BYTES_PER_PARAM if self.mixed_precision else ADAM_FP32_BYTES_PER_PARAM
        )
        if self.host_ranks:
            per_param = ADAM_FP32_BYTES_PER_PARAM
        g.add(
            OpKind.OPTIMIZER_UPDATE, list(g.grads.values()), TensorSpec((max(n, 1),), DType.FP32),
            OptimizerAttrs(self.kind, n, per_param, self.host_ranks, self.overlapped), phase=Phase.OPTIMIZER,
            name="optimizer.step",
        )  # fmt: skip
        return g
