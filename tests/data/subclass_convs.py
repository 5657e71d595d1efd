"""Conv subclasses as libraries and users write them, one of each: PyTorch's QAT ConvBn2d and
ConvReLU2d (they override forward: fake-quantised weight, batch-norm folding), a Lazy conv, a
user's subclass that overrides forward, and the old hook-based weight_norm and spectral_norm."""

from __future__ import annotations

import torch
import torch.ao.nn.intrinsic.qat as nniqat
from torch import Tensor, nn
from torch.ao.quantization import get_default_qat_qconfig


class ScaledConv(nn.Conv2d):
    """A user's own conv: the output scaled by a learnt factor, in its own forward."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.scale = nn.Parameter(torch.tensor(0.5))

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x) * self.scale


def build_model() -> nn.Module:
    torch.manual_seed(0)
    qconfig = get_default_qat_qconfig("fbgemm")
    return nn.Sequential(
        nniqat.ConvBn2d(3, 8, 3, padding=1, qconfig=qconfig),
        nniqat.ConvReLU2d(8, 8, 3, padding=1, qconfig=qconfig),
        nn.LazyConv2d(8, 3, padding=1),
        ScaledConv(8, 8, 3, padding=1),
        torch.nn.utils.weight_norm(nn.Conv2d(8, 8, 3, padding=1)),
        torch.nn.utils.spectral_norm(nn.Conv2d(8, 8, 3, padding=1)),
    )


def example_inputs() -> tuple[Tensor, ...]:
    return (torch.randn(2, 3, 12, 12),)
