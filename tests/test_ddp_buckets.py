"""PyTorch DDP's gradient buckets (``DataParallel.torch_ddp``): its reducer's assignment, and their timing."""

from __future__ import annotations

import pytest
import torch
from torch._C._distributed_c10d import _compute_bucket_assignment_by_size

from echosim.backends import cpu
from echosim.backends.base import Placement
from echosim.compiler import lower
from echosim.frontend import zoo_modules
from echosim.frontend.zoo import ArchConfig
from echosim.ir.ops import CollectiveAttrs, OpKind, Role
from echosim.ir.types import DType
from echosim.passes.data_parallel import DDP_BUCKET_CAP_BYTES, DDP_FIRST_BUCKET_BYTES, ddp_bucket_assignment
from echosim.plan import Cluster, Plan

#: benchmarks/cpu_reality.py's llama-4L-256 and gpt-6L-384
LLAMA = ArchConfig("llama", layers=4, hidden=256, heads=4, kv_heads=2, ffn=688, vocab=4096, seq_len=256)
GPT = ArchConfig("gpt", layers=6, hidden=384, heads=6, vocab=4096, seq_len=256, tied_embeddings=True)
LIMITS = [DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_CAP_BYTES]


def _buckets(cfg: ArchConfig, framework: str = "eager", backend: str = "cpu-x86") -> list:
    plan = Plan(dp=2, micro_batch=4, global_batch=8, dtype="fp32", attention="flash", framework=framework)
    compiled = lower(cfg.with_(dropout=0.0), plan, Cluster(backend, 2, 2))
    graph = compiled.stages[0].graph  # type: ignore[attr-defined]
    return [n for n in graph if isinstance(n.attrs, CollectiveAttrs) and n.attrs.role is Role.GRAD_SYNC]


@pytest.mark.parametrize("cfg", [LLAMA, GPT], ids=["llama-4L-256", "gpt-6L-384"])
def test_the_assignment_is_torchs_own_on_a_real_models_parameters(cfg: ArchConfig) -> None:
    """The reducer's rule (reducer.cpp compute_bucket_assignment_by_size, as rebuild_buckets calls it: tensors in
    gradient-ready order, limits 1 MiB then 25 MiB) over the real module's parameters, last registered first."""
    torch.manual_seed(0)
    params = list(reversed(list((zoo_modules.GPT if cfg.arch == "gpt" else zoo_modules.Llama)(cfg).parameters())))
    indices = list(range(len(params)))
    expected, _ = _compute_bucket_assignment_by_size(params, LIMITS, [False] * len(params), indices)
    ours = ddp_bucket_assignment([(p.numel() * p.element_size(), p.dtype) for p in params])
    assert ours == expected and len(ours) > 1


def test_the_assignment_caps_by_dtype_and_moves_to_the_next_limit() -> None:
    """Synthetic sizes, two dtypes: each dtype fills its own bucket, the 1 MiB limit applies once per dtype."""
    shapes = [(300_000, torch.float32), (10, torch.float32), (7_000_000, torch.float32), (100, torch.float64),
              (400_000, torch.float64), (5, torch.float32), (6_600_000, torch.float32)]  # fmt: skip
    tensors = [torch.empty(n, dtype=d) for n, d in shapes]
    expected, _ = _compute_bucket_assignment_by_size(tensors, LIMITS, [False] * len(tensors), list(range(len(tensors))))
    ours = ddp_bucket_assignment([(t.numel() * t.element_size(), t.dtype) for t in tensors])
    assert ours == expected


def test_llama_4l_256_buckets_are_the_reducers_rebuilt_ones() -> None:
    """lm_head's 4 MiB gradient is ready first and closes the 1 MiB bucket alone; every other gradient (the
    norm, the four layers, the embedding, ready last) fits one 25 MiB bucket, reduced when the embedding's
    gradient is ready. The reducer's rebuilt buckets of the real model (DistributedDataParallel over a
    one-rank gloo group, three iterations, ``reducer._get_zeros_like_grad_buckets()``, torch 2.13): the
    same [4,194,304, 15,803,392] bytes."""
    nodes = _buckets(LLAMA)
    assert [n.attrs.bytes for n in nodes] == [4096 * 256 * 4, 15_803_392]
    assert all(n.op is OpKind.ALL_REDUCE and n.attrs.bucket_copy for n in nodes)
    assert [n.attrs.ready for n in nodes] == [0, LLAMA.layers + 1]  # after lm_head, at the backward's end
    # one input per gradient it holds: the block's once per layer (the copies count each)
    assert len(nodes[1].inputs) == 1 + 9 * LLAMA.layers + 1


