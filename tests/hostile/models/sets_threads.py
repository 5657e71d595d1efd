"""forward sets one thread under autocast and leaves it so, as a careless model might."""

import torch
from torch import nn

from tests.hostile.models._net import example_inputs, net  # noqa: F401


class SetsThreads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = net()

    def forward(self, x):  # noqa: ANN001, ANN201
        torch.set_num_threads(1)
        return self.body(x)


def build_model() -> nn.Module:
    return SetsThreads()
