"""The optuna search. The only module (with storage.py and advice.py) that imports optuna.

PyTorch's default configuration is enqueued first and is the baseline. When the whole grid fits the
budget every point is enqueued (each evaluated exactly once, even with many workers on one study);
otherwise a TPE sampler explores after the default. A candidate that fails or is rejected by the
numeric gate is a FAIL trial with its reason, and the study goes on.

Every process that runs trials (`advisor advise`, `advisor worker`) runs the same loop:
1. reclaim orphans: a RUNNING trial whose process (on this host) is gone is failed; heartbeats do
   the same for other hosts on a database storage;
2. enqueue the grid points that have neither a result nor a WAITING/RUNNING trial, so a trial
   lost to a kill -9, a Ctrl-C or a dead worker is run again; a point whose process died
   `RETRIES + 1` times is recorded as failed instead;
3. run WAITING trials; a trial whose point already has a lower-numbered trial (result, running or
   waiting) is pruned as a duplicate, so racing workers never measure a point twice;
4. while other processes hold RUNNING trials, wait for them (and for their heartbeats).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import optuna
import torch
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from advisor.candidate import Mode
from advisor.environment import Environment, current_environment
from advisor.errors import AdvisorError, StorageError, first_line
from advisor.evaluators import Evaluator, new_evaluator
from advisor.impls import conv_modules
from advisor.impls import names as impl_names
from advisor.impls import why_not as impl_why_not
from advisor.knobs import KNOB_NAMES, Settings, precision_of
from advisor.ownership import owner_dead, owner_id
from advisor.pick import pareto_front
from advisor.results import TrialResult
from advisor.space import Dropped, SearchSpace, candidates
from advisor.storage import GRACE_S, RETRIES, open_storage
from advisor.workload import Workload

log = logging.getLogger("advisor")
WAIT_S = 1.0  # how often a process waiting for other workers' trials looks again


class CandidateFailed(Exception):
    """Raised inside the objective so optuna records the trial as FAIL; the reason is an attr."""


@dataclass(frozen=True)
class Progress:
    done: int
    total: int
    best_ms: float | None
    last: TrialResult | None
    elapsed_s: float
    stage: str = "global knobs"


@dataclass
class SearchOptions:
    """How to search. `max_memory_mb` rejects candidates whose peak memory is above it, except
    PyTorch's default: it is the baseline every speedup is measured against and what runs without
    the advisor, so it is always measured and kept (with a warning when it is over the limit)."""

    mode: Mode = "infer"
    trials: int | None = None  # overrides the space's budget.trials
    storage: str | None = None  # None: the embedded default; 'memory': not stored
    study_name: str | None = None
    isolate: bool = False
    trial_timeout_s: float = 600.0
    max_memory_mb: float | None = None
    objectives: tuple[str, ...] = ("time",)
    fresh: bool = False  # discard a stored study of the same name first
    progress: Callable[[Progress], None] | None = None


@dataclass
class SearchOutcome:
    results: list[TrialResult]
    baseline: TrialResult
    dropped: list[Dropped]
    study_name: str
    environment: Environment
    elapsed_s: float
    trial_numbers: list[int] = field(default_factory=list)
    pareto: list[TrialResult] = field(default_factory=list)  # time,memory mode: the Pareto set


@dataclass(frozen=True)
class WorkSummary:
    """What one process (an `advisor worker`) did in a shared study."""

    study_name: str
    evaluated_here: int
    failed_here: int
    evaluated: int  # grid points with a result, by any process
    total: int
    elapsed_s: float


def make_evaluator(
    workload: Workload, device: torch.device, space: SearchSpace, options: SearchOptions
) -> Evaluator:
    """The evaluator these options ask for (see `advisor.evaluators`)."""
    return new_evaluator(
        workload,
        device,
        space,
        options.mode,
        isolate=options.isolate,
        timeout_s=options.trial_timeout_s,
    )


def applicable_impls(workload: Workload, device: torch.device) -> list[str]:
    """Implementations that can run every conv layer of a single-layer workload; for a model,
    only `native` here (models get per-layer implementations in a later stage)."""
    if not workload.is_layer:
        return ["native"]
    model = workload.make_model()
    convs = conv_modules(model)
    dtype = workload.example_inputs[0].dtype
    return [
        name
        for name in impl_names()
        if all(impl_why_not(name, m, device=device, dtype=dtype) is None for _, m in convs)
    ]


def study_name_for(
    workload: Workload,
    mode: Mode,
    space: SearchSpace,
    env: Environment,
    user_name: str | None,
    objectives: tuple[str, ...] = ("time",),
) -> str:
    """One study per workload, mode, space and environment: results never mix across hardware.
    A time,memory study is another study (optuna fixes a study's directions when it is made)."""
    key: dict[str, Any] = {
        # The info's JSON is what earlier versions hashed as a plain dict: same workload, same name.
        "workload": workload.info.model_dump(mode="json"),
        "mode": mode,
        "space": space.model_dump(mode="json"),
    }
    if tuple(objectives) != ("time",):
        key["objectives"] = list(objectives)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
    base = user_name or f"{mode}-{digest[:10]}"
    return f"{base}@{env.fingerprint}"


def _params(t: FrozenTrial) -> dict[str, Any]:
    return t.params or dict(t.system_attrs.get("fixed_params", {}))


def _key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True)


