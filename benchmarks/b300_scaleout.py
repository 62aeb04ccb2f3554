"""B300 / GB300 rows of ``cases.csv``: which traffic leaves a node, and how much the NIC rate moves them.

For every B300 / GB300 row and its B200 / GB200 twin (same release, model, precision and GPU count) this prints
the nodes the job spans (NVLink domains: 8 GPUs on DGX B200 / B300, the 72-GPU rack on GB200 / GB300, split
as ``topology.fill_domains`` does) and, for the expert-parallel, data-parallel and pipeline groups of the
Megatron rank order, the nodes one group spans (``topology.megatron_placement``; experts with expert-tp 1, the
Megatron-Bridge presets' setting). It then re-runs the selected rows with the Blackwell Ultra devices' NIC at
400 Gb/s (``nic_GBps`` 50, a ConnectX-7's rate) in a fresh process, so the error each row would take if its
cluster delivered a B200's per-GPU scale-out rate is measured next to the error it takes now. Nothing is
changed in echosim: the second column is a counterfactual, not a rule (benchmarks/b300_scaleout.md says why).

    PYTHONPATH=. python benchmarks/b300_scaleout.py [--cases ../shared/validation/cases.csv]

About one minute of CPU (two validations of ~40 rows).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from echosim.backends.devices import DEVICES  # noqa: E402
from echosim.backends.topology import fill_domains, megatron_placement  # noqa: E402
from echosim.validation.cases import Case, read_cases  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from constant_sensitivity import child_json  # noqa: E402

CASES = ROOT.parent / "shared" / "validation" / "cases.csv"
ULTRA = ("b300", "gb300")
TWIN = {"b300": "b200", "gb300": "gb200"}
#: The counterfactual per-GPU NIC rate: one ConnectX-7 at 400 Gb/s (DGX B200's, devices.B200.nic_GBps).
NIC_400G_GBPS = 50.0

_CHILD = """
import dataclasses, json, sys
import echosim.backends.devices as devices
for name in filter(None, sys.argv[3].split(",")):
    devices.DEVICES[name] = dataclasses.replace(devices.DEVICES[name], nic_GBps=float(sys.argv[2]))
from echosim.validation.run import validate_cases
rows = validate_cases(sys.argv[1], [f"device={d}" for d in sys.argv[4].split(",")]).rows
print(json.dumps({r.case_id: r.error for r in rows}))
"""


def _key(c: Case) -> tuple[str, str, str, str, str]:
    return (c["source_id"], c["layers"], c["hidden"], c["dtype"], c["devices"])


def spans(c: Case) -> dict[str, int]:
    """Nodes the job spans and the nodes one EP / DP / PP group spans (Megatron order, expert-tp 1)."""
    dev = DEVICES[c["device"]]
    world = c.int("devices") or 1
    per_node = fill_domains(world, dev.devices_per_node)
    tp, cp, pp, ep = (c.int(k, 1) or 1 for k in ("tp", "cp", "pp", "ep"))
    dp = world // (tp * cp * pp)
    dense = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
    out = {"nodes": -(-world // per_node)}
    out["dp"] = megatron_placement("dp", dense, per_node).nodes
    out["pp"] = megatron_placement("pp", dense, per_node).nodes
    if c["arch"] == "moe" and ep > 1:
        out["ep"] = megatron_placement("ep", {"ep": ep, "dp": world // (ep * pp), "pp": pp}, per_node).nodes
    return out


def errors(cases: Path, devices: tuple[str, ...], nic_GBps: float | None) -> dict[str, float | None]:
    """Errors of the rows on ``devices``, the B300 / GB300 NIC at ``nic_GBps`` (None: as echosim has it)."""
    changed = ",".join(ULTRA) if nic_GBps is not None else ""
    return child_json(_CHILD, str(cases), repr(nic_GBps or 0.0), changed, ",".join(devices))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=Path, default=CASES)
    args = parser.parse_args()
    cases = read_cases(args.cases)
    ultra = [c for c in cases if c["device"] in ULTRA]
    twins = {(_key(c), c["device"]): c for c in cases if c["device"] in TWIN.values()}
    now = errors(args.cases, (*ULTRA, *TWIN.values()), None)
    slow = errors(args.cases, ULTRA, NIC_400G_GBPS)
    print("| row | layout | nodes | EP / DP / PP group nodes | measured s | error now | NIC 400G | twin | twin error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for dev in ULTRA:
        rows = [c for c in ultra if c["device"] == dev]
        for c in rows:
            s = spans(c)
            layout = " ".join(f"{k}{c[k]}" for k in ("tp", "pp", "vpp", "cp", "ep") if c[k] not in ("", "1"))
            layout += f" mb{c['micro_batch']} gbs{c['global_batch']}"
            groups = f"{s.get('ep', '-')} / {s['dp']} / {s['pp']}"
            twin = twins.get((_key(c), TWIN[dev]))
            twin_txt, twin_err = "-", "-"
            if twin is not None:
                tl = " ".join(f"{k}{twin[k]}" for k in ("tp", "pp", "vpp", "cp", "ep") if twin[k] not in ("", "1"))
                twin_txt = f"{float(twin['step_time_s']):.2f} s ({tl} mb{twin['micro_batch']})"
                te = now.get(twin.case_id)
                twin_err = "-" if te is None else f"{100 * te:+.1f}%"
            e0, e1 = now.get(c.case_id), slow.get(c.case_id)
            print(
                f"| {c.case_id} | {layout} | {s['nodes']} | {groups} | {float(c['step_time_s']):.2f} | "
                f"{'-' if e0 is None else f'{100 * e0:+.1f}%'} | {'-' if e1 is None else f'{100 * e1:+.1f}%'} | "
                f"{twin_txt} | {twin_err} |"
            )
        errs = [now[c.case_id] for c in rows if now.get(c.case_id) is not None]
        moved = [slow[c.case_id] for c in rows if slow.get(c.case_id) is not None]
        if errs:
            print(
                f"| **{dev} mean** ({len(errs)} rows) | | | | | {100 * sum(errs) / len(errs):+.1f}% | "
                f"{100 * sum(moved) / len(moved):+.1f}% | | |"
            )


if __name__ == "__main__":
    main()
