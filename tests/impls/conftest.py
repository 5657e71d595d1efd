"""Fixtures for the implementation tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def one_thread() -> Iterator[None]:
    """torch on one thread, restored after. For many tiny convs: on a busy 2-core machine two
    threads cost up to 100x one (OpenMP spinning and waiting on 30-element tensors)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
