"""Per-layer implementation choice for models: the second stage of the search.

After the global knobs are chosen, each conv layer is timed alone (with its input shape as seen in
the model, under the chosen settings) with every implementation that qualifies for it; layers with
the same signature and input shape share one measurement. The fastest beyond noise wins per layer
(ties go to `native`). The combination is then measured on the whole model and kept only if it
beats the global-knob winner beyond noise.

Measurements are stored in a companion study ("<study>/layers", `storage.LayerStore`) so a
resumed search does not repeat them.

A layer the stage cannot take (a class computing more than a conv with no recipe for it, see
`impls.classes`; a Lazy conv never initialised; any error describing or checking it) keeps
PyTorch's forward, unmeasured, its reason in one line (`LayerGroup.kept`); the run goes on.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from advisor import impls
from advisor.apply import compute_dtype
from advisor.errors import first_line
from advisor.execute.evaluators import Evaluator, Lent
from advisor.knobs import Settings
from advisor.measure.candidate import LAYER_STEP, Mode
from advisor.measure.contest import Contest
from advisor.measure.results import TrialResult
from advisor.search.options import Progress, SearchOptions, SearchOutcome
from advisor.search.pick import choose, decide
from advisor.search.storage import LayerStore, measured_under, open_storage
from advisor.space import SearchSpace
from advisor.stages.autotune_bound import AutotuneBound
from advisor.stages.layer_groups import LayerGroup, layer_groups
from advisor.stages.layer_share import MINOR, minor_keys
from advisor.workload.build import Workload


@dataclass
class LayerChoice:
    """One layer group's choice: each implementation's result, the one chosen and why, and why
    the others do not qualify."""

    group: LayerGroup
    results: dict[str, TrialResult]  # impl name -> result
    chosen: str
    why: str
    skipped: dict[str, str]  # impl name -> why it does not qualify


def layer_context(mode: Mode, space: SearchSpace) -> str:
    """What else a layer measurement depends on: the mode, and the space's timing and gate
    settings (another space with the same rules may reuse it; other rules measure again)."""
    rules = space.model_dump(
        mode="json",
        include={"timing", "tolerances", "grad_tolerances", "layer_tolerances", "gate", "race",
                 "min_gain"},
    )  # fmt: skip
    digest = hashlib.sha256(json.dumps(rules, sort_keys=True).encode()).hexdigest()[:12]
    return f"{mode}|{digest}|{LAYER_STEP}"


def choose_layer_impls(
    workload: Workload,
    settings: Settings,
    device: torch.device,
    mode: Mode,
    space: SearchSpace,
    make_evaluator: Callable[[Workload], Evaluator],
    storage: Any,
    study_name: str,
    steps: int | None = None,
    progress: Callable[[int, int, TrialResult | None], None] | None = None,
    deadline: float | None = None,
    stats: dict[str, int] | None = None,
    every_group: bool = True,
    bound: AutotuneBound | None = None,
    measured: list[TrialResult] | None = None,
) -> list[LayerChoice]:
    """Time each qualifying implementation per layer group under `settings`; pick per group
    (without `every_group`, only those `layer_share` keeps: the rest are "minor" in `stats`).

    One evaluator (one worker process when isolated) serves every group. An implementation that
    provably cannot beat the group's best so far is stopped early (`stats.Race`). Groups are
    not started after `deadline` (a `time.perf_counter()` value); `stats` counts them
    ("unmeasured") and the measurements found stored ("reused"). An implementation that
    autotunes is tried only where `bound` (default: one learning this run's costs) says its
    autotuning can pay, and is stopped mid-autotuning once it has spent what it could repay
    within the horizon (`steps`) even at zero time a step."""
    contest = space.contest(steps)
    bound = bound if bound is not None else AutotuneBound(contest)
    stats = stats if stats is not None else {}
    stats.setdefault("unmeasured", 0)
    stats.setdefault("reused", 0)
    wanted = [n for n in space.knobs.get("conv_impl", ["native"]) if n in impls.names()]
    if wanted == ["native"] or not wanted:
        return []
    if "native" not in wanted:
        wanted = ["native", *wanted]
    groups = layer_groups(workload, settings, device, mode)
    store = LayerStore(storage, study_name, layer_context(mode, space), contest.horizon_steps)
    done, elsewhere = store.layer_results()
    plan = [_plan(g, wanted, settings, device) for g in groups]
    stats["minor"] = len(minor := set() if every_group else minor_keys(plan, mode))
    total = sum(len(u) for g, u, _ in plan if len(u) > 1 and g.key not in minor)
    count = 0
    choices = []
    evaluator: Evaluator | None = None
    try:
        for g, usable, skipped in plan:
            if g.kept is not None:
                choices.append(LayerChoice(g, {}, "native", g.kept, skipped))
                continue
            if len(usable) < 2:
                continue
            if g.key in minor:
                choices.append(LayerChoice(g, {}, "native", MINOR, skipped))
                continue
            if deadline is not None and time.perf_counter() >= deadline:
                stats["unmeasured"] += 1
                continue
            before = {(g.key, n, measured_under(settings)) for n in usable} & elsewhere
            stats["shared"] = stats.get("shared", 0) + len(before)
            evaluator = _measure_group(g, usable, settings, store, done, evaluator,
                                       make_evaluator, deadline, stats,
                                       contest, elsewhere, bound, skipped,
                                       measured)  # fmt: skip
            keys = {name: (g.key, name, measured_under(settings)) for name in usable}
            results = {name: done[k] for name, k in keys.items() if k in done}
            for r in results.values():
                count += 1
                if progress is not None:
                    progress(count, total, r)
            choices.append(_choose(g, results, skipped, contest.min_gain))
    finally:
        if evaluator is not None:
            evaluator.close()
    return choices


def _plan(
    g: LayerGroup, wanted: list[str], settings: Settings, device: torch.device
) -> tuple[LayerGroup, list[str], dict[str, str]]:
    """The group (kept where its check fails), the implementations that qualify, why not others."""
    if g.kept is not None:
        return g, ["native"], {n: g.kept for n in wanted if n != "native"}
    assert g.workload is not None
    usable, skipped = [], {}
    try:
        module = g.workload.make_model()
        dtype = compute_dtype(module, settings)
        for name in wanted:
            impl = impls.get_impl(name)
            reason = impls.why_not(name, module, device=device, dtype=dtype)
            if g.recipe and name != "native" and not impl.follows_recipes:
                reason = f"its class computes more than a conv; {name} does not reproduce it"
            if reason is None:
                usable.append(name)
            else:
                skipped[name] = reason
    except Exception as e:  # noqa: BLE001 - an implementation's own check failed: keep native
        kept = replace(g, workload=None, kept=f"checking it failed: {first_line(e)}")
        return _plan(kept, wanted, settings, device)
    return g, usable, skipped


def _measure_group(
    g: LayerGroup,
    usable: list[str],
    settings: Settings,
    store: LayerStore,
    done: dict[tuple[str, str, str], TrialResult],
    evaluator: Evaluator | None,
    make_evaluator: Callable[[Workload], Evaluator],
    deadline: float | None,
    stats: dict[str, int],
    contest: Contest,
    elsewhere: set[tuple[str, str, str]],
    bound: AutotuneBound,
    skipped: dict[str, str],
    measured: list[TrialResult] | None = None,
) -> Evaluator | None:
    """Measure the group's implementations not stored yet (native first: the others race it);
    one that autotunes where it cannot pay (`bound`) goes to `skipped`, unmeasured, and is
    stopped mid-autotuning at its allowance where it is measured."""
    switched = False
    leader: TrialResult | None = None
    assert (workload := g.workload) is not None, "kept layers are not measured"
    for name in usable:
        key = (g.key, name, measured_under(settings))
        attrs: dict[str, Any] = dict(
            key=g.key,
            impl=name,
            names=list(g.names),
            description=g.description,
            spec=g.spec.model_dump(mode="json"),
        )  # spec: per-layer roofline in reports
        if key in done:
            stats["reused"] += 1
            if key in elsewhere:  # measured by another study: this study's record (reports)
                store.add_layer_result(done[key], shared=False, **attrs)
                elsewhere.discard(key)
        else:
            native = done.get((g.key, "native", measured_under(settings)))
            why = bound.why_not(name, native, len(g.names))
            if why is not None:
                skipped[name] = why
                continue
            if evaluator is None:
                evaluator = make_evaluator(workload)
            elif not switched:
                evaluator.use(workload)
            switched = True
            race = None
            if leader is not None:
                allowance = bound.allowance_s(name, native, len(g.names))
                race = contest.race(leader.measurement, allowance_s=allowance)
            left = None if deadline is None else max(0.0, deadline - time.perf_counter())
            res = evaluator(
                settings.model_copy(update={"conv_impl": name, "layers": {}}),
                race=race,
                time_left_s=left,
            )
            store.add_layer_result(res, **attrs)
            if measured is not None:  # this run's own: its samples are the run's
                measured.append(res)
            done[key] = store.first_result(g.key, name, settings) or res
            bound.measured(name, done[key], native)
        r = done[key]
        if r.status == "ok" and (leader is None or r.median_ms < leader.median_ms):
            leader = r
    return evaluator


def _choose(
    g: LayerGroup, results: dict[str, TrialResult], skipped: dict[str, str], min_gain: float
) -> LayerChoice:
    base = results["native"]
    if base.status != "ok":
        return LayerChoice(g, results, "native", f"native failed on this layer ({base.reason}): kept",
                           skipped)  # fmt: skip
    pick = choose(list(results.values()), base, min_gain)
    return LayerChoice(g, results, pick.chosen.settings.conv_impl, pick.why, skipped)


def layers_map(choices: list[LayerChoice], default_impl: str = "native") -> dict[str, str]:
    """module name -> implementation, for layers whose choice differs from the default."""
    out = {}
    for c in choices:
        if c.chosen != default_impl:
            for name in c.group.names:
                out[name] = c.chosen
    return out


def per_layer_stage(
    workload: Workload,
    outcome: SearchOutcome,
    device: torch.device,
    space: SearchSpace,
    options: SearchOptions,
    stats: dict[str, int],
    evaluator: Evaluator,
    measured: list[TrialResult],
) -> list[LayerChoice]:
    """Choose conv implementations per layer under the best global settings; if that changes any
    layer, measure the combination on the whole model (unless measured already) and add it to
    the outcome's candidates. The run's `evaluator` measures the layer groups and the
    combination; the layers' results go to `measured`. Returns the per-layer choices."""
    contest = space.contest(options.steps)
    best = decide(outcome.results, outcome.baseline, contest).chosen
    start = time.perf_counter()

    def report(done: int, total: int, last: Any) -> None:
        if options.progress is not None:
            elapsed, stage = time.perf_counter() - start, "per-layer implementations"
            options.progress(Progress(done, total, None, last, elapsed, stage=stage))

    storage = open_storage(options.storage)
    choices = choose_layer_impls(
        workload,
        best.settings,
        device,
        options.mode,
        space,
        lambda wl: Lent(evaluator, wl, home=workload),  # the run's worker measures the layers
        storage,
        outcome.study_name,
        options.steps,
        report,
        deadline=options.deadline,
        stats=stats,
        every_group=options.every_layer_group,
        measured=measured,
    )
    layers = layers_map(choices, best.settings.conv_impl)
    combined = best.settings.model_copy(update={"layers": layers})
    # nothing changed, or measured by this run or an earlier one
    if not layers or outcome.ledger.standing(combined) is not None:
        return choices
    if options.deadline is not None and time.perf_counter() >= options.deadline:
        stats["combination"] = len(layers)  # chosen, but no time left to measure it
        return choices
    left = None if options.deadline is None else max(0.0, options.deadline - time.perf_counter())
    outcome.ledger.trial(evaluator(combined, time_left_s=left), "per-layer")
    return choices
