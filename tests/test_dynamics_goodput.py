"""Goodput: the Young/Daly optimum against its closed form, and the Llama 3 405B run's failures."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echosim.dynamics.goodput import (
    STORAGE,
    GoodputInput,
    checkpoint_bytes,
    daly_interval_s,
    goodput,
    job_mtbf_s,
    optimal_interval_s,
    parse_interval,
    parse_storage,
    time_to_train,
    wall_factor,
    young_interval_s,
)
from echosim.errors import EchosimError

# Llama 3 405B (Dubey et al. 2024, sec. 3.3.4): 16,384 H100, a 54-day snapshot, 466 interruptions of which
# 419 unexpected, and "higher than 90% effective training time".
LLAMA3_GPUS, LLAMA3_DAYS, LLAMA3_UNEXPECTED = 16384, 54, 419
LLAMA3_405B_PARAMS = 405_853_388_800  # echosim compile llama3-405b --json: params


def _golden_min(f, lo: float, hi: float) -> float:
    """Minimiser of a unimodal ``f`` on [lo, hi] (golden-section search on log scale)."""
    a, b = math.log(lo), math.log(hi)
    g = (math.sqrt(5) - 1) / 2
    for _ in range(200):
        c, d = b - g * (b - a), a + g * (b - a)
        if f(math.exp(c)) < f(math.exp(d)):
            b = d
        else:
            a = c
    return math.exp((a + b) / 2)


@settings(max_examples=200, deadline=None)
@given(block=st.floats(1e-3, 1e3), mtbf=st.floats(1e3, 1e7))
def test_optimum_is_young_daly_closed_form(block: float, mtbf: float) -> None:
    """No restart, no lag: the model's optimum is sqrt(2 block M) - block (Young's term, Daly's first correction)."""
    if block >= mtbf / 4:
        return
    tau = optimal_interval_s(block, 0.0, 0.0, mtbf)
    assert tau + block == pytest.approx(math.sqrt(2 * block * mtbf), rel=1e-9)
    assert tau + block == pytest.approx(young_interval_s(block, mtbf), rel=1e-9)
    # Daly's higher-order estimate differs only in terms of order block/M
    assert tau == pytest.approx(daly_interval_s(block, mtbf), rel=3 * math.sqrt(block / mtbf) + 1e-9)


@settings(max_examples=200, deadline=None)
@given(
    block=st.floats(1e-3, 1e3),
    lag=st.floats(0, 1e3),
    restart=st.floats(0, 3e3),
    mtbf=st.floats(1e4, 1e7),
)
def test_closed_form_minimises_the_wall_time(block: float, lag: float, restart: float, mtbf: float) -> None:
    """The closed form is where the expected wall time is least (numerical minimisation agrees)."""
    if restart + lag + block >= mtbf / 4:
        return
    tau = optimal_interval_s(block, lag, restart, mtbf)
    f = lambda t: wall_factor(t, block, lag, restart, mtbf)  # noqa: E731
    numeric = _golden_min(f, 1e-6, mtbf)
    assert f(tau) <= f(numeric) * (1 + 1e-12)
    assert numeric == pytest.approx(tau, rel=1e-4)


def test_no_interval_keeps_up_with_failures() -> None:
    assert math.isnan(optimal_interval_s(10.0, 0.0, 2000.0, 1000.0))
    assert wall_factor(100.0, 10.0, 0.0, 2000.0, 1000.0) == math.inf


@settings(max_examples=100, deadline=None)
@given(
    ideal=st.floats(1e3, 1e8),
    interval=st.floats(10, 1e4),
    block=st.floats(0, 100),
    lag=st.floats(0, 100),
    restart=st.floats(0, 600),
)
def test_time_to_train_parts_add_up(ideal: float, interval: float, block: float, lag: float, restart: float) -> None:
    mtbf = 1e5
    t = time_to_train(ideal, interval, block, lag, restart, mtbf)
    parts = t["ideal_days"] + t["checkpoint_overhead_days"] + t["restart_days"] + t["lost_work_days"]
    assert parts == pytest.approx(t["time_to_train_days"], rel=1e-9)
    assert t["expected_interruptions"] == pytest.approx(t["time_to_train_days"] * 86400 / mtbf, rel=1e-9)


def test_checkpoint_bytes_follow_the_memory_model() -> None:
    # Megatron mixed precision: 2-byte weights + 12 bytes of Adam (fp32 master, momentum, variance)
    assert checkpoint_bytes(1000, "bf16", "megatron") == 14_000
    assert checkpoint_bytes(1000, "fp32", "megatron") == 12_000  # 4 + 8
    assert checkpoint_bytes(1000, "bf16", "maxtext") == 12_000  # fp32 weights, no master copy
    # sharded embedding tables as held: bf16 rows and a 4-byte Adagrad accumulator per row, no Adam state
    tables = {"params": 800, "weight_bytes": 1600, "optimizer_bytes": 40}
    assert checkpoint_bytes(1000, "bf16", "megatron", tables=tables) == 200 * 14 + 1600 + 40


def _llama3(restart_minutes: float, storage: str = "tectonic", mode: str = "sync") -> dict:
    mtbf = LLAMA3_DAYS * 24 * LLAMA3_GPUS / LLAMA3_UNEXPECTED
    given = GoodputInput(mtbf, restart_minutes, None, STORAGE[storage], mode, 15.6e12)
    # step time and throughput of `echosim compile llama3-405b --backend h100-sxm --tp 8 --pp 16 --dp 128
    # --global-batch 2048 --seq-len 8192 --framework megatron` (inputs here; the slow test compiles it)
    return goodput(given, params=LLAMA3_405B_PARAMS, dtype="bf16", framework="megatron", pp=16,
                   devices=LLAMA3_GPUS, backend="h100-sxm", step_time_s=10.0872, tokens_per_s=1663220.0)  # fmt: skip


