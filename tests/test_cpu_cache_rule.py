"""The CPU backend's cache regime and write-allocate rule, PyTorch's CPU cross-entropy backward, and the calibration's
cache eviction (benchmarks/cpu_breakdown.py measures them against a real training step)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import cpu_llama_stage_graph

from echosim.backends import cpu
from echosim.calibrate import bench
from echosim.ir.ops import OpKind, Phase
from echosim.passes.flops import io_bytes

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
    return cpu_llama_stage_graph(4, hidden=128, ffn=344, vocab=4096, seq_len=128)


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


def test_writes_beyond_the_cache_pay_a_write_allocate_read_in_place_ones_do_not() -> None:
    # out of place: a 8 MiB copy (4 read, 4 written) moves 12 MiB of DRAM traffic
    assert cpu.memory_bound_time_s(SPEC, 8 * MiB, written=4 * MiB) == pytest.approx(12 * MiB / 10e9 + 1e-6)
    # in place (x.add_(y): 8 read, 4 written over x): its 12 MiB, no more
    assert cpu.memory_bound_time_s(SPEC, 12 * MiB, written=4 * MiB, inplace=True) == pytest.approx(
        12 * MiB / 10e9 + 1e-6
    )
    # in place, only the distinct bytes need the cache: 3 MiB moved over 2 MiB of lines
    assert cpu.memory_bound_time_s(SPEC, 3 * MiB, written=MiB, inplace=True) == pytest.approx(3 * MiB / 60e9 + 1e-6)
    # within the cache the writes cost nothing extra
    assert cpu.memory_bound_time_s(SPEC, MiB, written=MiB // 2) == cpu.memory_bound_time_s(SPEC, MiB)
    with pytest.raises(ValueError, match="non-negative"):
        cpu.memory_bound_time_s(SPEC, MiB, written=-1)


def test_optimizer_steps_and_gradient_sums_write_in_place_other_kernels_out_of_place() -> None:
    g = _llama_graph()
    opt = next(n for n in g if n.op is OpKind.OPTIMIZER_UPDATE)
    acc = next(n for n in g if n.name.endswith(".grad_acc"))
    mul = next(n for n in g if n.op is OpKind.ELEMENTWISE and not n.name.endswith(".grad_acc"))
    assert cpu.is_inplace(opt) and cpu.is_inplace(acc) and not cpu.is_inplace(mul)
    backend = cpu.CPUBackend(replace(SPEC, cache_bytes=0.0))
    io = 10 * MiB
    assert backend.op_time_s(opt, io) == pytest.approx(io / 10e9 + 1e-6)
    assert backend.op_time_s(mul, io) == pytest.approx((io + mul.out.nbytes) / 10e9 + 1e-6)


def test_calibration_counts_the_write_allocate_traffic_of_its_samples() -> None:
    from echosim.calibrate import fit

    copy = bench.Sample("memory", "copy", "fp32", nbytes=8 * MiB, seconds=1e-3)
    add_ = bench.Sample("memory", "add_", "fp32", nbytes=12 * MiB, seconds=1e-3)
    assert fit.sample_writes(copy) == (4 * MiB, False) and fit.dram_traffic(copy) == 12 * MiB
    assert fit.sample_writes(add_) == (4 * MiB, True) and fit.dram_traffic(add_) == 12 * MiB
    # the model predicts a sample with the same writes
    assert fit.predict_cpu(SPEC, copy) == pytest.approx(12 * MiB / 10e9 + 1e-6)
    assert fit.predict_cpu(SPEC, add_) == pytest.approx(12 * MiB / 10e9 + 1e-6)


def test_the_dram_peak_comes_from_samples_that_do_not_fit_in_the_cache() -> None:
    from echosim.calibrate import fit

    l2 = bench.cache_bytes(2)
    # an in-place add of 1.5 x L2 touches only L2's worth of lines: warm, it must not set the DRAM peak
    warm = bench.Sample("memory", "add_", "fp32", nbytes=3 * l2 // 2, seconds=3 * l2 / 2 / 90e9)
    cold = bench.Sample("memory", "copy", "fp32", nbytes=8 * l2, seconds=8 * l2 / 12e9)
    assert fit.resident_bytes(warm) == l2 and fit.resident_bytes(cold) == 8 * l2
    spec, _ = fit.cpu_identity_spec(cpu.CPU_X86, [warm, cold], threads=1, ranks=1)
    assert spec.ddr_GBps == pytest.approx(12 * 1.5)  # the copy's traffic, its write-allocate read counted
