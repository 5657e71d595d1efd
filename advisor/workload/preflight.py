"""The workload's sizes checked before it is made: every shape it will allocate (each shape of a
shape set, each batch size), on the CPU, where inputs are made first, and on the device.

`check_workload_sizes` takes the workload options as `workload.args.make_workload` does; each problem is
a one-line SpecError naming the tensor, its shape and its size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from advisor.device.environment import resolve_device
from advisor.errors import SpecError
from advisor.workload.layer_spec import layer_spec
from advisor.workload.sizes import check_bytes, check_int64, numel, shape_of, short

__all__ = ["check_workload_sizes"]


def _shape(s: Any, option: str) -> tuple[int, ...]:
    try:
        shape = shape_of(s)
    except ValueError as e:
        raise SpecError(f"{option}: {e}") from None
    check_int64(shape, f"{option} dimension")
    return shape


def check_workload_sizes(
    device: str | torch.device | None,
    *,
    layer: str | dict[str, Any] | None = None,
    layer_file: str | None = None,
    input_shape: Any = None,
    input_shapes: Sequence[Any] | None = None,
    batch_sizes: Sequence[int] | None = None,
    dtype: str | None = None,
    first_layer: bool = False,
    **_others: Any,
) -> None:
    """Reject, before the workload is made, any shape it would allocate that cannot fit here.

    A layer: its input, weight and output at every shape of the set. A model file or live model:
    its inputs are known only once it is loaded (running the user's code), so each shape or batch
    size is checked at one byte per element, the least any input of that shape needs."""
    dev = resolve_device(device)
    shapes = [_shape(s, "--input-shape") for s in input_shapes or []]
    batches = [int(b) for b in batch_sizes or []]
    check_int64(batches, "batch size")
    if layer is not None or layer_file is not None:
        base = input_shape if input_shape is not None else (input_shapes or [None])[0]
        spec = layer_spec(
            layer, input_shape=base, dtype=dtype, file=layer_file, first_layer=first_layer
        )
        spec.check_fits(dev)
        for shape in shapes:
            spec.check_fits(dev, shape)
        for b in batches:
            spec.check_fits(dev, (b, *spec.input_shape[1:]))
        return
    for shape in shapes:
        dims = short("x".join(str(d) for d in shape))
        check_bytes(f"input {dims} needs at least", numel(shape), dev)
    for b in batches:
        check_bytes(f"batch size {short(b)}: its inputs need at least", b, dev)
