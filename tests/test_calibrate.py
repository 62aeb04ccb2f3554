"""`echosim calibrate`: the store, applying parameters to a backend, fitting, profiles, the command."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from echosim.backends.cpu import CPU_X86, CPUBackend
from echosim.backends.loading import load_backend
from echosim.calibrate import apply_calibration, covered_backends, with_parameters
from echosim.calibrate.bench import Sample
from echosim.calibrate.db import CalibrationError, matmul_key
from echosim.calibrate.fit import CPU_KNOBS, fit_spec, predict_cpu
from echosim.calibrate.store import CalibrationStore, load_calibration, resolve
from echosim.frontend.zoo import ArchConfig
from echosim.ir.graph import Node
from echosim.ir.ops import MatmulAttrs, OpKind
from echosim.ir.types import DType, TensorSpec

TINY = ArchConfig("gpt", layers=2, hidden=64, heads=4, vocab=128, seq_len=16)


def matmul(m: int, n: int, k: int) -> Node:
    return Node(0, OpKind.MATMUL, (), TensorSpec((m, n), DType.FP32), MatmulAttrs(m, n, k))


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "cal.sqlite"
    store = CalibrationStore(path, create=True)
    store.save(
        "box", "cpu-x86", {"hostname": "box"}, {"gemm_eff_fp32": (0.4, "fitted"), "op_overhead_us": (3.0, "x")}, "test"
    )
    store.close()
    return path


@pytest.fixture(scope="module")
def cli() -> click.Group:
    from echosim.cli import cli as group
    from echosim.plugins import get_registry

    if "calibrate" not in group.commands:
        get_registry().add_commands(group)
    return group


# ---- the store ------------------------------------------------------------------------------------------


def test_store_round_trip_and_references(db, monkeypatch):
    cal = load_calibration(f"{db}#box")
    assert cal.backends == ["cpu-x86"] and cal.parameters["cpu-x86"] == {"gemm_eff_fp32": 0.4, "op_overhead_us": 3.0}
    assert cal.machine["cpu-x86"] == {"hostname": "box"} and cal.what["cpu-x86"]["gemm_eff_fp32"] == "fitted"
    assert resolve(str(db)) == (db, "box")  # a file: its most recent calibration
    monkeypatch.setenv("ECHOSIM_CALIBRATION", str(db))
    assert resolve("box") == (db, "box")  # a name: in the default database
    assert covered_backends("box") == {"cpu-x86"}
    with pytest.raises(CalibrationError, match=r"no calibration named 'other' in .* \(known: box\)"):
        load_calibration("other")
    with pytest.raises(CalibrationError, match="no such file"):
        load_calibration(str(db.parent / "missing.sqlite"))


def test_names_cannot_hold_the_reference_separators(db):
    store = CalibrationStore(db)
    with pytest.raises(CalibrationError, match="without '#' or '@'"):
        store.save("a#b", "cpu-x86", {}, {}, "test")
    store.close()


# ---- parameters applied to a backend -------------------------------------------------------------------


def test_with_parameters_rebuilds_the_backend_with_the_fitted_fields():
    base = CPUBackend(CPU_X86)
    slower = with_parameters(base, {"gemm_eff_fp32": CPU_X86.gemm_eff_fp32 / 2, "overlap.compute_slowdown": 2.0})
    big = matmul(4096, 4096, 4096)
    assert slower.op_time_s(big, 0) == pytest.approx(2 * base.op_time_s(big, 0), rel=0.01)
    assert slower.overlap().compute_slowdown == 2.0
    with pytest.raises(CalibrationError, match="unknown parameter 'gemm_eff_fp64'"):
        with_parameters(base, {"gemm_eff_fp64": 0.5})
    with pytest.raises(CalibrationError, match="'gemm_eff_fp32' is a fraction"):
        with_parameters(base, {"gemm_eff_fp32": 1.5})


def test_compile_uses_the_calibration_and_refuses_another_backend(db):
    from echosim.compiler import compile as compile_model
    from echosim.plan import Cluster, Plan

    plan = Plan(dtype="fp32")
    model = TINY.with_(hidden=1024, heads=16, seq_len=512, vocab=1024)  # matmul-bound
    plain = compile_model(model, plan, Cluster("cpu-x86", 1, 2)).step_time_s
    calibrated = compile_model(model, plan, Cluster("cpu-x86", 1, 2, calibration=f"{db}#box")).step_time_s
    assert calibrated > 1.5 * plain  # gemm_eff 0.4 instead of 0.8
    with pytest.raises(CalibrationError, match=r"calibration 'box' was made for backend\(s\) cpu-x86, not 'h100-sxm'"):
        compile_model(TINY, plan, Cluster("h100-sxm", 1, 8, calibration=f"{db}#box"))


def test_compile_cli_takes_the_calibrations_backend(db, cli):
    result = CliRunner().invoke(
        cli, ["compile", "gpt3-125m", "--seq-len", "64", "--dtype", "fp32", "--calibration", f"{db}#box", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["backend"] == "cpu-x86"
    result = CliRunner().invoke(cli, ["compile", "gpt3-125m", "--calibration", f"{db}#nope"])
    assert result.exit_code == 1 and "no calibration named 'nope'" in result.output


def test_a_whole_database_file_applies_its_calibration_to_the_backends_it_covers(db, cli, monkeypatch):
    args = ["compile", "gpt3-125m", "--seq-len", "64", "--dtype", "fp32", "--backend", "cpu-x86", "--json"]

    def step_time(*extra: str) -> float:
        result = CliRunner().invoke(cli, [*args, *extra])
        assert result.exit_code == 0, result.output
        return json.loads(result.output)["step_time_s"]

    plain, named = step_time(), step_time("--calibration", f"{db}#box")
    assert step_time("--calibration", str(db)) == named != plain  # FILE: its most recent calibration
    monkeypatch.setenv("ECHOSIM_CALIBRATION", str(db))
    assert step_time() == named  # the variable is --calibration's default on the command line
    from echosim.compiler import compile as compile_model
    from echosim.plan import Cluster, Plan

    model = TINY.with_(hidden=1024, heads=16, seq_len=512, vocab=1024)
    uncalibrated = compile_model(model, Plan(dtype="fp32"), Cluster("cpu-x86", 1, 2)).step_time_s
    monkeypatch.delenv("ECHOSIM_CALIBRATION")
    assert compile_model(model, Plan(dtype="fp32"), Cluster("cpu-x86", 1, 2)).step_time_s == uncalibrated  # library
    gpu = load_backend("h100-sxm")
    assert apply_calibration(gpu, str(db)).inner is gpu.inner  # another backend's calibration in the file: not applied
    assert covered_backends(str(db)) == {"cpu-x86"}


def test_a_database_of_measured_rows_only_is_a_calibration_of_the_backends_it_measured(tmp_path):
    from echosim.calibrate.db import CalibrationDB

    path = tmp_path / "rows.sqlite"
    CalibrationDB(path).put("cpu-x86", "matmul", matmul_key(64, 64, 64), "fp32", 1e-3, "test")
    assert load_calibration(str(path)).backends == [] and covered_backends(str(path)) == {"cpu-x86"}
    backend = apply_calibration(
        __import__("echosim.backends.loading").backends.loading.load_backend("cpu-x86"), str(path)
    )
    assert backend.op_time_s(matmul(64, 64, 64), 0) == 1e-3
    with pytest.raises(CalibrationError, match="holds no calibration"):
        load_calibration(str(CalibrationDB(tmp_path / "empty.sqlite").path))


@pytest.mark.parametrize("name", ["tpu-v5p", "a100-80gb", "b200", "cpu-x86"])
def test_measured_rows_change_times_only_not_what_the_backend_is(tmp_path, name):
    """A calibrated backend keeps the node size, dtypes, formats and buffer policy of the one it
    wraps (a TPU slice stayed one node of 4,096 chips, not 8; A100 still refuses fp8)."""
    from echosim.calibrate import apply_measurements
    from echosim.calibrate.db import CalibrationDB

    path = tmp_path / "rows.sqlite"
    CalibrationDB(path).put(name, "matmul", matmul_key(64, 64, 64), "bf16", 1e-3, "test")
    plain = load_backend(name)
    calibrated = apply_measurements(plain, path)
    assert calibrated.node_devices(4096) == plain.node_devices(4096)
    assert calibrated.static_buffers == plain.static_buffers
    assert calibrated.formats() == plain.formats()
    assert [calibrated.supports_dtype(d) for d in ("fp8", "fp32")] == [plain.supports_dtype(d) for d in ("fp8", "fp32")]


# ---- fitting ------------------------------------------------------------------------------------------------


def test_fit_recovers_the_parameters_that_made_the_samples():
    truth = replace(
        CPU_X86,
        gemm_eff_fp32=0.37,
        stream_fraction=0.55,
        math_fraction=0.2,
        op_overhead_us=4.0,
        fresh_memory_GBps=1.7,
        bag_call_us=80.0,
        bag_lookup_ns=150.0,
    )
    samples = [Sample("matmul", "matmul", "fp32", m=n, n=n, k=n) for n in (64, 256, 1024, 2048)]
    samples += [Sample("memory", op, "fp32", nbytes=b) for op in ("copy", "gelu") for b in (2**16, 2**20, 2**24)]
    samples += [Sample("overhead", "add", "fp32", nbytes=96)]
    samples += [Sample("fresh", "zeros", "fp32", nbytes=b) for b in (40 * 2**20, 80 * 2**20)]
    samples += [
        Sample("embedding", f"embedding_bag_{d}", "fp32", m=256, n=ids, k=32, batch=256)
        for d in ("fwd", "bwd")
        for ids in (256, 1024, 4096)
    ]
    samples = [replace(s, seconds=predict_cpu(truth, s)) for s in samples]
    names = ("gemm_eff_fp32", "stream_fraction", "math_fraction", "op_overhead_us", "fresh_memory_GBps")
    names += ("bag_call_us", "bag_lookup_ns")
    knobs = [k for k in CPU_KNOBS if k.name in names]
    fitted = fit_spec(CPU_X86, knobs, samples, predict_cpu)
    for name in names:
        assert math.isclose(getattr(fitted, name), getattr(truth, name), rel_tol=0.02), name


# ---- a profiler trace -----------------------------------------------------------------------------------


def test_profile_import_keys_matmuls_like_the_ir(tmp_path, db):
    import torch

    from echosim.calibrate.profile import import_profile

    a, b, w = torch.randn(64, 32), torch.randn(32, 16), torch.nn.Linear(32, 8)
    with torch.profiler.profile(record_shapes=True) as prof:
        a @ b
        w(a)
        torch.bmm(torch.randn(4, 8, 16), torch.randn(4, 16, 8))
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    rows, counts = import_profile(trace, "box@cpu-x86")
    keys = {(r.shape, r.dtype) for r in rows}
    assert {
        (matmul_key(64, 16, 32), "fp32"),
        (matmul_key(64, 8, 32), "fp32"),
        (matmul_key(8, 8, 16, 4), "fp32"),
    } <= keys
    assert counts["kernels"] == len(rows) and all(r.seconds > 0 for r in rows)
    store = CalibrationStore(db)
    store.save("box", "cpu-x86", {}, {}, "profile", rows)
    store.close()
    backend = apply_calibration(
        __import__("echosim.backends.loading").backends.loading.load_backend("cpu-x86"), f"{db}#box"
    )
    measured = {r.shape: r.seconds for r in rows}[matmul_key(64, 16, 32)]
    assert backend.op_time_s(matmul(64, 16, 32), 0) == pytest.approx(measured)


def test_bad_profiles_are_one_line_errors(tmp_path):
    from echosim.calibrate.profile import import_profile

    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(CalibrationError, match="not a JSON trace"):
        import_profile(tmp_path / "x.json", "k")
    (tmp_path / "y.json").write_text(json.dumps({"traceEvents": [{"cat": "cpu_op", "ph": "X", "name": "aten::mm"}]}))
    with pytest.raises(CalibrationError, match="record_shapes=True"):
        import_profile(tmp_path / "y.json", "k")


# ---- the command -------------------------------------------------------------------------------------------


def test_calibrate_command_tiny_sweep(tmp_path, cli, monkeypatch):
    path = tmp_path / "not-yet" / "c.sqlite"  # $ECHOSIM_CALIBRATION naming a file (and folder) still to be created
    monkeypatch.setenv("ECHOSIM_CALIBRATION", str(path))
    listing = CliRunner().invoke(cli, ["calibrate", "--list"])
    assert listing.exit_code == 0 and "no calibrations yet (`echosim calibrate` writes them here)" in listing.output
    result = CliRunner().invoke(cli, ["calibrate", "--sweep", "tiny", "--ranks", "1", "--name", "t"])
    assert result.exit_code == 0, result.output
    assert path.exists()
    out = result.output
    assert "fitted constant(s):" in out and "gemm_eff_fp32" in out and "derived from the machine" in out
    assert "use it: echosim compile MODEL --backend cpu-x86 --calibration t" in out
    listing = CliRunner().invoke(cli, ["calibrate", "--list", "--db", str(path), "--json"])
    [cal] = json.loads(listing.output)
    params = cal["backends"]["cpu-x86"]["parameters"]
    assert {"gemm_eff_fp32", "stream_fraction", "op_overhead_us", "fresh_memory_GBps"} <= set(params)
    assert "peak_fp32_tflops" in params
    assert cal["backends"]["cpu-x86"]["machine"]["usable_cores"] >= 1
    # the machine-speed probe, timed as the benchmarks start and end, is stored with the machine for --check
    stored = cal["backends"]["cpu-x86"]["machine"]["probe"]
    assert stored["stream_s"] > 0 and stored["start"]["stream_s"] > 0 and stored["end"]["stream_s"] > 0
    check = CliRunner().invoke(cli, ["calibrate", "--check", "t"])
    assert check.exit_code == 0 and "probe now against calibration 't'" in check.output


def test_calibrate_command_errors(tmp_path, cli):
    result = CliRunner().invoke(
        cli, ["calibrate", "--backend", "h100-sxm", "--sweep", "tiny", "--db", str(tmp_path / "g.sqlite")]
    )
    assert result.exit_code == 1 and ("no CUDA device" in result.output or "GPU is" in result.output)
    result = CliRunner().invoke(cli, ["calibrate", "--no-bench", "--db", str(tmp_path / "g.sqlite")])
    assert result.exit_code == 2 and "--no-bench needs --from-profile" in result.output
    result = CliRunner().invoke(cli, ["calibrate", "--list", "--db", str(tmp_path / "none.sqlite"), "--json"])
    assert result.exit_code == 0 and json.loads(result.output) == []


@pytest.mark.slow
def test_gloo_collectives_between_two_processes():
    from echosim.calibrate.bench import bench_collectives

    samples = bench_collectives("tiny", ranks=2)
    assert {s.op for s in samples} == {"all_reduce", "all_gather", "broadcast"}
    assert all(s.seconds > 0 and s.ranks == 2 for s in samples)
    assert all(s.seconds <= s.wall_s and 0 < s.cpu_share <= 1 for s in samples)  # the CPU time of the slowest rank


def test_the_command_line_and_the_library_name_the_same_environment_variable() -> None:
    from echosim.calibrate.db import ENV_VAR
    from echosim.commands import options

    assert options.ENV_VAR == ENV_VAR  # options.py spells it out so that `echosim --help` stays light


def test_cost_applies_a_calibration_as_compile_does(db, cli):
    """`echosim cost --calibration` reads NAME, FILE and FILE#NAME as compile does, fitted parameters included
    (before, it took a file only, applied its measured rows alone, and said "no such file" to FILE#NAME)."""
    from echosim.backends.cpu import matmul_time_s

    args = ("--backend", "cpu-x86", "matmul", "--m", "256", "--n", "256", "--k", "256", "--dtype", "fp32", "--json")
    fitted = replace(CPU_X86, gemm_eff_fp32=0.4, op_overhead_us=3.0)
    for ref in (f"{db}#box", str(db)):  # the file's most recent calibration is the one made for this backend
        result = CliRunner().invoke(cli, ["cost", "--calibration", ref, *args])
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["time_s"] == pytest.approx(matmul_time_s(fitted, 256, 256, 256))
    plain = CliRunner().invoke(cli, ["cost", *args])
    assert json.loads(plain.output)["time_s"] == pytest.approx(matmul_time_s(CPU_X86, 256, 256, 256))
    wrong = CliRunner().invoke(cli, ["cost", "--calibration", f"{db}#box", "--backend", "h100-sxm", *args[2:]])
    assert wrong.exit_code == 1
    assert wrong.output.strip().splitlines() == [
        "Error: calibration 'box' was made for backend(s) cpu-x86, not 'h100-sxm'"
    ]


def test_search_uses_a_calibration_as_compile_does(db, cli):
    """`echosim search --calibration` (it had none: a calibrated CPU's layouts were ranked by the uncalibrated
    model) prices every layout with it, and names a calibration made for another backend once, in one line."""
    layout = ["--devices", "1", "--global-batch", "2", "--seq-len", "64", "--dtype", "fp32"]
    space = ["--space", "mb=2", "--space", "recompute=none", "--space", "zero=0", "--json"]
    searched = CliRunner().invoke(cli, ["search", "gpt3-125m", *layout, *space, "--calibration", f"{db}#box"])
    assert searched.exit_code == 0, searched.output
    [best] = json.loads(searched.output)["best"]
    compiled = CliRunner().invoke(
        cli, ["compile", "gpt3-125m", *layout, "--micro-batch", "2", "--calibration", f"{db}#box", "--json"]
    )
    report = json.loads(compiled.output)
    assert report["backend"] == "cpu-x86"  # the calibration's backend, --backend not given, as compile picks it
    assert best["step_time_s"] == pytest.approx(report["step_time_s"])
    plain = CliRunner().invoke(cli, ["search", "gpt3-125m", "--backend", "cpu-x86", *layout, *space])
    assert json.loads(plain.output)["best"][0]["step_time_s"] != pytest.approx(best["step_time_s"])
    wrong = CliRunner().invoke(cli, ["search", "gpt3-125m", "--backend", "h100-sxm", *layout, "--calibration",
                                     f"{db}#box"])  # fmt: skip
    assert wrong.exit_code == 1
    assert wrong.output.strip().splitlines() == [
        "Error: calibration 'box' was made for backend(s) cpu-x86, not 'h100-sxm'"
    ]
