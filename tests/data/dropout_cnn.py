"""A small conv net with dropout, for training-mode checks of compiled candidates: Inductor draws
its own dropout masks, so a compiled step is comparable with the reference only under the gate's
canonical masks."""

import torch
from torch import nn


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Dropout(0.3),
        nn.Conv2d(8, 4, 1),
    )


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 3, 8, 8),)
