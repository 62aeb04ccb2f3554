"""hf: configs: published sizes, folding, TP plans on HF module paths, FLOPs against PyTorch, bad input."""

from __future__ import annotations

import functools
import json
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import check_golden, masked_attention_flops

pytest.importorskip("transformers")

from echosim.compiler import lower
from echosim.errors import EchosimError
from echosim.frontend import CaptureSpec, hf
from echosim.ir import print_graph, verify
from echosim.ir.ops import MatmulAttrs, OpKind, Phase
from echosim.passes.autodiff import Autodiff
from echosim.passes.base import run_passes
from echosim.passes.flops import graph_flops
from echosim.plan import Cluster, Plan

CONFIGS = Path(__file__).parent / "configs"
TINY = ["tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-gpt2", "tiny-mixtral", "tiny-qwen2-moe", "tiny-deepseek-v3"]

# Model cards: Llama 2 (arXiv:2307.09288), Llama 3 (meta-llama/Meta-Llama-3-8B, -70B), Mistral 7B
# (arXiv:2310.06825), Qwen2 (arXiv:2407.10671: 7.6B, 57B-A14B), GPT-2 small (124M), Mixtral 8x7B
# (arXiv:2401.04088: 46.7B), DeepSeek-V3 (arXiv:2412.19437: 671B without the MTP module), Qwen3-30B-A3B
# (arXiv:2505.09388 / model card: 30.5B).
PUBLISHED = {
    "llama2-7b": 6.74e9,
    "llama3-8b": 8.03e9,
    "llama3-70b": 70.6e9,
    "mistral-7b": 7.24e9,
    "qwen2-7b": 7.62e9,
    "gpt2": 124e6,
    "mixtral-8x7b": 46.7e9,
    "qwen2-57b-a14b": 57.4e9,
    "deepseek-v3": 671e9,
    "qwen3-30b-a3b": 30.5e9,
}


def tiny(name: str, layers: int | None = None) -> object:
    config = hf.build_config(CONFIGS / f"{name}.json")
    if layers is not None:
        config.num_hidden_layers = layers
    return config


@functools.cache
def captured(name: str, batch: int = 2, seq: int = 16) -> tuple[object, int]:
    cap, total = hf.capture_config(tiny(name), CaptureSpec(micro_batch=batch, seq_len=seq), name)
    return cap, total


def test_every_test_config_has_a_published_size_or_is_tiny() -> None:
    assert sorted(hf.shipped()) == sorted(PUBLISHED)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_shipped_config_matches_published_parameter_count(name: str) -> None:
    model = hf.build_model(hf.build_config(hf.config_path(f"hf:{name}")))
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(PUBLISHED[name], rel=0.005)


@pytest.mark.parametrize("name", TINY)
def test_tiny_models_capture_fold_and_keep_every_parameter(name: str) -> None:
    cap, total = captured(name)
    verify(cap.graph)
    assert len(cap.graph.repeats) == 1
    assert cap.graph.param_count() == total
    assert not cap.warnings, cap.warnings


def test_capture_golden_tiny_llama() -> None:
    cap, _ = captured("tiny-llama", batch=1)
    check_golden("capture_hf_llama.txt", print_graph(cap.graph))


def test_rmsnorm_written_out_by_hf_is_one_norm_node() -> None:
    cap, _ = captured("tiny-llama")
    norms = [n for n in cap.graph if n.op is OpKind.NORM]
    assert len(norms) == 3  # input, post-attention (folded layer) and final norm
    assert not any(n.scope.endswith("layernorm") and n.op is OpKind.ELEMENTWISE for n in cap.graph)


def test_deepseek_dense_layers_stay_and_moe_layers_fold() -> None:
    cap, _ = captured("tiny-deepseek-v3")
    assert cap.graph.repeats == {"model.layers.1": 2}  # first_k_dense_replace=1 of 3 layers
    assert any(n.scope == "model.layers.0.mlp.gate_proj" for n in cap.graph)


def test_moe_experts_are_grouped_matmuls_with_the_expert_count_in_batch() -> None:
    cap, _ = captured("tiny-mixtral")
    experts = [n for n in cap.graph if isinstance(n.attrs, MatmulAttrs) and n.scope.endswith("experts")]
    assert [n.attrs.batch for n in experts] == [4, 4]
    tokens, top_k, hidden, ffn = 2 * 16, 2, 64, 96
    assert sum(n.attrs.flops for n in experts) == 2 * tokens * top_k * (hidden * 2 * ffn + ffn * hidden)


