"""The advise pipeline, top to bottom: workload -> space -> search -> per-layer stage -> compile
stage -> final re-time -> final check where the user runs it -> Advice.

Shared by `advisor.advise()` and the CLI so both do exactly the same thing.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from advisor.advice import Advice, build_advice
from advisor.compiled import leave_for_training, shared_measurement_cache
from advisor.config import FinalCheck
from advisor.device.environment import resolve_device
from advisor.device.global_state import global_state_kept
from advisor.errors import AdvisorError
from advisor.execute.benchmark_processes import BenchmarkSplit
from advisor.execute.evaluators import Evaluator
from advisor.execute.probe import hand_over, launch_worker, probe_model
from advisor.measure.machine_load import CpuUsage, busy_warning
from advisor.measure.results import TrialResult
from advisor.search.options import Progress, SearchOptions, SearchOutcome
from advisor.search.pick import beyond_noise, decide
from advisor.search.pick_gates import gated_pick
from advisor.search.run import make_evaluator, search
from advisor.search.storage import open_storage
from advisor.space import (
    SearchSpace,
    benchmark_finalists,
    compile_modes,
    load_space,
    with_tolerances,
)
from advisor.stages.benchmark_twins import run_benchmark_twins
from advisor.stages.budget import BudgetPlan, budget_notes, budget_plan
from advisor.stages.compiling import FIRST_COMPILE_S, compile_candidates, compile_race
from advisor.stages.confirm import check_pick
from advisor.stages.effort import effort_of
from advisor.stages.final_check import FreshProcess
from advisor.stages.finalists import after_compile, machine_moved, retime_finalists
from advisor.stages.later import measure_later
from advisor.stages.per_layer import LayerChoice, per_layer_stage
from advisor.stages.walltime import LOAD, StageClock, breakdown
from advisor.workload.args import make_workload
from advisor.workload.build import Workload

log = logging.getLogger("advisor")

# How long, beyond the run's time so far, the first trial waits for the final check's process
# to load (it loads beside the probe, so it is nearly always ready); one still loading is ended.
SPARE_WAIT_S = 5.0


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
    effort: str = "default",
    on_eager: Callable[[Advice], None] | None = None,
    process_started: float | None = None,
    **workload_args: Any,
) -> Advice:
    """One advise run (see the module's docstring). `effort` is quick, default or full
    (advisor.stages.effort). `on_eager` receives the eager answer, final check included, before
    the compile stage starts (not called where no compile stage runs): the CLI writes and prints
    it, so an interrupted compile leaves it in place. `process_started` (a `time.perf_counter`
    value): where the run began, for the `advisor` command, whose own start-up is then the first
    of the run's process starts."""
    start = time.perf_counter() if process_started is None else process_started
    clock = StageClock(start, _stage_reporter(progress))
    if process_started is not None:
        clock.process_start(time.perf_counter() - start)
    usage = CpuUsage()  # other processes' share of the CPU over the whole run
    if mode not in ("infer", "train"):
        raise AdvisorError(f"unknown mode {mode!r}; use infer or train")
    if budget_s is not None and not budget_s > 0:
        raise AdvisorError(f"--budget must be a positive time, got {budget_s:g} s")
    level = effort_of(effort)
    if steps is not None and steps < 1:
        raise AdvisorError(f"--steps must be a positive number of training steps, got {steps}")
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
        on_start=clock.process_start,
        steps=steps,
        fresh=fresh,
        screen=level.screens,
        every_layer_group=level.every_layer_group,
        check_always=level.check_always,
    )
    dev = resolve_device(device)
    sp = level.space(with_tolerances(load_space(space, dev), tolerances or {}), dev)
    contest = sp.contest(steps)
    # The same question asked again (the default storage, not fresh) is answered from the
    # stored advice, before anything is probed or loaded; the key reads run_advise's arguments.
    from advisor.reuse import AdviceReuse

    reuse = AdviceReuse.lookup(run_advise, locals(), dev, sp)
    if reuse.advice is not None:
        return reuse.advice
    compiles = bool(compile_modes(sp, dev)[0])
    # Compiled candidates' caches are shared by the run's processes: a re-time or the final
    # check compiles warm from what a trial compiled cold.
    with contextlib.ExitStack() as stack:
        run_cache = stack.enter_context(shared_measurement_cache()) if compiles else None
        probed, spare = None, None
        if isolate and workload_args.get("model_file") is not None:
            # The final check's fresh process loads the model file beside the probe (both
            # isolated), so the check later pays for its timing only (final_check.FreshProcess).
            # Not at quick, whose check runs only where the margin is within noise: the spare
            # would compete with the probe for the CPU on every run to save its start on a few.
            if level.check_always:
                spare = stack.enter_context(
                    contextlib.closing(FreshProcess(("args", workload_args)))
                )
            # The user's code runs here only after it ran once, isolated, under the trial
            # limit; the child that ran it goes on as the run's worker.
            probed = probe_model(workload_args, mode, str(dev), trial_timeout_s, keep=True)
        # A model file the probe loaded is loaded here only when a stage needs it (the
        # per-layer stage; none at quick effort): its imports would be paid twice.
        deferred = probed.deferred(clock.deferred_load) if probed is not None else None
        workload: Workload
        if deferred is not None:
            workload = deferred
        else:
            try:  # what the user's code sets at import is not the caller's
                with global_state_kept():
                    workload = make_workload(**workload_args)
            except BaseException:
                if probed is not None:
                    probed.close()
                raise
        per_layer = not workload.is_layer and sp.per_layer
        # One evaluator (one worker process when isolated) serves every stage: each worker
        # start costs an interpreter, torch's import and the model's set-up.
        evaluator = make_evaluator(workload, dev, sp, options)
        stack.callback(evaluator.close)  # on an error before the stages (closed again: a no-op)
        hand_over(probed, evaluator)
        if spare is not None and spare.ready(SPARE_WAIT_S + time.perf_counter() - start):
            spare.close()  # not loaded yet (or failed): the check starts its own, as it would
            spare = None
        if storage != "memory":
            open_storage(storage)  # a storage that cannot be opened is bad input: said first
        if probed is None:
            launch_worker(evaluator)  # its start overlaps the study's opening and planning
        twins_ahead = level.benchmark_finalists > 0 and benchmark_finalists(sp, dev)
        if isinstance(evaluator, BenchmarkSplit) and twins_ahead:
            evaluator.launch_on()  # cudnn.benchmark's process loads while the search runs
        clock.until_now(LOAD)
        # The stages share what the start-up and the load left of the budget.
        plan = budget_plan(start, budget_s or sp.budget.time_s, sp, per_layer,
                           compiles and not workload.is_layer, now=time.perf_counter())  # fmt: skip
        options.deadline = plan.search
        checks: dict[str, tuple[FinalCheck | None, str | None]] = {}
        layer_results: list[TrialResult] = []  # the per-layer stage's own measurements
        spares = [spare] if spare is not None else []  # the first check uses it; a later one
        # (a compiled pick after the eager answer's) starts its own

        def conclude(retimed: int, retime_error: str | None, choices: list[LayerChoice],
                     stats: dict[str, int], answer: str = "final") -> Advice:  # fmt: skip
            """The advice from the results so far, its pick checked where the user runs it
            once per pick (the eager answer's check stands if the compile stage keeps its pick)."""
            notes = budget_notes(outcome, stats, budget_s or sp.budget.time_s, start)
            notes += [n for n in (outcome.screen_note, level.note()) if n]
            share = usage.others_share()
            moved = machine_moved(trial_baseline, outcome.baseline, share)
            unsteady = None if accept_noisy else moved
            check, check_error = None, None
            if retime_error is None and unsteady is None:
                pick = decide(outcome.results, outcome.baseline, contest)
                key = pick.chosen.settings.model_dump_json()
                clear = None if level.check_always else beyond_noise(pick, outcome.results,
                                                                      outcome.baseline, contest)
                if clear is not None:
                    notes.append(clear)
                elif key in checks:
                    check, check_error = checks[key]
                else:
                    with clock.stage("final check"):
                        check, check_error = check_pick(workload, outcome, dev, sp, options,
                                                        plan, share, notes,
                                                        spares.pop() if spares else None)  # fmt: skip
                    checks[key] = (check, check_error)
            outcome.elapsed_s = time.perf_counter() - start  # the whole run, every stage
            share = usage.others_share()
            advice = build_advice(outcome, workload.info, mode, sp.name, choices,
                                  retimed, retime_error=retime_error, notes=notes,
                                  unsteady=unsteady, contest=contest, final=check,
                                  final_error=check_error, other_load=share, effort=level.name,
                                  answer=answer,
                                  stages_done=not (stats.get("unmeasured")
                                                   or stats.get("combination")),
                                  stage_s=breakdown(clock.spans, outcome.results,
                                                    outcome.elapsed_s, clock.paid,
                                                    layer_results,
                                                    [c for c, _ in checks.values() if c]))  # fmt: skip
            warnings = [w for w in (moved, busy_warning(share)) if w]  # the summary prints
            if warnings and advice.config.result is not None:
                result = advice.config.result.model_copy(update={"warnings": warnings})
                advice.config = advice.config.model_copy(update={"result": result})
            return advice

        try:
            with clock.stage("global knobs"):
                outcome = search(workload, dev, sp, options, evaluator=evaluator)
                run_benchmark_twins(outcome, sp, dev, level.benchmark_finalists, evaluator,
                                    plan.search, contest, progress)  # fmt: skip
            trial_baseline = outcome.baseline
            compiling = plan.compile is not None and not workload.is_layer
            retimed, retime_error, choices, stats = _eager_stages(workload, outcome, dev, sp,
                                                                  options, plan, per_layer,
                                                                  evaluator, clock, compiling,
                                                                  layer_results)  # fmt: skip
            if compiling and retime_error is None:
                if level.eager_first:
                    eager = conclude(retimed, retime_error, choices, stats, "eager")
                    if on_eager is not None:
                        on_eager(eager)
                again, retime_error = _compile_stage(workload, outcome, dev, sp, options, plan,
                                                     evaluator, clock)  # fmt: skip
                retimed = again or retimed
        finally:
            evaluator.close()
        advice = conclude(retimed, retime_error, choices, stats)
        if run_cache is not None and advice.settings.compiled:
            _leave_compile_caches(advice, run_cache)
    reuse.store(advice)  # a complete answer, for the same question asked again
    return advice


