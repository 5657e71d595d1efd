"""forward never returns."""

import time

from torch import nn

from tests.hostile.models._net import example_inputs, net  # noqa: F401


class Hangs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = net()

    def forward(self, x):  # noqa: ANN001, ANN201
        while True:
            time.sleep(1)


def build_model() -> nn.Module:
    return Hangs()
