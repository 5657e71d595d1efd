"""A model that runs 4x slower while several copies of it are alive at once: that is the re-time
of the finalists (they are held together, interleaved), not the trials (one at a time). What a
machine that gets busy half-way through tuning does to every candidate, made deterministic.
It is 2x faster on channels_last inputs, busy or not: the trials always find a finalist to re-time
against the default (with nothing that can win, nothing is re-timed), and the re-time confirms it,
so only the machine's moving keeps the default."""

import gc
import time
import weakref

import torch
from torch import nn

from tests.hostile.models._net import example_inputs, net  # noqa: F401

ALIVE: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()


class SlowsDown(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = net()
        gc.collect()  # models of finished trials (or of an earlier run) held only by cycles
        ALIVE.add(self)

    def forward(self, x):  # noqa: ANN001, ANN201
        busy = 4 if len(ALIVE) >= 2 else 1
        time.sleep(busy * (0.001 if x.is_contiguous(memory_format=torch.channels_last) else 0.002))
        return self.body(x)


def build_model() -> nn.Module:
    return SlowsDown()
