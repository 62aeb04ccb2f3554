"""A model whose inputs fix its batch: throughput counts the samples its forward runs, not ``--micro-batch``.

A graph neural network trained on one whole graph, a ``.py`` file that hands example tensors, or an ONNX file
exported with a fixed batch: ``--micro-batch`` binds none of their dimensions. Before, the report multiplied
``--micro-batch`` into the global batch anyway: a full-graph GCN at ``--micro-batch 8`` on 2 GPUs claimed 16
samples a step, with a step time that does not depend on 8 at all.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from echosim.cli import cli
from echosim.ir.graph import Graph
from echosim.ir.serialize import graph_from_data, graph_to_data

GCN = """
import torch
from torch import nn

class GCN(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(32, 32)

    def forward(self, x, src, dst):
        return torch.zeros_like(x).index_add_(0, dst, self.lin(x)[src]).relu().sum()

def model():
    return GCN(), {inputs}
"""
FIXED = "[((500, 32), torch.float32), ((2000,), torch.long), ((2000,), torch.long)]"
BATCHED = "[(('batch', 32), torch.float32), ((2000,), torch.long), ((2000,), torch.long)]"


def compile_json(source: str, *flags: str) -> dict:
    args = ["compile", source, "--backend", "h100-sxm", "--devices", "2", "--json", *flags]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def write(tmp_path: Path, inputs: str) -> str:
    path = tmp_path / "gcn.py"
    path.write_text(GCN.format(inputs=inputs))
    return f"{path}:model"


def test_inputs_that_fix_the_batch_count_their_samples(tmp_path: Path) -> None:
    source = write(tmp_path, FIXED)
    one, eight = compile_json(source), compile_json(source, "--micro-batch", "8")
    assert one["step_time_s"] == eight["step_time_s"]  # --micro-batch changes nothing the step runs
    for report in (one, eight):
        # 500 nodes (the first input's leading dimension) on each of 2 data-parallel ranks (0: micro-batch x dp)
        assert report["plan"]["micro_batch"] == 500 and report["plan"]["global_batch"] == 0
        assert report["samples_per_s"] == pytest.approx(1000 / report["step_time_s"], rel=1e-4)
    assert any("--micro-batch 8 does not apply: the inputs fix the batch at 500" in n for n in eight["notes"])
    assert not any("does not apply" in n for n in one["notes"])  # the default binds nothing: nothing to say


def test_the_global_batch_counts_samples_a_whole_number_of_calls_a_rank(tmp_path: Path) -> None:
    source = write(tmp_path, FIXED)
    report = compile_json(source, "--micro-batch", "2", "--global-batch", "2000")
    # 2,000 samples: 2 calls of forward on each of 2 ranks, each call the 500-node graph
    assert report["plan"]["global_batch"] == 2000 and report["plan"]["micro_batch"] == 500
    assert report["samples_per_s"] == pytest.approx(2000 / report["step_time_s"], rel=1e-4)
    assert report["step_time_s"] > compile_json(source)["step_time_s"]  # two calls a rank, not one
    result = CliRunner().invoke(cli, ["compile", source, "--backend", "h100-sxm", "--devices", "2",
                                      "--global-batch", "1500"])  # fmt: skip
    assert result.exit_code != 0 and len(result.output.strip().splitlines()) == 1
    assert "global batch 1500 is not a multiple of the model's 500 samples a call of forward" in result.output


def test_search_takes_the_fixed_batch_as_its_micro_batch(tmp_path: Path) -> None:
    source = write(tmp_path, FIXED)
    args = ["search", source, "--backend", "h100-sxm", "--devices", "2", "--json", "--space", "pp=1", "--zero", "0"]
    result = CliRunner().invoke(cli, [*args, "--global-batch", "2000"])
    assert result.exit_code == 0, result.output
    best = json.loads(result.output)["best"][0]
    assert best["micro_batch"] == 500 and best["samples_per_s"] == pytest.approx(2000 / best["step_time_s"], 1e-3)
    mb = ["--global-batch", "2000", "--space", "mb=1,2"]
    for flags, words in ((["--global-batch", "700"], "not a multiple of the 500 samples"),
                         (mb, "--space mb: the model's inputs fix")):  # fmt: skip
        bad = CliRunner().invoke(cli, [*args, *flags])
        assert bad.exit_code != 0 and words in bad.output and len(bad.output.strip().splitlines()) == 1, bad.output


def test_a_named_batch_dimension_is_bound_as_before(tmp_path: Path) -> None:
    report = compile_json(write(tmp_path, BATCHED), "--micro-batch", "8")
    assert report["plan"]["micro_batch"] == 8 and report["plan"]["global_batch"] == 0  # 0: micro-batch x dp
    assert report["samples_per_s"] == pytest.approx(16 / report["step_time_s"], rel=1e-4)
    assert not any("does not apply" in n for n in report["notes"])


def onnx_mlp(tmp_path: Path, batch: int | str) -> str:
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "mlp",
        [helper.make_tensor_value_info("x", f32, [batch, 64])],
        [helper.make_tensor_value_info("y", f32, None)],
        initializer=[helper.make_tensor("w", f32, [64, 64], [0.0] * 64 * 64)],
    )
    path = tmp_path / "mlp.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return str(path)


@pytest.mark.parametrize(("batch", "samples"), [(5, 5), ("N", 8)])
def test_an_onnx_file_with_a_fixed_batch_counts_it(tmp_path: Path, batch: int | str, samples: int) -> None:
    report = compile_json(onnx_mlp(tmp_path, batch), "--micro-batch", "8")
    assert report["plan"]["micro_batch"] == samples and report["plan"]["global_batch"] == 0  # 0: micro-batch x dp
    assert report["samples_per_s"] == pytest.approx(2 * samples / report["step_time_s"], rel=1e-4)


def test_the_fixed_batch_survives_the_capture_cache_format() -> None:
    graph = Graph("g")
    graph.samples = 500
    assert graph_from_data(graph_to_data(graph)).samples == 500
    assert "samples" not in graph_to_data(Graph("h"))  # graphs of batched models keep their data as before
