"""`echosim compile MODEL` for every kind of MODEL, and one clear line for every kind of bad one."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from echosim.cli import cli

CONFIGS = Path(__file__).parent / "configs"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["compile", *args])
    return result.exit_code, result.output


def test_hf_config_compiles_with_notes_in_the_report() -> None:
    pytest.importorskip("transformers")
    code, out = run(f"hf:{CONFIGS}/tiny-llama.json", "--backend", "null", "--tp", "2", "--json")
    assert code == 0, out
    report = json.loads(out)
    assert report["params"] == 78144 and report["devices"] == 2
    assert any("cross-entropy" in n for n in report["notes"])


def test_python_file_compiles_and_notes_data_parallel_only() -> None:
    code, out = run(f"{EXAMPLES}/resnet50.py:model", "--backend", "null", "--dp", "2", "--json")
    assert code == 0, out
    assert "no tensor-parallel plan matches this model's module paths: it runs data parallel only" in out


def _truncated_onnx(tmp: Path) -> str:
    from test_frontend_onnx import block_model

    data = block_model().SerializeToString()
    (tmp / "cut.onnx").write_bytes(data[: len(data) // 3])
    return str(tmp / "cut.onnx")


def _text_as_onnx(tmp: Path) -> str:
    (tmp / "notes.onnx").write_text("this is not a model\n")
    return str(tmp / "notes.onnx")


def _unbound_onnx(tmp: Path) -> str:
    import onnx
    from test_frontend_onnx import block_model

    onnx.save(block_model(extra_dim=True), str(tmp / "dyn.onnx"))
    return str(tmp / "dyn.onnx")


def _python(body: str) -> object:
    def make(tmp: Path) -> str:
        (tmp / "m.py").write_text(textwrap.dedent(body))
        return f"{tmp / 'm.py'}:model"

    return make


def _unknown_model_type(tmp: Path) -> str:
    (tmp / "config.json").write_text(json.dumps({"model_type": "warp-drive", "hidden_size": 8}))
    return f"hf:{tmp / 'config.json'}"


BAD = {
    "truncated ONNX": (_truncated_onnx, "not a valid ONNX model"),
    "not ONNX": (_text_as_onnx, "not a valid ONNX model"),
    "unbound ONNX dim": (_unbound_onnx, "dimension 'width' (axis 2) that --micro-batch and --seq-len do not bind"),
    "file raises": (_python("import nothing_here_at_all\n"), "raised ModuleNotFoundError"),
    "factory returns no module": (_python("def model():\n    return 'a string'\n"), "returned str, not an nn.Module"),
    "cannot export": (
        _python(
            """
            import torch
            from torch import nn

            class M(nn.Module):
                def forward(self, ids):
                    if ids.sum() > 0:
                        return ids.float() * 2
                    return ids.float()

            def model():
                return M()
            """
        ),
        "torch.export could not capture M",
    ),
    "unknown model_type": (_unknown_model_type, "unknown model_type 'warp-drive'"),
    "no such config": (lambda tmp: f"hf:{tmp / 'nowhere'}", "no config.json at"),
    "unknown name": (lambda tmp: "gpt-17", "unknown model 'gpt-17'"),
}


def test_layout_the_config_forbids_is_named_in_its_terms() -> None:
    pytest.importorskip("transformers")
    code, out = run("hf:qwen2-7b", "--backend", "null", "--tp", "8", "--seq-len", "8")
    assert code == 1 and out.strip() == "Error: tp=8 does not divide attention heads (28)"


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_model_is_one_line_and_exit_1(case: str, tmp_path: Path) -> None:
    if case in ("truncated ONNX", "unbound ONNX dim"):
        pytest.importorskip("onnx")
    if case == "unknown model_type":
        pytest.importorskip("transformers")
    make, message = BAD[case]
    code, out = run(make(tmp_path), "--backend", "null", "--seq-len", "8")
    lines = out.strip().splitlines()
    assert code == 1
    assert len(lines) == 1 and lines[0].startswith("Error: "), out
    assert message in lines[0]


def test_the_terminal_summary_lists_the_notes(tmp_path: Path) -> None:
    (tmp_path / "mlp.py").write_text(
        "import torch\nfrom torch import nn\n\n"
        "def model():\n"
        "    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10)), [(('batch', 16), torch.float32)]\n"
    )
    code, out = run(f"{tmp_path}/mlp.py:model", "--backend", "null", "--dp", "2")
    assert code == 0, out
    assert "note: no tensor-parallel plan matches this model's module paths: it runs data parallel only" in out
