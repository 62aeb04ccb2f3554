"""Re-planning: when devices come or go, the best layout for the new count and what the switch costs.

Two ways to go on after the device count changes from N to N': keep the model-parallel shape
(tp, pp, cp) and let data parallelism take what is left (``keep``), or take the best layout a
search finds for N' (``best``, :func:`echosim.layout_search.search` over tp, pp and dp unless
``space`` widens it). Where the kept shape cannot take all N' devices because their ranks cannot share the batch,
it may still run on fewer of them, the rest idle (``keep_fewer``: growing, that is the old layout itself). Each
costs a switch: every device must end up holding its new share of the
weights and optimizer state (a checkpoint's bytes, :func:`~echosim.dynamics.goodput.checkpoint_bytes`).

What a device already holds is counted in closed form. The state is a box cut three ways:
layers into ``pp`` contiguous ranges, each layer's tensors into ``tp`` slices, and (ZeRO) the
optimizer state into ``dp`` slices; ranks are numbered tp fastest, then dp, then pp (Megatron's
order, :mod:`echosim.backends.topology`). Rank ``r`` keeps the overlap of its old and new boxes
and receives the rest; the switch takes as long as the device that receives the most, over one
point-to-point transfer across nodes on the backend's own model. Sharded embedding tables move by their
placements instead (:func:`table_moves`). A re-plan pays for itself after
``(switch_best - switch_keep) / (step_keep - step_best)`` steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from echosim.errors import EchosimError


@dataclass(frozen=True)
class Shape:
    """How the state is cut: pipeline stages, tensor slices, data-parallel ranks and the ZeRO stage."""

    tp: int
    pp: int
    dp: int
    zero: int

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def coords(self, rank: int) -> tuple[int, int, int]:
        return rank % self.tp, (rank // self.tp) % self.dp, rank // (self.tp * self.dp)


def _overlap(i: int, n: int, j: int, m: int) -> float:
    """Length of [i/n, (i+1)/n) and [j/m, (j+1)/m) in common."""
    return max(0.0, min((i + 1) / n, (j + 1) / m) - max(i / n, j / m))


def held_fractions(shape: Shape, rank: int) -> tuple[float, float]:
    """(weights, optimizer state) a rank holds, as fractions of the whole model's."""
    weights = 1.0 / (shape.tp * shape.pp) / (shape.dp if shape.zero >= 3 else 1)
    optimizer = 1.0 / (shape.tp * shape.pp) / (shape.dp if shape.zero >= 1 else 1)
    return weights, optimizer


def kept(old: Shape, new: Shape, rank: int) -> tuple[float, float]:
    """Fractions of the model's (weights, optimizer state) that ``rank`` holds in both layouts."""
    if rank >= old.world:
        return 0.0, 0.0
    t0, d0, p0 = old.coords(rank)
    t1, d1, p1 = new.coords(rank)
    box = _overlap(p0, old.pp, p1, new.pp) * _overlap(t0, old.tp, t1, new.tp)

    def dp_part(sharded_old: bool, sharded_new: bool) -> float:
        if sharded_new and sharded_old:
            return _overlap(d0, old.dp, d1, new.dp)
        if sharded_new:  # replicated before: the new slice is all there
            return 1.0 / new.dp
        if sharded_old:  # sharded before, replicated now: only the old slice is here
            return 1.0 / old.dp
        return 1.0

    return (
        box * dp_part(old.zero >= 3, new.zero >= 3),
        box * dp_part(old.zero >= 1, new.zero >= 1),
    )


def reshard(
    old: Shape, new: Shape, weight_bytes: float, optimizer_bytes: float, tables: list[float] | None = None
) -> dict[str, float]:
    """Bytes the new layout's devices must receive (total, and the most any one device receives); ``tables``: each
    new rank's bytes of sharded embedding tables besides (:func:`table_moves`)."""
    total = most = 0.0
    for rank in range(new.world):
        w_need, o_need = held_fractions(new, rank)
        w_kept, o_kept = kept(old, new, rank)
        got = (w_need - w_kept) * weight_bytes + (o_need - o_kept) * optimizer_bytes
        got = got if got > 1e-12 * (weight_bytes + optimizer_bytes) else 0.0  # rounding of equal slices
        got += tables[rank] if tables else 0.0
        total += got
        most = max(most, got)
    return {"bytes": total, "max_device_bytes": most}


