"""forward hangs only when gradients are on (training), and works under no_grad."""

import time

import torch
from torch import nn

from tests.hostile.models._net import example_inputs, net  # noqa: F401


class HangsWithGrad(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = net()

    def forward(self, x):  # noqa: ANN001, ANN201
        while torch.is_grad_enabled():
            time.sleep(1)
        return self.body(x)


def build_model() -> nn.Module:
    return HangsWithGrad()
