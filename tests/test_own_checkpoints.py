"""A model that checkpoints its own blocks in code (``torch.utils.checkpoint``): the report says what it leaves out.

The call is invisible to torch.export (it traces the function once), so a GPT whose forward checkpoints every
block was costed as keeping every activation, with no word about it: the memory verdict a user acts on (out of
memory or not) was the one of a model that does not recompute. echosim takes recompute from ``--recompute``, and
now warns where the model's code asks for some and the layout has none.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from echosim.cli import cli
from echosim.frontend import CaptureSpec
from echosim.frontend.pyfile import load
from echosim.ir.graph import Graph
from echosim.ir.serialize import graph_from_data, graph_to_data

MODEL = """
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x):
        return x + torch.relu(self.fc(x))

    def inner(self, x):
        return self.forward(x)


class Net(nn.Module):
    seq_len = 16

    def __init__(self, how):
        super().__init__()
        self.embed = nn.Embedding(100, 32)
        self.blocks = nn.ModuleList(Block() for _ in range(4))
        self.head = nn.Linear(32, 100)
        self.how = how

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            if self.how == "module":
                x = checkpoint(block, x, use_reentrant=False)
            elif self.how == "reentrant":
                x = checkpoint(block.forward, x, use_reentrant=True)
            elif self.how == "method":
                x = checkpoint(block.inner, x, use_reentrant=False)
            elif self.how == "lambda":
                x = checkpoint(lambda y: block(y), x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(x)


def factory(how):
    return lambda: Net(how)


module = factory("module")
reentrant = factory("reentrant")
function = factory("lambda")
method = factory("method")
plain = factory("plain")
"""


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ckpt") / "net.py"
    path.write_text(MODEL)
    return path


@pytest.mark.parametrize(
    ("factory", "recorded"),
    [
        ("module", ("blocks.*",)),
        ("reentrant", ("blocks.*",)),
        ("method", ("blocks.*.inner",)),
        ("lambda", ("<function>",)),
        ("plain", ()),
    ],
)
def test_the_checkpointed_modules_are_recorded(model_file: Path, factory: str, recorded: tuple[str, ...]) -> None:
    name = "function" if factory == "lambda" else factory
    graph, _, _ = load(f"{model_file}:{name}").capture(CaptureSpec(micro_batch=2))
    assert graph.checkpointed == recorded


def test_a_layout_without_recompute_says_what_the_model_asks_for(model_file: Path) -> None:
    def run(*flags: str) -> dict:
        args = ["compile", f"{model_file}:module", "--backend", "h100-sxm", "--micro-batch", "4", "--json", *flags]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    kept, replayed = run(), run("--recompute", "full")
    assert any("checkpoints blocks.* with torch.utils.checkpoint" in w for w in kept["warnings"])
    assert not any("torch.utils.checkpoint" in w for w in replayed["warnings"])
    assert replayed["memory"][0]["activations"] < kept["memory"][0]["activations"]


def test_checkpointed_modules_survive_the_capture_cache_format() -> None:
    graph = Graph("g")
    graph.checkpointed = ("blocks.*", "<function>")
    assert graph_from_data(graph_to_data(graph)).checkpointed == ("blocks.*", "<function>")
    assert "checkpointed" not in graph_to_data(Graph("h"))
