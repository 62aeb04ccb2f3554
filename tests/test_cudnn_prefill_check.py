"""benchmarks/cudnn_prefill_check.py: the stored cuDNN 9.27 prefill rows are self-consistent, and echosim's Hopper
fused-attention model holds across their shapes (a regression guard: its level rests on one other shape)."""

from __future__ import annotations

import math

from script_loader import load_script


def _module():
    return load_script("benchmarks/cudnn_prefill_check.py")


def test_rows_count_causal_flops() -> None:
    """Each row's rate times its time is the causal forward's FLOPs (4 b h s^2 d / 2): the columns are read right."""
    m = _module()
    rows = m.read_rows()
    assert len(rows) == 52 and {r["backend"] for r in rows} == {"h200", "b200", "gb200", "gb300"}
    for r in rows:
        a = m.attention(r)
        assert a.causal and a.q_len == a.kv_len and a.kernel == "te"
        flops = 4 * a.batch * a.heads * a.q_len * a.kv_len * a.head_dim / 2
        assert math.isclose(float(r["tflops"]) * 1e12 * float(r["time_ms"]) * 1e-3, flops, rel_tol=2e-3)
        assert r["source"].startswith("https://github.com/NVIDIA/cudnn-frontend/blob/")


def test_hopper_cudnn_model_holds_across_the_sweep() -> None:
    m = _module()
    results = [m.compare(r) for r in m.read_rows()]
    s = m.summary(results)
    # H200's level comes from cuDNN 9.4 at one non-causal 16-head shape; these are 9.27, causal, 8-64 heads, d 128/256
    assert s["h200"]["rows"] == 20
    assert s["h200"]["mape"] <= 0.04
    assert all(abs(r["predicted"] / r["measured"] - 1) <= 0.15 for r in results if r["backend"] == "h200")
    # every device has the reference row the shape columns divide by, and dividing by it leaves that row exact
    for device, d in s.items():
        ref = [r for r in results if r["backend"] == device and (r["heads"], r["tokens"]) == m.REFERENCE]
        assert len(ref) == 1 and ref[0]["head_dim"] == 128
        assert d["shape_max"] >= 0 and d["shape_mape"] <= d["shape_max"]
