"""Conv layers as libraries ship them: which classes an implementation may compute.

`isinstance(m, nn.Conv2d)` holds for subclasses that compute something else: timm's StdConv2d
standardises its weight, its Conv2dSame pads 'same' at run time, QAT's ConvBn2d folds a batch
norm and fake-quantises. An implementation computes `conv(input, weight, bias, ...)` with the
module's arguments, so it may take a layer only when:

- its class computes PyTorch's own conv: `forward` and `_conv_forward` are those of the nn.ConvNd
  it derives from. That covers Lazy convs (a swapped one stays swapped when it becomes its
  nn.ConvNd at its first call), parametrized convs (weight_norm / spectral_norm from
  torch.nn.utils.parametrizations: `module.weight` is a property recomputed on each access) and
  the hook-based torch.nn.utils.weight_norm / spectral_norm (a forward pre-hook sets
  `module.weight` before each call); or
- a `Recipe` reproduces its class: the input padding and the weight transform its forward applies
  before PyTorch's conv. Each recipe is checked once per class against the class's own forward,
  in float64, before any layer of that class is given to an implementation.

Any other class keeps PyTorch's forward: `class_reason` says why, in one line.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize

from advisor.impls.base import CONV_TYPES, ConvImpl, in_channels
from advisor.workload.copying import copy_module

__all__ = [
    "Recipe",
    "class_name",
    "class_reason",
    "conv_input_shape",
    "recipe_for",
    "register_recipe",
    "stock_base",
    "weight_dtype",
]


@dataclass(frozen=True)
class Recipe:
    """What a conv subclass's forward does around PyTorch's conv with the module's arguments:
    `pad(module, input)` first, and `weight(module)` as the conv's weight (None: unchanged)."""

    what: str
    weight: Callable[[nn.Module], Tensor] | None = None
    pad: Callable[[nn.Module, Tensor], Tensor] | None = None


_FORWARDS = ("forward", "_conv_forward")  # what a class overrides to compute something else
_RECIPES: dict[str, Recipe] = {}
_CHECKED: dict[type, str | None] = {}  # class -> why its recipe is not used (None: it holds)


def register_recipe(class_path: str, recipe: Recipe) -> None:
    """Declare that `recipe` reproduces the class `module.QualName` (that class exactly: a
    subclass of it may override forward again)."""
    _RECIPES[class_path] = recipe
    _CHECKED.clear()


def class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _original(cls: type) -> type:
    """The class the user built: a swapped class's original, a parametrized class's base."""
    cls = getattr(cls, "_advisor_original_class", cls)
    if cls.__module__ == parametrize.__name__ and cls.__name__.startswith("Parametrized"):
        return cls.__bases__[0]  # parametrize derives a class from the module's own
    return cls


def stock_base(cls: type) -> type[nn.Module] | None:
    """The nn.Conv*/ConvTranspose* class `cls` derives from (None: not a conv class)."""
    return next((b for b in _original(cls).__mro__ if b in CONV_TYPES), None)


def _stock(cls: type) -> bool:
    """Whether `cls` computes its base conv's forward (a parametrized class derives from the
    user's class: its forward is that class's)."""
    own, base = _original(cls), stock_base(cls)
    if base is None:
        return False
    return all(getattr(own, f, None) is getattr(base, f, None) for f in _FORWARDS)


def recipe_for(cls: type) -> Recipe | None:
    """The recipe declared for this class exactly (a swapped class: the user's class)."""
    cls = _original(cls)
    return None if _stock(cls) else _RECIPES.get(class_name(cls))


def class_reason(module: nn.Module, impl: ConvImpl | None = None) -> str | None:
    """None if an implementation (`impl`, else any that follows recipes) may compute `module` in
    place of its class's forward, else why its layer keeps PyTorch's forward."""
    cls = _original(type(module))
    if _stock(cls):
        return None
    if stock_base(cls) is None:
        return f"{cls.__name__} is not a convolution class"
    if cls not in _CHECKED:
        _CHECKED[cls] = _check_recipe(cls, module)
    reason = _CHECKED[cls]
    if reason is None and impl is not None and not impl.follows_recipes:
        what = _RECIPES[class_name(cls)].what
        return f"{cls.__name__} computes more than a conv ({what}), which {impl.name} does not do"
    return reason


def _check_recipe(cls: type, module: nn.Module) -> str | None:
    """Why `cls`'s recipe is not used (None: it reproduces the class's own forward on a copy of
    `module` in float64, forward and backward)."""
    recipe = _RECIPES.get(class_name(cls))
    if recipe is None:
        base = stock_base(cls)
        what = next(f for f in _FORWARDS if getattr(cls, f, None) is not getattr(base, f, None))
        return f"{cls.__name__} overrides {what} and no implementation declares it reproduces it"
    try:
        error = _recipe_error(recipe, module)
    except Exception as e:  # noqa: BLE001 - a recipe that cannot run is one that does not hold
        return f"the recipe for {cls.__name__} ({recipe.what}) failed its check: {e}"
    if error > 1e-9:
        return (
            f"the recipe for {cls.__name__} ({recipe.what}) differs from its forward by "
            f"{error:.1e} (another version of its library?)"
        )
    return None


