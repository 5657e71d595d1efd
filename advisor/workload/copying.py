"""Copying a model or a layer as it is, whatever the library that built it left in it."""

from __future__ import annotations

import copy
import functools
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["closure_in", "copy_module", "copying_factory"]


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


def closure_in(module: nn.Module) -> str | None:
    """Where a module keeps a closure (a lambda or nested function with free variables, or a
    functools.partial) as an attribute or a hook: deepcopy copies such a function by reference,
    so a copy's hook could still act on the original's modules. None where there is none."""
    for name, m in module.named_modules():
        for attr, value in vars(m).items():
            held = value.values() if attr.endswith("hooks") and isinstance(value, dict) else [value]
            for fn in held:
                if isinstance(fn, functools.partial) or (
                    isinstance(fn, types.FunctionType) and fn.__closure__
                ):
                    return f"{name or type(module).__name__}.{attr}"
    return None


def copying_factory(
    build: Callable[[], nn.Module], on_kept: Callable[[nn.Module], None] | None = None
) -> Callable[[], nn.Module]:
    """`build`, made once: every call returns a copy of that first model (`copy_module`), weights,
    buffers and all. A model's own initialisation can cost far more than a copy (ResNet-18's random
    init about 8x), and the advisor makes one per candidate, per gate check and per training run.
    Where a copy could differ from a build (a closure it keeps, `closure_in`; a copy that raises),
    every call builds. `on_kept` receives the model copied from, never handed out: the caller may
    point its own copy of the weights at it."""
    kept: list[nn.Module] = []  # the model copied from; empty: build every time
    copies = True

    def make() -> nn.Module:
        nonlocal copies
        if copies and not kept:
            model = build()
            if closure_in(model) is not None:
                copies = False
                return model
            kept.append(model)
            if on_kept is not None:
                on_kept(model)
        if copies:
            try:
                return copy_module(kept[0])
            except Exception:  # noqa: BLE001 - a model deepcopy refuses: build it instead
                copies = False
                if on_kept is None:  # nobody else holds it: hand out the model as built
                    return kept.pop()
        return build()

    return make
