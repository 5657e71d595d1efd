"""forward computes, then returns None."""

from torch import nn

from tests.hostile.models._net import example_inputs, net  # noqa: F401


class NoneOutput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = net()

    def forward(self, x):  # noqa: ANN001, ANN201
        self.body(x)


def build_model() -> nn.Module:
    return NoneOutput()
