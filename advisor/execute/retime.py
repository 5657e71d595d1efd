"""Interleaved re-timing of the finalists before the pick.

Candidates measured one after another see different machine states (clock boost, other load,
thermal drift). The finalists — the fastest few accepted candidates and PyTorch's default — are
re-timed together in rounds, one sample each per round, in rotating order (A B C, B C A, ...),
so drift hits them all alike. Every sample is taken by the same `Sampler` as in the trials (CUDA
events on a GPU, the same calls per sample, the same L2 flush for a single layer), so the fresh
measurements are comparable with each other and replace the sequential ones: the pick is then made
among the re-timed finalists only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch

from advisor.apply import Tuned
from advisor.compiled import inductor_caches, measurement_cache, recompile_guard, start_inductor
from advisor.device.global_state import global_state, restore_global_state
from advisor.device.ops import device_guard
from advisor.knobs import GlobalFlags
from advisor.measure.candidate import Candidate, Mode
from advisor.measure.gpu_clock import l2_flusher, warm_device
from advisor.measure.results import TrialResult
from advisor.measure.settle import settles
from advisor.measure.stats import STRICT_Z, Measurement, combine, paired_speedup
from advisor.measure.timing import (
    DECIDE_AFTER_S,
    Sampler,
    TimingPolicy,
    interleave,
    synchronize,
    warm_up,
)
from advisor.workload.build import Workload


def retime_policy(policy: TimingPolicy, n: int, time_left_s: float | None) -> TimingPolicy:
    """The trials' policy, with the time per finalist cut to fit what is left of the budget
    (and, when that is less than the trials had, one warm-up run and three rounds at least)."""
    if time_left_s is None:
        return policy
    share = max(0.05, time_left_s / max(n, 1))
    if share >= policy.max_time_s:
        return policy
    return dataclasses.replace(
        policy,
        max_time_s=share,
        warmup_runs=min(policy.warmup_runs, 1),
        warmup_s=0.0,
        min_samples=min(policy.min_samples, 3),
    )


class RetimeSession:
    """The finalists of one shape case, built and warmed up, sampled one at a time: `sample(i)`
    is one sample of finalist i after PyTorch's state is put back and its flags set. The rounds
    may be driven from another process (`advisor.execute.benchmark_processes`: finalists that
    must not share a process)."""

    def __init__(
        self,
        workload: Workload,
        results: Sequence[TrialResult],
        device: torch.device,
        mode: Mode,
        policy: TimingPolicy,
        case: int = 0,
    ) -> None:
        warm_device(device)
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(device_guard(device))
        start_s = 0.0
        if any(r.settings.compiled for r in results):
            # Compiled finalists compile again from the caches their trials filled (warm), in a
            # fresh compiler state, and fail rather than recompile on every call. Inductor's
            # start comes first, kept apart from the first call and added to the first compiled
            # one's (`first_ms`: what a training step pays first in a fresh process).
            start_s = start_inductor(device)
            self._stack.enter_context(recompile_guard(len(workload.shape_cases)))
            self._stack.enter_context(inductor_caches(measurement_cache()))
        self.pristine = global_state()  # what each sample starts from (threads, flags, ...)
        single = workload.is_layer
        self.sampler = Sampler(
            device, flush=l2_flusher(device) if single else None, queue_ahead=single
        )
        self.reps = [_reps(r, case) for r in results]
        self.cands: list[Candidate] = []
        try:
            for r in results:
                self.cands.append(Candidate(workload, r.settings, device, mode, case=case))
            self.before = [partial(prepare_flags, self.pristine, c.tuned) for c in self.cands]
            steps = [c.step for c in self.cands]
            self.first_ms: list[float] = []  # each finalist's first call here (a compile)
            # on a CPU, only a finalist the process has not settled its layout for settles here
            settled = [settles(workload, case, r.settings.memory_format) for r in results]
            self.launch_ms = warm_up(steps, self.before, policy.warmup_runs, self.sampler.clock,
                                     self.first_ms, device, settles=settled)  # fmt: skip
            synchronize(device)
        except BaseException:
            self.close()
            raise
        if start_s:  # paid here, so some finalist compiles: the first of them carries it
            first = next(i for i, r in enumerate(results) if r.settings.compiled)
            self.first_ms[first] += start_s * 1e3

    def sample(self, i: int) -> float:
        self.before[i]()
        self.sampler.launch_ms = self.launch_ms[i]
        return self.sampler(self.cands[i].step, self.reps[i])

    def close(self) -> None:
        try:
            for c in reversed(self.cands):  # flags were saved in creation order: restore reversed
                c.close()
            self.cands = []
        finally:
            self._stack.close()


def retime(
    workload: Workload,
    results: Sequence[TrialResult],
    device: torch.device,
    mode: Mode,
    policy: TimingPolicy,
    *,
    min_gain: float | None = None,
    decided: Callable[[list[list[float]]], bool] | None = None,
    first_s: list[float] | None = None,
) -> list[TrialResult]:
    """`results` with fresh, interleaved measurements (weighted over a shape set), marked
    `retimed`. Each finalist keeps the calls per sample its trial used, per shape. With
    `min_gain`, the rounds of a single shape stop by `stop_rule`; with `decided`, once it
    holds. `first_s` (one per result) receives each one's first calls (seconds over the shapes)."""
    per_case: list[list[list[float]]] = []
    rule = stop_rule(results, min_gain) if min_gain is not None else decided
    rule = rule if len(workload.shape_cases) == 1 else None  # a shape set's rounds are summed
    for case in range(len(workload.shape_cases)):
        session = RetimeSession(workload, results, device, mode, policy, case)
        try:
            if first_s is not None:
                for i, ms in enumerate(session.first_ms):
                    first_s[i] += ms / 1e3
            samplers = [partial(session.sample, i) for i in range(len(results))]
            per_case.append(
                interleave(samplers, session.sampler.clock, **rounds(policy), decided=rule)
            )
        finally:
            session.close()
    return retimed_results(workload, results, per_case)


