"""Golden IR text for the frontend and every pass, on a 2-layer GPT and Llama."""

from __future__ import annotations

import pytest
from conftest import check_golden

from echosim.ir import Graph, print_graph, verify
from echosim.passes.attention import AttentionKernel
from echosim.passes.autodiff import Autodiff
from echosim.passes.base import run_passes
from echosim.passes.data_parallel import DataParallel, Optimizer
from echosim.passes.pipeline import PipelineParallel
from echosim.passes.recompute import Recompute
from echosim.passes.tensor_parallel import TensorParallel


def test_capture_gpt(tiny_gpt: Graph) -> None:
    verify(tiny_gpt)
    check_golden("capture_gpt.txt", print_graph(tiny_gpt))


def test_capture_llama(tiny_llama: Graph) -> None:
    verify(tiny_llama)
    check_golden("capture_llama.txt", print_graph(tiny_llama))


@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_tensor_parallel(arch: str, tiny_gpt: Graph, tiny_llama: Graph) -> None:
    g = run_passes(tiny_gpt if arch == "gpt" else tiny_llama, [TensorParallel(2)])
    check_golden(f"tp2_{arch}.txt", print_graph(g))


def test_autodiff(tiny_gpt: Graph) -> None:
    check_golden("autodiff_gpt.txt", print_graph(run_passes(tiny_gpt, [Autodiff()])))


def test_autodiff_after_tp(tiny_llama: Graph) -> None:
    check_golden("tp2_autodiff_llama.txt", print_graph(run_passes(tiny_llama, [TensorParallel(2), Autodiff()])))


def test_recompute_full(tiny_gpt: Graph) -> None:
    check_golden("recompute_full_gpt.txt", print_graph(run_passes(tiny_gpt, [Autodiff(), Recompute("full")])))


def test_recompute_selective_math_attention(tiny_gpt: Graph) -> None:
    g = run_passes(tiny_gpt, [AttentionKernel(flash=False), Autodiff(), Recompute("selective")])
    check_golden("recompute_selective_gpt.txt", print_graph(g))


def test_pipeline_stages(tiny_gpt: Graph) -> None:
    joint = run_passes(tiny_gpt, [Autodiff()])
    stages = PipelineParallel(2).split(joint)
    assert [s.layers for s in stages] == [1, 1]
    for s in stages:
        verify(s.graph)
    check_golden("pp2_stage0_gpt.txt", print_graph(stages[0].graph))
    check_golden("pp2_stage1_gpt.txt", print_graph(stages[1].graph))


def test_data_parallel_and_optimizer(tiny_llama: Graph) -> None:
    g = run_passes(tiny_llama, [Autodiff(), DataParallel(4), Optimizer()])
    check_golden("dp4_opt_llama.txt", print_graph(g))


def test_zero1_and_fsdp(tiny_llama: Graph) -> None:
    g1 = run_passes(tiny_llama, [Autodiff(), DataParallel(4, zero=1), Optimizer(shard=4)])
    check_golden("zero1_llama.txt", print_graph(g1))
    g3 = run_passes(tiny_llama, [Autodiff(), DataParallel(4, zero=3), Optimizer(shard=4)])
    check_golden("fsdp_llama.txt", print_graph(g3))


def test_fp8_linears(tiny_llama: Graph) -> None:
    from echosim.passes.precision import Fp8Linears

    g = run_passes(tiny_llama, [Autodiff(), Fp8Linears()])
    check_golden("fp8_llama.txt", print_graph(g))
    text = print_graph(g)
    assert "lm_head" in text and "m=16 n=128 k=64}" in text  # the output layer stays 16-bit


def test_fp8_linears_gather_the_quantised_shard_under_sequence_parallelism(tiny_llama: Graph) -> None:
    """Transformer Engine casts the local shard and all-gathers fp8: the gather moves half the bytes and
    the cast reads 1/tp of the activation; gathers that feed anything but a linear stay 16-bit."""
    from echosim.ir.ops import Axis, CollectiveAttrs, ElementwiseAttrs, MatmulAttrs, OpKind
    from echosim.ir.types import DType
    from echosim.passes.precision import Fp8Linears

    base = run_passes(tiny_llama, [TensorParallel(2, sequence_parallel=True), Autodiff()])
    fp8 = run_passes(base, [Fp8Linears()])
    verify(fp8)

    def gathers(g: Graph) -> list:
        return [n for n in g if n.op is OpKind.ALL_GATHER and isinstance(n.attrs, CollectiveAttrs)
                and n.attrs.axis is Axis.TP]  # fmt: skip

    quantised = [n for n in gathers(fp8) if n.out.dtype is DType.FP8]
    assert quantised, "no sequence-parallel gather moved fp8"
    before = {n.id: n for n in gathers(base)}
    for n in quantised:
        assert n.attrs.bytes * 2 == before[n.id].attrs.bytes
        cast = fp8[n.inputs[0]]
        assert isinstance(cast.attrs, ElementwiseAttrs) and cast.attrs.fn.endswith("_cast")
        assert cast.out.numel * 2 == n.out.numel  # the local shard of tp=2
        readers = [fp8[u] for u in fp8.users(n.id)]
        assert readers and all(isinstance(r.attrs, MatmulAttrs) and r.attrs.precision == "fp8" for r in readers)
    assert sum(n.attrs.bytes for n in gathers(fp8)) < sum(n.attrs.bytes for n in gathers(base))


