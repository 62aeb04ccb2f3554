"""Turn CLI-style options into (model, Plan, Cluster), starting from the embedded default run."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from echosim.plan import Cluster, Plan

_CLUSTER_KEYS = {"backend", "devices", "devices_per_node", "calibration"}


def plan_from_options(model: str | None, opts: dict[str, Any]) -> tuple[str, Plan, Cluster]:
    """No model and no options: the published GPT-3 175B run. Otherwise options override."""
    from echosim.compiler import DEFAULT_CLUSTER, DEFAULT_MODEL, DEFAULT_PLAN

    given = {k: v for k, v in opts.items() if v is not None}
    if model is None:
        base_plan, base_cluster = DEFAULT_PLAN, DEFAULT_CLUSTER
    else:
        base_plan, base_cluster = Plan(), Cluster(devices=0)
    plan_keys = {f.name for f in fields(Plan)}
    plan = replace(base_plan, **{k: v for k, v in given.items() if k in plan_keys})
    cluster = replace(base_cluster, **{k: v for k, v in given.items() if k in _CLUSTER_KEYS})
    if cluster.devices == 0:
        cluster = replace(cluster, devices=plan.tp * plan.pp * plan.dp)
    return model or DEFAULT_MODEL, plan, cluster
