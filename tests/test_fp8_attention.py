"""FP8 attention: the BF16 kernel's time over cuDNN's measured FP8 / BF16 speed-up (echosim.backends.fp8_attention)."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace
from importlib import resources

import pytest
from click.testing import CliRunner

from echosim.backends import compute, fp8_attention
from echosim.backends.devices import DEVICES
from echosim.cli import cli
from echosim.ir.ops import AttentionAttrs
from echosim.plan import Cluster, Plan, PlanError


def _measured(device: str, config: str, causal: str, q_len: int, phase: str) -> float:
    text = resources.files("echosim").joinpath("data", fp8_attention.DATA_FILE).read_text()
    for row in csv.DictReader(text.splitlines()):
        if (row["device"], row["config"], row["causal"], int(row["q_len"]), row["pass"]) == (
            device,
            config,
            causal,
            q_len,
            phase,
        ):
            return float(row["bf16_time_ms"]) / float(row["fp8_time_ms"])
    raise KeyError((device, config, causal, q_len, phase))


def test_speedup_is_the_published_ratio_interpolated_in_log_length() -> None:
    llama = AttentionAttrs(2, 64, 8, 4096, 4096, 128)
    at_4k = _measured("gb300", "llama3.1", "yes", 4096, "bwd")
    assert fp8_attention.speedup("gb300", llama, True) == pytest.approx(at_4k)
    # B300 is GB300's GPU, B200 GB200's
    assert fp8_attention.speedup("b300", llama, True) == fp8_attention.speedup("gb300", llama, True)
    assert fp8_attention.speedup("b200", llama, False) == pytest.approx(
        _measured("gb200", "llama3.1", "yes", 4096, "fwd")
    )
    # halfway between 4k and 8k in log2 of the length: the mean of the two ratios
    mid = replace(llama, q_len=round(4096 * math.sqrt(2)), kv_len=round(4096 * math.sqrt(2)))
    at_8k = _measured("gb300", "llama3.1", "yes", 8192, "bwd")
    assert fp8_attention.speedup("gb300", mid, True) == pytest.approx((at_4k + at_8k) / 2, rel=1e-3)
    # held at the ends of the measured lengths
    short = replace(llama, q_len=512, kv_len=512)
    assert fp8_attention.speedup("gb300", short, True) == pytest.approx(
        _measured("gb300", "llama3.1", "yes", 2048, "bwd")
    )
    # DeepSeek-V3's MLA (192 / 128) is the 160 AttentionAttrs keeps; non-causal takes the no_mask rows
    mla = AttentionAttrs(2, 128, 128, 16384, 16384, 160, causal=False)
    assert fp8_attention.speedup("gb200", mla, False) == pytest.approx(_measured("gb200", "dsv3", "no", 16384, "fwd"))
    # gpt-oss's windowed shape has its own (slow) backward; its full-attention layers were not measured
    window = AttentionAttrs(2, 64, 8, 4096, 4096, 64, window=128)
    assert fp8_attention.speedup("gb300", window, True) == pytest.approx(
        _measured("gb300", "gpt_oss", "yes", 4096, "bwd")
    )
    assert fp8_attention.speedup("gb300", replace(window, window=0), True) is None
    assert fp8_attention.speedup("h100-sxm", llama, False) is None


def test_an_fp8_kernel_costs_its_bf16_time_over_the_speedup() -> None:
    dev = DEVICES["gb300"]
    bf16 = AttentionAttrs(4, 32, 4, 4096, 4096, 128, kernel="te")
    fp8 = replace(bf16, fp8=True)
    for backward in (False, True):
        ratio = fp8_attention.speedup("gb300", bf16, backward)
        assert ratio is not None
        want = compute.attention_time_s(dev, bf16, "bf16", backward) / ratio
        assert compute.attention_time_s(dev, fp8, "bf16", backward) == pytest.approx(want)
    unmeasured = AttentionAttrs(4, 32, 4, 4096, 4096, 256, kernel="te")  # no head_dim 256 in the benchmark
    assert compute.attention_time_s(dev, replace(unmeasured, fp8=True), "bf16", True) == compute.attention_time_s(
        dev, unmeasured, "bf16", True
    )


@pytest.mark.parametrize(
    ("plan", "backend", "message"),
    [
        (Plan(dp=8, dtype="fp8", fp8_attention=True), "h100-sxm", "no published FP8 attention measurement"),
        (Plan(dp=8, fp8_attention=True), "gb300", "needs an FP8 recipe"),
        (Plan(dp=8, dtype="mxfp8", attention="math", fp8_attention=True), "gb300", "needs the fused attention"),
    ],
)
def test_fp8_attention_is_refused_where_it_cannot_be_priced(plan: Plan, backend: str, message: str) -> None:
    from echosim.compiler import compile

    with pytest.raises(PlanError, match=message):
        compile("llama3-8b", replace(plan, seq_len=1024, global_batch=8), Cluster(backend, 8, 8))


def test_the_compile_shortens_attention_and_names_the_unmeasured_shapes() -> None:
    from echosim.compiler import compile

    plan = Plan(dp=8, dtype="mxfp8", seq_len=4096, global_batch=8, framework="megatron-bridge")
    base = compile("llama3-8b", plan, Cluster("gb300", 8, 8))
    fast = compile("llama3-8b", replace(plan, fp8_attention=True), Cluster("gb300", 8, 8))
    assert fast.breakdown["compute.attention"] < base.breakdown["compute.attention"]
    assert fast.breakdown["compute.matmul"] == pytest.approx(base.breakdown["compute.matmul"])
    assert not any("FP8 attention" in n for n in fast.notes)
    assert fast.plan["fp8_attention"] is True and "fp8_attention" not in base.plan
    # gpt-oss: the windowed layers are measured, its 64-dim full-attention layers are not
    oss = compile(
        "gpt-oss-120b", Plan(dp=8, ep=8, dtype="mxfp8", fp8_attention=True, global_batch=8), Cluster("gb300", 8, 8)
    )
    assert [n for n in oss.notes if n.startswith("FP8 attention")] == [
        "FP8 attention: no measured FP8 / BF16 speed-up on gb300 for head_dim 64 (causal): those kernels are priced "
        "at their BF16 time"
    ]


def test_the_cli_flag_and_its_refusal() -> None:
    args = ["compile", "llama3-8b", "--backend", "gb200", "--dp", "8", "--seq-len", "1024", "--global-batch", "8"]
    ok = CliRunner().invoke(cli, [*args, "--dtype", "mxfp8", "--fp8-attention", "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["plan"]["fp8_attention"] is True
    refused = CliRunner().invoke(cli, [*args, "--fp8-attention"])
    assert refused.exit_code != 0
    assert refused.output.strip().splitlines()[-1].startswith("Error: --fp8-attention needs an FP8 recipe")
    assert "Traceback" not in refused.output


def test_search_takes_the_moe_and_attention_settings_for_every_layout() -> None:
    """``search`` fixes the dispatcher, combined 1F1B, the fused MLP and FP8 attention across the layouts it ranks,
    and refuses them as ``compile`` does, in one line, before enumerating anything."""
    space = "tp=1 pp=1 ep=8 mb=4 recompute=none"
    args = ["search", "qwen3-30b-a3b", "--backend", "gb200", "--devices", "8", "--global-batch", "64", "--dtype",
            "mxfp8", "--framework", "megatron-bridge", "--space", space, "--json"]  # fmt: skip
    plain = CliRunner().invoke(cli, args)
    tuned = CliRunner().invoke(
        cli, [*args, "--moe-dispatcher", "hybridep", "--moe-ep-overlap", "--moe-fused-mlp", "--fp8-attention"]
    )
    assert plain.exit_code == 0 and tuned.exit_code == 0, tuned.output
    best = json.loads(tuned.output)["best"][0]
    assert best["step_time_s"] < json.loads(plain.output)["best"][0]["step_time_s"]
    refused = CliRunner().invoke(cli, [*args[:-1], "--backend", "h200", "--fp8-attention"])
    assert refused.exit_code != 0 and "Traceback" not in refused.output
    assert refused.output.strip().splitlines()[-1].startswith("Error: --fp8-attention: no published FP8 attention")
