"""The small network every hostile model wraps: fine on its own."""

import torch
from torch import nn


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3, padding=1))


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 3, 16, 16),)
