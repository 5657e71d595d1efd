"""Screened candidates kept built and warm for their full timing.

A screen (`advisor.search.screen`) builds each candidate, runs its first call and warm-up and takes
a few samples. Without the park a survivor would be built, first-called and warmed up again for
its full timing, fixed costs that can exceed its screen's samples. Kept here between the two, a
survivor's full timing starts from one re-warming call (`timing.measure(resume=...)`).

Only on a CPU, and within `CPU_BYTES` (at most an eighth of the memory free when the park is
made) of parameters, gradients, buffers and inputs: on a GPU a parked model's memory would be
taken from the candidates timed meanwhile (their allocator and cuDNN's workspaces), and a GPU
step long enough to be screened there (`screen.SCREEN_MIN_STEP_MS` and more) is rare. The park
is emptied where its candidates' workload stops being the one timed (a re-time, another
workload), and a candidate is taken from it once.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch

from advisor.knobs import Settings
from advisor.measure.candidate import Candidate
from advisor.measure.stats import Measurement

__all__ = ["CPU_BYTES", "Park", "Parked", "cpu_budget", "parks"]

CPU_BYTES = 1 << 30


def parks(device: torch.device) -> bool:
    """Whether screened candidates are parked on `device`: on a CPU only."""
    return device.type == "cpu"


def cpu_budget() -> int:
    """`CPU_BYTES`, or an eighth of the memory free now where that is less."""
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not POSIX, or not this name here
        return CPU_BYTES
    return min(CPU_BYTES, free // 8)


@dataclass
class Parked:
    """A screened candidate: built, warm, its flags put back; its screen and the memory it took."""

    cand: Candidate
    screen: Measurement
    peak_mb: float  # its peak above the memory in use before it was built
    first_call_peak_mb: float


def _held_bytes(cand: Candidate) -> int:
    module = cand.tuned.module
    tensors = [*module.parameters(), *module.buffers()]
    tensors += [p.grad for p in module.parameters() if p.grad is not None]
    tensors += [x for x in (*cand.inputs, *cand.kwargs.values()) if torch.is_tensor(x)]
    return sum(t.numel() * t.element_size() for t in tensors)


class Park:
    """Screened candidates by settings, for the run's current workload."""

    def __init__(self, device: torch.device, budget_bytes: int | None = None) -> None:
        self.device = device
        if not parks(device):
            self.budget = 0
        else:
            self.budget = cpu_budget() if budget_bytes is None else budget_bytes
        self._kept: dict[str, tuple[Parked, int]] = {}

    @property
    def held_bytes(self) -> int:
        return sum(size for _, size in self._kept.values())

    def keep(self, settings: Settings, parked: Parked) -> bool:
        """Keep a screened candidate (its flags are put back); False where it does not fit or
        is not parked here (a compiled model, a GPU): the caller closes it."""
        if self.budget <= 0 or settings.compiled:
            return False
        size = _held_bytes(parked.cand)
        key = settings.model_dump_json()
        if key in self._kept or self.held_bytes + size > self.budget:
            return False
        parked.cand.tuned.restore()
        self._kept[key] = (parked, size)
        return True

    def take(self, settings: Settings) -> Parked | None:
        """The parked candidate with these settings, its flags applied again; None if none."""
        got = self._kept.pop(settings.model_dump_json(), None)
        if got is None:
            return None
        got[0].cand.tuned.reapply()
        return got[0]

    def clear(self) -> None:
        """Close every parked candidate (each closing's failure is its own: ignored here)."""
        kept, self._kept = self._kept, {}
        for parked, _ in kept.values():
            with contextlib.suppress(Exception):  # a candidate nobody will time
                parked.cand.close()
