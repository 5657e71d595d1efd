"""Candidates measured after the eager search, on its finalists: torch.compile's modes
(`advisor.stages.compiling`) and cudnn.benchmark (`advisor.stages.benchmark_twins`).

Both are settings whose cost is paid once per process (a cold compile, cuDNN's algorithm search)
and whose worth depends on the finalists, so they are tried on those, not across the grid. Each
result is a trial entry of the run's ledger (a later run of the study reuses it); it enters the
pick after an interleaved re-time with the finalists.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from advisor.execute.evaluators import Evaluator
from advisor.knobs import Settings
from advisor.measure.results import TrialResult
from advisor.measure.stats import Race
from advisor.search.ledger import Stage
from advisor.search.options import Progress, SearchOutcome

__all__ = ["measure_later", "reusable"]


def reusable(result: TrialResult | None, race: Race | None) -> TrialResult | None:
    """A stored result, unless its payback check was made for another horizon."""
    if result is None or result.stop is None:
        return result
    return result if result.stop.holds_at(race.horizon_steps if race is not None else None) else None


def measure_later(
    outcome: SearchOutcome,
    candidates: list[Settings],
    evaluator: Evaluator,
    deadline: float | None,
    progress: Callable[[Progress], None] | None = None,
    race: Race | None = None,
    *,
    stage: Stage,
    first_s: float,
) -> list[TrialResult]:
    """Measure `candidates` in order with the run's evaluator while the budget allows, each in
    `race`; each result is a trial entry of the outcome's ledger, and the standings are
    returned. One the ledger holds already (an earlier run of the study measured it) is not
    measured again, unless its payback was judged for another horizon. A candidate starts only
    when the time left covers the longest one so far (`first_s` before the first); those the
    budget left out are named in `outcome.not_measured`."""
    start = time.perf_counter()
    longest = first_s
    measured: list[TrialResult] = []
    for n, settings in enumerate(candidates):
        result = reusable(outcome.ledger.standing(settings), race)
        if result is None:
            left = None if deadline is None else deadline - time.perf_counter()
            if left is not None and left < longest:
                outcome.not_measured.append(settings.label())
                continue
            t0 = time.perf_counter()
            outcome.ledger.trial(evaluator(settings, race=race, time_left_s=left), stage)
            longest = max(time.perf_counter() - t0, 1.0)  # the next one costs about as much
            result = outcome.ledger.standing(settings)
            assert result is not None
        measured.append(result)
        if progress is not None:
            elapsed = time.perf_counter() - start
            progress(Progress(n + 1, len(candidates), None, result, elapsed, stage=stage))
    return measured
