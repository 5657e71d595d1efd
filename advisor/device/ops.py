"""Every call the advisor makes to the CUDA runtime, in one object.

The advisor's CUDA paths run only on a GPU, and a path that never ran can crash on its first call
(`torch.cuda.set_device(torch.device("cuda"))` raises). With every device call behind one object,
the CPU test suite drives the same control flow through a stand-in that keeps each real call's
contract (`tests/standins/cuda_on_cpu.py`: its `set_device` still rejects a device without an
index, its events still need a `record()` before `elapsed_time()`), with tensors placed on the CPU.

`ADVISOR_DEVICE_OPS=module:attribute` names a `CudaOps` subclass to use instead: this process and
the workers it spawns (they inherit the environment) then talk to it. Only tests set it.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from functools import lru_cache
from typing import Any, Protocol

import torch

__all__ = ["CudaOps", "Event", "autocast_type", "cuda_ops", "device_guard", "placement"]

ENV = "ADVISOR_DEVICE_OPS"


class Event(Protocol):
    """What the advisor uses of `torch.cuda.Event(enable_timing=True)`."""

    def record(self) -> None: ...

    def synchronize(self) -> None: ...

    def elapsed_time(self, end: Any) -> float: ...


class CudaOps:
    """The real CUDA calls. A stand-in subclasses this and keeps each method's contract."""

    name = "cuda"
    warm_up_s = 1.0  # busy work before the first measurement in a process (`gpu_clock.warm_device`)

    def is_available(self) -> bool:
        return torch.cuda.is_available()

    def device_count(self) -> int:
        return torch.cuda.device_count()

    def current_device(self) -> int:
        return torch.cuda.current_device()

    def started(self) -> list[int]:
        """The current device's index where CUDA is up in this process, else none (reading its
        generator's state, say, would start it)."""
        return [torch.cuda.current_device()] if torch.cuda.is_initialized() else []

    def index_of(self, device: torch.device) -> int:
        """The device's index; an index-less `cuda` means the current device (as PyTorch's
        own `torch.device("cuda")` tensors do)."""
        return device.index if device.index is not None else self.current_device()

    def set_device(self, device: torch.device | int) -> None:
        """torch.cuda.set_device: needs an index (a bare `cuda` device raises ValueError)."""
        torch.cuda.set_device(device)

    def make_current(self, device: torch.device) -> None:
        """Make `device` this process's current device for good (a worker's whole life)."""
        self.set_device(self.index_of(device))

    def guard(self, device: torch.device) -> contextlib.AbstractContextManager[Any]:
        """`device` is the current one inside (events, streams and Triton launches use it)."""
        return torch.cuda.device(device)

    def properties(self, index: int) -> Any:
        """torch.cuda.get_device_properties: name, major, minor, total_memory,
        multi_processor_count, L2_cache_size, clock_rate (the last two may be missing)."""
        return torch.cuda.get_device_properties(index)

    def cudnn_version(self) -> int | None:
        return torch.backends.cudnn.version()

    def bf16_supported(self) -> bool:
        return torch.cuda.is_bf16_supported()

    def synchronize(self, device: torch.device) -> None:
        torch.cuda.synchronize(device)

    def event(self) -> Event:
        return torch.cuda.Event(enable_timing=True)

    def sleep(self, cycles: int) -> None:
        """Keep the current stream busy for about `cycles` GPU clock cycles."""
        torch.cuda._sleep(cycles)

    def reset_peak_memory(self, device: torch.device) -> None:
        torch.cuda.reset_peak_memory_stats(device)

    def memory_allocated(self, device: torch.device) -> int:
        return torch.cuda.memory_allocated(device)

    def max_memory_allocated(self, device: torch.device) -> int:
        return torch.cuda.max_memory_allocated(device)

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def placement(self, device: torch.device) -> torch.device:
        """Where tensors for `device` live (the device itself; the CPU for a stand-in)."""
        return device

    def autocast_type(self, device: torch.device) -> str:
        """The device type autocast and GradScaler are given for `device`."""
        return device.type


@lru_cache(maxsize=1)
def cuda_ops() -> CudaOps:
    """The CUDA calls in use in this process: the real ones, or the stand-in `$ADVISOR_DEVICE_OPS`
    names."""
    spec = os.environ.get(ENV)
    if not spec:
        return CudaOps()
    module, _, attr = spec.partition(":")
    ops = getattr(importlib.import_module(module), attr or "OPS")
    ops = ops() if isinstance(ops, type) else ops
    if not isinstance(ops, CudaOps):
        raise TypeError(f"${ENV}={spec!r} is not a CudaOps")
    return ops


def placement(device: torch.device) -> torch.device:
    """Where tensors for `device` are put: the device itself, but for a CUDA stand-in."""
    return cuda_ops().placement(device) if device.type == "cuda" else device


def autocast_type(device: torch.device) -> str:
    """The device type for `torch.autocast` / `torch.amp.GradScaler` on `device`."""
    return cuda_ops().autocast_type(device) if device.type == "cuda" else device.type


def device_guard(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Make `device` the current CUDA device inside: CUDA events, streams and Triton launches use
    the current device, so with `--device cuda:1` and nothing set they would time (and run on)
    device 0. Nothing on other devices."""
    if device.type == "cuda":
        return cuda_ops().guard(device)
    return contextlib.nullcontext()
