"""A workload spread over several input shapes (variable image sizes) or batch sizes, weighted:
the search's objective becomes the weighted sum of the per-shape median times."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from advisor.errors import SpecError, first_line
from advisor.workload.build import ShapeCase, Workload
from advisor.workload.info import ShapeSetInfo
from advisor.workload.model_file import check_runs

__all__ = ["with_shape_set"]


def _resized(x: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """A tensor of `shape` like `x`: floating values are redrawn later (`fresh_like`), so only
    the shape matters; integer and bool values (ids, masks) are `x`'s, repeated or cut along
    each dimension (zeros where the number of dimensions changes)."""
    shape = tuple(shape)
    if x.is_floating_point() or x.is_complex():
        return torch.empty(shape, dtype=x.dtype)
    if x.dim() != len(shape) or 0 in x.shape:
        return torch.zeros(shape, dtype=x.dtype)
    for d, n in enumerate(shape):
        x = x.index_select(d, torch.arange(n) % x.shape[d])
    return x.contiguous()


def _reshaped(
    case: ShapeCase, shape: Sequence[int] | None, batch: int | None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Example inputs with the first tensor's shape replaced (positional inputs first), or the
    batch size of every tensor that has one, keyword inputs included. The examples' batch size
    is the leading dimension of the first tensor with two or more (a batch of vectors at
    least); a tensor whose leading dimension differs (per-channel values) is left as it is."""
    tensors = case.tensors
    batched = [x for x in tensors if x.dim() > 1] or [x for x in tensors if x.dim() > 0]
    example_batch = batched[0].shape[0] if batched else None
    first = tensors[0] if tensors else None

    def one(x: Any) -> Any:
        if not torch.is_tensor(x):
            return x
        if shape is not None and x is first:
            return _resized(x, shape)
        if batch is not None and x.dim() > 0 and x.shape[0] == example_batch:
            return _resized(x, (batch, *x.shape[1:]))
        return x

    return tuple(one(x) for x in case.inputs), {k: one(v) for k, v in case.kwargs.items()}


def with_shape_set(
    workload: Workload,
    *,
    shapes: Sequence[Sequence[int]] | None = None,
    batch_sizes: Sequence[int] | None = None,
    weights: Sequence[float] | None = None,
) -> Workload:
    """The workload over several input shapes (variable image sizes) or batch sizes, weighted.

    The search's objective becomes the weighted sum of the per-shape median times.
    """
    if shapes and batch_sizes:
        raise SpecError("give several input shapes or several batch sizes, not both")
    variants: list[tuple[Sequence[int] | None, int | None]] = (
        [(s, None) for s in shapes] if shapes else [(None, b) for b in batch_sizes or []]
    )
    if not variants and not weights:
        return workload
    w = list(weights) if weights else [1.0] * len(variants)
    if len(w) != len(variants):
        raise SpecError(f"{len(w)} shape weights for {len(variants)} shapes")
    if any(x <= 0 for x in w):
        raise SpecError("shape weights must be positive")
    if any(b <= 0 for _, b in variants if b is not None):
        raise SpecError("batch sizes must be positive")
    example = ShapeCase(1.0, workload.example_inputs, workload.example_kwargs)
    cases = tuple(
        ShapeCase(float(wi), *_reshaped(example, s, b))
        for wi, (s, b) in zip(w, variants, strict=True)
    )
    _check_cases(workload, cases)
    shape_set = ShapeSetInfo(
        shapes=[list(s) for s in shapes] if shapes else None,
        batch_sizes=list(batch_sizes) if batch_sizes else None,
        weights=w,
        input_shapes=[[list(x.shape) for x in c.tensors] for c in cases],
    )
    description = f"{workload.info.description} over {len(cases)} shapes"
    info = workload.info.model_copy(update={"shape_set": shape_set, "description": description})
    return Workload(
        description,
        info,
        workload.make_model,
        cases[0].inputs,
        cases,
        workload.input_grad,
        workload.input_layout,
        cases[0].kwargs,
    )


def _check_cases(workload: Workload, cases: tuple[ShapeCase, ...]) -> None:
    """Every shape must run: a bad shape is bad input, not a failed trial."""
    model = workload.make_model()
    for case in cases:
        shapes = [tuple(x.shape) for x in case.tensors]
        try:
            check_runs(model, case.inputs, case.kwargs)
        except Exception as e:  # noqa: BLE001 - user model: any failure is a bad shape
            raise SpecError(
                f"the workload fails on input shape {shapes}: {first_line(e, with_type=False)}"
            ) from None
