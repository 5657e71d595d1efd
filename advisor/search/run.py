"""Running trials: the objective (measure, gate, record) and the loop every process runs; the
outcome is read back from the study by `advisor.search.outcome`."""

from __future__ import annotations

import dataclasses
import logging
import time
import warnings
from collections.abc import Callable
from typing import Any

import optuna
import torch
from optuna.trial import FrozenTrial, TrialState

from advisor.execute.evaluators import Evaluator
from advisor.execute.make_evaluator import new_evaluator
from advisor.execute.ownership import owner_id
from advisor.knobs import Settings
from advisor.measure.results import TrialResult
from advisor.measure.verdict import PrecisionCheck
from advisor.search.deferred_gates import leaders, settle_pending
from advisor.search.options import (
    CandidateFailed,
    Progress,
    SearchOptions,
    SearchOutcome,
    WorkSummary,
)
from advisor.search.outcome import check_key, memory_checked, read_outcome, stored_checks
from advisor.search.point_lock import PointLocks
from advisor.search.screen import inversion, record_dropped, screen
from advisor.search.shared_checks import reused
from advisor.search.sqlite_claim import TrialClaims
from advisor.search.study import (
    Plan,
    enqueue_missing,
    evaluated,
    fail_stale,
    first_results,
    has_heartbeat,
    open_plan,
    point_key,
    reclaim_orphans,
    settings_from,
    trial_params,
)
from advisor.space import SearchSpace
from advisor.workload.build import Workload

log = logging.getLogger("advisor")
WAIT_S = 1.0  # how often a process waiting for other workers' trials looks again


def make_evaluator(
    workload: Workload, device: torch.device, space: SearchSpace, options: SearchOptions
) -> Evaluator:
    """The evaluator these options ask for (see `advisor.execute.evaluators`)."""
    return new_evaluator(
        workload,
        device,
        space,
        options.mode,
        isolate=options.isolate,
        timeout_s=options.trial_timeout_s,
        on_start=options.on_start,
    )


