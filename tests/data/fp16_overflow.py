"""A negative control for fp16: activations beyond fp16's largest value (65504) with nothing to
scale them (a GradScaler scales gradients, not activations): in fp16 they overflow to Inf. It
must not be judged to train like fp32 in fp16."""

import torch
from torch import nn


class Overflows(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, x):  # noqa: ANN001, ANN201
        big = self.conv1(x) * 1e5  # |values| up to ~1e5: past 65504
        return self.conv2(torch.relu(big)) * 1e-5


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return Overflows()


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(4, 3, 12, 12),)
