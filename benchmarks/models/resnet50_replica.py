"""ResNet-50 without torchvision (which the development machine's CPU torch cannot import):
torchvision's layout (Bottleneck blocks 3-4-6-3, 64 channels at the first stage, 1000 classes)
and its initialisation (kaiming_normal_, fan_out), from tests/data/bottleneck_resnet.py's blocks,
on 32 x 3 x 64 x 64 inputs: the batch of a GPU's training step at a size a 2-core CPU runs.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from torch import Tensor, nn

_spec = importlib.util.spec_from_file_location(
    "_bottleneck_resnet",
    Path(__file__).resolve().parents[2] / "tests" / "data" / "bottleneck_resnet.py",
)
assert _spec is not None and _spec.loader is not None
_blocks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_blocks)


def build_model() -> nn.Module:
    torch.manual_seed(0)
    model = _blocks.BottleneckResNet(width=64, blocks=(3, 4, 6, 3))
    model.fc = nn.Linear(2048, 1000)
    return model


def example_inputs() -> tuple[Tensor, ...]:
    return (torch.randn(32, 3, 64, 64),)
