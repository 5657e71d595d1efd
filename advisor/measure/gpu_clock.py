"""The GPU's side of honest timing: an L2 flush between per-layer samples, clocks brought up
before the first measurement, and a spin kernel that holds the GPU while calls are queued
(`advisor.measure.timing.Sampler`)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from advisor.device.ops import cuda_ops, placement

__all__ = ["hold_gpu", "l2_flusher", "warm_device"]


class _L2Flusher:
    """Writes a buffer larger than L2 so a per-layer sample does not start from a warm cache."""

    def __init__(self, device: torch.device) -> None:
        ops = cuda_ops()
        l2 = getattr(ops.properties(ops.index_of(device)), "L2_cache_size", 50 * 2**20)
        self._buf = torch.zeros(  # written once: its memory is in use before a trial starts
            max(2 * l2, 64 * 2**20), dtype=torch.uint8, device=placement(device)
        )

    def __call__(self) -> None:
        self._buf.zero_()


def l2_flusher(device: torch.device) -> Callable[[], None] | None:
    return _L2Flusher(device) if device.type == "cuda" else None


def warm_device(device: torch.device) -> None:
    """Bring a GPU to its working clocks once per process before the first measurement: an idle
    GPU can sit at a few hundred MHz, and the first candidate (PyTorch's default) would be timed
    while the clocks ramp up."""
    global _WARMED
    if device.type != "cuda" or _WARMED:
        return
    _WARMED = True
    seconds = cuda_ops().warm_up_s
    a = torch.randn(2048, 2048, device=placement(device))
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ a  # noqa: B018 - the work is the point
        cuda_ops().synchronize(device)


_WARMED = False


def hold_gpu(device: torch.device, ms: float) -> None:
    """Keep the current stream busy for about `ms` (capped at 20 ms) with a spin kernel."""
    ops = cuda_ops()
    props = ops.properties(ops.index_of(device))
    khz = getattr(props, "clock_rate", 0) or 1_500_000  # cycles per ms
    ops.sleep(int(min(ms, 20.0) * khz))
