"""The advise pipeline, top to bottom: workload -> space -> search -> per-layer stage -> compile
stage -> final re-time -> final check where the user runs it -> Advice.

Shared by `advisor.advise()` and the CLI so both do exactly the same thing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from advisor.advice import Advice, build_advice
from advisor.compiled import shared_measurement_cache
from advisor.config import FinalCheck
from advisor.device.environment import resolve_device
from advisor.device.global_state import global_state, restore_global_state
from advisor.errors import AdvisorError, first_line
from advisor.execute.evaluators import Evaluator, Lent
from advisor.execute.ownership import owner_id
from advisor.execute.probe import hand_over, probe_model
from advisor.execute.retime import finalists
from advisor.measure.machine_load import BUSY_SHARE, CpuUsage, busy_warning
from advisor.measure.results import TrialResult
from advisor.search import Progress, SearchOptions, SearchOutcome, make_evaluator, search
from advisor.search.pick import pick_final, pick_for_steps
from advisor.search.storage import (
    FinalCheckRecord,
    LayerStore,
    RetimeRecord,
    SharedRecord,
    open_storage,
)
from advisor.space import SearchSpace, compile_modes, load_space, with_tolerances
from advisor.stages.budget import BudgetPlan, budget_notes, budget_plan
from advisor.stages.compiling import compile_candidates, run_compile_stage
from advisor.stages.final_check import CheckFailed, FreshProcess, check_policy, final_check
from advisor.stages.per_layer import (
    LayerChoice,
    choose_layer_impls,
    layers_map,
)
from advisor.workload.args import make_workload
from advisor.workload.build import (
    Workload,
)

log = logging.getLogger("advisor")

# How long, beyond the time the run has taken so far, the first trial waits for the final
# check's process to finish loading: it loads beside the probe and the run's own load, so it is
# nearly always ready by then; one that is not (a load that hangs) is ended, not waited for.
SPARE_WAIT_S = 5.0


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
    only_with: Sequence[TrialResult] | None = None,
    deadline: float | None = None,
    evaluator: Evaluator | None = None,
) -> tuple[int, str | None]:
    """Re-time the finalists interleaved and put the fresh measurements in the outcome.

    With `only_with`, re-time only if one of those candidates is among the finalists. Returns
    how many were re-timed (0 when skipped: fewer than two finalists) and, when the re-time
    failed, why.
    """
    top = space.retime_top
    fin = finalists(outcome.results, outcome.baseline, top, space.min_gain) if top else []
    if len(fin) < 2 or (only_with is not None and not any(r is w for r in fin for w in only_with)):
        return 0, None
    left = None if deadline is None else max(0.0, deadline - time.perf_counter())
    record, key = _shared_record(RetimeRecord, options, outcome.study_name, fin)
    # Another run of this study that re-times these finalists: use its result, so both agree.
    fresh = (
        record.taken(key, owner_id(), options.trial_timeout_s * len(fin))
        if record is not None
        else None
    )
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


_Record = TypeVar("_Record", bound=SharedRecord[Any])


def _shared_record(
    kind: type[_Record], options: SearchOptions, study_name: str, of: list[TrialResult]
) -> tuple[_Record | None, str]:
    """Where what is measured of these results (their re-time, the final check) is shared with
    other runs of the study (not for an in-memory study, which no other run can see)."""
    key = hashlib.sha256(
        json.dumps(sorted(r.settings.model_dump_json() for r in of)).encode()
    ).hexdigest()[:16]
    if options.storage == "memory":
        return None, key
    try:
        return kind(open_storage(options.storage), study_name), key
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
    steps: int | None = None,
    **workload_args: Any,
) -> Advice:
    start = time.perf_counter()
    usage = CpuUsage()  # other processes' share of the CPU over the whole run
    if mode not in ("infer", "train"):
        raise AdvisorError(f"unknown mode {mode!r}; use infer or train")
    if budget_s is not None and not budget_s > 0:
        raise AdvisorError(f"--budget must be a positive time, got {budget_s:g} s")
    if steps is not None and steps < 1:
        raise AdvisorError(f"--steps must be a positive number of training steps, got {steps}")
    dev = resolve_device(device)
    sp = with_tolerances(load_space(space, dev), tolerances or {})
    compiles = bool(compile_modes(sp, dev)[0])
    # Compiled candidates' caches are shared by the run's processes: a re-time or the final
    # check compiles warm from what a trial compiled cold.
    with contextlib.ExitStack() as stack:
        if compiles:
            stack.enter_context(shared_measurement_cache())
        probed, spare = None, None
        if isolate and workload_args.get("model_file") is not None:
            # The final check's fresh process loads the model file beside the probe (both
            # isolated), so the check later pays for its timing only (final_check.FreshProcess).
            spare = stack.enter_context(contextlib.closing(FreshProcess(("args", workload_args))))
            # The user's code runs here only after it ran once, isolated, under the trial
            # limit; the child that ran it goes on as the run's worker.
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
        plan = budget_plan(start, budget_s or sp.budget.time_s, sp, per_layer,
                           compiles and not workload.is_layer)  # fmt: skip
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
        # One evaluator (one worker process when isolated) for the whole model's trials, its
        # per-layer combination, its compiled candidates and the re-times: each worker start
        # costs an interpreter, torch's import and the model's set-up (about 4 s on 2 cores).
        evaluator = make_evaluator(workload, dev, sp, options)
        hand_over(probed, evaluator)
        if spare is not None and spare.ready(SPARE_WAIT_S + time.perf_counter() - start):
            spare.close()  # not loaded yet (or failed): the check starts its own, as it would
            spare = None
        try:
            outcome = search(workload, dev, sp, options, evaluator=evaluator)
            trial_baseline = outcome.baseline
            retimed, retime_error, choices, stats = _stages(workload, outcome, dev, sp, options,
                                                            plan, per_layer, evaluator)  # fmt: skip
        finally:
            evaluator.close()
        notes = budget_notes(outcome, stats, budget_s or sp.budget.time_s, start)
        moved = machine_moved(trial_baseline, outcome.baseline)
        unsettled = None if accept_noisy else moved
        share = usage.others_share()
        check, check_error = None, None
        if retime_error is None and unsettled is None:
            check, check_error = _final_check(workload, outcome, dev, sp, options, steps, plan,
                                              share, notes, spare)  # fmt: skip
    outcome.elapsed_s = time.perf_counter() - start  # the whole run, every stage
    share = usage.others_share()
    warnings = [w for w in (moved, busy_warning(share)) if w]  # the summary prints them
    advice = build_advice(outcome, workload.info, mode, sp.name, sp.min_gain, choices, retimed,
                          retime_error=retime_error, notes=notes, unsettled=unsettled,
                          steps=steps, final=check, final_error=check_error,
                          other_load=share)  # fmt: skip
    if warnings and advice.config.result is not None:
        result = advice.config.result.model_copy(update={"warnings": warnings})
        advice.config = advice.config.model_copy(update={"result": result})
    return advice


def _stages(
    workload: Workload,
    outcome: SearchOutcome,
    dev: torch.device,
    sp: SearchSpace,
    options: SearchOptions,
    plan: BudgetPlan,
    per_layer: bool,
    evaluator: Evaluator,
) -> tuple[int, str | None, list[LayerChoice], dict[str, int]]:
    """After the search: the first re-time, the per-layer stage, the compile stage and the
    re-times they call for. Returns how many were re-timed last, why a re-time failed, the
    per-layer choices and the per-layer stage's counts."""
    # The global finalists are re-timed together first, so the per-layer and compile stages
    # work from the settings that would be recommended; a candidate of theirs that reaches the
    # finalists is then re-timed with them, interleaved, before it can be picked.
    first = plan.layers if per_layer else (plan.compile or plan.layers)
    retimed, retime_error = retime_finalists(workload, outcome, dev, sp, options,
                                             deadline=first, evaluator=evaluator)  # fmt: skip
    choices: list[LayerChoice] = []
    stats: dict[str, int] = {}
    if per_layer and retime_error is None:
        options.deadline = plan.layers
        choices, combined = per_layer_stage(workload, outcome, dev, sp, options, stats,
                                            evaluator=evaluator)  # fmt: skip
        if combined is not None:
            again, retime_error = retime_finalists(
                workload, outcome, dev, sp, options, only_with=[combined],
                deadline=plan.compile or plan.retime, evaluator=evaluator,
            )  # fmt: skip
            retimed = again or retimed
    if workload.is_layer:
        compile_candidates(outcome, sp, dev, False, layer=True)  # says why none is measured
    if plan.compile is not None and retime_error is None:
        options.deadline = plan.compile
        todo = compile_candidates(outcome, sp, dev, len(workload.shape_cases) > 1)
        compiled = run_compile_stage(outcome, todo, evaluator, options.storage, plan.compile,
                                     options.progress)  # fmt: skip
        if compiled:
            again, retime_error = retime_finalists(workload, outcome, dev, sp, options,
                                                   only_with=compiled, deadline=plan.retime,
                                                   evaluator=evaluator)  # fmt: skip
            retimed = again or retimed
    return retimed, retime_error, choices, stats


