"""A model that gets slower with every call while several copies of it are alive at once: that
is the re-time of the finalists (they are held together, interleaved), not the trials (one at a
time). What a machine that gets busier and busier under the measurements does to every
candidate, made deterministic: PyTorch's default drifts across the re-time's own rounds (and so
the advisor can tell it from a trial that was merely cold). It is 10x faster on channels_last
inputs, busy or not: the trials always find a finalist to re-time against the default (with
nothing that can win, nothing is re-timed), and the re-time confirms it, so only the machine's
moving keeps the default.

Each call takes its scripted time whatever else runs on the machine: its one conv is a 1x1 on a
1x3x4x4 input (microseconds, run on one thread: a multi-threaded conv on a machine with every core
busy waits for its second thread, tens of milliseconds), and the call then sleeps until its time
is up (a sleep does not stretch when the CPU is busy)."""

import gc
import time
import weakref

import torch
from torch import nn

ALIVE: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()
QUIET_MS = {True: 2.0, False: 20.0}  # a call on channels_last inputs, on contiguous ones
RAMP = 1.25  # while another copy is alive, each call is this much slower than the one before,
BUSY = 10  # up to this much slower than quiet
BUSY_CALLS = [0]  # calls made while another copy was alive


class SlowsDown(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Conv2d(3, 4, 1)
        gc.collect()  # models of finished trials (or of an earlier run) held only by cycles
        ALIVE.add(self)
        # A closure it keeps: the advisor never copies such a model but builds it each time
        # (advisor.workload.copying), so no model it copies from stays alive beside the trials.
        alive = ALIVE
        self.copies_alive = lambda: len(alive)

    def forward(self, x):  # noqa: ANN001, ANN201
        start = time.perf_counter()
        out = self.body(x)
        ms = QUIET_MS[x.is_contiguous(memory_format=torch.channels_last)]
        if len(ALIVE) >= 2:
            ms *= min(BUSY, RAMP ** BUSY_CALLS[0])
            BUSY_CALLS[0] += 1
        time.sleep(max(0.0, start + ms / 1e3 - time.perf_counter()))
        return out


def build_model() -> nn.Module:
    return SlowsDown()


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(1, 3, 4, 4),)
