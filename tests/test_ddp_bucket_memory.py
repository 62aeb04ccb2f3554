"""PyTorch DDP's flat gradient buckets in the memory model (``StatePolicy.bucket_bytes``).

With its default ``gradient_as_bucket_view=False`` the reducer allocates its buckets once and keeps them for the
run, beside the ``.grad`` tensors (reducer.cpp ``Reducer::initialize_buckets``): one more copy of every gradient
it reduces, in ``comm_buffers``. Megatron's DDP, FSDP / ZeRO and XLA keep no such copy.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from echosim.compiler import lower
from echosim.frontend.zoo import ArchConfig
from echosim.ir.ops import CollectiveAttrs, Role
from echosim.passes.memory import NCCL_BUFFERS_PER_GROUP, StatePolicy, transient_bytes
from echosim.plan import Cluster, Plan
from echosim.timeline.report import build_report

#: tests/test_ddp_buckets.py's llama-4L-256: lm_head closes the 1 MiB bucket, the rest fills one 25 MiB bucket
LLAMA = ArchConfig("llama", layers=4, hidden=256, heads=4, kv_heads=2, ffn=688, vocab=4096, seq_len=256)


def _compile(framework: str = "eager", dtype: str = "fp32", backend: str = "a100-80gb", **degrees: int) -> object:
    dp = degrees.pop("dp", 2)
    plan = Plan(dp=dp, micro_batch=4, global_batch=8 * dp, dtype=dtype, attention="flash", framework=framework,
                **degrees)  # type: ignore[arg-type]  # fmt: skip
    devices = dp * degrees.get("tp", 1) * degrees.get("pp", 1)
    return lower(LLAMA.with_(dropout=0.0), plan, Cluster(backend, devices, 8))


def _nccl(compiled: object) -> int:
    return compiled.facts.comm_groups * NCCL_BUFFERS_PER_GROUP  # type: ignore[attr-defined]


@pytest.mark.parametrize("framework, dtype", [("eager", "fp32"), ("eager-amp", "bf16"), ("eager", "bf16")])
def test_eager_data_parallel_keeps_a_second_copy_of_every_gradient(framework: str, dtype: str) -> None:
    """The buckets hold every parameter's gradient in fp32 (fp32 training and autocast's fp32 parameters; the
    data-parallel pass's reduce dtype): 4 bytes a parameter on top of the NCCL buffers, exactly the
    gradients' own bytes and the bytes of the buckets the reducer all-reduces."""
    compiled = _compile(framework, dtype)
    (row,) = compiled.report.memory  # type: ignore[attr-defined]
    params = compiled.report.params  # type: ignore[attr-defined]
    assert row["comm_buffers"] - _nccl(compiled) == params * 4 == row["grads"]
    graph = compiled.stages[0].graph  # type: ignore[attr-defined]
    buckets = [n for n in graph if isinstance(n.attrs, CollectiveAttrs) and n.attrs.role is Role.GRAD_SYNC]
    assert all(n.attrs.ready >= 0 and n.attrs.bucket_copy for n in buckets)
    assert sum(n.attrs.bytes for n in buckets) == params * 4


