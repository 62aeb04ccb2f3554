"""The cross-entropy kernels Megatron-Core runs, per path: unfused fp32, jit-fused 'native', Transformer Engine's.

Bytes per logit against the kernel-by-kernel closed forms of echosim.ir.ops.LOSS_KERNEL_BYTES, the frameworks and
configs that select each path, and the validation rows that take them.
"""

from __future__ import annotations

import pytest
from conftest import SHARED

from echosim.configs import ConfigError, read_source
from echosim.configs.megatron import read_megatron_args
from echosim.frameworks import get_framework, loss_framework
from echosim.ir.graph import Graph
from echosim.ir.ops import LOSS_KERNEL_BYTES, CrossEntropyAttrs, OpKind, Phase
from echosim.ir.types import DType, TensorSpec
from echosim.passes.attention import AttentionKernel
from echosim.passes.flops import io_bytes

TOKENS, VOCAB = 4096, 16032  # one micro-batch's tokens, a tp=8 slice of a 128k vocabulary


def _loss(kernel: str, phase: Phase, tp: str = "") -> tuple[Graph, int]:
    g = Graph("loss")
    logits = g.add(OpKind.INPUT, [], TensorSpec((TOKENS, VOCAB), DType.BF16))
    labels = g.add(OpKind.INPUT, [], TensorSpec((TOKENS,), DType.INT64))
    attrs = CrossEntropyAttrs(VOCAB, tp=tp, kernel=kernel)
    if phase is Phase.FORWARD:
        return g, g.add(OpKind.CROSS_ENTROPY, [logits, labels], TensorSpec((TOKENS,), DType.FP32), attrs)
    dy = g.add(OpKind.INPUT, [], TensorSpec((TOKENS,), DType.FP32))
    out = TensorSpec((TOKENS, VOCAB), DType.BF16)
    return g, g.add(OpKind.CROSS_ENTROPY, [dy, logits, labels], out, attrs, phase=Phase.BACKWARD)


LOGITS = TOKENS * VOCAB
PER_TOKEN_FWD = TOKENS * (8 + 4)  # the labels in, the per-token loss out
PER_TOKEN_BWD = TOKENS * (4 + 8)  # the incoming gradient and the labels


@pytest.mark.parametrize(
    ("kernel", "forward", "backward"),
    [
        # .float() 2+4, max 4, -= 4+4, exp 4+4, sum 4, div_ 4+4 | mul_ 4+4, autograd's cast to bf16 4+2
        ("unfused", 34, 14),
        # upcast+max 2+4, sub+exp+sum 4+4, div 4+4 | scale in place 4+4 and return bf16 2
        ("native", 22, 10),
        # online softmax reads 2, the second pass reads 2 and writes the gradient in place 2 | scale in place 2+2
        ("te", 6, 4),
        # torchtitan's eager F.cross_entropy(pred.float()): .float() 2+4, cunn_SoftMaxForward's max, sum-exp and
        # write passes 4+4+4+4 | nll_loss_backward's zero fill 4, cunn_SoftMaxBackward's sum and write 4+4+4+4,
        # the cast back to bf16 4+2
        ("eager", 22, 26),
    ],
)
def test_bytes_per_logit_of_each_loss_path(kernel: str, forward: int, backward: int) -> None:
    g, n = _loss(kernel, Phase.FORWARD)
    assert io_bytes(g, g[n]) == LOGITS * forward + PER_TOKEN_FWD
    g, n = _loss(kernel, Phase.BACKWARD)
    assert io_bytes(g, g[n]) == LOGITS * backward + PER_TOKEN_BWD


def test_a_vocabulary_parallel_eager_loss_runs_loss_parallels_decomposition() -> None:
    """tp > 1: DTensor's _log_softmax / _nll_loss_and_log_softmax_backward, op by op (a + 36 each way)."""
    # .float() 2+4, amax 4, x - max 4+4, exp 4+4, sum 4, shifted - lse 4+4
    g, n = _loss("eager", Phase.FORWARD, tp="vocab")
    assert io_bytes(g, g[n]) == LOGITS * 38 + PER_TOKEN_FWD
    # zeros_like 4, exp 4+4, + 4+4+4, * grad 4+4, cast back 4+2
    g, n = _loss("eager", Phase.BACKWARD, tp="vocab")
    assert io_bytes(g, g[n]) == LOGITS * 38 + PER_TOKEN_BWD
    # the fused paths are the same kernels on a slice
    g, n = _loss("te", Phase.FORWARD, tp="vocab")
    assert io_bytes(g, g[n]) == LOGITS * 6 + PER_TOKEN_FWD


def test_without_a_kernel_the_loss_is_one_pass() -> None:
    g, n = _loss("", Phase.FORWARD)
    assert io_bytes(g, g[n]) == LOGITS * 2 + PER_TOKEN_FWD
    g, n = _loss("", Phase.BACKWARD)
    assert io_bytes(g, g[n]) == LOGITS * (2 + 2) + PER_TOKEN_BWD
    assert set(LOSS_KERNEL_BYTES) == {"unfused", "native", "te", "eager", "eager-loss-parallel"}


def test_the_pass_marks_the_loss_and_can_undo_it() -> None:
    g, n = _loss("", Phase.FORWARD)
    marked = AttentionKernel(loss="te").run(g)
    assert marked[n].attrs.kernel == "te"
    assert AttentionKernel().run(marked)[n].attrs.kernel == ""


