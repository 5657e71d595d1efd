"""A small ReLU/BatchNorm CNN: conv3x3(3->16)-BN-ReLU, conv3x3(16->32, stride 2)-BN-ReLU,
conv3x3(32->32)-BN-ReLU, global average pool, linear(32->10), on 8x3x32x32 inputs.
PyTorch's default init throughout (convs without bias: BatchNorm follows each).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def _conv_bn_relu(cin: int, cout: int, stride: int = 1) -> list[nn.Module]:
    return [
        nn.Conv2d(cin, cout, kernel_size=3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    ]


def build_model() -> nn.Module:
    return nn.Sequential(
        *_conv_bn_relu(3, 16),
        *_conv_bn_relu(16, 32, stride=2),
        *_conv_bn_relu(32, 32),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(1),
        nn.Linear(32, 10),
    )


def example_inputs() -> tuple[Tensor, ...]:
    return (torch.randn(8, 3, 32, 32),)
