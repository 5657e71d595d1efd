"""Gating after the search: a candidate at a precision not judged yet is gated once the search
ends, against its final leader, fastest first; the order trials ran in no longer decides which
training checks are paid.

A reduced precision is judged by a training check (`advisor.gate.precision`): seconds of training
runs, once per precision per model. During the search, a candidate at a precision not judged yet
is measured without its gate (`Race.defer_gate`: `gate_pending`). Judged at once, its check was
paid wherever it could beat the leader *of that moment*, and the first trials race a weak one:
on an H200 ResNet-50's TF32 and bf16 candidates paid 4.5 s and 10 s of checks early in a quick
run and then lost to channels_last, 14% faster (benchmarks/results/
gpu_acceptance_nvidia_h200_f473b9e_quick.md).

Once every trial is in, `settle_pending` walks the candidates that could still be picked:
those pending, and those stopped before their gate because the fastest candidate of their moment
was faster (`CANNOT_WIN`: measured in full, so gated now if that one is rejected). Fastest
first, each whose interval reaches below the bar (the best accepted candidate's CI upper end,
plus min_gain: the rule `Race.judge_below_ms` applies during the search) is gated
(`Evaluator.gate`: its capture, its layers, its precision's check); an accepted one lowers the
bar for the rest. What is left above the bar is stopped unjudged, its reason naming the final
bar. A pending candidate never leads a race (its sign test stops others for good); it does
raise the bar below which others are gated during the search, since those it stops stay open
here.

Verdicts go to the study's attributes (`study.SETTLED_PREFIX`): a trial is immutable once
told, and every reader of trials overlays them (`study.trial_result`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import optuna

from advisor.execute.evaluators import Evaluator
from advisor.execute.gating import settle
from advisor.execute.runner import cannot_win
from advisor.knobs import Settings
from advisor.measure.results import TrialResult
from advisor.measure.verdict import CANNOT_WIN, OUT_OF_TIME, PrecisionCheck, judged
from advisor.search.outcome import memory_checked
from advisor.search.study import Plan, first_results, store_settled

__all__ = ["leaders", "open_verdict", "settle_pending"]


def open_verdict(r: TrialResult) -> bool:
    """Whether a result's gate is still to run, where it could be picked: measured in full,
    pending, or stopped only because a faster candidate was measured first."""
    if r.measurement is None:
        return False
    if r.status == "ok":
        return r.gate_pending
    # a check the budget cut is judged by a later run of the study
    return r.status == "stopped" and (
        (r.reason or "").startswith(CANNOT_WIN) or r.reason == OUT_OF_TIME
    )


def settle_pending(
    plan: Plan,
    evaluator: Evaluator,
    min_gain: float,
    max_memory_mb: float | None,
    deadline: float,
    record: Callable[[PrecisionCheck], None],
    known: list[PrecisionCheck],
    on_gated: Callable[[TrialResult], None] | None = None,
) -> list[TrialResult]:
    """Gate the study's open results that could be picked, fastest first (see the module's
    docstring); `record` keeps each precision verdict as a trial's is kept; `known`: the
    verdicts known before (for what the rest's reasons say); `on_gated` hears of each verdict
    (the progress display). Returns the results it gated."""
    gated: list[TrialResult] = []
    known = list(known)
    default = plan.cands[0]
    tried: set[str] = set()
    out_of_time = False
    while True:
        results = [memory_checked(r, max_memory_mb, default) for r in first_results(plan.study)]
        bar = _bar(results, min_gain)
        open_ = sorted((r for r in results if open_verdict(r)), key=lambda r: r.median_ms)
        if bar is None:
            return gated  # no accepted baseline: the outcome says so
        nxt = next((r for r in open_ if r.measurement and r.measurement.ci_low_ms <= bar
                    and r.settings.label() not in tried), None)  # fmt: skip
        if nxt is None or out_of_time:
            break
        tried.add(nxt.settings.label())
        verdict = evaluator.gate(nxt.settings, time_left_s=max(0.0, deadline - time.perf_counter()))
        done = settle(nxt, verdict)
        if verdict.status == "stopped" and verdict.reason == OUT_OF_TIME:
            # the budget is spent: said as a trial's check cut short is, and left to a later run
            done = done.model_copy(update={"reason": OUT_OF_TIME})
            out_of_time = True
        if done.precision_check is not None and done.precision_check.own_path != Settings():
            record(done.precision_check)
            known.append(done.precision_check)
        store_settled(plan.study, done)
        gated.append(done)
        if on_gated is not None:
            on_gated(done)
    for r in open_:  # above the final bar: never picked, so never gated
        assert r.measurement is not None
        if r.measurement.ci_low_ms <= bar:
            continue  # the budget ran out before its gate: open to a later run of the study
        paths = [c.own_path for c in known]
        unjudged = None if judged(r.precision, r.settings, paths) else r.precision
        if r.status == "stopped" and r.reason == cannot_win(r.measurement, bar, unjudged):
            continue
        store_settled(plan.study, r.model_copy(update={
            "status": "stopped", "gate_pending": False,
            "reason": cannot_win(r.measurement, bar, unjudged),
        }))  # fmt: skip
    return gated


def leaders(
    study: optuna.Study, max_memory_mb: float | None, default: Settings
) -> tuple[TrialResult | None, TrialResult | None]:
    """The fastest accepted candidate measured so far in this study (by any process), which a
    candidate races; and the fastest one measured at all, its gate pending or not, below whose
    bar a candidate is gated (one it stops stays open to `settle_pending`)."""
    ok = [r for r in (memory_checked(r, max_memory_mb, default) for r in first_results(study))
          if r.status == "ok" and r.measurement is not None]  # fmt: skip
    return _fastest([r for r in ok if not r.gate_pending]), _fastest(ok)


def _fastest(results: list[TrialResult]) -> TrialResult | None:
    return min(results, key=lambda r: r.median_ms, default=None)


def _bar(results: list[TrialResult], min_gain: float) -> float | None:
    """Below this a candidate could be picked: the fastest accepted one's CI upper end plus
    min_gain (`SearchSpace.race_against`'s gate bar)."""
    best = _fastest([r for r in results if r.status == "ok" and not r.gate_pending
                     and r.measurement is not None])  # fmt: skip
    if best is None or best.measurement is None:
        return None
    return best.measurement.ci_high_ms * (1 + min_gain)

