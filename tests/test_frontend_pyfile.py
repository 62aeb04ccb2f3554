"""path.py:factory sources: the examples (CNN, LSTM, DLRM) and every way a user's file can go wrong."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from echosim.compiler import lower
from echosim.errors import EchosimError
from echosim.frontend import CaptureSpec, capture_named, pyfile
from echosim.ir import verify
from echosim.ir.ops import EmbeddingAttrs, MatmulAttrs, OpKind, Phase
from echosim.passes.autodiff import Autodiff
from echosim.passes.base import run_passes
from echosim.passes.flops import graph_flops, node_flops
from echosim.plan import Cluster, Plan

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def write(tmp_path: Path, body: str, name: str = "model.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


_LM = """
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(128, 64)
        self.layers = nn.ModuleList(Block() for _ in range({layers}))
        self.lm_head = nn.Linear(64, 128)

    def forward(self, ids):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head({head})

def model():
    return Net(), [(("batch", 16), torch.int64)]
"""


def write_lm(tmp_path: Path, block: str, head: str = "x", layers: int = 2) -> Path:
    """A language model (16 tokens, 64 wide) of ``layers`` copies of ``block``, the source of a class ``Block``."""
    header = "import torch\nimport torch.nn.functional as F\nfrom torch import nn\n"
    return write(tmp_path, header + textwrap.dedent(block) + _LM.format(head=head, layers=layers))


@pytest.mark.slow
def test_resnet50_flops_match_flop_counter_and_the_paper() -> None:
    """ResNet-50: 25.6M parameters and ~4.1 GMACs per 224x224 image (He et al. 2015, Table 1)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    graph, messages, params = capture_named(f"{EXAMPLES}/resnet50.py:model", CaptureSpec(micro_batch=2))
    verify(graph)
    assert params == 25_557_032
    forward = graph_flops(graph).forward
    assert forward / 2 / 2 == pytest.approx(4.1e9, rel=0.02)  # 2 images, 2 FLOPs per multiply-add
    model, _spec = pyfile.load(f"{EXAMPLES}/resnet50.py:model").module, None
    images = torch.zeros(2, 3, 224, 224, device="meta")
    counter = FlopCounterMode(display=False)
    with counter:
        torch.nn.functional.cross_entropy(model(images), torch.zeros(2, dtype=torch.long, device="meta")).backward()
    assert graph_flops(run_passes(graph, [Autodiff()])).model == counter.get_total_flops()
    assert any("cross-entropy" in m for m in messages)  # the loss echosim adds to the logits


def test_a_model_without_a_tp_plan_runs_data_parallel_and_refuses_tensor_parallel(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        import torch
        from torch import nn

        def cnn():
            net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
            return net, [(("batch", 3, 16, 16), torch.float32)]
        """,
    )
    report = lower(f"{path}:cnn", Plan(dp=2, micro_batch=4), Cluster("null", devices=2)).report
    assert "no tensor-parallel plan matches this model's module paths: it runs data parallel only" in report.notes
    assert report.breakdown["comm.dp"] > 0
    with pytest.raises(EchosimError, match="tp=2: no module path"):
        lower(f"{path}:cnn", Plan(tp=2), Cluster("null", devices=2))


def test_linears_no_tp_rule_matches_are_named_not_split_in_silence(tmp_path: Path) -> None:
    """A layer whose attention the plan splits but whose MLP it does not know runs that MLP whole on every rank:
    the report names it. A small linear (a router-like gate) is not reported."""
    path = write_lm(
        tmp_path,
        """

        class Block(nn.Module):
            def __init__(self, h=64, heads=4):
                super().__init__()
                self.heads = heads
                self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(h, h) for _ in range(4))
                self.up, self.down = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)
                self.gate = nn.Linear(h, 2)

            def forward(self, x):
                b, s, h = x.shape
                projections = (self.q_proj, self.k_proj, self.v_proj)
                q, k, v = (p(x).view(b, s, self.heads, -1).transpose(1, 2) for p in projections)
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, h)
                x = x + self.o_proj(a)
                return x + self.down(F.gelu(self.up(x))) + self.gate(x).sum(-1, keepdim=True)
        """,
        layers=3,
    )
    two = lower(f"{path}:model", Plan(tp=2, micro_batch=2), Cluster("null", devices=2)).report
    [warning] = [w for w in two.warnings if "linear layer" in w]
    # two per layer, three layers (folded to one block that stands for them)
    assert warning.startswith("6 linear layers (layers.0.up, layers.0.down, ...) run whole on all 2")
    assert "gate" not in warning
    assert not [
        w
        for w in lower(f"{path}:model", Plan(micro_batch=2), Cluster("null", devices=1)).report.warnings
        if "linear" in w
    ]


_NAMED_LM = """
import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq, self.wo = nn.Linear(64, 64), nn.Linear(64, 64)

    def forward(self, x):
        b, s, h = x.shape
        q = self.wq(x).view(b, s, 4, 16).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, q, q, is_causal=True).transpose(1, 2).reshape(b, s, h)
        return x + self.wo(a)


