"""What a newcomer meets first: derived degrees, refused nonsense, honest sequence and throughput figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from echosim.cli import cli

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = Path(__file__).parent / "configs"


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def report(*args: str) -> dict:  # type: ignore[type-arg]
    code, out = run("compile", *args, "--json")
    assert code == 0, out
    return json.loads(out)


def test_dp_is_derived_from_the_devices() -> None:
    r = report("gpt3-1.3b", "--devices", "64", "--tp", "4", "--seq-len", "128")
    assert (r["plan"]["tp"], r["plan"]["dp"], r["devices"]) == (4, 16, 64)


def test_devices_are_derived_from_the_degrees() -> None:
    r = report("gpt3-1.3b", "--tp", "2", "--dp", "4", "--seq-len", "128")
    assert r["devices"] == 8


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--devices", "64", "--tp", "3"], "--devices 64 is not a multiple of tp*pp = 3*1 = 3"),
        (["--seq-len", "0"], "--seq-len must be at least 1, got 0 (leave it out for the model's own)"),
        (["--seq-len", "-1"], "--seq-len must be at least 1, got -1"),
        (["--tp", "0"], "--tp must be at least 1, got 0"),
        (["--devices", "0"], "--devices must be at least 1, got 0"),
        (["--global-batch", "-8"], "--global-batch must be at least 1, got -8"),
        (["--vpp", "2"], "vpp=2 needs pipeline parallelism (pp > 1)"),
        (["--moe-imbalance", "3"], "--moe-imbalance 3 needs expert parallelism (ep > 1)"),
        (["--moe-router-groups", "8"], "--moe-router-groups 8 --moe-router-group-topk 0: give both"),
        (["--moe-capacity-factor", "1.25"], "--moe-capacity-factor 1.25 needs a mixture-of-experts model"),
    ],
)
def test_nonsense_is_refused_naming_the_option(args: list[str], message: str) -> None:
    code, out = run("compile", "gpt3-1.3b", *args)
    assert code == 1, out
    assert message in out and len(out.strip().splitlines()) == 1


def test_the_sequence_taken_from_the_model_is_reported() -> None:
    r = report("gpt3-1.3b")
    assert r["plan"]["seq_len"] == 2048
    assert r["tokens_per_s"] == pytest.approx(r["samples_per_s"] * 2048, rel=1e-5)
    code, out = run("compile", "gpt3-1.3b")
    assert code == 0 and "seq 2048" in out and "seq model" not in out


def test_an_image_model_reports_samples_per_second() -> None:
    args = [f"{ROOT / 'examples' / 'resnet50.py'}:model", "--dp", "8", "--global-batch", "256"]
    r = report(*args)
    assert r["tokens_per_s"] is None and r["plan"]["seq_len"] == 0
    assert r["samples_per_s"] == pytest.approx(256 / r["step_time_s"], rel=1e-5)
    code, out = run("compile", *args)
    assert code == 0 and "samples/s" in out and "tokens/s" not in out and "seq " not in out


def test_the_hf_sequence_note_says_when_it_is_capped(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    config = json.loads((CONFIGS / "tiny-llama.json").read_text())
    config["max_position_embeddings"] = 131072
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    r = report(f"hf:{path}")
    assert r["plan"]["seq_len"] == 8192
    assert "sequence length 8192: the config's max_position_embeddings 131072 capped at 8192" in " ".join(r["notes"])
