"""FSDP1's FlatParameter gradient path (Composer, llm-foundry): flatten, cast, pre-divide, then reduce-scatter."""

from __future__ import annotations

from dataclasses import replace

import pytest

from echosim.compiler import lower
from echosim.frameworks import FRAMEWORKS, get_framework
from echosim.ir.graph import Graph
from echosim.ir.ops import OpKind
from echosim.ir.types import DType
from echosim.passes.autodiff import Autodiff
from echosim.passes.base import run_passes
from echosim.passes.data_parallel import DataParallel
from echosim.passes.flops import io_bytes
from echosim.passes.plugin import _data_parallel
from echosim.plan import Cluster, Plan


def _flat(g: Graph) -> dict[str, list]:
    out: dict[str, list] = {}
    for n in g:
        if n.name.startswith(("fsdp.grad_cat", "fsdp.grad_cast", "fsdp.grad_div")):
            out.setdefault(n.scope, []).append(n)
    return out


@pytest.mark.parametrize("reduce_dtype, per_param", [(DType.FP32, 4 + 6 + 8), (None, 4 + 4)])
def test_each_unit_moves_its_gradient_through_three_kernels(
    tiny_llama: Graph, reduce_dtype: DType | None, per_param: int
) -> None:
    """Closed form for 16-bit gradients: the concatenation reads and writes 2 + 2 bytes a parameter, the cast to
    fp32 2 + 4 (none when the reduce dtype is the gradients'), the in-place division 2 x the reduce dtype's."""
    g = run_passes(tiny_llama, [Autodiff(), DataParallel(4, zero=3, fsdp_reduce_dtype=reduce_dtype, flat_grads=True)])
    flat = _flat(g)
    scatters = {n.scope: n for n in g if n.op is OpKind.REDUCE_SCATTER}
    assert flat and flat.keys() == scatters.keys()
    for scope, nodes in flat.items():
        numel = nodes[0].out.numel
        assert sum(g[i].out.numel for i in nodes[0].inputs) == numel  # every gradient of the unit, once
        assert {g[i].out.dtype for i in nodes[0].inputs} == {DType.FP16}  # the fixture's 16 bits
        assert sum(io_bytes(g, n) for n in nodes) == per_param * numel
        assert scatters[scope].inputs == (nodes[-1].id,)  # the reduce-scatter reads the divided flat gradient
        assert scatters[scope].attrs.bytes == numel * nodes[-1].out.dtype.itemsize
    plain = run_passes(tiny_llama, [Autodiff(), DataParallel(4, zero=3, fsdp_reduce_dtype=reduce_dtype)])
    assert not _flat(plain)


def test_composer_runs_it_for_shard_grad_op_and_full_shard_only() -> None:
    assert "SplitWithSizesBackward" in get_framework("composer").fsdp_flat_grads
    assert get_framework("composer-triton").fsdp_flat_grads == get_framework("composer").fsdp_flat_grads
    for zero, expected in ((0, False), (1, False), (2, True), (3, True)):
        assert _data_parallel(Plan(dp=8, zero=zero, framework="composer")).flat_grads is expected
    for other in ("eager", "torchtitan", "deepspeed-2021", "megatron"):
        assert not _data_parallel(Plan(dp=8, zero=3, framework=other)).flat_grads


def _step(framework: str, zero: int = 3) -> object:
    plan = Plan(dp=8, micro_batch=2, global_batch=16, seq_len=1024, zero=zero, framework=framework, dtype="bf16")
    return lower("llama3-8b", plan, Cluster("h100-sxm", 8, 8))


@pytest.mark.parametrize("zero", [2, 3])
def test_the_kernels_lengthen_the_backward_by_their_bytes_at_the_stream_rate(zero: int) -> None:
    """Without the rule (the same framework entry, ``fsdp_flat_grads`` blank) the step is faster by about the
    kernels' bytes at the device's achievable HBM bandwidth: they run beside no communication that hides them."""
    FRAMEWORKS["composer-no-flat"] = replace(FRAMEWORKS["composer"], name="composer-no-flat", fsdp_flat_grads="")
    try:
        with_rule, without = _step("composer", zero), _step("composer-no-flat", zero)
    finally:
        del FRAMEWORKS["composer-no-flat"]
    g = with_rule.stages[0].graph  # type: ignore[attr-defined]
    flat = [n for nodes in _flat(g).values() for n in nodes]
    assert flat and not _flat(without.stages[0].graph)  # type: ignore[attr-defined]
    moved = sum(io_bytes(g, n) * g.multiplicity(n) for n in flat)
    params = with_rule.report.params  # type: ignore[attr-defined]
    assert moved == pytest.approx(18 * params, rel=0.01)  # bf16 gradients, fp32 reduction: 4 + 6 + 8 bytes
    extra = with_rule.report.step_time_s - without.report.step_time_s  # type: ignore[attr-defined]
    assert extra == pytest.approx(moved / 2984e9, rel=0.25)  # H100's achievable STREAM bandwidth


def test_fsdp2_copies_out_every_gather_and_copies_the_gradients_in(tiny_llama: Graph) -> None:
    """FSDP2 (torchtitan): split_with_sizes_copy after each all-gather reads and writes the gathered 16-bit weights
    (2 + 2 bytes a parameter, forward and backward), chunk_cat writes the gradients into the fp32 reduce-scatter
    input (2 + 4 bytes); no flattening, no division."""
    g = run_passes(tiny_llama, [Autodiff(), DataParallel(4, zero=3, fsdp_reduce_dtype=DType.FP32, fsdp2_copies=True)])
    assert not _flat(g)
    gathers = [n for n in g if n.op is OpKind.ALL_GATHER]
    outs = [n for n in g if n.name.startswith("fsdp.param_copy_out")]
    ins = {n.scope: n for n in g if n.name.startswith("fsdp.grad_copy_in")}
    assert len(outs) == len(gathers) == 2 * len(ins) > 0
    for n in outs:
        (gathered,) = n.inputs
        assert g[gathered].op is OpKind.ALL_GATHER and g[gathered].phase is n.phase
        assert io_bytes(g, n) == 2 * g[gathered].out.nbytes
    for n in g:
        if n.op is OpKind.REDUCE_SCATTER:
            copy_in = ins[n.scope]
            assert n.inputs == (copy_in.id,) and copy_in.out.dtype is DType.FP32
            assert io_bytes(g, copy_in) == (2 + 4) * copy_in.out.numel


def test_torchtitan_reduces_in_fp32_and_copies_except_under_a_pipeline() -> None:
    for name in ("torchtitan", "torchtitan-compile", "torchtitan-2025", "torchtitan-2025-compile"):
        fw = get_framework(name)
        assert "mixed_precision_reduce" in fw.fsdp_reduce_fp32 and "split_with_sizes_copy" in fw.fsdp2_copies
        dp = _data_parallel(Plan(dp=8, zero=3, framework=name))
        assert dp.fsdp2_copies and not dp.flat_grads and dp.fsdp_reduce_dtype is DType.FP32
        # under a pipeline FSDP2 gathers and reduces once a step (Framework.pp_unsharded): no per-micro-batch copies
        assert not _data_parallel(Plan(dp=8, pp=2, zero=3, framework=name)).fsdp2_copies
    assert not _data_parallel(Plan(dp=8, zero=3, framework="composer")).fsdp2_copies
