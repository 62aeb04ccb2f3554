"""PyTorch DDP's reducer copies (``gradient_as_bucket_view=False``) in eager data-parallel steps."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import pytest

from echosim.backends import cpu
from echosim.compiler import lower
from echosim.frameworks import FRAMEWORKS
from echosim.frontend.zoo_torch import TorchZooModel, dlrm_module, dlrm_params
from echosim.ir.ops import CollectiveAttrs, OpKind, Role
from echosim.ir.types import DType
from echosim.passes.data_parallel import bucket_copy_bytes
from echosim.plan import Cluster, Plan

ROWS, POOL, DIM = (20000,) * 8, (4,) * 8, 32


def _dlrm() -> TorchZooModel:
    """The small DLRM of benchmarks/cpu_reality_nonllm.py: 8 dense tables of 20,000 x 32."""
    return TorchZooModel(
        "dlrm-ddp-test",
        partial(dlrm_module, ROWS, POOL, DIM, 13, (64, 32), (128, 64, 1), 2, 32),
        ((("batch", 13), "float32"), (("batch", sum(POOL)), "int64")),
        "8 tables of 20,000 x 32",
        "queries",
    )


def _compile(framework: str = "eager", zero: int = 0, backend: str = "cpu-x86", dp: int = 2) -> object:
    plan = Plan(dp=dp, micro_batch=256, global_batch=256 * dp, dtype="fp32", framework=framework, zero=zero)
    return lower(_dlrm(), plan, Cluster(backend, dp, 2 if backend.startswith("cpu") else 8))


def _grad_sync(compiled: object) -> list:
    g = compiled.stages[0].graph  # type: ignore[attr-defined]
    return [n for n in g if isinstance(n.attrs, CollectiveAttrs) and n.attrs.role is Role.GRAD_SYNC]


def test_bucket_copies_move_four_passes_over_every_gradient() -> None:
    """Closed form: mul_out(bucket, grad, 1/world) reads and writes every fp32 gradient, and
    grad.copy_(bucket) does it again: 2 x 2 x 4 bytes per parameter, tables included (dense grads)."""
    tables, dense = dlrm_params(ROWS, DIM, 13, (64, 32), (128, 64, 1), 2, 32)
    nodes = _grad_sync(_compile())
    assert nodes and all(n.attrs.bucket_copy and n.op is OpKind.ALL_REDUCE for n in nodes)
    into = sum(bucket_copy_bytes(n)[0] for n in nodes)
    back = sum(bucket_copy_bytes(n)[1] for n in nodes)
    assert into == back == 2 * 4 * (tables + dense)
    assert into == 2 * sum(n.attrs.bytes for n in nodes)


def test_bucket_copies_cost_one_kernel_per_gradient_at_the_stream_rate() -> None:
    spec = replace(cpu.CPU_X86, stream_fraction=0.1, op_overhead_us=3.0)
    compiled = _compile()
    graph = compiled.stages[0].graph  # type: ignore[attr-defined]
    from echosim.timeline.lower import Coster

    coster = Coster(graph, cpu.CPUBackend(spec), {})
    numels = [graph[p].out.numel for p in graph.grads]
    # each gradient: one mul_out into the bucket and one copy back, 2 x 4 bytes per element each, the 4 bytes
    # written out of place (a write-allocate read of each line beyond the cache: 3 x 4 bytes of DRAM traffic)
    expected = 2 * sum(cpu.memory_bound_time_s(spec, 2 * 4 * n, written=4 * n) for n in numels)
    got = sum(sum(coster.bucket_copies(n)) for n in _grad_sync(compiled))
    assert got == pytest.approx(expected)
    assert expected > 2 * 12 * sum(numels) / (spec.ddr_GBps * 1e9 * spec.stream_fraction)  # plus 3 us a kernel


def test_the_copies_lengthen_the_step_and_show_as_a_tail_task() -> None:
    eager, plain = _compile(), _compile("deepspeed")  # DeepSpeed: zero 0, no DDP reducer
    assert not any(n.attrs.bucket_copy for n in _grad_sync(plain))
    tasks = [t for t in eager.costed.tails if t.task == "dp_copies"]  # type: ignore[attr-defined]
    assert len(tasks) == 1 and tasks[0].category == "compute.memory_bound" and tasks[0].duration > 0
    # the DLRM's gradients are all outside a repeated block: its buckets are reduced after the backward, so the
    # copies add whole. DDP's constructor also broadcasts the parameters in one 20.8 MB buffer, which raises
    # glibc's mmap threshold above the 2.56 MB table gradients: their fills come from the heap (DeepSpeed
    # broadcasts parameter by parameter), which the backward saves whole too. DDP's reducer splits the
    # gradients in two buckets (1 MiB, then 25 MiB: tests/test_ddp_buckets.py) where DeepSpeed reduces one
    table = ROWS[0] * DIM * 4
    heap = len(ROWS) * (cpu.fresh_fill_time_s(cpu.CPU_X86, table) - cpu.memory_bound_time_s(cpu.CPU_X86, table))
    assert [len(_grad_sync(c)) for c in (eager, plain)] == [2, 1]
    buckets = eager.report.breakdown["comm.dp"] - plain.report.breakdown["comm.dp"]  # type: ignore[attr-defined]
    assert eager.report.step_time_s == pytest.approx(  # type: ignore[attr-defined]
        plain.report.step_time_s + tasks[0].duration - heap + buckets  # type: ignore[attr-defined]
    )
    memory_bound = eager.report.breakdown["compute.memory_bound"]  # type: ignore[attr-defined]
    assert memory_bound == pytest.approx(plain.report.breakdown["compute.memory_bound"] + tasks[0].duration - heap)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "framework, zero",
    [("megatron", 0), ("eager", 1), ("eager", 3), ("composer", 0), ("jax-xla", 0), ("nemo-megatron-vit", 0)],
)
def test_no_copies_without_the_ddp_reducer(framework: str, zero: int) -> None:
    assert not any(n.attrs.bucket_copy for n in _grad_sync(_compile(framework, zero)))
    assert not FRAMEWORKS["composer"].ddp_bucket_copies and FRAMEWORKS["eager"].ddp_bucket_copies


def test_no_copies_under_torchrec_sharding_nor_on_xla() -> None:
    """TorchRec's DDP wrapper sets gradient_as_bucket_view=True; XLA compiles the reduction into the step."""
    plan = Plan(dp=2, micro_batch=256, global_batch=512, dtype="fp32", embedding_sharding="table")
    sharded = lower(_dlrm(), plan, Cluster("cpu-x86", 2, 2))
    assert _grad_sync(sharded) and not any(n.attrs.bucket_copy for n in _grad_sync(sharded))
    tpu = lower(_dlrm(), replace(plan, embedding_sharding="none"), Cluster("tpu-v5e", 2, 2))
    assert _grad_sync(tpu) and not any(n.attrs.bucket_copy for n in _grad_sync(tpu))


