"""FlashAttention's kernels run on padded head dimensions (compute.FLASH_KERNEL_HEAD_DIMS): FA2's templates are
32, 64, 96, 128, 192, 256 (static_switch.h), FA3's 64, 96, 128, 192, 256 (hopper/flash_api.cpp round_up_headdim).
cuDNN's kernels take the head_dim as it is."""

from __future__ import annotations

import pytest

from echosim.backends import compute, devices
from echosim.ir.ops import AttentionAttrs


def _attn(d: int, kernel: str = "", d_v: int = 0) -> AttentionAttrs:
    # long enough that the tensor cores, not the bytes, set the time
    return AttentionAttrs(4, 16, 16, 8192, 8192, d, causal=False, kernel=kernel, head_dim_v=d_v)


@pytest.mark.parametrize(("family", "d", "padded"), [("fa2", 72, 96), ("fa2", 112, 128), ("fa2", 160, 192),
                                                     ("fa3", 32, 64), ("fa3", 88, 96), ("fa3", 128, 128),
                                                     ("", 88, 88)])  # fmt: skip
def test_template_head_dims(family: str, d: int, padded: int) -> None:
    assert compute.flash_kernel_head_dim(family, _attn(d)) == padded


def test_a_padded_head_costs_the_template_it_runs() -> None:
    """ViT-H/14's 80-wide heads take FA2's 96 kernel on A100 and FA3's on H100: the time of d=96 attention."""
    for dev in (devices.A100_80GB, devices.H100_SXM):
        t80 = compute.attention_time_s(dev, _attn(80), "bf16")
        t96 = compute.attention_time_s(dev, _attn(96), "bf16")
        assert t80 == pytest.approx(t96, rel=0.02), dev.name
        assert compute.attention_time_s(dev, _attn(80), "bf16", backward=True) == pytest.approx(
            compute.attention_time_s(dev, _attn(96), "bf16", backward=True), rel=0.02
        )


def test_cudnn_and_blackwell_take_the_head_dim_as_it_is() -> None:
    te = compute.attention_time_s(devices.H100_SXM, _attn(80, "te"), "bf16")
    assert te < compute.attention_time_s(devices.H100_SXM, _attn(96, "te"), "bf16") * 0.95
    # B200's forward is MUFU-bound up to 96 wide (compute.flash_fwd_rate), so compare 112 with 128
    assert (
        compute.attention_time_s(devices.B200, _attn(112), "bf16")
        < compute.attention_time_s(devices.B200, _attn(128), "bf16") * 0.95
    )


def test_mla_pads_query_key_and_value_sizes_each() -> None:
    """DeepSeek's MLA: query/key 192, value 128, held as their mean 160 (exact FLOPs). FA3 has both templates, so
    nothing is padded; without head_dim_v the mean would have been read as a 160-wide head and padded to 192."""
    mla = _attn(160, d_v=128)
    assert mla.head_dims == (192, 128)
    assert compute.flash_kernel_head_dim("fa3", mla) == 160
    assert compute.flash_kernel_head_dim("fa3", _attn(160)) == 192
