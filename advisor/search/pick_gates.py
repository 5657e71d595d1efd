"""The verdicts a pick needs, asked for when it needs them.

Under a race, a candidate's gate is paid in its trial only where it is cheap and the candidate
could be picked: a precision not judged yet on the model (a training check of seconds), a
compiled candidate's capture under dropout (a second compile), or the checks of one measured
above the bar of the fastest candidate so far wait, and the result says what it waits for
(`TrialResult.pending`). `gated_pick` makes the pick (`pick.decide`) and, where a pending
candidate is the pick, is the fastest and its verdict would change the pick, challenges a
kept default (`pick.challenger`) or is the runner-up the final check times beside the pick
(`pick.runner_up`: recommended where it beats the pick there), asks the evaluator for its
gate, keeps the verdict in the ledger (a precision's verdict too, for every later candidate and
study of the model) and decides again. So nothing is recommended ungated, and no verdict is
paid for a candidate that cannot be picked.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from advisor.execute.evaluators import Evaluator
from advisor.knobs import Settings
from advisor.measure.contest import Contest
from advisor.measure.results import TrialResult
from advisor.search.options import Progress, SearchOutcome
from advisor.search.pick import Pick, beyond_noise, check_subjects, decide

__all__ = ["gated_pick", "needed"]


def needed(
    pick: Pick, results: list[TrialResult], baseline: TrialResult, contest: Contest,
    check_always: bool | None = None,
) -> TrialResult | None:
    """The pending candidate whose verdict the pick needs, or None: the pick itself, or the
    fastest candidate where the pick without it would be another; with `check_always` (the
    effort's, `SearchOptions`), where the final check will run (at quick, where `beyond_noise`
    leaves it to run), what it recommends if it holds there: where the default is the pick, the
    `challenger` timed in its place, and the `runner_up` timed beside it."""
    if pick.chosen.pending is not None:
        return pick.chosen
    fastest = pick.fastest
    if fastest.pending is not None and fastest.settings != pick.chosen.settings:
        without = [r for r in results if r.settings != fastest.settings]
        if decide(without, baseline, contest).chosen.settings != pick.chosen.settings:
            return fastest
    if check_always is None or (
        not check_always and beyond_noise(pick, results, baseline, contest)
    ):
        return None
    checked, runner = check_subjects(results, pick.chosen, baseline)
    if checked is None or checked.pending is not None:
        return checked
    return runner if runner is not None and runner.pending is not None else None


def gated_pick(
    outcome: SearchOutcome,
    evaluator: Evaluator,
    contest: Contest,
    deadline: float | None = None,
    progress: Callable[[Progress], None] | None = None,
    check_always: bool | None = None,
) -> Pick:
    """The pick once every verdict it needs is in (see the module's docstring). `deadline`
    bounds a training check (past it the candidate is stopped, unjudged, and the next pick is
    made)."""
    asked: set[str] = set()
    start = time.perf_counter()
    while True:
        results, baseline = outcome.results, outcome.baseline
        pick = decide(results, baseline, contest)
        need = needed(pick, results, baseline, contest, check_always)
        if need is None or need.settings.model_dump_json() in asked:
            return pick
        asked.add(need.settings.model_dump_json())
        left = None if deadline is None else max(0.0, deadline - time.perf_counter())
        verdict = evaluator.gate(need.settings, time_left_s=left)
        check = verdict.precision_check
        if check is not None and not check.reused and check.own_path != Settings():
            outcome.ledger.precision(check)
            evaluator.know([check])
            if outcome.shared_checks is not None:  # the model's other studies read it too
                outcome.shared_checks.add(check)
        outcome.ledger.verdict(verdict)
        if progress is not None:
            now = outcome.ledger.standing(need.settings)
            progress(
                Progress(
                    len(asked), len(asked), None, now, time.perf_counter() - start, stage="gates"
                )
            )
