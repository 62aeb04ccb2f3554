"""torchtitan's eager RMSNorm: the Llama reference module run op by op, against one fused kernel."""

from __future__ import annotations

from dataclasses import fields

import pytest
from conftest import SHARED

from echosim.backends.devices import DEVICES
from echosim.backends.gpu import GPUBackend
from echosim.frameworks import get_framework
from echosim.ir.graph import Graph
from echosim.ir.ops import REFERENCE_RMSNORM, NormAttrs, OpKind, Phase
from echosim.ir.types import DType, TensorSpec
from echosim.passes.attention import AttentionKernel
from echosim.passes.flops import io_bytes


def _norm(reference: bool, phase: Phase = Phase.FORWARD) -> tuple[Graph, int]:
    g = Graph("norm")
    x = g.add(OpKind.INPUT, [], TensorSpec((2, 8192, 4096), DType.BF16))
    w = g.add(OpKind.PARAMETER, [], TensorSpec((4096,), DType.BF16))
    return g, g.add(OpKind.NORM, [x, w], TensorSpec((2, 8192, 4096), DType.BF16), NormAttrs("rmsnorm", reference),
                    phase=phase)  # fmt: skip


def test_reference_rmsnorm_moves_nine_times_the_bytes_forward() -> None:
    elements = 2 * 8192 * 4096
    g, n = _norm(True)
    assert io_bytes(g, g[n]) == elements * (4 * 2 + 28) == 36 * elements
    g, n = _norm(True, Phase.BACKWARD)
    assert io_bytes(g, g[n]) == elements * (4 * 2 + 76)
    g, n = _norm(False)
    assert io_bytes(g, g[n]) == 2 * 2 * elements + 2 * 4096  # fused: x in, y out, the weight
    assert REFERENCE_RMSNORM == {False: (4, 28, 8), True: (4, 76, 13)}


def test_reference_rmsnorm_pays_each_kernels_launch_gap() -> None:
    h100 = DEVICES["h100-96gb"]
    backend = GPUBackend(h100)
    g, n = _norm(True)
    node = g[n]
    seconds = backend.op_time_s(node, io_bytes(g, node))
    assert seconds == pytest.approx(36 * 2 * 8192 * 4096 / (h100.hbm_stream_GBps * 1e9) + 8 * 4e-6)


def test_the_pass_marks_rmsnorms_only_and_can_undo_it() -> None:
    g, n = _norm(False)
    layer = g.add(OpKind.NORM, [g[n].inputs[0]], g[n].out, NormAttrs("layernorm"))
    marked = AttentionKernel(reference_norms=True).run(g)
    assert marked[n].attrs.reference and not marked[layer].attrs.reference
    assert not AttentionKernel().run(marked)[n].attrs.reference


def test_torchtitan_eager_runs_the_reference_norm_and_compile_fuses_it() -> None:
    eager, compiled = get_framework("torchtitan-2025"), get_framework("torchtitan-2025-compile")
    assert eager.norm_kernels == "reference" and "9dec370" in eager.norm_source
    assert compiled.norm_kernels == "" and compiled.row_names == ()
    # compiled_collectives: torch.compile also waits on the ring attention's collectives where they are issued
    differ = {"name", "title", "row_names", "norm_kernels", "norm_source", "compiled_collectives"}
    same = {f.name for f in fields(eager)} - differ
    assert all(getattr(eager, f) == getattr(compiled, f) for f in same)  # memory rules and kernels alike
    assert not eager.compiled_collectives and "fullgraph=True" in compiled.compiled_collectives
    assert all(get_framework(n).norm_kernels == "" for n in ("torchtitan", "nemo", "megatron", "eager"))


@pytest.mark.skipif(not (SHARED / "validation" / "cases.csv").exists(), reason="shared/validation not present")
def test_torchtitan_rows_take_eager_or_compile_from_their_notes() -> None:
    """The 2024-12 table: FSDP alone 5762 tokens/s/GPU, with torch.compile 6667 (2.84 s and 2.46 s a step);
    the reference norm puts 0.30 s of the measured 0.39 s between the two predictions."""
    from echosim.compiler import compile as compile_model
    from echosim.validation.cases import read_cases
    from echosim.validation.rows import row_framework, row_model, row_plan

    cases = {c.case_id: c for c in read_cases(SHARED / "validation" / "cases.csv")}
    eager = cases["torchtitan2412-t1-llama-3p1-8b-bf16-h100-96gb-8"]
    compiled = cases["torchtitan2412-t1-llama-3p1-8b-compile-bf16-h100-96gb-8"]
    assert (row_framework(eager), row_framework(compiled)) == ("torchtitan-2025", "torchtitan-2025-compile")
    # commit e7c0cae descends from bbb1b61: its --training.compile compiles the loss too
    assert row_framework(cases["torchtitan-h200-llama-3p1-8b-fp8-32"]) == "torchtitan-2025-compile-loss"
    steps = [compile_model(row_model(c), *row_plan(c)).step_time_s for c in (eager, compiled)]
    assert steps[0] - steps[1] == pytest.approx(0.30, abs=0.02)