class Net(nn.Module):
    def __init__(self, tied):
        super().__init__()
        self.{embedding} = nn.Embedding(128, 64)
        self.layers = nn.ModuleList(Block() for _ in range(2))
        self.{head} = nn.Linear(64, 128, bias=not tied)
        if tied:
            self.{head}.weight = self.{embedding}.weight

    def forward(self, ids):
        x = self.{embedding}(ids)
        for layer in self.layers:
            x = layer(x)
        return self.{head}(x)


def model():
    return Net({tied}), [(("batch", 16), torch.int64)]
"""


@pytest.mark.parametrize(("embedding", "head", "tied"), [("tok_embeddings", "output", False), ("emb", "head", True)])
def test_a_language_models_vocabulary_layers_split_whatever_their_names(
    tmp_path: Path, embedding: str, head: str, tied: bool
) -> None:
    """torchtitan's (and Meta's Llama's) ``tok_embeddings`` and ``output``, a hand-written ``emb`` and tied
    ``head``: the embedding whose rows are the loss's vocabulary and the linear the loss reads split by vocabulary,
    as Megatron splits them. Before, only names the plan knows (``embed_tokens``, ``lm_head``, ...) were split:
    the rest ran whole on every rank and the output layer was reported as such."""
    path = tmp_path / "names.py"
    path.write_text(_NAMED_LM.format(embedding=embedding, head=head, tied=tied))
    compiled = lower(f"{path}:model", Plan(tp=2, micro_batch=2), Cluster("null", devices=2))
    assert not [w for w in compiled.report.warnings if "run whole" in w]
    graph = compiled.graph
    tables = {graph[n.inputs[1]].out.shape for n in graph if n.op is OpKind.EMBEDDING and n.phase is Phase.FORWARD}
    assert tables == {(64, 64)}  # 128 rows, half on each rank
    logits = [n.attrs for n in graph if isinstance(n.attrs, MatmulAttrs) and n.attrs.tp == "vocab"]
    assert logits and {a.n for a in logits if not a.grad_of} == {64}


def test_lstm_language_model_in_fp16() -> None:
    """Input projection once per layer, then one recurrent GEMM per step (h0 is zeros, still multiplied)."""
    plan = Plan(micro_batch=4, seq_len=10, dtype="fp16")
    compiled = lower(f"{EXAMPLES}/lstm_lm.py:model", plan, Cluster("h100-sxm", devices=1))
    graph = compiled.graph
    assert {n.out.dtype.value for n in graph if n.op is OpKind.MATMUL} == {"fp16"}
    fwd = [n.attrs for n in graph if isinstance(n.attrs, MatmulAttrs) and not n.attrs.grad_of]
    h, vocab, tokens = 1500, 10_000, 40
    assert fwd.count(MatmulAttrs(m=tokens, n=4 * h, k=h)) == 2
    assert fwd.count(MatmulAttrs(m=4, n=4 * h, k=h)) == 2 * 10
    assert (
        sum(a.flops for a in fwd)
        == 2 * (2 * tokens * 4 * h * h) + 2 * (2 * tokens * 4 * h * h) + 2 * tokens * h * vocab
    )
    assert compiled.report.params == 10_000 * 1500 + 2 * (2 * 4 * 1500 * 1500 + 2 * 4 * 1500) + 10_000
    assert compiled.report.step_time_s > 0


def test_dlrm_embedding_tables_and_interaction() -> None:
    """26 identical tables used side by side are not a chain of layers: none is folded away."""
    graph, messages, params = capture_named(f"{EXAMPLES}/dlrm.py:model", CaptureSpec(micro_batch=64))
    tables = [n for n in graph if isinstance(n.attrs, EmbeddingAttrs)]
    assert len(tables) == 26 and tables[0].attrs == EmbeddingAttrs(4_000_000, 128, lookups=64)  # one id per sample
    assert graph.repeats == {}
    assert graph.param_count() == params
    assert params == pytest.approx(13.3e9, rel=0.01)
    assert any(isinstance(n.attrs, MatmulAttrs) and n.attrs.batch == 64 and n.attrs.k == 128 for n in graph)
    assert not [m for m in messages if "no rule" in m]  # the loss (BCE with logits) has a rule


def test_default_inputs_are_token_ids_for_each_forward_argument(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        import torch
        from torch import nn

        class Tiny(nn.Module):
            seq_len = 12
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(50, 16)
                self.lm_head = nn.Linear(16, 50)
            def forward(self, ids, labels):
                return nn.functional.cross_entropy(self.lm_head(self.embed(ids)).flatten(0, 1), labels.flatten())

        def build():
            return Tiny()
        """,
    )
    graph, _messages, params = capture_named(f"{path}:build", CaptureSpec(micro_batch=3))
    assert [graph[i].out.shape for i in graph.inputs] == [(3, 12), (3, 12)]  # the module's own seq_len
    assert params == 50 * 16 + 16 * 50 + 50
    assert graph[graph.outputs[0]].op is OpKind.CROSS_ENTROPY


