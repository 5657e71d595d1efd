"""Run one candidate: apply its settings to a fresh model, time its step, gate its numerics.

Used by the search (in process or in a worker subprocess) and by the benchmarks. The step is what a
training loop does under `advisor.apply` (see `advisor.measure.candidate`); the gate is `advisor.gate.numeric`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from advisor.compiled import (
    cold_cache,
    graph_breaks,
    inductor_caches,
    keep_artifacts,
    recompile_guard,
    recompile_reason,
    start_inductor,
)
from advisor.device.allocator import settle_cpu_allocator
from advisor.device.global_state import global_state
from advisor.errors import first_line
from advisor.execute.gating import Checked
from advisor.execute.gating import close_candidate as _close
from advisor.execute.gating import failed as _failed
from advisor.execute.gating import verdict as _verdict
from advisor.execute.park import Park, Parked
from advisor.execute.payback import cannot_pay
from advisor.gate.numeric import Gate
from advisor.gate.precision import CheckOutOfTime
from advisor.knobs import Settings
from advisor.measure.candidate import Candidate, Captured, Mode, flatten_tensors
from advisor.measure.gpu_clock import l2_flusher, warm_device
from advisor.measure.memory import PeakMemory
from advisor.measure.results import TrialResult
from advisor.measure.settle import settles
from advisor.measure.stats import Measurement, Race, combine
from advisor.measure.stopping import SCREENED
from advisor.measure.timing import TimingPolicy, measure
from advisor.measure.verdict import CANNOT_WIN, GATE_PENDING, PRECISION_PENDING
from advisor.space import SearchSpace
from advisor.workload.build import Workload

__all__ = ["Candidate", "Captured", "Gate", "Mode", "TrialResult", "cannot_win", "evaluate", "flatten_tensors"]


def _stopped(
    settings: Settings,
    precision: str,
    per_shape: list[Measurement],
    workload: Workload,
    why: str,
) -> TrialResult:
    """A candidate raced out: its samples so far, no numeric check (it cannot be picked)."""
    weights = [c.weight for c in workload.shape_cases][: len(per_shape)]
    return TrialResult(
        settings=settings,
        status="stopped",
        reason=why,
        measurement=combine(per_shape, weights),
        per_shape=per_shape if len(per_shape) > 1 else None,
        precision=precision,
        compile_cold_s=_first_calls_s(per_shape) if settings.compiled and per_shape else None,
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
    clock: Callable[[], float] | None = None,
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

    A compiled candidate (`settings.compile`) compiles with empty caches: each shape's first call
    is its cold compile (`compile_cold_s`, never in the samples; the warm cost of the pick is its
    first call in the final check's fresh process). Raced out, it stops before the gate's
    capture like any candidate. Its numerics are checked at model level only (the per-layer check
    runs conv modules alone: it cannot see inside a compiled graph, and the eager modules are
    its eager twin's, checked there); a recompile on every call fails it. Under dropout that
    capture compiles the model again: in the compile stage's race (`Race.defer_gate`) it is left
    out, the result says `gate_pending`, and `gate_only` runs it if the candidate wins the pick
    (`advisor.stages.gate_winner`). `wall_s` is the whole call's.

    With a `park`, a screened candidate (`race.screen`) is kept built and warm there, and its
    full timing resumes it (`advisor.execute.park`): the result then carries its screen.
    """
    started = time.perf_counter()
    # One shape: a shape set is not raced, so not screened either.
    parked = park.take(settings) if park is not None and len(gate.cases) == 1 else None
    result = _evaluate_any(workload, settings, device, mode, space, gate, policy, clock, race,
                           time_left_s, park, parked)  # fmt: skip
    update: dict[str, object] = {"wall_s": time.perf_counter() - started}
    if parked is not None:
        update["screen"] = parked.screen
    return result.model_copy(update=update)


def _evaluate_any(
    workload: Workload,
    settings: Settings,
    device: torch.device,
    mode: Mode,
    space: SearchSpace,
    gate: Gate,
    policy: TimingPolicy | None,
    clock: Callable[[], float] | None,
    race: Race | None,
    time_left_s: float | None,
    park: Park | None = None,
    parked: Parked | None = None,
) -> TrialResult:
    if settings.compiled:
        try:
            start_s = start_inductor(device)  # not the candidate's cost: once per process
        except Exception as e:  # noqa: BLE001 - e.g. no C++ compiler: this candidate fails
            return _failed(settings, f"torch.compile cannot start: {first_line(e)}",
                           gate.precision(settings))  # fmt: skip
        cold = cold_cache()
        with recompile_guard(len(gate.cases)), inductor_caches(cold):
            result = _evaluate(workload, settings, device, mode, space, gate, policy, clock,
                               race, time_left_s)  # fmt: skip
            breaks = graph_breaks()  # Dynamo's record, reset as the caches were entered
        keep_artifacts(cold)
        return result.model_copy(update={"compile_start_s": start_s or None,
                                          "graph_breaks": breaks})  # fmt: skip
    return _evaluate(workload, settings, device, mode, space, gate, policy, clock, race,
                     time_left_s, park, parked)  # fmt: skip


