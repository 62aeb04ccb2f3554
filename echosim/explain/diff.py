"""Two reports term by term: step time, each kind of compute and communication, bubble, memory parts.

Reads report dictionaries (``Report.to_dict()`` or a saved ``--json``/``--out`` file), so two
saved reports and two freshly compiled layouts compare the same way. Each term that moved
names the layout settings it depends on that changed: why it moved.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from echosim.errors import EchosimError
from echosim.plan import Plan

GiB = 2**30
REPORT_KEYS = ("step_time_s", "breakdown", "memory", "plan", "model")

# What each term depends on: plan fields and derived settings (microbatches, layers_per_stage, backend,
# devices_per_node). A term that moved names those of them that changed. Keys ending in "." cover a family.
# moe_dispatcher and moe_pad_to_capacity decide Megatron-Core's fp8 alignment copies (passes.expert_parallel); the
# framework picks kernels (attention, loss, norms, layout copies), FP8 exchanges and what backward keeps
_COMPUTE = (
    "tp cp cp_comm cp_a2a ep sp micro_batch seq_len dtype recompute attention layers_per_stage moe_capacity_factor "
    "moe_dispatcher moe_pad_to_capacity framework"
)
_STATE = "tp pp ep zero dp layers_per_stage dtype framework"
_GRAD_DTYPE = "grad_dtype optimizer_dtypes framework"
DEPENDS: dict[str, tuple[str, ...]] = {
    key: tuple(value.split())
    for key, value in {
        "compute.": f"{_COMPUTE} moe_imbalance tp_overlap microbatches backend",
        "comm.tp": "tp sp tp_overlap micro_batch seq_len dtype recompute layers_per_stage microbatches "
        "devices_per_node backend",
        "comm.cp": "cp cp_comm cp_balance micro_batch seq_len layers_per_stage microbatches backend",
        # hierarchical CP: the all-to-alls inside a group, the ring across groups (placed on nodes)
        "comm.cp_a2a": "cp cp_comm cp_a2a tp micro_batch seq_len layers_per_stage microbatches devices_per_node "
        "backend",
        "comm.cp_p2p": "cp cp_comm cp_a2a tp cp_balance micro_batch seq_len layers_per_stage microbatches "
        "devices_per_node backend",
        "comm.ep": "ep tp moe_capacity_factor moe_imbalance moe_dispatcher micro_batch seq_len layers_per_stage "
        "microbatches devices_per_node backend framework",
        # ZeRO 0-2 reduce the gradients in the dtype they are kept in: the framework's, --grad-dtype's, main_grads'
        "comm.dp": f"dp zero tp pp cp ep dtype layers_per_stage devices_per_node backend embedding_sharding "
        f"{_GRAD_DTYPE}",
        # TorchRec's table-wise-row-wise tables: within a node, then across nodes
        "comm.dp_intra": "dp embedding_sharding micro_batch devices_per_node backend",
        "comm.dp_cross": "dp embedding_sharding micro_batch devices_per_node backend",
        "comm.edp": f"dp ep zero tp pp dtype layers_per_stage devices_per_node backend {_GRAD_DTYPE}",
        "comm.fsdp": "dp zero tp pp cp dtype layers_per_stage microbatches devices_per_node backend fsdp_reduce_dtype "
        "offload_params framework",
        "comm.": "tp pp dp sp micro_batch seq_len devices_per_node backend",
        "bubble": "pp vpp schedule microbatches pp_balance tp sp micro_batch recompute",
        "optimizer": "zero dp tp pp layers_per_stage dtype backend optimizer_dtypes offload_optimizer offload_overlap "
        "framework",
        "idle": "tp pp micro_batch",
        "memory.params": f"{_STATE} offload_params",
        "memory.grads": f"{_STATE} {_GRAD_DTYPE}",
        "memory.optimizer": f"{_STATE} cp optimizer_dtypes offload_optimizer",
        "memory.activations": "recompute micro_batch seq_len sp tp cp pp vpp schedule layers_per_stage attention "
        "dtype microbatches offload_layers loss_chunks framework",
        "memory.": "tp pp dp micro_batch seq_len recompute sp zero layers_per_stage dtype grad_dtype offload_optimizer "
        "framework",
    }.items()
}
MEMORY_PARTS = ("params", "grads", "optimizer", "activations", "transient", "comm_buffers", "fragmentation")
DERIVED = ("microbatches", "layers_per_stage", "backend", "devices_per_node")
_SHARDED_STATE = ("memory.params", "memory.grads", "memory.optimizer")


@dataclass(frozen=True)
class Term:
    """One figure in both reports: seconds (time terms) or bytes (memory terms)."""

    name: str
    a: float
    b: float
    unit: str  # "s" or "bytes"
    why: tuple[str, ...] = ()  # the changed settings the term depends on ("tp 8 -> 4")

    @property
    def delta(self) -> float:
        return self.b - self.a

    def as_dict(self) -> dict[str, Any]:
        return {"term": self.name, "a": self.a, "b": self.b, "change": self.delta, "unit": self.unit,
                "why": list(self.why)}  # fmt: skip


@dataclass(frozen=True)
class Comparison:
    a: Mapping[str, Any]
    b: Mapping[str, Any]
    changes: tuple[tuple[str, Any, Any], ...]  # (setting, value in A, value in B)
    terms: tuple[Term, ...]
    notes: tuple[str, ...] = field(default=())

    def term(self, name: str) -> Term:
        return next(t for t in self.terms if t.name == name)

    def moved(self, threshold: float = 0.005) -> list[Term]:
        """Terms that moved by more than ``threshold`` of the larger step time (or peak), largest first."""
        step = max(self.a["step_time_s"], self.b["step_time_s"])
        peak = max(peak_bytes(self.a), peak_bytes(self.b)) or 1
        out = [t for t in self.terms if abs(t.delta) > threshold * (step if t.unit == "s" else peak)]
        return sorted(out, key=lambda t: (-abs(t.delta) / (step if t.unit == "s" else peak), t.name))

    def as_dict(self) -> dict[str, Any]:
        return {
            "a": _summary(self.a),
            "b": _summary(self.b),
            "changes": [{"setting": k, "a": x, "b": y} for k, x, y in self.changes],
            "terms": [t.as_dict() for t in self.terms],
            "notes": list(self.notes),
        }


def load_report(path: str | Path) -> dict[str, Any]:
    """A saved report (``compile --json`` or ``--out``); anything else is one line naming the file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise EchosimError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise EchosimError(f"{path}: not an echosim report (not JSON)") from None
    missing = [k for k in REPORT_KEYS if not isinstance(data, dict) or k not in data]
    if missing:
        raise EchosimError(f"{path}: not an echosim report (no {', '.join(missing)}; save one with compile --out)")
    bad = _malformed(data)
    if bad:
        raise EchosimError(f"{path}: not an echosim report ({bad})")
    return data


