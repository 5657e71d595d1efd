"""The advise pipeline, top to bottom: workload -> space -> search -> per-layer stage -> Advice.

Shared by `advisor.advise()` and the CLI so both do exactly the same thing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from advisor.advice import Advice, build_advice
from advisor.environment import resolve_device
from advisor.errors import AdvisorError, first_line
from advisor.per_layer import (
    LayerChoice,
    choose_layer_impls,
    layers_map,
)
from advisor.pick import pick_final
from advisor.results import TrialResult
from advisor.retime import finalists
from advisor.search import Progress, SearchOptions, SearchOutcome, make_evaluator, search
from advisor.space import SearchSpace, load_space, with_tolerances
from advisor.storage import LayerStore, open_storage
from advisor.timing import machine_load_warning
from advisor.workload import (
    Workload,
    layer_spec,
    layer_workload,
    model_workload,
    object_workload,
    with_shape_set,
)

log = logging.getLogger("advisor")


def make_workload(
    *,
    model: nn.Module | None = None,
    inputs: Any = None,
    layer: str | dict[str, Any] | None = None,
    layer_file: str | None = None,
    input_shape: Any = None,
    dtype: str | None = None,
    first_layer: bool = False,
    model_file: str | None = None,
    build: str = "build_model",
    inputs_fn: str = "example_inputs",
    input_shapes: list[Any] | None = None,
    batch_sizes: list[int] | None = None,
    shape_weights: list[float] | None = None,
) -> Workload:
    """The workload to tune. Several input shapes or batch sizes (with weights) make a shape set:
    the objective is then the weighted time over those shapes."""
    workload = _base_workload(
        model,
        inputs,
        layer,
        layer_file,
        input_shape or (input_shapes[0] if input_shapes else None),
        dtype,
        first_layer,
        model_file,
        build,
        inputs_fn,
    )
    shapes = [_shape(s) for s in input_shapes] if input_shapes and len(input_shapes) > 1 else None
    if shapes or batch_sizes or shape_weights:
        workload = with_shape_set(
            workload, shapes=shapes, batch_sizes=batch_sizes, weights=shape_weights
        )
    return workload


def _shape(s: Any) -> tuple[int, ...]:
    if isinstance(s, str):
        try:
            return tuple(int(p) for p in s.replace("x", ",").split(",") if p.strip())
        except ValueError:
            raise AdvisorError(f"not a comma-separated list of integers: {s!r}") from None
    return tuple(int(v) for v in s)


def _base_workload(
    model: nn.Module | None,
    inputs: Any,
    layer: str | dict[str, Any] | None,
    layer_file: str | None,
    input_shape: Any,
    dtype: str | None,
    first_layer: bool,
    model_file: str | None,
    build: str,
    inputs_fn: str,
) -> Workload:
    given = [x is not None for x in (model, layer or layer_file, model_file)]
    if sum(given) != 1:
        raise AdvisorError("give exactly one of: a model with inputs, a layer spec, a model file")
    if first_layer and not (layer or layer_file):
        raise AdvisorError("--first-layer describes a layer spec, not a model")
    if model is not None:
        if inputs is None:
            raise AdvisorError("a model needs example inputs: advise(model, (x,))")
        return object_workload(model, inputs)
    if model_file is not None:
        return model_workload(model_file, build=build, inputs=inputs_fn)
    spec = layer_spec(
        layer, input_shape=input_shape, dtype=dtype, file=layer_file, first_layer=first_layer
    )
    return layer_workload(spec)


def per_layer_stage(
    workload: Workload,
    outcome: SearchOutcome,
    device: torch.device,
    space: SearchSpace,
    options: SearchOptions,
    stats: dict[str, int] | None = None,
) -> tuple[list[LayerChoice], TrialResult | None]:
    """Choose conv implementations per layer under the best global settings; if that changes any
    layer, measure the combination on the whole model and add it to the outcome's candidates.

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

    storage = open_storage(options.storage)
    choices = choose_layer_impls(
        workload,
        best.settings,
        device,
        options.mode,
        space,
        lambda wl: make_evaluator(wl, device, space, options),
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
        evaluator = make_evaluator(workload, device, space, options)
        left = (
            None if options.deadline is None else max(0.0, options.deadline - time.perf_counter())
        )
        try:
            result = evaluator(combined, time_left_s=left)
        finally:
            evaluator.close()
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
    # Like the trials, in a worker subprocess unless the user asked for in-process trials.
    evaluator = make_evaluator(workload, device, space, options)
    try:
        fresh = evaluator.retime(fin, time_left_s=left)
    except (torch.OutOfMemoryError, RuntimeError) as e:  # e.g. finalists too big to hold together
        why = first_line(e, with_type=False)
        log.warning("interleaved re-time failed: %s", why)
        return 0, why
    finally:
        evaluator.close()
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
    **workload_args: Any,
) -> Advice:
    start = time.perf_counter()
    if mode not in ("infer", "train"):
        raise AdvisorError(f"unknown mode {mode!r}; use infer or train")
    if budget_s is not None and not budget_s > 0:
        raise AdvisorError(f"--budget must be a positive time, got {budget_s:g} s")
    dev = resolve_device(device)
    sp = with_tolerances(load_space(space, dev), tolerances or {})
    workload = make_workload(**workload_args)
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
    outcome = search(workload, dev, sp, options)
    busy += [w for w in (machine_load_warning(dev),) if w and w not in busy]
    # The global finalists are re-timed together first, so the per-layer stage works under the
    # settings that will be recommended; a per-layer combination that reaches the finalists is then
    # re-timed with them, interleaved, before it can be picked.
    retimed, retime_error = retime_finalists(workload, outcome, dev, sp, options,
                                             deadline=plan.layers)  # fmt: skip
    choices: list[LayerChoice] = []
    stats: dict[str, int] = {}
    if per_layer and retime_error is None:
        options.deadline = plan.layers
        choices, combined = per_layer_stage(workload, outcome, dev, sp, options, stats)
        if combined is not None:
            again, retime_error = retime_finalists(workload, outcome, dev, sp, options,
                                                   only_with=combined, deadline=plan.end)  # fmt: skip
            retimed = again or retimed
    notes = budget_notes(outcome, stats, budget_s or sp.budget.time_s, start)
    outcome.elapsed_s = time.perf_counter() - start  # the whole run, every stage
    advice = build_advice(outcome, workload.info, mode, sp.name, sp.min_gain, choices, retimed,
                          retime_error=retime_error, notes=notes)  # fmt: skip
    if busy and advice.config.result is not None:
        result = advice.config.result.model_copy(update={"warnings": busy[:1]})
        advice.config = advice.config.model_copy(update={"result": result})
    return advice


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
