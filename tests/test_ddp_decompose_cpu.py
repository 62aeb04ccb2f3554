"""benchmarks/ddp_decompose_cpu.py: how it files a DDP rank's profiled ops into echosim's categories."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from script_loader import load_script

ROOT = Path(__file__).resolve().parents[1]


def _script() -> ModuleType:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    return load_script("benchmarks/ddp_decompose_cpu.py")


@dataclass
class Event:
    """The fields of a torch.profiler FunctionEvent the script reads."""

    name: str
    input_shapes: list[Any] = field(default_factory=list)
    cpu_parent: Any = None


def test_reducer_copies_and_c10d_ops_are_ddp_the_forward_range_is_not() -> None:
    s = _script()
    fwd = Event("DistributedDataParallel.forward")
    # reducer.cpp copy_grad_to_bucket: mul.out(grad, 1 / world, out=bucket_view)
    assert s.category(Event("aten::mul", [[688, 256], [], [688, 256]], Event("autograd::engine"))) == "ddp"
    assert s.category(Event("c10d::allreduce_", [[], []])) == "ddp"
    # the model's own ops under DDP's forward range keep their categories
    assert s.category(Event("aten::mm", [[1024, 256], [256, 688]], fwd)) == "matmul"
    assert s.category(Event("aten::mul", [[4, 256, 688], [4, 256, 688]], fwd)) == "other kernels"
    assert s.category(Event("aten::copy_", [[4, 256, 256], [4, 256, 256], []], Event("aten::to"))) == "other kernels"
    assert s.category(Event("aten::add_", [], Event("Optimizer.step#AdamW.step"))) == "optimizer"


def test_minor_faults_reads_field_10_of_proc_self_stat() -> None:
    s = _script()
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    before = int(fields[7])
    assert s.minor_faults() >= before
