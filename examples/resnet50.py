"""ResNet-50 (He et al. 2015, arXiv:1512.03385, Table 1), for ``echosim compile examples/resnet50.py:model``.

Bottleneck blocks of 1x1, 3x3, 1x1 convolutions with batch norm, [3, 4, 6, 3]
blocks in the four stages, 64-2048 channels, 224x224 images, 1,000 classes:
25.6M parameters. echosim costs each convolution as the implicit GEMM cuDNN runs
and adds the classification loss (cross-entropy over the 1,000 logits).
"""

from __future__ import annotations

import torch
from torch import nn

IMAGE = 224
CLASSES = 1000


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1) -> None:
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.downsample: nn.Module | None = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        skip = x if self.downsample is None else self.downsample(x)
        return self.relu(out + skip)


class ResNet(nn.Module):
    def __init__(self, blocks: tuple[int, ...] = (3, 4, 6, 3), classes: int = CLASSES) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        )
        stages, cin = [], 64
        for i, count in enumerate(blocks):
            width = 64 * 2**i
            layers = []
            for j in range(count):
                layers.append(Bottleneck(cin, width, stride=2 if j == 0 and i > 0 else 1))
                cin = width * Bottleneck.expansion
            stages.append(nn.Sequential(*layers))
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.stages(self.stem(images))).flatten(1))


def model() -> tuple[nn.Module, list[tuple[tuple[object, ...], torch.dtype]]]:
    """ResNet-50 and its input: a batch of 3x224x224 images."""
    return ResNet(), [(("batch", 3, IMAGE, IMAGE), torch.float32)]
