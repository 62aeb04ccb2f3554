"""hf: configs whose ``architectures`` name a head other than a causal LM: bidirectional encoders (BERT's masked
LM), image classifiers (ViT) and encoder-decoders (T5, Whisper), built as named and fed the inputs they read.

Before, a config whose model type has no causal LM (T5, ViT, Whisper's encoder) was refused or built without the
part its head needs (Whisper as ``WhisperForCausalLM``: the decoder alone), and BERT as ``BertLMHeadModel``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

pytest.importorskip("transformers")

from echosim.cli import cli
from echosim.frontend import CaptureSpec, hf
from echosim.ir.ops import AttentionAttrs, OpKind

VIT_B16 = {"model_type": "vit", "architectures": ["ViTForImageClassification"], "hidden_size": 768,
           "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072, "image_size": 224,
           "patch_size": 16, "num_channels": 3, "num_labels": 1000}  # fmt: skip
BERT = {"model_type": "bert", "architectures": ["BertForMaskedLM"], "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 256, "vocab_size": 1000,
        "max_position_embeddings": 128}  # fmt: skip
T5 = {"model_type": "t5", "architectures": ["T5ForConditionalGeneration"], "d_model": 64, "d_ff": 256, "d_kv": 16,
      "num_heads": 4, "num_layers": 3, "num_decoder_layers": 3, "vocab_size": 1000,
      "decoder_start_token_id": 0}  # fmt: skip
SWIN = {"model_type": "swin", "architectures": ["SwinForImageClassification"], "embed_dim": 32, "depths": [2, 2],
        "num_heads": [2, 4], "window_size": 4, "image_size": 32, "patch_size": 2, "num_labels": 10}  # fmt: skip
MARIAN = {"model_type": "marian", "architectures": ["MarianMTModel"], "d_model": 64, "encoder_layers": 2,
          "decoder_layers": 2, "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 128,
          "decoder_ffn_dim": 128, "vocab_size": 1000, "max_position_embeddings": 64, "pad_token_id": 0,
          "decoder_start_token_id": 0}  # fmt: skip
WHISPER = {"model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"], "d_model": 64,
           "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
           "encoder_ffn_dim": 256, "decoder_ffn_dim": 256, "vocab_size": 1000, "pad_token_id": 0, "bos_token_id": 1,
           "eos_token_id": 2, "decoder_start_token_id": 1, "num_mel_bins": 80,
           "max_source_positions": 100, "max_target_positions": 48}  # fmt: skip


def write(tmp_path: Path, config: dict[str, Any], name: str = "config") -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(config))
    return path


def capture(tmp_path: Path, config: dict[str, Any], seq: int = 0) -> tuple[Any, list[str]]:
    path = write(tmp_path, config)
    model_config, _ = hf.read_model_config(path)
    cap, total = hf.capture_config(model_config, CaptureSpec(micro_batch=2, seq_len=seq), "m")
    assert cap.graph.param_count() <= total
    return cap.graph, cap.warnings + cap.notes


def attention(graph: Any) -> list[tuple[str, AttentionAttrs]]:
    return [(n.scope, n.attrs) for n in graph if n.op is OpKind.ATTENTION]


def compile_json(source: str, *flags: str) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["compile", source, "--backend", "a100-80gb", "--json", *flags])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_a_masked_lm_attends_both_ways(tmp_path: Path) -> None:
    graph, _ = capture(tmp_path, BERT, seq=32)
    layers = attention(graph)
    assert layers and all(not a.causal and a.q_len == a.kv_len == 32 for _, a in layers)
    assert graph[graph.inputs[0]].out.shape == (2, 32)  # token ids


def test_t5_adds_its_relative_position_bias_and_runs_both_stacks(tmp_path: Path) -> None:
    """T5 adds a per-head position bias to the scores (its decoder adds the causal mask into it): every key is
    scored, and the bias tables are part of the step (they were left out, their parameters "never used")."""
    path = write(tmp_path, T5)
    config, _ = hf.read_model_config(path)
    cap, total = hf.capture_config(config, CaptureSpec(micro_batch=2, seq_len=24), "m")
    graph = cap.graph
    kinds = {(scope.split(".")[0], scope.rsplit(".", 1)[-1], a.causal, a.kv_len) for scope, a in attention(graph)}
    assert kinds == {("encoder", "SelfAttention", False, 24), ("decoder", "SelfAttention", False, 24),
                     ("decoder", "EncDecAttention", False, 24)}  # fmt: skip
    biased = [n for n in graph if n.op is OpKind.ATTENTION and n.scope.endswith(".SelfAttention")]
    assert biased and all(graph[n.inputs[3]].out.shape[-3:] == (4, 24, 24) for n in biased)  # heads x q x k
    assert graph.param_count() == total and not [w for w in cap.warnings if "never used" in w]
    assert [graph[i].out.shape for i in graph.inputs[:2]] == [(2, 24), (2, 24)]  # encoder and decoder ids


def test_whisper_reads_log_mel_frames_of_its_config(tmp_path: Path) -> None:
    graph, notes = capture(tmp_path, WHISPER)
    assert graph[graph.inputs[0]].out.shape == (2, 80, 200)  # 2 frames per encoder position
    encoder = [a for scope, a in attention(graph) if scope.startswith("model.encoder")]
    cross = [a for scope, a in attention(graph) if scope.endswith("encoder_attn")]
    assert encoder and all(a.q_len == a.kv_len == 100 and not a.causal for a in encoder)
    assert cross and all(a.q_len == 48 and a.kv_len == 100 and not a.causal for a in cross)
    assert any("sequence length 48: the config's max_target_positions" in n for n in notes)


def test_hf_vit_b16_is_the_zoos_vit_b16(tmp_path: Path) -> None:
    """The same model by two routes: transformers' ViTForImageClassification and echosim's zoo entry."""
    path = write(tmp_path, VIT_B16, "vit")
    flags = ("--micro-batch", "32", "--devices", "8")
    hf_run, zoo = compile_json(f"hf:{path}", *flags), compile_json("vit-b16", *flags)
    assert hf_run["params"] == zoo["params"] == 86_567_656  # ViT-B/16 with a 1,000-class head
    assert hf_run["model_flops_per_step"] == pytest.approx(zoo["model_flops_per_step"], rel=0.005)
    assert hf_run["samples_per_s"] and hf_run.get("tokens_per_s") is None  # images, not tokens
    assert hf_run["step_time_s"] == pytest.approx(zoo["step_time_s"], rel=0.1)


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({**VIT_B16, "architectures": ["ViTModel"]}, "architectures (ViTModel) name no model echosim builds"),
        (
            {"model_type": "wav2vec2", "architectures": ["Wav2Vec2ForSequenceClassification"], "hidden_size": 64,
             "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 128},
            "reads 'input_values', which echosim cannot make from the config",
        ),
    ],
)  # fmt: skip
def test_a_head_echosim_cannot_feed_is_one_line(tmp_path: Path, config: dict[str, Any], words: str) -> None:
    result = CliRunner().invoke(cli, ["compile", f"hf:{write(tmp_path, config)}", "--backend", "a100-80gb"])
    assert result.exit_code != 0
    assert words in result.output and len(result.output.strip().splitlines()) == 1, result.output


def test_swin_adds_its_relative_position_bias_per_window(tmp_path: Path) -> None:
    """Swin hands transformers' attention its relative position bias (its shifted windows' mask added in) as a
    floating-point mask with a head axis: added to the scores, so the bias tables are part of the step."""
    graph, notes = capture(tmp_path, SWIN)
    windows = attention(graph)
    assert windows and all(a.q_len == a.kv_len == 16 and not a.causal for _, a in windows)  # 4 x 4 windows
    biased = [n for n in graph if n.op is OpKind.ATTENTION]
    assert all(len(n.inputs) == 4 and graph[n.inputs[3]].out.shape[-3:-2] in ((2,), (4,)) for n in biased)
    assert not [m for m in notes if "never used" in m]


def test_marians_translation_model_is_an_encoder_decoder(tmp_path: Path) -> None:
    """``MarianMTModel``, not ``...ForConditionalGeneration``: built as named (it was built decoder-only)."""
    graph, notes = capture(tmp_path, MARIAN, seq=16)
    scopes = {scope.split(".")[1] for scope, _ in attention(graph)}
    assert scopes == {"encoder", "decoder"} and len(graph.inputs) >= 2
    assert not [m for m in notes if "never used" in m]
