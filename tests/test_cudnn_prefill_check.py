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
    dense = [r for r in rows if r["sinks"] == "no"]
    assert len(dense) == 52 and {r["backend"] for r in dense} == {"h200", "b200", "gb200", "gb300"}
    assert len(rows) - len(dense) == 30  # gpt-oss: H200 4 head counts, B200 64 heads; window 128 and full
    for r in rows:
        a = m.attention(r)
        assert a.causal and a.q_len == a.kv_len and a.kernel == "te"
        assert r["source"].startswith("https://github.com/NVIDIA/cudnn-frontend/blob/")
        if a.window:  # the benchmark counts a windowed row's FLOPs as full causal: only its time is a measurement
            continue
        flops = 4 * a.batch * a.heads * a.q_len * a.kv_len * a.head_dim / 2
        assert math.isclose(float(r["tflops"]) * 1e12 * float(r["time_ms"]) * 1e-3, flops, rel_tol=2e-3)


def test_hopper_cudnn_model_holds_across_the_sweep() -> None:
    m = _module()
    results = [m.compare(r) for r in m.read_rows()]
    s = m.summary(results)
    # H200's level comes from cuDNN 9.4 at one non-causal 16-head shape; these are 9.27, causal, 8-64 heads, d 128/256
    assert s["h200"]["rows"] == 20  # the summary leaves the sink rows out
    assert s["h200"]["mape"] <= 0.04
    assert all(
        abs(r["predicted"] / r["measured"] - 1) <= 0.15 for r in results if r["backend"] == "h200" and not r["sinks"]
    )
    # Blackwell's forward CTAs carry two query tiles (compute.FLASH_FWD_Q_TILES): with the level taken out, the
    # rate's dependence on tokens and heads follows cuDNN's (one tile per CTA read 14.8 / 8.0 / 4.0 %)
    for device in ("b200", "gb200", "gb300"):
        assert s[device]["shape_mape"] <= 0.05
    # every device has the reference row the shape columns divide by, and dividing by it leaves that row exact
    for device, d in s.items():
        ref = [r for r in results if r["backend"] == device and (r["heads"], r["tokens"]) == m.REFERENCE]
        assert len(ref) == 1 and ref[0]["head_dim"] == 128
        assert d["shape_max"] >= 0 and d["shape_mape"] <= d["shape_max"]


def test_windowed_rows_cost_a_band_in_both() -> None:
    """cuDNN skips the key tiles outside a sliding window: its 128-token-window time grows about linearly with the
    tokens (x16 tokens, < x16 time), far below full causal's x256; echosim's band does the same."""
    m = _module()
    rows = [m.compare(r) for r in m.read_rows() if r["window"] != "0"]
    by = {(r["backend"], r["heads"], r["tokens"]): r for r in rows}
    for key in {(b, h) for b, h, _ in by}:
        small, large = by[(*key, 2048)], by[(*key, 32768)]
        assert small["window"] == large["window"] == 128
        assert large["measured_ms"] / small["measured_ms"] < 16
        assert large["predicted_ms"] / small["predicted_ms"] < 16
