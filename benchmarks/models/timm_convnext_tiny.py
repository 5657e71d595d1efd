"""timm's ConvNeXt-Tiny (`timm.create_model("convnext_tiny")`: random weights, 1000 classes;
depthwise 7x7 convs, LayerNorm, GELU, stochastic depth 0) on 32x3x224x224 inputs.

timm is imported only when the model is built; without it build_model raises an ImportError
saying so, and benchmarks/zoo.py skips the model with that reason.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def build_model() -> nn.Module:
    try:
        import timm
    except Exception as e:  # noqa: BLE001 - timm pulls torchvision, which may not load
        raise ImportError(
            f"timm_convnext_tiny.py needs timm: `pip install timm` "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        ) from e
    model: nn.Module = timm.create_model("convnext_tiny", pretrained=False)
    return model


def example_inputs() -> tuple[Tensor, ...]:
    return (torch.randn(32, 3, 224, 224),)
