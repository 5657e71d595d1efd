"""The optuna study of one workload: its name, the candidates it holds, the grid points enqueued
(each measured once, even by many processes), and trials whose process died reclaimed."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import warnings
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import optuna
import torch
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from advisor.device.environment import Environment, current_environment
from advisor.errors import StorageError, first_line
from advisor.execute.ownership import owner_dead
from advisor.impls import conv_modules
from advisor.impls import names as impl_names
from advisor.impls import why_not as impl_why_not
from advisor.knobs import KNOB_NAMES, Settings, precision_of
from advisor.measure.candidate import LAYER_STEP, Mode
from advisor.measure.results import TrialResult
from advisor.search.ledger import FORMAT_ATTR, RECORD_FORMAT, check_format
from advisor.search.options import SearchOptions
from advisor.search.shared_checks import SharedChecks
from advisor.search.storage import GRACE_S, RETRIES, open_storage
from advisor.space import Dropped, SearchSpace, candidates
from advisor.workload.build import Workload

log = logging.getLogger("advisor")


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
    if workload.is_layer and mode == "train":  # a layer's training step was timed another way
        key["layer_step"] = LAYER_STEP
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
    base = user_name or f"{mode}-{digest[:10]}"
    return f"{base}@{env.fingerprint}"


def trial_params(t: FrozenTrial) -> dict[str, Any]:
    return t.params or dict(t.system_attrs.get("fixed_params", {}))


def point_key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True)


def evaluated(t: FrozenTrial) -> bool:
    return "result" in t.user_attrs


def settings_from(params: dict[str, Any], fixed: dict[str, Any]) -> Settings:
    return Settings(**{**fixed, **params})


# ---- who runs a trial: orphans of dead processes on this host are reclaimed at once -----------


def reclaim_orphans(study: optuna.Study, heartbeats: bool) -> None:
    """Fail RUNNING trials whose process on this host died (kill -9, a crash in-process), and
    (trials that do not beat) RUNNING trials that never named their process: a live process
    names itself the moment it takes a trial, so one killed between taking and naming leaves a
    trial nobody reclaims (a resumed run would wait for it until its budget ran out)."""
    now = datetime.now()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = t.user_attrs.get("worker")
        if owner is not None:
            orphan = owner_dead(owner)
        else:
            started = t.datetime_start or now
            orphan = not heartbeats and now - started > timedelta(seconds=2 * GRACE_S)
        if not orphan:
            continue
        with contextlib.suppress(Exception):  # another process may reclaim it first
            study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
            log.warning("trial %d: its process died; the candidate will be retried", t.number)


def fail_stale(study: optuna.Study) -> None:
    """Fail trials whose heartbeat stopped (a worker on another host died)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # optuna marks heartbeats experimental
        optuna.storages.fail_stale_trials(study)


def has_heartbeat(storage: optuna.storages.BaseStorage) -> bool:
    interval = getattr(storage, "get_heartbeat_interval", None)  # RDB storages
    return interval is not None and interval() is not None


# ---- the study ----------------------------------------------------------------------------------


@dataclass
class Plan:
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
    shared_checks: SharedChecks | None = None  # precision verdicts of this workload's studies

    @property
    def points(self) -> list[Settings]:
        """The candidates that are enqueued: all of them for a grid; else the default and each
        single change (TPE explores the combinations after them)."""
        if self.grid:
            return self.cands
        return [c for c in self.cands if len(c.changes()) <= 1][: self.budget]

    @property
    def total(self) -> int:
        return len(self.cands) if self.grid else self.budget

    def params(self, s: Settings) -> dict[str, Any]:
        return {k: getattr(s, k) for k in self.varying}


def open_plan(
    workload: Workload, device: torch.device, space: SearchSpace, options: SearchOptions
) -> Plan:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    env = current_environment(device)
    impls = applicable_impls(workload, device)
    cands, dropped = candidates(space, device, impls, workload.param_dtype)
    # Cheap things first: the default, each single change, then combinations (a time budget
    # that runs out has then measured what matters most; racing has a leader early). Among as
    # many changes, autocast first: where a half precision is fast it is the largest win, and
    # once it is judged and leads, a slower reduced precision (oneDNN's bf16 fp32 convs, TF32)
    # cannot win and is not judged (above the race's bar, `Race.bar_ms`); where it is slow it is
    # raced out in a few samples.
    cands = [cands[0], *sorted(cands[1:], key=lambda s: (len(s.changes()), s.amp == "off"))]
    if workload.is_layer:  # a model's implementations are chosen per layer, after this search
        unfit = [v for v in space.knobs.get("conv_impl", []) if v not in impls]
        dropped += [Dropped(f"conv_impl={v}", "cannot run this workload here") for v in unfit]
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
        check_format(study, name)
        study.set_user_attr(FORMAT_ATTR, RECORD_FORMAT)
        study.set_user_attr("workload", workload.info.model_dump(mode="json"))
        study.set_user_attr("mode", options.mode)
        study.set_user_attr("space", space.name)
        study.set_user_attr("min_gain", space.min_gain)  # the pick rule, for reports
        study.set_user_attr("environment", env.model_dump(mode="json"))
        shared = SharedChecks(storage, name, workload, options.mode, device, space)
    except StorageError:
        raise
    except Exception as e:  # noqa: BLE001 - storage backends raise many kinds
        raise StorageError(
            f"cannot open study {name!r}: {first_line(e, with_type=False)}"
        ) from None
    return Plan(study, storage, name, env, cands, dropped, fixed, varying, len(cands) <= budget,
                 budget, multi, shared)  # fmt: skip


def died_result(plan: Plan, s: Settings, space: SearchSpace, device: torch.device) -> TrialResult:
    return TrialResult(
        settings=s,
        status="failed",
        reason=f"the process evaluating it died {RETRIES + 1} times (kill -9, or a crash in "
        "--in-process mode): given up",
        failure="crash",
        precision=precision_of(s, device),
    )


def enqueue_missing(plan: Plan, space: SearchSpace, device: torch.device) -> int:
    """Enqueue every point with neither a result nor a WAITING/RUNNING trial; returns how many.

    Safe to run from many processes at once: a point enqueued twice is measured once (the
    objective prunes the higher-numbered duplicate)."""
    covered: set[str] = set()
    deaths: dict[str, int] = {}
    for t in plan.study.get_trials(deepcopy=False):
        key = point_key(trial_params(t))
        if evaluated(t) or t.state in (TrialState.WAITING, TrialState.RUNNING):
            covered.add(key)
        elif t.state == TrialState.FAIL:
            deaths[key] = deaths.get(key, 0) + 1  # failed without a result: its process died
    added = 0
    for s in plan.points:
        params = plan.params(s)
        key = point_key(params)
        if key in covered:
            continue
        if deaths.get(key, 0) > RETRIES:
            result = died_result(plan, s, space, device)
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
