"""The evaluator a run uses: isolated workers where the workload can be rebuilt in one, in this
process otherwise, and on CUDA a process per `cudnn_benchmark` value where the space has both."""

from __future__ import annotations

from collections.abc import Callable

import torch

from advisor.execute.benchmark_processes import needs_split, split_by_benchmark
from advisor.execute.evaluators import Evaluator, InProcessEvaluator
from advisor.execute.isolate import IsolatedEvaluator
from advisor.measure.candidate import Mode
from advisor.space import SearchSpace
from advisor.workload.build import Workload

__all__ = ["new_evaluator"]


def new_evaluator(
    workload: Workload,
    device: torch.device,
    space: SearchSpace,
    mode: Mode,
    *,
    isolate: bool = False,
    timeout_s: float = 600.0,
    on_start: Callable[[float], None] | None = None,
) -> Evaluator:
    """Isolated (a worker subprocess per candidate stream) where the workload can be rebuilt in a
    worker and the user did not ask for in-process trials; in-process otherwise. On CUDA, with
    both `cudnn_benchmark` values in the space, `True` gets a worker process of its own
    (`advisor.execute.benchmark_processes`). `on_start` is told each wait for a worker's start."""
    ev: InProcessEvaluator | IsolatedEvaluator
    if isolate and workload.info.recreatable:
        ev = IsolatedEvaluator(workload.info, device, mode, space, timeout_s, on_start=on_start)
    else:
        ev = InProcessEvaluator(workload, device, mode, space)
    if needs_split(device, space):
        return split_by_benchmark(ev, workload, device, space, mode, timeout_s, on_start)
    return ev