def _final_check(
    workload: Workload,
    outcome: SearchOutcome,
    dev: torch.device,
    sp: SearchSpace,
    options: SearchOptions,
    steps: int | None,
    plan: BudgetPlan,
    share: float | None,
    notes: list[str],
    spare: FreshProcess | None = None,
) -> tuple[FinalCheck | None, str | None]:
    """The recommendation re-timed against the default where the user runs it (a fresh
    process for a recreatable workload in an isolated run; else this process): the check, or
    why it could not be made. Nothing to check when the default is the pick."""
    pick, _ = pick_for_steps(outcome.results, outcome.baseline, sp.min_gain, steps)
    if pick.chosen.settings == outcome.baseline.settings:
        return None, None
    if dev.type == "cuda" and pick.chosen.settings.cudnn_benchmark:
        # One process cannot time it against the default: cuDNN's plan cache ignores the flag
        # (advisor/execute/benchmark_processes.py), so the re-time compared them a process each.
        notes.append(
            "no final check in a fresh process: cudnn.benchmark cannot be timed against the "
            "default in one process (cuDNN's plan cache ignores the flag); the re-time compared "
            "them in a process each"
        )
        return None, None
    if options.progress is not None:
        options.progress(Progress(0, 1, None, pick.chosen, 0.0, stage="final check"))
    left = max(0.0, plan.end - time.perf_counter())
    # Runs sharing the study check the pick once and agree (as with the re-time).
    record, key = _shared_record(FinalCheckRecord, options, outcome.study_name,
                                 [outcome.baseline, pick.chosen])  # fmt: skip
    check = record.taken(key, owner_id(), options.trial_timeout_s) if record is not None else None
    if check is None:
        try:
            check = final_check(
                workload, dev, options.mode, check_policy(sp.timing.policy(), left),
                outcome.baseline, pick.chosen,
                fresh=options.isolate and workload.info.recreatable,
                busy=share is not None and share > BUSY_SHARE,
                timeout_s=options.trial_timeout_s,
                spare=spare,
            )  # fmt: skip
        except CheckFailed as e:
            log.warning("final check failed: %s", e)
            return None, str(e)
        if record is not None:
            record.put(key, check)
    if options.progress is not None:
        options.progress(Progress(1, 1, None, pick.chosen, 0.0, stage="final check"))
    return check, None


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