def test_llama3_405b_interruptions_and_effective_training_time() -> None:
    mtbf = LLAMA3_DAYS * 24 * LLAMA3_GPUS / LLAMA3_UNEXPECTED
    assert mtbf == pytest.approx(50_000, rel=0.02)  # the "about 50,000 hours" per device
    g = _llama3(10.0)
    # their 419 unexpected interruptions in 54 days, back from the per-device MTBF
    assert g["interruptions_per_day"] * LLAMA3_DAYS == pytest.approx(LLAMA3_UNEXPECTED, rel=1e-6)
    assert g["mtbf_job_hours"] == pytest.approx(LLAMA3_DAYS * 24 / LLAMA3_UNEXPECTED, rel=1e-6)
    # 405.9e9 x 14 bytes = 5.7 TB at Tectonic's 2 TB/s: under 3 s per checkpoint
    assert g["checkpoint_bytes"] == LLAMA3_405B_PARAMS * 14
    assert g["checkpoint_write_s"] == pytest.approx(5.682e12 / 2e12, rel=1e-3)
    # Llama 3: "higher than 90% effective training time"; with a 10-minute restart the model agrees
    assert 0.90 < g["goodput"] < 0.96
    # restarts dominate: at 30 minutes a restart, goodput falls well below what Llama 3 reports
    assert _llama3(30.0)["goodput"] < 0.85
    # in-memory (host) checkpoints change little once writes take seconds: the restart is what costs
    assert _llama3(10.0, "host-pcie5", "async")["goodput"] == pytest.approx(g["goodput"], abs=0.03)


def test_given_interval_and_async_floor() -> None:
    fixed = GoodputInput(1e4, 5.0, 30.0, STORAGE["tectonic"], "sync", None)
    g = goodput(fixed, params=10**9, dtype="bf16", framework="megatron", pp=1, devices=64, backend="h100-sxm",
                step_time_s=1.0, tokens_per_s=1e5)  # fmt: skip
    assert g["interval_source"] == "given" and g["interval_s"] == 1800.0 and g["interval_steps"] == 1800
    slow = GoodputInput(1e4, 5.0, None, parse_storage("0.5GBps"), "async", None)
    g = goodput(slow, params=10**9, dtype="bf16", framework="megatron", pp=1, devices=64, backend="h100-sxm",
                step_time_s=1.0, tokens_per_s=1e5)  # fmt: skip
    # async: no new checkpoint before the last one is on storage (14 GB at 0.5 GB/s: 28 s)
    assert g["interval_s"] >= g["checkpoint_write_s"] - g["checkpoint_blocking_s"]
    assert g["checkpoint_blocking_s"] == pytest.approx(14e9 / 64 / 64e9, rel=1e-6)  # PCIe Gen5 per device


def test_bad_settings_are_one_line() -> None:
    with pytest.raises(EchosimError, match="unknown storage"):
        parse_storage("floppy")
    with pytest.raises(EchosimError, match="'auto' or minutes"):
        parse_interval("soon")
    with pytest.raises(EchosimError, match="'auto' or minutes"):
        parse_interval("-3")
    with pytest.raises(EchosimError, match="--mtbf-hours"):
        GoodputInput(0.0).check()
    with pytest.raises(EchosimError, match="no host-link bandwidth"):
        goodput(GoodputInput(1e4, mode="async"), params=10, dtype="bf16", framework="eager", pp=1, devices=8,
                backend="tpu-v5p", step_time_s=1.0, tokens_per_s=1.0)  # fmt: skip


def test_job_mtbf_scales_with_devices() -> None:
    assert job_mtbf_s(50_000, 16_384) == pytest.approx(50_000 * 3600 / 16_384)


@pytest.mark.slow
def test_llama3_405b_compiled_through_the_command_line() -> None:
    """The 405B step compiled on 16,384 H100 (Llama 3's TP 8, PP 16, DP 128 at 8K), with its failure rate."""
    import json

    from click.testing import CliRunner

    from echosim.cli import cli

    mtbf = LLAMA3_DAYS * 24 * LLAMA3_GPUS / LLAMA3_UNEXPECTED
    args = ["compile", "llama3-405b", "--backend", "h100-sxm", "--tp", "8", "--pp", "16", "--dp", "128",
            "--global-batch", "2048", "--seq-len", "8192", "--framework", "megatron", "--zero", "1",
            "--recompute", "full", "--mtbf-hours", f"{mtbf:.0f}", "--restart-minutes", "10", "--tokens", "15.6e12",
            "--json"]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    r = json.loads(result.output)
    g = r["goodput"]
    assert r["fits"] and r["params"] == LLAMA3_405B_PARAMS
    assert g["interruptions_per_day"] * LLAMA3_DAYS == pytest.approx(LLAMA3_UNEXPECTED, rel=1e-3)
    assert 0.90 < g["goodput"] < 0.96  # Llama 3: "higher than 90% effective training time"
    assert g["time_to_train_days"] == pytest.approx(g["ideal_days"] / g["goodput"], rel=1e-5)  # JSON: 6 digits
