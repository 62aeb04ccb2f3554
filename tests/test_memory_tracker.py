"""Memory against PyTorch's own MemTracker (FakeTensorMode on CPU), single device, AdamW, fp32."""

from __future__ import annotations

import pytest
from script_loader import load_script

from echosim.compiler import lower
from echosim.frontend.zoo import ArchConfig
from echosim.plan import Cluster, Plan

pytestmark = pytest.mark.slow

MODELS = {
    "llama": ArchConfig("llama", layers=4, hidden=1024, heads=16, kv_heads=4, vocab=8192, ffn=2816, seq_len=1024),
    "gpt": ArchConfig(
        "gpt", layers=4, hidden=768, heads=12, vocab=8192, seq_len=1024, dropout=0.1, tied_embeddings=True
    ),
}


def tracked(cfg: ArchConfig, batch: int) -> dict[str, float]:
    """Peak snapshot of one training step after a warm-up step has created Adam's states."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from echosim.frontend import zoo_modules

    step = _memory_cpu().peak_of_one_step
    with FakeTensorMode():
        model = (zoo_modules.GPT if cfg.arch == "gpt" else zoo_modules.Llama)(cfg)
        return step(model, cfg, batch)  # type: ignore[no-any-return]


def _both(arch: str) -> tuple[dict[str, float], dict]:
    cfg = MODELS[arch]
    theirs = tracked(cfg, batch=2)
    # PyTorch's CPU attention kernel has no dropout, so SDPA with dropout (GPT) materialises the scores
    attention = "math" if cfg.dropout else "flash"
    plan = Plan(micro_batch=2, dtype="fp32", attention=attention)
    return theirs, lower(cfg, plan, Cluster("cpu-x86", 1)).report.memory[0]


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_state_matches_memtracker_exactly(arch: str) -> None:
    theirs, ours = _both(arch)
    assert ours["params"] == pytest.approx(theirs["PARAM"], rel=0.02)
    assert ours["grads"] == pytest.approx(theirs["GRAD"], rel=0.02)
    assert ours["optimizer"] == pytest.approx(theirs["OPT"], rel=0.02)


@pytest.mark.parametrize(
    "arch",
    [
        "gpt",
        "llama",
    ],
)
def test_peak_matches_memtracker(arch: str) -> None:
    theirs, ours = _both(arch)
    assert ours["peak"] == pytest.approx(theirs["Total"], rel=0.10)


def _memory_cpu():
    return load_script("benchmarks/memory_cpu.py")


@pytest.mark.parametrize("arch", ["gpt", "llama", "moe"])
def test_real_cpu_training_peak_matches(arch: str) -> None:
    """Real tensors on this CPU (benchmarks/memory_cpu.py): state exact, peak within 10 %."""
    r = _memory_cpu().compare(arch, batch=1)
    for part in ("params", "grads", "optimizer"):
        assert r["predicted"][part] == pytest.approx(r["measured"][part], rel=0.02), part
    assert r["predicted"]["peak"] == pytest.approx(r["measured"]["peak"], rel=0.10)