def test_activations_written_with_expm1_and_log1p_are_costed_without_a_warning(tmp_path: Path) -> None:
    """Apertus's xIELU is written with ``expm1``, a router with ``logsigmoid``, an L2 norm with
    ``linalg.vector_norm``: ops with a rule, not unknown ones."""
    path = write(
        tmp_path,
        """
        import torch
        from torch import nn

        class Act(nn.Module):
            seq_len = 8
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(50, 16)
                self.lm_head = nn.Linear(16, 50)
            def forward(self, ids):
                h = self.embed(ids)
                h = torch.expm1(h) + torch.log1p(h.abs()) + torch.exp2(h) + torch.log2(h.abs())
                h = nn.functional.logsigmoid(h) / torch.linalg.vector_norm(h, dim=-1, keepdim=True)
                h = torch.concatenate([h, torch.concat([h, h])]).reshape_as(torch.cat([h, h, h]))
                return self.lm_head(h + torch.rand_like(h))

        def build():
            return Act()
        """,
    )
    graph, messages, _ = capture_named(f"{path}:build", CaptureSpec())
    fns = {getattr(n.attrs, "fn", "") for n in graph}
    assert {"expm1", "log1p", "exp2", "log2", "log_sigmoid", "norm"} <= fns
    assert not [m for m in messages if "no rule" in m]


