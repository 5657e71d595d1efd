"""Absurd sizes, rejected before anything is allocated: a tensor larger than this machine could
ever hold (its total RAM; on CUDA, also the device's memory), and integers beyond int64.

`check_workload_sizes` takes the workload options as `service.make_workload` does and checks every
shape the workload will allocate (each shape of a shape set, each batch size) on the CPU, where
inputs are made first, and on the device. Each problem is a one-line SpecError naming the tensor,
its shape and its size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from advisor.environment import memory_limit, resolve_device
from advisor.errors import SpecError

__all__ = [
    "INT64_MAX",
    "check_bytes",
    "check_int64",
    "check_tensor_fits",
    "check_workload_sizes",
    "format_bytes",
]

INT64_MAX = 2**63 - 1


def short(v: Any, limit: int = 60) -> str:
    """`v` as text, cut to `limit` characters."""
    text = str(v)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def format_bytes(n: int) -> str:
    """1099511627776 -> '1.0 TiB'."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.3g} EiB"


def check_int64(values: Sequence[int], what: str) -> None:
    """SpecError when a value does not fit in a 64-bit integer (what PyTorch sizes are)."""
    for v in values:
        if abs(v) > INT64_MAX:
            raise SpecError(f"{what} {short(v)} does not fit in a 64-bit integer")


def check_bytes(label: str, nbytes: int, device: str | torch.device = "cpu") -> None:
    """SpecError "{label} {nbytes}; this machine has ..." when `nbytes` is more than this machine
    could hold: its total RAM (inputs are made on the CPU first) and, on CUDA, the device's."""
    dev = torch.device(device)
    for where in ("cpu", dev) if dev.type != "cpu" else ("cpu",):
        limit = memory_limit(where)
        if limit is not None and nbytes > limit[0]:
            raise SpecError(
                f"{label} {format_bytes(nbytes)}; "
                f"this machine has {format_bytes(limit[0])} of {limit[1]}"
            )


def _numel(shape: Sequence[int]) -> int:
    numel = 1
    for d in shape:
        numel *= max(int(d), 0)
    return numel


def check_tensor_fits(
    what: str, shape: Sequence[int], dtype: torch.dtype, device: str | torch.device = "cpu"
) -> None:
    """SpecError naming `what`, its shape and size when a tensor of `shape` and `dtype` is larger
    than this machine could hold (total RAM; on CUDA, also the device's memory)."""
    nbytes = _numel(shape) * torch.empty((), dtype=dtype).element_size()
    dims = short("x".join(str(d) for d in shape))
    check_bytes(f"{what} {dims} ({str(dtype).removeprefix('torch.')}) needs", nbytes, device)


def _shape(s: Any, option: str) -> tuple[int, ...]:
    if isinstance(s, str):
        try:
            shape = tuple(int(p) for p in s.replace("x", ",").split(",") if p.strip())
        except ValueError:
            raise SpecError(
                f"{option}: not a comma-separated list of integers: {short(s)!r}"
            ) from None
    else:
        shape = tuple(int(v) for v in s)
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
        from advisor.layer_spec import layer_spec  # layer_spec imports this module

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
        check_bytes(f"input {dims} needs at least", _numel(shape), dev)
    for b in batches:
        check_bytes(f"batch size {short(b)}: its inputs need at least", b, dev)
