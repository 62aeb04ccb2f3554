"""llm-foundry's A100 tables: Composer FSDP with mixed_precision 'PURE', gradients reduce-scattered in bf16."""

from __future__ import annotations

import pytest
from conftest import SHARED

from echosim.frameworks import get_framework
from echosim.ir.types import DType
from echosim.passes.plugin import _data_parallel
from echosim.plan import Plan
from echosim.validation.cases import read_cases
from echosim.validation.rows import llm_foundry_pure, row_framework

CASES = SHARED / "validation" / "cases.csv"


def test_pure_reduces_in_the_parameters_16_bits_and_keeps_every_other_composer_behaviour() -> None:
    pure, default = get_framework("composer-triton-pure"), get_framework("composer-triton")
    assert not pure.fsdp_reduce_fp32 and default.fsdp_reduce_fp32
    assert _data_parallel(Plan(dp=8, zero=3, framework="composer-triton")).fsdp_reduce_dtype is DType.FP32
    assert _data_parallel(Plan(dp=8, zero=3, framework="composer-triton-pure")).fsdp_reduce_dtype is None
    for field in ("attention_kernel", "fsdp_flat_grads", "optimizer_bytes", "attention_unpad", "ce_saved"):
        assert getattr(pure, field) == getattr(default, field), field


def test_reduce_scatter_bytes_halve_under_pure() -> None:
    """The same FULL_SHARD step: the reduce-scatters move 2 bytes a parameter, not 4."""
    from echosim.compiler import lower
    from echosim.ir.ops import OpKind
    from echosim.plan import Cluster

    def scattered(framework: str) -> int:
        plan = Plan(dp=8, zero=3, micro_batch=1, global_batch=8, seq_len=128, framework=framework)
        g = lower("gpt3-125m", plan, Cluster("a100-40gb", 8, 8)).graph
        return sum(n.attrs.bytes * g.multiplicity(n) for n in g if n.op is OpKind.REDUCE_SCATTER)

    assert scattered("composer-triton") == 2 * scattered("composer-triton-pure")


@pytest.mark.skipif(not CASES.exists(), reason="shared/validation not present")
def test_the_a100_tables_ran_pure_and_the_h100_tables_default() -> None:
    """README: Precision 'bf16' with MP Mode 'PURE' (every A100 40GB row, the A100 80GB 70b rows), 'amp_bf16'
    with 'DEFAULT' (every H100 row)."""
    rows = [c for c in read_cases(CASES) if c["source_id"] == "llm_foundry_bench"]
    pure = {c.case_id for c in rows if llm_foundry_pure(c)}
    assert pure == {c.case_id for c in rows if c["device"].startswith("a100")} and len(pure) == 12
    assert {row_framework(c) for c in rows if c.case_id in pure} == {"composer-triton-pure"}
    assert "composer-triton-pure" not in {row_framework(c) for c in rows if c.case_id not in pure}
