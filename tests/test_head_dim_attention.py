"""Flash attention's forward at a head dimension other than the device's measured anchor (128).

The backward has taken the FlashAttention-4 roofline at each head dimension (compute.flash_bwd_rate);
the forward now does too (compute.flash_fwd_rate): a tile's exponentials do not shrink with the head,
so on B200 a head of 64 halves the MMA cycles of a tile but not its MUFU ones.
"""

from __future__ import annotations

import pytest

from echosim.backends.compute import (
    FLASH_SOFTMAX_HEAD_DIM,
    flash_attention_time_s,
    flash_fwd_rate,
    flash_pass_fraction,
)
from echosim.backends.devices import DEVICES
from echosim.ir.ops import AttentionAttrs

#: The forward tile work the measured model prices at head d, relative to 128 (softmax as extra work).
WORK_64 = (64 + FLASH_SOFTMAX_HEAD_DIM) / (128 + FLASH_SOFTMAX_HEAD_DIM)


def _layer(dev_name: str, head_dim: int, backward: bool = False) -> float:
    """Seconds of a causal 4096-token attention layer 4096 wide (64 heads of 64 or 32 of 128, GQA 8), 16 sequences:
    a grid large enough that its tail (half the longest CTA, longer where a forward CTA holds two query tiles:
    compute.FLASH_FWD_Q_TILES) does not hide the per-tile work these tests compare."""
    dev = DEVICES[dev_name]
    heads = 4096 // head_dim
    a = AttentionAttrs(16, heads, heads // 8, 4096, 4096, head_dim)
    return flash_attention_time_s(dev, a, "bf16", backward) - dev.kernel_overhead_us * 1e-6


def test_forward_rate_follows_the_slowest_unit() -> None:
    """B200 / GB200 at 64: MMA 512 cycles a tile (704 with the softmax's equivalent work), MUFU 1024, so the
    tile runs at 704 / 1024 of its work's rate; the anchor (128) is tensor-bound (1216 against 1024). B300,
    GB300, H100, H200 and A100 stay tensor-bound at 64 and above; nothing changes at 128 or wider heads."""
    for name in ("b200", "gb200"):
        assert flash_fwd_rate(DEVICES[name], 64) == pytest.approx(704 / 1024)
        assert flash_pass_fraction(DEVICES[name], 64, False) == 0.5  # the roofline's own figure (MUFU-bound)
    for name in ("b300", "gb300", "h100-sxm", "h200", "h800", "a100-80gb"):
        assert flash_fwd_rate(DEVICES[name], 64) == 1.0
    for name in DEVICES:
        for d in (128, 160, 192, 256):
            assert flash_fwd_rate(DEVICES[name], d) == 1.0, (name, d)


def test_head_64_forward_on_b200_pays_the_mufu() -> None:
    """Same model width, half the head: twice the tiles, each 64-wide tile at WORK_64 of a 128-wide one's
    work. Where the tensor cores bind (B300, H100) the layer costs 2 x WORK_64 of the 128-head one (as
    before); on B200 / GB200 the MUFU stretches each tile to 1024 / 1216 of the wide one."""
    for name in ("b300", "h100-sxm"):
        assert _layer(name, 64) / _layer(name, 128) == pytest.approx(2 * WORK_64, rel=0.02), name
    for name in ("b200", "gb200"):
        assert _layer(name, 64) / _layer(name, 128) == pytest.approx(2 * 1024 / 1216, rel=0.02), name


def test_the_backward_is_not_touched() -> None:
    """The backward keeps its own roofline ratio (flash_bwd_rate): at 64 over 128 on B200 it is what it was."""
    dev = DEVICES["b200"]
    expected = 2 * WORK_64 * flash_pass_fraction(dev, 128, True) / flash_pass_fraction(dev, 64, True)
    assert _layer("b200", 64, True) / _layer("b200", 128, True) == pytest.approx(expected, rel=0.02)