def test_fp8_linears_gather_the_quantised_output_gradient_of_row_parallel_linears(tiny_llama: Graph) -> None:
    """Backward gathers a row-parallel linear's output gradient for its dgrad and wgrad; Transformer Engine
    quantises the local shard first (grad_output_preprocess), so that gather moves fp8 bytes too."""
    from echosim.ir.ops import Axis, CollectiveAttrs, ElementwiseAttrs, MatmulAttrs, OpKind, Phase
    from echosim.ir.types import DType
    from echosim.passes.precision import Fp8Linears

    base = run_passes(tiny_llama, [TensorParallel(2, sequence_parallel=True), Autodiff()])
    fp8 = run_passes(base, [Fp8Linears()])
    verify(fp8)
    backward = [n for n in fp8 if n.op is OpKind.ALL_GATHER and isinstance(n.attrs, CollectiveAttrs)
                and n.attrs.axis is Axis.TP and n.phase is Phase.BACKWARD and n.name.endswith(".grad.all_gather")
                and n.scope.endswith("_proj")]  # fmt: skip
    assert len(backward) == 2, "the gradient gathers of o_proj and down_proj"
    for n in backward:
        readers = [fp8[u] for u in fp8.users(n.id)]
        assert {r.attrs.grad_of for r in readers if isinstance(r.attrs, MatmulAttrs)} == {"dgrad", "wgrad"}
        assert n.out.dtype is DType.FP8 and n.attrs.bytes * 2 == base[n.id].attrs.bytes
        cast = fp8[n.inputs[0]]
        assert isinstance(cast.attrs, ElementwiseAttrs) and cast.out.numel * 2 == n.out.numel  # the local shard


def test_fp8_linears_take_the_bias_gradient_from_the_local_shard(tiny_gpt: Graph) -> None:
    """A biased row-parallel linear (GPT's proj and fc2) still gathers its output gradient in fp8; its bias
    gradient sums the local 16-bit shard, before the cast and the gather."""
    from echosim.ir.ops import ElementwiseAttrs, OpKind
    from echosim.ir.types import DType
    from echosim.passes.precision import Fp8Linears

    base = run_passes(tiny_gpt, [TensorParallel(2, sequence_parallel=True), Autodiff()])
    fp8 = run_passes(base, [Fp8Linears()])
    verify(fp8)
    gathers = [n for n in fp8 if n.op is OpKind.ALL_GATHER and n.name.endswith("tp_rs.grad.all_gather")
               and "layers" in n.scope]  # fmt: skip
    assert gathers and all(n.out.dtype is DType.FP8 for n in gathers)
    for n in gathers:
        local = fp8[n.inputs[0]].inputs[0]  # the cast's input: the 16-bit shard
        bgrads = [m for m in fp8 if isinstance(m.attrs, ElementwiseAttrs) and m.attrs.fn == "bias_grad"
                  and m.scope == n.scope]  # fmt: skip
        assert len(bgrads) == 1 and bgrads[0].inputs == (local,)
        assert fp8[local].out.dtype is not DType.FP8 and fp8[local].out.numel * 2 == n.out.numel


def test_fsdp_reduce_dtype_fp32_doubles_the_reduce_scatter(tiny_llama: Graph) -> None:
    """Composer's 'DEFAULT' FSDP mixed precision reduce-scatters fp32 gradients: twice the 16-bit gathers."""
    from echosim.ir.ops import OpKind
    from echosim.ir.types import DType

    def bytes_of(g: Graph, kind: OpKind) -> dict[str, int]:
        return {n.scope: n.attrs.bytes for n in g if n.op is kind and n.name.startswith("fsdp.")}

    plain = run_passes(tiny_llama, [Autodiff(), DataParallel(4, zero=3)])
    fp32 = run_passes(tiny_llama, [Autodiff(), DataParallel(4, zero=3, fsdp_reduce_dtype=DType.FP32)])
    rs16, rs32 = bytes_of(plain, OpKind.REDUCE_SCATTER), bytes_of(fp32, OpKind.REDUCE_SCATTER)
    assert rs16 and rs32.keys() == rs16.keys()
    assert all(rs32[k] == 2 * rs16[k] for k in rs16)
    assert bytes_of(fp32, OpKind.ALL_GATHER) == bytes_of(plain, OpKind.ALL_GATHER)
    assert {n.out.dtype for n in fp32 if n.name.startswith("fsdp.grad_reduce_scatter")} == {DType.FP32}
