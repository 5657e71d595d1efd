"""torchvision's MobileNetV3-Large (`torchvision.models.mobilenet_v3_large()`: random weights,
1000 classes, dropout 0.2) on 64x3x224x224 inputs.

torchvision is imported only when the model is built; without it build_model raises an
ImportError saying so, and benchmarks/zoo.py skips the model with that reason.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def build_model() -> nn.Module:
    try:
        from torchvision.models import mobilenet_v3_large
    except Exception as e:  # noqa: BLE001 - a wheel built for another torch fails in many ways
        raise ImportError(
            f"tv_mobilenet_v3_large.py needs torchvision: `pip install torchvision` "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        ) from e
    return mobilenet_v3_large(weights=None)


def example_inputs() -> tuple[Tensor, ...]:
    return (torch.randn(64, 3, 224, 224),)