def test_repeated_blocks_fold_in_any_module(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        from torch import nn

        def model():
            blocks = [nn.Sequential(nn.Linear(32, 32), nn.ReLU()) for _ in range(12)]
            return nn.Sequential(nn.Linear(8, 32), nn.ModuleList(blocks)[0], *blocks), [(("batch", 8), None)]
        """,
    )
    path.write_text(path.read_text().replace("None", "__import__('torch').float32"))
    graph, _, params = capture_named(f"{path}:model", CaptureSpec(micro_batch=2))
    assert graph.repeats == {}  # a Sequential is called whole; only ModuleLists iterate layer by layer
    assert graph.param_count() == params


@pytest.mark.parametrize(
    ("body", "spec", "message"),
    [
        ("x = 1 / 0\n", "model.py:model", r"model.py raised ZeroDivisionError: division by zero at line 1"),
        ("def model(:\n", "model.py:model", r"model.py:1: syntax error"),
        ("def model():\n    return 42\n", "model.py:model", r"returned int, not an nn.Module"),
        (
            "def model():\n    raise RuntimeError('no GPU here')\n",
            "model.py:model",
            r"model\(\) raised RuntimeError: no GPU",
        ),
        ("def model():\n    pass\n", "model.py:build", r"defines no 'build'"),
        ("model = 3\n", "model.py:model", r"is a int, not a callable"),
        ("", "missing.py:model", r"no such file"),
    ],
)
def test_bad_python_files(tmp_path: Path, body: str, spec: str, message: str) -> None:
    write(tmp_path, body)
    with pytest.raises(EchosimError, match=message):
        capture_named(f"{tmp_path}/{spec}", CaptureSpec())


def test_a_model_torch_cannot_capture_names_the_construct(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        import torch
        from torch import nn

        class Branchy(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8)
            def forward(self, x):
                if x.sum() > 0:  # data-dependent control flow
                    return self.fc(x)
                return x

        def model():
            return Branchy(), [(("batch", 8), torch.float32)]
        """,
    )
    with pytest.raises(EchosimError, match=r"torch.export could not capture Branchy: .*model.py:10 `if x.sum\(\) > 0:"):
        capture_named(f"{path}:model", CaptureSpec())


def test_unknown_model_string_names_the_ways_to_give_a_model() -> None:
    with pytest.raises(
        EchosimError, match=r"not a registered name .* path\.py:factory, hf:config\.json or model\.onnx"
    ):
        capture_named("no-such-model", CaptureSpec())


def test_attention_written_by_hand_becomes_one_attention_op(tmp_path: Path) -> None:
    """nanoGPT-style q @ k^T, scale, causal mask, softmax, dropout, @ v: one attention op, same FLOPs."""
    path = write(
        tmp_path,
        """
        import math
        import torch
        from torch import nn

        class Attn(nn.Module):
            seq_len = 16
            def __init__(self, d=32, h=4):
                super().__init__()
                self.h = h
                self.qkv = nn.Linear(d, 3 * d)
                self.proj = nn.Linear(d, d)
                self.drop = nn.Dropout(0.1)
                self.register_buffer("mask", torch.ones(16, 16).tril().view(1, 1, 16, 16))
            def forward(self, x):
                b, t, d = x.shape
                q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in self.qkv(x).split(d, dim=2))
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf"))
                att = self.drop(torch.softmax(att, dim=-1))
                return self.proj((att @ v).transpose(1, 2).reshape(b, t, d))

        def model():
            return Attn(), [(("batch", "seq", 32), torch.float32)]
        """,
    )
    graph, messages, _ = capture_named(f"{path}:model", CaptureSpec(micro_batch=2))
    (attention,) = [n for n in graph if n.op is OpKind.ATTENTION]
    assert (attention.attrs.batch, attention.attrs.heads, attention.attrs.q_len, attention.attrs.head_dim) == (
        2,
        4,
        16,
        8,
    )
    assert attention.attrs.causal
    assert not [n for n in graph if n.op is OpKind.SOFTMAX]
    causal_scores = 16 * 17 // 2  # of 16 x 16
    assert graph_flops(graph).forward == 2 * 32 * 3 * 32 * 32 + 2 * 32 * 32 * 32 + 4 * 2 * 4 * causal_scores * 8
    assert any("costed as attention" in m for m in messages)


def test_flop_counter_misses_cpu_attention_where_the_closed_form_does_not() -> None:
    """Under FakeTensorMode on CPU, SDPA runs as the CPU flash kernel, which has no FLOP formula."""
    import torch
    from conftest import TINY_LLAMA, capture
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    from echosim.frontend import zoo_modules

    with FakeTensorMode():
        model = zoo_modules.Llama(TINY_LLAMA)
        ids = torch.zeros(2, TINY_LLAMA.seq_len, dtype=torch.long)
        counter = FlopCounterMode(display=False)
        with counter:
            model(ids, ids).backward()
    joint = run_passes(capture(TINY_LLAMA, batch=2), [Autodiff()])
    b, h, s, d = 2, TINY_LLAMA.heads, TINY_LLAMA.seq_len, TINY_LLAMA.dim_head
    closed = TINY_LLAMA.layers * 3 * 4 * b * h * s * (s + 1) // 2 * d  # causal QK^T and PV forward, 2x backward
    ours = graph_flops(joint).model
    attention = [n for n in joint if n.op is OpKind.ATTENTION]
    assert sum(node_flops(n) * joint.multiplicity(n) for n in attention) == closed
    assert counter.get_total_flops() == ours - closed


