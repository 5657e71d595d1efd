"""The mirror of wins_when_worn.py: a model whose channels_last *loses* in a process that has
built it many times (the advisor's worker: the fp32 reference, each trial and each re-time build
one) and wins in a fresh process that builds it three times (the workload, then the default and
the challenger, as `advisor.apply` in a user's process would). The search keeps PyTorch's default;
the final check times its challenger where the user runs it and must recommend it. Deterministic
with sleeps: worn, channels_last 65 ms against 50 (1.3x slower: above the bar, within the race); fresh, 5 ms against 50 (10x)."""

import time

import torch
from torch import nn

BUILT = 0  # models built in this process
WORN = 4  # from the fourth model on, channels_last "loses" (a fresh check builds 3)


class LosesWhenWorn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        global BUILT
        BUILT += 1
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        # A closure it keeps: the advisor never copies such a model but builds it each time
        # (advisor.workload.copying), so every model made in a process counts here.
        built = BUILT
        self.built = lambda: built

    def forward(self, x):  # noqa: ANN001, ANN201
        channels_last = x.is_contiguous(memory_format=torch.channels_last)
        if channels_last:
            time.sleep(0.065 if BUILT >= WORN else 0.005)
        else:
            time.sleep(0.050)
        return self.conv(x)


def build_model() -> nn.Module:
    return LosesWhenWorn()


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(1, 3, 8, 8),)
