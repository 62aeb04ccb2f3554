"""The installable example plugin (examples/echosim-mi300x): loads, costs, validates its spec, runs end to end."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from echosim.backends.base import Backend, Placement
from echosim.backends.loading import load_backend
from echosim.ir.ops import OpKind
from echosim.plugins import load_registry

PLUGIN_DIR = Path(__file__).resolve().parent.parent / "examples" / "echosim-mi300x"


def installed() -> bool:
    return any(ep.name == "mi300x" for ep in importlib.metadata.entry_points(group="echosim"))


@pytest.fixture(scope="module")
def plugin():
    if not installed():
        sys.path.insert(0, str(PLUGIN_DIR))
    return importlib.import_module("echosim_mi300x")


def test_the_plugin_registers_an_mi300x_backend(plugin):
    registry = load_registry(include_entrypoints=False, extra_plugins=[plugin])
    assert registry.errors == []
    backend = load_backend("mi300x", registry)
    assert isinstance(backend.inner, Backend) and backend.owner == "echosim_mi300x"
    d = backend.describe()
    assert d["peak_bf16_tflops"] == 1307.4 and d["devices_per_node"] == 8 and "amd.com" in d["source"]


def test_rccl_style_collectives(plugin):
    from echosim_mi300x.model import collective_time_s
    from echosim_mi300x.spec import MI300X

    size = 2**30
    ar = collective_time_s(MI300X, OpKind.ALL_REDUCE, size, Placement(8, 1, 8))
    busbw = size * 2 * 7 / 8 / ar / 1e9
    assert busbw == pytest.approx(7 * 64 * 370 / 450, rel=0.03)  # seven xGMI links at NCCL's ring share
    pair = collective_time_s(MI300X, OpKind.ALL_REDUCE, size, Placement(2, 1, 2, 4))
    assert pair > 3 * ar  # a pair of GPUs has only one 64 GB/s link between them: no switch
    across = collective_time_s(MI300X, OpKind.ALL_REDUCE, size, Placement(16, 2, 8))
    assert across > ar


def test_a_bad_spec_names_the_plugin_and_the_field(plugin):
    from echosim_mi300x.spec import MI300X, SpecError

    with pytest.raises(SpecError, match=r"^plugin 'mi300x': device 'mi300x': field 'hbm_GBps' must be positive"):
        dataclasses.replace(MI300X, hbm_GBps=-1.0)
    with pytest.raises(SpecError, match="field 'xgmi_links' must connect every pair"):
        dataclasses.replace(MI300X, xgmi_links=4)


@pytest.mark.slow
@pytest.mark.skipif(not installed(), reason="pip install -e examples/echosim-mi300x (CI installs it)")
def test_installed_plugin_is_listed_and_compiles():
    from echosim.cli import cli
    from echosim.plugins import get_registry

    get_registry.cache_clear()
    if "cost" not in cli.commands:
        get_registry().add_commands(cli)
    runner = CliRunner()
    listed = runner.invoke(cli, ["backends", "--json"])
    assert listed.exit_code == 0
    rows = {r["name"]: r for r in json.loads(listed.output[listed.output.index("[") :])}
    assert rows["mi300x"]["plugin"] == "mi300x" and rows["mi300x"]["peak_bf16_tflops"] == 1307.4
    result = runner.invoke(
        cli, ["compile", "gpt3-125m", "--backend", "mi300x", "--tp", "4", "--dp", "2", "--seq-len", "256", "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["backend"] == "mi300x" and report["step_time_s"] > 0
