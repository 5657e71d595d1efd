"""When a warm-up goes on until the step has settled: once per layout in a process.

A workload's one-time costs are not all paid by its first call (pages first touched, oneDNN
primitives created for each pass, caches filled): a warm-up cut at a fixed count lets the rest
into the samples of the first measurement in a process (the default's trial can read 3x its
re-time). So the first step a process measures in a memory format warms up until it has stopped
getting faster (`settling`). A later step in that layout starts from a process that has paid
them (its buffers' pages touched, the allocator's heap grown) and warms up with the policy's runs
(`warmup_runs`, `warmup_s`): settling every candidate and every finalist again would about
double a quick run's warm-up.

A layer's step is the exception: it is short, so settling costs it a few runs where `warmup_s`
costs it hundreds, and every candidate of a layer group settles, with no time floor (on a CPU;
a GPU's warm-up is its launches and keeps the policy's). Both implementations of a group then
warm up alike: a second one given only the policy's runs reads a few percent slow.
"""

from __future__ import annotations

from collections.abc import Sequence

from advisor.workload.build import Workload

# A warm-up run this much faster than every run before it (after the first call): the step is
# still getting faster, so its one-time costs are still being paid (`settling`)
SETTLE_TOL = 0.05


def settling(runs_ms: Sequence[float], tol: float = SETTLE_TOL) -> bool:
    """Whether a step warming up is still getting faster: fewer than two runs after its first
    call, or its last run or the one before it more than `tol` faster than every run before it
    (so one jittery run does not end the warm-up of a step that was getting faster).

    The one rule for the end of a warm-up that settles (`timing.measure`, `timing.warm_up`):
    a step still paying beats its best run at every run; a settled one beats it by more than
    `tol` ever more rarely as its runs add up."""

    def beat(runs: Sequence[float]) -> bool:
        return len(runs) >= 2 and runs[-1] < (1 - tol) * min(runs[:-1])

    return len(runs_ms) < 2 or beat(runs_ms) or beat(runs_ms[:-1])


def settles(workload: Workload, case: int, memory_format: str) -> bool:
    """Whether a step of `workload` (shape case `case`) in `memory_format` warms up until it
    settles: the first this process measures in that layout (the default's trial, the first
    channels_last candidate, each finalist of the final check's fresh process). Asking records
    it: later steps in that layout warm up with the policy's runs. Every step of a layer settles."""
    if workload.is_layer:
        return True
    key = (case, memory_format)
    first = key not in workload.warmed
    workload.warmed.add(key)
    return first
