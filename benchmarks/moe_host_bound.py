"""Would host-bound execution after the dropless dispatcher's sync explain the MoE rows? A measurement.

Megatron-Core's alltoall dispatcher copies the per-expert token counts to the host and waits for
them before the expert-parallel all_to_all when the run is dropless (``_maybe_dtoh_and_synchronize``
at ``cuda_sync_point`` "before_ep_alltoall"; with ``moe_pad_expert_input_to_capacity`` it returns
without a copy: megatron/core/transformer/moe/token_dispatcher.py, Megatron-LM commit d98e8a6).
After the wait the GPU has nothing queued, so a section of kernels costs at least the host's time
to issue them. The rule under test, per MoE layer and micro-batch:

    forward  = max(GPU forward,  host_us x kernels issued forward)     (queue drained at each sync)
    backward = max(GPU backward, host_us x kernels issued backward)    (no sync, but no lead carried in)

with kernels counted from the IR of the row's own lowering, every grouped GEMM and its quantising
cast as one launch per local expert (Transformer Engine's GroupedLinear runs one cuBLAS GEMM per
expert, general_grouped_gemm). For each MoE row it prints the measured and predicted seconds per
layer and micro-batch, the predicted GPU time and kernel count per layer, the host microseconds per
kernel the rule needs to reach the measured step (``need_us``), and what the rule adds at the
project's own sourced host launch figure (``DeviceSpec.nccl_launch_us``: host time of one kernel
launch from one thread, read from nccl-tests). Nothing here changes a prediction.

    PYTHONPATH=. python benchmarks/moe_host_bound.py [--cases ../shared/validation/cases.csv]
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from typing import Any

from echosim.backends.devices import DEVICES
from echosim.compiler import lower
from echosim.errors import EchosimError
from echosim.validation.cases import read_cases
from echosim.validation.published import published_step_time
from echosim.validation.rows import row_model, row_plan

EXPERT_LAUNCH = re.compile(r"grouped_mm")  # TE launches these per local expert
QUANTISED = ("fp8", "nvfp4")  # the IR names a quantising cast after its format (".mxfp8", ".fp8")


def layer_profile(comp: Any, local_experts: int) -> dict[str, tuple[float, int]]:
    """(GPU seconds along the unit, kernels issued) of one repeated layer, forward and backward."""
    span: dict[str, float] = collections.defaultdict(float)
    kernels: dict[str, int] = collections.Counter()
    for _, a in comp.costed.dag().nodes(data=True):
        unit = a.get("unit", "")
        if a.get("kind") not in ("op", "collective") or not unit.endswith(".block"):
            continue
        key = unit.split(".")[0]
        if a.get("vstages", "0").split(",")[0] not in ("0", ""):
            continue  # the first stage shape only
        span[key] = max(span[key], a["start_s"] + a["duration_s"])
        grouped_gemm = a["op"] == "matmul" and bool(EXPERT_LAUNCH.search(a["name"]))
        expert_cast = a["op"] == "elementwise" and ".experts." in a["scope"] and a["name"].endswith(QUANTISED)
        per_expert = grouped_gemm or expert_cast
        kernels[key] += local_experts if per_expert else 1
    return {k: (span[k], kernels[k]) for k in span}


def host_bound_extra_s(host_s: float, gpu_fwd_s: float, kernels_fwd: int, gpu_bwd_s: float, kernels_bwd: int) -> float:
    """Seconds one layer and micro-batch gains when each half runs no faster than the host issues its kernels."""
    return max(0.0, host_s * kernels_fwd - gpu_fwd_s) + max(0.0, host_s * kernels_bwd - gpu_bwd_s)


def needed_host_s(measured_s: float, predicted_s: float, gpu_s: float, kernels: int) -> float:
    """Host seconds per kernel at which a fully host-bound layer takes what was measured (per layer-mb)."""
    return (measured_s - predicted_s + gpu_s) / kernels


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="../shared/validation/cases.csv")
    p.add_argument("--host-us", type=float, default=0.0, help="host µs per kernel (0: the device's nccl_launch_us)")
    args = p.parse_args(argv)
    if args.host_us < 0:
        p.error("--host-us must be >= 0")
    errors_before: list[float] = []
    errors_after: list[float] = []
    print("case | device | meas ms/layer-mb | pred | GPU fwd+bwd | kernels f+b | need_us | rule adds | error")
    for c in read_cases(args.cases):
        if c["arch"] != "moe" or not c["source_id"].startswith(("megatron_bridge", "dgxc", "nemo")):
            continue
        measured, _ = published_step_time(c)
        plan, cluster = row_plan(c)
        try:
            comp = lower(row_model(c), plan, cluster)
        except EchosimError as exc:  # a row the compiler does not take (e.g. EP folded over tp x dp)
            print(f"{c.case_id} | skipped: {exc}")
            continue
        experts = c.int("experts") or 1
        local = max(1, experts // max(1, plan.ep))
        prof = layer_profile(comp, local)
        (gf, kf), (gb, kb) = prof["forward"], prof["backward"]
        dp = plan.dp
        micro = max(1, plan.global_batch // (dp * plan.micro_batch))
        layers = (c.int("layers") or 1) / plan.pp
        runs = micro * layers
        meas = measured / runs
        pred = comp.report.step_time_s / runs
        need = needed_host_s(meas, pred, gf + gb, kf + kb) * 1e6
        h = (args.host_us or DEVICES[cluster.backend].nccl_launch_us) * 1e-6
        # the rule applies to rows whose dispatcher syncs: Megatron-Core alltoall, dropless; HybridEP is applied
        # on GB200/GB300 only (Megatron-Bridge v0.2.0 training/flex_dispatcher_backend.py), DeepEP rows and
        # token-dropping (padded to capacity) runs copy nothing to the host
        syncs = (
            c["source_id"].startswith("megatron_bridge")
            and plan.moe_dispatcher == "alltoall"
            and "tokendrop" not in c.case_id
            and c["device"] not in ("gb200", "gb300")
        )
        add = host_bound_extra_s(h, gf, kf, gb, kb) if syncs else 0.0
        before = comp.report.step_time_s / measured - 1
        after = (comp.report.step_time_s + add * runs) / measured - 1
        errors_before.append(before)
        errors_after.append(after)
        print(
            f"{c.case_id[:44]} | {c['device']} | {meas * 1e3:.2f} | {pred * 1e3:.2f} | "
            f"{(gf + gb) * 1e3:.2f} | {kf}+{kb} | {need:.0f} | {'sync' if syncs else '-'} {add * runs:+.3f} s "
            f"| {before:+.1%} -> {after:+.1%}"
        )
    n = len(errors_before)
    for name, errs in (("before", errors_before), ("after", errors_after)):
        mape = sum(abs(e) for e in errs) / n
        print(f"{name}: {n} rows, MAPE {mape:.1%}, mean {sum(errs) / n:+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
