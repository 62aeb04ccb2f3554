"""glibc's dynamic mmap threshold on the CPU backend: which per-step fills come from fresh pages.

Closed forms from mallopt(3) / malloc.c (DEFAULT_MMAP_THRESHOLD_MIN 128 KiB, DEFAULT_MMAP_THRESHOLD_MAX
32 MiB on 64-bit, the threshold raised to a freed mapped chunk's size) and PyTorch DDP's 250 MiB
parameter-broadcast buffers; the small DLRM and LSTM of benchmarks/cpu_reality_nonllm.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from echosim.backends.base import for_program, program_dependent
from echosim.backends.cpu import (
    CHUNK_OVERHEAD_BYTES,
    CPU_X86,
    DDP_BROADCAST_BUCKET_BYTES,
    MMAP_THRESHOLD_BYTES,
    MMAP_THRESHOLD_MAX_BYTES,
    PAGE_BYTES,
    CPUBackend,
    ddp_broadcast_buckets,
    fresh_fill_time_s,
    mapped_chunk_bytes,
    memory_bound_time_s,
    mmap_threshold_bytes,
    step_mmap_threshold_bytes,
)
from echosim.backends.loading import GuardedBackend
from echosim.compiler import lower, prepare
from echosim.ir.ops import EmbeddingAttrs, OpKind, Phase
from echosim.plan import Cluster, Plan

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from cpu_reality_nonllm import MODELS

MiB = 2**20


def test_glibc_constants() -> None:
    assert MMAP_THRESHOLD_BYTES == 128 * 1024
    assert MMAP_THRESHOLD_MAX_BYTES == 4 * 1024 * 1024 * 8  # sizeof(long) on 64-bit: 32 MiB
    assert DDP_BROADCAST_BUCKET_BYTES // MiB == 250


def test_mapped_chunk_is_the_request_and_header_in_whole_pages() -> None:
    assert mapped_chunk_bytes(PAGE_BYTES - CHUNK_OVERHEAD_BYTES) == PAGE_BYTES
    assert mapped_chunk_bytes(PAGE_BYTES - CHUNK_OVERHEAD_BYTES + 1) == 2 * PAGE_BYTES
    assert mapped_chunk_bytes(2_560_000) == 626 * PAGE_BYTES  # 2,560,072 B: 625.02 pages


def test_threshold_rises_to_the_largest_freed_mapped_block_up_to_32_MiB() -> None:
    assert mmap_threshold_bytes([]) == MMAP_THRESHOLD_BYTES
    assert mmap_threshold_bytes([64 * 1024, 100_000]) == MMAP_THRESHOLD_BYTES  # heap-fed: no change
    assert mmap_threshold_bytes([1_000_000]) == 245 * PAGE_BYTES  # 1,000,072 B: 244.2 pages
    assert mmap_threshold_bytes([40 * MiB]) == MMAP_THRESHOLD_BYTES  # above the maximum: mapped every time
    assert mmap_threshold_bytes([1_000_000, 40 * MiB, 2_560_000, 300_000]) == 626 * PAGE_BYTES
    # the last block whose chunk still fits under the maximum, and the first that does not
    fits = MMAP_THRESHOLD_MAX_BYTES - CHUNK_OVERHEAD_BYTES
    assert mmap_threshold_bytes([fits]) == MMAP_THRESHOLD_MAX_BYTES
    assert mmap_threshold_bytes([fits + 1]) == MMAP_THRESHOLD_BYTES


def test_a_block_the_size_of_the_freed_one_comes_from_the_heap() -> None:
    threshold = mmap_threshold_bytes([2_560_000])
    heap = memory_bound_time_s(CPU_X86, 2_560_000)
    assert fresh_fill_time_s(CPU_X86, 2_560_000, threshold) == heap
    fresh = 2_560_000 / (CPU_X86.fresh_memory_GBps * 1e9) + CPU_X86.op_overhead_us * 1e-6
    assert fresh_fill_time_s(CPU_X86, 2_560_000) == pytest.approx(fresh)  # the initial 128 KiB threshold
    assert fresh_fill_time_s(CPU_X86, threshold, threshold) == pytest.approx(threshold / 10e9 + 5e-6)


def test_ddp_broadcast_buffers_close_once_they_reach_the_limit() -> None:
    assert ddp_broadcast_buckets([100, 200], 250) == [300]
    assert ddp_broadcast_buckets([100, 100, 100, 10], 150) == [200, 110]
    assert ddp_broadcast_buckets([300, 10], 250) == [300, 10]
    assert ddp_broadcast_buckets([]) == []
    assert ddp_broadcast_buckets([20_000_000, 822_916]) == [20_822_916]


def _stage(name: str, dp: int):  # type: ignore[no-untyped-def]
    model, batch, seq = MODELS[name]
    plan = Plan(dp=dp, micro_batch=batch, global_batch=dp * batch, seq_len=seq, dtype="fp32")
    return model, plan, prepare(model, plan, Cluster("cpu-x86", dp, 2)).stages[0].graph


@pytest.mark.parametrize(
    ("name", "dp", "largest_freed"),
    [
        # the DLRM's largest tensor freed before its first optimizer step: the 256 x 288 interaction input
        ("dlrm-small", 1, 256 * 288 * 4),
        # under DDP its parameters (8 tables of 20,000 x 32 and the MLPs: 20,822,916 B) broadcast in one buffer
        ("dlrm-small", 2, 20_822_916),
        # the LSTM's logits (16 x 20 x 2,000) and their gradient
        ("lstm-small", 1, 16 * 20 * 2000 * 4),
        ("lstm-small", 2, 8_314_688),
    ],
)
def test_step_threshold_of_the_small_models(name: str, dp: int, largest_freed: int) -> None:
    _, _, graph = _stage(name, dp)
    assert step_mmap_threshold_bytes(graph) == mapped_chunk_bytes(largest_freed)


def _table_backwards(graph):  # type: ignore[no-untyped-def]
    return [
        n for n in graph if isinstance(n.attrs, EmbeddingAttrs) and not n.attrs.sparse and n.phase is Phase.BACKWARD
    ]


def test_dlrm_table_gradients_fault_in_one_process_and_come_from_the_heap_under_ddp() -> None:
    """Measured: ~2,500-4,700 faults a step in one process, 11-59 under DDP (cpu_gloo_ddp_heap.json)."""
    backend = CPUBackend(CPU_X86)
    for dp, fresh in ((1, True), (2, False)):
        _, _, graph = _stage("dlrm-small", dp)
        priced = backend.for_program(graph)
        tables = _table_backwards(graph)
        assert len(tables) == 8
        node = tables[0]
        table = node.out.nbytes
        assert table == 20_000 * 32 * 4
        threshold = mapped_chunk_bytes(256 * 288 * 4 if fresh else 20_822_916)
        assert priced.mmap_threshold == threshold
        io = table + 1024 * (32 * 4 + 8)  # the gradient, the output gradient's rows and the ids
        saved = backend.memory_cost_s(node, io) - priced.memory_cost_s(node, io)
        expect = 0.0 if fresh else fresh_fill_time_s(CPU_X86, table) - memory_bound_time_s(CPU_X86, table)
        assert saved == pytest.approx(expect, abs=1e-15)


def test_one_object_per_threshold_and_wrappers_kept() -> None:
    backend = CPUBackend(CPU_X86)
    _, _, dlrm2 = _stage("dlrm-small", 2)
    _, _, lstm1 = _stage("lstm-small", 1)
    a, b = backend.for_program(dlrm2), backend.for_program(lstm1)
    assert a is backend.for_program(dlrm2) and a is not b
    assert (a.mmap_threshold, b.mmap_threshold) == (mapped_chunk_bytes(20_822_916), mapped_chunk_bytes(2_560_000))
    guarded = GuardedBackend(backend, "cpu-x86", "echosim")
    variant = for_program(guarded, dlrm2)
    assert isinstance(variant, GuardedBackend) and variant.inner is a and variant is for_program(guarded, dlrm2)
    assert program_dependent(guarded)


def test_gpu_backends_are_not_program_dependent() -> None:
    from echosim.backends.loading import load_backend

    h100 = load_backend("h100-sxm")
    assert not program_dependent(h100)
    _, _, graph = _stage("lstm-small", 1)
    assert for_program(h100, graph) is h100


def test_lstm_ops_drop_exactly_their_two_fresh_fills() -> None:
    """Over the LSTM's whole program the rule takes off exactly the fresh-page price of the embedding gradient
    (2,000 x 256) and the cross-entropy gradient (16 x 20 x 2,000) over their streaming price; the step too."""
    from echosim.passes.flops import io_bytes

    model, plan, graph = _stage("lstm-small", 1)
    before = CPUBackend(CPU_X86)  # the initial 128 KiB threshold: the rule before
    after = before.for_program(graph)
    ops = [n for n in graph if n.op not in (OpKind.VIEW, OpKind.INPUT, OpKind.PARAMETER) and not n.op.is_collective]
    saved = sum(before.op_time_s(n, io_bytes(graph, n)) - after.op_time_s(n, io_bytes(graph, n)) for n in ops)
    fills = (2000 * 256 * 4, 16 * 20 * 2000 * 4)
    delta = sum(fresh_fill_time_s(CPU_X86, n) - memory_bound_time_s(CPU_X86, n) for n in fills)
    assert saved == pytest.approx(delta, rel=1e-9)
    step = lower(model, plan, Cluster("cpu-x86", 1, 2)).report.step_time_s
    total = sum(after.op_time_s(n, io_bytes(graph, n)) for n in ops)
    assert step == pytest.approx(total, rel=0.02)  # one process, one stream: the step is its ops


def test_search_falls_back_to_whole_stages_on_the_cpu() -> None:
    """The search's fast evaluator derives deep stages from depths 2 and 3; a CPU stage's threshold depends on
    the whole stage (its parameter broadcast grows with depth), so CPU layouts take the full lowering."""
    from echosim.backends.loading import load_backend

    assert program_dependent(load_backend("cpu-x86"))


def test_a_calibrated_backend_keeps_its_measurements_for_each_program(tmp_path: Path) -> None:
    from echosim.calibrate.db import CalibratedBackend, CalibrationDB, matmul_key

    db = CalibrationDB(tmp_path / "cal.sqlite")
    db.put("cpu-x86", "matmul", matmul_key(64, 64, 64), "fp32", 1e-3, "test")
    calibrated = CalibratedBackend(CPUBackend(CPU_X86), db)
    _, _, graph = _stage("dlrm-small", 2)
    variant = for_program(calibrated, graph)
    assert isinstance(variant, CalibratedBackend) and variant is for_program(calibrated, graph)
    assert variant.inner.mmap_threshold == mapped_chunk_bytes(20_822_916)
    assert variant._table is calibrated._table and variant._outside is calibrated._outside