def test_a_reduction_over_a_split_axis_is_completed_by_an_all_reduce(tmp_path: Path) -> None:
    """A norm over the features a column-parallel layer split (a sub-layer norm before the output projection,
    as BitNet-style models have) and a mean over sequence-split tokens: each rank reduces its part and an
    all_reduce completes it. Both were refused ("tp=2 does not divide axis 2 ... (size 1)")."""
    path = write_lm(
        tmp_path,
        """

        class Block(nn.Module):
            def __init__(self, h=64):
                super().__init__()
                self.up_proj, self.down_proj = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

            def forward(self, x):
                u = self.up_proj(x)
                u = u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + 1e-6)
                return x + self.down_proj(u)
        """,
        head="x - x.mean(1, keepdim=True)",
    )
    one = lower(f"{path}:model", Plan(micro_batch=2), Cluster("null", devices=1))
    for sp in (False, True):
        two = lower(f"{path}:model", Plan(tp=2, sp=sp, micro_batch=2), Cluster("null", devices=2))
        completed = [n for n in two.graph if n.op is OpKind.ALL_REDUCE and n.name.endswith(".tp_all_reduce")]
        reduced = {two.graph[n.inputs[0]].op for n in completed}
        assert OpKind.REDUCTION in reduced
        # the norm's statistic [2, 16, 1] in each layer, and under SP the mean over tokens [2, 1, 64] too
        shapes = {n.out.shape for n in completed if two.graph[n.inputs[0]].op is OpKind.REDUCTION}
        assert shapes == ({(2, 16, 1), (2, 1, 64)} if sp else {(2, 16, 1)})
        assert two.report.model_flops_per_step == pytest.approx(one.report.model_flops_per_step, rel=1e-9)


def test_an_attention_no_rule_splits_gathers_its_sequence_parallel_inputs(tmp_path: Path) -> None:
    """q, k and v from a projection no rule matches, under --sp: the attention reads every token, so its inputs are
    all-gathered and it runs whole (it was split by heads it did not have, and the next layer refused)."""
    path = write_lm(
        tmp_path,
        """

        class Block(nn.Module):
            def __init__(self, h=64, heads=4):
                super().__init__()
                self.heads = heads
                self.mix = nn.Linear(h, 3 * h)
                self.up_proj, self.down_proj = nn.Linear(h, 2 * h), nn.Linear(2 * h, h)

            def forward(self, x):
                b, s, h = x.shape
                q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in self.mix(x).chunk(3, -1))
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, h)
                x = x + a
                return x + self.down_proj(F.gelu(self.up_proj(x)))
        """,
    )
    compiled = lower(f"{path}:model", Plan(tp=2, sp=True, micro_batch=2), Cluster("null", devices=2))
    [attention] = [n for n in compiled.graph if n.op is OpKind.ATTENTION and n.phase is Phase.FORWARD]
    assert attention.attrs.heads == 4 and attention.out.shape[-2] == 16  # whole: every head, every token
    gathered = {compiled.graph[i].op for i in attention.inputs}
    assert gathered <= {OpKind.ALL_GATHER, OpKind.VIEW}
    assert any("layers.0.mix" in w for w in compiled.report.warnings)


