"""A model whose first calls in a process are slow on purpose: a large one-time cost, paid over
its first calls, with no other load. What a workload's first measurement in a process meets
(pages first touched, oneDNN's primitives created for each pass, caches filled), made
deterministic: the n-th call in a process with a memory format (n from 0) takes its steady time
plus EXTRA_MS * DECAY**n (150 ms, then 128, 108, 92, ...: still about 4x the steady
time at the 10th).

channels_last runs 2x faster than contiguous once warm: the measured winner. Each call sleeps
until its scripted time is up after a 1x1 conv on a tiny input (a sleep does not stretch when
the CPU is busy), so the figures hold on a loaded machine too."""

import time
from collections import Counter

import torch
from torch import nn

STEADY_MS = {True: 5.0, False: 10.0}  # a warm call on channels_last inputs, on contiguous ones
EXTRA_MS = 150.0
DECAY = 0.85
CALLS: Counter = Counter()  # calls made in this process, per memory format


class SlowFirstCalls(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Conv2d(3, 4, 1)

    def forward(self, x):  # noqa: ANN001, ANN201
        start = time.perf_counter()
        out = self.body(x)
        fmt = x.is_contiguous(memory_format=torch.channels_last)
        ms = STEADY_MS[fmt] + EXTRA_MS * DECAY ** CALLS[fmt]
        CALLS[fmt] += 1
        time.sleep(max(0.0, start + ms / 1e3 - time.perf_counter()))
        return out


def build_model() -> nn.Module:
    return SlowFirstCalls()


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(1, 3, 4, 4),)
