"""Absurd sizes, rejected before anything is allocated: a tensor larger than this machine could
ever hold (its total RAM; on CUDA, also the device's memory), and integers beyond int64.

Each problem is a one-line SpecError naming the tensor, its shape and its size. `preflight`
applies these checks to a whole workload before it is made.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from advisor.device.environment import memory_limit
from advisor.errors import SpecError

__all__ = [
    "INT64_MAX",
    "check_bytes",
    "check_int64",
    "check_tensor_fits",
    "format_bytes",
    "numel",
    "shape_of",
    "short",
]

INT64_MAX = 2**63 - 1


def short(v: Any, limit: int = 60) -> str:
    """`v` as text, cut to `limit` characters."""
    text = str(v)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shape_of(v: Any) -> tuple[int, ...]:
    """'8,3,64,64' or '8x3x64x64' (an empty part is a typo, not a separator), or a sequence of
    integers, as a shape; ValueError naming the text otherwise."""
    if not isinstance(v, str):
        return tuple(int(p) for p in v)
    try:
        return tuple(int(p) for p in v.replace("x", ",").split(","))
    except ValueError:
        raise ValueError(f"not a comma-separated list of integers: {short(v)!r}") from None


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


def numel(shape: Sequence[int]) -> int:
    """Elements in a tensor of `shape` (negative sizes count as 0)."""
    count = 1
    for d in shape:
        count *= max(int(d), 0)
    return count


def check_tensor_fits(
    what: str, shape: Sequence[int], dtype: torch.dtype, device: str | torch.device = "cpu"
) -> None:
    """SpecError naming `what`, its shape and size when a tensor of `shape` and `dtype` is larger
    than this machine could hold (total RAM; on CUDA, also the device's memory)."""
    nbytes = numel(shape) * torch.empty((), dtype=dtype).element_size()
    dims = short("x".join(str(d) for d in shape))
    check_bytes(f"{what} {dims} ({str(dtype).removeprefix('torch.')}) needs", nbytes, device)