def _leave_compile_caches(advice: Advice, run_cache: Path) -> None:
    """A compiled recommendation: the run's compile artifacts are left in the Inductor cache
    the user's training reads, and the compile note says so (its first step then costs what
    the final check's first call did, not a cold compile)."""
    target = leave_for_training(run_cache)
    result = advice.config.result
    if target is None or result is None or result.compile_note is None:
        return
    note = (f"{result.compile_note}; this run left its compile caches in {target} "
            "(Inductor's cache folder), which your torch.compile reads on this machine")  # fmt: skip
    advice.config = advice.config.model_copy(
        update={"result": result.model_copy(update={"compile_note": note})}
    )


def _eager_stages(
    workload: Workload,
    outcome: SearchOutcome,
    dev: torch.device,
    sp: SearchSpace,
    options: SearchOptions,
    plan: BudgetPlan,
    per_layer: bool,
    evaluator: Evaluator,
    clock: StageClock,
    compiling: bool,
    layer_results: list[TrialResult],
) -> tuple[int, str | None, list[LayerChoice], dict[str, int]]:
    """After the search: the re-time, and where the model's layers are tuned the per-layer
    stage before it: the eager answer (the layer measurements it takes go to `layer_results`).
    Returns how many were re-timed, why the re-time failed, the per-layer choices and the
    stage's counts."""
    # One re-time of the eager candidates, after the per-layer stage where there is one: the
    # stage works from the search's gated pick, and its combination is timed interleaved with
    # the global finalists before it can be picked.
    contest = sp.contest(options.steps)
    choices: list[LayerChoice] = []
    stats: dict[str, int] = {}
    end: float | None = plan.compile or plan.layers
    if per_layer:
        with clock.stage("global knobs"):  # the per-layer stage tunes the layers of a gated pick
            gated_pick(outcome, evaluator, contest, plan.layers, options.progress)
        options.deadline = plan.layers
        with clock.stage("per-layer"):
            choices = per_layer_stage(workload, outcome, dev, sp, options, stats,
                                      evaluator=evaluator, measured=layer_results)  # fmt: skip
        end = plan.layers if compiling else plan.retime
    if workload.is_layer:  # says why no compiled candidate is measured
        compile_candidates(outcome, sp, dev, False, contest, layer=True)
    with clock.stage("re-time"):
        retimed, retime_error = retime_finalists(workload, outcome, dev, sp, options,
                                                 deadline=end, evaluator=evaluator)  # fmt: skip
    with clock.stage("global knobs"):
        gated_pick(outcome, evaluator, contest, end, options.progress, options.check_always)
    return retimed, retime_error, choices, stats