def _part(rows: int, cols: int, t: Any, index: int, kind: str) -> tuple[float, float, float, float]:
    """The part of table ``t`` a rank's shards hold, as ``(row0, row1, col0, col1)`` fractions of the table.

    Row-wise shard ``index`` holds rows ``[index * rows, (index + 1) * rows)`` (TorchRec's even split); table- and
    column-wise shards hold whole rows of ``cols`` columns (which columns is not kept: a rank keeps those it held
    where it needs as many, the least a switch moves); a replicated table is whole everywhere."""
    if kind in ("row", "table_row"):
        return min(1.0, index * rows / t.rows), min(1.0, (index + 1) * rows / t.rows), 0.0, 1.0
    return 0.0, 1.0, 0.0, cols / t.dim


Holding = dict[int, tuple[float, tuple[float, float, float, float]]]  # table -> (bytes with its state, part held)


def table_holdings(placement: Any, tables: list[Any], host: int) -> list[Holding]:
    """For each data-parallel rank of an embedding placement, the bytes of each table it holds and which part."""
    out: list[Holding] = []
    for rank, shards in enumerate(placement.ranks):
        held: Holding = {}
        for i in dict.fromkeys(s.table for s in shards):
            mine = [s for s in shards if s.table == i]
            kind = mine[0].kind
            index = rank if kind == "row" else rank % host
            part = _part(mine[0].rows, sum(s.cols for s in mine), tables[i], index, kind)
            held[i] = (float(sum(s.storage(tables[i]) for s in mine)), part)
        out.append(held)
    return out


def table_moves(old: list[Holding], new: list[Holding]) -> list[float]:
    """Bytes of embedding tables (rows and their optimizer state) each rank receives: what it holds in the new
    placement less the part of the same table it held in the old one."""
    out = []
    for rank, held in enumerate(new):
        before = old[rank] if rank < len(old) else {}
        got = 0.0
        for i, (nbytes, (r0, r1, c0, c1)) in held.items():
            area = (r1 - r0) * (c1 - c0)
            if area <= 0:  # a row-wise shard past a small table's last row: nothing of it to receive
                continue
            if i in before:
                _, (q0, q1, d0, d1) = before[i]
                common = max(0.0, min(r1, q1) - max(r0, q0)) * max(0.0, min(c1, d1) - max(c0, d0))
                share = 1 - common / area
                got += nbytes * share if share > 1e-9 else 0.0  # rounding of equal shards
            else:
                got += nbytes
        out.append(got)
    return out


def switch_time_s(backend: Any, max_device_bytes: float, devices_per_node: int) -> float:
    """The device that receives the most, over its network link (the backend's point-to-point model)."""
    from echosim.backends.base import Placement
    from echosim.ir.ops import OpKind

    if max_device_bytes <= 0:
        return 0.0
    chunk = 2**30  # in 1 GiB transfers: the backend's model is for one message
    whole, rest = divmod(int(max_device_bytes), chunk)
    place = Placement(2, 2, 1, devices_per_node)
    t = whole * backend.collective_time_s(OpKind.SEND, chunk, place) if whole else 0.0
    return t + (backend.collective_time_s(OpKind.SEND, rest, place) if rest else 0.0)


