"""compile's cluster-dynamics options through click's runner: sections, determinism, one-line errors."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from echosim.cli import cli
from echosim.dynamics.stragglers import expected_max_empirical

SMALL = ["gpt3-1.3b", "--backend", "h100-sxm", "--tp", "2", "--pp", "2", "--dp", "2", "--global-batch", "16"]


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def test_sections_in_json_and_text_and_byte_identical() -> None:
    args = ["compile", *SMALL, "--mtbf-hours", "50000", "--restart-minutes", "10", "--tokens", "1e11",
            "--straggler-cv", "0.05", "--dp-strategy", "diloco", "--inner-steps", "100", "--json"]  # fmt: skip
    code, out = run(*args)
    assert code == 0, out
    _, out2 = run(*args)
    assert out2 == out  # byte-identical
    r = json.loads(out)
    g, s, d = r["goodput"], r["stragglers"], r["dp_strategy"]
    assert 0 < g["goodput"] < 1 and g["time_to_train_days"] > g["ideal_days"]
    assert s["ideal_step_s"] == r["step_time_s"] and s["expected_step_s"] > r["step_time_s"]
    # time to train sees the straggling step
    assert g["ideal_days"] == pytest.approx(1e11 / (r["tokens_per_s"] / s["slowdown"]) / 86400, rel=1e-4)
    assert d["communication_reduction"] == pytest.approx(100.0) and d["replicas"] == 2
    code, text = run(*[a for a in args if a != "--json"])
    assert code == 0, text
    assert "goodput" in text and "stragglers (normal, cv 0.05)" in text and "DiLoCo H=100" in text


def test_plain_compile_json_has_no_dynamics_keys() -> None:
    code, out = run("compile", *SMALL, "--json")
    assert code == 0, out
    assert not {"goodput", "stragglers", "dp_strategy"} & set(json.loads(out))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--straggler-cv", "-0.1"], "--straggler-cv must be 0 or more"),
        (["--straggler-cv", "nan"], "--straggler-cv must be 0 or more"),
        (["--straggler-dist", "lognormal"], "--straggler-dist needs --straggler-cv"),
        (["--straggler-file", "/nonexistent/times.txt"], "--straggler-file /nonexistent/times.txt: cannot read"),
        (["--mtbf-hours", "0"], "--mtbf-hours must be a positive"),
        (["--mtbf-hours", "1000", "--storage", "floppy"], "--storage 'floppy': unknown storage"),
        (["--mtbf-hours", "1000", "--checkpoint-interval", "soon"], "--checkpoint-interval must be 'auto' or minutes"),
        (["--mtbf-hours", "1000", "--restart-minutes", "-1"], "--restart-minutes must be 0 or more"),
        (["--restart-minutes", "5"], "--restart-minutes needs --mtbf-hours"),
        (["--tokens", "1e9"], "--tokens needs --mtbf-hours"),
        (["--mtbf-hours", "1000", "--tokens", "-5"], "--tokens must be a positive"),
        (["--inner-steps", "10"], "--inner-steps needs --dp-strategy"),
        (["--dp-strategy", "diloco", "--inner-steps", "0"], "--inner-steps must be at least 1"),
        (["--dp-strategy", "gossip", "--slow-link-gbps", "-1"], "--slow-link-gbps must be a positive"),
    ],
)
def test_bad_input_is_one_line(extra: list[str], message: str) -> None:
    code, out = run("compile", *SMALL, *extra)
    assert code == 1, out
    assert out.strip().splitlines() == [out.strip()] and "Traceback" not in out
    assert message in out


def test_straggler_file_through_the_command_line(tmp_path) -> None:
    times = tmp_path / "times.txt"
    times.write_text("1.00\n1.02\n0.98\n1.10\n")
    code, out = run("compile", *SMALL, "--straggler-file", str(times), "--json")
    assert code == 0, out
    s = json.loads(out)["stragglers"]
    assert s["distribution"] == "empirical" and s["source"] == str(times)
    # eight devices each drawing from four equally likely times: the slowest is 1.10 unless all eight miss it
    assert s["slowdown"] == pytest.approx(expected_max_empirical([1.0, 1.02, 0.98, 1.1], 8), rel=1e-5)
    code, out = run("compile", *SMALL, "--straggler-file", str(times), "--straggler-dist", "normal")
    assert code == 1 and "--straggler-dist applies to --straggler-cv" in out


def test_dp_strategy_without_data_parallelism_is_one_line() -> None:
    code, out = run("compile", "gpt3-125m", "--backend", "h100-sxm", "--tp", "2", "--dp-strategy", "diloco")
    assert code == 1 and out.count("\n") == 1
    assert "one data-parallel replica (dp*cp = 1)" in out


def test_async_checkpoint_on_a_backend_without_a_host_link_is_one_line() -> None:
    code, out = run("compile", "gpt3-125m", "--backend", "tpu-v5p", "--dp", "2", "--mtbf-hours", "1000",
                    "--checkpoint-mode", "async")  # fmt: skip
    assert code == 1, out
    assert out.strip().count("\n") == 0 and "no host-link bandwidth known for backend 'tpu-v5p'" in out
