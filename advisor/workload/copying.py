"""Copying a model or a layer as it is, whatever the library that built it left in it."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

__all__ = ["copy_module"]


def copy_module(module: nn.Module) -> nn.Module:
    """copy.deepcopy, also of a module that holds a computed tensor: the hook-based weight_norm
    and spectral_norm set `module.weight` (not a graph leaf, which deepcopy refuses) before each
    call. Such tensors are copied detached; the next call computes them anew."""
    memo: dict[int, Any] = {
        id(t): t.detach().clone()
        for m in module.modules()
        for t in vars(m).values()
        if isinstance(t, torch.Tensor) and t.grad_fn is not None
    }
    return copy.deepcopy(module, memo)
