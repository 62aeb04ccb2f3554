"""The command line through click's runner: output, JSON contract, determinism, bad input."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from echosim.cli import cli

SMALL = ["gpt3-1.3b", "--backend", "a100-80gb", "--tp", "2", "--pp", "2", "--dp", "2", "--global-batch", "16"]


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


@pytest.mark.slow
def test_default_compile_is_the_gpt3_reference_run() -> None:
    code, out = run("compile", "--json")
    assert code == 0, out
    report = json.loads(out)
    assert report["model"] == "gpt3-175b" and report["devices"] == 1024
    assert report["plan"]["tp"] == 8 and report["plan"]["pp"] == 16 and report["plan"]["dp"] == 8
    assert report["step_time_s"] == pytest.approx(32.0, rel=0.15)  # Narayanan et al. 2021: ~140 TFLOP/s/GPU


def test_json_contract_and_breakdown_adds_up() -> None:
    code, out = run("compile", *SMALL, "--json")
    assert code == 0, out
    r = json.loads(out)
    for key in ("step_time_s", "tokens_per_s", "mfu", "hfu", "tflops_per_device", "params", "memory", "breakdown"):
        assert key in r
    assert r["params"] == 1_317_654_528
    assert 0 < r["mfu"] == r["hfu"] < 1  # no recompute: model FLOPs are hardware FLOPs
    assert sum(r["breakdown"].values()) == pytest.approx(r["step_time_s"], rel=1e-4)
    assert r["tokens_per_s"] == pytest.approx(16 * 2048 / r["step_time_s"], rel=1e-5)
    assert [m["stage"] for m in r["memory"]] == [0, 1]


def test_same_inputs_same_bytes() -> None:
    assert run("compile", *SMALL, "--json") == run("compile", *SMALL, "--json")


def test_summary_and_trace(tmp_path) -> None:  # type: ignore[no-untyped-def]
    trace = tmp_path / "t.json"
    out_file = tmp_path / "r.json"
    code, out = run("compile", *SMALL, "--trace", str(trace), "--out", str(out_file))
    assert code == 0, out
    assert "step time" in out and "where the time goes" in out
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["name"] for e in events}
    assert {"F0", "B0", "optimizer step"} <= names
    assert all(e["dur"] >= 0 for e in events if e["ph"] == "X")
    assert json.loads(out_file.read_text())["model"] == "gpt3-1.3b"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tp", "2", "--pp", "2", "--dp", "2", "--devices", "16"], "tp*pp*dp = 2*2*2 = 8 does not equal devices=16"),
        (["--tp", "3"], "tp=3 does not divide attention heads (16)"),
        (["--pp", "32"], "pp=32 exceeds the number of layers (24)"),
        (["--backend", "tpu-v9"], "unknown backend 'tpu-v9'"),
        (["--global-batch", "3", "--dp", "2"], "global batch 3 is not a multiple of micro-batch*dp = 1*2"),
        # a node larger than the hardware's: the layout's error, not blamed on the backend
        (
            ["--backend", "h100-sxm", "--dp", "16", "--devices-per-node", "16"],
            "--devices-per-node 16: a h100-sxm node holds 8 devices",
        ),
        (
            ["--backend", "cpu-x86", "--dp", "8", "--devices-per-node", "4"],
            "--devices-per-node 4: a cpu-x86 node holds 2 devices",
        ),
    ],
)
def test_bad_layouts_are_one_line(args: list[str], message: str) -> None:
    code, out = run("compile", "gpt3-1.3b", *args)
    assert code == 1
    assert message in out
    assert "Traceback" not in out and len(out.strip().splitlines()) == 1


def test_unknown_model_is_one_line() -> None:
    code, out = run("compile", "gpt-9000")
    assert code == 1 and "unknown model 'gpt-9000'" in out and len(out.strip().splitlines()) == 1


def test_a_mistyped_model_or_backend_names_what_it_likely_meant() -> None:
    code, out = run("compile", "llama3-8x", "--backend", "h100-sxm")
    assert code == 1 and "(did you mean llama3-8b" in out and len(out.strip().splitlines()) == 1
    code, out = run("compile", "gpt3-1.3b", "--backend", "h100")
    assert code == 1 and "unknown backend 'h100': did you mean h100-96gb, h100-a3mega, h100-sxm?" in out


@pytest.mark.parametrize("command", ["backends", "models", "plugins"])
def test_listings_have_json(command: str) -> None:
    code, out = run(command, "--json")
    assert code == 0, out
    data = json.loads(out)
    rows = data["plugins"] if command == "plugins" else data
    assert rows
    if command == "models":
        assert {"gpt3-175b", "llama3-70b"} <= {r["name"] for r in rows}
    if command == "backends":
        a100 = next(r for r in rows if r["name"] == "a100-80gb")
        assert a100["plugin"] == "echosim.backends.plugin" and "source" in a100


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pp", "2", "--vpp", "2", "--global-batch", "3"], "needs micro-batches (3) to be a multiple of pp=2"),
        (["--pp", "2", "--vpp", "2", "--schedule", "gpipe"], "vpp=2 needs the interleaved 1F1B schedule"),
        (["--pp", "8", "--vpp", "4", "--global-batch", "8"], "pp*vpp=32 exceeds the number of layers (24)"),
        (["--dp", "4", "--ep", "3"], "ep=3 does not divide tp*cp*dp = 4"),
    ],
)
def test_schedule_constraints_are_named(args: list[str], message: str) -> None:
    code, out = run("compile", "gpt3-1.3b", *args)
    assert code == 1 and message in out, out


def test_fp8_and_zero_bubble_and_fsdp_compile() -> None:
    base = ["compile", "gpt3-1.3b", "--backend", "h100-sxm", "--pp", "2", "--dp", "4", "--global-batch", "32", "--json"]
    plain = json.loads(run(*base)[1])
    fp8 = json.loads(run(*base, "--dtype", "fp8")[1])
    zb = json.loads(run(*base, "--schedule", "zb-h1")[1])
    fsdp = json.loads(run(*base, "--zero", "3")[1])
    assert fp8["breakdown"]["compute.matmul"] < plain["breakdown"]["compute.matmul"]
    assert zb["step_time_s"] < plain["step_time_s"]
    assert fsdp["memory"][0]["optimizer"] * 4 == pytest.approx(plain["memory"][0]["optimizer"], rel=1e-6)
    assert "comm.fsdp" in fsdp["breakdown"]


def test_cost_balanced_stages_unload_the_output_layer() -> None:
    base = ["compile", "llama3-8b", "--backend", "h100-sxm", "--pp", "4", "--dp", "2", "--global-batch", "64", "--json"]
    uniform = json.loads(run(*base)[1])
    cost = json.loads(run(*base, "--pp-balance", "cost")[1])
    assert [s["layers"] for s in uniform["stages"]] == [8, 8, 8, 8]
    assert cost["stages"][-1]["layers"] < 8 and sum(s["layers"] for s in cost["stages"]) == 32
    assert cost["step_time_s"] < uniform["step_time_s"]
