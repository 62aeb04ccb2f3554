"""Zoo models that are not decoder LLMs: recommendation, vision, an encoder and a recurrent LM.

Each is a plain PyTorch module built on the ``meta`` device (no weights, no torchvision), with
the shapes of the configuration it is named after, and captured like a ``file.py:factory``
model (torch.export; echosim adds the loss to the logits they return):

* ``dlrm-dcnv2``: the MLPerf Training DLRM-DCNv2 benchmark (reference implementation
  ``facebookresearch/dlrm`` ``torchrec_dlrm``, flags of the MLPerf v3.0+ runs:
  ``--embedding_dim 128 --dense_arch_layer_sizes 512,256,128 --over_arch_layer_sizes
  1024,1024,512,256,1 --interaction_type=dcn --dcn_num_layers=3 --dcn_low_rank_dim=512``, the 26
  table sizes of ``--num_embeddings_per_feature`` and the pooling factors of ``--multi_hot_sizes``).
  ``dlrm-dcnv2-1hot`` is the same model on the original one-hot Criteo 1TB features, as the
  reference README's measured runs use it.
  Architecture: Wang et al. 2021, DCN V2 (arXiv:2008.13535), the low-rank cross layer
  ``x_{l+1} = x_0 * (U (V^T x_l) + b) + x_l``.
* ``resnet50``: He et al. 2015 (arXiv:1512.03385, Table 1), the torchvision v1.5 layout (stride
  in the 3x3 convolution), 224x224 images, 1,000 classes: 25,557,032 parameters.
* ``vit-b16``: Dosovitskiy et al. 2020 (arXiv:2010.11929, Table 1): 12 layers, hidden 768, MLP
  3072, 12 heads, 16x16 patches of 224x224 images, class token: 86,567,656 parameters.
  ``vit-b16-pretrain`` is its pre-training form (sec. 3.1, Table 3): a hidden tanh layer of 768 before
  the classifier and dropout 0.1, as NVIDIA JAX-Toolbox's Rosetta ViT pre-trains it (configs/base.gin,
  ``REP_SIZE=768``, ``hidden_dropout_prob`` 0.1, ``attention_probs_dropout_prob`` 0.0), with flax's
  ``MultiHeadDotProductAttention`` (layers.py): separate query, key, value and out projections.
  ``vit-g14-pretrain`` is Rosetta's ViT-G/14 the same way (configs/G.gin after Zhai et al. 2021, arXiv:2106.04560:
  48 layers, hidden 1664, MLP 8192, 16 heads, 14x14 patches; G_pretrain_imagenet.gin ``REP_SIZE=768``): 1.84B.
  ``vit-g14-nemo`` is ViT-g/14 as NeMo pre-trains it (NeMo-Framework-Launcher ``conf/training/vit/g_14.yaml``: 40
  layers, hidden 1408, FFN 6144, 16 heads, patch 14, ``hidden_dropout`` 0.1, ``attention_dropout`` 0; NeMo's
  ``vision/modules/vit/vit_backbone.py``: ``class_token_length`` 8 tokens before the patches, head ``VitMlpHead``
  dense 1408 + tanh + dense 1000, Megatron's bias-dropout-add on each sub-layer's output only): 1.01B.
* ``bert-large``: Devlin et al. 2018 (arXiv:1810.04805): 24 layers, hidden 1024, 16 heads,
  vocabulary 30,522, 512 positions; with the pre-training heads (masked LM tied to the word
  embeddings, next sentence): 336,226,108 parameters (335,141,888 without the heads, HF's
  ``bert-large-uncased`` BertModel). Sequence 512 (phase 2 of NVIDIA's recipe); the masked LM
  predicts the masked positions only, as NVIDIA DeepLearningExamples' BERT does.
* ``gnmt``: GNMT v2 as NVIDIA DeepLearningExamples trains it (PyTorch/Translation/GNMT, an LSTM
  encoder-decoder after Wu et al. 2016, arXiv:1609.08144): 4 encoder layers (the first bidirectional) and 4
  decoder layers of 1,024, normalized Bahdanau attention fed by the first decoder layer, shared embedding,
  vocabulary 32,320, dropout 0.2: 160,671,297 parameters.
* ``lstm-lm``: Zaremba et al. 2014 (arXiv:1409.2329), the large PTB model: two LSTM layers of
  1,500 units, vocabulary 10,000, 35 unrolled steps: 66,034,000 parameters.
* ``lstm-superbench``: Microsoft SuperBench's ``pytorch-lstm`` model benchmark
  (superbench/benchmarks/model_benchmarks/pytorch_lstm.py): random float features of 224 per step
  into one 8-layer ``nn.LSTM`` of 1,000 units (``batch_first``), a linear classifier of 100 classes on
  the last step's output, as superbench/config/azure_ndv4.yaml runs it (``--input_size 224 --hidden_size
  1000 --seq_len 32``, the default ``--num_layers 8``): 61,060,100 parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from echosim.frontend.spec import CaptureSpec
    from echosim.ir.graph import Graph

# MLPerf DLRM-DCNv2 (Criteo 1TB multi-hot): rows of the 26 tables and the ids each sample looks up in each.
DLRM_TABLE_ROWS = (
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10, 2209, 11938, 155, 4, 976,
    14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
)  # fmt: skip
DLRM_POOLING = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)
DLRM_DENSE_FEATURES = 13
DLRM_EMBEDDING_DIM = 128
DLRM_DENSE_ARCH = (512, 256, 128)
DLRM_OVER_ARCH = (1024, 1024, 512, 256, 1)
DLRM_DCN_LAYERS = 3
DLRM_DCN_RANK = 512


def _mlp(sizes: tuple[int, ...], cin: int, last_relu: bool = True) -> nn.Module:
    from torch import nn

    layers: list[nn.Module] = []
    for i, width in enumerate(sizes):
        layers.append(nn.Linear(cin, width))
        if last_relu or i < len(sizes) - 1:
            layers.append(nn.ReLU())
        cin = width
    return nn.Sequential(*layers)


def dlrm_module(
    rows: tuple[int, ...] = DLRM_TABLE_ROWS,
    pooling: tuple[int, ...] = DLRM_POOLING,
    dim: int = DLRM_EMBEDDING_DIM,
    dense_features: int = DLRM_DENSE_FEATURES,
    dense_arch: tuple[int, ...] = DLRM_DENSE_ARCH,
    over_arch: tuple[int, ...] = DLRM_OVER_ARCH,
    dcn_layers: int = DLRM_DCN_LAYERS,
    dcn_rank: int = DLRM_DCN_RANK,
) -> nn.Module:
    """DLRM with a low-rank DCN-v2 interaction; sparse ids arrive as one ``(batch, sum(pooling))`` tensor."""
    import torch
    from torch import nn

    class DCNv2(nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.v = nn.ModuleList(nn.Linear(width, dcn_rank, bias=False) for _ in range(dcn_layers))
            self.u = nn.ModuleList(nn.Linear(dcn_rank, width) for _ in range(dcn_layers))

        def forward(self, x0: torch.Tensor) -> torch.Tensor:
            x = x0
            for v, u in zip(self.v, self.u, strict=True):
                x = x0 * u(v(x)) + x
            return x

    class DLRM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pooling = tuple(pooling)
            self.dense_arch = _mlp(dense_arch, dense_features)
            self.tables = nn.ModuleList(nn.EmbeddingBag(r, dim, mode="sum") for r in rows)
            width = dense_arch[-1] + len(rows) * dim
            self.interaction = DCNv2(width)
            self.over_arch = _mlp(over_arch, width, last_relu=False)

        def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
            pooled = [self.dense_arch(dense)]
            for table, ids in zip(self.tables, torch.split(sparse, self.pooling, dim=1), strict=True):
                pooled.append(table(ids))
            return self.over_arch(self.interaction(torch.cat(pooled, dim=1)))

    return DLRM()


def dlrm_params(
    rows: tuple[int, ...] = DLRM_TABLE_ROWS,
    dim: int = DLRM_EMBEDDING_DIM,
    dense_features: int = DLRM_DENSE_FEATURES,
    dense_arch: tuple[int, ...] = DLRM_DENSE_ARCH,
    over_arch: tuple[int, ...] = DLRM_OVER_ARCH,
    dcn_layers: int = DLRM_DCN_LAYERS,
    dcn_rank: int = DLRM_DCN_RANK,
) -> tuple[int, int]:
    """(embedding, dense) parameters in closed form."""

    def mlp(sizes: tuple[int, ...], cin: int) -> int:
        total = 0
        for width in sizes:
            total += cin * width + width
            cin = width
        return total

    width = dense_arch[-1] + len(rows) * dim
    dense = mlp(dense_arch, dense_features) + dcn_layers * (2 * width * dcn_rank + width) + mlp(over_arch, width)
    return sum(rows) * dim, dense


def resnet50_module(classes: int = 1000) -> nn.Module:
    import torch
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, width: int, stride: int) -> None:
            super().__init__()
            cout = 4 * width
            self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
            self.down: nn.Module | None = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = torch.relu(self.bn1(self.conv1(x)))
            out = torch.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            return torch.relu(out + (x if self.down is None else self.down(x)))

    class ResNet50(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(
                nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
            )
            blocks: list[nn.Module] = []
            cin = 64
            for i, count in enumerate((3, 4, 6, 3)):
                for j in range(count):
                    blocks.append(Bottleneck(cin, 64 * 2**i, 2 if j == 0 and i > 0 else 1))
                    cin = 4 * 64 * 2**i
            self.blocks = nn.Sequential(*blocks)
            self.fc = nn.Linear(cin, classes)

        def forward(self, images: torch.Tensor) -> torch.Tensor:
            return self.fc(self.blocks(self.stem(images)).mean(dim=(2, 3)))

    return ResNet50()


def _encoder_layer(
    hidden: int, heads: int, ffn: int, pre_norm: bool, dropout: float = 0.0, attn_dropout: float | None = None,
    mlp_inner_dropout: bool = False, separate_qkv: bool = False,
) -> nn.Module:  # fmt: skip
    """One transformer encoder layer (bidirectional attention): pre-LN (ViT) or post-LN (BERT), with
    ``dropout`` on the attention and MLP outputs (``hidden_dropout_prob``) and ``attn_dropout`` (default:
    ``dropout``) on the attention probabilities (``attention_probs_dropout_prob``) when not 0;
    ``mlp_inner_dropout`` also drops the MLP's activation (Google's ViT ``MlpBlock``: dropout after the GELU
    and after the second dense layer). ``separate_qkv``: three projections (``q_proj``, ``k_proj``, ``v_proj``,
    out ``o_proj``) as flax's ``MultiHeadDotProductAttention`` builds its query, key, value and out
    ``DenseGeneral`` (flax/linen/attention.py), not one fused GEMM."""
    p_attn = dropout if attn_dropout is None else attn_dropout
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            if separate_qkv:
                self.q_proj, self.k_proj, self.v_proj = (nn.Linear(hidden, hidden) for _ in range(3))
                self.o_proj = nn.Linear(hidden, hidden)
            else:
                self.qkv = nn.Linear(hidden, 3 * hidden)
                self.proj = nn.Linear(hidden, hidden)
            self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.fc1, self.fc2 = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

        def attn(self, x: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            if separate_qkv:
                q, k, v = (
                    p(x).view(b, s, -1, hidden // heads).transpose(1, 2)
                    for p in (self.q_proj, self.k_proj, self.v_proj)
                )
            else:
                q, k, v = self.qkv(x).view(b, s, 3, heads, hidden // heads).permute(2, 0, 3, 1, 4)
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p_attn if self.training else 0.0)
            out = out.transpose(1, 2).reshape(b, s, -1)
            out = self.o_proj(out) if separate_qkv else self.proj(out)
            return F.dropout(out, dropout, self.training) if dropout else out

        def mlp(self, x: torch.Tensor) -> torch.Tensor:
            inner = F.gelu(self.fc1(x))
            if mlp_inner_dropout and dropout:
                inner = F.dropout(inner, dropout, self.training)
            out = self.fc2(inner)
            return F.dropout(out, dropout, self.training) if dropout else out

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if pre_norm:
                x = x + self.attn(self.norm1(x))
                return x + self.mlp(self.norm2(x))
            x = self.norm1(x + self.attn(x))
            return self.norm2(x + self.mlp(x))

    return Layer()


def vit_module(
    layers: int = 12, hidden: int = 768, heads: int = 12, ffn: int = 3072, patch: int = 16, image: int = 224,
    classes: int = 1000, dropout: float = 0.0, representation: int = 0, class_tokens: int = 1,
    mlp_inner_dropout: bool = True, separate_qkv: bool = False,
) -> nn.Module:  # fmt: skip
    """ViT; ``dropout`` and ``representation`` give the pre-training form of Dosovitskiy et al. (arXiv:2010.11929,
    sec. 3.1 and Table 3: a head with one hidden tanh layer, dropout 0.1 for ImageNet): dropout after the
    position embeddings, on each layer's attention output and after both MLP layers (Google's ``MlpBlock``;
    ``mlp_inner_dropout=False``: after the second only, as Megatron's bias-dropout-add), none on the attention
    probabilities (google-research/vision_transformer ``attention_dropout_rate`` 0.0). ``class_tokens``: the
    learned tokens before the patches (NeMo's Megatron ViT prepends 8, ``class_token_length``); the head reads
    the first. ``separate_qkv``: flax's query, key and value projections (see :func:`_encoder_layer`)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    tokens = (image // patch) ** 2 + class_tokens

    class ViT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.patch = nn.Conv2d(3, hidden, patch, patch)
            self.cls = nn.Parameter(torch.zeros(1, class_tokens, hidden))
            self.pos = nn.Parameter(torch.zeros(1, tokens, hidden))
            self.layers = nn.ModuleList(
                _encoder_layer(
                    hidden,
                    heads,
                    ffn,
                    True,
                    dropout,
                    0.0,
                    mlp_inner_dropout=mlp_inner_dropout,
                    separate_qkv=separate_qkv,
                )
                for _ in range(layers)
            )
            self.norm = nn.LayerNorm(hidden)
            self.pre_logits = nn.Linear(hidden, representation) if representation else None
            self.head = nn.Linear(representation or hidden, classes)

        def forward(self, images: torch.Tensor) -> torch.Tensor:
            x = self.patch(images).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
            if dropout:
                x = F.dropout(x, dropout, self.training)
            for layer in self.layers:
                x = layer(x)
            x = self.norm(x[:, 0])
            if self.pre_logits is not None:
                x = torch.tanh(self.pre_logits(x))
            return self.head(x)

    return ViT()


def bert_module(
    layers: int = 24, hidden: int = 1024, heads: int = 16, ffn: int = 4096, vocab: int = 30522, positions: int = 512,
    dropout: float = 0.1,
) -> nn.Module:  # fmt: skip
    """BERT with its pre-training heads; returns the masked-LM logits of every position.

    ``dropout`` is BERT's 0.1 (Devlin et al. 2018, A.2; DeepLearningExamples' bert_configs/large.json,
    ``hidden_dropout_prob`` and ``attention_probs_dropout_prob``): after the embeddings' LayerNorm, on
    each layer's attention probabilities (the attention node's ``dropout``) and attention and MLP outputs."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Bert(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.words = nn.Embedding(vocab, hidden)
            self.positions = nn.Embedding(positions, hidden)
            self.types = nn.Embedding(2, hidden)
            self.emb_norm = nn.LayerNorm(hidden)
            self.layers = nn.ModuleList(
                _encoder_layer(hidden, heads, ffn, pre_norm=False, dropout=dropout) for _ in range(layers)
            )
            self.pooler = nn.Linear(hidden, hidden)
            self.transform = nn.Linear(hidden, hidden)
            self.mlm_norm = nn.LayerNorm(hidden)
            self.mlm_bias = nn.Parameter(torch.zeros(vocab))
            self.nsp = nn.Linear(hidden, 2)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            s = ids.shape[1]
            pos = torch.arange(s, device=ids.device)
            x = self.emb_norm(self.words(ids) + self.positions(pos) + self.types(torch.zeros_like(ids)))
            x = F.dropout(x, dropout, self.training)
            for layer in self.layers:
                x = layer(x)
            # NVIDIA's recipe predicts only the masked positions (dense sequence output, its default), at most
            # max_predictions_per_seq of them: 20 at sequence 128, 80 at 512. The next-sentence head (pooler,
            # nsp) is a few thousand FLOPs per sample: held, not run.
            masked = x[:, : mlm_positions(s)]
            h = self.mlm_norm(F.gelu(self.transform(masked)))
            return F.linear(h, self.words.weight, self.mlm_bias)

    net = Bert()
    net.seq_len = positions  # type: ignore[assignment]
    return net


def mlm_positions(seq: int) -> int:
    """Masked positions BERT pre-training predicts per sequence: NVIDIA DeepLearningExamples'
    ``--max_predictions_per_seq`` (20 for sequence 128, 80 for 512: 15.6% of the tokens)."""
    return max(1, seq * 20 // 128)


def lstm_lm_module(
    layers: int = 2, hidden: int = 1500, vocab: int = 10000, steps: int = 35, cell: str = "lstm"
) -> nn.Module:
    """Zaremba's LM; ``cell`` "gru" or "rnn" swaps the LSTM for that recurrent layer (module named after it)."""
    import torch
    from torch import nn

    layer = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}[cell]

    class LSTMLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, hidden)
            setattr(self, cell, layer(hidden, hidden, num_layers=layers, batch_first=True))
            self.decoder = nn.Linear(hidden, vocab)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            out, _ = getattr(self, cell)(self.embed(ids))
            return self.decoder(out)

    net = LSTMLM()
    net.seq_len = steps  # type: ignore[assignment]
    return net