def _run(
    plan: Plan,
    device: torch.device,
    space: SearchSpace,
    options: SearchOptions,
    evaluator: Evaluator,
    start: float,
    gate_after: bool = False,
) -> tuple[int, int]:
    """Run trials until every point has a result (grid) or the budget is spent, waiting for
    other processes' trials; returns (evaluated, failed) by this process. `gate_after`: then
    gate what could be picked and was measured without its gate (`advisor.search.deferred_gates`; the
    process that answers does, not a `work` process)."""
    study, varying, fixed, default = plan.study, plan.varying, plan.fixed, plan.cands[0]
    allowed = {c.model_dump_json() for c in plan.cands}
    owner = owner_id()
    best: list[float] = []
    mine = {"evaluated": 0, "failed": 0}

    shared = _unlocked(plan.storage)
    locks = PointLocks(plan.storage, plan.name)
    study_id = plan.storage.get_study_id_from_name(plan.name)
    claims = TrialClaims(plan.storage, study_id, owner) if shared else None

    def objective(trial: optuna.Trial) -> float | tuple[float, float]:
        if claims is None:
            trial.set_user_attr("worker", owner)
        elif not claims.claim(trial):
            # SQLite cannot lock a row: two processes may pop the same waiting trial. The first
            # to claim it owns it; the other leaves it alone (and does not tell it).
            raise _NotMine
        params = {k: trial.suggest_categorical(k, v) for k, v in varying.items()}
        settings = settings_from(params, fixed)
        if settings.model_dump_json() not in allowed:
            trial.set_user_attr("reason", "excluded by a skip rule of the search space")
            raise optuna.TrialPruned()
        if settings != default and time.perf_counter() >= deadline:
            # Past the budget only PyTorch's default is still measured (the baseline). optuna's
            # timeout is looked at between trials, so without this a loop kept alive for the
            # default starts one more candidate after it: on a busy 2-core machine a bf16
            # candidate's timing and training check, 5 s past a 12 s budget. Left unmeasured
            # (listed as such), a later run of the study measures it.
            trial.set_user_attr("reason", "the time budget ran out before it started")
            raise optuna.TrialPruned()
        key = point_key(params)
        if not locks.hold(key):
            trial.set_user_attr("reason", "duplicate: another process is measuring this point")
            raise optuna.TrialPruned()
        try:
            return measure(trial, params, settings, key)
        finally:
            locks.release(key)

    def measure(
        trial: optuna.Trial, params: dict[str, Any], settings: Settings, key: str
    ) -> float | tuple[float, float]:
        # Under the point's lock (PostgreSQL), what other processes committed, read directly:
        # optuna's trial cache may not have fetched a trial another process just added.
        others = (
            plan.storage.get_all_trials(study_id, deepcopy=False)
            if locks.active
            else study.get_trials(deepcopy=False)
        )
        for other in others:
            if other.number == trial.number or point_key(trial_params(other)) != key:
                continue
            lower = other.number < trial.number
            if evaluated(other) or (
                lower and other.state in (TrialState.RUNNING, TrialState.WAITING)
            ):
                trial.set_user_attr("reason", f"duplicate of trial {other.number}")
                raise optuna.TrialPruned()
        race = None
        if space.race and not plan.multi and settings != default:
            leader, fastest = leaders(study, options.max_memory_mb, default)
            if leader is not None and leader.measurement is not None:
                bar = fastest.measurement.ci_high_ms if fastest and fastest.measurement else None
                # a precision not judged yet is judged once the search ends (`settle_pending`)
                race = dataclasses.replace(
                    space.race_against(leader.measurement.ci_high_ms, bar), defer_gate=True
                )
        raw = evaluator(settings, race=race, time_left_s=max(0.0, deadline - time.perf_counter()))
        if raw.precision_check is not None and raw.precision_check.own_path != Settings():
            record(raw.precision_check)
        trial.set_user_attr("result", raw.model_dump(mode="json"))
        trial.set_user_attr("label", settings.label())
        mine["evaluated"] += 1
        result = memory_checked(raw, options.max_memory_mb, default)
        if result.status == "stopped":  # raced out: its (partial) time still guides TPE
            trial.set_user_attr("reason", result.reason)
            if plan.multi:
                return result.median_ms, float(result.peak_memory_mb or 0.0)
            return result.median_ms
        if result.status != "ok":
            mine["failed"] += result.status == "failed"
            trial.set_user_attr("reason", result.reason)
            raise CandidateFailed(result.reason)
        if not result.gate_pending:  # the best accepted so far, for the progress display
            best.append(result.median_ms)
        if plan.multi:
            return result.median_ms, float(result.peak_memory_mb or 0.0)
        return result.median_ms

    def record(check: PrecisionCheck) -> None:
        # Judged once per precision per model: kept with the study for every later candidate,
        # process and run of it, and for this workload's other studies.
        study.set_user_attr(check_key(check), check.model_dump(mode="json"))
        if plan.shared_checks is not None:
            plan.shared_checks.add(check)
        evaluator.know([check])

    def on_trial(study: optuna.Study, trial: FrozenTrial) -> None:
        if options.progress is not None and evaluated(trial):
            done = _points_done(study)
            last = TrialResult.model_validate(trial.user_attrs["result"])
            options.progress(
                Progress(
                    done, plan.total, min(best) if best else None, last, time.perf_counter() - start
                )
            )

    def on_gated(result: TrialResult) -> None:
        if result.status == "ok":
            best.append(result.median_ms)
        if options.progress is not None:
            options.progress(Progress(_points_done(study), plan.total, min(best, default=None),
                                      result, time.perf_counter() - start))  # fmt: skip

    deadline = options.deadline if options.deadline is not None else start + space.budget.time_s
    # Verdicts judged before this run: this study's, then other studies' of the workload
    # (`--effort quick` before the default effort); `--fresh` judges again.
    known = reused(stored_checks(study))
    if plan.shared_checks is not None and not options.fresh:
        known += plan.shared_checks.read()
    evaluator.know(known)
    try:
        # `race: false` promises every candidate measured and gated in full: no screen either
        screening = options.screen and space.race
        screened = screen(plan, evaluator, options, deadline, start) if screening else None
        _loop(plan, space, device, objective, on_trial, deadline, shared)
        if screened is not None and screened.dropped:
            full = first_results(study)
            why = inversion(screened, plan, full, space.min_gain)
            if why is None:
                record_dropped(screened, plan)
            else:  # the guard: the screen's ranking does not hold here; time them all
                study.set_user_attr("screen_fallback", why)
                plan.cands = screened.full_plan
                _loop(plan, space, device, objective, on_trial, deadline, shared)
        if gate_after:
            settle_pending(plan, evaluator, space.min_gain, options.max_memory_mb, deadline,
                           record, known + stored_checks(study), on_gated)  # fmt: skip
    finally:
        locks.close()
    return mine["evaluated"], mine["failed"]


def _loop(
    plan: Plan,
    space: SearchSpace,
    device: torch.device,
    objective: Callable[[optuna.Trial], float | tuple[float, float]],
    on_trial: Callable[[optuna.Study, FrozenTrial], None],
    deadline: float,
    shared: bool,
) -> None:
    """Until every point has a result (grid) or the budget is spent, waiting for other
    processes' trials."""
    study = plan.study
    stalled = 0
    while (remaining := deadline - time.perf_counter()) > 0 or not _default_done(plan):
        remaining = max(remaining, 1.0)  # PyTorch's default is always measured: the baseline
        # SQLite trials run in this loop, not optuna's: they do not beat (`_optimize`).
        reclaim_orphans(study, has_heartbeat(plan.storage) and not shared)
        fail_stale(study)
        enqueue_missing(plan, space, device)
        trials = study.get_trials(deepcopy=False)
        before = sum(1 for t in trials if evaluated(t))
        run = _optimize if shared else _optimize_with_optuna
        if plan.grid and any(t.state == TrialState.WAITING for t in trials):
            run(study, objective, on_trial, remaining, grid=True)
            continue
        if not plan.grid and before < plan.budget and stalled < 3:
            run(study, objective, on_trial, remaining, n_trials=plan.budget - before)
            # TPE may only re-suggest measured points (pruned): give up after a few rounds.
            stalled = stalled + 1 if _count_evaluated(study) == before else 0
            continue
        if not study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            break
        time.sleep(WAIT_S)  # other processes hold trials: wait for them or their heartbeats


