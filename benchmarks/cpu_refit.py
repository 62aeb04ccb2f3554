"""Predict the rows of a CPU-reality result with the CPU model with and without some of its rules, both fitted
to the same calibration samples, so that a rule's effect is read apart from the machine's drift.

Usage::

    python benchmarks/cpu_refit.py RESULT.json [--without gemm_pack_rows,autograd_op_us]
    python benchmarks/cpu_refit.py --samples NAME.json [...]   # the matmul samples' fit, with and without

``RESULT.json`` is what ``benchmarks/cpu_reality.py --out`` or ``cpu_reality_nonllm.py --out`` wrote; the
samples of its calibrations lie beside their databases (NAME.json, written by ``cpu_reality.calibrate``).
"Without" a rule: its parameter stays 0 (the rule off) and the samples only it reads (the few-row matmuls for
``gemm_pack_rows``, the autograd chain for ``autograd_op_us``) are left out of the fit, as before the rule.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

#: The samples a rule alone reads, by the parameter that switches it on.
ONLY_FOR = {
    "gemm_pack_rows": lambda s: s.kind == "matmul" and (s.m, s.n, s.k, s.batch) in _small_m(),
    "autograd_op_us": lambda s: s.kind == "autograd",
}


def _small_m() -> set[tuple[int, int, int, int]]:
    from echosim.calibrate.bench import SMALL_M_MATMULS

    return set(SMALL_M_MATMULS)


def refit(samples_json: Path, without: list[str], db: Path, name: str) -> str:
    """Fit the CPU model to the samples of ``samples_json`` with the rules of ``without`` off; store it as ``name``."""
    from echosim.backends.cpu import CPU_X86
    from echosim.calibrate import fit
    from echosim.calibrate.bench import Sample
    from echosim.calibrate.store import CalibrationStore

    data = json.loads(samples_json.read_text())
    samples = [Sample(**s) for s in data["samples"]]
    samples = [s for s in samples if not any(ONLY_FOR[w](s) for w in without)]
    machine = data["machine"]
    threads, ranks = int(machine.get("threads_per_rank", 1)), int(machine.get("ranks", 1))
    base = replace(CPU_X86, **{w: 0.0 for w in without})
    knobs = fit.CPU_KNOBS
    try:
        fit.CPU_KNOBS = tuple(k for k in knobs if k.name not in without)
        spec, derived = fit.fit_cpu(base, samples, threads, ranks)
        params = {k.name: (getattr(spec, k.name), k.what) for k in fit.fitted_knobs(fit.CPU_KNOBS, samples)}
    finally:
        fit.CPU_KNOBS = knobs
    params.update({f: (v, n) for f, (v, n) in derived.items()})
    params.update({w: (0.0, "rule off") for w in without})
    store = CalibrationStore(db, create=True)
    try:
        store.save(name, "cpu-x86", machine, params, f"cpu_refit of {samples_json.name}")
    finally:
        store.close()
    return f"{db}#{name}"


def matmul_fit(samples_json: Path) -> None:
    """Each matmul sample's error under the model fitted with and without the packing rule (all samples)."""
    from echosim.backends.cpu import CPU_X86
    from echosim.calibrate import fit
    from echosim.calibrate.bench import Sample

    data = json.loads(samples_json.read_text())
    samples = [Sample(**s) for s in data["samples"]]
    machine = data["machine"]
    threads, ranks = int(machine.get("threads_per_rank", 1)), int(machine.get("ranks", 1))
    specs = {}
    knobs = fit.CPU_KNOBS
    for label, off in (("without", ["gemm_pack_rows"]), ("with", [])):
        try:
            fit.CPU_KNOBS = tuple(k for k in knobs if k.name not in off)
            specs[label] = fit.fit_cpu(replace(CPU_X86, **{w: 0.0 for w in off}), samples, threads, ranks)[0]
        finally:
            fit.CPU_KNOBS = knobs
    print(f"{samples_json.name}: gemm_pack_rows {specs['with'].gemm_pack_rows:.2f}")
    errs: dict[str, list[float]] = {"without": [], "with": []}
    for s in (s for s in samples if s.kind == "matmul"):
        row = []
        for label, spec in specs.items():
            e = fit.predict_cpu(spec, s) / s.seconds - 1
            errs[label].append(abs(e))
            row.append(f"{e:>+8.1%}")
        print(f"  {s.batch}x{s.m}x{s.n}x{s.k}".ljust(24), f"{s.flops / s.seconds / 1e9:7.1f} GFLOP/s", *row)
    for label, values in errs.items():
        print(f"  {label} the rule: matmul samples' mean absolute error {statistics.mean(values):.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("result", type=Path, nargs="?")
    parser.add_argument("--without", default="gemm_pack_rows,autograd_op_us")
    parser.add_argument("--samples", type=Path, nargs="+", help="Calibration sample files (NAME.json) to refit.")
    args = parser.parse_args()
    if args.samples:
        for path in args.samples:
            matmul_fit(path)
        return
    if args.result is None:
        parser.error("give a RESULT.json or --samples")
    without = [w for w in args.without.split(",") if w]
    if unknown := [w for w in without if w not in ONLY_FOR]:
        parser.error(f"unknown rule {unknown[0]!r}; known: {', '.join(ONLY_FOR)}")
    result = json.loads(args.result.read_text())
    refs = result.get("calibration") or result.get("calibrations")
    nonllm = "calibrations" in result
    pairs = refs if nonllm else [refs]
    before: list[dict[str, str]] = []
    for pair in pairs:
        out = {}
        for key, ref in pair.items():
            path, _, name = ref.partition("#")
            db = Path(path)
            out[str(key)] = refit(db.parent / f"{name}.json", without, db, f"{name}-without")
        before.append(out)
    if nonllm:
        import cpu_reality_nonllm as bench

        def predict(row: dict[str, Any], refs: dict[str, str]) -> float:
            ranks = "1" if row["layout"] == "1 process" else "2"
            return bench.predict(row["model"], row["layout"], refs[ranks])["step_time_s"]
    else:
        import cpu_reality as bench

        def predict(row: dict[str, Any], refs: dict[str, str]) -> float:
            key = str(bench.calibration_key(row["layout"]))
            return bench.predict(bench.MODELS[row["model"]], row["layout"], refs[key])["step_time_s"]

    measured_key = "cpu_step_s" if nonllm else "measured_step_s"
    print(f"{'model':<20}{'layout':<22}{'measured s':>11}{'without':>9}{'with':>9}")
    errs: dict[str, list[float]] = {"without": [], "with": []}
    for row in result["rows"]:
        old = statistics.median(predict(row, refs) for refs in before) / row[measured_key] - 1
        new = row["predicted_step_s"] / row[measured_key] - 1
        errs["without"].append(abs(old))
        errs["with"].append(abs(new))
        print(f"{row['model']:<20}{row['layout']:<22}{row[measured_key]:>11.4f}{old:>+9.1%}{new:>+9.1%}")
    for key, values in errs.items():
        print(f"{key} {args.without}: mean absolute {statistics.mean(values):.1%}, worst {max(values):.1%}")


if __name__ == "__main__":
    main()