def _evaluated(t: FrozenTrial) -> bool:
    return "result" in t.user_attrs


def _settings_from(params: dict[str, Any], fixed: dict[str, Any]) -> Settings:
    return Settings(**{**fixed, **params})


# ---- who runs a trial: orphans of dead processes on this host are reclaimed at once -----------


def _reclaim_orphans(study: optuna.Study, heartbeats: bool) -> None:
    """Fail RUNNING trials whose process on this host died (kill -9, a crash in-process), and
    (storages without heartbeats) RUNNING trials that never named their process for too long."""
    now = datetime.now()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = t.user_attrs.get("worker")
        if owner is not None:
            orphan = owner_dead(owner)
        else:
            started = t.datetime_start or now
            orphan = not heartbeats and now - started > timedelta(seconds=6 * GRACE_S)
        if not orphan:
            continue
        with contextlib.suppress(Exception):  # another process may reclaim it first
            study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
            log.warning("trial %d: its process died; the candidate will be retried", t.number)


def _fail_stale(study: optuna.Study) -> None:
    """Fail trials whose heartbeat stopped (a worker on another host died)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # optuna marks heartbeats experimental
        optuna.storages.fail_stale_trials(study)


def _has_heartbeat(storage: optuna.storages.BaseStorage) -> bool:
    interval = getattr(storage, "get_heartbeat_interval", None)  # RDB storages
    return interval is not None and interval() is not None


# ---- the study ----------------------------------------------------------------------------------


@dataclass
class _Plan:
    """A study opened for one workload, and the candidates it holds."""

    study: optuna.Study
    storage: optuna.storages.BaseStorage
    name: str
    env: Environment
    cands: list[Settings]
    dropped: list[Dropped]
    fixed: dict[str, Any]
    varying: dict[str, list[Any]]
    grid: bool
    budget: int
    multi: bool

    @property
    def points(self) -> list[Settings]:
        """The candidates that are enqueued (all of them for a grid; else the default)."""
        return self.cands if self.grid else self.cands[:1]

    @property
    def total(self) -> int:
        return len(self.cands) if self.grid else self.budget

    def params(self, s: Settings) -> dict[str, Any]:
        return {k: getattr(s, k) for k in self.varying}


def _open(
    workload: Workload, device: torch.device, space: SearchSpace, options: SearchOptions
) -> _Plan:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    env = current_environment(device)
    cands, dropped = candidates(space, device, applicable_impls(workload, device))
    if not workload.is_layer:
        # A model's implementations are chosen per layer after this search, not dropped.
        dropped = [d for d in dropped if not d.what.startswith("conv_impl=")]
    axes = {k: list(dict.fromkeys(getattr(c, k) for c in cands)) for k in KNOB_NAMES}
    fixed = {k: v[0] for k, v in axes.items() if len(v) == 1}
    varying = {k: v for k, v in axes.items() if len(v) > 1}
    budget = options.trials or space.budget.trials
    multi = "memory" in options.objectives
    name = study_name_for(
        workload, options.mode, space, env, options.study_name, tuple(options.objectives)
    )
    storage = open_storage(options.storage)
    try:
        if options.fresh:
            for stale in (name, f"{name}/layers"):  # the per-layer companion study too
                with contextlib.suppress(KeyError):
                    optuna.delete_study(study_name=stale, storage=storage)
        study = optuna.create_study(
            storage=storage,
            study_name=name,
            load_if_exists=True,
            sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=min(10, budget)),
            directions=["minimize", "minimize"] if multi else ["minimize"],
        )
        study.set_user_attr("workload", workload.info.model_dump(mode="json"))
        study.set_user_attr("mode", options.mode)
        study.set_user_attr("space", space.name)
        study.set_user_attr("min_gain", space.min_gain)  # the pick rule, for reports
        study.set_user_attr("environment", env.model_dump(mode="json"))
    except Exception as e:  # noqa: BLE001 - storage backends raise many kinds
        raise StorageError(
            f"cannot open study {name!r}: {first_line(e, with_type=False)}"
        ) from None
    return _Plan(study, storage, name, env, cands, dropped, fixed, varying, len(cands) <= budget,
                 budget, multi)  # fmt: skip


def _died_result(plan: _Plan, s: Settings, space: SearchSpace, device: torch.device) -> TrialResult:
    return TrialResult(
        settings=s,
        status="failed",
        reason=f"the process evaluating it died {RETRIES + 1} times (kill -9, or a crash in "
        "--in-process mode): given up",
        precision=precision_of(s, device),
    )


def enqueue_missing(plan: _Plan, space: SearchSpace, device: torch.device) -> int:
    """Enqueue every point with neither a result nor a WAITING/RUNNING trial; returns how many.

    Safe to run from many processes at once: a point enqueued twice is measured once (the
    objective prunes the higher-numbered duplicate)."""
    covered: set[str] = set()
    deaths: dict[str, int] = {}
    for t in plan.study.get_trials(deepcopy=False):
        key = _key(_params(t))
        if _evaluated(t) or t.state in (TrialState.WAITING, TrialState.RUNNING):
            covered.add(key)
        elif t.state == TrialState.FAIL:
            deaths[key] = deaths.get(key, 0) + 1  # failed without a result: its process died
    added = 0
    for s in plan.points:
        params = plan.params(s)
        key = _key(params)
        if key in covered:
            continue
        if deaths.get(key, 0) > RETRIES:
            result = _died_result(plan, s, space, device)
            plan.study.add_trial(
                optuna.trial.create_trial(
                    state=TrialState.FAIL,
                    params=params,
                    distributions={k: CategoricalDistribution(plan.varying[k]) for k in params},
                    user_attrs={
                        "result": result.model_dump(mode="json"),
                        "label": s.label(),
                        "reason": result.reason,
                    },
                )
            )
            continue
        plan.study.enqueue_trial(params, user_attrs={"retry": True} if key in deaths else None)
        added += 1
    return added


def _memory_checked(result: TrialResult, limit: float | None, baseline: Settings) -> TrialResult:
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


def _run(
    plan: _Plan,
    device: torch.device,
    space: SearchSpace,
    options: SearchOptions,
    evaluator: Evaluator,
    start: float,
) -> tuple[int, int]:
    """Run trials until every point has a result (grid) or the budget is spent, waiting for
    other processes' trials; returns (evaluated, failed) by this process."""
    study, varying, fixed, default = plan.study, plan.varying, plan.fixed, plan.cands[0]
    allowed = {c.model_dump_json() for c in plan.cands}
    owner = owner_id()
    best: list[float] = []
    mine = {"evaluated": 0, "failed": 0}

    def objective(trial: optuna.Trial) -> float | tuple[float, float]:
        trial.set_user_attr("worker", owner)
        params = {k: trial.suggest_categorical(k, v) for k, v in varying.items()}
        settings = _settings_from(params, fixed)
        if settings.model_dump_json() not in allowed:
            trial.set_user_attr("reason", "excluded by a skip rule of the search space")
            raise optuna.TrialPruned()
        for other in study.get_trials(deepcopy=False):
            if other.number >= trial.number or _params(other) != params:
                continue
            if _evaluated(other) or other.state in (TrialState.RUNNING, TrialState.WAITING):
                trial.set_user_attr("reason", f"duplicate of trial {other.number}")
                raise optuna.TrialPruned()
        raw = evaluator(settings)
        trial.set_user_attr("result", raw.model_dump(mode="json"))
        trial.set_user_attr("label", settings.label())
        mine["evaluated"] += 1
        result = _memory_checked(raw, options.max_memory_mb, default)
        if result.status != "ok":
            mine["failed"] += result.status == "failed"
            trial.set_user_attr("reason", result.reason)
            raise CandidateFailed(result.reason)
        best.append(result.median_ms)
        if plan.multi:
            return result.median_ms, float(result.peak_memory_mb or 0.0)
        return result.median_ms

    def on_trial(study: optuna.Study, trial: FrozenTrial) -> None:
        if options.progress is not None and _evaluated(trial):
            done = _points_done(study)
            last = TrialResult.model_validate(trial.user_attrs["result"])
            options.progress(
                Progress(
                    done, plan.total, min(best) if best else None, last, time.perf_counter() - start
                )
            )
        if plan.grid and not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            study.stop()

    deadline = start + space.budget.time_s
    stalled = 0
    while (remaining := deadline - time.perf_counter()) > 0:
        _reclaim_orphans(study, _has_heartbeat(plan.storage))
        _fail_stale(study)
        enqueue_missing(plan, space, device)
        trials = study.get_trials(deepcopy=False)
        before = sum(1 for t in trials if _evaluated(t))
        run: dict[str, Any] = dict(timeout=remaining, catch=(CandidateFailed,),
                                   callbacks=[on_trial], gc_after_trial=False)  # fmt: skip
        if plan.grid and any(t.state == TrialState.WAITING for t in trials):
            study.optimize(objective, **run)
            continue
        if not plan.grid and before < plan.budget and stalled < 3:
            study.optimize(objective, n_trials=plan.budget - before, **run)
            # TPE may only re-suggest measured points (pruned): give up after a few rounds.
            stalled = stalled + 1 if _count_evaluated(study) == before else 0
            continue
        if not study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            break
        time.sleep(WAIT_S)  # other processes hold trials: wait for them or their heartbeats
    return mine["evaluated"], mine["failed"]


