"""The CPU backend's cache regime, PyTorch's CPU cross-entropy backward, and the calibration's
cache eviction (benchmarks/cpu_breakdown.py measures them against a real training step)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from echosim.backends import cpu
from echosim.calibrate import bench
from echosim.compiler import lower
from echosim.frontend.zoo import ArchConfig
from echosim.ir.ops import OpKind, Phase
from echosim.passes.flops import io_bytes
from echosim.plan import Cluster, Plan

MiB = 2**20
SPEC = replace(
    cpu.CPU_X86,
    ddr_GBps=20.0,
    stream_fraction=0.5,  # 10 GB/s from DRAM
    math_fraction=0.4,  # vector math at most 4 GB/s
    cache_bytes=2 * MiB,
    cache_GBps=60.0,
    op_overhead_us=1.0,
    fresh_memory_GBps=2.5,
)


def test_streaming_ops_that_fit_in_cache_run_at_the_cache_rate_larger_ones_at_dram_rate() -> None:
    assert cpu.memory_bound_time_s(SPEC, MiB) == pytest.approx(MiB / 60e9 + 1e-6)
    assert cpu.memory_bound_time_s(SPEC, 2 * MiB) == pytest.approx(2 * MiB / 60e9 + 1e-6)
    assert cpu.memory_bound_time_s(SPEC, 2 * MiB + 1) == pytest.approx((2 * MiB + 1) / 10e9 + 1e-6)
    # vector math: a roofline, never faster than its out-of-cache arithmetic rate
    assert cpu.memory_bound_time_s(SPEC, MiB, vector_math=True) == pytest.approx(MiB / 4e9 + 1e-6)
    assert cpu.memory_bound_time_s(SPEC, 8 * MiB, vector_math=True) == pytest.approx(8 * MiB / 4e9 + 1e-6)


def test_without_a_cache_size_the_shipped_model_is_unchanged() -> None:
    base = replace(SPEC, cache_bytes=0.0)
    assert cpu.CPU_X86.cache_bytes == 0.0
    assert cpu.memory_bound_time_s(base, MiB) == pytest.approx(MiB / 10e9 + 1e-6)
    assert cpu.memory_bound_time_s(base, MiB, vector_math=True) == pytest.approx(MiB / 4e9 + 1e-6)
    with pytest.raises(ValueError, match="cache_bytes"):
        replace(SPEC, cache_bytes=-1.0)


def _llama_graph() -> object:
    cfg = ArchConfig("llama", layers=2, hidden=128, heads=4, kv_heads=2, ffn=344, vocab=4096, seq_len=128)
    plan = Plan(micro_batch=4, global_batch=4, dtype="fp32", attention="flash")
    return lower(cfg, plan, Cluster("cpu-x86", 1, 2)).stages[0].graph


def test_cpu_cross_entropy_backward_fills_a_fresh_logits_sized_gradient() -> None:
    g = _llama_graph()
    backend = cpu.CPUBackend(SPEC)
    ce = next(n for n in g if n.op is OpKind.CROSS_ENTROPY and n.phase is Phase.BACKWARD)
    logits = 4 * 128 * 4096 * 4
    assert ce.out.nbytes == logits
    io = io_bytes(g, ce)
    expected = logits / 2.5e9 + 1e-6 + (2 * io - logits) / 4e9 + 1e-6  # zeros fresh, then log_softmax backward
    assert backend.op_time_s(ce, io) == pytest.approx(expected)


def test_cache_sizes_parse_sysfs_text() -> None:
    assert bench._size_bytes("491520K\n") == 491520 * 1024
    assert bench._size_bytes("2M") == 2 * MiB
    assert bench._size_bytes("512") == 512
    assert bench.cache_bytes(2) > 0 and bench.cache_bytes() >= bench.cache_bytes(2)


def test_eviction_runs_before_every_timed_call_outside_the_timing() -> None:
    calls: list[str] = []
    bench.time_fn(lambda: calls.append("fn"), 3, warmup=1, before=lambda: calls.append("evict"))
    assert calls == ["fn", "evict", "fn", "evict", "fn", "evict", "fn"]
    evictor = bench.CacheEvictor(4 * MiB)
    assert evictor.nbytes == 4 * MiB
    evictor()
    assert float(evictor._buffer[0]) == 1.0