def _evaluate(
    workload: Workload,
    settings: Settings,
    device: torch.device,
    mode: Mode,
    space: SearchSpace,
    gate: Gate,
    policy: TimingPolicy | None,
    clock: Callable[[], float] | None,
    race: Race | None,
    time_left_s: float | None,
    park: Park | None = None,
    parked: Parked | None = None,
) -> TrialResult:
    """`evaluate`'s body for one candidate; `parked`: its screen's built candidate, resumed."""
    now = clock or time.perf_counter
    deadline = None if time_left_s is None else now() + time_left_s
    # the precision check's training runs stop on the wall clock, whatever clock times samples
    check_deadline = None if time_left_s is None else time.perf_counter() + time_left_s
    precision = gate.precision(settings)
    policy = policy or space.timing.policy()
    settle_cpu_allocator()
    warm_device(device)
    flush = l2_flusher(device) if workload.is_layer else None  # harness, not the candidate's
    memory = PeakMemory(device)
    peak = 0.0
    gate_s = 0.0  # the gate's capture, comparison and layer checks (the training check apart)
    per_shape: list[Measurement] = []
    checked = Checked(0.0 if mode == "train" else None)  # the gate's errors over the shapes
    pristine = global_state()  # before any candidate's flags: a payback check builds a second
    judge_below = race.judge_below_ms if race is not None else None
    if len(gate.cases) > 1:
        race = None  # slower on one shape does not mean slower over the weighted set
        park = None
    # Gated later, where it could still be picked: a compiled candidate under dropout (its
    # capture would compile again: `advisor.stages.gate_winner`), or one at a precision not
    # judged yet (its training check is judged against the search's final leader, not this
    # moment's: `advisor.search.deferred_gates`)
    defer = race is not None and race.defer_gate and (
        (settings.compiled and gate.dropout) or not gate.judged(settings)
    )
    pending = False
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
            m = measure(
                cand.step,
                device,
                policy,
                clock=clock,
                flush=flush,
                queue_ahead=workload.is_layer,
                race=race,
                deadline=deadline,
                after_first=memory.after_first,
                resume=screen,
                settle=settles(workload, case, settings.memory_format),
            )
            if not m.samples_ms:  # its first call used up the budget: nothing to compare
                return TrialResult(
                    settings=settings, status="stopped", reason=m.stopped, precision=precision
                )
            per_shape.append(m)
            unpaid = cannot_pay(cand, m, race, workload=workload, device=device, mode=mode,
                                seed=gate.seed, case=case, policy=policy, pristine=pristine,
                                clock=clock)  # fmt: skip
            if unpaid is not None:
                lost = unpaid
            elif race is not None and m.stopped is not None and (
                "slower than" in m.stopped or m.stopped.startswith(SCREENED)
            ):
                # Lost the race, or cut by the budget while slower: not gated. A compiled
                # candidate too, though its capture under dropout masks compiles again: only the
                # race's margin stops it before, as any candidate (its bar was measured in an
                # earlier window: MobileNetV3-Small train, stopped at 27.1 ms against the eager
                # leader's 22.7 ms, which the re-time then measured at 29.5 ms).
                lost = m.stopped
                if park is not None and m.stopped.startswith(SCREENED):
                    kept = Parked(cand, m, max(peak, memory.growth_mb()), memory.first_call_mb)
                    if park.keep(settings, kept):
                        cand = None  # its full timing resumes it
            elif (slow := _cannot_win_ungated(gate, settings, m, judge_below)) is not None:
                lost = slow  # measured in full and slower than the leader: never picked
            elif defer:
                peak = max(peak, memory.growth_mb())
                pending = True  # gated only if it wins the pick (`gate_only`)
            else:
                # The candidate's own peak: read before the numeric check allocates its copies.
                peak = max(peak, memory.growth_mb())
                t0 = time.perf_counter()
                checked.add(cand, settings, gate, gate.cases[case], mode)
                gate_s += time.perf_counter() - t0
        except torch.OutOfMemoryError:
            failure = "out of memory"
        except Exception as e:  # noqa: BLE001 - a broken candidate is a result, not a crash
            failure = recompile_reason(e, len(gate.cases)) or first_line(e)
        if cand is not None:
            # After a sticky CUDA error (an illegal memory access) closing raises it again: the
            # first failure is the reason, and the closing one tells a failure closing found.
            failure = failure or _close(cand)
        if failure is not None:
            return _failed(settings, failure, precision)
        if lost is not None:
            return _stopped(settings, precision, per_shape, workload, lost)
    unjudged = _cannot_win_unjudged(gate, settings, per_shape, workload, judge_below)
    if unjudged is not None:
        return _stopped(settings, precision, per_shape, workload, unjudged)
    weights = [c.weight for c in workload.shape_cases]
    measured: dict[str, object] = {
        "measurement": combine(per_shape, weights),
        "per_shape": per_shape if len(per_shape) > 1 else None,
        "peak_memory_mb": peak,
        "first_call_peak_mb": memory.first_call_mb,
        "compile_cold_s": _first_calls_s(per_shape) if settings.compiled else None,
    }
    if pending:
        why = GATE_PENDING if settings.compiled and gate.dropout else PRECISION_PENDING
        return TrialResult(settings=settings, status="ok", reason=why,
                           precision=precision, gate_pending=True, **measured)  # fmt: skip
    try:
        return _verdict(gate, settings, precision, checked.err, checked.grad_err, checked.layer,
                        check_deadline, compile_check_s=checked.check_s or None,
                        gate_s=gate_s or None,
                        **measured)  # fmt: skip
    except CheckOutOfTime as e:  # not judged: it cannot be picked, and a later run checks it
        return _stopped(settings, precision, per_shape, workload, str(e))


