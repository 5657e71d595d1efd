"""A small ReLU/BatchNorm CNN (as benchmarks/models/relu_bn_block.py, smaller input): its
training gradients jump when a unit near zero flips, the case where a numeric gate decides by
luck unless its tolerance is calibrated on the model."""

import torch
from torch import nn


def _block(cin: int, cout: int, stride: int = 1) -> list[nn.Module]:
    return [
        nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    ]


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        *_block(3, 16),
        *_block(16, 32, stride=2),
        *_block(32, 32),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(1),
        nn.Linear(32, 10),
    )


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(8, 3, 16, 16),)