def test_gpu_eager_data_parallel_pays_the_copies_at_hbm_rate() -> None:
    compiled = _compile(backend="a100-80gb")
    tasks = [t for t in compiled.costed.tails if t.task == "dp_copies"]  # type: ignore[attr-defined]
    tables, dense = dlrm_params(ROWS, DIM, 13, (64, 32), (128, 64, 1), 2, 32)
    # 16 bytes a parameter through A100 80GB's 2.039 TB/s HBM: no faster than the peak allows
    assert tasks and tasks[0].duration >= 16 * (tables + dense) / 2.039e12


def test_a_repeated_blocks_copies_count_once_per_layer() -> None:
    """A folded stage holds one copy of the repeated block: DDP copies every layer's gradients into
    their buckets and back (its buckets span layers, each a gradient of the block once per layer), so the
    tail's copies are one mul_out and one copy per gradient, the block's x the layer count."""
    from echosim.timeline.lower import Coster

    plan = Plan(dp=2, micro_batch=1, global_batch=2, seq_len=128, dtype="fp32", framework="eager")
    compiled = lower("gpt3-125m", plan, Cluster("cpu-x86", 2, 2))
    stage = compiled.stages[0]  # type: ignore[attr-defined]
    graph = stage.graph
    coster = Coster(graph, cpu.CPUBackend(cpu.CPU_X86), {})  # the copies read no placement
    nodes = _grad_sync(compiled)
    assert len(nodes) > 1 and stage.layers > 1
    expected = sum(
        (coster._copy_s("mul", graph[p].out.numel, DType.FP32) + coster._copy_s("copy", graph[p].out.numel, DType.FP32))
        * graph.multiplicity(graph[p])
        for p in graph.grads
    )
    tasks = [t for t in compiled.costed.tails if t.task == "dp_copies"]  # type: ignore[attr-defined]
    assert len(tasks) == 1 and tasks[0].duration == pytest.approx(expected)


@pytest.mark.parametrize(
    "degrees",
    [{"tp": 2}, {"pp": 2}, {"cp": 2}],
)
def test_a_split_eager_layout_stands_for_megatron_cores_ddp_and_copies_nothing(degrees: dict[str, int]) -> None:
    """Plain PyTorch has no tensor, pipeline or context parallelism of its own: a split eager layout stands for
    Megatron-Core's DDP, whose param.main_grad is a view into its gradient buffer (param_and_grad_buffer.py), so
    its gradient reductions copy nothing, as its buckets are per layer and not the reducer's. The same model
    over pure data parallelism keeps PyTorch DDP's reducer and its copies."""
    from echosim.frontend.zoo import ArchConfig

    llama = ArchConfig("llama", layers=4, hidden=256, heads=4, kv_heads=2, ffn=688, vocab=4096, seq_len=256)

    def compiled(**split: int) -> object:
        plan = Plan(dp=2, micro_batch=4, global_batch=8 * 2, dtype="bf16", attention="flash", framework="eager",
                    **split)  # type: ignore[arg-type]  # fmt: skip
        devices = 2 * split.get("tp", 1) * split.get("pp", 1) * split.get("cp", 1)
        return lower(llama.with_(dropout=0.0), plan, Cluster("a100-80gb", devices, 8))

    whole, split = compiled(), compiled(**degrees)
    assert _grad_sync(whole) and all(n.attrs.bucket_copy for n in _grad_sync(whole))
    assert [t for t in whole.costed.tails if t.task == "dp_copies"]  # type: ignore[attr-defined]
    for stage in split.stages:  # type: ignore[attr-defined]
        syncs = [n for n in stage.graph if isinstance(n.attrs, CollectiveAttrs) and n.attrs.role is Role.GRAD_SYNC]
        assert syncs and not any(n.attrs.bucket_copy or n.attrs.ready >= 0 for n in syncs)
    assert not [t for t in split.costed.tails if t.task == "dp_copies"]  # type: ignore[attr-defined]
    assert split.facts.state.bucket_bytes == 0.0  # type: ignore[attr-defined]
