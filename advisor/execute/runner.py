"""Run one candidate: apply its settings to a fresh model, time its step, gate its numerics.

Used by the search (in process or in a worker subprocess) and by the benchmarks. The step is what a
training loop does under `advisor.apply` (see `advisor.measure.candidate`); the gate is `advisor.gate.numeric`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from functools import partial

import torch

from advisor.allowance import over_allowance, stop_after
from advisor.compiled import (
    cache_reads,
    cold_cache,
    graph_breaks,
    inductor_caches,
    keep_artifacts,
    measurement_cache,
    recompile_guard,
    recompile_reason,
    start_inductor,
)
from advisor.device.allocator import keep_cpu_buffers_resident
from advisor.device.global_state import global_state
from advisor.errors import first_line
from advisor.execute import gating
from advisor.execute.park import Park, Parked
from advisor.execute.payback import cannot_pay
from advisor.gate.numeric import Gate
from advisor.gate.precision import CheckOutOfTime
from advisor.knobs import Settings
from advisor.measure.candidate import Candidate, Captured, Mode, flatten_tensors
from advisor.measure.gpu_clock import l2_flusher, warm_device
from advisor.measure.memory import PeakMemory
from advisor.measure.results import Pending, TrialResult
from advisor.measure.settle import settles
from advisor.measure.stats import Measurement, Race, combine
from advisor.measure.stop import Stop
from advisor.measure.stopping import TimingPolicy
from advisor.measure.timing import measure
from advisor.space import SearchSpace
from advisor.workload.build import Workload

__all__ = ["Candidate", "Captured", "Gate", "Mode", "TrialResult", "evaluate", "flatten_tensors"]


def _stopped(
    settings: Settings,
    precision: str,
    per_shape: list[Measurement],
    workload: Workload,
    why: Stop,
    payback: list[Measurement] | None = None,
) -> TrialResult:
    """A candidate out of the pick: its samples so far (none where its cold compile was
    stopped) and its payback rounds, no numeric check."""
    weights = [c.weight for c in workload.shape_cases][: len(per_shape)]
    cold = _first_calls_s(per_shape) if per_shape else why.cold_s
    return TrialResult(
        settings=settings,
        status="stopped",
        stop=why,
        measurement=combine(per_shape, weights) if per_shape else None,
        per_shape=per_shape if len(per_shape) > 1 else None,
        precision=precision,
        compile_cold_s=cold if settings.compiled else None,
        payback=payback,
    )


def evaluate(
    workload: Workload,
    settings: Settings,
    device: torch.device,
    mode: Mode,
    space: SearchSpace,
    gate: Gate,
    *,
    policy: TimingPolicy | None = None,
    race: Race | None = None,
    time_left_s: float | None = None,
    park: Park | None = None,
) -> TrialResult:
    """Measure and gate one candidate on every shape of the workload.

    Any failure becomes a failed result with its reason. The objective over a shape set is the
    weighted sum of the per-shape medians. A single layer is timed as a per-layer decision: L2
    flushed before each sample and, on a GPU, device time only (see `timing.Sampler`). With a
    `race`, a candidate that provably cannot win is stopped early and not gated (status
    "stopped"); `time_left_s` cuts sampling when the run's time budget is spent. It counts from
    before the model is built: the first call (compilation, autotuning) is inside it, and a raced
    candidate whose first call runs past it stops there, unmeasured and not gated.

    A compiled candidate (`settings.compile`) compiles with empty caches, or reads a graph this
    process compiled for another (`_compiled`): each shape's first call is its cold compile
    (`compile_cold_s`, never in the samples; the warm cost of the pick is its first call in the
    final check's fresh process). Raced out, it stops before the gate's
    capture like any candidate. Its numerics are checked at model level only (the per-layer check
    runs conv modules alone: it cannot see inside a compiled graph, and the eager modules are
    its eager twin's, checked there); a recompile on every call fails it.

    Under a race, a gate dearer than the candidate's own checks waits: a precision not judged
    yet (its training check), a compiled candidate's capture under dropout (it compiles the
    model again), or the checks of an eager candidate measured above the race's bar. The result
    is then accepted with `pending` set, and `gating.gate_only` runs the gate where the pick
    needs its verdict (`advisor.search.pick_gates`). `wall_s` is the whole call's.

    With a `park`, a screened candidate (`race.screen`) is kept built and warm there, and its
    full timing resumes it (`advisor.execute.park`): the result then carries its screen.
    """
    started = time.perf_counter()
    check = gate.precision_check(settings) if gate.judged(settings) else None
    if check is not None and not check.accepted:  # its precision failed on this model: untimed
        untimed = TrialResult(settings=settings, status="ok", precision=check.precision)
        return gating.with_precision(untimed, check)
    # One shape: a shape set is not raced, so not screened either.
    parked = park.take(settings) if park is not None and len(gate.cases) == 1 else None
    body = partial(
        _evaluate, workload, settings, device, mode, space, gate, policy, race, time_left_s
    )
    result = _compiled(settings, gate, device, body) if settings.compiled else body(park, parked)
    update: dict[str, object] = {"wall_s": time.perf_counter() - started}
    if parked is not None:
        update["screen"] = parked.screen
    return result.model_copy(update=update)


def _compiled(
    settings: Settings, gate: Gate, device: torch.device, body: Callable[..., TrialResult]
) -> TrialResult:
    """`body` (`_evaluate`, for a compiled candidate) run with empty compiler caches; or, where
    this process has compiled its graph for another candidate (`Settings.graph`), with that
    compile's artifacts: the graph is then read, not compiled again, and its cold compile is the
    other's (`compile_bill.paid_by`). Where it was not read after all, or Inductor's graph cache
    is off, it is compiled cold."""
    try:
        start_s = start_inductor(device)  # not the candidate's cost: once per process
    except Exception as e:  # noqa: BLE001 - e.g. no C++ compiler: this candidate fails
        return gating.failed(settings, f"torch.compile cannot start: {first_line(e)}",
                             gate.precision(settings))  # fmt: skip
    warm = measurement_cache()  # where every cold compile's artifacts are kept
    graph = (str(warm), gate.workload.info.model_dump_json(), gate.mode,
             settings.graph().model_dump_json())  # fmt: skip
    done: dict[str, object] = {"compile_start_s": start_s or None}
    before = cache_reads() if graph in _COMPILED else None
    if before is not None:
        with recompile_guard(len(gate.cases)), inductor_caches(warm):
            result = body(compiled_s=_COMPILED[graph])
            done["graph_breaks"] = graph_breaks()
        hits, misses = cache_reads() or before
        if hits > before[0] and misses == before[1]:
            return result.model_copy(update={**done, "compile_cold_s": None})
    cold = cold_cache()
    with recompile_guard(len(gate.cases)), inductor_caches(cold):
        result = body()
        done["graph_breaks"] = graph_breaks()  # Dynamo's record, reset as the caches were entered
    keep_artifacts(cold)
    if result.compile_cold_s is not None and result.measurement is not None:
        _COMPILED[graph] = result.compile_cold_s
    return result.model_copy(update=done)


# The graphs this process compiled cold, by the folder their artifacts were kept in, the
# workload and its mode: the cold compile's seconds
_COMPILED: dict[tuple[str, str, str, str], float] = {}


def _evaluate(
    workload: Workload,
    settings: Settings,
    device: torch.device,
    mode: Mode,
    space: SearchSpace,
    gate: Gate,
    policy: TimingPolicy | None,
    race: Race | None,
    time_left_s: float | None,
    park: Park | None = None,
    parked: Parked | None = None,
    compiled_s: float | None = None,
) -> TrialResult:
    """`evaluate`'s body for one candidate; `parked`: its screen's built candidate, resumed;
    `compiled_s`: the cold compile of its graph, where another candidate's made it."""
    deadline = None if time_left_s is None else time.perf_counter() + time_left_s
    precision = gate.precision(settings)
    policy = policy or space.timing.policy()
    if workload.is_layer and device.type != "cuda":
        policy = dataclasses.replace(policy, warmup_s=0.0)  # a layer's step settles (`settles`)
    keep_cpu_buffers_resident()
    warm_device(device)
    flush = l2_flusher(device) if workload.is_layer else None  # harness, not the candidate's
    memory = PeakMemory(device)
    peak = 0.0
    per_shape: list[Measurement] = []
    checked = gating.Checked(0.0 if mode == "train" else None)  # the gate's errors over the shapes
    pristine = global_state()  # before any candidate's flags: a payback check builds a second
    allowance = race.allowance_s if race is not None else None  # a one-off's, where bounded
    horizon = race.horizon_steps if race is not None else None
    if len(gate.cases) > 1:
        race = None  # slower on one shape does not mean slower over the weighted set
        park = None
    # Above the bar of the fastest so far an eager candidate's gate waits (`could_win`'s test);
    # PyTorch's default, the baseline, is gated whatever the bar, and so is a compiled one (its
    # bar came from an earlier window: a re-time decides)
    bar = None if race is None or settings.compiled or settings == Settings() else race.bar_ms
    # Under a race, a gate that costs more than the candidate's own checks waits until the
    # candidate could be picked: a precision not judged yet (its training check), or a compiled
    # candidate under dropout (its capture compiles the model again)
    pending: Pending | None = None
    payback: list[Measurement] | None = None  # a compiled candidate's rounds beside its rival
    if race is not None and not gate.judged(settings):
        pending = "precision"
    elif race is not None and settings.compiled and gate.dropout:
        pending = "capture"
    screen = parked.screen if parked is not None else None
    for case in range(len(gate.cases)):  # each reference read after its timing
        cand: Candidate | None = None
        failure = lost = None
        try:
            if parked is not None:
                cand = parked.cand
                peak, memory.first_call_mb = parked.peak_mb, parked.first_call_peak_mb
            else:
                cand = Candidate(workload, settings, device, mode, gate.seed, case=case)
            first_started = time.perf_counter()
            with stop_after(allowance) as allowed:
                def after_first() -> None:
                    allowed.end()
                    memory.after_first()

                m = measure(
                    cand.step,
                    device,
                    policy,
                    flush=flush,
                    queue_ahead=workload.is_layer,
                    race=race,
                    deadline=deadline,
                    after_first=after_first,
                    resume=screen,
                    settle=settles(workload, case, settings.memory_format),
                )
            if not m.samples_ms:  # its first call used up the budget: nothing to compare
                first_s = (m.first_call_ms or 0.0) / 1e3
                return TrialResult(settings=settings, status="stopped", precision=precision,
                                   stop=Stop(kind="budget", cold_s=first_s))  # fmt: skip
            per_shape.append(m)
            unpaid, payback = cannot_pay(cand, m, race, workload=workload, device=device,
                                         mode=mode, seed=gate.seed, case=case, policy=policy,
                                         pristine=pristine, cold_s=compiled_s)  # fmt: skip
            if unpaid is not None:
                lost = unpaid
            elif race is not None and (raced := _raced(m, race)) is not None:
                # Lost the race, or cut by the budget while slower, or screened: not gated
                lost = raced
                if park is not None and raced.kind == "screened" and not raced.cut:
                    kept = Parked(cand, m, max(peak, memory.growth_mb()), memory.first_call_mb)
                    if park.keep(settings, kept):
                        cand = None  # its full timing resumes it
            else:
                # The candidate's own peak: read before the numeric check allocates its copies.
                peak = max(peak, memory.growth_mb())
                if pending is None and bar is not None and m.ci_low_ms > bar:
                    pending = "checks"  # slower than the fastest so far: its gate waits too
                if pending is None:  # else gated only where it could be picked (`gate_only`)
                    checked.add(cand, settings, gate, gate.cases[case], mode)
        except torch.OutOfMemoryError:
            failure = "out of memory"
        except Exception as e:  # noqa: BLE001 - a broken candidate is a result, not a crash
            if over_allowance(e) and allowance is not None and horizon is not None:
                # stopped mid-compile or mid-autotuning: the compiler's state is dropped, the
                # candidate is out; the most it could save a step is what its allowance repays
                torch.compiler.reset()
                lost = Stop(kind="cannot_pay", horizon_steps=horizon,
                            saving_ms=allowance * 1e3 / horizon,
                            cold_s=time.perf_counter() - first_started,
                            one_off="cold compile" if settings.compiled else "autotuning")  # fmt: skip
            else:
                failure = recompile_reason(e, len(gate.cases)) or first_line(e)
        if cand is not None:
            # After a sticky CUDA error (an illegal memory access) closing raises it again: the
            # first failure is the reason, and the closing one tells a failure closing found.
            failure = failure or gating.close_candidate(cand)
        if failure is not None:
            return gating.failed(settings, failure, precision)
        if lost is not None:
            return _stopped(settings, precision, per_shape, workload, lost, payback)
    weights = [c.weight for c in workload.shape_cases]
    measured: dict[str, object] = {
        "measurement": combine(per_shape, weights),
        "per_shape": per_shape if len(per_shape) > 1 else None,
        "peak_memory_mb": peak,
        "first_call_peak_mb": memory.first_call_mb,
        "compile_cold_s": _first_calls_s(per_shape) if settings.compiled else None,
        "payback": payback,
    }
    if pending is not None:
        return TrialResult(settings=settings, status="ok", precision=precision, pending=pending,
                           **measured)  # fmt: skip
    try:
        return gating.verdict(gate, settings, precision, checked, deadline, **measured)
    except CheckOutOfTime:  # not judged: it cannot be picked, and a later run checks it
        return _stopped(settings, precision, per_shape, workload, Stop(kind="out_of_time"))


def _raced(m: Measurement, race: Race) -> Stop | None:
    """Why sampling left `m` out of the pick: its race lost, its screen taken, or the budget
    cut it while slower than the race's limit; None where it goes on to its gate."""
    if m.stop in ("screened", "cut"):
        return Stop(kind="screened", ms=m.median_ms, samples=len(m.samples_ms),
                    cut=m.stop == "cut")  # fmt: skip
    if m.stop == "raced" or (m.stop == "budget" and m.median_ms > race.limit_ms):
        return Stop(kind="raced", bar_ms=race.limit_ms, samples=len(m.samples_ms),
                    ms=m.median_ms)  # fmt: skip
    return None


def _first_calls_s(per_shape: list[Measurement]) -> float:
    return sum(m.first_call_ms or 0.0 for m in per_shape) / 1e3
