"""A tiny conv net model file for tests."""

import torch
from torch import nn


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, groups=8),
        nn.Conv2d(8, 4, 1),
    )


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 3, 16, 16),)


def build_other() -> nn.Module:
    return nn.Conv2d(3, 3, 1)


def bad_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 5, 16, 16),)


def raising_model() -> nn.Module:
    raise RuntimeError("weights not found")
