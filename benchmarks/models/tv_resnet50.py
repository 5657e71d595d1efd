"""torchvision's ResNet-50 (`torchvision.models.resnet50()`: random weights, 1000 classes) on
32x3x224x224 inputs: the ImageNet training batch of one GPU in torchvision's reference recipe.

torchvision is imported only when the model is built; without it (it is not installed with the
CPU torch of the development machine) build_model raises an ImportError saying so, and
benchmarks/zoo.py skips the model with that reason.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def build_model() -> nn.Module:
    try:
        from torchvision.models import resnet50
    except Exception as e:  # noqa: BLE001 - a wheel built for another torch fails in many ways
        raise ImportError(
            f"tv_resnet50.py needs torchvision: `pip install torchvision` "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        ) from e
    return resnet50(weights=None)


def example_inputs() -> tuple[Tensor, ...]:
    return (torch.randn(32, 3, 224, 224),)
