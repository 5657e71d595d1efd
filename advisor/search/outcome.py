"""What a search found, read back from its study: every point's result (the memory limit applied
now), the baseline, the Pareto set and what was not measured; and the precision verdicts the
study stores beside its trials."""

from __future__ import annotations

import logging

import optuna

from advisor.errors import AdvisorError, StorageError
from advisor.knobs import Settings
from advisor.measure.results import TrialResult
from advisor.measure.verdict import OUT_OF_TIME, PRECISION_PENDING, PrecisionCheck
from advisor.search.options import SearchOptions, SearchOutcome
from advisor.search.pick import pareto_front
from advisor.search.screen import SCREEN_DROP
from advisor.search.study import (
    Plan,
    evaluated,
    point_key,
    settled_results,
    trial_params,
    trial_result,
)

__all__ = ["CHECK_PREFIX", "check_key", "memory_checked", "read_outcome", "stored_checks", "unsettled"]

log = logging.getLogger("advisor")


def memory_checked(result: TrialResult, limit: float | None, baseline: Settings) -> TrialResult:
    """Reject an accepted candidate whose peak memory is over `limit` (never the baseline)."""
    if limit is None or result.status != "ok" or (result.peak_memory_mb or 0.0) <= limit:
        return result
    if result.settings == baseline:
        return result
    return result.model_copy(
        update={
            "status": "rejected",
            "reason": f"peak memory {result.peak_memory_mb:.1f} MB over the --max-memory limit "
            f"of {limit:g} MB",
        }
    )


def unsettled(result: TrialResult) -> TrialResult:
    """A search result still waiting for its gate where the search stopped before gating it
    (`advisor.search.deferred_gates`: Ctrl-C, a `work` process's view): stopped, never picked."""
    if not (result.status == "ok" and result.gate_pending):
        return result
    return result.model_copy(update={
        "status": "stopped", "gate_pending": False,
        "reason": f"{PRECISION_PENDING}; the search ended before it was gated",
    })  # fmt: skip


def read_outcome(plan: Plan, options: SearchOptions, elapsed: float) -> SearchOutcome:
    """Every point's result (the lowest-numbered trial's), the memory limit applied now, so a
    resumed study may use another limit without measuring again."""
    default = plan.cands[0]
    results, numbers, seen = [], [], set()
    settled = settled_results(plan.study)
    for t in sorted(plan.study.get_trials(deepcopy=False), key=lambda t: t.number):
        if not evaluated(t) or (key := point_key(trial_params(t))) in seen:
            continue
        seen.add(key)
        raw = unsettled(trial_result(t, settled))
        results.append(memory_checked(raw, options.max_memory_mb, default))
        numbers.append(t.number)
    baseline = next((r for r in results if r.settings == default), None)
    if baseline is None:
        raise StorageError(f"study {plan.name!r} has no measurement of PyTorch's default yet")
    if baseline.status != "ok":
        raise AdvisorError(f"PyTorch's default configuration could not be measured: "
                           f"{baseline.reason}")  # fmt: skip
    limit = options.max_memory_mb
    if limit is not None and (baseline.peak_memory_mb or 0.0) > limit:
        log.warning(
            "PyTorch's default peaks at %.1f MB, over --max-memory %g MB: it is kept as the "
            "baseline; only candidates under the limit are considered instead of it",
            baseline.peak_memory_mb,
            limit,
        )
    pareto = pareto_front(results) if plan.multi else []
    if plan.grid:
        missing = [s.label() for s in plan.cands if point_key(plan.params(s)) not in seen]
    else:
        short = plan.budget - len(results)
        missing = [f"{short} more TPE trial(s) of the budget's {plan.budget}"] if short > 0 else []
    # measured, but the budget ran out before its precision was judged: it could not be picked
    missing += [f"{r.settings.label()} (its precision check)" for r in results
                if r.status == "stopped" and r.reason == OUT_OF_TIME]  # fmt: skip
    return SearchOutcome(results, baseline, plan.dropped, plan.name, plan.env, elapsed, numbers,
                         pareto, missing, screen_note(plan))  # fmt: skip


def screen_note(plan: Plan) -> str | None:
    """What screening did in this study (advisor.search.screen), in a line; None where it did
    nothing."""
    fallback = plan.study.user_attrs.get("screen_fallback")
    if fallback is not None:
        return (f"screening's ranking did not hold ({fallback}): every candidate was timed in "
                "full")  # fmt: skip
    dropped = [t.user_attrs.get("label", "?") for t in plan.study.get_trials(deepcopy=False)
               if t.user_attrs.get("screened")]  # fmt: skip
    if not dropped:
        return None
    # a label holds commas ("memory_format=channels_last, amp=bf16"): the list is in semicolons
    shown = "; ".join(dropped[:4]) + (f"; and {len(dropped) - 4} more" if len(dropped) > 4 else "")
    return (f"screening (a few samples of every candidate first) left {len(dropped)} candidate(s) "
            f"untimed in full and ungated, above {SCREEN_DROP:g}x the fastest: {shown}")


CHECK_PREFIX = "precision_check:"


def check_key(check: PrecisionCheck) -> str:
    return CHECK_PREFIX + check.own_path.label()


def stored_checks(study: optuna.Study) -> list[PrecisionCheck]:
    """The precision verdicts this study has measured (by any process or earlier run)."""
    return [
        PrecisionCheck.model_validate(value)
        for key, value in study.user_attrs.items()
        if key.startswith(CHECK_PREFIX)
    ]
