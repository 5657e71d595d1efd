"""A negative control for half precisions: a network whose signal lives below bf16's resolution.
Its first conv sees `1 + 1e-3 * x` and the constant's response is subtracted back, so in fp32 it
computes `1e-3 * conv(x)` (scaled back up); in bf16 (8 bits of mantissa: steps of 0.0078 near 1)
`x` is rounded away before the conv sees it. It must not be judged to train like fp32 in bf16."""

import torch
from torch import nn


class BelowBf16(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x):  # noqa: ANN001, ANN201
        signal = self.conv(1 + 1e-3 * x) - self.conv(torch.ones_like(x))
        return self.head(torch.relu(1e3 * signal))


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return BelowBf16()


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(4, 3, 12, 12),)
