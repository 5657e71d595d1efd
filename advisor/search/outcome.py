"""What a search found, read from its study's ledger: every candidate's standing (the memory
limit applied now), the baseline and what was not measured."""

from __future__ import annotations

import logging
import time

from advisor.errors import AdvisorError, StorageError
from advisor.execute.ownership import owner_id
from advisor.measure.contest import SCREEN_DROP
from advisor.search.ledger import Ledger
from advisor.search.options import SearchOptions, SearchOutcome
from advisor.search.study import Plan, point_key

__all__ = ["ledger_of", "read_outcome"]

log = logging.getLogger("advisor")


def ledger_of(plan: Plan, options: SearchOptions, run: str = "") -> Ledger:
    """The study's ledger, read as run `run` reads it: its re-time rounds, its memory limit."""
    return Ledger(
        plan.study,
        plan.cands[0],
        run=run,
        max_memory_mb=options.max_memory_mb,
        storage=plan.storage,
    )


def read_outcome(plan: Plan, options: SearchOptions, elapsed: float) -> SearchOutcome:
    """Every point's standing, the memory limit applied now, so a resumed study may use another
    limit without measuring again; read as a new run (its own re-time rounds)."""
    ledger = ledger_of(plan, options, f"{owner_id()}@{time.time():.6f}")
    results = ledger.results()
    baseline = ledger.baseline()
    if baseline is None:
        raise StorageError(f"study {plan.name!r} has no measurement of PyTorch's default yet")
    if baseline.status != "ok":
        raise AdvisorError(
            f"PyTorch's default configuration could not be measured: {baseline.reason}"
        )
    limit = options.max_memory_mb
    if limit is not None and (baseline.peak_memory_mb or 0.0) > limit:
        log.warning(
            "PyTorch's default peaks at %.1f MB, over --max-memory %g MB: it is kept as the "
            "baseline; only candidates under the limit are considered instead of it",
            baseline.peak_memory_mb,
            limit,
        )
    seen = {point_key(plan.params(r.settings)) for r in results}
    if plan.grid:
        missing = [s.label() for s in plan.cands if point_key(plan.params(s)) not in seen]
    else:
        short = plan.budget - len(results)
        missing = [f"{short} more TPE trial(s) of the budget's {plan.budget}"] if short > 0 else []
    return SearchOutcome(
        dropped=plan.dropped,
        study_name=plan.name,
        environment=plan.env,
        elapsed_s=elapsed,
        pareto=plan.multi,
        not_measured=missing,
        screen_note=screen_note(plan),
        ledger=ledger,
        shared_checks=plan.shared_checks,
    )


def screen_note(plan: Plan) -> str | None:
    """What screening did in this study (advisor.search.screen), in a line; None where it did
    nothing."""
    fallback = plan.study.user_attrs.get("screen_fallback")
    if fallback is not None:
        return f"screening's ranking did not hold ({fallback}): every candidate was timed in full"
    dropped = [
        t.user_attrs.get("label", "?")
        for t in plan.study.get_trials(deepcopy=False)
        if t.user_attrs.get("screened")
    ]
    if not dropped:
        return None
    # a label holds commas ("memory_format=channels_last, amp=bf16"): the list is in semicolons
    shown = "; ".join(dropped[:4]) + (f"; and {len(dropped) - 4} more" if len(dropped) > 4 else "")
    return (
        f"screening (a few samples of every candidate first) left {len(dropped)} candidate(s) "
        f"untimed in full and ungated, above {SCREEN_DROP:g}x the fastest: {shown}"
    )
