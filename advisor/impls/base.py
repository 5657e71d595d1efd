"""What every convolution implementation provides, and the layer signature it is judged on."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn
from torch.nn.parameter import is_lazy

CONV_TYPES: tuple[type[nn.Module], ...] = (
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
)


def in_channels(m: nn.modules.conv._ConvNd) -> int:
    """The layer's input channels. A Lazy conv given its weights by load_state_dict keeps
    in_channels 0 (only its first call would set it): its weight's shape says."""
    if m.in_channels or is_lazy(m.weight):  # uninitialised: 0 until its first call
        return m.in_channels
    shape = m.weight.shape
    return shape[0] if m.transposed else shape[1] * m.groups


@dataclass(frozen=True)
class ConvSignature:
    """Everything about a conv layer that decides which implementation can run it and how fast.

    Hashable, so layers with the same signature (and input shape) share one measurement.
    """

    transposed: bool
    ndim: int  # spatial dims: 1, 2 or 3
    in_channels: int
    out_channels: int
    kernel_size: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...] | str  # ints per dim, or 'same' / 'valid'
    dilation: tuple[int, ...]
    groups: int
    bias: bool
    output_padding: tuple[int, ...]
    padding_mode: str

    @classmethod
    def from_module(cls, module: nn.Module) -> ConvSignature:
        if not isinstance(module, CONV_TYPES):
            raise TypeError(f"not a convolution module: {type(module).__name__}")
        m: nn.modules.conv._ConvNd = module  # type: ignore[assignment]
        padding = m.padding if isinstance(m.padding, str) else tuple(m.padding)
        return cls(
            transposed=bool(m.transposed),
            ndim=len(m.kernel_size),
            in_channels=in_channels(m),
            out_channels=m.out_channels,
            kernel_size=tuple(m.kernel_size),
            stride=tuple(m.stride),
            padding=padding,
            dilation=tuple(m.dilation),
            groups=m.groups,
            bias=m.bias is not None,
            output_padding=tuple(m.output_padding),
            padding_mode=m.padding_mode,
        )

    @property
    def kind(self) -> str:
        """The PyTorch class name this signature describes, e.g. 'Conv2d', 'ConvTranspose3d'."""
        return f"{'ConvTranspose' if self.transposed else 'Conv'}{self.ndim}d"


class ConvImpl(ABC):
    """One way to compute a conv layer (forward and backward).

    `why_not` says where it does not apply (None where it does); `wrap` turns a conv module into
    one computed by this implementation while keeping its parameters and state_dict keys.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    # Whether its forward pads the input and takes the weight as a conv subclass's `Recipe` says
    # (`_swap.conv_weight`), so it may compute the classes a recipe reproduces (impls.classes).
    follows_recipes: ClassVar[bool] = False
    # Whether its first call on a shape autotunes (Triton): a one-off cost a training run pays,
    # which the per-layer stage weighs against what the layer could save (stages.autotune_bound).
    autotunes: ClassVar[bool] = False

    @abstractmethod
    def why_not(
        self, sig: ConvSignature, *, device: torch.device, dtype: torch.dtype
    ) -> str | None:
        """None if this implementation can run the layer here, else the reason it cannot."""

    @abstractmethod
    def wrap(self, module: nn.Module) -> nn.Module:
        """A module computed by this implementation with the same parameters and state_dict keys."""
