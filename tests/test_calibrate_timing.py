"""How a CPU calibration times its samples: calls repeated inside a timing so that the clocks' own cost stays
out, the sweep run in rounds with each sample's median round kept, the autograd sample's two depths in turn."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from types import SimpleNamespace

import pytest

from echosim.calibrate import bench
from echosim.calibrate.bench import Sample


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_short_op_is_repeated_inside_each_timing_and_its_time_is_per_call() -> None:
    calls: list[int] = []
    bench.time_fn(lambda: calls.append(1), 3, warmup=1)
    # one warm-up, one call to size the timing, then 3 timings of many calls each
    assert len(calls) > 2 + 3 * 10
    wall, cpu = bench.time_fn(lambda: _spin(50e-6), 5)
    assert 40e-6 < wall < 100e-6 and cpu < 100e-6


def test_the_clocks_cost_stays_out_of_a_tiny_ops_time() -> None:
    # reading the process CPU clock is a system call of ~1 us: one read inside a one-call timing of a no-op
    # would show as the op's time; over 1 ms of calls it is a thousandth of a microsecond a call
    c0 = time.process_time()
    for _ in range(1000):
        time.process_time()
    read_s = (time.process_time() - c0) / 1000
    _, cpu = bench.time_fn(lambda: None, 5)
    assert cpu < max(0.3 * read_s, 0.05e-6)
    _, single = bench.time_fn(lambda: None, 5, min_timed_s=0)
    assert single > cpu


def test_timings_after_an_eviction_or_between_ranks_are_one_call_each() -> None:
    calls: list[str] = []
    bench.time_fn(lambda: calls.append("fn"), 3, warmup=1, min_timed_s=0)
    assert calls == ["fn"] * 4  # a collective: ranks must call it equally often
    calls.clear()
    bench.time_fn(lambda: calls.append("fn"), 2, warmup=0, before=lambda: calls.append("evict"))
    assert calls == ["evict", "fn", "evict", "fn"]


def test_calls_per_timing_fills_the_minimum_span(monkeypatch: pytest.MonkeyPatch) -> None:
    # a fake clock that only the op advances: the count must not depend on how loaded this machine is
    now = [0.0]
    monkeypatch.setattr(bench, "time", SimpleNamespace(perf_counter=lambda: now[0], process_time=time.process_time))

    def op(seconds: float) -> Callable[[], None]:
        return lambda: now.__setitem__(0, now[0] + seconds)

    assert bench.calls_per_timing(op(0.2e-3)) == 5 == math.ceil(bench.MIN_TIMED_S / 0.2e-3)
    assert bench.calls_per_timing(op(0.3e-3)) == 4
    assert bench.calls_per_timing(op(2e-3)) == 1


def _samples(*seconds: float) -> list[Sample]:
    return [Sample("matmul", "matmul", "fp32", m=i + 1, seconds=s) for i, s in enumerate(seconds)]


def test_each_sample_keeps_its_median_round(monkeypatch: pytest.MonkeyPatch) -> None:
    rounds = iter([_samples(1.0, 9.0), _samples(3.0, 2.0), _samples(2.0, 4.0)])
    shares: list[float] = []

    def one_round(sweep: str, dtypes: tuple[str, ...], threads: int, progress: object, share: float) -> list[Sample]:
        shares.append(share)
        return next(rounds)

    monkeypatch.setattr(bench, "_bench_cpu_round", one_round)
    out = bench.bench_cpu("quick", rounds=3)
    assert [s.seconds for s in out] == [2.0, 4.0] and [s.m for s in out] == [1, 2]
    assert shares == [pytest.approx(1 / 3)] * 3  # each round a third of the repeats: the sweep keeps its length
    assert bench.median_sample(_samples(5.0, 1.0, 3.0, 4.0)).seconds == 3.0  # even count: the lower middle
    with pytest.raises(ValueError, match="at least one round"):
        bench.bench_cpu("quick", rounds=0)


def test_the_sweeps_run_in_rounds_except_the_tests_tiny_one(monkeypatch: pytest.MonkeyPatch) -> None:
    from echosim.calibrate.run import progress_total

    seen: list[float] = []
    monkeypatch.setattr(bench, "_bench_cpu_round", lambda *a: seen.append(a[-1]) or _samples(1.0))
    bench.bench_cpu("tiny")
    assert seen == [1.0]
    bench.bench_cpu("quick")
    assert len(seen) == 1 + bench.ROUNDS
    one_round = len(bench.MATMUL_SWEEPS["quick"]) + 8 * len(bench.MEMORY_SWEEPS["quick"]) + 2
    one_round += sum(len(x["quick"]) for x in (bench.ATTENTION_SWEEPS, bench.FRESH_SWEEPS, bench.BAG_SWEEPS))
    assert progress_total("quick", "cpu", 1, ("fp32",)) == bench.ROUNDS * one_round


def test_the_autograd_sample_times_a_layer_from_pairs_of_depths() -> None:
    s = bench.autograd_sample(repeats=5)
    assert (s.kind, s.m) == ("autograd", bench.AUTOGRAD_LAYER_OPS)
    assert 1e-6 < s.seconds < 1e-3
