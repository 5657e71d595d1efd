"""Convolution implementations, chosen per layer.

Each implementation is a `ConvImpl` registered here by name. `swap(module, name)` returns a module
computed by that implementation, keeping the parameters and state_dict keys of the original.

- `base`: `ConvImpl` and `ConvSignature`, what an implementation declares and qualifies on;
- `classes`: which conv classes an implementation may compute (subclasses that override forward
  keep it unless a `Recipe` reproduces them);
- `native` (PyTorch's own op), `unfold_gemm` (unfold + one GEMM), `rewrites` (exact rewrites:
  fold time into the batch, transposed conv as a multiply), `triton_conv` (Triton kernels, with
  `triton_configs` for their tile sizes and `triton_loader` for importing Triton lazily).
"""

from __future__ import annotations

import torch
from torch import nn

from advisor.errors import ImplError
from advisor.impls.base import CONV_TYPES, ConvImpl, ConvSignature
from advisor.impls.classes import class_reason
from advisor.impls.native import NativeImpl
from advisor.impls.rewrites import FoldTimeImpl, TransposeAsMulImpl
from advisor.impls.triton_conv import TritonImpl
from advisor.impls.unfold_gemm import UnfoldGemmImpl

_REGISTRY: dict[str, ConvImpl] = {}


def register(impl: ConvImpl) -> ConvImpl:
    _REGISTRY[impl.name] = impl
    return impl


register(NativeImpl())
register(UnfoldGemmImpl())
register(TritonImpl())
register(FoldTimeImpl())
register(TransposeAsMulImpl())


def load_plugins() -> None:
    """Import the modules named in $ADVISOR_PLUGINS (comma-separated): they may `register` their
    own implementations. Workers inherit the variable, so isolated trials see them too."""
    import importlib
    import os

    for name in os.environ.get("ADVISOR_PLUGINS", "").split(","):
        if name.strip():
            try:
                importlib.import_module(name.strip())
            except ImportError as e:
                raise ImplError(f"cannot import plugin {name.strip()!r}: {e}") from None


def names() -> list[str]:
    """Every registered implementation name, `native` first."""
    return list(_REGISTRY)


def get_impl(name: str) -> ConvImpl:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ImplError(
            f"unknown conv implementation {name!r}; known: {', '.join(_REGISTRY)}"
        ) from None


def why_not(
    name: str, module: nn.Module, *, device: torch.device, dtype: torch.dtype
) -> str | None:
    """None if implementation `name` can run `module` here, else the reason it cannot."""
    impl = get_impl(name)
    if name != "native":
        reason = class_reason(module, impl)
        if reason is not None:
            return reason
    return impl.why_not(ConvSignature.from_module(module), device=device, dtype=dtype)


def swap(module: nn.Module, name: str) -> nn.Module:
    """`module` computed by implementation `name` (same parameters, same state_dict keys). An
    ImplError where its class computes more than a conv that `name` does not reproduce."""
    impl = get_impl(name)
    if name != "native":
        reason = class_reason(module, impl)
        if reason is not None:
            raise ImplError(f"{name} cannot run this layer: {reason}")
    return impl.wrap(module)


def conv_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(qualified name, module) for every conv layer in `model`, in definition order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, CONV_TYPES)]


__all__ = [
    "ConvImpl",
    "ConvSignature",
    "class_reason",
    "conv_modules",
    "get_impl",
    "names",
    "register",
    "swap",
    "why_not",
]

load_plugins()
