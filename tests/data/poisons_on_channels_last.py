"""A model that, on channels_last inputs, does what an illegal memory access does on a GPU: it
leaves the (stand-in) CUDA context unusable and raises its sticky error. For the CUDA stand-in
tests (tests/standins/cuda_on_cpu.py)."""

import torch
from torch import nn

from advisor.device.ops import cuda_ops
from tests.standins.cuda_on_cpu import STICKY


class Poisons(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):  # noqa: ANN001, ANN201
        if not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
            cuda_ops().poison()
            raise RuntimeError(STICKY)
        return self.conv(x)


def build_model() -> nn.Module:
    return Poisons()


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 3, 8, 8),)