@pytest.mark.parametrize(
    ("name", "kernel"),
    [
        ("megatron", "unfused"),  # cross_entropy_loss_fusion defaults to False
        ("megatron-2022", "unfused"),
        ("nemo", "unfused"),  # NeMo 1 leaves Megatron-Core's default
        ("nemo-ce-native", "native"),  # GPTConfig.cross_entropy_loss_fusion = True, impl 'native'
        ("megatron-bridge", "te"),  # the performance scripts set cross_entropy_fusion_impl = 'te'
        ("megatron-ce-native", "native"),
        ("megatron-ce-te", "te"),
        ("eager", ""),
        ("torchtitan", "eager"),  # F.cross_entropy(pred.float()) outside the compiled blocks
        ("torchtitan-2025", "eager"),
        ("torchtitan-2025-compile", "eager"),  # --training.compile compiles the loss only from bbb1b61
        ("torchtitan-2025-compile-loss", ""),  # from bbb1b61 on (the e7c0cae rows): compiled with the blocks
        ("torchtitan-compile", ""),  # Inductor fuses it
        ("maxtext", ""),
    ],
)
def test_frameworks_name_their_loss_kernels_with_a_source(name: str, kernel: str) -> None:
    framework = get_framework(name)
    assert framework.loss_kernel == kernel
    assert bool(framework.loss_source) == bool(kernel)


def test_a_megatron_launch_line_selects_the_loss_path() -> None:
    base = "--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128"
    assert read_megatron_args(base).framework == "megatron"
    assert read_megatron_args(f"{base} --cross-entropy-loss-fusion").framework == "megatron-ce-native"
    fused_te = read_megatron_args(f"{base} --cross-entropy-loss-fusion --cross-entropy-fusion-impl te")
    assert fused_te.framework == fused_te.options["framework"] == "megatron-ce-te"
    # the implementation alone changes nothing: the fusion is off
    assert read_megatron_args(f"{base} --cross-entropy-fusion-impl te").framework == "megatron"
    with pytest.raises(ConfigError, match="cross-entropy-fusion-impl 'triton'"):
        read_megatron_args(f"{base} --cross-entropy-loss-fusion --cross-entropy-fusion-impl triton")
    assert loss_framework("nemo", "te") == "megatron-bridge"


def test_a_nemo_yaml_selects_the_loss_path(tmp_path) -> None:  # type: ignore[no-untyped-def]
    body = (
        "trainer:\n  num_nodes: 1\n  devices: 8\n  precision: bf16\n"
        "model:\n  micro_batch_size: 1\n  global_batch_size: 8\n  encoder_seq_length: 2048\n"
        "  max_position_embeddings: 2048\n  num_layers: 2\n  hidden_size: 1024\n  ffn_hidden_size: 4096\n"
        "  num_attention_heads: 16\n  tensor_model_parallel_size: 1\n  pipeline_model_parallel_size: 1\n"
    )
    for extra, want in [
        ("", "nemo"),
        ("  cross_entropy_loss_fusion: true\n", "nemo-ce-native"),
        ("  cross_entropy_loss_fusion: true\n  cross_entropy_fusion_impl: te\n", "megatron-bridge"),
        ("  cross_entropy_loss_fusion: false\n", "nemo"),
    ]:
        path = tmp_path / f"gpt{len(extra)}.yaml"
        path.write_text(body + extra)
        assert read_source(f"nemo:{path}").framework == want


@pytest.mark.skipif(not (SHARED / "validation" / "cases.csv").exists(), reason="shared/validation not present")
def test_rows_take_the_loss_path_their_release_ran() -> None:
    from echosim.validation.cases import read_cases
    from echosim.validation.rows import row_framework

    cases = read_cases(SHARED / "validation" / "cases.csv")
    first = {}
    for c in cases:
        first.setdefault(c["source_id"], c)
    want = {
        "megatron_lm_llama_fp8": "megatron-ce-native",  # train_llama3_8b_h100_fp8.sh: --cross-entropy-loss-fusion
        "megascale2024": "megascale",
        "nemo_2407": "nemo",
        "nemo_2504_gb200": "nemo-ce-native",
        "megatron_bridge_25.11": "megatron-bridge",
        "torchtitan_2412": "torchtitan-2025",  # 9dec370: the loss's torch.compile is commented out
        "torchtitan_h200_trainy": "torchtitan-2025-compile-loss",  # e7c0cae, after bbb1b61
    }
    assert {s: row_framework(first[s]) for s in want} == want
    # NeMo-Framework-Launcher 24.07 sets cross_entropy_loss_fusion: true in its Llama 3 and small Nemotron configs only
    nemo_2407 = {c.case_id: row_framework(c) for c in cases if c["source_id"] == "nemo_2407"}
    assert nemo_2407["nemo2407-llama3-8b-fp8-h100-sxm-8"] == "nemo-ce-native"
    assert nemo_2407["nemo2407-nemotron-22b-fp8-h100-sxm-64"] == "nemo-ce-native"
    assert nemo_2407["nemo2407-nemotron-340b-fp8-h100-sxm-128"] == "nemo"
    assert nemo_2407["nemo2407-llama2-7b-fp8-h100-sxm-8"] == "nemo"
    assert nemo_2407["nemo2407-gpt3-175b-fp8-h100-sxm-128"] == "nemo"
