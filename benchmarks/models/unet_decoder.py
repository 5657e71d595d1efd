"""The upsampling path of a UNet (a segmentation decoder) at a GPU's size: four stages from 1024
to 64 channels, each a 2x2 stride-2 ConvTranspose2d, concatenation with the encoder's skip
tensor and two 3x3 conv + BatchNorm + ReLU, then a 1x1 classifier to 21 classes, on a batch of
8 at 256x256 (five inputs: the bottleneck and the four skips, deepest first).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

WIDTHS = (512, 256, 128, 64)
BATCH, SIZE = 8, 256


class _ConvBlock(nn.Sequential):
    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__(
            nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(inplace=True),
            nn.Conv2d(c_out, c_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(inplace=True),
        )


class UNetDecoder(nn.Module):
    def __init__(self, widths: tuple[int, ...] = WIDTHS, classes: int = 21) -> None:
        super().__init__()
        ups, blocks = [], []
        c = 2 * widths[0]
        for w in widths:
            ups.append(nn.ConvTranspose2d(c, w, 2, stride=2))
            blocks.append(_ConvBlock(2 * w, w))
            c = w
        self.ups = nn.ModuleList(ups)
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Conv2d(c, classes, 1)

    def forward(self, x: Tensor, *skips: Tensor) -> Tensor:
        for up, block, skip in zip(self.ups, self.blocks, skips, strict=True):
            x = block(torch.cat([up(x), skip], dim=1))
        return self.head(x)


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return UNetDecoder()


def example_inputs() -> tuple[Tensor, ...]:
    shapes = [(BATCH, 2 * WIDTHS[0], SIZE // 16, SIZE // 16)]
    shapes += [(BATCH, w, SIZE // 2 ** (3 - i), SIZE // 2 ** (3 - i)) for i, w in enumerate(WIDTHS)]
    return tuple(torch.randn(s) for s in shapes)
