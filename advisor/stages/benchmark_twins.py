"""cudnn.benchmark on the eager search's finalists, not across its grid.

cuDNN runs its algorithm search again at the first call of every new (shape, dtype, layout) in a
process: seconds a candidate, against milliseconds for PyTorch's default's first call, so crossed
with every other knob the flag would take most of a grid's time. Its worth is a per-step saving on
settings already chosen for everything else, so it is tried on the best `count` accepted
candidates of the benchmark-off search (two at quick
and default effort, three at full: `Effort.benchmark_finalists`), the fastest first.

They run in the flag's own process (`advisor.execute.benchmark_processes`: cuDNN's plan
cache ignores it), which loads the model beside the search and runs nothing before the twins'
first calls (`advisor.execute.first_calls`): each is a fresh process's search, what the user
pays at the start of training, and what the cudnn.benchmark note, the `Worth it:` line and the
`--steps` bill read (`compile_bill.paid_by`). Each twin races the fastest accepted
candidate as a trial does: one that cannot win stops before its gate.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from advisor.execute.benchmark_processes import BenchmarkSplit
from advisor.execute.evaluators import Evaluator
from advisor.knobs import Settings
from advisor.measure.contest import Contest
from advisor.measure.results import TrialResult
from advisor.search.options import Progress, SearchOutcome
from advisor.space import SearchSpace, benchmark_finalists
from advisor.stages.later import measure_later, reusable

__all__ = ["benchmark_twins", "run_benchmark_twins"]

log = logging.getLogger("advisor")

# What a twin is assumed to take before one was measured: about cuDNN's search for a large
# CNN's convolutions, so a budget too short for one does not start it.
FIRST_TWIN_S = 15.0


def _accepted(outcome: SearchOutcome) -> list[TrialResult]:
    """The search's accepted eager candidates without the flag, fastest first."""
    return sorted((r for r in outcome.results if r.status == "ok" and r.measurement is not None
                   and not r.settings.compiled and not r.settings.cudnn_benchmark),
                  key=lambda r: r.median_ms)  # fmt: skip


def benchmark_twins(
    outcome: SearchOutcome, space: SearchSpace, device: torch.device, count: int
) -> list[Settings]:
    """The finalists' twins with cudnn.benchmark on, the fastest finalist first: none where the
    space does not list the flag or the device has no cuDNN."""
    if count < 1 or not benchmark_finalists(space, device):
        return []
    twins: list[Settings] = []
    for r in _accepted(outcome):
        twin = r.settings.model_copy(update={"cudnn_benchmark": True})
        if twin not in twins:
            twins.append(twin)
        if len(twins) == count:
            break
    return twins


def run_benchmark_twins(
    outcome: SearchOutcome,
    space: SearchSpace,
    device: torch.device,
    count: int,
    evaluator: Evaluator,
    deadline: float | None,
    contest: Contest,
    progress: Callable[[Progress], None] | None = None,
) -> list[TrialResult]:
    """Measure the finalists' twins (`benchmark_twins`) while the budget allows, each racing
    the fastest accepted candidate; their results join the outcome."""
    twins = benchmark_twins(outcome, space, device, count)
    if not twins:
        return []
    leader = _accepted(outcome)[0].measurement  # the fastest finalist, whose twin came first
    race = contest.race(leader)
    # Those to measure here (not measured or stored already) first run their first calls in
    # the flag's process, before anything else: a fresh process's searches
    todo = [t for t in twins if reusable(outcome.ledger.standing(t), race) is None]
    if todo and isinstance(evaluator, BenchmarkSplit):
        why = evaluator.prime(todo)
        if why is not None:
            log.warning("cudnn.benchmark's first calls could not be taken first: %s", why)
    return measure_later(outcome, twins, evaluator, deadline, progress, race,
                         stage="cudnn.benchmark", first_s=FIRST_TWIN_S)  # fmt: skip
