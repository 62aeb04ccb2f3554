"""A word-level LSTM language model, for ``echosim compile examples/lstm_lm.py:model --dtype fp16``.

The "large" model of Zaremba et al. 2014 (arXiv:1409.2329): two LSTM layers of
1,500 units over a 10,000-word vocabulary (the Penn Treebank), here with the
output layer tied to the embedding as Press & Wolf 2017 (arXiv:1608.05859)
suggest. Training unrolls 35 steps; echosim unrolls the recurrence too, because
its steps run one after another.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 10_000
HIDDEN = 1500


class LSTMLanguageModel(nn.Module):
    seq_len = 35  # the unroll length of the paper; --seq-len overrides it

    def __init__(self, vocab: int = VOCAB, hidden: int = HIDDEN, layers: int = 2, dropout: float = 0.65) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.drop = nn.Dropout(dropout)
        self.lstm = nn.LSTM(hidden, hidden, num_layers=layers, batch_first=True, dropout=dropout)
        self.head = nn.Linear(hidden, vocab)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.drop(self.embed(tokens)))
        logits = self.head(self.drop(out))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def model() -> nn.Module:
    """Called with (tokens, targets), each a (micro_batch, seq_len) tensor of word ids."""
    return LSTMLanguageModel()
