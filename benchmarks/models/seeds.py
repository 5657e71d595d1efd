"""The seeds' layers: the cases the project started from, as `build_<name>()` and
`inputs_<name>()` pairs (`advisor advise benchmarks/models/seeds.py --build build_conv3d_1x3x3
--inputs inputs_conv3d_1x3x3`). Each has the seed's own size (`inputs_<name>_full`, a GPU's) and
one a 2-core CPU times in seconds (`inputs_<name>`); the weights are seeded, the inputs fresh
random draws (never zeros: they hide unwritten outputs).

- conv3d_1x3x3: Conv3d(2, 2, (1, 3, 3)) in training; its backward is much slower than a Conv2d
  over folded time (the `fold_time` implementation).
- dwconvT_bn: a depthwise ConvTranspose2d 2x2 stride 2 + BatchNorm (a decoder's upsampling),
  inference; AMP has batch-size cliffs there.
- conv2d_3to16: Conv2d(3, 16, 3) on a large image, inference: few input channels, where
  channels_last can slow a conv.
- conv2d_512to1024: Conv2d(512, 1024, 3) on a large feature map, inference (64 -> 128 on a CPU).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def _draw(*shape: int) -> tuple[Tensor, ...]:
    return (torch.randn(*shape),)


def build_conv3d_1x3x3() -> nn.Module:
    torch.manual_seed(0)
    return nn.Conv3d(2, 2, (1, 3, 3), padding=(0, 1, 1), bias=False)


def inputs_conv3d_1x3x3() -> tuple[Tensor, ...]:
    return _draw(2, 2, 50, 64, 64)


build_conv3d_1x3x3_full = build_conv3d_1x3x3


def inputs_conv3d_1x3x3_full() -> tuple[Tensor, ...]:
    return _draw(8, 2, 500, 64, 64)


def _dw_transpose_bn(channels: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.ConvTranspose2d(channels, channels, 2, stride=2, groups=channels, bias=False),
        nn.BatchNorm2d(channels),
    )


def build_dwconvT_bn() -> nn.Module:
    return _dw_transpose_bn(256)


def inputs_dwconvT_bn() -> tuple[Tensor, ...]:
    return _draw(16, 256, 16, 16)


def build_dwconvT_bn_full() -> nn.Module:
    return _dw_transpose_bn(2048)


def inputs_dwconvT_bn_full() -> tuple[Tensor, ...]:
    return _draw(8, 2048, 16, 16)


def build_conv2d_3to16() -> nn.Module:
    torch.manual_seed(0)
    return nn.Conv2d(3, 16, 3, padding=1)


def inputs_conv2d_3to16() -> tuple[Tensor, ...]:
    return _draw(1, 3, 512, 512)


build_conv2d_3to16_full = build_conv2d_3to16


def inputs_conv2d_3to16_full() -> tuple[Tensor, ...]:
    return _draw(1, 3, 1024, 1024)


def build_conv2d_512to1024() -> nn.Module:
    torch.manual_seed(0)
    return nn.Conv2d(64, 128, 3)


def inputs_conv2d_512to1024() -> tuple[Tensor, ...]:
    return _draw(2, 64, 64, 128)


def build_conv2d_512to1024_full() -> nn.Module:
    torch.manual_seed(0)
    return nn.Conv2d(512, 1024, 3)


def inputs_conv2d_512to1024_full() -> tuple[Tensor, ...]:
    return _draw(5, 512, 128, 256)
