"""A small net with in-place activations and in-place dropout (MobileNetV3's classifier: Linear,
Hardswish(inplace=True), Dropout(inplace=True), Linear), for compiled candidates in train mode:
the gate's capture under its canonical dropout masks must train it as torch.compile does."""

import torch
from torch import nn


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.Hardswish(inplace=True),
        nn.Dropout2d(0.2, inplace=True),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(inplace=True),  # not before an in-place dropout: its backward reads its output
        nn.Flatten(),
        nn.Linear(8 * 8 * 8, 32),
        nn.Hardswish(inplace=True),
        nn.Dropout(0.5, inplace=True),
        nn.Linear(32, 4),
    )


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 3, 8, 8),)
