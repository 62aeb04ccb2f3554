"""Mixed hardware: a cluster of device pools and the links between them (a TOML file).

Each pool runs whole data-parallel replicas of one layout (the same tp, pp, cp on every
pool), so the replicas differ only in speed. A synchronous step ends when the slowest pool's
replicas finish their micro-batches and the pools have reduced their gradients over the links.
The naive split gives every replica the same number of micro-batches; the balanced split gives
each pool micro-batches in proportion to its speed, found by water-filling on each pool's
simulated step time (then every pool is simulated again at its share: the figures reported are
compiled, not extrapolated). Where each replica runs its share in one micro-batch, the samples of
that micro-batch are split instead (:func:`_balance_samples`).

The gradient reduction across pools is hierarchical: each pool reduces inside itself (part of
its compiled step), then the pools all-reduce one replica's worth of gradients over the links
as a ring (``2 (P-1)/P`` of it over the slowest link, plus ``2 (P-1)`` latencies), exposed.

File format (``examples/clusters/h100-a100.toml``)::

    [[pools]]
    name = "h100"
    device = "h100-sxm"      # a backend (`echosim backends`)
    devices = 512

    [[links]]
    pools = ["h100", "a100"]
    GBps = 100.0             # per direction, all traffic between the two pools
    latency_us = 20.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import tomllib

from echosim.errors import EchosimError


class ClusterFileError(EchosimError):
    """A cluster file that cannot describe a cluster; the message names the file and the problem."""


@dataclass(frozen=True)
class Pool:
    name: str
    device: str
    devices: int


@dataclass(frozen=True)
class Link:
    a: str
    b: str
    GBps: float
    latency_s: float


@dataclass(frozen=True)
class MixedCluster:
    pools: tuple[Pool, ...]
    links: tuple[Link, ...]

    @property
    def devices(self) -> int:
        return sum(p.devices for p in self.pools)

    def slowest_link(self) -> Link | None:
        return min(self.links, key=lambda x: (x.GBps, -x.latency_s)) if self.links else None


def read_cluster(path: str, known_devices: list[str]) -> MixedCluster:
    """Read and check a cluster file; every problem is one line naming the file and what is wrong."""
    where = f"cluster file {path}"
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ClusterFileError(f"{where}: cannot read ({exc.strerror or exc})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ClusterFileError(f"{where}: not valid TOML ({exc})") from None
    extra = sorted(set(data) - {"pools", "links"})
    if extra:
        raise ClusterFileError(f"{where}: unknown table {extra[0]!r} (known: pools, links)")
    raw_pools = data.get("pools")
    if not isinstance(raw_pools, list) or not raw_pools:
        raise ClusterFileError(f"{where}: no [[pools]] (each with name, device and devices)")
    pools: list[Pool] = []
    for i, raw in enumerate(raw_pools, start=1):
        if not isinstance(raw, dict):
            raise ClusterFileError(f"{where}: pool {i} is not a table")
        missing = [k for k in ("name", "device", "devices") if k not in raw]
        if missing:
            raise ClusterFileError(f"{where}: pool {i} has no {missing[0]!r}")
        unknown = sorted(set(raw) - {"name", "device", "devices"})
        if unknown:
            raise ClusterFileError(f"{where}: pool {raw['name']!r}: unknown key {unknown[0]!r}")
        name, device, count = raw["name"], raw["device"], raw["devices"]
        if not isinstance(name, str) or not name:
            raise ClusterFileError(f"{where}: pool {i}: name must be a non-empty string")
        if device not in known_devices:
            raise ClusterFileError(
                f"{where}: pool {name!r}: unknown device {device!r} (known: {', '.join(sorted(known_devices))})"
            )
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ClusterFileError(f"{where}: pool {name!r}: devices must be a whole number >= 1, got {count!r}")
        if any(p.name == name for p in pools):
            raise ClusterFileError(f"{where}: two pools named {name!r}")
        pools.append(Pool(name, device, count))
    links = _links(data.get("links", []), {p.name for p in pools}, where)
    _check_connected(pools, links, where)
    return MixedCluster(tuple(pools), tuple(links))


def _links(raw_links: Any, names: set[str], where: str) -> list[Link]:
    if not isinstance(raw_links, list):
        raise ClusterFileError(f"{where}: links must be [[links]] tables")
    links: list[Link] = []
    for i, raw in enumerate(raw_links, start=1):
        if not isinstance(raw, dict):
            raise ClusterFileError(f"{where}: link {i} is not a table")
        unknown = sorted(set(raw) - {"pools", "GBps", "latency_us"})
        if unknown:
            raise ClusterFileError(f"{where}: link {i}: unknown key {unknown[0]!r} (known: pools, GBps, latency_us)")
        ends = raw.get("pools")
        if not (isinstance(ends, list) and len(ends) == 2 and all(isinstance(e, str) for e in ends)):
            raise ClusterFileError(f'{where}: link {i}: pools must name two pools, e.g. pools = ["a", "b"]')
        for end in ends:
            if end not in names:
                raise ClusterFileError(f"{where}: link {i} names pool {end!r}, which no [[pools]] defines")
        if ends[0] == ends[1]:
            raise ClusterFileError(f"{where}: link {i} joins pool {ends[0]!r} to itself")
        bw = raw.get("GBps")
        if not isinstance(bw, int | float) or isinstance(bw, bool) or not (bw > 0 and math.isfinite(bw)):
            raise ClusterFileError(f"{where}: link {i} ({ends[0]}-{ends[1]}): GBps must be a positive number")
        lat = raw.get("latency_us", 0.0)
        if not isinstance(lat, int | float) or isinstance(lat, bool) or not (lat >= 0 and math.isfinite(lat)):
            raise ClusterFileError(f"{where}: link {i} ({ends[0]}-{ends[1]}): latency_us must be 0 or more")
        links.append(Link(ends[0], ends[1], float(bw), float(lat) * 1e-6))
    return links


def _check_connected(pools: list[Pool], links: list[Link], where: str) -> None:
    """Every pool must reach every other through links (the gradient reduction crosses them)."""
    if len(pools) < 2:
        return
    reach = {pools[0].name}
    grew = True
    while grew:
        grew = False
        for link in links:
            if (link.a in reach) != (link.b in reach):
                reach |= {link.a, link.b}
                grew = True
    cut = [p.name for p in pools if p.name not in reach]
    if cut:
        raise ClusterFileError(
            f"{where}: no link between pools {pools[0].name!r} and {cut[0]!r} (add a [[links]] entry "
            f'with pools = ["{pools[0].name}", "{cut[0]}"], GBps and latency_us)'
        )


# -- costing ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolRun:
    """One pool at one share of the batch: its replicas, micro-batches per replica and their size, the compiled
    step."""

    pool: Pool
    replicas: int
    microbatches: int
    step_s: float
    fits: bool
    peak_bytes: int
    warnings: tuple[str, ...] = ()  # the pool's compile's (shown once for the cluster, not per pool)
    micro_batch: int = 1
    capacity_bytes: int = 0  # a device's memory

    def as_dict(self) -> dict[str, Any]:
        return {"pool": self.pool.name, "device": self.pool.device, "devices": self.pool.devices,
                "replicas": self.replicas, "microbatches_per_replica": self.microbatches,
                "micro_batch": self.micro_batch, "step_s": self.step_s, "fits": self.fits,
                "peak_bytes": self.peak_bytes}  # fmt: skip


def _compile_pool(model: Any, plan: Any, pool: Pool, replicas: int, microbatches: int, micro_batch: int = 0) -> PoolRun:
    from echosim.compiler import lower
    from echosim.plan import Cluster

    size = micro_batch or plan.micro_batch
    p = replace(plan, dp=replicas, micro_batch=size, global_batch=replicas * microbatches * size)
    report = lower(model, p, Cluster(pool.device, pool.devices)).report
    peak = max(int(m["peak"]) for m in report.memory)
    capacity = min(int(m["capacity"]) for m in report.memory)
    return PoolRun(pool, replicas, microbatches, report.step_time_s, report.fits, peak, tuple(report.warnings), size,
                   capacity)  # fmt: skip


#: The most steps a replica's micro-batch is split into when samples are balanced (:func:`_balance_samples`).
MAX_SAMPLE_STEPS = 256


def _balance_samples(model: Any, plan: Any, naive: list[PoolRun], replicas: list[int]) -> list[PoolRun]:
    """Each replica runs its share in one micro-batch (an image or recommendation model at its whole batch): no
    whole micro-batch can move, so the samples of that micro-batch are split instead. Each pool's step is taken
    as affine in its micro-batch, through its compiled step at the naive size and at half of it (the fixed part:
    the optimizer, the gradient reduction), and so is its peak memory (the activations grow with the batch, the
    state does not): water-filled over the samples of the sizes predicted to fit, then compiled at its share."""
    size = plan.micro_batch
    half = [_compile_pool(model, plan, run.pool, run.replicas, 1, size // 2) for run in naive]

    def affine(a: float, b: float, s: int) -> float:  # through (size // 2, b) and (size, a)
        return a + max(0.0, a - b) / (size - size // 2) * (s - size)

    def predicted(i: int, s: int) -> float:
        run = naive[i]
        if run.fits and affine(run.peak_bytes, half[i].peak_bytes, s) > run.capacity_bytes:
            return math.inf
        return affine(run.step_s, half[i].step_s, s)

    # in steps of the smallest divisor of the size that leaves at most MAX_SAMPLE_STEPS of them (the subset sum's
    # bit sets grow with the steps: a DLRM replica of 65,536 samples moves them 256 at a time)
    unit = next(u for u in range(1, size + 1) if size % u == 0 and size // u <= MAX_SAMPLE_STEPS)
    steps = water_fill(size // unit * sum(replicas), replicas, lambda i, k: predicted(i, k * unit))
    shares = [k * unit for k in steps] if steps else [size] * len(replicas)
    return [
        run if s == size else _compile_pool(model, plan, run.pool, run.replicas, 1, s)
        for run, s in zip(naive, shares, strict=True)
    ]


def cross_pool_sync_s(cluster: MixedCluster, replica_grad_bytes: float) -> float:
    """A ring all-reduce of one replica's gradients over the pools, at the slowest link."""
    k = len(cluster.pools)
    link = cluster.slowest_link()
    if k < 2 or link is None:
        return 0.0
    return 2.0 * (k - 1) / k * replica_grad_bytes / (link.GBps * 1e9) + 2 * (k - 1) * link.latency_s


