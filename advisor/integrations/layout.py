"""Inputs in the tuned memory format, for frameworks that hand the batch to the model themselves.

Only channels_last needs work: a contiguous input is PyTorch's default. Conversion follows
`Tuned.inputs`: every 4-D tensor becomes channels_last and every 5-D one channels_last_3d (the
first conv is then fed what it was timed with; a Conv3d with a channels_last_3d weight does not
convert a contiguous input itself on a CPU, so its whole network would stay contiguous).
"""

from __future__ import annotations

from typing import Any

import torch

from advisor.knobs import memory_format_for


def _converted(x: torch.Tensor) -> torch.Tensor | None:
    """`x` in channels_last(_3d), or None where it has no such layout or already has it."""
    fmt = memory_format_for(x.dim(), "channels_last")
    if fmt is None or x.is_contiguous(memory_format=fmt):
        return None
    return x.contiguous(memory_format=fmt)


def to_channels_last_in_place(batch: Any) -> None:
    """Give every 4-D/5-D tensor in `batch` (nested lists, tuples, dicts) the channels_last
    layout in place. In place because a Lightning callback's batch hooks cannot return a new
    batch; assigning `.data` gives the same tensor object new strides, its values unchanged."""
    if torch.is_tensor(batch):
        new = _converted(batch)
        if new is not None:
            batch.data = new
    elif isinstance(batch, dict):
        for value in batch.values():
            to_channels_last_in_place(value)
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            to_channels_last_in_place(value)


class ChannelsLastInputs:
    """A forward pre-hook (`register_forward_pre_hook(hook, with_kwargs=True)`) giving the
    model's top-level tensor inputs, positional and keyword, the channels_last layout. A class,
    not a closure, so a model carrying it still pickles (`torch.save(model)`)."""

    def __call__(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return tuple(map(_layout, args)), {k: _layout(v) for k, v in kwargs.items()}


def _layout(x: Any) -> Any:
    if not torch.is_tensor(x):
        return x
    new = _converted(x)
    return x if new is None else new