def _points_done(study: optuna.Study) -> int:
    return len({_key(_params(t)) for t in study.get_trials(deepcopy=False) if _evaluated(t)})


def _count_evaluated(study: optuna.Study) -> int:
    return sum(1 for t in study.get_trials(deepcopy=False) if _evaluated(t))


def _with_evaluator(
    plan: _Plan,
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
    plan = _open(workload, device, space, options)
    _with_evaluator(plan, workload, device, space, options, evaluator, start)
    return _outcome(plan, options, time.perf_counter() - start)


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
    plan = _open(workload, device, space, options)
    evaluated, failed = _with_evaluator(plan, workload, device, space, options, evaluator, start)
    done = _points_done(plan.study)
    return WorkSummary(plan.name, evaluated, failed, done, plan.total, time.perf_counter() - start)


def _outcome(plan: _Plan, options: SearchOptions, elapsed: float) -> SearchOutcome:
    """Every point's result (the lowest-numbered trial's), the memory limit applied now, so a
    resumed study may use another limit without measuring again."""
    default = plan.cands[0]
    results, numbers, seen = [], [], set()
    for t in sorted(plan.study.get_trials(deepcopy=False), key=lambda t: t.number):
        if not _evaluated(t) or (key := _key(_params(t))) in seen:
            continue
        seen.add(key)
        raw = TrialResult.model_validate(t.user_attrs["result"])
        results.append(_memory_checked(raw, options.max_memory_mb, default))
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
    return SearchOutcome(
        results, baseline, plan.dropped, plan.name, plan.env, elapsed, numbers, pareto
    )
