"""Convolutions, resampling, pooling and the vision activations in every frontend (issue 15: CNNs).

A convolution is one implicit GEMM (echosim.frontend.conv.conv_matmul) whether torch.export, torch.fx or an ONNX
file brings it; transposed convolutions (a decoder's upsampling) are GEMMs too, with the FLOPs PyTorch's counter
gives them. Ops that are truly memory-bound (resampling, pooling, pixel shuffles, relu6) have rules, so that a
vision model captures without "no rule" warnings.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from onnx import TensorProto, helper
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from echosim.frontend import CaptureSpec
from echosim.frontend import onnx as onnx_frontend
from echosim.frontend.aten import capture_export
from echosim.frontend.conv import conv_matmul
from echosim.frontend.fx import capture_module
from echosim.ir.ops import MatmulAttrs, OpKind
from echosim.ir.types import DType


class Decoder(nn.Module):
    """A small U-Net-like block: plain, grouped, depthwise, transposed and 1-D/3-D convolutions."""

    def __init__(self) -> None:
        super().__init__()
        self.down = nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.act = nn.ReLU6()
        self.pool = nn.MaxPool2d(2)
        self.group = nn.Conv2d(16, 32, 3, padding=1, groups=4)
        self.norm = nn.GroupNorm(4, 32)
        self.depthwise = nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.up = nn.ConvTranspose2d(32, 8, 4, stride=2, padding=1, groups=2)
        self.inorm = nn.InstanceNorm2d(8, affine=True)
        self.head = nn.AdaptiveAvgPool2d(1)
        self.flat = nn.Flatten()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pool(self.act(self.bn(self.down(x))))
        y = self.depthwise(self.norm(self.group(y)))
        return self.fc(self.flat(self.head(self.inorm(self.up(y)))))


def capture_exported(model: nn.Module, args: tuple[torch.Tensor, ...], dtype: DType) -> object:
    return capture_export(model, model, args, dtype=dtype, name="m")


def _matmuls(graph: object) -> list[MatmulAttrs]:
    return [n.attrs for n in graph if n.op is OpKind.MATMUL]  # type: ignore[attr-defined]


def test_conv_matmul_is_the_implicit_gemm() -> None:
    x, out = (2, 16, 8, 8), (2, 32, 8, 8)
    assert conv_matmul(x, (32, 4, 3, 3), out, groups=4) == MatmulAttrs(
        m=2 * 64, n=8, k=4 * 9, batch=4, conv_io=2 * 16 * 64 + 2 * 32 * 64
    )
    # transposed: each of the 2 x 8 x 8 input pixels' 16 / 2 channels times a (8 x 4 * kernel) weight
    up = conv_matmul(x, (16, 4, 4, 4), (2, 8, 16, 16), groups=2, transposed=True)
    assert (up.m, up.n, up.k, up.batch) == (2 * 64, 4, 8 * 16, 2)


def test_export_and_fx_capture_the_same_convolutions_with_pytorchs_flops() -> None:
    with torch.device("meta"):
        model = Decoder()
        x = torch.zeros(2, 3, 32, 32)
    exported = capture_exported(model, (x,), dtype=DType.FP32)
    traced = capture_module(model, (x,), dtype=DType.FP32)
    assert _matmuls(exported.graph) == _matmuls(traced.graph)
    assert [a.conv_io > 0 for a in _matmuls(traced.graph)] == [True] * 4 + [False]
    assert not [w for w in exported.warnings + traced.warnings if "no rule" in w]
    with FlopCounterMode(display=False) as counter:
        model(x)
    assert sum(a.flops for a in _matmuls(traced.graph)) == counter.get_total_flops()
    kinds = {n.name: n.op for n in traced.graph}
    assert kinds["pool"] is OpKind.REDUCTION and kinds["head"] is OpKind.REDUCTION
    assert kinds["bn"] is kinds["norm"] is kinds["inorm"] is OpKind.NORM


def test_resampling_pooling_and_vision_activations_have_rules() -> None:
    import torch.nn.functional as F

    class Ops(nn.Module):
        def forward(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
            y = F.relu6(x) + F.selu(x) + F.celu(x) + F.hardshrink(x) + F.threshold(x, 0.1, 0.0)
            y = F.interpolate(y, scale_factor=2, mode="bilinear") + F.interpolate(y, scale_factor=2, mode="nearest")
            y = F.pixel_shuffle(y, 2)
            y = F.adaptive_max_pool2d(y, 4) + F.avg_pool2d(y, 8)
            z = F.interpolate(F.max_pool3d(s, 2) + F.avg_pool3d(s, 2), scale_factor=2, mode="trilinear")
            return y.mean() + z.mean() + F.adaptive_avg_pool3d(s, 2).mean() + F.instance_norm(x).mean()

    with torch.device("meta"):
        x, s = torch.zeros(2, 8, 8, 8), torch.zeros(1, 2, 8, 8, 8)
    capture = capture_exported(Ops(), (x, s), dtype=DType.FP32)
    assert not [w for w in capture.warnings if "no rule" in w]
    fns = {n.attrs.fn: n.op for n in capture.graph if hasattr(n.attrs, "fn")}
    assert fns["upsample_bilinear2d"] is OpKind.ELEMENTWISE and fns["upsample_trilinear3d"] is OpKind.ELEMENTWISE
    assert fns["adaptive_max_pool2d"] is OpKind.REDUCTION and fns["max_pool3d"] is OpKind.REDUCTION
    flops = {n.attrs.fn: n.attrs.flops_per_element for n in capture.graph if hasattr(n.attrs, "fn")}
    assert (flops["upsample_nearest2d"], flops["upsample_bilinear2d"], flops["upsample_trilinear3d"]) == (0, 8, 16)


def _onnx_conv(tmp_path: Path) -> Path:
    w = helper.make_tensor("W", TensorProto.FLOAT, [16, 4, 3, 3], [0.0] * (16 * 4 * 9))
    wt = helper.make_tensor("WT", TensorProto.FLOAT, [16, 4, 2, 2], [0.0] * (16 * 4 * 4))
    nodes = [
        helper.make_node("Conv", ["x", "W"], ["y"], pads=[1, 1, 1, 1], group=2),
        helper.make_node("ConvTranspose", ["y", "WT"], ["z"], strides=[2, 2], group=4),
    ]
    graph = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 10, 10])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        initializer=[w, wt],
    )
    path = tmp_path / "conv.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return path


def test_an_onnx_convolution_is_the_same_gemm_as_the_torch_one(tmp_path: Path) -> None:
    """Before, an ONNX Conv carried no conv_io: no NCHW transposes on a GPU, and the parallel passes took it
    for a linear."""
    g, _, _ = onnx_frontend.load(str(_onnx_conv(tmp_path))).capture(CaptureSpec(micro_batch=2))

    class Same(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(8, 16, 3, padding=1, groups=2, bias=False)
            self.up = nn.ConvTranspose2d(16, 16, 2, stride=2, groups=4, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.up(self.conv(x))

    with torch.device("meta"):
        torch_capture = capture_exported(Same(), (torch.zeros(2, 8, 10, 10),), dtype=DType.FP32)
    assert _matmuls(g) == _matmuls(torch_capture.graph)
    assert all(a.conv_io for a in _matmuls(g))


@pytest.mark.parametrize("transposed", [False, True])
def test_conv_matmul_flops_match_pytorchs_counter_for_odd_shapes(transposed: bool) -> None:
    cls = nn.ConvTranspose3d if transposed else nn.Conv3d
    with torch.device("meta"):
        conv = cls(6, 9, (3, 2, 1), stride=(2, 1, 1), padding=(1, 0, 0), groups=3)
        x = torch.zeros(2, 6, 5, 7, 4)
        with FlopCounterMode(display=False) as counter:
            out = conv(x)
    attrs = conv_matmul(tuple(x.shape), tuple(conv.weight.shape), tuple(out.shape), 3, transposed)
    assert attrs.flops == counter.get_total_flops()
