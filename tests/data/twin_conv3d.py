"""Two identical (1,3,3) Conv3d layers and a temporal one: per-layer choice test model.

A learnable input gain comes first, so the first conv's input needs a gradient like the second
one's and the two twins share one per-layer measurement (a network's first conv, fed the data,
needs no input gradient and would be measured apart).
"""

import torch
from torch import nn


class Twin(nn.Sequential):
    def __init__(self) -> None:
        super().__init__(
            nn.Conv3d(4, 4, (1, 3, 3), padding=(0, 1, 1)),
            nn.ReLU(),
            nn.Conv3d(4, 4, (1, 3, 3), padding=(0, 1, 1)),
            nn.Conv3d(4, 4, (3, 1, 1), padding=(1, 0, 0)),
        )
        self.gain = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x * self.gain)


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return Twin()


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(1, 4, 4, 12, 12),)
