"""Shared fixtures: tiny models captured once per session, golden-file comparison."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from echosim.frontend.zoo import ArchConfig
from echosim.ir.graph import Graph
from echosim.ir.types import DType

# Debug mode: verify the IR after every pass, built-in ones included (production checks only plugins' passes).
os.environ.setdefault("ECHOSIM_VERIFY", "1")

GOLDEN = Path(__file__).parent / "golden"
SHARED = Path(__file__).resolve().parents[2] / "shared"

TINY_GPT = ArchConfig("gpt", layers=2, hidden=64, heads=4, vocab=128, seq_len=16, dropout=0.1, tied_embeddings=True)
TINY_LLAMA = ArchConfig("llama", layers=2, hidden=64, heads=4, kv_heads=2, vocab=128, ffn=96, seq_len=16)


def capture(cfg: ArchConfig, batch: int = 1, dtype: DType = DType.FP16) -> Graph:
    import torch

    from echosim.frontend.fx import capture_module
    from echosim.frontend.zoo_modules import build_module

    ids = torch.zeros(batch, cfg.seq_len, dtype=torch.long, device="meta")
    return capture_module(build_module(cfg), (ids, ids), dtype=dtype, name=cfg.arch).graph


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
