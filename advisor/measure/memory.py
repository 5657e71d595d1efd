"""A trial's own peak memory: CUDA allocations on a GPU, resident memory (the kernel's peak-RSS
mark, restarted per trial) on a CPU."""

from __future__ import annotations

import contextlib
import resource
import sys

import torch

from advisor.device.allocator import release_free_heap
from advisor.device.ops import cuda_ops

__all__ = ["PeakMemory"]


def _reset_peak_rss() -> None:
    """Linux: restart the peak-RSS mark (VmHWM) at the current RSS, so the next peak read is this
    trial's own. ru_maxrss cannot be reset, and a spawned worker inherits its parent's."""
    release_free_heap()
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _peak_rss_mb() -> float:
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024 if sys.platform != "darwin" else kb / 2**20


class PeakMemory:
    """A trial's own peak memory above what was in use when it started: CUDA allocations on a
    GPU, resident memory on a CPU. The first call's one-off buffers (Triton autotuning's 256 MiB
    benchmark buffer, cuDNN's benchmark workspaces) are not the candidate's working set: the
    peak is restarted after it (`after_first`) and the first call's own peak kept apart."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.first_call_mb = 0.0
        self._restart()
        self.rss0 = _peak_rss_mb()
        self.mem0 = cuda_ops().memory_allocated(device) if device.type == "cuda" else 0

    def _restart(self) -> None:
        if self.device.type == "cuda":
            cuda_ops().reset_peak_memory(self.device)
        else:
            _reset_peak_rss()

    def growth_mb(self) -> float:
        if self.device.type == "cuda":
            return (cuda_ops().max_memory_allocated(self.device) - self.mem0) / 2**20
        return max(0.0, _peak_rss_mb() - self.rss0)

    def after_first(self) -> None:
        self.first_call_mb = max(self.first_call_mb, self.growth_mb())
        self._restart()