def _cannot_win_unjudged(
    gate: Gate,
    settings: Settings,
    per_shape: list[Measurement],
    workload: Workload,
    judge_below_ms: float | None,
) -> str | None:
    """Why a candidate at a precision not judged yet is stopped before its training check is
    paid (`Race.judge_below_ms`), or None: measured in full, it cannot win the pick."""
    if judge_below_ms is None or gate.judged(settings):
        return None
    m = combine(per_shape, [c.weight for c in workload.shape_cases])
    if m.ci_low_ms <= judge_below_ms:
        return None
    return cannot_win(m, judge_below_ms, gate.precision(settings))


def cannot_win(m: Measurement, judge_below_ms: float, unjudged: str | None = None) -> str:
    """Why a candidate measured in full is not gated: slower than the leader's bar; `unjudged`,
    its precision, where that was not judged on this model either."""
    if unjudged is not None:
        return (
            f"{_slower(m, judge_below_ms)}; {unjudged} not judged on this model (its training "
            "check is paid only for a candidate that could be picked)"
        )
    return (
        f"{_slower(m, judge_below_ms)}; not gated (the gate's checks are paid only for a "
        "candidate that could be picked)"
    )


def _cannot_win_ungated(
    gate: Gate, settings: Settings, m: Measurement, judge_below_ms: float | None
) -> str | None:
    """Why an eager candidate measured in full is stopped before the gate's capture and layer
    checks, or None. Above the leader's bar (`Race.judge_below_ms`) it cannot win the pick, as
    `_cannot_win_unjudged` says, and the re-time's finalists drop it by the same rule: its
    verdict would never be read (on small_cnn at quick, the layer checks were a second of the
    global knobs' 5). A compiled candidate is gated still: its bar came from an earlier window
    (a re-time decides); so is a shape set's case, whose weighted whole is what counts, and
    PyTorch's default, the baseline every advice reports against."""
    if settings.compiled or settings == Settings() or len(gate.cases) > 1:
        return None
    if judge_below_ms is None or m.ci_low_ms <= judge_below_ms:
        return None
    if not gate.judged(settings):  # the advice says which precision went unjudged, and why
        return cannot_win(m, judge_below_ms, gate.precision(settings))
    return cannot_win(m, judge_below_ms)


def _slower(m: Measurement, judge_below_ms: float) -> str:
    return (
        f"{CANNOT_WIN}: {m.ci_low_ms:.3f} ms at best, slower than the best accepted candidate's "
        f"{judge_below_ms:.3f} ms"
    )


def _first_calls_s(per_shape: list[Measurement]) -> float:
    return sum(m.first_call_ms or 0.0 for m in per_shape) / 1e3