def _recipe_error(recipe: Recipe, module: nn.Module) -> float:
    m: nn.modules.conv._ConvNd = copy_module(module).to(torch.float64)  # type: ignore[assignment]
    m.__class__ = getattr(type(m), "_advisor_original_class", type(m))  # the class's own forward
    m.train(module.training)
    if m.transposed:
        raise ValueError("recipes are for plain convs only")
    gen = torch.Generator().manual_seed(0)
    # A few windows wide, plus a remainder: strides and 'same' padding left uneven.
    size = [d * (k - 1) + 2 * s + 2 for k, s, d in zip(m.kernel_size, m.stride, m.dilation)]
    device = next((p.device for p in m.parameters()), torch.device("cpu"))
    x = torch.randn(1, in_channels(m), *size, generator=gen, dtype=torch.float64).to(device)
    x.requires_grad_(True)
    params = [p for p in m.parameters() if p.requires_grad]
    outs = []
    with torch.enable_grad(), torch.autocast(device.type, enabled=False):
        for run in (m, lambda t: _recipe_conv(recipe, m, t)):
            y = run(x)
            leaves = [x, *params]
            g = torch.autograd.grad(y, leaves, torch.ones_like(y), allow_unused=True)
            outs.append([y.detach()] + [torch.zeros_like(t) if d is None else d
                                        for d, t in zip(g, leaves)])  # fmt: skip
    return max(
        ((a - b).norm() / b.norm().clamp_min(1e-30)).item() for a, b in zip(*outs, strict=True)
    )


def _recipe_conv(recipe: Recipe, m: nn.modules.conv._ConvNd, x: Tensor) -> Tensor:
    """PyTorch's conv as the recipe says the class computes it (the reference for the check)."""
    if recipe.pad is not None:
        x = recipe.pad(m, x)
    weight = recipe.weight(m) if recipe.weight is not None else m.weight
    return m._conv_forward(x, weight, m.bias)


def conv_input_shape(module: nn.Module, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape PyTorch's conv receives inside `module` for an input of `shape` (its recipe's
    padding applied), for timing the conv alone."""
    recipe = recipe_for(type(module))
    if recipe is None or recipe.pad is None:
        return tuple(shape)
    return tuple(recipe.pad(module, torch.empty(shape, device="meta")).shape)


def weight_dtype(module: nn.Module) -> torch.dtype:
    """The dtype of the weight a conv computes with, without computing a parametrized one."""
    m: Any = module
    if parametrize.is_parametrized(m, "weight"):
        first = next(iter(m.parametrizations.weight.parameters()), None)
        if first is not None:
            return first.dtype
    return m.weight.dtype


# ---- recipes for timm's convs -------------------------------------------------------------------


def _same_pad(m: nn.Module, x: Tensor) -> Tensor:
    """TensorFlow's 'SAME' padding for this input (timm's pad_same): the extra pixel on the
    right/bottom."""
    pads: list[int] = []
    conv: Any = m
    kernel, stride, dilation = conv.kernel_size, conv.stride, conv.dilation
    for size, k, s, d in reversed(list(zip(x.shape[-len(kernel) :], kernel, stride, dilation))):
        total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
        pads += [total // 2, total - total // 2]
    return F.pad(x, pads) if any(pads) else x


def _same_pad_if_dynamic(m: nn.Module, x: Tensor) -> Tensor:
    return _same_pad(m, x) if getattr(m, "same_pad", False) else x


def _standardised(m: nn.Module, gain: Tensor | None = None) -> Tensor:
    """timm's weight standardisation: each output channel's weight to zero mean, unit variance
    (biased), as F.batch_norm in training mode computes it, times `gain` per channel."""
    w: Tensor = m.weight  # type: ignore[assignment]
    out_channels: int = m.out_channels  # type: ignore[assignment]
    eps: float = m.eps  # type: ignore[assignment]
    flat = w.reshape(1, out_channels, -1)
    return F.batch_norm(
        flat, None, None, weight=gain, training=True, momentum=0.0, eps=eps
    ).reshape_as(w)


def _scaled_standardised(m: nn.Module) -> Tensor:
    gain: Tensor = m.gain  # type: ignore[assignment]
    return _standardised(m, (gain * m.scale).view(-1))  # type: ignore[operator]


_STD = "weight standardised per output channel"
_SAME = "TensorFlow 'SAME' padding at run time"
for _prefix in ("timm.layers", "timm.models.layers"):  # timm >= 0.9, and older
    register_recipe(f"{_prefix}.std_conv.StdConv2d", Recipe(_STD, weight=_standardised))
    register_recipe(
        f"{_prefix}.std_conv.StdConv2dSame",
        Recipe(f"{_SAME} when dynamic, {_STD}", weight=_standardised, pad=_same_pad_if_dynamic),
    )
    register_recipe(
        f"{_prefix}.std_conv.ScaledStdConv2d",
        Recipe(f"{_STD}, scaled", weight=_scaled_standardised),
    )
    register_recipe(
        f"{_prefix}.std_conv.ScaledStdConv2dSame",
        Recipe(f"{_SAME} when dynamic, {_STD}, scaled", weight=_scaled_standardised,
               pad=_same_pad_if_dynamic),
    )  # fmt: skip
    register_recipe(f"{_prefix}.conv2d_same.Conv2dSame", Recipe(_SAME, pad=_same_pad))
