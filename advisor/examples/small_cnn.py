"""A small conv net for trying the advisor: `advisor advise <this file> --mode train`.

A model file defines build_model() (returns the nn.Module) and example_inputs() (a tuple of
tensors). The advisor builds the model, makes fresh random inputs shaped like the examples, and
times candidate settings on it.
"""

import torch
from torch import nn


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1, groups=32),  # depthwise
        nn.Conv2d(32, 64, 1),  # pointwise
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.Conv2d(64, 64, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.ConvTranspose2d(64, 32, 2, stride=2),
        nn.ReLU(),
        nn.Conv2d(32, 8, 3, padding=1),
    )


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(8, 3, 64, 64),)
