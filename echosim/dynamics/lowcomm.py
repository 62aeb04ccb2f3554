"""Low-communication data parallelism, costed against synchronous DP on the same step.

- ``sync``: every step all-reduces the gradients over the data-parallel replicas.
- ``diloco`` (Douillard et al. 2023, arXiv:2311.08105): each replica takes H inner optimizer
  steps alone, then the replicas all-reduce their pseudo-gradients (the parameter change, fp32)
  once: the same bytes once every H steps, so H times less communication (the paper's H = 500:
  "500 times less").
- ``streaming-diloco`` (Douillard et al. 2025, arXiv:2501.18512): the model is split into P
  fragments synchronised in turn, one every H/P steps, each overlapped with the next inner
  step: the same total bytes as DiLoCo, a P-times smaller peak, and the sync hidden behind compute.
- ``gossip`` (decentralised SGD, Lian et al. 2017, arXiv:1705.09056): every step each replica
  averages its parameters with k neighbours: no global collective, k point-to-point exchanges.

The inner step is the compiled step without its exposed data-parallel reduction (``comm.dp``
of the breakdown). A sync is costed with the backend's own collective model on the
data-parallel group's placement, or, over a slow link (``--slow-link-gbps``: a link of that many
GB/s per direction for each data-parallel replica, e.g. between sites), as a ring over the
replicas: ``2 (K-1)/K`` of a replica's bytes over the link plus ``2 (K-1)`` latencies, fully
exposed (an upper bound: bucketed overlap hides at most one backward). Only time is costed:
what rare synchronisation does to the loss per token is the papers' subject, not this model's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from echosim.errors import EchosimError

STRATEGIES = ("sync", "diloco", "streaming-diloco", "gossip")
DEFAULT_INNER_STEPS = 500  # DiLoCo's H (Douillard et al. 2023, sec. 3)
DEFAULT_FRAGMENTS = 4
DEFAULT_GOSSIP_PEERS = 2  # a ring: the previous and the next replica
PSEUDO_GRADIENT_BYTES = 4  # the outer gradient is an fp32 parameter difference
OVERLAP_STEPS = 1  # streaming DiLoCo overlaps a fragment's sync with this many inner steps (tau = 1)


@dataclass(frozen=True)
class StrategyInput:
    name: str
    inner_steps: int = DEFAULT_INNER_STEPS
    fragments: int = DEFAULT_FRAGMENTS
    gossip_peers: int = DEFAULT_GOSSIP_PEERS
    link_GBps: float | None = None  # the slow link, per direction per data-parallel replica
    link_latency_s: float = 0.0

    @classmethod
    def of(
        cls,
        name: str,
        inner_steps: int | None = None,
        fragments: int | None = None,
        gossip_peers: int | None = None,
        link_GBps: float | None = None,
        latency_ms: float | None = None,
    ) -> StrategyInput:
        """Checked settings; a setting the strategy does not use is refused, naming it."""
        if name not in STRATEGIES:
            raise EchosimError(f"--dp-strategy must be one of {', '.join(STRATEGIES)}, got {name!r}")
        uses = {"inner_steps": ("diloco", "streaming-diloco"), "fragments": ("streaming-diloco",),
                "gossip_peers": ("gossip",)}  # fmt: skip
        for key, value in (("inner_steps", inner_steps), ("fragments", fragments), ("gossip_peers", gossip_peers)):
            flag = f"--{key.replace('_', '-')}"
            if value is None:
                continue
            if name not in uses[key]:
                raise EchosimError(f"{flag} applies to --dp-strategy {' or '.join(uses[key])}, not {name}")
            if value < 1:
                raise EchosimError(f"{flag} must be at least 1, got {value}")
        if link_GBps is not None and not (link_GBps > 0 and math.isfinite(link_GBps)):
            raise EchosimError(f"--slow-link-gbps must be a positive bandwidth, got {link_GBps:g}")
        if latency_ms is not None and not (latency_ms >= 0 and math.isfinite(latency_ms)):
            raise EchosimError(f"--slow-link-latency-ms must be 0 or more, got {latency_ms:g}")
        if latency_ms is not None and link_GBps is None:
            raise EchosimError("--slow-link-latency-ms needs --slow-link-gbps")
        h = inner_steps or DEFAULT_INNER_STEPS
        p = fragments or DEFAULT_FRAGMENTS
        if name == "streaming-diloco" and p > h:
            raise EchosimError(f"--fragments {p} is more than --inner-steps {h}: each fragment syncs once per H steps")
        return cls(name, h, p, gossip_peers or DEFAULT_GOSSIP_PEERS, link_GBps, (latency_ms or 0.0) / 1e3)


@dataclass(frozen=True)
class DataParallel:
    """The data-parallel facts of a compiled step that every strategy is costed from."""

    replicas: int  # data-parallel replicas (dp x cp ranks of a stage)
    ranks_per_replica: int  # tp x pp x cp: the devices of one model copy
    grad_bytes: int  # one rank's gradient all-reduce buffer
    weight_bytes: int  # one rank's parameters (16-bit or fp32 weights)
    local_params: int
    step_s: float
    inner_step_s: float
    fast_sync_s: float  # one gradient all-reduce on the backend's network


def data_parallel(report: Any) -> DataParallel:
    """The replicas, the per-rank parameter count and the step without its data-parallel reduction."""
    from echosim.backends.loading import load_backend
    from echosim.frameworks import get_framework
    from echosim.ir.ops import Axis, OpKind
    from echosim.passes.memory import StatePolicy
    from echosim.timeline.placement import Degrees, axis_placements

    p = report.plan
    replicas = p["dp"] * p["cp"]
    sharded = StatePolicy.for_training(p["dtype"], p["zero"], replicas, **get_framework(p["framework"]).state(p["pp"]))
    # the rank's sharded embedding rows have no dense gradient and are no replica's copy: neither reduced nor synced
    tables = report.embedding_tables.get("rank_weight_bytes", 0)
    local = max(round((row["params"] - tables) / sharded.weight_bytes) for row in report.memory)
    kept = get_framework(p["framework"]).state(1, p.get("grad_dtype", ""), p["zero"], p["dtype"])
    plain = StatePolicy.for_training(p["dtype"], 0, 1, **kept)
    degrees = Degrees(p["tp"], p["pp"], p["dp"], p["cp"], p["ep"], p.get("etp", 0), p.get("cp_a2a", 0))
    where = axis_placements(degrees, report.devices_per_node)
    grad = int(local * plain.grad_bytes)
    backend = load_backend(report.backend)
    fast = backend.collective_time_s(OpKind.ALL_REDUCE, grad, where[Axis.DP]) if replicas > 1 else 0.0
    exposed = report.breakdown.get("comm.dp", 0.0)
    return DataParallel(
        replicas=replicas,
        ranks_per_replica=p["tp"] * p["pp"] * p["cp"],
        grad_bytes=grad,
        weight_bytes=int(local * plain.weight_bytes),
        local_params=local,
        step_s=report.step_time_s,
        inner_step_s=report.step_time_s - exposed,
        fast_sync_s=fast,
    )


def ring_wire(nbytes: float, k: int) -> float:
    """Bytes each member sends in a ring all-reduce of ``nbytes`` over ``k`` members."""
    return 2.0 * (k - 1) / k * nbytes if k > 1 else 0.0


def slow_sync_s(dp: DataParallel, rank_bytes: float, given: StrategyInput) -> float:
    """One all-reduce of ``rank_bytes`` per rank over the slow link: a ring over the replicas."""
    k = dp.replicas
    if k < 2:
        return 0.0
    assert given.link_GBps is not None
    replica_bytes = rank_bytes * dp.ranks_per_replica  # every rank of a replica crosses the replica's link
    return ring_wire(replica_bytes, k) / (given.link_GBps * 1e9) + 2 * (k - 1) * given.link_latency_s


def _sync_s(dp: DataParallel, rank_bytes: float, given: StrategyInput) -> float:
    if given.link_GBps is not None:
        return slow_sync_s(dp, rank_bytes, given)
    return dp.fast_sync_s * rank_bytes / dp.grad_bytes if dp.grad_bytes else 0.0


def _p2p_s(dp: DataParallel, rank_bytes: float, given: StrategyInput, fast_p2p_s: float) -> float:
    if given.link_GBps is not None:
        return rank_bytes * dp.ranks_per_replica / (given.link_GBps * 1e9) + given.link_latency_s
    return fast_p2p_s


def cost(given: StrategyInput, dp: DataParallel, fast_p2p_s: float = 0.0) -> dict[str, Any]:
    """Bytes per rank per step and step time of ``given`` beside synchronous DP."""
    k = dp.replicas
    sync_bytes = float(dp.grad_bytes)
    sync_step = dp.inner_step_s + slow_sync_s(dp, sync_bytes, given) if given.link_GBps else dp.step_s
    peak = sync_bytes
    if given.name == "sync":
        per_step, step = sync_bytes, sync_step
        wire = ring_wire(sync_bytes, k)
    elif given.name == "diloco":
        outer = dp.local_params * PSEUDO_GRADIENT_BYTES
        per_step = outer / given.inner_steps
        wire = ring_wire(outer, k) / given.inner_steps
        peak = outer
        step = dp.inner_step_s + _sync_s(dp, outer, given) / given.inner_steps
    elif given.name == "streaming-diloco":
        fragment = dp.local_params * PSEUDO_GRADIENT_BYTES / given.fragments
        per_step = fragment * given.fragments / given.inner_steps
        wire = ring_wire(fragment, k) * given.fragments / given.inner_steps
        peak = fragment
        hidden = OVERLAP_STEPS * dp.inner_step_s
        exposed = max(0.0, _sync_s(dp, fragment, given) - hidden)
        step = dp.inner_step_s + exposed * given.fragments / given.inner_steps
    else:  # gossip: k exchanges of the weights with neighbours every step
        peers = min(given.gossip_peers, max(0, k - 1))
        per_step = float(dp.weight_bytes * peers)
        wire = per_step
        peak = float(dp.weight_bytes)
        step = dp.inner_step_s + peers * _p2p_s(dp, dp.weight_bytes, given, fast_p2p_s) if peers else dp.inner_step_s
    sync_wire = ring_wire(sync_bytes, k)
    return {
        "strategy": given.name,
        "replicas": k,
        "inner_steps": given.inner_steps if "diloco" in given.name else 1,
        "fragments": given.fragments if given.name == "streaming-diloco" else 1,
        "gossip_peers": given.gossip_peers if given.name == "gossip" else 0,
        "link": (
            {"GBps_per_replica": given.link_GBps, "latency_s": given.link_latency_s}
            if given.link_GBps is not None
            else "backend"
        ),
        "sync_bytes_per_step": sync_bytes,
        "bytes_per_step": per_step,
        "peak_bytes_per_sync": peak,
        "wire_bytes_per_step": wire,
        "communication_reduction": sync_wire / wire if wire else math.inf,
        "saved_bytes_per_step": sync_wire - wire,
        "inner_step_s": dp.inner_step_s,
        "sync_step_s": sync_step,
        "step_s": step,
        "speedup_vs_sync": sync_step / step,
    }


def strategy_section(given: StrategyInput, report: Any) -> dict[str, Any]:
    """The ``dp_strategy`` key of a report."""
    dp = data_parallel(report)
    if dp.replicas < 2:
        raise EchosimError(
            f"--dp-strategy {given.name}: the layout has one data-parallel replica (dp*cp = 1): nothing to synchronise"
        )
    fast_p2p = 0.0
    if given.name == "gossip" and given.link_GBps is None and dp.replicas > 1:
        from echosim.backends.base import Placement
        from echosim.backends.loading import load_backend
        from echosim.ir.ops import OpKind

        node = report.devices_per_node
        crosses = dp.ranks_per_replica >= node  # neighbours sit in other nodes once a replica fills one
        place = Placement(2, 2, 1, node) if crosses else Placement(2, 1, 2, max(1, node // 2))
        fast_p2p = load_backend(report.backend).collective_time_s(OpKind.SEND, dp.weight_bytes, place)
    return cost(given, dp, fast_p2p)


def render(section: dict[str, Any]) -> list[str]:
    s = section
    link = "the backend's network" if s["link"] == "backend" else f"a {s['link']['GBps_per_replica']:g} GB/s link"
    what = {"sync": "synchronous DP", "diloco": f"DiLoCo H={s['inner_steps']}",
            "streaming-diloco": f"streaming DiLoCo H={s['inner_steps']}, {s['fragments']} fragments",
            "gossip": f"gossip with {s['gossip_peers']} peers"}[s["strategy"]]  # fmt: skip
    sync_wire = s["wire_bytes_per_step"] * s["communication_reduction"] if s["wire_bytes_per_step"] else 0.0
    versus = (
        "the baseline"
        if s["strategy"] == "sync"
        else f"{s['communication_reduction']:.4g}x less than sync DP's {sync_wire / 1e9:.4g} GB"
    )
    return [
        f"data parallel: {what} over {s['replicas']} replicas on {link}: sends {s['wire_bytes_per_step'] / 1e9:.4g} GB "
        f"per rank per step ({versus}); syncs {s['peak_bytes_per_sync'] / 1e9:.4g} GB at a time",
        f"  step {s['step_s']:.4g} s vs sync DP {s['sync_step_s']:.4g} s ({s['speedup_vs_sync']:.3g}x); "
        f"inner step {s['inner_step_s']:.4g} s",
    ]