def _malformed(r: dict[str, Any]) -> str:
    """What makes a dictionary with a report's keys unusable as one ('' when nothing)."""
    number = (int, float)
    if not isinstance(r["step_time_s"], number) or isinstance(r["step_time_s"], bool) or r["step_time_s"] <= 0:
        return "step_time_s is not a positive number"
    if not isinstance(r["breakdown"], dict) or not all(isinstance(v, number) for v in r["breakdown"].values()):
        return "breakdown is not a table of seconds"
    rows = r["memory"]
    if not isinstance(rows, list) or not rows or not all(isinstance(m, dict) for m in rows):
        return "memory is not a list of stages"
    if not all(isinstance(m.get("peak"), number) and isinstance(m.get("stage"), int) for m in rows):
        return "a memory row has no peak or stage"
    plan = r["plan"]
    if not isinstance(plan, dict) or not all(
        isinstance(plan.get(k), int) and plan[k] > 0 for k in ("micro_batch", "dp")
    ):
        return "plan has no micro_batch and dp"
    return ""


def peak_bytes(report: Mapping[str, Any]) -> int:
    return max((int(m["peak"]) for m in report["memory"]), default=0)


def binding_stage(report: Mapping[str, Any]) -> Mapping[str, Any]:
    """The pipeline stage with the largest peak: the one that decides whether the layout fits."""
    return max(report["memory"], key=lambda m: (m["peak"], -m["stage"]))