def lstm_lm_params(layers: int = 2, hidden: int = 1500, vocab: int = 10000) -> int:
    """Embedding, ``layers`` LSTMs (4 gates: input and recurrent weights, two biases each), decoder."""
    return vocab * hidden + layers * 4 * (2 * hidden * hidden + 2 * hidden) + hidden * vocab + vocab


# Microsoft SuperBench pytorch-lstm (superbench/benchmarks/model_benchmarks/pytorch_lstm.py, commit 700d6501):
# --num_layers 8 and --num_classes 100 by default; azure_ndv4.yaml sets --input_size 224, --hidden_size 1000,
# --seq_len 32 (https://github.com/microsoft/superbenchmark/blob/700d6501f110ed17a7016f1b9f2e453926f7b7a1/
# superbench/config/azure_ndv4.yaml)
SUPERBENCH_LSTM = {"input_size": 224, "hidden": 1000, "layers": 8, "classes": 100, "steps": 32}


def lstm_superbench_module(
    input_size: int = 224, hidden: int = 1000, layers: int = 8, classes: int = 100, steps: int = 32
) -> nn.Module:
    """SuperBench's LSTM benchmark model: one multi-layer ``nn.LSTM`` over float features, a linear
    classifier on the last time step (``LSTMBenchmarkModel.forward``)."""
    import torch
    from torch import nn

    class LSTMBenchmark(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = nn.LSTM(input_size, hidden, layers, batch_first=True)
            self.linear = nn.Linear(hidden, classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out, _ = self.lstm(x)
            return self.linear(out[:, -1, :])

    net = LSTMBenchmark()
    net.seq_len = steps  # type: ignore[assignment]
    return net


def lstm_superbench_params(input_size: int = 224, hidden: int = 1000, layers: int = 8, classes: int = 100) -> int:
    """The LSTMs (4 gates: input and recurrent weights, two biases each; the first reads ``input_size``)
    and the classifier."""
    first = 4 * hidden * (input_size + hidden) + 8 * hidden
    rest = (layers - 1) * (4 * hidden * 2 * hidden + 8 * hidden)
    return first + rest + hidden * classes + classes


# NVIDIA DeepLearningExamples PyTorch/Translation/GNMT (commit 729963d) train.py defaults: --hidden-size 1024,
# --num-layers 4, --dropout 0.2, --train-max-length 50; --synthetic-vocab 32320 (the BPE-32000 vocabulary padded)
GNMT_HIDDEN, GNMT_LAYERS, GNMT_VOCAB, GNMT_DROPOUT, GNMT_MAX_LENGTH = 1024, 4, 32320, 0.2, 50


def gnmt_module(
    hidden: int = GNMT_HIDDEN, layers: int = GNMT_LAYERS, vocab: int = GNMT_VOCAB, dropout: float = GNMT_DROPOUT,
    steps: int = GNMT_MAX_LENGTH, smoothing: float = 0.1,
) -> nn.Module:  # fmt: skip
    """GNMT v2 as DeepLearningExamples trains it (seq2seq/models/{encoder,decoder,attention,gnmt}.py), time-major
    (``batch_first=False``), one embedding shared by encoder and decoder. Encoder: a bidirectional LSTM, an
    LSTM of 2h -> h, then ``layers - 2`` LSTMs with residual connections, dropout on every LSTM's input.
    Decoder: an LSTM whose outputs query normalized Bahdanau attention over the encoder's outputs
    (``v . tanh(W_q q + W_k k + b)`` over every (query, key) pair, softmax, context = scores @ keys), then
    ``layers - 1`` LSTMs of (x, context) -> h, residual from the second on, and the classifier over the vocabulary;
    it returns the trainer's loss, label smoothing over fp32 log-probabilities (seq2seq/train/smoothing.py).
    The source and the decoder input both hold ``seq`` tokens (the encoder reads the source with
    ``pack_padded_sequence``; here every sentence has the full length, so no padding is skipped)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear_q = nn.Linear(hidden, hidden, bias=False)
            self.linear_k = nn.Linear(hidden, hidden, bias=False)
            self.linear_att = nn.Parameter(torch.zeros(hidden))
            self.normalize_scalar = nn.Parameter(torch.zeros(1))
            self.normalize_bias = nn.Parameter(torch.zeros(hidden))

        def forward(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
            q, k = self.linear_q(query.transpose(0, 1)), self.linear_k(keys.transpose(0, 1))  # (b, t, n)
            b, t_k, n = k.shape
            t_q = q.shape[1]
            sum_qk = q.unsqueeze(2).expand(b, t_q, t_k, n) + k.unsqueeze(1).expand(b, t_q, t_k, n)
            v = self.linear_att / self.linear_att.norm() * self.normalize_scalar
            scores = F.softmax(torch.tanh(sum_qk + self.normalize_bias).matmul(v), dim=-1)
            return torch.bmm(scores, keys.transpose(0, 1)).transpose(0, 1)  # (t_q, b, n)

    class GNMT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedder = nn.Embedding(vocab, hidden)
            self.enc = nn.ModuleList(
                [nn.LSTM(hidden, hidden, bidirectional=True), nn.LSTM(2 * hidden, hidden)]
                + [nn.LSTM(hidden, hidden) for _ in range(layers - 2)]
            )
            self.att_rnn = nn.LSTM(hidden, hidden)
            self.attn = Attention()
            self.dec = nn.ModuleList(nn.LSTM(2 * hidden, hidden) for _ in range(layers - 1))
            self.classifier = nn.Linear(hidden, vocab)

        def forward(self, src: torch.Tensor, tgt: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            drop = partial(F.dropout, p=dropout, training=self.training)
            x = self.enc[1](drop(self.enc[0](drop(self.embedder(src)))[0]))[0]
            for lstm in self.enc[2:]:
                x = x + lstm(drop(x))[0]
            context = x
            y = self.att_rnn(drop(self.embedder(tgt)))[0]
            attn = self.attn(y, context)
            y = self.dec[0](drop(torch.cat((y, attn), dim=2)))[0]
            for lstm in self.dec[1:]:
                y = y + lstm(drop(torch.cat((y, attn), dim=2)))[0]
            # seq2seq/train/smoothing.py LabelSmoothing (smoothing 0.1): log-probabilities in fp32, the label's
            # and the mean over the vocabulary (no padding to mask: every pair has the full length)
            logprobs = F.log_softmax(self.classifier(y), dim=-1, dtype=torch.float32)
            nll = -logprobs.gather(dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)
            return ((1.0 - smoothing) * nll - smoothing * logprobs.mean(dim=-1)).sum()

    net = GNMT()
    net.seq_len = steps  # type: ignore[assignment]
    return net


def gnmt_params(hidden: int = GNMT_HIDDEN, layers: int = GNMT_LAYERS, vocab: int = GNMT_VOCAB) -> int:
    """The shared embedding, the LSTMs (4 gates; input and recurrent weights, two biases), attention, classifier."""

    def lstm(cin: int) -> int:
        return 4 * hidden * (cin + hidden) + 8 * hidden

    encoder = 2 * lstm(hidden) + lstm(2 * hidden) + (layers - 2) * lstm(hidden)
    decoder = lstm(hidden) + (layers - 1) * lstm(2 * hidden)
    attention = 2 * hidden * hidden + 2 * hidden + 1
    return vocab * hidden + encoder + decoder + attention + hidden * vocab + vocab


@dataclass(frozen=True)
class TorchZooModel:
    """A zoo entry built as a torch module: what ``echosim compile NAME`` captures."""

    name: str
    build: Callable[[], Any]
    inputs: tuple[tuple[tuple[object, ...], str], ...]  # (shape with "batch"/"seq", torch dtype name)
    description: str
    samples: str  # what one sample is, for the report: images, queries, sequences

    def module(self) -> nn.Module:
        import torch

        with torch.device("meta"):
            return self.build()

    def capture(self, spec: CaptureSpec) -> tuple[Graph, list[str], int]:
        """Capture once per (model, micro-batch, sequence, dtype); later runs read the capture cache."""
        import torch

        from echosim.frontend import cache
        from echosim.frontend.pyfile import capture_torch_module

        key = cache.key_of({"zoo-torch": self.name, "inputs": repr(self.inputs)}, spec, ("torch",))
        cached = cache.lookup(key)
        if cached is not None:
            return cached
        inputs = [(shape, getattr(torch, dtype)) for shape, dtype in self.inputs]
        graph, messages, params = capture_torch_module(self.module(), inputs, spec, self.name)
        cache.store(key, graph, messages, params)
        return graph, messages, params


_IMAGE = (("batch", 3, 224, 224), "float32")
_MEGATRON = {"mlp_inner_dropout": False}  # Megatron's MLP: dropout in bias-dropout-add after fc2 only
_FLAX = {"separate_qkv": True}  # flax's MultiHeadDotProductAttention: query, key, value and out DenseGeneral
_TOKENS = (("batch", "seq"), "int64")

TORCH_ZOO: dict[str, TorchZooModel] = {
    m.name: m
    for m in (
        TorchZooModel(
            "dlrm-dcnv2",
            dlrm_module,
            ((("batch", DLRM_DENSE_FEATURES), "float32"), (("batch", sum(DLRM_POOLING)), "int64")),
            f"MLPerf DLRM-DCNv2: 26 tables ({sum(DLRM_TABLE_ROWS) / 1e6:.1f}M rows x 128), DCN-v2 x3, "
            f"{sum(dlrm_params()) / 1e9:.1f}B params",
            "queries",
        ),
        TorchZooModel(
            "dlrm-dcnv2-1hot",
            partial(dlrm_module, pooling=(1,) * len(DLRM_TABLE_ROWS)),
            ((("batch", DLRM_DENSE_FEATURES), "float32"), (("batch", len(DLRM_TABLE_ROWS)), "int64")),
            "DLRM-DCNv2 on the original one-hot Criteo 1TB features (one id per table and sample)",
            "queries",
        ),
        TorchZooModel("resnet50", resnet50_module, (_IMAGE,), "ResNet-50 v1.5, 224x224, 25.6M params", "images"),
        TorchZooModel("vit-b16", vit_module, (_IMAGE,), "ViT-B/16, 224x224, 86.6M params", "images"),
        TorchZooModel(
            "vit-b16-pretrain",
            partial(vit_module, dropout=0.1, representation=768, **_FLAX),
            (_IMAGE,),
            "ViT-B/16 as pre-trained: tanh pre-logits layer of 768, dropout 0.1, 87.2M params",
            "images",
        ),
        TorchZooModel(
            "vit-g14-pretrain",
            partial(vit_module, 48, 1664, 16, 8192, 14, dropout=0.1, representation=768, **_FLAX),
            (_IMAGE,),
            "ViT-G/14 as Rosetta pre-trains it: 48 layers of 1664, MLP 8192, tanh pre-logits of 768, 1.84B params",
            "images",
        ),
        TorchZooModel(
            "vit-g14-nemo",
            partial(vit_module, 40, 1408, 16, 6144, 14, dropout=0.1, representation=1408, class_tokens=8, **_MEGATRON),
            (_IMAGE,),
            "ViT-g/14 as NeMo pre-trains it: 40 layers of 1408, MLP 6144, 8 class tokens, tanh MLP head, 1.01B params",
            "images",
        ),
        TorchZooModel(
            "bert-large", bert_module, (_TOKENS,), "BERT-large pre-training, seq 512, 336M params", "sequences"
        ),
        TorchZooModel(
            "gnmt",
            gnmt_module,
            ((("seq", "batch"), "int64"), (("seq", "batch"), "int64"), (("seq", "batch"), "int64")),
            f"GNMT v2 (DeepLearningExamples): 4+4 LSTM layers of 1024, Bahdanau attention, {gnmt_params() / 1e6:.0f}M "
            "params; a sample is one sentence pair of --seq-len source and --seq-len target tokens",
            "sentence pairs",
        ),
        TorchZooModel(
            "lstm-lm", lstm_lm_module, (_TOKENS,), "2-layer LSTM LM (Zaremba 2014), 35 steps, 66M params", "sequences"
        ),
        TorchZooModel(
            "lstm-superbench",
            lstm_superbench_module,
            ((("batch", "seq", SUPERBENCH_LSTM["input_size"]), "float32"),),
            "SuperBench pytorch-lstm: 8 LSTM layers of 1000 over 224 features, 32 steps, 100 classes, "
            f"{lstm_superbench_params() / 1e6:.1f}M params",
            "sequences",
        ),
    )
}


def sample_unit(model: str) -> str:
    """What one sample of a zoo model is (images, queries, sequences); ``samples`` for any other model."""
    entry = TORCH_ZOO.get(model)
    return entry.samples if entry is not None else "samples"


def conv_flops(cin: int, cout: int, kernel: int, out_hw: int) -> int:
    """Forward FLOPs of one convolution per image (2 per multiply-accumulate)."""
    return 2 * cin * cout * kernel * kernel * out_hw * out_hw


def resnet50_forward_flops(classes: int = 1000) -> int:
    """Closed-form forward FLOPs of one 224x224 image through ResNet-50's convolutions and classifier."""
    total = conv_flops(3, 64, 7, 112)
    cin, hw = 64, 56
    for i, count in enumerate((3, 4, 6, 3)):
        width = 64 * 2**i
        for j in range(count):
            stride = 2 if j == 0 and i > 0 else 1
            out = hw // stride
            total += conv_flops(cin, width, 1, hw) + conv_flops(width, width, 3, out)
            total += conv_flops(width, 4 * width, 1, out)
            if j == 0:
                total += conv_flops(cin, 4 * width, 1, out)
            cin, hw = 4 * width, out
    return total + 2 * cin * classes


def encoder_forward_flops(layers: int, hidden: int, ffn: int, tokens: int) -> int:
    """Matmul and attention FLOPs of ``layers`` encoder layers over ``tokens`` tokens (full attention)."""
    per_layer = 2 * tokens * (3 * hidden * hidden + hidden * hidden + 2 * hidden * ffn) + 4 * tokens * tokens * hidden
    return layers * per_layer


__all__ = ["TORCH_ZOO", "TorchZooModel", "sample_unit"]
