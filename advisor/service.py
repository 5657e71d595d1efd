"""The advise pipeline, top to bottom: workload -> space -> search -> per-layer stage -> Advice.

Shared by `advisor.advise()` and the CLI so both do exactly the same thing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from advisor.advice import Advice, build_advice
from advisor.environment import resolve_device
from advisor.errors import AdvisorError, first_line
from advisor.evaluators import Evaluator, Lent
from advisor.global_state import global_state, restore_global_state
from advisor.ownership import owner_id
from advisor.per_layer import (
    LayerChoice,
    choose_layer_impls,
    layers_map,
)
from advisor.pick import pick_final
from advisor.probe import hand_over, probe_model
from advisor.results import TrialResult
from advisor.retime import finalists
from advisor.search import Progress, SearchOptions, SearchOutcome, make_evaluator, search
from advisor.space import SearchSpace, load_space, with_tolerances
from advisor.storage import LayerStore, RetimeRecord, open_storage
from advisor.timing import machine_load_warning
from advisor.workload import (
    Workload,
)
from advisor.workload_args import make_workload

log = logging.getLogger("advisor")


def per_layer_stage(
    workload: Workload,
    outcome: SearchOutcome,
    device: torch.device,
    space: SearchSpace,
    options: SearchOptions,
    stats: dict[str, int] | None = None,
    evaluator: Evaluator | None = None,
) -> tuple[list[LayerChoice], TrialResult | None]:
    """Choose conv implementations per layer under the best global settings; if that changes any
    layer, measure the combination on the whole model and add it to the outcome's candidates.
    With `evaluator` (the run's own), the layer groups and the combination are measured with it.

    Returns the per-layer choices and the combination's result (None when nothing changed)."""
    best = pick_final(outcome.results, outcome.baseline, space.min_gain).chosen
    start = time.perf_counter()

    def report(done: int, total: int, last: Any) -> None:
        if options.progress is not None:
            options.progress(
                Progress(
                    done,
                    total,
                    None,
                    last,
                    time.perf_counter() - start,
                    stage="per-layer implementations",
                )
            )

    def make_layer_evaluator(wl: Workload) -> Evaluator:
        if evaluator is None:
            return make_evaluator(wl, device, space, options)
        return Lent(evaluator, wl, home=workload)  # the run's worker measures the layers too

    storage = open_storage(options.storage)
    choices = choose_layer_impls(
        workload,
        best.settings,
        device,
        options.mode,
        space,
        make_layer_evaluator,
        storage,
        outcome.study_name,
        space.min_gain,
        report,
        deadline=options.deadline,
        stats=stats,
    )
    layers = layers_map(choices, best.settings.conv_impl)
    if not layers:
        return choices, None
    combined = best.settings.model_copy(update={"layers": layers})
    known = [r for r in outcome.results if r.settings == combined]
    if known:
        return choices, known[0]
    store = LayerStore(storage, outcome.study_name)
    result = store.model_result(combined)
    if result is None and options.deadline is not None and time.perf_counter() >= options.deadline:
        if stats is not None:
            stats["combination"] = len(layers)  # chosen, but no time left to measure it
        return choices, None
    if result is None:
        ev = evaluator or make_evaluator(workload, device, space, options)
        left = (
            None if options.deadline is None else max(0.0, options.deadline - time.perf_counter())
        )
        try:
            result = ev(combined, time_left_s=left)
        finally:
            if ev is not evaluator:
                ev.close()
        store.add_model_result(result)
    outcome.results.append(result)
    outcome.trial_numbers.append(-1)  # not an optuna trial of the main study
    return choices, result


def retime_finalists(
    workload: Workload,
    outcome: SearchOutcome,
    device: torch.device,
    space: SearchSpace,
    options: SearchOptions,
    only_with: TrialResult | None = None,
    deadline: float | None = None,
    evaluator: Evaluator | None = None,
) -> tuple[int, str | None]:
    """Re-time the finalists interleaved and put the fresh measurements in the outcome.

    With `only_with`, re-time only if that candidate is among the finalists. Returns how many were
    re-timed (0 when skipped: fewer than two finalists) and, when the re-time failed, why.
    """
    top = space.retime_top
    fin = finalists(outcome.results, outcome.baseline, top, space.min_gain) if top else []
    if len(fin) < 2 or (only_with is not None and all(r is not only_with for r in fin)):
        return 0, None
    left = None if deadline is None else max(0.0, deadline - time.perf_counter())
    record, key = _retime_record(options, outcome.study_name, fin)
    fresh = record.get(key) if record is not None else None
    if fresh is None and record is not None and not record.claim(key, owner_id()):
        # Another run of this study re-times these finalists: use its result, so both agree.
        fresh = record.wait(key, timeout_s=options.trial_timeout_s * len(fin))
    if fresh is None:
        # Like the trials, in a worker subprocess unless the user asked for in-process trials.
        ev = evaluator or make_evaluator(workload, device, space, options)
        try:
            fresh = ev.retime(fin, time_left_s=left)
        except (torch.OutOfMemoryError, RuntimeError) as e:  # e.g. finalists too big together
            why = first_line(e, with_type=False)
            log.warning("interleaved re-time failed: %s", why)
            return 0, why
        finally:
            if ev is not evaluator:
                ev.close()
        if record is not None:
            record.put(key, fresh)
    # Only this re-time's finalists compete in the pick: an earlier re-time's samples were taken
    # in another time window.
    replace = {id(old): new for old, new in zip(fin, fresh, strict=True)}
    for r in outcome.results:
        if r.retimed and id(r) not in replace:
            replace[id(r)] = r.model_copy(update={"retimed": False})
    outcome.results = [replace.get(id(r), r) for r in outcome.results]
    outcome.baseline = replace.get(id(outcome.baseline), outcome.baseline)
    outcome.pareto = [replace.get(id(p), p) for p in outcome.pareto]
    return len(fin), None


def _retime_record(
    options: SearchOptions, study_name: str, fin: list[TrialResult]
) -> tuple[RetimeRecord | None, str]:
    """Where this set of finalists' re-time is shared with other runs of the study (not for an
    in-memory study, which no other run can see)."""
    key = hashlib.sha256(
        json.dumps(sorted(r.settings.model_dump_json() for r in fin)).encode()
    ).hexdigest()[:16]
    if options.storage == "memory":
        return None, key
    try:
        return RetimeRecord(open_storage(options.storage), study_name), key
    except KeyError:  # no such study stored (e.g. an outcome built by hand): nothing to share
        return None, key


def run_advise(
    *,
    mode: str = "infer",
    device: str = "auto",
    space: str | None = None,
    trials: int | None = None,
    storage: str | None = None,
    study_name: str | None = None,
    isolate: bool = False,
    trial_timeout_s: float = 600.0,
    max_memory_mb: float | None = None,
    objectives: tuple[str, ...] = ("time",),
    progress: Callable[[Progress], None] | None = None,
    fresh: bool = False,
    tolerances: dict[str, float] | None = None,
    budget_s: float | None = None,
    accept_noisy: bool = False,
    **workload_args: Any,
) -> Advice:
    start = time.perf_counter()
    if mode not in ("infer", "train"):
        raise AdvisorError(f"unknown mode {mode!r}; use infer or train")
    if budget_s is not None and not budget_s > 0:
        raise AdvisorError(f"--budget must be a positive time, got {budget_s:g} s")
    dev = resolve_device(device)
    sp = with_tolerances(load_space(space, dev), tolerances or {})
    probed = None
    if isolate and workload_args.get("model_file") is not None:
        # The user's code runs here only after it ran once, isolated, under the trial limit;
        # the child that ran it goes on as the run's worker.
        probed = probe_model(workload_args, mode, str(dev), trial_timeout_s, keep=True)
    saved = global_state()
    try:
        workload = make_workload(**workload_args)
    except BaseException:
        if probed is not None:
            probed.close()
        raise
    finally:
        restore_global_state(saved)  # what the user's code set at import is not the caller's
    per_layer = not workload.is_layer and sp.per_layer
    plan = budget_plan(start, budget_s or sp.budget.time_s, sp, per_layer)
    options = SearchOptions(
        mode=mode,  # type: ignore[arg-type]
        trials=trials,
        storage=storage,
        study_name=study_name,
        isolate=isolate,
        trial_timeout_s=trial_timeout_s,
        max_memory_mb=max_memory_mb,
        objectives=objectives,
        progress=progress,
        fresh=fresh,
        deadline=plan.search,
    )
    busy = [w for w in (machine_load_warning(dev),) if w]
    # One evaluator (one worker process when isolated) for the whole model's trials, its
    # per-layer combination and the re-times: each worker start costs an interpreter, torch's
    # import and the model's set-up (about 4 s on a 2-core CPU).
    evaluator = make_evaluator(workload, dev, sp, options)
    hand_over(probed, evaluator)
    try:
        outcome = search(workload, dev, sp, options, evaluator=evaluator)
        busy += [w for w in (machine_load_warning(dev),) if w and w not in busy]
        # The global finalists are re-timed together first, so the per-layer stage works under
        # the settings that will be recommended; a per-layer combination that reaches the
        # finalists is then re-timed with them, interleaved, before it can be picked.
        trial_baseline = outcome.baseline
        retimed, retime_error = retime_finalists(workload, outcome, dev, sp, options,
                                                 deadline=plan.layers, evaluator=evaluator)  # fmt: skip
        choices: list[LayerChoice] = []
        stats: dict[str, int] = {}
        if per_layer and retime_error is None:
            options.deadline = plan.layers
            choices, combined = per_layer_stage(workload, outcome, dev, sp, options, stats,
                                                evaluator=evaluator)  # fmt: skip
            if combined is not None:
                again, retime_error = retime_finalists(
                    workload, outcome, dev, sp, options, only_with=combined, deadline=plan.end,
                    evaluator=evaluator,
                )  # fmt: skip
                retimed = again or retimed
    finally:
        evaluator.close()
    notes = budget_notes(outcome, stats, budget_s or sp.budget.time_s, start)
    outcome.elapsed_s = time.perf_counter() - start  # the whole run, every stage
    moved = machine_moved(trial_baseline, outcome.baseline)
    if moved is not None:
        busy.insert(0, moved)  # first among the result's warnings (the summary prints them)
    advice = build_advice(outcome, workload.info, mode, sp.name, sp.min_gain, choices, retimed,
                          retime_error=retime_error, notes=notes,
                          unsettled=None if accept_noisy else moved)  # fmt: skip
    if busy and advice.config.result is not None:
        result = advice.config.result.model_copy(update={"warnings": busy[:2]})
        advice.config = advice.config.model_copy(update={"result": result})
    return advice


def machine_moved(trial: TrialResult, retimed: TrialResult, factor: float = 2.0) -> str | None:
    """Why the measurements cannot be trusted when PyTorch's default itself moved by more than
    `factor` between its trial and the re-time (other load, clock changes): then every
    comparison made across that time is suspect. None when it held still (or was not re-timed).
    (Smaller moves happen on a quiet machine too: a small step's trial, early in a process, can
    measure 1.4x its re-time.)"""
    if not retimed.retimed or trial.measurement is None or retimed.measurement is None:
        return None
    before, after = trial.measurement.median_ms, retimed.measurement.median_ms
    if before <= 0 or after <= 0 or max(before / after, after / before) <= factor:
        return None
    return (
        f"the machine was not steady: PyTorch's default measured {before:.3f} ms in its trial "
        f"and {after:.3f} ms when re-timed ({max(before / after, after / before):.1f}x apart)"
    )


@dataclass(frozen=True)
class BudgetPlan:
    """When each stage must stop starting work (`time.perf_counter()` values)."""

    search: float  # the global knobs
    layers: float  # the first re-time and the per-layer stage
    end: float  # the final re-time: the run ends about here


def budget_plan(start: float, budget_s: float, space: SearchSpace, per_layer: bool) -> BudgetPlan:
    """Split a run's time budget: the final interleaved re-time keeps what it needs (a trial's
    time cap per finalist, up to a quarter of the budget); with a per-layer stage, the global
    search keeps half of the rest and the layers the other half (a search that finishes early
    leaves its time to the layers)."""
    n = space.retime_top + 2  # the finalists, the default and a per-layer combination
    reserve = min(0.25 * budget_s, 1.5 * n * space.timing.max_time_s)
    end = start + budget_s
    layers = end - reserve
    search = start + (layers - start) * (0.5 if per_layer else 1.0)
    return BudgetPlan(search, layers, end)


def budget_notes(
    outcome: SearchOutcome, stats: dict[str, int], budget_s: float, start: float
) -> list[str]:
    """What the time budget left out, said plainly; and what was reused from earlier runs."""
    notes = []
    if outcome.not_measured:
        shown = ", ".join(outcome.not_measured[:5])
        more = f" and {len(outcome.not_measured) - 5} more" if len(outcome.not_measured) > 5 else ""
        notes.append(
            f"the {budget_s:g} s budget ran out before {len(outcome.not_measured)} "
            f"candidate(s) were measured: {shown}{more}"
        )
    if stats.get("unmeasured"):
        notes.append(
            f"the {budget_s:g} s budget ran out before {stats['unmeasured']} layer group(s) were "
            "measured: they keep PyTorch's native convolution"
        )
    if stats.get("combination"):
        notes.append(
            f"the {budget_s:g} s budget ran out before the per-layer choices ({stats['combination']} "
            "layer(s)) could be measured on the whole model: not applied"
        )
    if stats.get("reused"):
        shared = stats.get("shared", 0)
        notes.append(
            f"{stats['reused']} layer measurement(s) reused instead of measured again"
            + (f" ({shared} from other studies in this storage)" if shared else "")
        )
    return notes
