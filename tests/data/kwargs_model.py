"""A model as people write them: keyword-only inputs, one of them not a tensor, a bool mask, and a
dataclass output. `example_inputs()` returns a dict: the advisor calls `model(**inputs)`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass
class Output:
    logits: Tensor
    features: Tensor


class MaskedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Linear(8, 4)

    def forward(self, x: Tensor, *, scale: float, mask: Tensor) -> Output:
        if not isinstance(scale, float) or mask.dtype != torch.bool:
            raise TypeError("scale must stay a float and mask a bool tensor")
        h = torch.relu(self.bn(self.conv1(x)))
        h = self.conv2(h) * scale
        h = h * mask[:, None]  # (B, H, W) -> over every channel
        return Output(logits=self.head(h.mean((2, 3))), features=h)


def build_model() -> nn.Module:
    return MaskedNet()


def example_inputs() -> dict[str, object]:
    return {"x": torch.randn(2, 3, 16, 16), "scale": 0.5, "mask": torch.rand(2, 16, 16) > 0.3}


def not_inputs() -> int:
    return 3


def bad_keys() -> dict[object, object]:
    return {0: torch.randn(2, 3, 16, 16)}


def wrong_mask() -> dict[str, object]:
    return {"x": torch.randn(2, 3, 16, 16), "scale": 0.5, "mask": torch.rand(2, 8, 8) > 0.3}
