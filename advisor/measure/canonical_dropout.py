"""Dropout masks that do not depend on dtype, memory layout or device, for the numeric gate.

The gate compares a candidate's training step with the fp32 reference's, both seeded alike. But
PyTorch draws a dropout mask in memory order, with a vector width that depends on the dtype on
CUDA (4 fp32 values per thread, 8 fp16/bf16, 2 fp64): a channels_last candidate (on a CPU too) or
an AMP one (on CUDA) drops other units than the reference, and the comparison measures two masks,
not two precisions (AMP rejected, the fp32 noise floor vacuous: gpu_audit #5).

While `canonical_dropout()` is active, every dropout function (`nn.Dropout*`, `nn.AlphaDropout`,
`nn.FeatureAlphaDropout` and their functional forms) draws its mask on the CPU, in fp32, in the
tensor's logical order, from a seed and its call number: the same units in every candidate. A
dropout is affine in its input for a fixed mask, `out = x * a + b` (`b = 0` but for the alpha
variants), so `a` and `b` come from running PyTorch's own function on ones and zeros under that
seed. Only the gate's captures use it; timed steps run PyTorch's own kernels.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

__all__ = ["canonical_dropout"]

_DROPOUTS: tuple[Callable[..., Any], ...] = (
    F.dropout,
    F.dropout1d,
    F.dropout2d,
    F.dropout3d,
    F.alpha_dropout,
    F.feature_alpha_dropout,
)
_SIGNATURES = {f: inspect.signature(f) for f in _DROPOUTS}


class canonical_dropout(TorchFunctionMode):  # noqa: N801 - used as a context manager
    """Within it, dropout masks depend only on `seed`, the call's order and the logical shape."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.seed = seed
        self.calls = 0

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func not in _SIGNATURES:
            return func(*args, **kwargs)
        bound = _SIGNATURES[func].bind(*args, **kwargs)
        bound.apply_defaults()
        x, p = bound.arguments["input"], bound.arguments["p"]
        if not bound.arguments["training"] or p == 0 or not torch.is_tensor(x):
            return func(*args, **kwargs)
        self.calls += 1
        a, b = self._affine(func, tuple(x.shape), p)
        a, b = a.to(x.device, x.dtype), b.to(x.device, x.dtype)
        if bound.arguments["inplace"]:
            return x.mul_(a).add_(b)
        return x * a + b

    def _affine(
        self, func: Callable[..., Any], shape: tuple[int, ...], p: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`a`, `b` with func(x) == x * a + b for this call's mask, drawn on the CPU."""
        seed = self.seed * 100_003 + self.calls
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            ones = func(torch.ones(shape), p=p, training=True)
            torch.manual_seed(seed)
            zeros = func(torch.zeros(shape), p=p, training=True)
        return ones - zeros, zeros