def test_a_depthwise_convolution_on_split_channels_keeps_its_groups_split(tmp_path: Path) -> None:
    """A short causal convolution over the sequence, one group per channel, after a column-parallel projection
    (Inkling's key convolution, Megatron's Mamba conv1d): each rank convolves its own channels. It was refused."""
    path = write_lm(
        tmp_path,
        """

        class Block(nn.Module):
            def __init__(self, h=64):
                super().__init__()
                self.up_proj, self.down_proj = nn.Linear(h, 2 * h), nn.Linear(2 * h, h)
                self.conv = nn.Conv1d(2 * h, 2 * h, 4, groups=2 * h, padding=3)

            def forward(self, x):
                u = self.up_proj(x).transpose(1, 2)
                u = self.conv(u)[..., : x.shape[1]].transpose(1, 2)
                return x + self.down_proj(F.silu(u))
        """,
    )
    one = lower(f"{path}:model", Plan(micro_batch=2), Cluster("null", devices=1))
    for sp in (False, True):
        two = lower(f"{path}:model", Plan(tp=2, sp=sp, micro_batch=2), Cluster("null", devices=2))
        [conv] = [
            n for n in two.graph if n.op is OpKind.MATMUL and n.phase is Phase.FORWARD and n.scope == "layers.0.conv"
        ]
        assert conv.attrs.batch == 64 and conv.out.shape[1] == 64  # 128 channel groups over 2 ranks
        assert two.report.hardware_flops_per_step == pytest.approx(one.report.model_flops_per_step, rel=1e-9)


def test_products_that_sum_over_the_tokens_run_on_the_gathered_sequence_under_sp(tmp_path: Path) -> None:
    """A linear attention no rule splits: under --sp each rank projects its own tokens, then ``K^T V`` and
    ``Q (K^T V)``, which sum over every token, run whole on the gathered sequence."""
    path = write_lm(
        tmp_path,
        """

        class Block(nn.Module):
            def __init__(self, h=64):
                super().__init__()
                self.mix_q, self.mix_k, self.mix_v = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
                self.up_proj, self.down_proj = nn.Linear(h, 2 * h), nn.Linear(2 * h, h)

            def forward(self, x):
                q, k, v = self.mix_q(x), F.elu(self.mix_k(x)) + 1, self.mix_v(x)
                x = x + q @ (k.transpose(1, 2) @ v) / x.shape[1]
                return x + self.down_proj(F.gelu(self.up_proj(x)))
        """,
    )
    g = lower(f"{path}:model", Plan(tp=2, sp=True, micro_batch=2), Cluster("null", devices=2)).graph
    mixer = {
        n.scope: n for n in g if n.op is OpKind.MATMUL and n.phase is Phase.FORWARD and n.scope.startswith("layers.0")
    }
    assert all(mixer[f"layers.0.mix_{x}"].attrs.m == 2 * 8 for x in "qkv")  # each rank's 8 of 16 tokens
    products = [n for n in g if n.op is OpKind.MATMUL and n.phase is Phase.FORWARD and n.scope == "layers.0"]
    assert len(products) == 2 and all(n.attrs.useful == 0.5 for n in products)
    assert all(any(g[i].op is OpKind.ALL_GATHER for i in n.inputs) for n in products)


def test_a_layer_that_mixes_tokens_runs_whole_on_the_gathered_sequence_under_sp(tmp_path: Path) -> None:
    """MLP-Mixer's token mixing, a linear over the sequence axis, cannot run on a share of the tokens: under --sp
    its layer is made whole, its input all-gathered, as it runs without --sp; it was refused ("contracts the
    sequence-parallel axis"). The report warns that the layer, its split MLP included, runs whole."""
    path = write_lm(
        tmp_path,
        """

        class Block(nn.Module):
            def __init__(self, h=64, tokens=16):
                super().__init__()
                self.token_mix = nn.Linear(tokens, tokens)
                self.up_proj, self.down_proj = nn.Linear(h, 2 * h), nn.Linear(2 * h, h)

            def forward(self, x):
                x = x + self.token_mix(x.transpose(1, 2)).transpose(1, 2)
                return x + self.down_proj(F.gelu(self.up_proj(x)))
        """,
    )
    compiled = lower(f"{path}:model", Plan(tp=2, sp=True, micro_batch=2), Cluster("null", devices=2))
    g = compiled.graph
    [mix] = [n for n in g if n.op is OpKind.MATMUL and n.phase is Phase.FORWARD and n.scope == "layers.0.token_mix"]
    assert mix.attrs.useful == 0.5 and mix.attrs.m == 2 * 64  # every rank: both sequences' 64 channels, 16 tokens
    assert g[g[mix.inputs[0]].inputs[0]].op is OpKind.ALL_GATHER  # the transpose of the gathered tokens
    [warning] = [w for w in compiled.report.warnings if w.startswith("--sp:")]
    assert warning.startswith("--sp: layers.0 runs whole on all 2 tensor-parallel ranks")


