"""What to simulate: the parallel layout and training settings (``Plan``) and the machine (``Cluster``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from echosim.errors import EchosimError
from echosim.passes.recompute import MODES as RECOMPUTE_MODES
from echosim.timeline.schedule import SCHEDULES

DTYPES = ("fp32", "fp16", "bf16", "fp8")


# Plan features the passes implement; a feature not listed here is refused with a clear message.
SUPPORTED: set[str] = {"sp", "cp", "ep", "zero", "vpp"}


class PlanError(EchosimError):
    """An impossible layout or setting; the message names the broken constraint."""


@dataclass(frozen=True)
class Cluster:
    backend: str = "a100-80gb"
    devices: int = 1024
    devices_per_node: int = 8
    calibration: str = ""  # a calibration (``echosim calibrate``) whose fitted parameters the backend uses

    def validate(self) -> None:
        if self.devices < 1:
            raise PlanError(f"--devices must be positive, got {self.devices}")
        if self.devices_per_node < 1:
            raise PlanError(f"--devices-per-node must be positive, got {self.devices_per_node}")
        if self.devices > self.devices_per_node and self.devices % self.devices_per_node:
            raise PlanError(f"devices={self.devices} is not a whole number of nodes of {self.devices_per_node}")

    @property
    def nodes(self) -> int:
        return max(1, self.devices // self.devices_per_node)


@dataclass(frozen=True)
class Plan:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    micro_batch: int = 1
    global_batch: int = 0  # 0: one micro-batch per data-parallel rank
    seq_len: int = 0  # 0: the model's own sequence length
    dtype: str = "bf16"
    recompute: str = "none"
    schedule: str = "1f1b"
    attention: str = "flash"  # "flash" (fused kernel) or "math" (materialised scores)
    pp_balance: str = "uniform"
    overlap_dp: bool = True
    sp: bool = False  # Megatron sequence parallelism (needs tp > 1)
    cp: int = 1  # context-parallel degree
    ep: int = 1  # expert-parallel degree (carved out of dp)
    zero: int = 0  # 0: replicated optimizer; 1/2/3: ZeRO stage (3 = FSDP)
    vpp: int = 1  # virtual pipeline stages per rank (interleaved 1F1B)
    tp_overlap: bool = False  # chunked GEMMs overlap their TP collectives (Megatron --tp-comm-overlap)
    cp_comm: str = "p2p"  # context parallelism: "p2p" (ring attention) or "all_gather" of K/V
    cp_balance: bool = True  # causal load balancing (2*cp chunks per sequence)
    moe_capacity_factor: float = 0.0  # expert capacity over the fair share; 0: dropless
    moe_imbalance: float = 1.0  # busiest expert-parallel rank's load over the mean; 1: balanced

    @property
    def batch(self) -> int:
        return self.global_batch or self.micro_batch * self.dp

    @property
    def microbatches(self) -> int:
        return self.batch // (self.micro_batch * self.dp)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def validate(self, cluster: Cluster) -> None:
        for name in ("tp", "pp", "dp", "micro_batch"):
            if getattr(self, name) < 1:
                raise PlanError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        for name in ("cp", "ep", "vpp"):
            if getattr(self, name) < 1:
                raise PlanError(f"--{name} must be at least 1, got {getattr(self, name)}")
        world = self.tp * self.pp * self.dp * self.cp
        if world != cluster.devices:
            shown = f"tp*pp*dp{'*cp' if self.cp > 1 else ''}"
            factors = f"{self.tp}*{self.pp}*{self.dp}" + (f"*{self.cp}" if self.cp > 1 else "")
            raise PlanError(f"{shown} = {factors} = {world} does not equal devices={cluster.devices}")
        if self.dp % self.ep:
            raise PlanError(f"ep={self.ep} does not divide dp={self.dp} (experts are sharded inside data parallelism)")
        if self.zero not in (0, 1, 2, 3):
            raise PlanError(f"unknown ZeRO stage {self.zero} (known: 0, 1, 2, 3)")
        if self.sp and self.tp == 1:
            raise PlanError("sequence parallelism needs tp > 1")
        requested = {
            "sp": ("sequence parallelism", self.sp),
            "cp": ("context parallelism", self.cp > 1),
            "ep": ("expert parallelism", self.ep > 1),
            "zero": ("ZeRO/FSDP", self.zero > 0),
            "vpp": ("interleaved pipelines", self.vpp > 1),
        }
        for name, (what, used) in requested.items():
            if used and name not in SUPPORTED:
                raise PlanError(f"{what} ({name}={getattr(self, name)}) is not modelled yet")
        if self.vpp > 1 and self.schedule not in ("1f1b", "interleaved"):
            raise PlanError(f"vpp={self.vpp} needs the interleaved 1F1B schedule, not {self.schedule!r}")
        if self.vpp > 1 and self.microbatches % self.pp:
            raise PlanError(
                f"the interleaved schedule needs micro-batches ({self.microbatches}) to be a multiple of pp={self.pp}"
            )
        if self.global_batch and self.global_batch % (self.micro_batch * self.dp):
            raise PlanError(
                f"global batch {self.global_batch} is not a multiple of micro-batch*dp = {self.micro_batch}*{self.dp}"
            )
        if self.dtype not in DTYPES:
            raise PlanError(f"unknown dtype {self.dtype!r} (known: {', '.join(DTYPES)})")
        if self.recompute not in RECOMPUTE_MODES:
            raise PlanError(f"unknown recompute {self.recompute!r} (known: {', '.join(RECOMPUTE_MODES)})")
        if self.schedule not in SCHEDULES:
            raise PlanError(f"unknown schedule {self.schedule!r} (known: {', '.join(SCHEDULES)})")
        if self.attention not in ("flash", "math"):
            raise PlanError(f"unknown attention {self.attention!r} (known: flash, math)")
        self._validate_cp_ep()

    def _validate_cp_ep(self) -> None:
        if self.cp_comm not in CP_COMMS:
            raise PlanError(f"unknown --cp-comm {self.cp_comm!r} (known: {', '.join(CP_COMMS)})")
        if self.moe_capacity_factor < 0:
            raise PlanError(f"--moe-capacity-factor must be >= 0 (0 = dropless), got {self.moe_capacity_factor:g}")
        if self.ep > 1 and not 1.0 <= self.moe_imbalance <= self.ep:
            raise PlanError(
                f"--moe-imbalance {self.moe_imbalance:g} must lie between 1 (balanced) and ep={self.ep} "
                "(every token on one rank)"
            )


CP_COMMS = ("p2p", "all_gather")


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
        cluster = replace(cluster, devices=plan.tp * plan.pp * plan.dp * plan.cp)
    return model or DEFAULT_MODEL, plan, cluster
