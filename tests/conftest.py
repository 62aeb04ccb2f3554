"""Shared fixtures: tiny models captured once per session, golden-file comparison."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from echosim.frontend.zoo import ArchConfig
from echosim.ir.graph import Graph
from echosim.ir.types import DType
from echosim.plan import Plan
from echosim.validation.cases import Case

# Debug mode: verify the IR after every pass, built-in ones included (production checks only plugins' passes).
os.environ.setdefault("ECHOSIM_VERIFY", "1")
# The capture cache of this test process (and of the commands it runs) lives in a fresh folder,
# never in the user's cache directory.
os.environ.setdefault("ECHOSIM_CACHE_DIR", tempfile.mkdtemp(prefix="echosim-test-cache-"))

GOLDEN = Path(__file__).parent / "golden"
SHARED = Path(__file__).resolve().parents[2] / "shared"

TINY_GPT = ArchConfig("gpt", layers=2, hidden=64, heads=4, vocab=128, seq_len=16, dropout=0.1, tied_embeddings=True)
# One layout per schedule and parallelism the costed graph must handle: (model, plan, devices on h100-sxm).
COSTED_LAYOUTS = {
    "1f1b": ("gpt3-1.3b", Plan(tp=2, pp=4, dp=2, global_batch=16, seq_len=1024), 16),
    "gpipe": ("gpt3-1.3b", Plan(pp=4, dp=2, global_batch=16, seq_len=1024, schedule="gpipe"), 8),
    "interleaved": ("gpt3-1.3b", Plan(pp=4, dp=2, vpp=3, global_batch=16, seq_len=1024), 8),
    "zb-h1": ("gpt3-1.3b", Plan(pp=4, dp=2, global_batch=16, seq_len=1024, schedule="zb-h1"), 8),
    "tp-overlap+sp": ("llama3-8b", Plan(tp=4, pp=2, dp=1, sp=True, tp_overlap=True, global_batch=8), 8),
    "cp+zero3": ("llama3-8b", Plan(tp=2, cp=2, dp=2, zero=3, global_batch=8, seq_len=16384), 8),
    "ep": ("mixtral-8x7b", Plan(tp=2, ep=4, dp=4, global_batch=16, seq_len=2048), 8),
    # a stage on two ranks, each running half of its micro-batches (the EP pairs' overlap is left out here: its
    # shortened backwards do not lay out op by op in the trace and critical path, as with --moe-ep-overlap)
    "dualpipe": ("gpt3-1.3b", Plan(pp=4, dp=2, global_batch=16, seq_len=1024, schedule="dualpipe"), 8),
}
TINY_LLAMA = ArchConfig("llama", layers=2, hidden=64, heads=4, kv_heads=2, vocab=128, ffn=96, seq_len=16)
#: Two MoE layers of 4 experts, top-2, with a shared expert: the expert-parallel and fused-MLP passes' IR tests.
TINY_MOE = ArchConfig(
    "moe", layers=2, hidden=64, heads=4, kv_heads=2, vocab=128, seq_len=16, experts=4, top_k=2, moe_ffn=32,
    shared_experts=1,
)  # fmt: skip


#: A tiny RWKV: no tensor-parallel rule matches its receptance projections, so at tp=2 compile warns that they run
#: whole.
TINY_RWKV = f"hf:{Path(__file__).parent / 'configs' / 'tiny-rwkv.json'}"


def check_whole_warning_carried(run: Callable[..., tuple[int, str]], args: tuple[str, ...], prefix: str) -> None:
    """``run(*args)`` (a command on :data:`TINY_RWKV` at tp=2) prints compile's warning after ``prefix``, and its
    ``--json`` lists it under ``warnings``."""
    code, out = run(*args)
    assert code == 0, out
    assert f"{prefix}6 linear layers (rwkv.blocks.0.attention.receptance" in out
    code, out = run(*args, "--json")
    assert code == 0, out
    assert any("run whole on all 2 tensor-parallel ranks" in w for w in json.loads(out)["warnings"])


def capture(cfg: ArchConfig, batch: int = 1, dtype: DType = DType.FP16) -> Graph:
    import torch

    from echosim.frontend.fx import capture_module
    from echosim.frontend.zoo_modules import build_module

    ids = torch.zeros(batch, cfg.seq_len, dtype=torch.long, device="meta")
    return capture_module(build_module(cfg), (ids, ids), dtype=dtype, name=cfg.arch).graph


def masked_attention_flops(graph: Graph) -> int:
    """FLOPs of the scores causal masks drop: what counting the full score matrix (PyTorch's
    FlopCounterMode on the math path, the Megatron papers' closed forms) adds to our model FLOPs."""
    from echosim.ir.ops import AttentionAttrs, Phase

    total = 0
    for n in graph:
        if isinstance(n.attrs, AttentionAttrs) and n.phase in (Phase.FORWARD, Phase.BACKWARD):
            total += (
                (n.attrs.flops - n.attrs.model_flops) * (2 if n.phase is Phase.BACKWARD else 1) * graph.multiplicity(n)
            )
    return total


@pytest.fixture(scope="session")
def tiny_gpt() -> Graph:
    return capture(TINY_GPT)


@pytest.fixture(scope="session")
def tiny_llama() -> Graph:
    return capture(TINY_LLAMA)


def check_golden(name: str, text: str) -> None:
    """Compare with tests/golden/NAME; ECHOSIM_UPDATE_GOLDEN=1 rewrites it."""
    path = GOLDEN / name
    if os.environ.get("ECHOSIM_UPDATE_GOLDEN") or not path.exists():
        path.write_text(text)
        if not os.environ.get("ECHOSIM_UPDATE_GOLDEN"):
            pytest.fail(f"golden file {name} was missing and has been written; rerun")
    assert text == path.read_text(), f"IR differs from tests/golden/{name} (ECHOSIM_UPDATE_GOLDEN=1 to accept)"


def cpu_llama_stage_graph(micro_batch: int, *, hidden: int, ffn: int, vocab: int, seq_len: int) -> Graph:
    """A 2-layer Llama lowered for one 2-core x86 CPU in fp32, the graph the CPU backend's rule tests cost."""
    from echosim.compiler import lower
    from echosim.plan import Cluster

    cfg = ArchConfig("llama", layers=2, hidden=hidden, heads=4, kv_heads=2, ffn=ffn, vocab=vocab, seq_len=seq_len)
    plan = Plan(micro_batch=micro_batch, global_batch=micro_batch, dtype="fp32", attention="flash")
    return lower(cfg, plan, Cluster("cpu-x86", 1, 2)).stages[0].graph


def case_with(c: Case, **cells: str) -> Case:
    """A validation row with some cells replaced (numbers re-read for the numeric ones)."""
    from dataclasses import replace

    numbers = dict(c.numbers)
    for k, v in cells.items():
        if k in numbers:
            numbers[k] = float(v) if v else None
    return replace(c, cells={**c.cells, **cells}, numbers=numbers)