def settings(report: Mapping[str, Any]) -> dict[str, Any]:
    """The plan's settings plus those derived from it that terms depend on."""
    plan = dict(report["plan"])
    batch = plan.get("global_batch") or plan["micro_batch"] * plan["dp"]
    plan["microbatches"] = batch // (plan["micro_batch"] * plan["dp"])
    plan["layers_per_stage"] = max((m.get("layers", 0) for m in report["memory"]), default=0)  # per pipeline rank
    plan["backend"] = report.get("backend")
    plan["devices_per_node"] = report.get("devices_per_node")
    return plan


def memory_parts(rows: list[Mapping[str, Any]]) -> list[str]:
    """The parts a peak is made of in these memory rows: the known ones in order, then any others."""
    found = {k for m in rows for k, v in m.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    found -= {"stage", "layers", "capacity", "peak"}
    return [k for k in MEMORY_PARTS if k in found] + sorted(found - set(MEMORY_PARTS))


def compare(a: Mapping[str, Any], b: Mapping[str, Any]) -> Comparison:
    """Every term of two reports, with the setting changes that explain each."""
    sa, sb = settings(a), settings(b)
    order = [f.name for f in fields(Plan)] + [k for k in DERIVED if k in sa or k in sb]
    order += sorted((set(sa) | set(sb)) - set(order))
    changes = tuple((k, sa.get(k), sb.get(k)) for k in order if sa.get(k) != sb.get(k))
    changed = {k: f"{k} {_fmt(x)} -> {_fmt(y)}" for k, x, y in changes}
    notes = []
    for key, what in (("model", "models"), ("backend", "backends"), ("devices", "device counts")):
        if a.get(key) != b.get(key):
            notes.append(f"the reports are of different {what}: {a.get(key)} and {b.get(key)}")

    sharded = bool(sa.get("zero") or sb.get("zero"))

    def why(name: str) -> tuple[str, ...]:
        deps = DEPENDS.get(name) or next((v for k, v in DEPENDS.items() if k.endswith(".") and name.startswith(k)), ())
        if not sharded and name in _SHARDED_STATE:  # without ZeRO the data-parallel degree shards no model state
            deps = tuple(d for d in deps if d not in ("dp", "zero"))
        return tuple(changed[d] for d in deps if d in changed)

    terms = [Term("step_time_s", a["step_time_s"], b["step_time_s"], "s", tuple(changed.values()))]
    for key in sorted(set(a["breakdown"]) | set(b["breakdown"])):
        terms.append(Term(key, a["breakdown"].get(key, 0.0), b["breakdown"].get(key, 0.0), "s", why(key)))
    ma, mb = binding_stage(a), binding_stage(b)
    for key in [*memory_parts([ma, mb]), "peak"]:
        name = f"memory.{key}"
        terms.append(Term(name, float(ma.get(key, 0)), float(mb.get(key, 0)), "bytes", why(name)))
    return Comparison(a, b, changes, tuple(terms), tuple(notes))


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value)) or "none"
    return str(value)


def _summary(r: Mapping[str, Any]) -> dict[str, Any]:
    stage = binding_stage(r)
    return {"model": r["model"], "backend": r.get("backend"), "devices": r.get("devices"),
            "step_time_s": r["step_time_s"], "peak_gib": stage["peak"] / GiB, "fits": bool(r.get("fits", True)),
            "binding_stage": stage["stage"]}  # fmt: skip


def signed_s(x: float) -> str:
    """A change of time: to the millisecond from 0.1 s, else in ms (a 3 ms step's terms are not '-0.000 s')."""
    return f"{x:+.3f} s" if abs(x) >= 0.1 else f"{x * 1e3:+.2f} ms"


def describe(t: Term) -> str:
    """``comm.tp -0.412 s (tp 8 -> 4, sp off -> on)``: one term's change and why."""
    amount = signed_s(t.delta) if t.unit == "s" else f"{t.delta / GiB:+.1f} GiB"
    return f"{t.name} {amount}" + (f" ({', '.join(t.why)})" if t.why else "")