def test_folding_makes_depth_free() -> None:
    """8 and 80 layers of Llama-3 70B widths capture to the same graph; only the repeat count differs."""
    spec = CaptureSpec(seq_len=128)
    base = hf.build_config(hf.config_path("hf:llama3-70b"))
    graphs = {}
    for layers in (8, 80):
        base.num_hidden_layers = layers
        cap, total = hf.capture_config(base, spec, "llama3-70b")
        graphs[layers] = (cap.graph, total)
    (g8, p8), (g80, p80) = graphs[8], graphs[80]
    assert len(g8) == len(g80)
    assert g8.repeats == {"model.layers.0": 8} and g80.repeats == {"model.layers.0": 80}
    assert g80.param_count() == p80 == pytest.approx(70.6e9, rel=0.005)
    assert g8.param_count() == p8


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2", "tiny-qwen2", "tiny-mistral"])
def test_tp_plan_finds_hf_module_paths(name: str) -> None:
    """TP divides the work of every matched layer evenly: FLOPs per rank halve at tp=2."""
    plan1, plan2 = Plan(seq_len=16, micro_batch=2), Plan(tp=2, seq_len=16, micro_batch=2)
    one = lower(f"hf:{CONFIGS / name}.json", plan1, Cluster("null", devices=1))
    two = lower(f"hf:{CONFIGS / name}.json", plan2, Cluster("null", devices=2))
    assert two.report.model_flops_per_step == pytest.approx(one.report.model_flops_per_step, rel=1e-9)
    collectives = Counter(n.op for n in two.graph if n.op.is_collective)
    assert collectives[OpKind.ALL_REDUCE] >= 4
    assert not two.report.warnings


@pytest.mark.parametrize("name", ["tiny-gpt-neox", "tiny-gptj", "tiny-opt", "tiny-falcon", "tiny-bloom"])
def test_tp_splits_every_linear_of_a_layer_under_each_librarys_module_names(name: str) -> None:
    """GPT-NeoX, Falcon and BLOOM (dense_h_to_4h / dense_4h_to_h), GPT-J (fc_in / fc_out, out_proj) and OPT
    (out_proj): every linear of the repeated layer is column- or row-parallel at tp=2. Their MLPs used to run
    whole on every rank with no word said, and Falcon's ``x @ self.weight.T`` hid the weight behind an uncosted
    ``numpy_T`` copy."""
    compiled = lower(f"hf:{CONFIGS / name}.json", Plan(tp=2, seq_len=16, micro_batch=2), Cluster("null", devices=2))
    g = compiled.graph
    styles = {
        n.scope.rsplit(".", 1)[-1]: n.attrs.tp
        for n in g
        if isinstance(n.attrs, MatmulAttrs)
        and n.phase is Phase.FORWARD
        and g.block_of(n) is not None
        and g[n.inputs[1]].op is OpKind.PARAMETER
    }
    assert len(styles) >= 4 and set(styles.values()) == {"colwise", "rowwise"}, styles
    assert not any("numpy_t" in n.name for n in g if n.op is not OpKind.VIEW)  # .T is a view, not a copy
    assert not compiled.report.warnings


def test_a_mamba_model_under_tp_splits_its_mixer_by_channels() -> None:
    """Mamba's in_proj is column-parallel, so the convolution and the scan run on each rank's channels; x_proj reads
    them and is row-parallel, as out_proj is. Its projections ran whole on both ranks."""
    compiled = lower(f"hf:{CONFIGS}/tiny-mamba.json", Plan(tp=2, seq_len=16), Cluster("null", devices=2))
    g = compiled.graph
    styles = {
        n.scope: n.attrs.tp
        for n in g
        if n.op is OpKind.MATMUL and n.phase is Phase.FORWARD and g[n.inputs[1]].op is OpKind.PARAMETER
    }
    mixer = "backbone.layers.0.mixer"
    assert styles == {
        f"{mixer}.in_proj": "colwise",
        f"{mixer}.x_proj": "rowwise",
        f"{mixer}.out_proj": "rowwise",
        "lm_head": "vocab",
    }
    assert not compiled.report.warnings


def test_model_flops_count_a_product_every_tp_rank_repeats_once() -> None:
    """DeepSeek's MLA down-projections (``q_a_proj``, ``kv_a_proj_with_mqa``) and the router match no rule and run
    whole on both ranks at tp=2, as Megatron-Core keeps them: the hardware does them twice, the model once, so the
    model FLOPs (MFU's numerator) are the tp=1 figure and the repeat is hardware FLOPs only."""
    path = f"hf:{CONFIGS}/tiny-deepseek-v3.json"
    one = lower(path, Plan(seq_len=16, micro_batch=2, global_batch=2), Cluster("null", devices=1)).report
    two = lower(path, Plan(tp=2, seq_len=16, micro_batch=2, global_batch=2), Cluster("null", devices=2)).report
    assert two.model_flops_per_step == pytest.approx(one.model_flops_per_step, rel=1e-6)
    assert two.hardware_flops_per_step > 1.02 * one.hardware_flops_per_step


