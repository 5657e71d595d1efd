"""A model whose first forward allocates and writes a 256 MiB buffer once, as Triton's autotuner
does on its first call (its do_bench buffer) and cuDNN's benchmark search does with workspaces:
a one-off cost that is not the model's working set."""

import torch
from torch import nn


class BigFirstCall(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.calls = 0

    def forward(self, x):  # noqa: ANN001, ANN201
        self.calls += 1
        if self.calls == 1:
            scratch = torch.ones(64 * 2**20)  # 256 MiB of fp32, written
            del scratch
        return self.conv(x)


def build_model() -> nn.Module:
    return BigFirstCall()


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 3, 16, 16),)
