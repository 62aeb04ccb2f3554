"""Composer's DecoupledAdamW as llm-foundry runs it: eight eager kernels per parameter tensor and FSDP's
gradient clip, priced by the bytes they move instead of a fused Adam's."""

from __future__ import annotations

import pytest

from echosim.frameworks import COMPOSER_ADAMW_BYTES_PER_PARAM, FRAMEWORKS, get_framework
from echosim.ir.graph import Graph
from echosim.ir.ops import OpKind, OptimizerAttrs, ParamAttrs
from echosim.ir.types import DType, TensorSpec
from echosim.passes.data_parallel import ADAM_BYTES_PER_PARAM, Optimizer
from echosim.passes.flops import io_bytes


def _step(optimizer: Optimizer) -> OptimizerAttrs:
    g = Graph("w")
    g.add(OpKind.PARAMETER, [], TensorSpec((4096, 4096), DType.BF16), ParamAttrs())
    out = optimizer.run(g)
    node = next(n for n in out if n.op is OpKind.OPTIMIZER_UPDATE)
    assert isinstance(node.attrs, OptimizerAttrs)
    assert io_bytes(out, node) == node.attrs.params * node.attrs.bytes_per_param
    return node.attrs


def test_the_eager_loop_moves_96_bytes_per_parameter() -> None:
    # m: mul_ 8 + add_ 12; v: mul_ 8 + addcmul_ 16; sqrt 8, / 8, + eps 8; addcdiv_ 16; clip: norm 4 + scale 8
    assert COMPOSER_ADAMW_BYTES_PER_PARAM == 8 + 12 + 8 + 16 + 8 + 8 + 8 + 16 + 4 + 8 == 96
    fused = _step(Optimizer(shard=4))
    eager = _step(Optimizer(shard=4, bytes_per_param=COMPOSER_ADAMW_BYTES_PER_PARAM))
    assert fused.params == eager.params == 4096 * 4096 // 4
    assert (fused.bytes_per_param, eager.bytes_per_param) == (ADAM_BYTES_PER_PARAM, 96)


def test_only_composer_entries_name_their_optimizer() -> None:
    for name in ("composer", "composer-fa1", "composer-triton", "composer-triton-pure"):
        fw = get_framework(name)
        assert fw.optimizer_bytes == COMPOSER_ADAMW_BYTES_PER_PARAM
        assert "DecoupledAdamW" in fw.optimizer_source and "eb4fbd0" in fw.optimizer_source
    assert {f.name for f in FRAMEWORKS.values() if f.optimizer_bytes} == {
        "composer",
        "composer-fa1",
        "composer-triton",
        "composer-triton-pure",
    }


@pytest.mark.parametrize("framework, expected", [("composer", 96), ("eager", ADAM_BYTES_PER_PARAM)])
def test_the_plan_picks_the_frameworks_optimizer(framework: str, expected: int) -> None:
    from echosim.passes.plugin import _optimizer
    from echosim.plan import Plan

    opt = _optimizer(Plan(dp=8, zero=3, framework=framework))
    assert isinstance(opt, Optimizer) and (opt.bytes_per_param or ADAM_BYTES_PER_PARAM) == expected
