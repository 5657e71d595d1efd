"""PyTorch's own kernel (cuDNN on CUDA, oneDNN or the reference kernels on CPU): the baseline."""

from __future__ import annotations

import torch
from torch import nn

from advisor.impls.base import ConvImpl, ConvSignature


class NativeImpl(ConvImpl):
    name = "native"
    description = "PyTorch's own convolution (cuDNN on CUDA, oneDNN on CPU)"

    def why_not(
        self, sig: ConvSignature, *, device: torch.device, dtype: torch.dtype
    ) -> str | None:
        return None

    def wrap(self, module: nn.Module) -> nn.Module:
        # A module swapped to another implementation remembers its original class: restore it.
        original = getattr(type(module), "_advisor_original_class", None)
        if original is not None:
            module.__class__ = original
            module.__dict__.pop("fallbacks", None)  # the swapped forward's count
        return module
