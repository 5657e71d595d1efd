"""Swap a conv module's computation without touching its parameters.

`swap_module` retargets the module's class to a cached subclass of its original class whose
`forward` calls an implementation function. Parameters, buffers, hooks and state_dict keys stay
exactly those of the original module (no copies, so optimizers keep working), `isinstance` against
the original class still holds, and `native` unwraps by restoring `_advisor_original_class`.

The subclasses are created at run time, so pickling by class name would fail; `__reduce_ex__`
rebuilds them from (original class, impl name) instead, which makes `torch.save(model)`,
`pickle` and `copy.deepcopy` work.

Only layers whose class computes PyTorch's conv, or one a `Recipe` reproduces, are swapped
(`impls.classes`): a swapped class keeps its recipe (`_advisor_recipe`), `_swapped_forward` pads
the input as it says, and `conv_weight` gives the implementations the weight it says. A
parametrized weight (`module.weight` as a property) is so computed on every call, and its
gradients reach the parametrization's originals.

A swapped module never raises where its PyTorch module would not: an implementation's
`call_why_not` names the calls it does not compute (a dtype it lacks, an output_size it cannot
honour, ...), and those calls run PyTorch's own forward instead. Each such call adds one to the
module's `fallbacks` and logs a debug line (logger `advisor.impls._swap`) naming the layer, the
implementation and the reason. Only that check decides: an exception inside an implementation is
a bug and propagates, never turned into a silent fallback.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Callable, Sequence
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from advisor.errors import ImplError
from advisor.impls.base import ConvImpl, ConvSignature
from advisor.impls.classes import class_reason, recipe_for
from advisor.knobs import GlobalFlags

# The conv a forward computes, given the module and an input that needs no more padding_mode work:
# forward(module, input, padding, output_padding) -> output. output_padding is None for plain convs.
ForwardFn = Callable[[nn.Module, Tensor, "tuple[int, ...] | str", "list[int] | None"], Tensor]
# Whether an implementation computes this call: call_why_not(module, input, output_padding) is
# None if it does, else why not (PyTorch's forward then computes it). Called before any padding.
CallCheck = Callable[[nn.Module, Tensor, "list[int] | None"], "str | None"]

logger = logging.getLogger(__name__)

_FORWARDS: dict[str, ForwardFn] = {}
_CALL_CHECKS: dict[str, CallCheck] = {}
_CLASS_NAMES: dict[str, str] = {}
_CLASSES: dict[tuple[type[nn.Module], str], type[nn.Module]] = {}


def register_forward(
    impl_name: str, class_prefix: str, forward: ForwardFn, call_why_not: CallCheck
) -> None:
    """Declare how implementation `impl_name` computes a conv module's forward, and which calls
    it leaves to PyTorch (`call_why_not`)."""
    _FORWARDS[impl_name] = forward
    _CLASS_NAMES[impl_name] = class_prefix
    _CALL_CHECKS[impl_name] = call_why_not


def original_class(module: nn.Module) -> type[nn.Module]:
    return getattr(type(module), "_advisor_original_class", type(module))


def swapped_class(original: type[nn.Module], impl_name: str) -> type[nn.Module]:
    """The cached subclass of `original` whose forward runs implementation `impl_name`."""
    key = (original, impl_name)
    cls = _CLASSES.get(key)
    if cls is None:
        name = f"{_CLASS_NAMES[impl_name]}{original.__name__}"
        namespace: dict[str, object] = {
            "_advisor_original_class": original,
            "_advisor_impl": impl_name,
            "_advisor_recipe": recipe_for(original),  # what the class does around its conv
            "fallbacks": 0,  # calls PyTorch's forward computed; the instance's own once counted
            "forward": _swapped_forward,
            "__reduce_ex__": _reduce_ex,
            "__module__": __name__,
            "__qualname__": name,
        }
        # A Lazy* module turns itself into `cls_to_become` (e.g. nn.Conv2d) on its first call:
        # make that the swapped class too, or the swap would silently end there.
        become = getattr(original, "cls_to_become", None)
        if isinstance(become, type) and issubclass(become, nn.Module):
            namespace["cls_to_become"] = swapped_class(become, impl_name)
        cls = type(name, (original,), namespace)
        _CLASSES[key] = cls
    return cls


def swap_module(module: nn.Module, impl_name: str) -> nn.Module:
    """Make `module` (in place, also returned) compute its forward with `impl_name`."""
    module.__class__ = swapped_class(original_class(module), impl_name)
    module.__dict__.pop("fallbacks", None)  # counted per implementation: a new swap starts at 0
    return module


def _swapped_forward(
    self: nn.Module, input: Tensor, output_size: list[int] | None = None
) -> Tensor:
    m: nn.modules.conv._ConvNd = self  # type: ignore[assignment]
    impl = type(self)._advisor_impl  # type: ignore[attr-defined]
    forward = _FORWARDS[impl]
    ndim = len(m.kernel_size)
    output_padding: list[int] | None = None
    if m.transposed:
        if m.padding_mode != "zeros":
            raise ValueError(f"Only `zeros` padding mode is supported for {type(m).__name__}")
        output_padding = list(
            m._output_padding(  # type: ignore[operator]
                input, output_size, m.stride, m.padding, m.kernel_size, ndim, m.dilation
            )
        )
    elif output_size is not None:
        raise TypeError("output_size is only accepted by transposed convolutions")
    reason = _CALL_CHECKS[impl](self, input, output_padding)
    if reason is not None:
        return _pytorch_forward(m, impl, reason, input, output_size)
    recipe = type(self)._advisor_recipe  # type: ignore[attr-defined]
    if recipe is not None and recipe.pad is not None:
        input = recipe.pad(self, input)
    if output_padding is not None:
        return forward(self, input, tuple(m.padding), output_padding)  # type: ignore[arg-type]
    if m.padding_mode != "zeros":
        # What nn.ConvNd does: pad explicitly with the mode, then convolve without padding.
        input = F.pad(input, m._reversed_padding_repeated_twice, mode=m.padding_mode)
        return forward(self, input, (0,) * ndim, None)
    padding = m.padding if isinstance(m.padding, str) else tuple(m.padding)
    return forward(self, input, padding, None)


def _pytorch_forward(
    m: nn.modules.conv._ConvNd,
    impl: str,
    reason: str,
    input: Tensor,
    output_size: list[int] | None,
) -> Tensor:
    """The call computed by the original class's forward: PyTorch's own op, same parameters."""
    original = original_class(m)
    # Under torch.compile, logging would break the graph: the fallback is just traced there.
    if not torch.compiler.is_compiling():
        object.__setattr__(m, "fallbacks", getattr(m, "fallbacks", 0) + 1)
        if logger.isEnabledFor(logging.DEBUG):
            layer = f"{original.__name__}({m.extra_repr()})"
            logger.debug("%s under %s: PyTorch's conv computes this call: %s", layer, impl, reason)
    if m.transposed:
        return original.forward(m, input, output_size)
    return original.forward(m, input)


def conv_weight(module: nn.Module) -> Tensor:
    """The weight a swapped module's conv computes with: as its class's recipe transforms it,
    else `module.weight` (a parametrized one computed now, as PyTorch's forward would)."""
    recipe = getattr(type(module), "_advisor_recipe", None)
    if recipe is not None and recipe.weight is not None:
        return recipe.weight(module)
    weight = module.weight
    assert isinstance(weight, Tensor)
    return weight


def fallbacks(module: nn.Module) -> int:
    """How many calls of swapped `module` PyTorch's own conv computed (0 for a native module)."""
    count = getattr(module, "fallbacks", 0)
    return count if isinstance(count, int) else 0


def _rebuild(original: type[nn.Module], impl_name: str) -> nn.Module:
    # Unpickling imports this module, and so the `advisor.impls` package first, which registers
    # every built-in implementation's forward.
    cls = swapped_class(original, impl_name)
    return cls.__new__(cls)


def _reduce_ex(self: nn.Module, protocol: int) -> tuple:
    reduced = object.__reduce_ex__(self, protocol)
    cls = type(self)
    rebuild_args = (cls._advisor_original_class, cls._advisor_impl)  # type: ignore[attr-defined]
    return (_rebuild, rebuild_args, *reduced[2:])


# ---- helpers shared by the implementations ------------------------------------------------------


def resolve_padding(
    padding: Sequence[int] | int | str,
    kernel_size: Sequence[int],
    dilation: Sequence[int],
    stride: Sequence[int],
) -> list[tuple[int, int]]:
    """(left, right) zero padding per spatial dim; 'same' may be asymmetric, like PyTorch's."""
    ndim = len(kernel_size)
    if isinstance(padding, str):
        if padding == "valid":
            return [(0, 0)] * ndim
        if padding != "same":
            raise ValueError(f"unknown padding {padding!r}")
        if any(s != 1 for s in stride):
            raise ValueError("padding='same' is not supported for strided convolutions")
        pads = []
        for k, d in zip(kernel_size, dilation):
            total = d * (k - 1)
            pads.append((total // 2, total - total // 2))
        return pads
    if isinstance(padding, int):
        padding = (padding,) * ndim
    return [(p, p) for p in padding]


def conv_out_size(size: int, k: int, s: int, d: int, pad: tuple[int, int]) -> int:
    return (size + pad[0] + pad[1] - d * (k - 1) - 1) // s + 1


def conv_transpose_out_size(size: int, k: int, s: int, p: int, op: int, d: int) -> int:
    return (size - 1) * s - 2 * p + d * (k - 1) + op + 1


def ntuple(value: int | Sequence[int], ndim: int) -> tuple[int, ...]:
    return (value,) * ndim if isinstance(value, int) else tuple(value)


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The autocast dtype in force for `device_type`, or None when autocast is off."""
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def cast_for_autocast(*tensors: Tensor | None) -> tuple[Tensor | None, ...]:
    """Cast floating tensors as autocast would for a conv, for ops autocast does not cover
    (float64 excepted, as autocast does)."""
    first = next(t for t in tensors if t is not None)
    dtype = autocast_dtype(first.device.type)
    if dtype is None:
        return tensors
    return tuple(
        t.to(dtype) if t is not None and t.is_floating_point() and t.dtype != torch.float64 else t
        for t in tensors
    )


def conv_tf32(dtype: torch.dtype) -> bool:
    """Whether an implementation computes an fp32 conv in TF32 here. It replaces a cuDNN conv, so
    it follows PyTorch's *conv* TF32 flag (on under tf32="conv", PyTorch's default, and "on"),
    not the matmul one: the precision the settings give convs, and the gate's tf32 class."""
    return dtype == torch.float32 and GlobalFlags.conv_tf32()


FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class SwappingImpl(ConvImpl):
    """A `ConvImpl` whose `wrap` retargets the module's class (see `swap_module`).

    Subclasses say which layers they can run in `layer_reason` (device independent) and add the
    device and dtype rules in `why_not`; `wrap` refuses a layer `layer_reason` rejects.
    """

    class_prefix: ClassVar[str]
    # Functional forms with F.conv{N}d's / F.conv_transpose{N}d's argument order, for the default
    # `module_forward`; implementations with other signatures override `module_forward` instead.
    conv_fn: ClassVar[Callable[..., Tensor] | None] = None
    conv_transpose_fn: ClassVar[Callable[..., Tensor] | None] = None

    @abstractmethod
    def layer_reason(self, sig: ConvSignature) -> str | None:
        """None if the layer's kind and arguments are supported, else why not."""

    def why_not(
        self, sig: ConvSignature, *, device: torch.device, dtype: torch.dtype
    ) -> str | None:
        """Default rule: any floating dtype on any device, then the layer rules."""
        if dtype not in FLOAT_DTYPES:
            return f"dtype {dtype} is not a floating type"
        return self.layer_reason(sig)

    def call_why_not(
        self, module: nn.Module, input: Tensor, output_padding: list[int] | None
    ) -> str | None:
        """None if this implementation computes this call of `module`, else why not: PyTorch's
        own forward then computes it (see `_swapped_forward`). Subclasses add their own rules."""
        if input.dtype not in FLOAT_DTYPES:
            return f"input dtype {input.dtype} is not a supported floating type"
        ndim = len(module.kernel_size)  # type: ignore[arg-type]
        if input.numel() == 0 and 0 in input.shape[-ndim - 1 :]:
            # An empty channel or spatial dim (a zero batch is computed): PyTorch's error or result.
            return f"empty input {tuple(input.shape)} beyond its batch dim"
        return None

    def module_forward(
        self,
        module: nn.Module,
        input: Tensor,
        padding: tuple[int, ...] | str,
        output_padding: list[int] | None,
    ) -> Tensor:
        """The output of `module` for `input`, computed by this implementation."""
        m: nn.modules.conv._ConvNd = module  # type: ignore[assignment]
        weight = conv_weight(m)  # read once: a parametrized weight is computed on each read
        if output_padding is None:
            conv = type(self).conv_fn
            assert conv is not None, f"{self.name} has no conv_fn"
            return conv(input, weight, m.bias, m.stride, padding, m.dilation, m.groups)
        conv_t = type(self).conv_transpose_fn
        assert conv_t is not None, f"{self.name} has no conv_transpose_fn"
        return conv_t(
            input, weight, m.bias, m.stride, padding, output_padding, m.groups, m.dilation
        )

    def __init__(self) -> None:
        register_forward(self.name, self.class_prefix, self.module_forward, self.call_why_not)

    def wrap(self, module: nn.Module) -> nn.Module:
        reason = class_reason(module, self)
        if reason is not None:
            raise ImplError(f"{self.name} cannot run this layer: {reason}")
        sig = ConvSignature.from_module(module)
        reason = self.layer_reason(sig)
        if reason is not None:
            raise ImplError(f"{self.name} cannot run this {sig.kind}: {reason}")
        return swap_module(module, self.name)
