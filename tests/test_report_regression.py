"""Refactors change no number: the ``--json`` report of each layout below is kept in tests/data/reports.

Every key of a stored report must be present with the same value (a refactor may add keys,
never change or drop one). ``ECHOSIM_UPDATE_REPORTS=1`` rewrites the stored files; do that
only for a change that is meant to move numbers, and say which in the commit.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from echosim.cli import cli

DATA = Path(__file__).parent / "data"
REPORTS = DATA / "reports"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# name -> compile arguments; together they cover every zoo family, parallelism, schedule,
# precision and backend kind, and each frontend (zoo, hf:, .onnx, .py).
LAYOUTS: dict[str, list[str]] = {
    "default": [],
    "gpt3-1.3b-dp8": ["gpt3-1.3b", "--dp", "8", "--global-batch", "64", "--seq-len", "2048"],
    "gpt3-13b-tp8-pp2-math": ["gpt3-13b", "--tp", "8", "--pp", "2", "--dp", "2", "--global-batch", "64",
                              "--attention", "math", "--dtype", "fp16", "--seq-len", "2048"],
    "llama3-8b-h100-tp2": ["llama3-8b", "--backend", "h100-sxm", "--tp", "2", "--dp", "4", "--global-batch", "32",
                           "--recompute", "selective", "--seq-len", "4096"],
    "llama3-70b-h100-tp8-pp4-dp2": ["llama3-70b", "--backend", "h100-sxm", "--tp", "8", "--pp", "4", "--dp", "2",
                                    "--global-batch", "64", "--seq-len", "8192", "--recompute", "selective"],
    "llama3-70b-sp": ["llama3-70b", "--backend", "h100-sxm", "--tp", "8", "--pp", "4", "--dp", "2", "--sp",
                      "--global-batch", "64", "--seq-len", "8192"],
    "llama3-70b-vpp": ["llama3-70b", "--backend", "h100-sxm", "--tp", "8", "--pp", "4", "--dp", "2", "--vpp", "5",
                       "--global-batch", "64", "--seq-len", "4096"],
    "llama3-70b-gpipe": ["llama3-70b", "--backend", "h100-sxm", "--tp", "8", "--pp", "4", "--dp", "2",
                         "--schedule", "gpipe", "--global-batch", "32", "--seq-len", "4096", "--recompute", "full"],
    "llama3-70b-zb": ["llama3-70b", "--backend", "h100-sxm", "--tp", "8", "--pp", "4", "--dp", "2",
                      "--schedule", "zb-h1", "--global-batch", "64", "--seq-len", "4096"],
    "mixtral-dualpipe": ["mixtral-8x7b", "--backend", "h100-sxm", "--pp", "4", "--ep", "4", "--dp", "4",
                         "--schedule", "dualpipe", "--global-batch", "32", "--seq-len", "2048"],
    "llama3-70b-balance-cost": ["llama3-70b", "--backend", "h100-sxm", "--tp", "8", "--pp", "8",
                                "--pp-balance", "cost", "--global-batch", "64", "--seq-len", "4096"],
    "llama3-70b-tp-overlap": ["llama3-70b", "--backend", "h100-sxm", "--tp", "8", "--pp", "4", "--dp", "2", "--sp",
                              "--tp-overlap", "--global-batch", "64", "--seq-len", "8192"],
    "llama3-8b-cp2-ring": ["llama3-8b", "--backend", "h100-sxm", "--tp", "4", "--cp", "2", "--dp", "2",
                           "--global-batch", "16", "--seq-len", "32768"],
    "llama3-8b-cp4-allgather": ["llama3-8b", "--backend", "h100-sxm", "--tp", "2", "--cp", "4", "--cp-comm",
                                "all_gather", "--no-cp-balance", "--global-batch", "8", "--seq-len", "65536"],
    "llama3-8b-zero1": ["llama3-8b", "--backend", "a100-80gb", "--dp", "16", "--zero", "1", "--global-batch", "64"],
    "llama3-8b-zero2": ["llama3-8b", "--backend", "a100-80gb", "--dp", "16", "--zero", "2", "--global-batch", "64"],
    "llama3-8b-zero3": ["llama3-8b", "--backend", "h100-sxm", "--dp", "64", "--zero", "3", "--global-batch", "128",
                        "--micro-batch", "2"],
    "llama3-8b-fp8": ["llama3-8b", "--backend", "h100-sxm", "--tp", "2", "--dp", "4", "--dtype", "fp8",
                      "--global-batch", "32"],
    "llama3-8b-b200-fp8": ["llama3-8b", "--backend", "b200", "--dp", "8", "--dtype", "fp8", "--global-batch", "64"],
    "llama2-7b-fp32-full-recompute": ["llama2-7b", "--backend", "a100-80gb", "--dp", "8", "--dtype", "fp32",
                                  "--global-batch", "16", "--recompute", "full"],
    "llama3-405b-16k": ["llama3-405b", "--backend", "h100-sxm", "--devices", "16384", "--tp", "8", "--pp", "16",
                        "--dp", "128", "--cp", "1", "--global-batch", "2048", "--seq-len", "8192", "--vpp", "7"],
    "mixtral-8x7b-ep8": ["mixtral-8x7b", "--backend", "h100-sxm", "--tp", "2", "--ep", "8", "--dp", "8",
                         "--global-batch", "64", "--seq-len", "4096"],
    "mixtral-8x22b-ep-capacity": ["mixtral-8x22b", "--backend", "h200", "--tp", "4", "--pp", "4", "--ep", "8",
                                  "--dp", "8", "--global-batch", "128", "--moe-capacity-factor", "1.25",
                                  "--moe-imbalance", "1.3", "--seq-len", "4096"],
    "qwen3-30b-a3b-ep": ["qwen3-30b-a3b", "--backend", "h100-sxm", "--ep", "8", "--dp", "8",
                         "--global-batch", "64", "--seq-len", "4096", "--zero", "1"],
    "qwen1.5-moe-sp-ep": ["qwen1.5-moe-a2.7b", "--backend", "a100-80gb", "--tp", "2", "--sp", "--ep", "4",
                          "--dp", "4", "--global-batch", "32", "--seq-len", "4096"],
    "gpt-oss-120b": ["gpt-oss-120b", "--backend", "h100-sxm", "--ep", "8", "--dp", "8", "--global-batch", "64"],
    "tpu-v5p-llama3-8b": ["llama3-8b", "--backend", "tpu-v5p", "--devices", "64", "--devices-per-node", "64",
                          "--dp", "64", "--zero", "3", "--global-batch", "256"],
    "tpu-v4-gpt3-13b": ["gpt3-13b", "--backend", "tpu-v4", "--tp", "4", "--dp", "16", "--devices-per-node", "64",
                        "--global-batch", "64", "--seq-len", "2048"],
    "tpu-v5e-llama2-7b": ["llama2-7b", "--backend", "tpu-v5e", "--dp", "16", "--devices-per-node", "16",
                          "--global-batch", "64", "--zero", "3"],
    "tpu-v6e-llama3-8b": ["llama3-8b", "--backend", "tpu-v6e", "--tp", "4", "--dp", "64", "--devices-per-node", "256",
                          "--global-batch", "256", "--seq-len", "8192"],
    "cpu-gpt3-125m": ["gpt3-125m", "--backend", "cpu-x86", "--devices-per-node", "1", "--dp", "2",
                      "--global-batch", "4", "--seq-len", "256", "--dtype", "fp32"],
    "cpu-gpt3-125m-pp2": ["gpt3-125m", "--backend", "cpu-x86", "--devices-per-node", "2", "--pp", "2",
                      "--global-batch", "4", "--seq-len", "128", "--dtype", "fp32"],
    "h800-llama2-70b": ["llama2-70b", "--backend", "h800", "--tp", "8", "--pp", "4", "--dp", "4",
                        "--global-batch", "256", "--seq-len", "4096", "--recompute", "full"],
    "gb200-llama3-70b": ["llama3-70b", "--backend", "gb200", "--devices-per-node", "72", "--tp", "4", "--pp", "2",
                         "--dp", "9", "--global-batch", "72", "--seq-len", "8192"],
    "onnx-block": [str(DATA / "block.onnx"), "--backend", "h100-sxm", "--dp", "2", "--micro-batch", "4",
                   "--seq-len", "64", "--global-batch", "16"],
    "hf-tiny-llama-tp2": [f"hf:{Path(__file__).parent / 'configs' / 'tiny-llama.json'}", "--backend", "h100-sxm",
                          "--tp", "2", "--dp", "2", "--global-batch", "8"],
    "hf-tiny-mixtral": [f"hf:{Path(__file__).parent / 'configs' / 'tiny-mixtral.json'}", "--backend", "a100-80gb",
                        "--dp", "2", "--global-batch", "4"],
    "py-resnet50": [f"{EXAMPLES / 'resnet50.py'}:model", "--backend", "a100-80gb", "--dp", "8",
                    "--global-batch", "256", "--micro-batch", "32"],
}  # fmt: skip

# Paths inside a report that name this checkout; they are compared without the directory.
_PATH_KEYS = ("model",)


def _report(args: list[str]) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["compile", *args, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    for key in _PATH_KEYS:
        if isinstance(data.get(key), str) and os.sep in data[key]:
            data[key] = Path(data[key].removeprefix("hf:")).name
    return data


def _contained(stored: Any, now: Any, where: str = "") -> list[str]:
    """Where ``now`` differs from ``stored``, ignoring keys that only ``now`` has."""
    if isinstance(stored, dict) and isinstance(now, dict):
        diffs = []
        for key, value in stored.items():
            if key not in now:
                diffs.append(f"{where}.{key}: missing")
            else:
                diffs += _contained(value, now[key], f"{where}.{key}")
        return diffs
    if isinstance(stored, list) and isinstance(now, list):
        if len(stored) != len(now):
            return [f"{where}: {len(stored)} items, now {len(now)}"]
        return [d for i, (a, b) in enumerate(zip(stored, now, strict=True)) for d in _contained(a, b, f"{where}[{i}]")]
    return [] if stored == now else [f"{where}: {stored!r} -> {now!r}"]


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_report_unchanged(name: str) -> None:
    if name.startswith("hf-"):
        pytest.importorskip("transformers")
    if name.startswith("onnx-"):
        pytest.importorskip("onnx")
    path = REPORTS / f"{name}.json"
    now = _report(LAYOUTS[name])
    if os.environ.get("ECHOSIM_UPDATE_REPORTS") or not path.exists():
        path.write_text(json.dumps(now, indent=2, sort_keys=True) + "\n")
        if not os.environ.get("ECHOSIM_UPDATE_REPORTS"):
            pytest.fail(f"{path.name} was missing and has been written; rerun")
        return
    diffs = _contained(json.loads(path.read_text()), now)
    assert not diffs, f"{name}: the report changed:\n" + "\n".join(diffs[:20])
