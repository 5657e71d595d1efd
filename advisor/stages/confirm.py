"""Confirming the pick: the recommendation, the default and the strongest alternative of another
family (another memory format or precision) timed together once more where the user runs it.

A pick can flip with the machine's state between runs of one model (between families, not only
within one), and a check of the pick against the default alone cannot tell. So the runner-up of
another family (`pick.runner_up`, its gate paid first) is timed beside both
(`final_check.runner_up_check`): where it beats the pick beyond noise it is recommended instead
(`advice`); where the two are within noise, the advice says this machine cannot order them.

The check also runs where the search keeps the default. A worker's state can hide a win as it
can fake one (a long-lived worker can measure a reduced precision slower than the default where
fresh processes measure it faster), so the fastest eager alternative (`pick.challenger`, its
gate paid first) is timed against the default where the user runs it, with a runner-up of
another family beside it, and recommended where it holds there (`after_check`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import torch

from advisor.config import FinalCheck
from advisor.measure.machine_load import BUSY_SHARE
from advisor.measure.results import TrialResult
from advisor.search.options import Progress, SearchOptions, SearchOutcome
from advisor.search.pick import Pick, check_subjects, decide
from advisor.space import SearchSpace
from advisor.stages.budget import BudgetPlan
from advisor.stages.final_check import (
    CheckFailed,
    FreshProcess,
    check_policy,
    final_check,
    rounds_fit,
)
from advisor.stages.finalists import group_of, taken_once
from advisor.workload.build import Workload

__all__ = ["after_check", "check_pick", "first_step_note", "runner_held"]

log = logging.getLogger("advisor")


def check_pick(
    workload: Workload,
    outcome: SearchOutcome,
    dev: torch.device,
    sp: SearchSpace,
    options: SearchOptions,
    plan: BudgetPlan,
    share: float | None,
    notes: list[str],
    spare: FreshProcess | None = None,
) -> tuple[FinalCheck | None, str | None]:
    """The recommendation re-timed against the default where the user runs it (a fresh
    process for a recreatable workload in an isolated run; else this process), with the
    runner-up of another family beside it: the check, or why it could not be made. Where the
    default is the pick, its `challenger` is checked in its place (the check says so); nothing
    is checked where there is none."""
    pick = decide(outcome.results, outcome.baseline, sp.contest(options.steps))
    chosen, runner = check_subjects(outcome.results, pick.chosen, outcome.baseline)
    if chosen is None or chosen.pending is not None:  # none, or its gate was not paid in time
        return None, None
    challenging = chosen is not pick.chosen
    if runner is not None and runner.pending is not None:  # its gate was not paid in time
        runner = None
    if dev.type == "cuda" and chosen.settings.cudnn_benchmark:
        # One process cannot time it against the default: cuDNN's plan cache ignores the flag
        # (advisor/execute/benchmark_processes.py), so the re-time compared them a process each.
        if challenging:  # that comparison, in fresh processes, already kept the default
            return None, None
        notes.append(
            "no final check in a fresh process: cudnn.benchmark cannot be timed against the "
            "default in one process (cuDNN's plan cache ignores the flag); the re-time compared "
            "them in a process each"
        )
        return None, None
    busy = share is not None and share > BUSY_SHARE
    left = max(0.0, plan.end - time.perf_counter())
    policy = check_policy(sp.timing.policy(), left)
    checked = [outcome.baseline, chosen] + ([runner] if runner is not None else [])
    # The budget reserves the check for two: a runner-up is timed where all three's rounds fit.
    if runner is not None and not rounds_fit(checked, policy, busy, dev, left):
        notes.append(f"the budget left no time for the runner-up {runner.settings.label()} in "
                     "the final check")  # fmt: skip
        runner, checked = None, checked[:2]
    if options.progress is not None:
        options.progress(Progress(0, 1, None, chosen, 0.0, stage="final check"))
    # Runs sharing the study check the pick once and agree (as with the re-time).
    group = group_of(checked)
    taken = taken_once(outcome, options, "final_check", group)
    check = taken[-1].final if taken else None
    if check is None:
        try:
            check = final_check(
                workload, dev, options.mode, policy, outcome.baseline, chosen,
                fresh=options.isolate and workload.info.recreatable,
                busy=busy,
                timeout_s=options.trial_timeout_s,
                spare=spare,
                runner_up=runner,
                min_gain=sp.min_gain,
                on_start=options.on_start,
            )  # fmt: skip
        except CheckFailed as e:
            log.warning("final check failed: %s", e)
            return None, str(e)
        outcome.ledger.final_check(chosen.settings, check, group)
    # What was checked is this run's reading: a run sharing the study may have checked the same
    # three as its pick (no challenger), or as a challenger of its kept default.
    check = check.model_copy(update={"challenger": chosen.settings if challenging else None})
    if options.progress is not None:
        options.progress(Progress(1, 1, None, chosen, 0.0, stage="final check"))
    return check, None


def runner_held(final: FinalCheck, results: list[TrialResult]) -> TrialResult | None:
    """The final check's runner-up where it held against the default, else None."""
    if not final.runner_up_held or final.runner_up is None:
        return None
    return next((r for r in results if r.settings == final.runner_up), None)


