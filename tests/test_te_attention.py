"""Transformer Engine's attention (Megatron-LM, NeMo, Megatron-Bridge): cuDNN's fused attention from Hopper on.

TE's ``get_attention_backend`` prefers FusedAttention (cuDNN) to FlashAttention on compute capability 9.0 and
later, so these frameworks run cuDNN's kernel on H100 / H200, not FlashAttention-3 (the part's own flash
figure). Its rates are cudnn-frontend's measured ones (echosim.backends.devices, ``cudnn_fwd_eff``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from echosim.backends.compute import attention_flops, attention_time_s, flash_attention_time_s, te_view
from echosim.backends.devices import DEVICES
from echosim.frameworks import get_framework
from echosim.ir.ops import AttentionAttrs

#: cudnn-frontend benchmark/benchmark_results.csv at commit de355c7 (cuDNN 9.4.0, H200): bf16, non-causal,
#: 1 x 16 heads x 16,384 x 128, TFLOP/s forward and backward (the backward's 5 GEMMs counted).
CUDNN_FWD, CUDNN_BWD = 687.97, 546.53


@pytest.mark.parametrize("name", ["h100-sxm", "h200", "h800"])
def test_te_attention_runs_at_cudnns_measured_rates_on_hopper(name: str) -> None:
    dev = te_view(DEVICES[name])
    a = AttentionAttrs(1, 16, 16, 16384, 16384, 128, causal=False)
    fwd = attention_flops(a) / flash_attention_time_s(dev, a, "bf16") / 1e12
    bwd = 2.5 * attention_flops(a) / flash_attention_time_s(dev, a, "bf16", backward=True) / 1e12
    assert fwd == pytest.approx(CUDNN_FWD, rel=2e-3)  # less the one launch gap the measurement includes
    assert bwd == pytest.approx(CUDNN_BWD, rel=2e-3)


def test_cudnn_is_faster_than_the_fa3_figure_and_fa2_on_hopper() -> None:
    """At a training shape (causal, 8 heads of 128 per rank, 8k tokens): cuDNN > FA3's anchor > FA2."""
    dev = DEVICES["h100-sxm"]
    a = AttentionAttrs(1, 8, 1, 8192, 8192, 128)
    for backward in (False, True):
        te = attention_time_s(dev, replace(a, kernel="te"), "bf16", backward)
        fa3 = attention_time_s(dev, a, "bf16", backward)
        fa2 = attention_time_s(dev, replace(a, kernel="fa2"), "bf16", backward)
        assert te < fa3 < fa2


@pytest.mark.parametrize("name", ["a100-80gb", "b200", "gb200", "gb300"])
def test_te_elsewhere_is_the_parts_own_flash_figure(name: str) -> None:
    """Ampere: TE picks FlashAttention (FA2, the part's figure); Blackwell: the part's figure is cuDNN's."""
    assert te_view(DEVICES[name]) is DEVICES[name]


@pytest.mark.parametrize("name", ["nemo", "megatron"])
def test_megatron_core_frameworks_call_te_attention(name: str) -> None:
    fw = get_framework(name)
    assert fw.attention_kernel == "te" and "FusedAttention preference" in fw.attention_source


def test_dgxc_maxtext_rows_and_configs_with_cudnn_flash_te_run_te_attention() -> None:
    """DGX Cloud Benchmarking's MaxText recipe passes attention=cudnn_flash_te (configure.sh, commit 741c886)."""
    from conftest import SHARED

    from echosim.configs import read_source
    from echosim.validation.cases import read_cases
    from echosim.validation.rows import row_framework

    cases = SHARED / "validation" / "cases.csv"
    if not cases.is_file():
        pytest.skip("shared/validation not present")
    dgxc = [c for c in read_cases(cases) if c["source_id"] == "dgxc_benchmarking_v25.04"]
    maxtext = [c for c in dgxc if c["framework"].startswith("MaxText")]
    assert len(maxtext) == 10 and {row_framework(c) for c in maxtext} == {"maxtext-te"}
    mt = Path(__file__).parent / "data" / "configs" / "maxtext"
    assert read_source(f"maxtext:{mt}/base.yml,{mt}/dgxc2504_llama3_70b_bf16_h100_128.yml").framework == "maxtext-te"
    tpu = read_source(f"maxtext:{mt}/base.yml,{mt}/models/llama2-7b.yml,attention=cudnn_flash_te")
    assert tpu.framework == "maxtext"  # hardware: tpu (base.yml's default): no Transformer Engine
    assert get_framework("maxtext-te").attention_kernel == "te"
