"""A CPU stand-in for the CUDA calls the advisor makes (`advisor.device.ops.CudaOps`).

It proves control flow, not speed: with `ADVISOR_DEVICE_OPS=tests.standins.cuda_on_cpu:CudaOnCpu`
the advisor takes every CUDA branch (device resolution, the worker's `set_device`, events,
synchronisation, memory statistics, the CUDA knobs and tolerances) while tensors live on the CPU.
Each call keeps the real one's contract where the advisor could get it wrong:

- `set_device` runs PyTorch's own index check (`torch.cuda._utils._get_device_index`, the check
  `torch.cuda.set_device` makes in Python), so a device without an index raises ValueError, and
  an index past the device count raises as CUDA does;
- `guard` accepts an index-less device (as `torch.cuda.device` does) and makes it current;
- an event must be recorded before `synchronize()` and `elapsed_time()`;
- `properties` rejects a device index that does not exist;
- after `poison()` (a model's forward can call it, as an illegal memory access would), every
  later call that touches the device raises the sticky error, as a CUDA context does.

`ADVISOR_STANDIN_LOG=path` appends one JSON line per `set_device`, `guard` and `event` call
(pid, call, argument), so a test can see which process did what.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import torch
from torch.cuda._utils import _get_device_index

from advisor.device.allocator import release_free_heap
from advisor.device.ops import CudaOps

STICKY = "CUDA error: an illegal memory access was encountered"


class HostEvent:
    """`torch.cuda.Event(enable_timing=True)` on the host clock."""

    def __init__(self, ops: CudaOnCpu) -> None:
        self._ops = ops
        self._t: float | None = None

    def record(self) -> None:
        self._ops._check()
        self._t = time.perf_counter()

    def synchronize(self) -> None:
        if self._t is None:
            raise RuntimeError("event has not been recorded")

    def elapsed_time(self, end: Any) -> float:
        if self._t is None or end._t is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end._t - self._t) * 1e3


def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class CudaOnCpu(CudaOps):
    name = "cuda stand-in (CPU)"
    warm_up_s = 0.0  # a CPU has no clocks to ramp up

    def __init__(self) -> None:
        self._count = int(os.environ.get("ADVISOR_STANDIN_GPUS", "1"))
        self._current = 0
        self._poisoned = False
        self._log = os.environ.get("ADVISOR_STANDIN_LOG")

    # ---- bookkeeping ---------------------------------------------------------------------------

    def _record(self, call: str, arg: Any) -> None:
        if self._log:
            with open(self._log, "a") as f:
                f.write(json.dumps({"pid": os.getpid(), "call": call, "arg": arg}) + "\n")

    def _check(self) -> None:
        if self._poisoned:
            raise RuntimeError(STICKY)

    def _valid(self, index: int) -> int:
        if not 0 <= index < self._count:
            raise RuntimeError("CUDA error: invalid device ordinal")
        return index

    def poison(self) -> None:
        """What an illegal memory access does to a CUDA context: every later call fails."""
        self._poisoned = True

    # ---- the calls ------------------------------------------------------------------------------

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return self._count

    def current_device(self) -> int:
        self._check()
        return self._current

    def set_device(self, device: torch.device | int) -> None:
        index = _get_device_index(device)  # PyTorch's own check: ValueError without an index
        self._record("set_device", str(device))
        self._check()
        self._current = self._valid(index)

    @contextlib.contextmanager
    def _guard(self, device: torch.device) -> Iterator[None]:
        index = _get_device_index(device, optional=True)  # index-less: the current device
        self._record("guard", str(device))
        before = self._current
        self._current = self._valid(before if index is None or index < 0 else index)
        try:
            yield
        finally:
            self._current = before

    def guard(self, device: torch.device) -> contextlib.AbstractContextManager[Any]:
        return self._guard(device)

    def properties(self, index: int) -> Any:
        self._valid(index)
        return SimpleNamespace(
            name="CUDA stand-in (CPU)",
            major=9,
            minor=0,
            total_memory=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            multi_processor_count=4,
            L2_cache_size=1 << 20,
            clock_rate=1_000_000,
        )

    def cudnn_version(self) -> int | None:
        return 91000

    def bf16_supported(self) -> bool:
        return True

    def synchronize(self, device: torch.device) -> None:
        self._check()
        self._valid(self.index_of(device))

    def event(self) -> HostEvent:
        self._record("event", None)
        return HostEvent(self)

    def sleep(self, cycles: int) -> None:
        self._check()  # the host clock has no queue to hold

    def reset_peak_memory(self, device: torch.device) -> None:
        self._check()
        # CUDA's peak counts allocations, not what the process holds: the heap's free pages
        # (glibc keeps them resident once settled: advisor.device.allocator) go back first
        release_free_heap()
        with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
            f.write("5")

    def memory_allocated(self, device: torch.device) -> int:
        self._check()
        return _rss_kb("VmRSS") * 1024

    def max_memory_allocated(self, device: torch.device) -> int:
        self._check()
        return _rss_kb("VmHWM") * 1024

    def empty_cache(self) -> None:
        self._check()

    def placement(self, device: torch.device) -> torch.device:
        self._valid(self.index_of(device))
        return torch.device("cpu")

    def autocast_type(self, device: torch.device) -> str:
        return "cpu"
