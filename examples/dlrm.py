"""A DLRM-style recommendation model (Naumov et al. 2019, arXiv:1906.00091), for
``echosim compile examples/dlrm.py:model --micro-batch 2048``.

Dense features go through a bottom MLP, each categorical feature looks up one
row of its own embedding table, the pairwise dot products of all those vectors
("interaction") and the dense vector feed a top MLP that predicts a click. The
sizes follow the paper's Criteo Terabyte setup (13 dense and 26 categorical
features, 128-wide vectors, bottom MLP 512-256-128, top MLP 1024-1024-512-256-1),
with every table capped at 4M rows to keep the example small: 13.3B parameters,
nearly all of them embedding rows, which is what makes such models different.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import nn

DENSE = 13
TABLES = 26
DIM = 128
ROWS = 4_000_000


def mlp(sizes: list[int], last_act: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(a, b))
        if last_act or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self, rows: int = ROWS, tables: int = TABLES, dim: int = DIM) -> None:
        super().__init__()
        self.bottom = mlp([DENSE, 512, 256, dim])
        self.tables = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))
        n = tables + 1
        below_diagonal = [r * n + c for r in range(n) for c in range(r)]  # each pair of vectors once
        self.register_buffer("pairs", torch.tensor(below_diagonal), persistent=False)
        self.top = mlp([dim + len(below_diagonal), 1024, 1024, 512, 256, 1], last_act=False)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor, clicks: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        vectors = [x] + [t(sparse[:, i : i + 1]) for i, t in enumerate(self.tables)]
        z = torch.stack(vectors, dim=1)  # (batch, 27, dim)
        dots = torch.bmm(z, z.transpose(1, 2)).flatten(1)
        features = torch.cat([x, dots[:, self.pairs]], dim=1)
        return F.binary_cross_entropy_with_logits(self.top(features).squeeze(1), clicks)


def model() -> tuple[nn.Module, list[tuple[tuple[object, ...], torch.dtype]]]:
    """DLRM and its inputs: dense features, one id per table, and the click labels."""
    inputs = [(("batch", DENSE), torch.float32), (("batch", TABLES), torch.long), (("batch",), torch.float32)]
    return DLRM(), inputs