def test_pytorchs_reducer_keeps_buckets_of_every_gradient_apart_from_the_grads() -> None:
    """The real thing (torch's DistributedDataParallel over a one-rank gloo group, the zoo's module, two steps so
    the buckets are rebuilt): with gradient_as_bucket_view=False the buckets a comm hook is handed hold every
    parameter's gradient and no .grad lies in them, so they are a second copy: the bytes echosim counts. With
    True every .grad is a view into them (no copy)."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from echosim.frontend import zoo_modules

    compiled = _compile()
    counted = compiled.report.memory[0]["comm_buffers"] - _nccl(compiled)  # type: ignore[attr-defined]
    cfg = LLAMA.with_(dropout=0.0)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for view in (False, True):
            torch.manual_seed(0)
            module = zoo_modules.Llama(cfg)
            ddp = DistributedDataParallel(module, gradient_as_bucket_view=view)
            buckets: dict[int, object] = {}

            # torch checks a comm hook's annotations against dist.GradBucket and Future (strings here): left off
            def hook(state, bucket, buckets=buckets):  # type: ignore[no-untyped-def]
                buckets[bucket.index()] = bucket.buffer()  # type: ignore[attr-defined]
                done = torch.futures.Future()
                done.set_result(bucket.buffer())  # type: ignore[attr-defined]
                return done

            ddp.register_comm_hook(None, hook)
            ids = torch.randint(0, cfg.vocab, (1, 32))
            for _ in range(2):  # the buckets are rebuilt in gradient-ready order as the second step begins
                ddp(ids, ids).backward()
            storages = [b.untyped_storage() for b in buckets.values()]  # type: ignore[attr-defined]
            spans = [(s.data_ptr(), s.data_ptr() + s.nbytes()) for s in storages]
            grads = [p.grad for p in module.parameters()]
            inside = [any(lo <= g.data_ptr() < hi for lo, hi in spans) for g in grads]
            assert sum(b.numel() * b.element_size() for b in buckets.values()) == counted  # type: ignore[attr-defined]
            assert all(inside) if view else not any(inside)
    finally:
        dist.destroy_process_group()


def test_the_peak_grows_by_exactly_the_gradient_bytes() -> None:
    """The same step without the buckets (``bucket_bytes`` 0) peaks lower by the fp32 gradients, params x 4."""
    compiled = _compile()
    facts = compiled.facts  # type: ignore[attr-defined]
    assert facts.state.bucket_bytes == 4.0
    without = build_report(compiled.costed, replace(facts, state=replace(facts.state, bucket_bytes=0.0)))  # type: ignore[attr-defined]
    gained = compiled.report.memory[0]["peak"] - without.memory[0]["peak"]  # type: ignore[attr-defined]
    assert gained == compiled.report.params * 4  # type: ignore[attr-defined]


def test_the_buckets_are_not_also_in_the_working_set() -> None:
    """Persistent buffers, reduced in place: the step's transient is the backward's alone, what the stage graph
    before the data-parallel and optimizer passes gives."""
    compiled = _compile()
    stage = compiled.stages[0]  # type: ignore[attr-defined]
    saved = compiled.facts.saved  # type: ignore[attr-defined]
    assert compiled.report.memory[0]["transient"] == transient_bytes(stage.base, saved)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "framework, backend, degrees",
    [
        ("megatron", "a100-80gb", {}),  # Megatron-Core's DDP: the gradient buffer is the buckets
        ("eager", "a100-80gb", {"zero": 1}),  # ZeRO / FSDP reduce-scatter, no DDP reducer
        ("eager", "a100-80gb", {"zero": 3}),
        ("eager", "a100-80gb", {"dp": 1}),  # no data parallelism, no DDP
        ("eager", "a100-80gb", {"tp": 2}),  # a split model stands for Megatron-Core's DDP
        ("eager", "tpu-v5e", {}),  # XLA compiles the all-reduce into the step
    ],
)
def test_no_bucket_copy_without_pytorch_ddps_reducer(framework: str, backend: str, degrees: dict[str, int]) -> None:
    compiled = _compile(framework, "bf16", backend, **degrees)
    assert compiled.facts.state.bucket_bytes == 0.0  # type: ignore[attr-defined]
    assert all(row["comm_buffers"] == _nccl(compiled) for row in compiled.report.memory)  # type: ignore[attr-defined]


def test_the_state_policy_counts_the_buckets_at_zero_zero_only() -> None:
    assert StatePolicy.for_training("fp32", ddp_bucket_buffers=True).bucket_bytes == 4.0
    assert StatePolicy.for_training("bf16", ddp_bucket_buffers=True, fp32_weights=True).bucket_bytes == 4.0
    assert StatePolicy.for_training("bf16", 1, 8, ddp_bucket_buffers=True).bucket_bytes == 0.0
    assert StatePolicy.for_training("fp32").bucket_bytes == 0.0
