"""PyTorch's process-wide state that a candidate's step could change, saved and put back.

A user's `forward` may call `torch.set_num_threads(1)`, switch deterministic algorithms on, leave
autocast enabled or change the default dtype; without this, every later trial (and the re-time)
would run under it. The flags the advisor sets itself go through `knobs.GlobalFlags`; this module puts them back
too, with everything else a step could change.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from advisor.device.flags import read_flags, write_flags

__all__ = ["global_state", "global_state_kept", "restore_global_state"]

_AUTOCAST_DEVICES = ("cpu", "cuda")


def global_state() -> dict[str, Any]:
    """Everything `restore_global_state` puts back, as plain values (comparable with ==)."""
    state: dict[str, Any] = {
        **read_flags(),
        "default_dtype": torch.get_default_dtype(),
        "grad_enabled": torch.is_grad_enabled(),
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_enabled": torch.backends.cudnn.enabled,
        "mkldnn_enabled": torch.backends.mkldnn.enabled,
        "anomaly": torch.is_anomaly_enabled(),
        "autocast_cache": torch.is_autocast_cache_enabled(),
    }
    for dev in _AUTOCAST_DEVICES:
        state[f"autocast_{dev}"] = (
            torch.is_autocast_enabled(dev),
            torch.get_autocast_dtype(dev),
        )
    return state


def restore_global_state(saved: dict[str, Any]) -> None:
    """Put back what `global_state()` saved, so nothing leaks from one trial into the next."""
    torch.clear_autocast_cache()  # weights cast under one candidate's autocast, not the next's
    now = global_state()
    if now == saved:
        return
    write_flags(saved)
    torch.set_default_dtype(saved["default_dtype"])
    torch.set_grad_enabled(saved["grad_enabled"])
    if now["threads"] != saved["threads"]:
        torch.set_num_threads(saved["threads"])
    if now["interop_threads"] != saved["interop_threads"]:
        with contextlib.suppress(RuntimeError):  # only settable before inter-op work starts
            torch.set_num_interop_threads(saved["interop_threads"])
    deterministic = ("deterministic", "deterministic_warn_only")
    if any(now[k] != saved[k] for k in deterministic):
        # only where it changed: the setter imports Inductor's config, and with it Inductor
        # (seconds on a small CPU), in a process that may compile nothing
        torch.use_deterministic_algorithms(
            saved["deterministic"], warn_only=saved["deterministic_warn_only"]
        )
    torch.backends.cudnn.deterministic = saved["cudnn_deterministic"]
    torch.backends.cudnn.enabled = saved["cudnn_enabled"]
    torch.backends.mkldnn.enabled = saved["mkldnn_enabled"]
    torch.set_anomaly_enabled(saved["anomaly"])
    torch.set_autocast_cache_enabled(saved["autocast_cache"])
    for dev in _AUTOCAST_DEVICES:
        enabled, dtype = saved[f"autocast_{dev}"]
        with contextlib.suppress(RuntimeError, AttributeError):  # e.g. no CUDA in this build
            torch.set_autocast_enabled(dev, enabled)
            torch.set_autocast_dtype(dev, dtype)


@contextlib.contextmanager
def global_state_kept() -> Iterator[None]:
    """PyTorch's process-wide state as it was before, put back after what runs within."""
    saved = global_state()
    try:
        yield
    finally:
        restore_global_state(saved)
