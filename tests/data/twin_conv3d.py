"""Two identical (1,3,3) Conv3d layers and a temporal one: per-layer choice test model."""

import torch
from torch import nn


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv3d(4, 4, (1, 3, 3), padding=(0, 1, 1)),
        nn.ReLU(),
        nn.Conv3d(4, 4, (1, 3, 3), padding=(0, 1, 1)),
        nn.Conv3d(4, 4, (3, 1, 1), padding=(1, 0, 0)),
    )


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(1, 4, 4, 12, 12),)
