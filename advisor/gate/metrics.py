"""The numeric gate: a candidate's outputs and gradients against an fp32 reference (TF32 off)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; inf for NaN/Inf or a shape mismatch."""
    if out.shape != ref.shape:
        return math.inf
    num, denom = _norms(out, ref)
    if not math.isfinite(num):  # NaN or Inf in `out` (the norm of a finite difference is finite)
        return math.inf
    if denom == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / denom


def _norms(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """‖out − ref‖ and ‖ref‖, in float64: the difference is taken in float64 (type promotion,
    without a float64 copy of `out` first), so an fp32 error of 1e-7 is not rounded away."""
    b = ref.detach()
    b = b if b.dtype == torch.float64 else b.to(torch.float64)
    num = torch.linalg.vector_norm(torch.sub(out.detach(), b)).item()
    return num, torch.linalg.vector_norm(b).item()


def max_rel_error(
    outs: Sequence[torch.Tensor] | Mapping[str, torch.Tensor],
    refs: Sequence[torch.Tensor] | Mapping[str, torch.Tensor],
) -> float:
    """The worst relative error over matching tensors (by position or by name)."""
    if isinstance(refs, Mapping):
        assert isinstance(outs, Mapping)
        if set(outs) != set(refs):
            return math.inf
        pairs = [(outs[k], refs[k]) for k in refs]
    else:
        if len(outs) != len(refs):
            return math.inf
        pairs = list(zip(outs, refs, strict=True))  # type: ignore[arg-type]
    return max((rel_error(o, r) for o, r in pairs), default=0.0)


def global_rel_error(outs: Mapping[str, torch.Tensor], refs: Mapping[str, torch.Tensor]) -> float:
    """‖all out − all ref‖ / ‖all ref‖ over every named tensor together (e.g. all gradients).

    Per-tensor errors mislead for gradients: a conv bias followed by BatchNorm has a true gradient
    of zero, so its reference is pure rounding noise and any relative error is huge.
    """
    if set(outs) != set(refs):
        return math.inf
    if not refs:
        return 0.0
    num = den = 0.0
    for k, r in refs.items():
        if outs[k].shape != r.shape:
            return math.inf
        n, d = _norms(outs[k], r)
        if not math.isfinite(n):
            return math.inf
        num += n**2
        den += d**2
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return math.sqrt(num / den)
