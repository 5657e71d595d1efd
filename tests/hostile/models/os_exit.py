"""forward calls os._exit(0): the process ends at once, with a 'success' code."""

import os

from torch import nn

from tests.hostile.models._net import example_inputs, net  # noqa: F401


class OsExit(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = net()

    def forward(self, x):  # noqa: ANN001, ANN201
        os._exit(0)


def build_model() -> nn.Module:
    return OsExit()