@pytest.mark.parametrize("name", ["tiny-mixtral", "tiny-qwen2-moe", "tiny-deepseek-v3", "tiny-dbrx"])
def test_moe_under_tp_splits_attention_heads_and_the_experts_by_their_weights_names(name: str) -> None:
    """transformers' fused experts hold both grouped weights in one module (``[experts, out, in]``): the weight's
    name picks the rule, ``experts.gate_up_proj`` column- and ``experts.down_proj`` row-parallel, as Megatron-Core's
    expert tensor parallelism (its default, the tensor-parallel size) splits them. They were replicated on every
    rank (1.64x the model's FLOPs for Mixtral at tp 2). DBRX stores its experts as ``w1``, ``v1`` and ``w2`` stacks."""
    compiled = lower(f"hf:{CONFIGS}/{name}.json", Plan(tp=2, seq_len=16), Cluster("null", devices=2))
    heads = {n.attrs.heads for n in compiled.graph if n.op is OpKind.ATTENTION and n.phase is Phase.FORWARD}
    assert heads == {2}  # 4 heads over 2 ranks (DeepSeek's MLA through q_b_proj / kv_b_proj)
    whole = lower(f"hf:{CONFIGS}/{name}.json", Plan(seq_len=16), Cluster("null", devices=1)).graph

    def grouped(g: Any) -> dict[str, Any]:
        return {n.name: n.attrs for n in g if n.op is OpKind.MATMUL and n.phase is Phase.FORWARD and n.attrs.grouped}

    full, split = grouped(whole), grouped(compiled.graph)
    assert full and {a.tp for a in split.values()} == {"colwise", "rowwise"}
    for product, a in split.items():  # gate_up's outputs halve, down_proj's inputs
        assert (a.n, a.k) == ((full[product].n // 2, full[product].k) if a.tp == "colwise" else
                              (full[product].n, full[product].k // 2))  # fmt: skip
    stacks = [n for n in compiled.graph if n.op is OpKind.PARAMETER and len(n.out.shape) == 3]
    assert stacks and all(n.attrs.shard == 2 for n in stacks)
    assert not any("experts" in w for w in compiled.report.warnings)


@pytest.mark.parametrize("ep", [1, 2])
def test_hf_experts_with_expert_tensor_parallelism_1_run_each_ranks_own_tokens(ep: int) -> None:
    """--etp 1 under SP: each rank runs its own tokens through the whole experts (Megatron's expert tensor
    parallelism 1); the work is not repeated, and the weights' gradients are reduced as experts'. By default the
    experts split as the dense layers do (expert tensor parallelism = tp)."""
    source = f"hf:{CONFIGS}/tiny-mixtral.json"
    plan = Plan(tp=2, sp=True, dp=2, ep=ep, etp=1, seq_len=16, global_batch=2)
    compiled = lower(source, plan, Cluster("null", devices=4))
    report = compiled.report
    assert report.hardware_flops_per_step == pytest.approx(report.model_flops_per_step, rel=1e-9)
    stacks = [n for n in compiled.graph if n.op is OpKind.PARAMETER and len(n.out.shape) == 3]
    assert stacks and all(n.attrs.expert for n in stacks)
    assert {n.out.shape[1:] for n in stacks} == {(192, 64), (64, 96)}  # whole: [experts, out, in]
    assert not any("experts" in w for w in report.warnings)
    split = lower(source, replace(plan, etp=0), Cluster("null", devices=4)).graph
    assert {n.out.shape[1:] for n in split if n.op is OpKind.PARAMETER and len(n.out.shape) == 3} == {
        (96, 64),
        (64, 48),
    }


@pytest.mark.parametrize("sp", [False, True])
def test_a_row_parallel_rule_on_a_linear_no_column_parallel_one_feeds_keeps_it_whole(tmp_path: Path, sp: bool) -> None:
    """BERT's LM-head transform is a ``*.dense`` as its output projections are, but reads the whole hidden state:
    it was refused ("row-parallel ... reads an unsplit input"); it now runs whole, named, and the encoder's
    projections still split."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(
        "bert", num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, vocab_size=512
    )
    config.to_json_file(tmp_path / "config.json")
    compiled = lower(f"hf:{tmp_path}", Plan(tp=2, sp=sp, seq_len=16), Cluster("null", devices=2))
    forward = [n for n in compiled.graph if n.op is OpKind.MATMUL and n.phase is Phase.FORWARD]
    ks = {n.scope: n.attrs.k for n in forward if n.scope.endswith(".dense")}
    assert ks["cls.predictions.transform.dense"] == 64
    assert {k for scope, k in ks.items() if scope.endswith("output.dense")} == {32, 64}  # attention: 64/2; MLP: 128/2
    [warning] = [w for w in compiled.report.warnings if "linear layer" in w]
    assert warning.startswith("1 linear layer (cls.predictions.transform.dense)")
    assert not any(w.startswith("--sp:") for w in compiled.report.warnings)  # no layer is made whole for SP
    # the MLM decoder is tied to the word embeddings: both vocabulary-parallel
    decoder = [n for n in compiled.graph if n.scope == "cls.predictions.decoder" and n.op is OpKind.MATMUL]
    assert {n.attrs.tp for n in decoder if n.phase is Phase.FORWARD} == {"vocab"}


MOE_TINY = ["tiny-mixtral", "tiny-qwen2-moe", "tiny-deepseek-v3"]


@pytest.mark.parametrize("name", MOE_TINY)
def test_hf_moe_routing_is_recognised_once_per_moe_layer(name: str) -> None:
    cap, _ = captured(name)
    fns = Counter(getattr(n.attrs, "fn", "") for n in cap.graph)
    assert fns["moe_dispatch"] == fns["moe_unpermute"] == 1  # one folded MoE layer


@pytest.mark.parametrize("name", MOE_TINY)
def test_expert_parallelism_splits_hf_experts(name: str) -> None:
    """ep=2: each rank holds half of every expert stack, two all_to_alls per MoE layer, the same FLOPs."""
    source = f"hf:{CONFIGS}/{name}.json"
    one = lower(source, Plan(dp=2, seq_len=16, global_batch=2), Cluster("null", devices=2))
    two = lower(source, Plan(dp=2, ep=2, seq_len=16, global_batch=2), Cluster("null", devices=2))
    stacks = {n.scope: n.out.shape[0] for n in two.graph if n.op is OpKind.PARAMETER and len(n.out.shape) == 3}
    full = {n.scope: n.out.shape[0] for n in one.graph if n.op is OpKind.PARAMETER and len(n.out.shape) == 3}
    assert stacks and all(stacks[s] * 2 == full[s] for s in full)
    forward = [n for n in two.graph if n.op is OpKind.ALL_TO_ALL and n.phase is Phase.FORWARD]
    assert len(forward) == 2
    assert two.report.model_flops_per_step == pytest.approx(one.report.model_flops_per_step, rel=1e-9)
    assert two.report.breakdown["comm.ep"] > 0


def test_an_ep_that_does_not_divide_hf_experts_is_one_line() -> None:
    from echosim.plan import PlanError

    with pytest.raises(PlanError, match=r"^ep=3 does not divide experts 4$"):
        lower(f"hf:{CONFIGS}/tiny-mixtral.json", Plan(dp=3, ep=3, seq_len=16, global_batch=3), Cluster("null", 3))


@pytest.mark.slow
def test_deepseek_v3_splits_its_256_experts_by_ep() -> None:
    """The real config: 671B parameters, 256 routed experts per MoE layer; ep=8 leaves 32 on each rank."""
    plan = Plan(dp=8, ep=8, seq_len=1024, global_batch=8)
    compiled = lower("hf:deepseek-v3", plan, Cluster("h100-sxm", 8))
    assert compiled.report.params == pytest.approx(671e9, rel=0.005)
    stacks = {n.out.shape[0] for n in compiled.graph if n.op is OpKind.PARAMETER and len(n.out.shape) == 3}
    assert stacks == {32}


def test_pipeline_parallel_splits_hf_layers() -> None:
    compiled = lower(f"hf:{CONFIGS}/tiny-llama.json", Plan(pp=2, seq_len=16), Cluster("null", devices=2))
    assert [s.layers for s in compiled.stages] == [1, 1]


def test_derived_backward_matches_pytorch_joint_graph_for_one_llama_layer() -> None:
    """aot_module_simplified after export: the same linear matmuls, and the same FLOPs in total."""
    import torch
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified

    config = tiny("tiny-llama", layers=1)
    ids = torch.zeros(2, 16, dtype=torch.long, device="meta")
    gm = torch.export.export(hf._logits_only(hf.build_model(config)), (ids,)).module()
    gm.graph._codegen = torch.fx.graph.CodeGen()  # plain tuple outputs, as aot_module_simplified wants
    gm.recompile()
    graphs: dict[str, torch.fx.GraphModule] = {}

    def keep(tag: str):
        def compiler(g: torch.fx.GraphModule, _inputs: object) -> object:
            graphs[tag] = g
            return make_boxed_func(g.forward)

        return compiler

    fn = aot_module_simplified(gm, (ids,), fw_compiler=keep("fw"), bw_compiler=keep("bw"))
    fn(ids)[0].float().sum().backward()
    mm = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}
    bmm = {torch.ops.aten.bmm.default}
    theirs: Counter[str] = Counter()
    flops = 0
    for tag, g in graphs.items():
        for n in g.graph.nodes:
            if n.op == "call_function" and n.target in mm | bmm:
                a, b = (x.meta["val"].shape for x in n.args[-2:])
                theirs[f"{tag}.{'mm' if n.target in mm else 'bmm'}"] += 1
                flops += 2 * a[0] * a[1] * b[1] if len(a) == 2 else 2 * a[0] * a[1] * a[2] * b[2]
    cap, _ = hf.capture_config(config, CaptureSpec(micro_batch=2, seq_len=16), "llama1")
    joint = run_passes(cap.graph, [Autodiff()])
    ours = Counter(n.phase for n in joint if n.op is OpKind.MATMUL)
    assert (ours[Phase.FORWARD], ours[Phase.BACKWARD]) == (theirs["fw.mm"], theirs["bw.mm"]) == (8, 16)
    # attention is one IR op; on meta PyTorch runs it as bmm: 2 forward, 4 backward
    assert (theirs["fw.bmm"], theirs["bw.bmm"]) == (2, 4)
    assert graph_flops(joint).model + masked_attention_flops(joint) == flops  # PyTorch multiplies masked scores too


def _counter_flops(config: object, grouped_mm: bool = False) -> int:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    model = hf.build_model(config)
    ids = torch.zeros(2, 16, dtype=torch.long, device="meta")
    mapping = {}
    if grouped_mm:

        def gmm(a: list[int], b: list[int], *_: object, out_shape: object = None, **__: object) -> int:
            return 2 * a[0] * a[1] * (b[2] if len(b) == 3 else b[1])

        mapping = {torch.ops.aten._grouped_mm: gmm}
    counter = FlopCounterMode(display=False, custom_mapping=mapping)
    with counter:
        model(input_ids=ids, use_cache=False).logits.float().sum().backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_flops_match_flop_counter_on_meta(name: str) -> None:
    """Dense models: mm/addmm and (on meta) the math SDPA path are all in FlopCounterMode's registry."""
    cap, _ = captured(name)
    joint = run_passes(cap.graph, [Autodiff()])
    assert graph_flops(joint).model + masked_attention_flops(joint) == _counter_flops(tiny(name))


def test_moe_flops_closed_form_where_flop_counter_misses_grouped_mm() -> None:
    """FlopCounterMode has no formula for aten._grouped_mm: it drops Mixtral's experts; ours keep them."""
    cfg = json.loads((CONFIGS / "tiny-mixtral.json").read_text())
    h, f, layers, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    heads, kv, experts, top_k = (
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["num_local_experts"],
        cfg["num_experts_per_tok"],
    )
    tokens, seq, d = 2 * 16, 16, h // heads
    attention = 4 * 2 * heads * seq * (seq + 1) // 2 * d  # the causal scores
    linear = 2 * tokens * h * (heads * d + 2 * kv * d) + 2 * tokens * heads * d * h + 2 * tokens * h * experts
    expert = 2 * tokens * top_k * 3 * h * f
    forward_layer = linear + expert + attention
    closed = 3 * (layers * forward_layer + 2 * tokens * h * vocab)
    cap, _ = captured("tiny-mixtral")
    ours = graph_flops(run_passes(cap.graph, [Autodiff()])).model
    assert ours == closed
    masked = 3 * layers * 4 * 2 * heads * seq * (seq - 1) // 2 * d  # PyTorch's math path multiplies them too
    missing = _counter_flops(tiny("tiny-mixtral"))
    assert missing == closed + masked - 3 * layers * expert
    assert _counter_flops(tiny("tiny-mixtral"), grouped_mm=True) == closed + masked


def test_unknown_model_type_is_one_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "no-such-arch", "hidden_size": 8}))
    with pytest.raises(EchosimError, match="unknown model_type 'no-such-arch'"):
        hf.build_config(path)


