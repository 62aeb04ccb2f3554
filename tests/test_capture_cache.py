"""The capture cache: IR as JSON data keyed by what defines the model; damaged or foreign entries are misses."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from echosim.frontend import CaptureSpec, cache, capture_named
from echosim.frontend.capture import _capture_arch_cached
from echosim.ir.graph import Graph
from echosim.ir.printer import print_graph
from echosim.ir.serialize import FORMAT, GraphDataError, graph_from_data, graph_to_data

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = Path(__file__).parent / "configs"

MODEL_PY = """
import torch
from torch import nn

class Net(nn.Module):
    seq_len = 8

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(64, WIDTH)
        self.out = nn.Linear(WIDTH, 64)

    def forward(self, ids):
        return self.out(self.emb(ids))

def model():
    return Net()
"""


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ECHOSIM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ECHOSIM_NO_CACHE", raising=False)
    _capture_arch_cached.cache_clear()
    return tmp_path / "cache" / "capture"


def entries(root: Path) -> list[Path]:
    return sorted(root.glob("*.json")) if root.exists() else []


def test_a_graph_survives_the_round_trip_through_json(tiny_gpt: Graph, tiny_llama: Graph) -> None:
    for graph in (tiny_gpt, tiny_llama):
        data = json.loads(json.dumps(graph_to_data(graph)))
        back = graph_from_data(data)
        assert print_graph(back) == print_graph(graph)
        assert back.param_count() == graph.param_count()
        assert (back.inputs, back.outputs, back.grads, back.repeats) == (
            graph.inputs,
            graph.outputs,
            graph.grads,
            graph.repeats,
        )
        assert all(back.users(n.id) == graph.users(n.id) for n in graph)


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda d: d.update(format=FORMAT + 1), "format"),
        (lambda d: d["nodes"][1].__setitem__(1, "no-such-op"), "no-such-op"),
        (lambda d: d["nodes"][1].__setitem__(2, [10**6]), "no earlier node"),
        (lambda d: d["nodes"][1].__setitem__(3, [True]), "integer"),
        (lambda d: d["nodes"][1].__setitem__(5, "os.system"), "cannot carry"),
        (lambda d: d["nodes"][1][6].__setitem__("evil", 1), "unknown attribute"),
        (lambda d: d.update(outputs=[10**6]), "names no node"),
        (lambda d: d["nodes"].__setitem__(1, d["nodes"][0]), "defined twice"),
        (lambda d: d.update(repeats={"layers.0": -1}), "repeats"),
    ],
)
def test_data_that_is_not_an_ir_graph_is_refused(tiny_gpt: Graph, damage, why: str) -> None:  # type: ignore[no-untyped-def]
    data = json.loads(json.dumps(graph_to_data(tiny_gpt)))
    damage(data)
    with pytest.raises(GraphDataError, match=why):
        graph_from_data(data)


def test_a_zoo_model_is_captured_once_and_read_back_the_same(cache_dir: Path) -> None:
    spec = CaptureSpec(1, 128, "bf16")
    fresh, messages, params = capture_named("gpt3-125m", spec)
    [entry] = entries(cache_dir)
    _capture_arch_cached.cache_clear()  # a new process would not have the in-memory copy
    again, messages_again, params_again = capture_named("gpt3-125m", spec)
    assert again is not fresh
    assert print_graph(again) == print_graph(fresh)
    assert (messages_again, params_again) == (messages, params)
    assert entries(cache_dir) == [entry]
    capture_named("gpt3-125m", CaptureSpec(2, 128, "bf16"))  # another micro-batch is another capture
    assert len(entries(cache_dir)) == 2


@pytest.mark.parametrize("garbage", [b"", b"{not json", b'{"entry_format": 1}', b"\x80\x81", b"[1, 2]"])
def test_a_damaged_entry_is_a_miss_and_is_rewritten(cache_dir: Path, garbage: bytes) -> None:
    spec = CaptureSpec(1, 128, "bf16")
    fresh = print_graph(capture_named("gpt3-125m", spec)[0])
    [entry] = entries(cache_dir)
    entry.write_bytes(garbage)
    _capture_arch_cached.cache_clear()
    assert print_graph(capture_named("gpt3-125m", spec)[0]) == fresh
    assert json.loads(entry.read_text())["entry_format"] == cache.ENTRY_FORMAT


def test_a_foreign_entry_under_the_key_is_a_miss(cache_dir: Path) -> None:
    spec = CaptureSpec(1, 128, "bf16")
    fresh = print_graph(capture_named("gpt3-125m", spec)[0])
    [entry] = entries(cache_dir)
    data = json.loads(entry.read_text())
    data["key"] = "0" * 64  # an entry copied from elsewhere
    data["graph"]["nodes"] = data["graph"]["nodes"][:1]
    entry.write_text(json.dumps(data))
    _capture_arch_cached.cache_clear()
    assert print_graph(capture_named("gpt3-125m", spec)[0]) == fresh


def test_a_model_file_is_keyed_by_its_bytes(cache_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "net.py"
    path.write_text(textwrap.dedent(MODEL_PY).replace("WIDTH", "32"))
    source = f"{path}:model"
    narrow = capture_named(source, CaptureSpec())
    assert len(entries(cache_dir)) == 1
    assert capture_named(source, CaptureSpec())[2] == narrow[2]  # a hit
    path.write_text(textwrap.dedent(MODEL_PY).replace("WIDTH", "48"))
    wide = capture_named(source, CaptureSpec())
    assert wide[2] > narrow[2]
    assert len(entries(cache_dir)) == 2


def test_a_changed_module_the_model_imports_makes_the_entry_stale(
    cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    monkeypatch.syspath_prepend(str(lib))
    (lib / "echosim_test_width.py").write_text("WIDTH = 32\n")
    path = tmp_path / "net.py"
    path.write_text("from echosim_test_width import WIDTH\n" + textwrap.dedent(MODEL_PY))
    source = f"{path}:model"
    try:
        narrow = capture_named(source, CaptureSpec())[2]
        [entry] = entries(cache_dir)
        assert str(lib / "echosim_test_width.py") in entry.read_text()
        (lib / "echosim_test_width.py").write_text("WIDTH = 48\n")
        sys.modules.pop("echosim_test_width")
        assert capture_named(source, CaptureSpec())[2] > narrow
    finally:
        sys.modules.pop("echosim_test_width", None)


def test_an_hf_config_is_cached(cache_dir: Path) -> None:
    pytest.importorskip("transformers")
    spec = CaptureSpec(1, 16, "bf16")
    source = f"hf:{CONFIGS / 'tiny-llama.json'}"
    fresh = capture_named(source, spec)
    assert len(entries(cache_dir)) == 1
    again = capture_named(source, spec)
    assert print_graph(again[0]) == print_graph(fresh[0]) and again[1:] == fresh[1:]


def test_no_cache_writes_nothing(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ECHOSIM_NO_CACHE", "1")
    capture_named("gpt3-125m", CaptureSpec(1, 128, "bf16"))
    assert entries(cache_dir) == []


def test_an_unwritable_cache_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("ECHOSIM_CACHE_DIR", str(blocker))  # a file where the folder should be
    _capture_arch_cached.cache_clear()
    graph, _, _ = capture_named("gpt3-125m", CaptureSpec(1, 128, "bf16"))
    assert len(graph) > 0


@pytest.mark.parametrize("layout", [["--pp", "2", "--vpp", "2"], ["--pp", "2", "--schedule", "zb-h1"]])
def test_a_repeated_compile_imports_no_torch_and_no_numpy(tmp_path: Path, layout: list[str]) -> None:
    """The second compile reads the IR back (no torch) and times its one layout in plain Python
    (timeline.sequential: no numpy, whose import and BLAS threads cost more than the compile)."""
    env_code = f"import os; os.environ['ECHOSIM_CACHE_DIR'] = {str(tmp_path)!r}\n"
    args = ["compile", "gpt3-125m", "--seq-len", "128", "--devices", "4", "--global-batch", "8", *layout, "--json"]
    code = env_code + textwrap.dedent(
        f"""
        import sys
        from echosim.cli import cli
        try:
            cli.main({args!r}, standalone_mode=False)
        finally:
            print("TORCH" if "torch" in sys.modules else "NO-TORCH", file=sys.stderr)
            print("NUMPY" if "numpy" in sys.modules else "NO-NUMPY", file=sys.stderr)
        """
    )
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert first.stderr.split()[-2:] == ["TORCH", "NUMPY"]  # the capture imports torch (and numpy with it)
    assert second.stderr.split()[-2:] == ["NO-TORCH", "NO-NUMPY"], second.stderr[-500:]
    assert first.stdout == second.stdout  # the same report, byte for byte


def test_a_cold_zoo_capture_imports_no_dynamo(tmp_path: Path) -> None:
    """torch._refs' type-promotion wrapper imports all of torch._dynamo on its first call on meta
    tensors (frontend.fx.skip_dynamo_import): a cold compile of a zoo model must not pay for it."""
    code = f"import os; os.environ['ECHOSIM_CACHE_DIR'] = {str(tmp_path)!r}\n" + textwrap.dedent(
        """
        import sys
        from echosim.cli import cli
        try:
            cli.main(["compile", "gpt3-125m", "--seq-len", "128", "--json"], standalone_mode=False)
        finally:
            print("DYNAMO" if "torch._dynamo" in sys.modules else "NO-DYNAMO", file=sys.stderr)
        """
    )
    cold = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert json.loads(cold.stdout)["step_time_s"] > 0
    assert cold.stderr.strip().endswith("NO-DYNAMO"), cold.stderr[-500:]
