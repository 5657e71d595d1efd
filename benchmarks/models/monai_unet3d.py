"""MONAI's 3-D UNet: UNet(spatial_dims=3, in_channels=1, out_channels=2, channels=(8, 16, 32, 64),
strides=(2, 2, 2), num_res_units=2) on a 1x1x32x32x32 volume.

MONAI's defaults apply: InstanceNorm3d (affine=False), PReLU, dropout 0, biased Conv3d, and
ConvTranspose3d for the up path. monai is imported only when the model is built.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def build_model() -> nn.Module:
    try:
        from monai.networks.nets import UNet
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(f"monai_unet3d.py needs MONAI: `pip install monai` ({e})") from e
    return UNet(
        spatial_dims=3,
        in_channels=1,
        out_channels=2,
        channels=(8, 16, 32, 64),
        strides=(2, 2, 2),
        num_res_units=2,
    )


def example_inputs() -> tuple[Tensor, ...]:
    return (torch.randn(1, 1, 32, 32, 32),)
