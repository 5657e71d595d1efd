"""A small video block with a (1,3,3) Conv3d: spatial convs over time, as in (2+1)D networks.

On many machines a Conv3d whose temporal kernel is 1 trains slower than the same work as a
Conv2d over folded batch x time; the advisor measures which implementation wins per layer.
"""

import torch
from torch import nn


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv3d(4, 16, (1, 3, 3), padding=(0, 1, 1)),
        nn.ReLU(),
        nn.Conv3d(16, 16, (3, 1, 1), padding=(1, 0, 0)),
        nn.ReLU(),
        nn.Conv3d(16, 16, (1, 3, 3), padding=(0, 1, 1)),
    )


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 4, 16, 48, 48),)
