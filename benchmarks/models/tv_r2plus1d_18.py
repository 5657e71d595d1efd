"""torchvision's R(2+1)D-18 (`torchvision.models.video.r2plus1d_18()`: random weights, 400
classes) on 8x3x16x112x112 clips: a published video network whose Conv3d layers are factorised
into a (1,3,3) spatial and a (3,1,1) temporal conv, at the size of the suite's
`r2plus1d_18_train` case (benchmarks/suite_models.py): 16-frame 112x112 clips.

torchvision is imported only when the model is built; without it build_model raises an
ImportError saying so, and the benchmarks skip the model with that reason.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def build_model() -> nn.Module:
    try:
        from torchvision.models.video import r2plus1d_18
    except Exception as e:  # noqa: BLE001 - a wheel built for another torch fails in many ways
        raise ImportError(
            f"tv_r2plus1d_18.py needs torchvision: `pip install torchvision` "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        ) from e
    return r2plus1d_18(weights=None)


def example_inputs() -> tuple[Tensor, ...]:
    return (torch.randn(8, 3, 16, 112, 112),)