def test_what_transformers_says_about_a_config_is_a_note_not_stderr(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """transformers logs its config checks (a bos_token_id outside the vocabulary) to stderr in its own format; the
    report carries each as one note naming transformers, and its logger is left as it was."""
    import logging

    from echosim.compiler import compile as compile_model

    data = json.loads((CONFIGS / "tiny-llama.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**data, "bos_token_id": -1}))
    logger = logging.getLogger("transformers")
    before = (list(logger.handlers), logger.level)
    report = compile_model(f"hf:{tmp_path}", Plan(), Cluster("a100-80gb", 1))
    said = [n for n in report.notes if n.startswith("transformers on config.json: ")]
    assert len(said) == 1 and "bos_token_id" in said[0]
    assert not [w for w in report.warnings if "bos_token_id" in w]
    assert "bos_token_id" not in capfd.readouterr().err
    assert (list(logger.handlers), logger.level) == before
    # a clean config says nothing
    clean = compile_model(f"hf:{CONFIGS / 'tiny-llama.json'}", Plan(), Cluster("a100-80gb", 1))
    assert not [n for n in clean.notes if n.startswith("transformers on")]


def test_floats_transformers_writes_as_tags_are_read_back(tmp_path: Path) -> None:
    """transformers' to_json_file writes an infinite float as {"__float__": "Infinity"} (Bamba's time_step_limit);
    transformers reads it back, and so must echosim, or the config it wrote is "rejected"."""
    import math

    from transformers import AutoConfig

    config = AutoConfig.for_model("bamba", num_hidden_layers=2, hidden_size=64, vocab_size=512)
    path = tmp_path / "config.json"
    config.to_json_file(path)
    assert '"__float__": "Infinity"' in path.read_text()
    assert hf.build_config(path).time_step_limit == (0.0, math.inf)


@pytest.mark.parametrize(
    ("text", "message"),
    [("{not json", "not a readable JSON config"), ("[1, 2]", "not a JSON object"), ("{}", "has no model_type")],
)
def test_bad_config_files(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(EchosimError, match=message):
        hf.load(f"hf:{path}")


def test_a_directory_holding_config_json_and_missing_paths(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((CONFIGS / "tiny-llama.json").read_text())
    assert hf.config_path(f"hf:{tmp_path}") == tmp_path / "config.json"
    with pytest.raises(EchosimError, match="downloads nothing"):
        hf.config_path("hf:meta-llama/Llama-3.1-8B")
    (tmp_path / "empty").mkdir()
    with pytest.raises(EchosimError, match=r"has no config\.json"):
        hf.config_path(f"hf:{tmp_path / 'empty'}")


def test_without_transformers_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(EchosimError, match=r"pip install 'echosim\[hf\]'"):
        hf.build_config(CONFIGS / "tiny-llama.json")


def test_llama4_interleaved_moe_layers_match_the_zoo_closed_form() -> None:
    """HF Llama 4 (interleave_moe_layer_step 2): layers 1 and 3 hold 4 experts of 32 and a shared one,
    layers 0 and 2 a dense MLP of 96; the same parameters as the zoo's ArchConfig with moe_layer_step 2.
    Alternating layers have no run of identical ones: the capture is unfolded."""
    from echosim.frontend.zoo import ArchConfig

    cap, total = captured("tiny-llama4")
    zoo = ArchConfig("moe", 4, 64, 4, 128, ffn=96, kv_heads=2, head_dim=16, experts=4, top_k=1, moe_ffn=32,
                     shared_experts=1, moe_layer_step=2)  # fmt: skip
    assert total == cap.graph.param_count() == zoo.param_count() == 164_928
    assert cap.graph.repeats == {}
    experts = {n.scope.split(".")[2] for n in cap.graph if n.op is OpKind.PARAMETER and ".experts" in n.scope}
    assert experts == {"1", "3"}


def test_interleaved_sliding_and_full_layers_fold_as_a_group_and_split_into_stages() -> None:
    """Gemma 2 alternates sliding-window and full attention: no two neighbours are identical, so nothing folded and
    --pp was refused. Pairs of layers now fold to one block of two (each keeps its own window), FLOPs and
    parameters as unfolded, and pipeline parallelism splits the pairs."""
    config, _ = hf.read_model_config(CONFIGS / "tiny-gemma2.json")
    spec = CaptureSpec(micro_batch=1, seq_len=32)
    folded, params = hf.capture_config(config, spec, "tiny-gemma2")
    whole, _ = hf.capture_config(config, spec, "tiny-gemma2", fold=False)
    assert folded.graph.repeats == {"model.layers.0": 3} and folded.graph.block_layers == {"model.layers.0": 2}
    windows = {n.scope: n.attrs.window for n in folded.graph if n.op is OpKind.ATTENTION}
    assert windows == {"model.layers.0.0.self_attn": 8, "model.layers.0.1.self_attn": 0}  # 0: no window
    assert folded.graph.param_count() == whole.graph.param_count() == params
    flops = [graph_flops(run_passes(c.graph, [Autodiff()])) for c in (folded, whole)]
    assert flops[0] == flops[1]
    staged = lower(f"hf:{CONFIGS}/tiny-gemma2.json", Plan(pp=3, seq_len=32, global_batch=6), Cluster("null", 3))
    assert len(staged.report.memory) == 3


def test_a_lookup_whose_ids_are_constants_still_reads_ids() -> None:
    """CPM-Ant's segment ids are a ``cat`` of fixed values: no IR value. The lookup held the table alone and
    autodiff crashed with a traceback; the ids are now a fresh buffer the lookup and its gradient read."""
    compiled = lower(f"hf:{CONFIGS}/tiny-cpmant.json", Plan(seq_len=32), Cluster("null", devices=1))
    lookups = [n for n in compiled.graph if n.op is OpKind.EMBEDDING and n.phase is Phase.FORWARD]
    assert len(lookups) >= 2 and all(len(n.inputs) == 2 for n in lookups)


@pytest.mark.parametrize("name", ["tiny-mpt", "tiny-glm-moe-dsa"])
def test_models_that_read_the_attention_mask_themselves_are_captured(name: str) -> None:
    """MPT's blocks and GLM-5's sparse-attention indexer read the causal mask outside the attention call; the
    capture's mask is ``None`` (its attention reads none), so they failed to capture. The capture is tried again
    with the mask built as a tensor. GLM-5's top-k key selection is not modelled, and the report says so."""
    compiled = lower(f"hf:{CONFIGS}/{name}.json", Plan(seq_len=64), Cluster("null", devices=1))
    assert compiled.report.step_time_s > 0
    sparse = [w for w in compiled.report.warnings if "sparse attention (32 keys per query" in w]
    assert len(sparse) == (name == "tiny-glm-moe-dsa")


def test_layers_that_differ_by_a_depth_dependent_constant_fold() -> None:
    """DiffLlama scales each layer's attention by lambda_init, a function of its depth: the layers cost the same,
    so they fold (they were captured at full depth, and --pp was refused), with the unfolded capture's FLOPs."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(
        "diffllama",
        num_hidden_layers=4,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
    )
    spec = CaptureSpec(micro_batch=1, seq_len=32)
    folded, _ = hf.capture_config(config, spec, "diffllama")
    whole, _ = hf.capture_config(config, spec, "diffllama", fold=False)
    assert folded.graph.repeats == {"model.layers.0": 4}
    assert graph_flops(folded.graph) == graph_flops(whole.graph)


@pytest.mark.parametrize("sp", [False, True])
def test_a_vocabulary_tp_does_not_divide_is_split_unevenly(tmp_path: Path, sp: bool) -> None:
    """GPT-2's 50,257 tokens over tp=2 were refused ("tp=2 does not divide lm_head.weight dim 0"); the busiest rank
    now holds ceil(V / tp) rows of the embedding, the output layer and the loss."""
    data = json.loads((CONFIGS / "tiny-llama.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**data, "vocab_size": 129}))
    compiled = lower(f"hf:{tmp_path}", Plan(tp=2, sp=sp, seq_len=16), Cluster("null", devices=2))
    tables = {
        n.out.shape[0]
        for n in compiled.graph
        if n.op is OpKind.PARAMETER and n.scope in ("model.embed_tokens", "lm_head")
    }
    assert tables == {65}
    losses = [n for n in compiled.graph if n.op is OpKind.CROSS_ENTROPY]
    assert losses and {n.attrs.vocab for n in losses} == {65}
    [logits] = [
        n for n in compiled.graph if n.op is OpKind.MATMUL and n.scope == "lm_head" and n.phase is Phase.FORWARD
    ]
    assert logits.attrs.n == 65 and logits.out.shape[-1] == 65


def test_mpt_fused_qkv_splits_by_heads() -> None:
    """MPT's attention projection is ``Wqkv``: it matched no rule, so its attention and output projection ran whole
    on every rank (under --sp the capture was refused)."""
    for sp in (False, True):
        compiled = lower(f"hf:{CONFIGS}/tiny-mpt.json", Plan(tp=2, sp=sp, seq_len=64), Cluster("null", devices=2))
        heads = {n.attrs.heads for n in compiled.graph if n.op is OpKind.ATTENTION and n.phase is Phase.FORWARD}
        assert heads == {2}
        assert not [w for w in compiled.report.warnings if "linear layer" in w]
        report = compiled.report
        assert report.hardware_flops_per_step == pytest.approx(report.model_flops_per_step, rel=1e-9)


def test_a_sequence_beyond_the_models_positions_is_said() -> None:
    """Past a learned position table's rows (GPT-2's wpe) the model cannot run: a warning. Past a rotary model's
    max_position_embeddings it extrapolates: a note. MPT fails to capture: the error says why."""
    gpt2 = lower(f"hf:{CONFIGS}/tiny-gpt2.json", Plan(seq_len=64), Cluster("null", devices=1)).report
    assert any("learned position embeddings (transformer.wpe)" in w for w in gpt2.warnings)
    llama = lower(f"hf:{CONFIGS}/tiny-llama.json", Plan(seq_len=64), Cluster("null", devices=1)).report
    assert "--seq-len 64 exceeds the config's max_position_embeddings 16" in llama.notes
    assert not [w for w in llama.warnings if "position" in w]
    with pytest.raises(EchosimError, match=r"\(--seq-len 256 exceeds the config's 64 positions\)$"):
        lower(f"hf:{CONFIGS}/tiny-mpt.json", Plan(seq_len=256), Cluster("null", devices=1))


@pytest.mark.slow
def test_a_model_mixing_its_own_fp32_states_with_bf16_weights_is_built_in_fp32() -> None:
    """xLSTM makes fp32 states of its own and multiplies them with its weights, which the capture builds in bf16:
    "expected scalar type Float but found BFloat16". It is built in fp32 instead, as it would train under
    autocast; the IR costs every float in the capture's dtype either way."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(
        "xlstm", hidden_size=64, embedding_dim=64, num_heads=8, num_blocks=2, num_hidden_layers=2, vocab_size=512
    )
    cap, _ = hf.capture_config(config, CaptureSpec(micro_batch=1, seq_len=128), "xlstm")
    assert cap.graph.repeats == {"backbone.blocks.0": 2}
    assert {n.out.dtype.value for n in cap.graph if n.op is OpKind.MATMUL} == {"bf16"}


@pytest.mark.parametrize("cp", [2, 4])
def test_hf_experts_under_context_parallelism_keep_each_ranks_tokens(cp: int) -> None:
    """transformers' MoE layer sorts ``tokens x top_k`` rows and views them back as ``[tokens, top_k]``: the split
    stays on the tokens. It went to the top_k axis, so the sum over a token's experts became an all_reduce of every
    token over the cp ranks at cp=2, and cp=4 was refused ("does not divide the sequence axis ... (2)")."""
    compiled = lower(f"hf:{CONFIGS}/tiny-mixtral.json", Plan(cp=cp, seq_len=1024), Cluster("null", devices=cp))
    moe = [n for n in compiled.graph if n.phase is Phase.FORWARD and ".mlp" in n.scope]
    assert not any(n.op.is_collective for n in moe)
    [combined] = [n for n in moe if n.op is OpKind.REDUCTION and n.scope.endswith("layers.0.mlp.experts")]
    assert combined.out.shape == (1024 // cp, 64)


def test_bloom_under_context_parallelism_runs_its_alibi_attention_head_parallel() -> None:
    """BLOOM's attention is written out (``baddbmm`` with its ALiBi bias), not one op a ring can split: under cp=2
    each layer trades tokens for heads by all_to_all and back, and the step does the model's FLOPs once. It was
    refused ("context parallelism needs attention as one op")."""
    path = f"hf:{CONFIGS}/tiny-bloom.json"
    one = lower(path, Plan(seq_len=64), Cluster("null", devices=1)).report
    two = lower(path, Plan(cp=2, seq_len=64), Cluster("null", devices=2))
    kinds = {n.name.rsplit(".", 1)[-1] for n in two.graph if n.op is OpKind.ALL_TO_ALL and n.phase is Phase.FORWARD}
    assert kinds == {"cp_to_heads", "cp_to_tokens"}
    assert two.report.hardware_flops_per_step == pytest.approx(one.model_flops_per_step, rel=1e-9)


def test_an_hf_sliding_window_runs_under_the_context_parallel_schemes_that_run_one() -> None:
    """Mistral's window (config sliding_window 8): all_gather and a2a keep the model's FLOPs, the ring refuses."""
    model = f"hf:{CONFIGS / 'tiny-mistral'}.json"
    one = lower(model, Plan(seq_len=16, micro_batch=2), Cluster("null", devices=1)).report
    for comm in ("all_gather", "a2a"):
        two = lower(model, Plan(cp=2, cp_comm=comm, seq_len=16, micro_batch=2), Cluster("null", devices=2)).report
        assert two.model_flops_per_step == pytest.approx(one.model_flops_per_step, rel=1e-9)
    with pytest.raises(EchosimError, match="does not run sliding-window attention"):
        lower(model, Plan(cp=2, seq_len=16, micro_batch=2), Cluster("null", devices=2))


def test_a_search_of_a_windowed_model_runs_context_parallelism_under_the_scheme_it_is_given() -> None:
    from click.testing import CliRunner

    from echosim.cli import cli

    args = ["search", f"hf:{CONFIGS / 'tiny-mistral'}.json", "--backend", "h100-sxm", "--devices", "2",
            "--global-batch", "2", "--seq-len", "16", "--space", "cp=2", "--micro-batches", "1",
            "--recompute", "none", "--json"]  # fmt: skip
    ring = CliRunner().invoke(cli, args)
    assert ring.exit_code == 1 and len(ring.output.strip().splitlines()) == 1
    assert "8 by a sliding window under the ring (--cp-comm p2p; all_gather, a2a run one)" in ring.output
    for comm in ("all_gather", "a2a"):
        found = CliRunner().invoke(cli, [*args, "--cp-comm", comm])
        assert found.exit_code == 0, found.output
        best = json.loads(found.stdout)["best"]
        assert best and all(b["cp"] == 2 and b["fits"] for b in best)


def test_minimax_lightning_attention_gate_splits_with_its_heads(tmp_path: Path) -> None:
    """MiniMax's lightning attention gates each head's output by a sigmoid of ``output_gate(x)``: column-parallel,
    as its q/k/v projection, so every linear of the layer is split at tp=2 (the gate ran whole and was warned of)."""
    from transformers import AutoConfig

    small = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 intermediate_size=128, vocab_size=512, max_position_embeddings=256)  # fmt: skip
    AutoConfig.for_model("minimax", **small).to_json_file(tmp_path / "config.json")
    compiled = lower(f"hf:{tmp_path}", Plan(tp=2, seq_len=64), Cluster("null", devices=2))
    gates = [n for n in compiled.graph if n.op is OpKind.MATMUL and n.scope.endswith("self_attn.output_gate")]
    assert gates and {n.attrs.tp for n in gates if n.phase is Phase.FORWARD} == {"colwise"}
    assert not any("run whole" in w for w in compiled.report.warnings)
