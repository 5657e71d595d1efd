"""Run one call of a conv module swapped to an implementation against the PyTorch module.

`compare` calls the swapped module and a reference copy of the original (in a reference dtype,
float64 by default) on the same values, forward and backward, and returns the relative error of
the output and of every gradient, and how many calls fell back to PyTorch's own op.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.modules.lazy import LazyModuleMixin

from advisor import impls
from advisor.impls import _swap
from advisor.workload.copying import copy_module


@dataclass
class Outcome:
    """What one call gave: relative errors by name, fallbacks, and PyTorch's own error if any."""

    errors: dict[str, float] = field(default_factory=dict)
    fallbacks: int = 0
    pytorch_raised: str | None = None

    @property
    def worst(self) -> float:
        return max(self.errors.values(), default=0.0)


def rel_err(out: Tensor, ref: Tensor) -> float:
    """|out - ref| / |ref| (complex too), in the reference's dtype; 0 for empty tensors."""
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert torch.isfinite(out).all(), "NaN or Inf in the output (an element left unwritten?)"
    denom = ref.norm().item()
    return (out.to(ref.dtype) - ref).norm().item() / max(denom, 1e-30)


def _leaves(module: nn.Module, x: Tensor) -> list[Tensor]:
    params = [p for p in module.parameters() if p.requires_grad]
    return ([x] if x.requires_grad else []) + params


def _run(
    module: nn.Module, x: Tensor, kwargs: dict[str, Any], gy: Tensor | None
) -> tuple[list[Tensor], Tensor]:
    """[output, grads...] of one call, and the upstream gradient used (made here if None)."""
    out = module(x, **kwargs)
    if gy is None:
        gen = torch.Generator().manual_seed(1)
        gy = torch.randn(out.shape, generator=gen, dtype=out.dtype)  # the reference dtype
    leaves = _leaves(module, x)
    grads = torch.autograd.grad(out, leaves, gy.to(out.dtype), allow_unused=True)
    # An unused leaf (a zero batch can leave one out of the graph) has a zero gradient.
    filled = [torch.zeros_like(t) if g is None else g for g, t in zip(grads, leaves)]
    return [out.detach(), *filled], gy


def _names(module: nn.Module, x: Tensor) -> list[str]:
    params = [n for n, p in module.named_parameters() if p.requires_grad]
    return ["output", *(["input grad"] if x.requires_grad else []), *(f"{n} grad" for n in params)]


def compare(
    module: nn.Module,
    impl: str,
    x: Tensor,
    kwargs: dict[str, Any] | None = None,
    *,
    ref_dtype: torch.dtype = torch.float64,
    seed: int = 0,
) -> Outcome:
    """Call `module` swapped to `impl` on `x` (and `kwargs`) and PyTorch's module in `ref_dtype`.

    `module` is left as it is (copies are swapped). A lazy module is initialised by the call, from
    the same seed in both copies, so both get the same parameters.
    """
    kwargs = kwargs or {}
    if x.is_complex():
        ref_dtype = torch.complex128
    swapped = impls.swap(copy_module(module), impl)  # deepcopy, also of a hook-normed conv
    ref = copy_module(module)
    try:
        if isinstance(ref, LazyModuleMixin) and ref.has_uninitialized_params():
            torch.manual_seed(seed)
            with torch.no_grad():
                ref(x.detach(), **kwargs)  # initialised in the call's dtype, as the swapped one
        ref = ref.to(ref_dtype)
        xr = x.detach().to(ref_dtype).requires_grad_(x.requires_grad)
        want, gy = _run(ref, xr, kwargs, None)
    except Exception as exc:  # PyTorch refuses this call: nothing to hold the swap to
        return Outcome(pytorch_raised=f"{type(exc).__name__}: {exc}")
    torch.manual_seed(seed)
    got, _ = _run(swapped, x, kwargs, gy)
    assert got[0].dtype == x.dtype, f"output dtype {got[0].dtype} for input dtype {x.dtype}"
    names = _names(swapped, x)
    errors = {name: rel_err(g, w) for name, g, w in zip(names, got, want)}
    return Outcome(errors=errors, fallbacks=_swap.fallbacks(swapped))
