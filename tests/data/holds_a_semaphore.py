"""A model file whose import makes a named semaphore, as tqdm does for its lock (Inductor's compile
progress makes it in whichever process compiles): a process that loads it and is killed before
its exit handlers run leaves the semaphore to multiprocessing's resource tracker, which warns of
it when the run ends. Each process appends its semaphore's name to $SEMAPHORE_LOG (if set)."""

import multiprocessing
import os

import torch
from torch import nn

LOCK = multiprocessing.RLock()
if LOCK._semlock.name and os.environ.get("SEMAPHORE_LOG"):  # a spawned process's: named
    with open(os.environ["SEMAPHORE_LOG"], "a") as f:
        f.write(LOCK._semlock.name + "\n")


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 1))


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 3, 16, 16),)
