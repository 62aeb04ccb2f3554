"""llm-foundry's attn_impl 'flash': q, k and v are gathered into flash-attn's varlen layout and the output
scattered back (bert_padding), copy kernels each way that the Triton path and PyTorch's SDPA do not run."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import SHARED

from echosim.backends.compute import attention_time_s, fa1_slowdown, memory_bound_time_s, pad_copies_time_s
from echosim.backends.devices import get_device
from echosim.frameworks import FRAMEWORKS, get_framework
from echosim.ir.graph import Graph
from echosim.ir.ops import VARLEN_PAD_COPIES, AttentionAttrs, OpKind
from echosim.ir.types import DType, TensorSpec
from echosim.passes.attention import AttentionKernel

CASES = SHARED / "validation" / "cases.csv"


def test_copies_count_each_gather_and_scatter_once_per_element() -> None:
    # MHA, q = k = v = b * h * s * d elements: forward 3 gathers (read + write) and pad_input (zeros, then
    # read + write) = 9 q; backward 3 x (zeros + scatter_) and pad_input's indexed read = 11 q
    a = AttentionAttrs(12, 16, 16, 2048, 2048, 128, kernel="fa2", padded=True)
    q = 12 * 16 * 2048 * 128
    assert a.pad_copy_elements(backward=False) == (9 * q, 5)
    assert a.pad_copy_elements(backward=True) == (11 * q, 7)
    # grouped-query attention: k and v are gathered at their own (smaller) size
    gqa = AttentionAttrs(2, 32, 8, 4096, 4096, 128, kernel="fa2", padded=True)
    q, kv = 2 * 32 * 4096 * 128, 2 * 8 * 4096 * 128
    assert gqa.pad_copy_elements(False) == (5 * q + 4 * kv, 5)
    assert gqa.pad_copy_elements(True) == (5 * q + 6 * kv, 7)
    assert VARLEN_PAD_COPIES == {False: (5, 4, 5), True: (5, 6, 7)}
    # nothing without the flag, nor on the math path (no varlen kernel there)
    assert AttentionAttrs(12, 16, 16, 2048, 2048, 128).pad_copy_elements(True) == (0, 0)
    assert AttentionAttrs(12, 16, 16, 2048, 2048, 128, flash=False, padded=True).pad_copy_elements(True) == (0, 0)


@pytest.mark.parametrize("backward", [False, True])
def test_the_copies_are_streaming_kernels_added_to_the_flash_kernel(backward: bool) -> None:
    h100 = get_device("h100-sxm")
    plain = AttentionAttrs(12, 16, 16, 2048, 2048, 128, kernel="fa2")
    padded = AttentionAttrs(12, 16, 16, 2048, 2048, 128, kernel="fa2", padded=True)
    elements, kernels = padded.pad_copy_elements(backward)
    extra = attention_time_s(h100, padded, "bf16", backward) - attention_time_s(h100, plain, "bf16", backward)
    assert extra == pytest.approx(memory_bound_time_s(h100, 2 * elements, kernels), rel=1e-12)
    assert pad_copies_time_s(h100, plain, "bf16", backward) == 0.0
    # the 1B model's layer at micro-batch 12: 0.30 ms forward, 0.36 ms backward at H100's STREAM rate
    assert extra == pytest.approx((11 if backward else 9) * 12 * 2048 * 2048 * 2 / (h100.hbm_stream_GBps * 1e9)
                                  + kernels * h100.kernel_overhead_us * 1e-6)  # fmt: skip


def test_only_llm_foundrys_flash_path_unpads() -> None:
    flash, triton = get_framework("composer"), get_framework("composer-triton")
    assert "index_first_axis" in flash.attention_unpad and "5e85bd6" in flash.attention_unpad
    assert triton.attention_unpad == ""
    assert [f.name for f in FRAMEWORKS.values() if f.attention_unpad] == ["composer", "composer-fa1"]


def test_the_pass_marks_flash_attention_padded_and_can_undo_it() -> None:
    g = Graph("attn")
    q = g.add(OpKind.INPUT, [], TensorSpec((2, 16, 2048, 128), DType.BF16))
    spec = TensorSpec((2, 16, 2048, 128), DType.BF16)
    n = g.add(OpKind.ATTENTION, [q, q, q], spec, AttentionAttrs(2, 16, 16, 2048, 2048, 128))
    marked = AttentionKernel(True, "fa2", padded=True).run(g)
    assert marked[n].attrs.padded and marked[n].attrs.kernel == "fa2"
    assert "padded" in str(marked[n].attrs)
    assert not AttentionKernel(True, "fa2").run(marked)[n].attrs.padded
    assert not AttentionKernel(False, "fa2", padded=True).run(g)[n].attrs.padded  # math path: no varlen call


@pytest.mark.slow
@pytest.mark.skipif(not CASES.exists(), reason="shared/validation not present")
def test_flash_rows_pay_the_copies_and_triton_rows_do_not() -> None:
    """The 1B large-scale row (24 layers, micro-batch 12, no recompute): 24 x (9 + 11) x 12 x 2048 x 2048
    x 2 bytes = 24 GB at STREAM bandwidth, 17 ms of the step."""
    from echosim.compiler import compile as compile_model
    from echosim.validation.cases import read_cases
    from echosim.validation.rows import row_framework, row_model, row_plan

    cases = {c.case_id: c for c in read_cases(CASES)}
    flash = cases["llmfoundry-mpt-1b-bf16-h100-sxm-128"]
    assert row_framework(flash) == "composer-fa1"  # flash-attn 1.0.9 (rows.llm_foundry_flash_v1)
    assert row_framework(cases["llmfoundry-mpt-13b-bf16-h100-sxm-128"]) == "composer-triton"
    plan, cluster = row_plan(flash)
    h100 = get_device("h100-sxm")
    copies = 24 * (20 * 12 * 2048 * 2048 * 2 / (h100.hbm_stream_GBps * 1e9) + 12 * h100.kernel_overhead_us * 1e-6)
    # FlashAttention v1 pays the same copies around its kernel, priced at FA1's H100 rate (108 TFLOP/s at 2k, where
    # echosim's FA2 runs 242)
    fa1 = compile_model(row_model(flash), plan, cluster)
    assert fa1.breakdown["compute.attention"] == pytest.approx(
        0.0702 * fa1_slowdown("hopper", 128, 2048) + copies, abs=5e-4
    )
    assert fa1_slowdown("hopper", 128, 2048) == pytest.approx(242 / 108, rel=0.01)
    # the same row on flash-attn 2 (framework composer)
    plan = replace(plan, framework="composer")
    report = compile_model(row_model(flash), plan, cluster)
    assert report.breakdown["compute.attention"] == pytest.approx(0.0702 + copies, abs=5e-4)
    # 0.4329 s before FSDP1's flat-gradient kernels (18 bytes a parameter, 7.9 ms: tests/test_fsdp_flat_grads.py);
    # 0.4408 s with HEURISTIC_GEMM_FRACTION 0.91 (fitted while Azure's cuBLASLt FP8 rows were priced promoted);
    # 0.4470 s before each GEMM's last wave paid its output store (compute.exposed_epilogue_s)
    assert report.step_time_s == pytest.approx(0.4476 + copies, abs=5e-4)