class _NotMine(Exception):
    """Another process popped the same waiting trial and owns it."""


def _unlocked(storage: optuna.storages.BaseStorage) -> bool:
    """A storage whose rows cannot be locked (a SQLite file): popping a waiting trial can race.
    (An in-memory SQLite database belongs to one process: nothing to race with.)"""
    engine = getattr(storage, "engine", None)
    return (
        engine is not None
        and engine.dialect.name == "sqlite"
        and engine.url.database not in (None, "", ":memory:")
    )


def _optimize_with_optuna(
    study: optuna.Study,
    objective: Callable[[optuna.Trial], float | tuple[float, float]],
    on_trial: Callable[[optuna.Study, FrozenTrial], None],
    timeout_s: float,
    *,
    n_trials: int | None = None,
    grid: bool = False,
) -> None:
    """optuna's own loop (with its heartbeats, which PostgreSQL workers on other hosts need)."""

    def callback(study: optuna.Study, trial: FrozenTrial) -> None:
        on_trial(study, trial)
        if grid and not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            study.stop()

    study.optimize(objective, n_trials=n_trials, timeout=timeout_s, catch=(CandidateFailed,),
                   callbacks=[callback], gc_after_trial=False)  # fmt: skip


def _optimize(
    study: optuna.Study,
    objective: Callable[[optuna.Trial], float | tuple[float, float]],
    on_trial: Callable[[optuna.Study, FrozenTrial], None],
    timeout_s: float,
    *,
    n_trials: int | None = None,
    grid: bool = False,
) -> None:
    """optuna's loop for SQLite, with the tell in our hands: a trial another process owns is not
    told here, and one told meanwhile by another process is skipped instead of raising."""
    start = time.perf_counter()
    done = 0
    while time.perf_counter() - start < timeout_s and (n_trials is None or done < n_trials):
        if grid and not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # on SQLite, orphans are found by pid, not heartbeats
            trial = study.ask()
        try:
            value = objective(trial)
        except _NotMine:
            continue
        except optuna.TrialPruned:
            frozen = study.tell(trial, state=TrialState.PRUNED, skip_if_finished=True)
        except CandidateFailed:
            frozen = study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
        except BaseException:
            study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
            raise
        else:
            frozen = study.tell(trial, value, skip_if_finished=True)
        on_trial(study, frozen)
        done += 1


def _default_done(plan: Plan) -> bool:
    key = point_key(plan.params(plan.cands[0]))
    return any(evaluated(t) and point_key(trial_params(t)) == key
               for t in plan.study.get_trials(deepcopy=False))  # fmt: skip


def _points_done(study: optuna.Study) -> int:
    return len(
        {point_key(trial_params(t)) for t in study.get_trials(deepcopy=False) if evaluated(t)}
    )


def _count_evaluated(study: optuna.Study) -> int:
    return sum(1 for t in study.get_trials(deepcopy=False) if evaluated(t))


def _with_evaluator(
    plan: Plan,
    workload: Workload,
    device: torch.device,
    space: SearchSpace,
    options: SearchOptions,
    evaluator: Evaluator | None,
    start: float,
    gate_after: bool = False,
) -> tuple[int, int]:
    own = evaluator is None
    ev = evaluator or make_evaluator(workload, device, space, options)
    try:
        return _run(plan, device, space, options, ev, start, gate_after)
    finally:
        if own:
            ev.close()


def search(
    workload: Workload,
    device: torch.device,
    space: SearchSpace,
    options: SearchOptions,
    evaluator: Evaluator | None = None,
) -> SearchOutcome:
    """Run (or resume, or join) the study for this workload and return every measured candidate."""
    start = time.perf_counter()
    plan = open_plan(workload, device, space, options)
    _with_evaluator(plan, workload, device, space, options, evaluator, start, gate_after=True)
    return read_outcome(plan, options, time.perf_counter() - start)


def work(
    workload: Workload,
    device: torch.device,
    space: SearchSpace,
    options: SearchOptions,
    evaluator: Evaluator | None = None,
) -> WorkSummary:
    """Join the study for this workload (another process's `search` or `work` with the same
    arguments names the same study) and evaluate trials until it is done; no recommendation."""
    start = time.perf_counter()
    plan = open_plan(workload, device, space, options)
    evaluated, failed = _with_evaluator(plan, workload, device, space, options, evaluator, start)
    done = _points_done(plan.study)
    return WorkSummary(plan.name, evaluated, failed, done, plan.total, time.perf_counter() - start)
