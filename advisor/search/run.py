"""Running trials: the objective (measure, gate, record) and the loop every process runs; the
outcome is read back from the study by `advisor.search.outcome`."""

from __future__ import annotations

import functools
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
from advisor.search.ledger import Ledger, memory_checked
from advisor.search.options import (
    CandidateFailed,
    Progress,
    SearchOptions,
    SearchOutcome,
    WorkSummary,
)
from advisor.search.outcome import ledger_of, read_outcome
from advisor.search.point_lock import PointLocks
from advisor.search.screen import inversion, min_step_ms, record_dropped, screen
from advisor.search.shared_checks import reused
from advisor.search.sqlite_claim import TrialClaims
from advisor.search.study import (
    Plan,
    enqueue_missing,
    evaluated,
    fail_stale,
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
) -> tuple[int, int]:
    """Run trials until every point has a result (grid) or the budget is spent, waiting for
    other processes' trials; returns (evaluated, failed) by this process. A candidate measured
    without its gate stays so: the pick asks for its verdict where it needs it
    (`advisor.search.pick_gates`)."""
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
            # default would start one more candidate after it, past the budget. Left unmeasured
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
        if not plan.multi and settings != default:
            # the fastest measured, its gate pending or not, sets the bar below which one is
            # gated; only an accepted one leads the race (`leaders`)
            leader, fastest = leaders(Ledger(study, default, max_memory_mb=options.max_memory_mb))
            race = contest.race(leader.measurement if leader else None,
                                fastest.measurement if fastest else None)  # fmt: skip
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
        if result.pending is None:  # the best accepted so far, for the progress display
            best.append(result.median_ms)
        if plan.multi:
            return result.median_ms, float(result.peak_memory_mb or 0.0)
        return result.median_ms

    def record(check: PrecisionCheck) -> None:
        # Judged once per precision per model: kept with the study for every later candidate,
        # process and run of it, and for this workload's other studies.
        ledger.precision(check)
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

    deadline = options.deadline if options.deadline is not None else start + space.budget.time_s
    contest = space.contest(options.steps)
    # Verdicts judged before this run: this study's, then other studies' of the workload
    # (`--effort quick` before the default effort); `--fresh` judges again.
    ledger = ledger_of(plan, options)
    known = reused(ledger.checks())
    if plan.shared_checks is not None and not options.fresh:
        known += plan.shared_checks.read()
    evaluator.know(known)
    try:
        # `race: false` promises every candidate measured and gated in full: no screen either
        screening = options.screen and space.race
        screened = (screen(plan, evaluator, options, deadline, start, contest, min_step_ms(device))
                    if screening else None)  # fmt: skip
        _loop(plan, space, device, objective, on_trial, deadline, shared)
        if screened is not None and screened.dropped:
            full = ledger_of(plan, options).results()
            why = inversion(screened, plan, full, space.min_gain)
            if why is None:
                record_dropped(screened, plan, contest)
            else:  # the guard: the screen's ranking does not hold here; time them all
                study.set_user_attr("screen_fallback", why)
                plan.cands = screened.full_plan
                _loop(plan, space, device, objective, on_trial, deadline, shared)
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
        run = functools.partial(_optimize, study, objective, on_trial, remaining, own_tell=shared)
        if plan.grid and any(t.state == TrialState.WAITING for t in trials):
            run(grid=True)
            continue
        if not plan.grid and before < plan.budget and stalled < 3:
            run(n_trials=plan.budget - before)
            # TPE may only re-suggest measured points (pruned): give up after a few rounds.
            after = study.get_trials(deepcopy=False)
            stalled = stalled + 1 if sum(1 for t in after if evaluated(t)) == before else 0
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


def _optimize(
    study: optuna.Study,
    objective: Callable[[optuna.Trial], float | tuple[float, float]],
    on_trial: Callable[[optuna.Study, FrozenTrial], None],
    timeout_s: float,
    *,
    own_tell: bool,
    n_trials: int | None = None,
    grid: bool = False,
) -> None:
    """Trials for `timeout_s`, or `n_trials`, or (`grid`) until none waits: optuna's loop, with the
    heartbeats PostgreSQL workers on other hosts need; or (`own_tell`, SQLite) ours, which tells
    no trial another process owns and skips one told meanwhile by another instead of raising."""
    if not own_tell:

        def callback(study: optuna.Study, trial: FrozenTrial) -> None:
            on_trial(study, trial)
            if grid and not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
                study.stop()

        study.optimize(objective, n_trials=n_trials, timeout=timeout_s, catch=(CandidateFailed,),
                       callbacks=[callback], gc_after_trial=False)  # fmt: skip
        return
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


def leaders(ledger: Ledger) -> tuple[TrialResult | None, TrialResult | None]:
    """The fastest accepted candidate measured so far in this study (by any process), which a
    candidate races; and the fastest measured at all, its gate pending or not, below whose bar
    a candidate is gated (a pending candidate never leads a race: its sign test would stop
    others for good, and its gate may yet reject it)."""
    ok = [r for r in ledger.results() if r.status == "ok" and r.measurement is not None]

    def fastest(rs: list[TrialResult]) -> TrialResult | None:
        return min(rs, key=lambda r: r.median_ms, default=None)

    return fastest([r for r in ok if r.pending is None]), fastest(ok)


def _default_done(plan: Plan) -> bool:
    key = point_key(plan.params(plan.cands[0]))
    return any(evaluated(t) and point_key(trial_params(t)) == key
               for t in plan.study.get_trials(deepcopy=False))  # fmt: skip


def _points_done(study: optuna.Study) -> int:
    return len(
        {point_key(trial_params(t)) for t in study.get_trials(deepcopy=False) if evaluated(t)}
    )


def _with_evaluator(
    plan: Plan,
    workload: Workload,
    device: torch.device,
    space: SearchSpace,
    options: SearchOptions,
    evaluator: Evaluator | None,
    start: float,
) -> tuple[int, int]:
    own = evaluator is None
    ev = evaluator or make_evaluator(workload, device, space, options)
    try:
        return _run(plan, device, space, options, ev, start)
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
    _with_evaluator(plan, workload, device, space, options, evaluator, start)
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
