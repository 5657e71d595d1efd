"""Three library conv classes in a row: timm's StdConv2d and Conv2dSame (both override forward),
then a weight-normed nn.Conv2d (torch.nn.utils.parametrizations.weight_norm). Issue 42's model.

timm's package imports torchvision, whose PyPI wheel does not load beside every torch build (not
beside this project's torch 2.13.0+cpu); timm's conv modules themselves need only torch.
`timm_layers` imports them the usual way when it can, else those modules alone, under their own
names (timm.layers.std_conv, ...) so that the classes are timm's own.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

__all__ = ["build_model", "example_inputs", "timm_layers"]

_MODULES = ("std_conv", "conv2d_same")


def timm_layers() -> dict[str, Any]:
    """timm's conv classes by name. ImportError, naming why, wherever they cannot be imported:
    timm not installed, or its conv modules failing to load. A torchvision installed beside a
    torch it was not built for fails with RuntimeError or AttributeError, not ImportError
    (`operator torchvision::nms does not exist`): any failure of the normal import falls back
    to the conv modules alone, and any failure of that is an ImportError."""
    try:
        import timm.layers as layers  # noqa: F401 - the normal way, with torchvision

        mods = [importlib.import_module(f"timm.layers.{m}") for m in _MODULES]
    except Exception as e:  # noqa: BLE001 - whatever timm's package import raises
        try:
            mods = _without_package()
        except Exception as alone:  # noqa: BLE001 - ImportError or not, it is timm's
            raise ImportError(
                f"timm does not import here ({type(e).__name__}: {e}), nor do its conv modules "
                f"alone ({type(alone).__name__}: {alone})"
            ) from alone
    return {k: v for m in mods for k, v in vars(m).items() if isinstance(v, type)}


def _without_package() -> list[types.ModuleType]:
    """timm.layers.std_conv and .conv2d_same, without running timm's and timm.layers'
    __init__ (which import torchvision): empty packages stand in while they load, then go."""
    spec = importlib.util.find_spec("timm")  # finds, does not run, the package
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("timm is not installed (pip install --no-deps timm)")
    root = Path(next(iter(spec.submodule_search_locations)))
    before = set(sys.modules)
    for name, path in (("timm", root), ("timm.layers", root / "layers")):
        if name not in sys.modules:
            stand_in = types.ModuleType(name)
            stand_in.__path__ = [str(path)]
            sys.modules[name] = stand_in
    try:
        return [importlib.import_module(f"timm.layers.{m}") for m in _MODULES]
    finally:
        for name in set(sys.modules) - before:
            del sys.modules[name]  # a later `import timm` is not handed a stand-in


def build_model() -> nn.Module:
    layers = timm_layers()
    torch.manual_seed(0)
    return nn.Sequential(
        layers["StdConv2d"](3, 8, 3, padding=1),
        nn.ReLU(),
        layers["Conv2dSame"](8, 8, 3, stride=2),
        nn.ReLU(),
        weight_norm(nn.Conv2d(8, 8, 3, padding=1)),
    )


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 3, 17, 17),)
