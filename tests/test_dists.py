"""echosim.dists reads what importlib.metadata reads (versions, entry points), without importing it."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

from echosim import dists

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["torch", "numpy", "click", "echosim", "transformers", "onnx", "no-such-dist-x"])
def test_versions_are_importlib_metadatas(name: str) -> None:
    try:
        expected = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        expected = None
    assert dists.version(name) == expected


def test_entry_points_are_importlib_metadatas() -> None:
    ours = sorted((e.name, e.value, e.dist.name, e.dist.version) for e in dists.entry_points("echosim"))
    theirs = sorted(
        (e.name, e.value, e.dist.name if e.dist else None, e.dist.version if e.dist else None)
        for e in importlib.metadata.entry_points(group="echosim")
    )
    assert ours == theirs
    assert dists.entry_points("no-such-group") == []


def test_an_installed_plugin_is_seen_at_once_and_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_plug.py").write_text("class Thing:\n    value = 3\n")
    info = tmp_path / "my_plug-1.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: My.Plug\nVersion: 1.2\n\nbody: x\n")
    (info / "entry_points.txt").write_text("[other]\nx = y\n\n[echosim]\n# comment\nplug = my_plug:Thing.value\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    (ep,) = [e for e in dists.entry_points("echosim") if e.name == "plug"]
    assert (ep.value, ep.dist.name, ep.dist.version) == ("my_plug:Thing.value", "My.Plug", "1.2")
    assert ep.load() == 3
    assert dists.version("my-plug") == "1.2"


def test_a_warm_compile_imports_no_importlib_metadata(tmp_path: Path) -> None:
    code = (
        f"import os, sys; os.environ['ECHOSIM_CACHE_DIR'] = {str(tmp_path)!r}\n"
        "from echosim.cli import cli\n"
        "try:\n"
        "    cli.main(['compile', 'gpt3-125m', '--seq-len', '128', '--json'], standalone_mode=False)\n"
        "finally:\n"
        "    print('META' if 'importlib.metadata' in sys.modules else 'NO-META', file=sys.stderr)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "ECHOSIM_VERIFY"}  # the suite's verifier reads networkx
    subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True, env=env)
    warm = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True, env=env)
    assert warm.stderr.strip().endswith("NO-META"), warm.stderr[-300:]
