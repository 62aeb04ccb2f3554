"""MaxText's FSDP weight all-gathers on TPUs move the compute dtype, not ``weight_dtype``.

MaxText stores its weights in ``weight_dtype: float32`` (src/maxtext/configs/base.yml line 174, commit e591f30)
and casts each kernel to ``dtype`` bfloat16 before its dot (``jnp.asarray(kernel, self.dtype)``,
src/maxtext/layers/linears.py). XLA's partitioner converts the *sharded* parameter: MaxText's own compiled
reference of Llama 3 8B on v6e-4 with the default weight_dtype (tests/utils/reference_hlo_llama3_8b.txt, commit
e591f30) gathers every layer weight as ``bf16[...] all-gather(dynamic-slice_convert_fusion)`` of a bf16 sharded
stack (the loop carries ``bf16[4,32,128,1024]``, a quarter of the 4096 model dim), and its sharding guide counts
FSDP's all-gather at 2 bytes a parameter (docs/guides/optimization/sharding.md, "All gather params EM in bf16").
"""

from __future__ import annotations

from conftest import TINY_LLAMA, capture

from echosim.frameworks import get_framework
from echosim.ir.ops import OpKind
from echosim.ir.types import DType
from echosim.passes.autodiff import Autodiff
from echosim.passes.base import run_passes
from echosim.passes.plugin import _data_parallel
from echosim.plan import Plan


def test_maxtext_fsdp_gathers_bf16_weights_though_it_stores_fp32() -> None:
    """``maxtext`` keeps fp32 weights (memory) but each layer's two all-gathers (forward, and backward with its
    recompute) and its reduce-scatter move 2 bytes a parameter, as ``maxtext-bf16-weights`` does."""
    assert get_framework("maxtext").fp32_weights and not get_framework("maxtext-bf16-weights").fp32_weights
    graph = capture(TINY_LLAMA, dtype=DType.BF16)

    def collectives(framework: str) -> list[tuple[str, OpKind, int]]:
        dp = _data_parallel(Plan(dp=4, zero=3, dtype="bf16", framework=framework))
        g = run_passes(graph, [Autodiff(), dp])
        return [(n.name, n.op, n.attrs.bytes) for n in g if n.name.startswith("fsdp.")]

    base = run_passes(graph, [Autodiff()])
    fp32_weights = collectives("maxtext")
    assert fp32_weights == collectives("maxtext-bf16-weights")
    numel = sum(base[p].out.numel for p in base.grads if base[p].scope.startswith("layers.0"))
    gathers = [b for name, op, b in fp32_weights if op is OpKind.ALL_GATHER and "layers.0" in name]
    scatters = [b for name, op, b in fp32_weights if op is OpKind.REDUCE_SCATTER and "layers.0" in name]
    assert numel and gathers == [2 * numel, 2 * numel] and scatters == [2 * numel]
