"""Convolution activation layout: cuDNN's NCHW<->NHWC transposes around tensor-core convolutions."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
from torch import nn

from echosim.backends.compute import matmul_time_s, memory_bound_time_s
from echosim.backends.devices import DEVICES
from echosim.backends.gpu import GPUBackend
from echosim.compiler import lower
from echosim.frontend.pyfile import capture_torch_module
from echosim.frontend.spec import CaptureSpec
from echosim.ir.ops import MatmulAttrs, OpKind, Phase
from echosim.passes.autodiff import Autodiff
from echosim.plan import Cluster, Plan
from echosim.plugins import hookimpl
from echosim.plugins.manager import load_registry

A100 = DEVICES["a100-80gb"]


def _two_convs() -> nn.Module:
    return nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 1), nn.Flatten())


def test_conv_products_carry_their_activation_elements_forward_and_backward() -> None:
    spec = CaptureSpec(micro_batch=4)
    with torch.device("meta"):
        module = _two_convs()
    graph, _, _ = capture_torch_module(module, [(("batch", 8, 32, 32), torch.float32)], spec, "two-convs")
    graph = Autodiff().run(graph)
    first = 4 * 8 * 32 * 32 + 4 * 16 * 16 * 16  # x in, y out of the stride-2 3x3 conv
    second = 4 * 16 * 16 * 16 + 4 * 32 * 16 * 16
    products = [n for n in graph if n.op is OpKind.MATMUL]
    assert products, "the convolutions were not captured as products"
    forward = sorted(n.attrs.conv_io for n in products if n.phase is Phase.FORWARD)
    assert forward == sorted([first, second])
    backward = [n.attrs for n in products if n.phase is Phase.BACKWARD]
    # dgrad moves dy and dx, wgrad x and dy: the same tensors' sizes as the forward product
    assert sorted((a.grad_of, a.conv_io) for a in backward) == sorted(
        [("wgrad", first), ("dgrad", second), ("wgrad", second)]  # the input needs no dgrad
    )


def test_nchw_adds_the_transposes_on_tensor_cores_only() -> None:
    conv = MatmulAttrs(m=256 * 56 * 56, n=64, k=64, conv_io=2 * 256 * 64 * 56 * 56)
    gemm = MatmulAttrs(m=256 * 56 * 56, n=64, k=64)
    nhwc, nchw = GPUBackend(A100), GPUBackend(A100, conv_layout="nchw")
    base = matmul_time_s(A100, conv.m, conv.n, conv.k, 1, "fp32", False, False)
    assert nhwc.matmul_cost_s(conv, "fp32") == base
    # each activation read and written once, one kernel per transposed tensor; fp32 = 4 bytes, fp16 = 2
    assert nchw.matmul_cost_s(conv, "fp32") == pytest.approx(
        base + memory_bound_time_s(A100, 2 * conv.conv_io * 4, kernels=2)
    )
    half = matmul_time_s(A100, conv.m, conv.n, conv.k, 1, "fp16", False, False)
    assert nchw.matmul_cost_s(conv, "fp16") == pytest.approx(
        half + memory_bound_time_s(A100, 2 * conv.conv_io * 2, kernels=2)
    )
    assert nchw.matmul_cost_s(gemm, "fp32") == nhwc.matmul_cost_s(gemm, "fp32")  # a GEMM is no convolution
    simt = GPUBackend(A100, allow_tf32=False, conv_layout="nchw")  # FP32 pipes: cuDNN's native NCHW
    assert simt.matmul_cost_s(conv, "fp32-simt") == GPUBackend(A100, allow_tf32=False).matmul_cost_s(conv, "fp32-simt")


def test_conv_layout_setting_is_checked_and_kept_by_variant() -> None:
    with pytest.raises(ValueError, match=r"conv_layout 'nwch': unknown \(known: nhwc, nchw\)"):
        GPUBackend(A100, conv_layout="nwch")
    assert GPUBackend(A100).variant(conv_layout="nchw").conv_layout == "nchw"
    assert GPUBackend(A100, conv_layout="nchw").variant(allow_tf32=False).conv_layout == "nchw"
    assert GPUBackend(A100, conv_layout="nchw").describe()["conv_layout"] == "nchw"


class _Nchw:
    @hookimpl
    def register_backends(self, register: object) -> None:
        register("a100-80gb-nchw", partial(GPUBackend, A100, conv_layout="nchw"))  # type: ignore[operator]


def test_resnet50_step_pays_the_transposes_of_every_convolution() -> None:
    registry = load_registry(extra_plugins=[_Nchw()])
    plan = Plan(micro_batch=8, dtype="fp32")
    nhwc = lower("resnet50", plan, Cluster(backend="a100-80gb", devices=1), registry)
    nchw = lower("resnet50", plan, Cluster(backend="a100-80gb-nchw", devices=1), registry)
    products = [n for n in nchw.graph if n.op is OpKind.MATMUL and n.attrs.conv_io]
    assert len(products) == 53 * 3 - 1  # 53 convolutions, each forward, dgrad and wgrad; the stem needs no dgrad
    extra = sum(memory_bound_time_s(A100, 2 * n.attrs.conv_io * 4, kernels=2) for n in products)
    step = nchw.report.breakdown["compute.matmul"] - nhwc.report.breakdown["compute.matmul"]
    assert step == pytest.approx(extra, rel=1e-9)
    assert math.isclose(
        nchw.report.breakdown["compute.memory_bound"], nhwc.report.breakdown["compute.memory_bound"], rel_tol=1e-12
    )
