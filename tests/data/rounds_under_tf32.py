"""A conv net whose convs round their outputs to 8 mantissa bits while TF32 convs are allowed:
on a CPU (through the CUDA stand-in, tests/standins/cuda_on_cpu.py) it differs from fp32 the way
TF32 convs on a GPU do, only more. For the gate's policy on PyTorch's default precision."""

import torch
from torch import nn

from advisor.device.flags import conv_tf32


class RoundingConv(nn.Conv2d):
    def forward(self, x):  # noqa: ANN001, ANN201
        y = super().forward(x)
        if conv_tf32() and y.dtype == torch.float32:  # TF32 rounds fp32 convs only
            y = y + (y.bfloat16().float() - y).detach()  # rounded values, fp32 gradients
        return y


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(RoundingConv(3, 8, 3, padding=1), nn.ReLU(), RoundingConv(8, 4, 3))


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 3, 12, 12),)
