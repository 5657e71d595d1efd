"""Candidates measured after the eager search, on its finalists: torch.compile's modes
(`advisor.stages.compiling`) and cudnn.benchmark (`advisor.stages.benchmark_twins`).

Both are settings whose cost is paid once per process (a cold compile, cuDNN's algorithm search)
and whose worth depends on the finalists, so they are tried on those, not across the grid. Each
result is stored beside the per-layer ones (`LayerStore.add_model_result`: a later run of the
study reuses it) and added to the outcome with trial number -1 (not a trial of the main study);
it enters the pick after an interleaved re-time with the finalists.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from advisor.execute.evaluators import Evaluator
from advisor.knobs import Settings
from advisor.measure.results import TrialResult
from advisor.measure.stats import Race
from advisor.measure.verdict import CANNOT_PAY
from advisor.search import Progress, SearchOutcome
from advisor.search.storage import LayerStore, open_storage

__all__ = ["measure_later", "reusable"]


def reusable(result: TrialResult | None, race: Race | None) -> TrialResult | None:
    """A stored result, unless its payback check was made for another horizon."""
    if result is None or CANNOT_PAY not in (result.reason or ""):
        return result
    steps = race.horizon_steps if race is not None else None
    if steps is not None and f"within {steps:,} steps" in (result.reason or ""):
        return result
    return None


def measure_later(
    outcome: SearchOutcome,
    candidates: list[Settings],
    evaluator: Evaluator,
    storage: str | None,
    deadline: float | None,
    progress: Callable[[Progress], None] | None = None,
    race: Race | None = None,
    *,
    stage: str,
    first_s: float,
    store: LayerStore | None = None,
) -> list[TrialResult]:
    """Measure `candidates` in order with the run's evaluator while the budget allows, each in
    `race`; their results are added to the outcome and returned. A candidate starts only when
    the time left covers the longest one so far (`first_s` before the first); those the budget
    left out are named in `outcome.not_measured`. `store`: the study's, where the caller
    opened it already."""
    store = store or LayerStore(open_storage(storage), outcome.study_name)
    start = time.perf_counter()
    longest = first_s
    measured: list[TrialResult] = []
    for n, settings in enumerate(candidates):
        if any(r.settings == settings for r in outcome.results):
            continue
        result = reusable(store.model_result(settings), race)
        if result is None:
            left = None if deadline is None else deadline - time.perf_counter()
            if left is not None and left < longest:
                outcome.not_measured.append(settings.label())
                continue
            t0 = time.perf_counter()
            result = evaluator(settings, race=race, time_left_s=left)
            longest = max(time.perf_counter() - t0, 1.0)  # the next one costs about as much
            store.add_model_result(result)
        outcome.results.append(result)
        outcome.trial_numbers.append(-1)
        measured.append(result)
        _report(progress, n + 1, len(candidates), result, start, stage)
    return measured


def _report(
    progress: Callable[[Progress], None] | None,
    done: int,
    total: int,
    last: Any,
    start: float,
    stage: str,
) -> None:
    if progress is not None:
        progress(Progress(done, total, None, last, time.perf_counter() - start, stage=stage))