def replan(
    model: str,
    plan: Any,
    cluster: Any,
    devices: int,
    space: dict[str, tuple[Any, ...]] | None = None,
    memory_fraction: float = 1.0,
) -> dict[str, Any]:
    """The old layout, keeping its shape on ``devices``, the best layout there, and each switch's cost.

    The global batch is the old layout's, on every layout compared: a batch left to dp x micro-batch is pinned
    to what it was, or the kept shape and the best layout would each run a batch of their own (ResNet-50 from 8
    to 12 devices at micro-batch 256: 3,072 images kept against 6,144 found, steps that compare nothing)."""
    from echosim.compiler import _backend, lower, resolve_cluster
    from echosim.dynamics.goodput import checkpoint_bytes
    from echosim.frameworks import get_framework
    from echosim.layout_search import batch_shares, evaluate, search
    from echosim.passes.memory import StatePolicy
    from echosim.plugins import get_registry

    if devices < 1:
        raise EchosimError(f"--devices must be at least 1, got {devices}")
    plan = replace(plan, global_batch=plan.batch)
    old_report = lower(model, plan, cluster).report
    backend = _backend(cluster.backend, get_registry())
    new_cluster = resolve_cluster(replace(cluster, devices=devices, devices_per_node=0), get_registry(), backend)
    framework = get_framework(plan.framework).state(plan.pp)
    state = StatePolicy.for_training(plan.dtype, 0, 1, optimizer_dtypes=plan.optimizer_dtypes, **framework)
    params = old_report.params
    tables = _sharded_tables(model, plan)
    dense = params - sum(t.rows * t.dim for t in tables)  # the tables move by their placements (table_moves)
    weight_bytes, opt_bytes = dense * state.weight_bytes, dense * state.optimizer_bytes
    old_shape = Shape(plan.tp, plan.pp, plan.dp * plan.cp, plan.zero)
    capacity = backend.memory_bytes()

    def holdings(p: Any, shape: Shape, node: int) -> list[Holding]:
        """Each rank's tables: its data-parallel index's shards on the first pipeline stage (the embeddings'),
        placed as compile places them on a (resolved) node of ``node`` devices."""
        from echosim.passes.embedding_sharding import host_size, place

        held = table_holdings(place(tables, p.embedding_sharding, p.dp, node, capacity), tables, host_size(p.dp, node))
        step = shape.dp // p.dp
        return [held[d // step] if stage == 0 else {} for _, d, stage in map(shape.coords, range(shape.world))]

    # the node the old layout's compile placed the tables on (a cluster given without one takes the backend's)
    old_node = resolve_cluster(cluster, get_registry(), backend).devices_per_node
    old_tables = holdings(plan, old_shape, old_node) if tables else []

    def switch(p: Any) -> dict[str, float]:
        shape = Shape(p.tp, p.pp, p.dp * p.cp, p.zero)
        moves = table_moves(old_tables, holdings(p, shape, new_cluster.devices_per_node)) if tables else None
        moved = reshard(old_shape, shape, weight_bytes, opt_bytes, moves)
        t = switch_time_s(backend, moved["max_device_bytes"], new_cluster.devices_per_node)
        return {**moved, "time_s": t}

    def row(p: Any, step: float | None, reason: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {"tp": p.tp, "pp": p.pp, "dp": p.dp, "cp": p.cp, "zero": p.zero,
                               "micro_batch": p.micro_batch, "step_time_s": step}  # fmt: skip
        if p.embedding_sharding != "none":  # a search over --space embedding_sharding=... may change it
            out["embedding_sharding"] = p.embedding_sharding
        if reason:
            out["reason"] = reason
        else:
            out["switch"] = switch(p)
        return out

    keep_rank = plan.tp * plan.pp * plan.cp
    # a model without token sequences that runs each device's whole batch at once (DLRM, ResNet) goes on doing so:
    # its micro-batch is the global batch's share of the new data-parallel degree, not the old share
    whole = not old_report.tokens_per_s and plan.microbatches == 1

    def kept_shape(dp: int) -> Any:
        kp = replace(plan, dp=dp)
        if whole and plan.batch % dp == 0:
            kp = replace(kp, micro_batch=plan.batch // dp)
        return kp

    def divides(dp: int) -> bool:
        """Whether ``dp`` ranks of the kept shape run the batch in whole micro-batches."""
        return plan.batch % (dp * kept_shape(dp).micro_batch) == 0

    keep: dict[str, Any]
    if devices % keep_rank:
        keep = {"reason": f"{devices} devices do not divide into tp*pp*cp = {keep_rank}"}
    else:
        kp = kept_shape(devices // keep_rank)
        done = evaluate(model, kp, new_cluster, memory_fraction)
        keep = row(kp, done.step_time_s, "" if done.ok else done.reason or "does not fit")
    # the shape on fewer devices than there are, the rest idle, where it cannot run on all of them: the largest
    # data-parallel degree whose ranks divide the batch (growing, that is the old layout itself: nothing moves)
    fewer: dict[str, Any] | None = None
    if "switch" not in keep:
        dp = next((d for d in range(devices // keep_rank, 0, -1) if d * keep_rank < devices and divides(d)), 0)
        if dp:
            used = resolve_cluster(
                replace(cluster, devices=dp * keep_rank, devices_per_node=0), get_registry(), backend
            )
            kp = kept_shape(dp)
            done = evaluate(model, kp, used, memory_fraction)
            if done.ok:
                fewer = {**row(kp, done.step_time_s), "devices": dp * keep_rank}
    defaults = {"zero": (plan.zero,), "recompute": (plan.recompute,), "schedule": (plan.schedule,),
                "sp": (plan.sp,), "tp_overlap": (plan.tp_overlap,), "vpp": (1,), "cp": (plan.cp,), "ep": (plan.ep,),
                "mb": batch_shares(plan.batch, devices) if whole else (plan.micro_batch,)}  # fmt: skip
    try:
        result = search(model, plan, new_cluster, space={**defaults, **(space or {})}, memory_fraction=memory_fraction)
    except EchosimError as exc:  # no layout of every device runs the batch: the shape on fewer of them still may
        if fewer is None:
            raise
        best: dict[str, Any] = {"reason": str(exc)}
        simulated, warnings = 0, []
    else:
        if result.best is None:
            if fewer is None:
                raise EchosimError(
                    f"no layout of {model} fits on {devices} x {cluster.backend} (echosim search lists why)"
                )
            best = {"reason": "no layout fits (echosim search lists why)"}
            warnings = []
        else:
            best = row(result.best.plan, result.best.step_time_s)
            # what compile warns of for the best layout (a search's batched costing reads none)
            warnings = list(lower(model, result.best.plan, new_cluster).report.warnings)
        simulated = result.simulated
    out: dict[str, Any] = {
        "model": model,
        "backend": cluster.backend,
        "from": {"devices": cluster.devices, "fits": old_report.fits, **row(plan, old_report.step_time_s, "old")},
        "devices": devices,
        "checkpoint_bytes": checkpoint_bytes(params, plan.dtype, plan.framework, plan.pp, old_report.embedding_tables),
        "keep": keep,
        "best": best,
        "simulated": simulated,
        "warnings": warnings,
    }
    if fewer is not None:
        out["keep_fewer"] = fewer
    base = keep if "switch" in keep and keep["step_time_s"] is not None else fewer
    if base is not None and "switch" in best:
        gain = base["step_time_s"] - best["step_time_s"]
        extra = best["switch"]["time_s"] - base["switch"]["time_s"]
        out["step_gain_s"] = gain
        if gain > 0:
            out["payback_steps"] = max(0, math.ceil(extra / gain))
        else:
            out["payback_steps"] = 0 if extra <= 0 else None  # keeping the shape is as fast: never pays back
    elif base is None:
        out["payback_steps"] = 0  # the old shape cannot run here: re-planning is the only way on
    else:
        out["payback_steps"] = None  # no layout of every device: keeping the shape on fewer is the only way on
    out["from"].pop("reason", None)
    return out


def _sharded_tables(model: str, plan: Any) -> list[Any]:
    """The pooled embedding tables the plan shards (none without ``--embedding-sharding``)."""
    from echosim.compiler import _load_model
    from echosim.passes.embedding_sharding import find_tables
    from echosim.plugins import get_registry

    if plan.embedding_sharding == "none":
        return []
    return find_tables(_load_model(model, plan, get_registry())[0])


def render(r: dict[str, Any]) -> list[str]:
    from echosim.passes.embedding_sharding import LABELS

    def layout(x: dict[str, Any]) -> str:
        """The degrees, and what else differs from the old layout: its micro-batch, how its tables are sharded."""
        old = r["from"]
        return (
            f"TP {x['tp']} PP {x['pp']} DP {x['dp']}"
            + (f" CP {x['cp']}" if x["cp"] > 1 else "")
            + (f" ZeRO {x['zero']}" if x["zero"] else "")
            + (f", micro-batch {x['micro_batch']}" if x["micro_batch"] != old["micro_batch"] else "")
            + (f", {LABELS.get(x['embedding_sharding'], 'auto-sharded')} tables" if "embedding_sharding" in x else "")
        )

    def switch(x: dict[str, Any]) -> str:
        s = x["switch"]
        most = s["max_device_bytes"] / 1e9
        return f"switch moves {s['bytes'] / 1e9:,.4g} GB ({most:.4g} GB to the busiest device), {s['time_s']:.4g} s"

    f = r["from"]
    fits = "" if f.get("fits", True) else " (does not fit in memory: `echosim compile` with these flags says where)"
    lines = [f"from {layout(f)} on {f['devices']:,} x {r['backend']}: step {f['step_time_s']:.4g} s{fits}"]
    keep = r["keep"]
    if "switch" in keep:
        lines.append(
            f"keep the shape on {r['devices']:,}: {layout(keep)}: step {keep['step_time_s']:.4g} s; {switch(keep)}"
        )
    else:
        lines.append(f"keep the shape on {r['devices']:,}: not possible ({keep['reason']})")
    fewer = r.get("keep_fewer")
    if fewer is not None:
        idle = r["devices"] - fewer["devices"]
        lines.append(
            f"keep the shape on {fewer['devices']:,} of them ({idle:,} idle): {layout(fewer)}: step "
            f"{fewer['step_time_s']:.4g} s; {switch(fewer)}"
        )
    best = r["best"]
    simulated = f"{r['simulated']:,} layout{'s' if r['simulated'] != 1 else ''} simulated"
    if "switch" in best:
        lines.append(f"best on {r['devices']:,} ({simulated}): {layout(best)}: step "
                     f"{best['step_time_s']:.4g} s; {switch(best)}")  # fmt: skip
    else:
        lines.append(f"best on all {r['devices']:,}: none ({best['reason']})")
    pay = r["payback_steps"]
    base = keep if "switch" in keep else fewer
    same = base is not None and {k: v for k, v in best.items() if k not in ("switch", "devices")} == {
        k: v for k, v in base.items() if k not in ("switch", "devices")
    }
    on_fewer = f"on {fewer['devices']:,} of the {r['devices']:,} devices" if fewer is not None else ""
    if base is None:
        lines.append(f"re-planning is the only way on: the old shape cannot run on {r['devices']:,} devices")
    elif "switch" not in best:
        lines.append(f"keeping the shape {on_fewer} is the only way on: no layout of all {r['devices']:,} runs")
    elif same:
        lines.append("keeping the shape is the best layout found")
    elif base is fewer and r.get("step_gain_s", 0.0) <= 0:
        lines.append(
            f"keeping the shape {on_fewer} is faster than any layout of all of them "
            f"({fewer['step_time_s']:.4g} s against {best['step_time_s']:.4g} s a step)"
        )
    elif pay == 0:
        against = f" {on_fewer}" if base is fewer else "'s"
        lines.append(f"re-planning pays for itself at once: its switch costs no more than keeping the shape{against}")
    else:
        against = f" (against keeping the shape {on_fewer})" if base is fewer else ""
        lines.append(
            "re-planning pays for itself "
            + (f"after {pay:,} step{'s' if pay != 1 else ''}" if pay is not None else "never (no faster step)")
            + against
        )
    from echosim.dynamics.cluster import warning_lines

    return lines + warning_lines(r)