def after_check(pick: Pick, final: FinalCheck, results: list[TrialResult]) -> Pick:
    """The pick the final check leaves, which the check then decided: the runner-up of another
    family where it beat the candidate checked there beyond noise, or held where that did not;
    else the candidate checked where it held (the search's pick, or the `challenger` of a
    default the search kept), with the order of the two said where this machine could not
    decide it; else the default, with what the check found (`build_advice` keeps the default
    before this where a pick of the search held nowhere)."""
    checked = final.challenger or pick.chosen.settings
    label, seen = checked.label(), f"in the final check {final.place}"
    what = f"{label}, the fastest alternative the search accepted" if final.challenger else label
    runner = runner_held(final, results)
    if runner is not None and (final.order == "runner-up" or not final.held):
        how = "beat it" if final.held else f"held where it did not ({final.figures()})"
        why = (f"{runner.settings.label()}, of another family than {what}, {how} {seen} "
               f"({final.runner_up_text()}): recommended instead")  # fmt: skip
        return replace(pick, chosen=runner, why=why, path=(pick.text(),))
    found: TrialResult | None = pick.chosen
    if final.challenger is not None:
        found = next((r for r in results if r.settings == final.challenger), None)
    if found is None or not final.held:  # a challenger (`build_advice` keeps a pick that did not)
        why = f"PyTorch's default: {what}, did not beat the default {seen} ({final.figures()})"
        nor = [f"nor did {final.runner_up_text()}"] if final.runner_up is not None else []
        return replace(pick, why=why, path=(pick.text(), *nor))
    path = [pick.why, *pick.path]
    if final.order == "undecided" and final.runner_up is not None:
        path.append(f"beside it, {final.runner_up_text()}: the order of the two is within what "
                    "this machine can decide")  # fmt: skip
    elif final.order == "pick" and final.runner_up is not None:
        path.append(f"it beat the runner-up {final.runner_up.label()} there")
    why = f"{what}: it beat the default {seen} ({final.figures()})"
    return replace(pick, chosen=found, why=why, path=tuple(path))


def first_step_note(note: str | None, chosen: TrialResult, final: FinalCheck | None) -> str | None:
    """The compile note, with what the user's first training step will cost where the final
    check saw it: the pick's first call in a fresh process, as `advisor.apply` builds it."""
    if note is None or not chosen.settings.compiled or final is None:
        return note
    # The runner-up recommended instead (`after_check`): its own first call, not the
    # replaced pick's.
    first = (
        final.runner_up_first_call_s if chosen.settings == final.runner_up else final.first_call_s
    )
    if first is None or final.where != "fresh process":
        return note
    return (
        f"{note}; your training's first step compiles it: {first:.1f} s here "
        "(its first call in the final check's fresh process)"
    )