def test_gpt_buckets_span_layers() -> None:
    """gpt-6L-384 (tied embedding): ln_f and layer 5's first gradients fill the 1 MiB bucket, 25 MiB buckets
    then cross layers and the last one is completed by the tied embedding. The reducer's rebuilt buckets of
    the real model: [2,363,904, 28,391,424, 18,519,552]; autograd makes a Linear's bias gradient ready before
    its weight's where echosim's graph has the weight's first, which moves one 384-float bias between the
    first and the last bucket."""
    nodes = _buckets(GPT)
    assert [n.attrs.bytes for n in nodes] == [2_363_904 - 1536, 28_391_424, 18_519_552 + 1536]
    assert [n.attrs.ready for n in nodes] == [1, 5, GPT.layers + 1]
    assert sum(n.attrs.bytes for n in nodes) == 4 * sum(
        p.numel() for p in zoo_modules.GPT(GPT).parameters()
    )  # every gradient once


def test_the_exposed_reduction_follows_the_last_bucket() -> None:
    """llama-4L-256 on the CPU model: the lm_head bucket is reduced beside the layers' backward (on a core the
    compute shares: its time again through the overlap slowdown) and the 15.8 MB bucket after the embedding's
    gradient, exposed whole: exposed = t(last) + (slowdown - 1) t(first)."""
    plan = Plan(dp=2, micro_batch=4, global_batch=8, dtype="fp32", attention="flash")
    compiled = lower(LLAMA.with_(dropout=0.0), plan, Cluster("cpu-x86", 2, 2))
    stage = compiled.costed.stages[0]  # type: ignore[attr-defined]
    backend = cpu.CPUBackend(cpu.CPU_X86)
    first, last = (
        backend.collective_time_s(OpKind.ALL_REDUCE, n, Placement(2, 1, 2)) for n in (4096 * 256 * 4, 15_803_392)
    )
    slowdown = backend.overlap().compute_slowdown
    assert stage.dp_busy == pytest.approx(first + last)
    assert stage.dp_exposed == pytest.approx(last + (slowdown - 1.0) * first)


def test_megatron_xla_apex_and_split_models_keep_their_own_buckets() -> None:
    """Megatron-Core's DDP buckets one repeated layer at a time; XLA compiles the reduction into the step; apex's
    DDP has its own rule; a model split by tensor or pipeline parallelism is not plain PyTorch's (no DDP
    reducer over a whole replica): all keep the per-layer buckets."""
    for framework, backend in (("megatron", "cpu-x86"), ("eager", "tpu-v5e"), ("apex-ddp", "cpu-x86")):
        nodes = _buckets(LLAMA, framework, backend)
        assert nodes and all(n.attrs.ready == -1 for n in nodes)
    for split in ({"tp": 2}, {"pp": 2}):
        plan = Plan(dp=2, micro_batch=4, global_batch=16, dtype="bf16", framework="eager", **split)  # type: ignore[arg-type]
        compiled = lower(LLAMA.with_(dropout=0.0), plan, Cluster("h100-sxm", 4, 8))
        graph = compiled.stages[0].graph  # type: ignore[attr-defined]
        nodes = [n for n in graph if isinstance(n.attrs, CollectiveAttrs) and n.attrs.role is Role.GRAD_SYNC]
        assert nodes and all(n.attrs.ready == -1 for n in nodes)


def test_autocast_buckets_hold_fp32_gradients() -> None:
    """Under torch.autocast the parameters, and so their gradients and DDP's buckets, stay fp32 (the IR's
    parameter nodes carry the compute dtype): the same bytes as fp32 training."""
    plan = Plan(dp=2, micro_batch=4, global_batch=8, dtype="bf16", attention="flash", framework="eager-amp")
    compiled = lower(LLAMA.with_(dropout=0.0), plan, Cluster("a100-80gb", 2, 8))
    graph = compiled.stages[0].graph  # type: ignore[attr-defined]
    nodes = [n for n in graph if isinstance(n.attrs, CollectiveAttrs) and n.attrs.role is Role.GRAD_SYNC]
    assert {n.out.dtype for n in nodes} == {DType.FP32}
    assert [n.attrs.bytes for n in nodes] == [4096 * 256 * 4, 15_803_392]
