"""A model torch.compile recompiles on every call: its forward reads a Python int that changes
per call (Dynamo guards on it). A compiled candidate must fail with that reason, not run on in
eager mode after Dynamo's recompile limit."""

import torch
from torch import nn


class Recompiles(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.calls = 0

    def forward(self, x):  # noqa: ANN001, ANN201
        self.calls += 1
        return self.conv(x) * self.calls


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return Recompiles()


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(1, 3, 8, 8),)
