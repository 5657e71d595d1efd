"""Prints a lot: at import, in build_model and in every forward (Python and C-level writes)."""

import os

from torch import nn

from tests.hostile.models._net import example_inputs, net  # noqa: F401

print("import: " + "x" * 1000)


class PrintFlood(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = net()

    def forward(self, x):  # noqa: ANN001, ANN201
        for _ in range(20):
            print("forward: " + "y" * 200)
        os.write(1, b"raw write to fd 1\n")
        return self.body(x)


def build_model() -> nn.Module:
    print("build_model: " + "z" * 1000)
    return PrintFlood()