#: A layer of four projections around an attention written as ``a = {mix}`` over q, k, v ``[b, heads, s, d]``.
_HEADS_BLOCK = """
class Block(nn.Module):
    def __init__(self, h=64, heads=4):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(h, h) for _ in range(4))

    def forward(self, x):
        b, s, h = x.shape
        projections = (self.q_proj, self.k_proj, self.v_proj)
        q, k, v = (p(x).view(b, s, self.heads, -1).transpose(1, 2) for p in projections)
        a = {mix}
        return x + self.o_proj(a.transpose(1, 2).reshape(b, s, h))
"""


def test_a_linear_attention_written_out_runs_head_parallel_under_context_parallelism(tmp_path: Path) -> None:
    """A linear attention written out (``phi(q) @ (phi(k)^T @ v)`` per head, MiniMax's lightning attention without
    its decay) multiplies two sequence-split tensors, which a ring cannot split: under --cp 2 its layer trades
    tokens for heads by all_to_all (DeepSpeed-Ulysses' scheme, Megatron-Core's for Mamba), runs over every token
    on half the heads, and trades back before the output projection. It was refused ("context parallelism needs
    attention as one op")."""
    path = write_lm(tmp_path, _HEADS_BLOCK.format(mix="(F.elu(q) + 1) @ ((F.elu(k) + 1).transpose(-2, -1) @ v) / s"))
    one = lower(f"{path}:model", Plan(micro_batch=2), Cluster("null", devices=1))
    two = lower(f"{path}:model", Plan(cp=2, micro_batch=2), Cluster("null", devices=2))
    exchanged = [
        n for n in two.graph if n.phase is Phase.FORWARD and n.op is OpKind.ALL_TO_ALL and "layers.0" in n.scope
    ]
    assert sorted(n.name.rsplit(".", 1)[-1] for n in exchanged) == ["cp_to_heads"] * 3 + ["cp_to_tokens"]
    assert two.report.hardware_flops_per_step == pytest.approx(one.report.model_flops_per_step, rel=1e-9)


def test_an_attention_in_a_head_parallel_layer_attends_every_token_on_the_ranks_heads(tmp_path: Path) -> None:
    """A layer that adds a linear-attention term to its softmax attention is made head-parallel under --cp 2 (the
    term multiplies two token-split tensors): its attention then runs on every token of half the heads, as
    Ulysses runs it, not on a ring."""
    mix = "F.scaled_dot_product_attention(q, k, v, is_causal=True) + q @ (k.transpose(-2, -1) @ v) / s"
    path = write_lm(tmp_path, _HEADS_BLOCK.format(mix=mix))
    g = lower(f"{path}:model", Plan(cp=2, micro_batch=2), Cluster("null", devices=2)).graph
    [attention] = [n for n in g if n.op is OpKind.ATTENTION and n.phase is Phase.FORWARD and "layers.0" in n.scope]
    assert (attention.attrs.heads, attention.attrs.q_len, attention.attrs.kv_len) == (2, 16, 16)
    assert not any(n.op is OpKind.RECV for n in g)  # no ring


_BMM_3D = (
    "torch.bmm(torch.softmax(torch.bmm(q.reshape(b * self.heads, s, -1), k.reshape(b * self.heads, s, -1)"
    ".transpose(1, 2)) / 4, -1), v.reshape(b * self.heads, s, -1)).view(b, self.heads, s, -1)"
)


