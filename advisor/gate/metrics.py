"""The numeric gate: a candidate's outputs and gradients against an fp32 reference (TF32 off)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; inf for NaN/Inf or a shape mismatch."""
    if out.shape != ref.shape:
        return math.inf
    a = out.detach().to(torch.float64)
    b = ref.detach().to(torch.float64)
    if not torch.isfinite(a).all():
        return math.inf
    denom = torch.linalg.vector_norm(b).item()
    num = torch.linalg.vector_norm(a - b).item()
    if denom == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / denom


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
        o = outs[k].detach().to(torch.float64)
        if o.shape != r.shape or not torch.isfinite(o).all():
            return math.inf
        r64 = r.detach().to(torch.float64)
        num += torch.linalg.vector_norm(o - r64).item() ** 2
        den += torch.linalg.vector_norm(r64).item() ** 2
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return math.sqrt(num / den)
