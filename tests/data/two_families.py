"""A model on which a runner-up of another family beats the pick, made deterministic with sleeps:
PyTorch's default 200 ms, channels_last 100 ms, bf16 autocast 20 ms (whatever the layout): gaps
that a busy machine's late wake-ups, tens of ms each, cannot close. What the
final check's runner-up is for: the search picked channels_last, the check must prefer bf16."""

import time

import torch
from torch import nn


class TwoFamilies(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):  # noqa: ANN001, ANN201
        if torch.is_autocast_enabled("cpu"):
            time.sleep(0.020)
        elif x.is_contiguous(memory_format=torch.channels_last):
            time.sleep(0.100)
        else:
            time.sleep(0.200)
        return self.conv(x)


def build_model() -> nn.Module:
    return TwoFamilies()


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(1, 3, 8, 8),)
