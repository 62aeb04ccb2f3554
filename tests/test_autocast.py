"""torch.autocast over fp32 parameters (framework ``eager-amp``): the dtypes autocast gives each op and its casts."""

from __future__ import annotations

from functools import cache

import pytest

from echosim.compiler import lower
from echosim.frameworks import FRAMEWORKS, get_framework
from echosim.ir.graph import Graph, Node
from echosim.ir.ops import Axis, CollectiveAttrs, ElementwiseAttrs, NormAttrs, OpKind, OptimizerAttrs, Phase
from echosim.ir.types import DType, TensorSpec
from echosim.passes.autocast import CAST, Autocast
from echosim.passes.data_parallel import ADAM_FP32_BYTES_PER_PARAM
from echosim.passes.flops import io_bytes
from echosim.plan import Cluster, Plan

BATCH = 2
TOKENS = (224 // 16) ** 2 + 1  # ViT-B/16: 196 patches and the class token
HIDDEN = 768


@cache
def _vit(framework: str) -> Graph:
    plan = Plan(micro_batch=BATCH, global_batch=BATCH, dtype="bf16", framework=framework)
    return lower("vit-b16-pretrain", plan, Cluster(backend="h200", devices=1)).graph


def _layer0(g: Graph, phase: Phase = Phase.FORWARD) -> list[Node]:
    return [n for n in g if n.phase is phase and n.scope.startswith("layers.0")]


def _casts(g: Graph) -> list[Node]:
    return [n for n in g if isinstance(n.attrs, ElementwiseAttrs) and n.attrs.fn in (CAST, f"{CAST}_grad", "grad_cast")]


def test_only_eager_amp_runs_autocast() -> None:
    """Frameworks that keep 16-bit parameters (Megatron, NeMo, torchtitan's FSDP2 param_dtype, Composer's FSDP
    mixed precision, MaxText) run the model in the plan's dtype: no autocast, no casts."""
    assert [name for name, f in FRAMEWORKS.items() if f.autocast] == ["eager-amp"]
    g = _vit("eager")
    floats = {n.out.dtype for n in g if n.phase is not Phase.OPTIMIZER and n.op is not OpKind.INPUT}
    assert floats - {DType.INT64, DType.INT32, DType.BOOL} == {DType.BF16}
    assert not _casts(g)


def test_autocast_runs_linears_in_bf16_and_layer_norm_and_the_residual_stream_in_fp32() -> None:
    g = _vit("eager-amp")
    layer = _layer0(g)
    by_kind: dict[str, set[DType]] = {}
    for n in layer:
        kind = n.op.value if not isinstance(n.attrs, ElementwiseAttrs) else n.attrs.fn
        by_kind.setdefault(kind, set()).add(n.out.dtype)
    assert by_kind["parameter"] == {DType.FP32}  # parameters stay fp32
    assert by_kind["matmul"] == {DType.BF16} and by_kind["attention"] == {DType.BF16}  # lower-precision list
    assert by_kind["norm"] == {DType.FP32}  # layer_norm: float32 list
    assert by_kind["add"] == {DType.FP32}  # fp32 residual + bf16 branch promotes to fp32
    assert by_kind["gelu"] == {DType.BF16} and by_kind["dropout"] == {DType.BF16}  # the input's dtype
    for n in layer:  # every float input of a linear is bf16 (cast before it)
        if n.op is OpKind.MATMUL:
            assert {g[i].out.dtype for i in n.inputs} == {DType.BF16}


def test_each_parameter_is_cast_once_per_forward_and_each_activation_per_consumer() -> None:
    g = _vit("eager-amp")
    forward = [n for n in _casts(g) if n.phase is Phase.FORWARD]
    params = [n for n in forward if g[n.inputs[0]].op is OpKind.PARAMETER]
    sources = [n.inputs[0] for n in params]
    assert len(sources) == len(set(sources))  # autocast's cache: one cast per parameter per forward
    # every parameter of a linear or the patch conv is cast (layer norms' weights are not: fp32 op)
    linear_params = {i for n in g if n.op is OpKind.MATMUL and n.phase is Phase.FORWARD for i in n.inputs}
    assert set(sources) == {i for i in linear_params if g[i].op is OpKind.PARAMETER} | set(sources)
    assert all(g[i].op is not OpKind.PARAMETER for n in g if n.op is OpKind.MATMUL for i in n.inputs)
    norms = {n.id for n in _layer0(g) if isinstance(n.attrs, NormAttrs)}
    # each LN output cast once per linear it feeds (a non-leaf tensor is not cached): flax's separate q, k, v
    # projections after the first (zoo vit-b16-pretrain), the MLP's first linear after the second
    assert sum(1 for n in forward if n.inputs[0] in norms) == 4


def test_a_cast_moves_four_bytes_in_and_two_out_per_element() -> None:
    """fp32 -> bf16: the copy kernel reads the fp32 value and writes its bf16 copy (closed form)."""
    g = _vit("eager-amp")
    cast = next(n for n in _casts(g) if n.name == "norm1.to_bf16")  # one per projection it feeds
    elements = BATCH * TOKENS * HIDDEN
    assert cast.out.numel == elements and cast.out.dtype is DType.BF16
    assert io_bytes(g, cast) == elements * (4 + 2)
    norm = g[cast.inputs[0]]
    assert io_bytes(g, norm) == elements * (4 + 4) + 2 * HIDDEN * 4  # fp32 in, fp32 out, fp32 weight and bias


def test_backward_casts_gradients_back_to_their_inputs_dtypes() -> None:
    g = _vit("eager-amp")
    back = _layer0(g, Phase.BACKWARD)
    # each linear's weight gradient (bf16 GEMM) is cast to fp32 for the parameter's .grad
    wgrads = [n for n in back if n.name.endswith(".weight.to_bf16.grad")]
    assert len(wgrads) == 6 and all(n.out.dtype is DType.FP32 for n in wgrads)  # q, k, v, o, fc1, fc2
    assert all(g[grad].out.dtype is DType.FP32 for grad in g.grads.values())
    # the residual's fp32 gradient is cast to bf16 before each branch's dropout backward (autograd engine)
    grad_casts = [n for n in back if isinstance(n.attrs, ElementwiseAttrs) and n.attrs.fn == "grad_cast"]
    assert len(grad_casts) == 2 and all(n.out.dtype is DType.BF16 for n in grad_casts)
    # layer norm's backward runs on fp32
    assert {n.out.dtype for n in back if n.op is OpKind.NORM} == {DType.FP32}


def test_autocast_steps_fp32_parameters_with_no_master_copy() -> None:
    plan = Plan(micro_batch=BATCH, global_batch=BATCH, dtype="bf16", framework="eager-amp")
    stage = lower("vit-b16-pretrain", plan, Cluster(backend="h200", devices=1)).stages[0].graph
    (step,) = [n for n in stage if n.op is OpKind.OPTIMIZER_UPDATE]  # the optimizer is a stage-level pass
    assert isinstance(step.attrs, OptimizerAttrs)
    assert step.attrs.bytes_per_param == ADAM_FP32_BYTES_PER_PARAM


def test_batch_norm_keeps_its_inputs_dtype_under_autocast() -> None:
    """batch_norm is on neither autocast list: cuDNN takes fp16 activations with fp32 weights."""
    plan = Plan(micro_batch=BATCH, global_batch=BATCH, dtype="fp16", framework="eager-amp")
    g = lower("resnet50", plan, Cluster(backend="a100-80gb", devices=1)).graph
    norms = [n for n in g if n.op is OpKind.NORM and n.phase is Phase.FORWARD]
    assert norms and {n.out.dtype for n in norms} == {DType.FP16}
    assert {g[i].out.dtype for n in norms for i in n.inputs[1:]} == {DType.FP32}


def test_autocast_costs_more_than_pure_bf16_by_its_casts_and_fp32_stream() -> None:
    plan = Plan(micro_batch=64, global_batch=64, dtype="bf16")
    pure = lower("vit-b16", plan, Cluster(backend="h200", devices=1)).report.step_time_s
    amp = lower("vit-b16", Plan(**{**plan.as_dict(), "framework": "eager-amp"}), Cluster(backend="h200", devices=1))
    assert amp.report.step_time_s > pure * 1.1
    assert get_framework("eager-amp").fp32_weights


@pytest.mark.parametrize("dtype", ["fp32", "fp8"])
def test_autocast_applies_to_16_bit_autocast_dtypes_only(dtype: str) -> None:
    from echosim.passes.plugin import _autocast

    assert _autocast(Plan(dtype=dtype, framework="eager-amp")) is None
    assert _autocast(Plan(dtype="bf16", framework="eager-amp")) is not None


def test_a_collective_of_an_fp32_value_moves_fp32_bytes() -> None:
    """A value autocast leaves in fp32 (the residual stream) is gathered in fp32: the collective's bytes follow."""
    g = Graph("sp")
    x = g.add(OpKind.INPUT, (), TensorSpec((4, 8), DType.BF16))
    spec = TensorSpec((8, 8), DType.BF16)
    gather = g.add(OpKind.ALL_GATHER, [x], spec, CollectiveAttrs(Axis.TP, 2, spec.nbytes))
    g.outputs = [gather]
    out = Autocast().run(g)[gather]
    assert out.out.dtype is DType.FP32
    assert isinstance(out.attrs, CollectiveAttrs) and out.attrs.bytes == 8 * 8 * 4
