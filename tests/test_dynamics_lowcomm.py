"""DiLoCo, streaming DiLoCo and gossip against synchronous DP: bytes per step and step time."""

from __future__ import annotations

import pytest

from echosim.dynamics.lowcomm import DataParallel, StrategyInput, cost, ring_wire
from echosim.errors import EchosimError

# One rank of a 1B-parameter shard, 8 replicas of 8 ranks each, a 2 s step of which 0.1 s is exposed DP sync.
DP = DataParallel(replicas=8, ranks_per_replica=8, grad_bytes=4 * 10**9, weight_bytes=2 * 10**9,
                  local_params=10**9, step_s=2.0, inner_step_s=1.9, fast_sync_s=0.5)  # fmt: skip


def test_diloco_communicates_h_times_less() -> None:
    """Douillard et al. 2023: with H = 500 inner steps, "communicating 500 times less"."""
    s = cost(StrategyInput.of("diloco", inner_steps=500), DP)
    assert s["communication_reduction"] == pytest.approx(500.0)
    assert s["bytes_per_step"] == pytest.approx(4e9 / 500)
    assert s["sync_bytes_per_step"] == 4e9 and s["peak_bytes_per_sync"] == 4e9
    assert s["saved_bytes_per_step"] == pytest.approx(ring_wire(4e9, 8) * (1 - 1 / 500))
    # on the backend's network: sync DP is the compiled step; DiLoCo pays its sync once every H steps
    assert s["sync_step_s"] == 2.0 and s["step_s"] == pytest.approx(1.9 + 0.5 / 500)


def test_streaming_diloco_same_volume_smaller_peak_hidden_sync() -> None:
    d = cost(StrategyInput.of("diloco", inner_steps=100), DP)
    s = cost(StrategyInput.of("streaming-diloco", inner_steps=100, fragments=4), DP)
    assert s["bytes_per_step"] == pytest.approx(d["bytes_per_step"])
    assert s["peak_bytes_per_sync"] == pytest.approx(d["peak_bytes_per_sync"] / 4)
    assert s["step_s"] == pytest.approx(1.9)  # a fragment's 0.125 s sync hides behind one 1.9 s inner step


def test_slow_link_sync_dp_against_diloco() -> None:
    """Over a 1 GB/s link per replica, sync DP moves 2 (K-1)/K of a replica's gradients every step."""
    link = {"link_GBps": 1.0, "latency_ms": 50.0}
    sync = cost(StrategyInput.of("sync", **link), DP)
    replica_bytes = 4e9 * 8
    expected = 1.9 + 2 * 7 / 8 * replica_bytes / 1e9 + 2 * 7 * 0.05
    assert sync["step_s"] == pytest.approx(expected) and sync["speedup_vs_sync"] == pytest.approx(1.0)
    diloco = cost(StrategyInput.of("diloco", inner_steps=500, **link), DP)
    assert diloco["sync_step_s"] == pytest.approx(expected)
    assert diloco["step_s"] == pytest.approx(1.9 + (expected - 1.9) / 500)
    assert diloco["speedup_vs_sync"] > 20  # 58 s a step vs 2.0 s
    streaming = cost(StrategyInput.of("streaming-diloco", inner_steps=500, fragments=4, **link), DP)
    assert streaming["step_s"] < diloco["step_s"]  # most of each fragment's sync overlaps inner steps


def test_gossip_exchanges_weights_with_neighbours() -> None:
    g = cost(StrategyInput.of("gossip", gossip_peers=2, link_GBps=1.0), DP)
    assert g["bytes_per_step"] == 2 * 2e9  # two neighbours, 16-bit weights
    assert g["step_s"] == pytest.approx(1.9 + 2 * (2e9 * 8 / 1e9))
    assert g["communication_reduction"] == pytest.approx(ring_wire(4e9, 8) / 4e9)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "diloco", "inner_steps": 0}, "--inner-steps must be at least 1"),
        ({"name": "diloco", "fragments": 4}, "--fragments applies to --dp-strategy streaming-diloco"),
        ({"name": "sync", "gossip_peers": 2}, "--gossip-peers applies to --dp-strategy gossip"),
        ({"name": "diloco", "link_GBps": 0.0}, "--slow-link-gbps must be a positive"),
        ({"name": "diloco", "latency_ms": 5.0}, "needs --slow-link-gbps"),
        ({"name": "streaming-diloco", "inner_steps": 2, "fragments": 4}, "more than --inner-steps"),
        ({"name": "allreduce"}, "--dp-strategy must be one of"),
    ],
)
def test_bad_strategy_settings(kwargs: dict, message: str) -> None:
    with pytest.raises(EchosimError, match=message):
        StrategyInput.of(**kwargs)