def water_fill(total: int, replicas: list[int], time_of: Any) -> list[int] | None:
    """Micro-batches per replica of each pool, summing to ``total`` over all replicas, least max time first.

    ``time_of(i, m)``: predicted step of pool ``i`` at ``m`` micro-batches per replica (increasing in m).
    Exact: the least makespan whose per-pool limits still admit a split of whole micro-batches that adds
    up (a bounded subset sum, as bit sets), found by bisection over the candidate times. ``None`` when
    no split adds up.
    """
    caps = [total // r for r in replicas]
    if any(c < 1 for c in caps):
        return None
    candidates = sorted({time_of(i, m) for i, c in enumerate(caps) for m in range(1, c + 1)})

    def split(limit: float) -> list[int] | None:
        most = [max((m for m in range(1, c + 1) if time_of(i, m) <= limit), default=0) for i, c in enumerate(caps)]
        if not all(most):
            return None
        full = (1 << (total + 1)) - 1
        layers = [1]  # bit s set: s micro-batches reachable with the pools so far
        for r, top in zip(replicas, most, strict=True):
            reach, nxt = layers[-1], 0
            for m in range(1, top + 1):
                nxt |= reach << (r * m)
            layers.append(nxt & full)
        if not layers[-1] >> total & 1:
            return None
        out, s = [], total  # walk back: the largest share of each pool (last first) that still reaches
        for i in range(len(replicas) - 1, -1, -1):
            m = next(
                m for m in range(most[i], 0, -1) if s - replicas[i] * m >= 0 and layers[i] >> (s - replicas[i] * m) & 1
            )
            out.append(m)
            s -= replicas[i] * m
        return out[::-1]

    lo, hi = 0, len(candidates) - 1
    if split(candidates[hi]) is None:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if split(candidates[mid]) is None:
            lo = mid + 1
        else:
            hi = mid
    return split(candidates[lo])


def mixed_step(model: Any, plan: Any, cluster: MixedCluster) -> dict[str, Any]:
    """The naive (equal) and the balanced (speed-proportional) split of the batch over the pools."""
    from echosim.dynamics.lowcomm import PSEUDO_GRADIENT_BYTES

    per_replica = plan.tp * plan.pp * plan.cp
    replicas = []
    for pool in cluster.pools:
        if pool.devices % per_replica:
            raise ClusterFileError(
                f"pool {pool.name!r}: {pool.devices} devices do not divide into replicas of tp*pp*cp = {per_replica}"
            )
        replicas.append(pool.devices // per_replica)
    total_mb = plan.batch // plan.micro_batch if plan.global_batch else sum(replicas)
    if plan.global_batch and plan.global_batch % plan.micro_batch:
        raise EchosimError(f"--global-batch {plan.global_batch} is not a multiple of --micro-batch {plan.micro_batch}")
    all_replicas = sum(replicas)
    if total_mb % all_replicas:
        raise EchosimError(
            f"--global-batch {plan.global_batch}: {total_mb} micro-batches do not split equally over "
            f"{all_replicas} replicas (the naive split needs a multiple of {all_replicas * plan.micro_batch})"
        )
    equal = total_mb // all_replicas
    naive = [_compile_pool(model, plan, pool, r, equal) for pool, r in zip(cluster.pools, replicas, strict=True)]
    # 1F1B: a step is about (m + pp - 1) micro-batch slots; scale each pool's compiled step by that
    slots = plan.pp - 1

    def predicted(i: int, m: int) -> float:
        return naive[i].step_s * (m + slots) / (equal + slots)

    if equal == 1 and plan.micro_batch > 1:
        try:
            balanced = _balance_samples(model, plan, naive, replicas)
        except EchosimError:  # a size the layout cannot run (the naive one can): the naive split stands
            balanced = naive
    else:
        shares = water_fill(total_mb, replicas, predicted) or [equal] * len(replicas)
        balanced = [
            run if m == equal else _compile_pool(model, plan, run.pool, run.replicas, m)
            for run, m in zip(naive, shares, strict=True)
        ]
    slower = max(r.step_s for r in balanced) > max(r.step_s for r in naive)  # predicted better, compiled worse
    if slower or (all(r.fits for r in naive) and not all(r.fits for r in balanced)):  # or out of memory
        balanced = naive
    local_params = _replica_params(model, plan)
    replica_grad = local_params * PSEUDO_GRADIENT_BYTES  # fp32 gradients of one whole replica
    sync = cross_pool_sync_s(cluster, replica_grad)
    naive_step = max(r.step_s for r in naive) + sync
    balanced_step = max(r.step_s for r in balanced) + sync
    return {
        "pools": [{"name": p.name, "device": p.device, "devices": p.devices} for p in cluster.pools],
        "links": [{"pools": [x.a, x.b], "GBps": x.GBps, "latency_s": x.latency_s} for x in cluster.links],
        "devices": cluster.devices,
        "micro_batches": total_mb,
        "cross_pool_sync_s": sync,
        "naive": {"step_s": naive_step, "pools": [r.as_dict() for r in naive]},
        "balanced": {"step_s": balanced_step, "pools": [r.as_dict() for r in balanced]},
        "speedup": naive_step / balanced_step,
        "fits": all(r.fits for r in balanced),
        "warnings": list(dict.fromkeys(w for r in (*naive, *balanced) for w in r.warnings)),
    }


def _replica_params(model: Any, plan: Any) -> int:
    """Parameters of the whole model (one replica holds all of them across its tp x pp ranks)."""
    from echosim.compiler import load_model

    graph, _, total = load_model(model, plan)
    return int(total or graph.param_count())


def render(result: dict[str, Any]) -> list[str]:
    lines = [f"{result['devices']:,} devices in {len(result['pools'])} pools, {result['micro_batches']} micro-batches "
             f"per step; gradient sync across pools {result['cross_pool_sync_s']:.4g} s"]  # fmt: skip
    for key in ("naive", "balanced"):
        split = result[key]
        parts = ", ".join(
            f"{r['pool']} ({r['device']}) {_share(r, result)} x {r['replicas']} replicas: {r['step_s']:.4g} s"
            for r in split["pools"]
        )
        lines.append(f"{key:>8} split: step {split['step_s']:.4g} s  [{parts}]")
    lines.append(f"balanced is {result['speedup']:.3f}x the naive equal split")
    return lines + warning_lines(result)


def _share(run: dict[str, Any], result: dict[str, Any]) -> str:
    """A replica's share: its micro-batches, or the size of its one micro-batch where the split moved samples."""
    sizes = {r["micro_batch"] for key in ("naive", "balanced") for r in result[key]["pools"]}
    if len(sizes) > 1:
        return f"{run['micro_batch']} samples"
    return f"{run['microbatches_per_replica']} mb"


def warning_lines(result: dict[str, Any]) -> list[str]:
    """What the compiles behind a result warn of, as ``compile`` prints it."""
    return [f"warning: {w}" for w in result.get("warnings", ())]


# -- pipeline stages across pools -------------------------------------------------------------------------


def _stage_time(
    units: list[tuple[Any, int]], total: float, layers: int, n: int, graph: Any = None, b_units: int = 3
) -> float:
    """A stage's fwd (or bwd) with ``n`` repeated layers instead of ``layers``: its block unit (the second
    of before / block / after, :func:`echosim.timeline.lower._units`) run ``k - layers + n`` times. Under
    ``full:N`` or ``full:every-N`` a backward has two block units (the layers that keep their activations, then
    the replayed ones: ``b_units`` 4; ``graph``, the stage's, says how many of ``n`` replay)."""
    from echosim.timeline.lower import repeated

    if len(units) < 3 or layers < 1:
        return total
    if graph is not None and b_units == 4:
        (plain, kept), (replay, replayed) = units[1], units[2]
        again = graph.replayed_of(next(iter(graph.repeats)), n)
        return (total - repeated(plain, kept) - repeated(replay, replayed)
                + repeated(plain, n - again) + repeated(replay, again))  # fmt: skip
    unit, k = units[1]
    return total - repeated(unit, k) + repeated(unit, max(0, k - layers + n))


def _boundary_bytes(graph: Any) -> tuple[int, int]:
    """Bytes a stage sends forwards and backwards to its pipeline neighbours (one micro-batch)."""
    from echosim.ir.ops import OpKind, Phase, Role

    fwd = bwd = 0
    for n in graph:
        if n.op is OpKind.SEND and getattr(n.attrs, "role", None) is Role.PIPELINE:
            if n.phase is Phase.FORWARD:
                fwd += n.out.nbytes
            else:
                bwd += n.out.nbytes
    return fwd, bwd


def pipeline_step(model: Any, plan: Any, cluster: MixedCluster) -> dict[str, Any]:
    """Pipeline stages laid over the pools in file order, layers split evenly against split to speed.

    Each pool holds ``pp * devices / total`` consecutive stages of every replica. The model is
    compiled once per pool's device with the whole layout; a stage's forward and backward come from
    its own pool's compile, its repeated block run for the stage's layer count (the unit simulated op
    by op, :func:`echosim.timeline.lower.repeated`), and a transfer that crosses pools goes over the
    slowest link shared by every sender of the boundary. The schedule composer then times the step.
    """
    from echosim import plugins
    from echosim.compiler import lower
    from echosim.plan import Cluster
    from echosim.timeline.composer import time_schedule
    from echosim.timeline.lower import StepOptions, step_plan
    from echosim.timeline.schedule import on_stages

    if plan.vpp != 1:
        raise EchosimError("--split pipeline: interleaved stages (--vpp > 1) are not laid across pools")
    if plan.pp < 2:
        raise EchosimError("--split pipeline needs --pp 2 or more (stages to lay across the pools)")
    if plan.schedule == "dualpipe":
        raise EchosimError("--split pipeline: dualpipe runs every stage on two ranks; use 1f1b or gpipe")
    total = cluster.devices
    per_stage = plan.tp * plan.cp * plan.dp
    if plan.pp * per_stage != total:
        raise EchosimError(
            f"--split pipeline: tp*cp*dp*pp = {plan.pp * per_stage} but the cluster file has {total} devices"
        )
    owner: list[int] = []
    for i, pool in enumerate(cluster.pools):
        if pool.devices % per_stage:
            raise ClusterFileError(
                f"pool {pool.name!r}: {pool.devices} devices do not hold whole stages of tp*cp*dp = {per_stage}"
            )
        owner += [i] * (pool.devices // per_stage)
    compiled = [lower(model, plan, Cluster(pool.device, total)) for pool in cluster.pools]
    costs = [compiled[owner[s]].costed.stages[s] for s in range(plan.pp)]
    if any(c.wgrad for c in costs):
        raise EchosimError(f"--split pipeline: schedule {plan.schedule!r} defers weight gradients; use 1f1b or gpipe")
    layers = [c.layers for c in costs]  # repetitions of the repeated block (the unit a split moves)
    # reported as layers: the block's layers per repetition (a split moves repetitions)
    per_block = [max((c.graph.layers_per_block(p) for p in c.graph.repeats), default=1) for c in costs]
    fixed = [c.graph.unfolded_layers() for c in costs]  # layers outside the block stay on their stage
    repeat = sum(layers)

    def stage(s: int, n: int) -> tuple[float, float]:
        c = costs[s]
        return (
            _stage_time(c.fwd_units, c.fwd, c.layers, n),
            _stage_time(c.bwd_units, c.bwd + c.wgrad, c.layers, n, c.graph, c.b_units),
        )

    link = cluster.slowest_link()
    replicas = plan.cp * plan.dp  # every replica sends one activation over the boundary
    widen = plan.tp if plan.sp else 1  # with sequence parallelism each tp rank sends 1/tp of it

    def p2p(s: int) -> tuple[float, float]:
        c = costs[s]
        if s + 1 >= plan.pp or owner[s] == owner[s + 1] or link is None:
            return c.p2p_fwd, c.p2p_bwd
        fwd_bytes, _ = _boundary_bytes(c.graph)
        _, bwd_bytes = _boundary_bytes(costs[s + 1].graph)
        over = lambda b: b * widen * replicas / (link.GBps * 1e9) + link.latency_s  # noqa: E731
        return max(c.p2p_fwd, over(fwd_bytes)), max(costs[s + 1].p2p_bwd, over(bwd_bytes))

    schedules = {name: entry.value for name, entry in plugins.get_registry().schedules.items()}
    options = StepOptions(
        schedule=on_stages(schedules[plan.schedule], plan.pp), pp=plan.pp, microbatches=plan.microbatches
    )
    splan = step_plan(options)

    def timed(split: list[int]) -> dict[str, Any]:
        fb = [stage(s, n) for s, n in enumerate(split)]
        links = [p2p(s) for s in range(plan.pp)]
        timing = time_schedule(splan, [f for f, _ in fb], [b for _, b in fb], [x for x, _ in links],
                               [y for _, y in links]).layout(0)  # fmt: skip
        tails = [(costs[s].dp_copies + costs[s].dp_exposed + costs[s].step_end + costs[s].optimizer)
                 * split[s] / max(1, layers[s]) for s in range(plan.pp)]  # fmt: skip
        step = max(end + tail for end, tail in zip(timing.rank_ends, tails, strict=True))
        rows = [{"stage": s, "pool": cluster.pools[owner[s]].name, "device": cluster.pools[owner[s]].device,
                 "layers": split[s] * per_block[s] + fixed[s], "fwd_s": fb[s][0], "bwd_s": fb[s][1],
                 **memory(s, split[s])}
                for s in range(plan.pp)]  # fmt: skip
        return {"step_s": step, "stages": rows, "fits": all(r["fits"] for r in rows)}

    def memory(s: int, n: int) -> dict[str, Any]:
        """The stage's compiled peak with its per-layer parts (state, activations) scaled to ``n`` layers."""
        row = compiled[owner[s]].report.memory[s]
        scale = n / max(1, layers[s])
        layered = sum(row[k] for k in ("params", "grads", "optimizer", "activations"))
        peak = int(row["peak"] + layered * (scale - 1))
        return {"peak_bytes": peak, "fits": peak <= row["capacity"]}

    naive = timed(layers)
    per_mb = lambda s, n: sum(stage(s, n))  # noqa: E731
    balanced_split = water_fill(repeat, [1] * plan.pp, per_mb) or layers
    balanced = timed(balanced_split)
    return {
        "split": "pipeline",
        "pools": [{"name": p.name, "device": p.device, "devices": p.devices} for p in cluster.pools],
        "devices": total,
        "microbatches": plan.microbatches,
        "naive": naive,
        "balanced": balanced,
        "speedup": naive["step_s"] / balanced["step_s"],
        "fits": balanced["fits"],
        "warnings": list(dict.fromkeys(w for c in compiled for w in c.report.warnings)),
    }


def render_pipeline(result: dict[str, Any]) -> list[str]:
    lines = [f"{result['devices']:,} devices in {len(result['pools'])} pools, pipeline stages laid across them, "
             f"{result['microbatches']} micro-batches"]  # fmt: skip
    for key in ("naive", "balanced"):
        split = result[key]
        parts = ", ".join(
            f"{r['pool']} {r['layers']} layers ({r['fwd_s'] + r['bwd_s']:.4g} s)" for r in split["stages"]
        )
        lines.append(f"{key:>8} split: step {split['step_s']:.4g} s  [{parts}]")
    lines.append(f"balanced is {result['speedup']:.3f}x the naive equal split")
    return lines + warning_lines(result)
