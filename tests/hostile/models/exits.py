"""forward calls sys.exit(3)."""

import sys

from torch import nn

from tests.hostile.models._net import example_inputs, net  # noqa: F401


class Exits(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = net()

    def forward(self, x):  # noqa: ANN001, ANN201
        sys.exit(3)


def build_model() -> nn.Module:
    return Exits()