@pytest.mark.parametrize("mix", ["torch.softmax(q @ k.transpose(-2, -1) / 4, -1) @ v", _BMM_3D])
def test_head_parallel_context_parallelism_exchanges_an_attention_written_out_in_its_own_layout(
    tmp_path: Path, mix: str
) -> None:
    """--cp-comm a2a on attention written out, folded to one op whose K is transposed (``[b, heads, d, s]``) or
    whose heads are merged with the batch (``[b * heads, s, d]``, XGLM's and TrOCR's bmm): each input is exchanged
    on its own token axis and heads, and the model's FLOPs are kept (it was refused: "reads its tokens on axis 3")."""
    path = write_lm(tmp_path, _HEADS_BLOCK.format(mix=mix))
    one = lower(f"{path}:model", Plan(micro_batch=2), Cluster("null", devices=1))
    two = lower(f"{path}:model", Plan(cp=2, cp_comm="a2a", micro_batch=2), Cluster("null", devices=2))
    fwd = [n for n in two.graph if n.phase is Phase.FORWARD and "layers.0" in n.scope]
    exchanged = [n.name.rsplit(".", 1)[-1] for n in fwd if n.op is OpKind.ALL_TO_ALL]
    assert exchanged == ["cp_a2a_heads"] * 3 + ["cp_a2a_tokens"]
    [whole] = [n.attrs for n in one.graph if n.op is OpKind.ATTENTION and n.phase is Phase.FORWARD]
    [attention] = [n.attrs for n in fwd if n.op is OpKind.ATTENTION]
    assert (attention.heads, attention.q_len, attention.kv_len) == (whole.heads // 2, 16, 16)
    assert two.report.model_flops_per_step == pytest.approx(one.report.model_flops_per_step, rel=1e-9)


def test_recompute_on_a_model_without_repeated_layers_says_it_recomputes_nothing() -> None:
    """Every policy checkpoints layers; ResNet-50's stages do not fold into one repeated block, so --recompute
    full changed nothing, silently."""
    plan = Plan(recompute="full", micro_batch=8, global_batch=8)
    report = lower(f"{EXAMPLES / 'resnet50.py'}:model", plan, Cluster("null", devices=1)).report
    assert any("has no repeated block of layers" in w and "nothing is recomputed" in w for w in report.warnings)


def test_a_mean_over_the_tokens_under_context_parallelism_is_completed_by_an_all_reduce(tmp_path: Path) -> None:
    """Each context-parallel rank holds part of the sequence: a mean over the tokens is its part's, then an
    all_reduce over the cp ranks (it was refused: "cp=2 does not divide the sequence axis ... (1)")."""
    block = _HEADS_BLOCK.format(mix="F.scaled_dot_product_attention(q, k, v, is_causal=True)")
    path = write_lm(tmp_path, block, head="x - x.mean(1, keepdim=True)")
    compiled = lower(f"{path}:model", Plan(cp=2, micro_batch=2), Cluster("null", devices=2))
    [reduced] = [n for n in compiled.graph if n.name.endswith(".cp_all_reduce")]
    assert reduced.op is OpKind.ALL_REDUCE and reduced.out.shape == (2, 1, 64)


def test_a_no_grad_region_is_converted_op_by_op(tmp_path: Path) -> None:
    """torch.export wraps a torch.no_grad() region in the higher-order op wrap_with_set_grad_enabled (Phi-3.5-MoE's
    router, CPM-Ant's position bias): it was one memory-bound node and a "no rule" warning."""
    path = write(
        tmp_path,
        """
        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.up_proj, self.down_proj = nn.Linear(64, 128), nn.Linear(128, 64)

            def forward(self, x):
                with torch.no_grad():
                    scale = torch.sigmoid(x.abs().amax(-1, keepdim=True)).exp()
                return self.down_proj(torch.relu(self.up_proj(x * scale)))

        def model():
            return Net(), [(("batch", 16, 64), torch.float32)]
        """,
    )
    compiled = lower(f"{path}:model", Plan(micro_batch=2), Cluster("null", devices=1))
    assert not [w for w in compiled.report.warnings if "wrap_with_set_grad_enabled" in w]
    fns = {str(n.attrs) for n in compiled.graph if n.phase is Phase.FORWARD and n.op is not OpKind.MATMUL}
    assert {"abs", "sigmoid", "exp"} <= fns
