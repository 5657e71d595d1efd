"""A model whose channels_last "win" exists only in a process that has built it many times: a
long-lived worker (the fp32 reference, each trial and each re-time build one), never a fresh
process that builds it three times (the workload, then the default and the pick, as
`advisor.apply` in a user's process would). What the final check is for, made deterministic
with sleeps (50 ms against 5 ms: a 10x gap, so a busy machine's late wake-ups, a few ms each,
cannot turn the worn process's win into a tie). In a fresh process channels_last loses by 2x
(100 ms against 50): under load a wake-up can come 15 ms late, and a 60-against-50 loss was once
read as a 1.02x tie (CI, 2026-11-27). The pick must not survive the check, and the check's
speedup must stay far from the worn process's 10x."""

import time

import torch
from torch import nn

BUILT = 0  # models built in this process
WORN = 4  # from the fourth model on, channels_last "wins" (a fresh check builds 3)


class WinsWhenWorn(nn.Module):
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
            time.sleep(0.005 if BUILT >= WORN else 0.100)
        else:
            time.sleep(0.050)
        return self.conv(x)


def build_model() -> nn.Module:
    return WinsWhenWorn()


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(1, 3, 8, 8),)