def stop_rule(results: Sequence[TrialResult], min_gain: float) -> Callable[..., bool]:
    """What ends the rounds of a single shape early: the pick among `results` decided, with and
    without the finalists whose one-off cost may not pay (compiled; then cuDNN's search too)."""
    changes = [len(r.settings.changes()) for r in results]
    eager = [i for i, r in enumerate(results) if not r.settings.compiled]
    plain = [i for i in eager if not results[i].settings.cudnn_benchmark]
    return partial(decided_with_or_without_one_offs, complexity=changes, subsets=(eager, plain),
                   min_gain=min_gain)  # fmt: skip


def pick_decided(samples: list[list[float]], complexity: Sequence[int], min_gain: float) -> bool:
    """Whether the rounds so far already give the pick (`search.pick.choose`: the fastest,
    except that a simpler one within `min_gain` of it wins): some finalist C, whatever its place,
    beats each finalist as simple as it or simpler (PyTorch's default included) by more than
    `min_gain`, and no more complex one can beat C by `min_gain`, in their paired intervals at
    `STRICT_Z` (a rule looked at after every round). `complexity[i]` is finalist i's number of
    changes from the default. More rounds would then only narrow intervals that cannot change
    the pick: a per-layer combination a few per cent slower than the simpler settings it builds
    on decides at once. Finalists as simple as each other and within `min_gain` never decide it:
    their rounds go on to the budget, as without a rule."""
    if len(samples[0]) < 5:  # the fewest a paired interval is computed from
        return False
    m = [Measurement(samples_ms=s) for s in samples]

    def decides(c: int) -> bool:
        for x in range(len(samples)):
            if x == c:
                continue
            if complexity[x] > complexity[c]:  # x cannot beat c by min_gain
                _, _, hi = paired_speedup(m[c], m[x], STRICT_Z)
                if hi >= 1.0 + min_gain:
                    return False
            else:  # c beats x by more than min_gain
                _, lo, _ = paired_speedup(m[x], m[c], STRICT_Z)
                if lo <= 1.0 + min_gain:
                    return False
        return True

    order = sorted(range(len(samples)), key=lambda i: statistics.median(samples[i]))
    return any(decides(c) for c in order)


def decided_with_or_without_one_offs(
    samples: list[list[float]],
    complexity: Sequence[int],
    subsets: Sequence[Sequence[int]],
    min_gain: float,
) -> bool:
    """`pick_decided` among all the finalists and among each of `subsets` (indices): a leader
    whose one-off cost (a cold compile, cuDNN's search) then does not pay leaves the pick to the
    finalists without it (`search.pick.decide`), and their order must be decided by the same
    rounds."""
    if not pick_decided(samples, complexity, min_gain):
        return False
    return all(len(s) in (0, 1, len(samples))
               or pick_decided([samples[i] for i in s], [complexity[i] for i in s], min_gain)
               for s in subsets)  # fmt: skip


def rounds(policy: TimingPolicy) -> dict[str, Any]:
    """`interleave`'s rounds for a policy: the same time per candidate as a trial, decided no
    sooner than `DECIDE_AFTER_S` per candidate."""
    return {
        "min_rounds": policy.min_samples,
        "max_rounds": policy.max_samples,
        "budget_s": policy.max_time_s,
        "decide_after_s": DECIDE_AFTER_S,
    }


def retimed_results(
    workload: Workload, results: Sequence[TrialResult], per_case: list[list[list[float]]]
) -> list[TrialResult]:
    """`results` with the interleaved samples (per shape case, per finalist) as their
    measurements, weighted over the shape set, marked `retimed`."""
    weights = list(workload.shape_weights)
    out = []
    for i, r in enumerate(results):
        ms = [Measurement(samples_ms=samples[i], reps=_reps(r, case))
              for case, samples in enumerate(per_case)]  # fmt: skip
        m = combine(ms, weights)
        first = r.measurement.first_call_ms if r.measurement else None
        m = m.model_copy(update={"first_call_ms": first})
        taken = r.per_shape or ([r.measurement] if r.measurement is not None else [])
        out.append(
            r.model_copy(
                update={"measurement": m, "per_shape": ms if len(ms) > 1 else None, "retimed": True,
                        "replaced": [*r.replaced, *taken]}  # fmt: skip
            )
        )
    return out


def prepare_flags(pristine: dict[str, Any], tuned: Tuned) -> None:
    """Before each finalist's sample: PyTorch's state as it was, then that finalist's flags."""
    restore_global_state(pristine)
    GlobalFlags.switch_to(tuned.settings, tuned.device)


def _reps(result: TrialResult, case: int) -> int:
    if result.per_shape is not None and case < len(result.per_shape):
        return result.per_shape[case].reps
    return result.measurement.reps if result.measurement is not None else 1