def _compile_stage(
    workload: Workload,
    outcome: SearchOutcome,
    dev: torch.device,
    sp: SearchSpace,
    options: SearchOptions,
    plan: BudgetPlan,
    evaluator: Evaluator,
    clock: StageClock,
) -> tuple[int, str | None]:
    """torch.compile on the eager answer's settings (advisor.stages.compiling), its candidates
    re-timed with the finalists, interleaved, before one can be picked: how many were re-timed,
    and why the re-time failed."""
    options.deadline = plan.compile
    contest = sp.contest(options.steps)
    todo = compile_candidates(outcome, sp, dev, len(workload.shape_weights) > 1, contest)
    eager = decide(outcome.results, outcome.baseline, contest)  # no compiled one yet
    with clock.stage("compile"):
        new = measure_later(outcome, todo, evaluator, plan.compile, options.progress,
                            compile_race(outcome, contest), stage="compile",
                            first_s=FIRST_COMPILE_S)  # fmt: skip
    if not new:
        return 0, None
    with clock.stage("re-time"):
        retimed, why = retime_finalists(workload, outcome, dev, sp, options, only_with=new,
                                        deadline=plan.retime, evaluator=evaluator,
                                        among=after_compile(eager, new))  # fmt: skip
    # A pick whose gate waited is gated now, after a failed re-time too (nothing is picked
    # ungated); a compiled pick's capture under dropout is a compile: it counts with the stage's.
    with clock.stage("compile"):
        gated_pick(outcome, evaluator, contest, plan.end, options.progress, options.check_always)
    return retimed, why


def _stage_reporter(
    progress: Callable[[Progress], None] | None,
) -> Callable[[str, float, float], None] | None:
    """Each span's end, told to the progress display (a line with its time and its stage's)."""
    if progress is None:
        return None
    return lambda stage, seconds, all_s: progress(Progress(0, 0, None, None, all_s, stage, seconds))
