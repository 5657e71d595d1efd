"""Interleaved re-timing of the finalists before the pick.

Candidates measured one after another see different machine states (clock boost, other load,
thermal drift). The finalists — the fastest few accepted candidates and PyTorch's default — are
re-timed together in rounds, one sample each per round, in alternating order (A B C, C B A, ...),
so drift hits them all alike. Every sample is taken by the same `Sampler` as in the trials (CUDA
events on a GPU, the same calls per sample, the same L2 flush for a single layer), so the fresh
measurements are comparable with each other and replace the sequential ones: the pick is then made
among the re-timed finalists only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import partial
from typing import Any

import torch

from advisor.apply import Tuned
from advisor.candidate import Candidate, Mode
from advisor.global_state import global_state, restore_global_state
from advisor.knobs import GlobalFlags
from advisor.results import TrialResult
from advisor.stats import Measurement, combine
from advisor.timing import (
    Clock,
    Sampler,
    TimingPolicy,
    device_guard,
    l2_flusher,
    sample_interleaved,
    warm_device,
)
from advisor.workload import Workload


def finalists(
    results: Sequence[TrialResult], baseline: TrialResult, top: int, min_gain: float = 0.02
) -> list[TrialResult]:
    """The `top` fastest accepted candidates that could still win, plus the baseline.

    A candidate whose whole interval lies above the fastest's interval by more than `min_gain`
    cannot win the pick, so it is not re-timed (e.g. bf16 on a CPU without bf16 units)."""
    ok = sorted(
        (r for r in results if r.status == "ok" and r.measurement), key=lambda r: r.median_ms
    )
    if not ok:
        return [baseline]
    assert ok[0].measurement is not None
    limit = ok[0].measurement.ci_high_ms * (1 + min_gain)
    chosen = [r for r in ok if r.measurement is not None and r.measurement.ci_low_ms <= limit][:top]
    if all(r.settings != baseline.settings for r in chosen):
        chosen.append(baseline)
    return chosen


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


def retime(
    workload: Workload,
    results: Sequence[TrialResult],
    device: torch.device,
    mode: Mode,
    policy: TimingPolicy,
    *,
    clock: Clock | None = None,
) -> list[TrialResult]:
    """`results` with fresh, interleaved measurements (weighted over a shape set), marked
    `retimed`. Each finalist keeps the calls per sample its trial used, per shape."""
    per_case: list[list[Measurement]] = [[] for _ in results]
    warm_device(device)
    pristine = global_state()  # what each sample starts from (a step may change threads, ...)
    single = workload.is_layer
    with device_guard(device):
        sampler = Sampler(device, clock, l2_flusher(device) if single else None, single)
        for case in range(len(workload.shape_cases)):
            reps = [_reps(r, case) for r in results]
            cands: list[Candidate] = []
            try:
                for r in results:
                    cands.append(Candidate(workload, r.settings, device, mode, case=case))
                samples = sample_interleaved(
                    [c.step for c in cands],
                    sampler,
                    reps=reps,
                    before=[partial(_prepare, pristine, c.tuned) for c in cands],
                    warmup=policy.warmup_runs,
                    min_rounds=policy.min_samples,
                    max_rounds=policy.max_samples,
                    budget_s=policy.max_time_s,  # the same time per candidate as a trial
                )
            finally:
                for c in reversed(cands):  # flags were saved in creation order: restore in reverse
                    c.close()
            for i, s in enumerate(samples):
                per_case[i].append(Measurement(samples_ms=s, reps=reps[i]))
    weights = [c.weight for c in workload.shape_cases]
    out = []
    for r, ms in zip(results, per_case, strict=True):
        m = combine(ms, weights)
        first = r.measurement.first_call_ms if r.measurement else None
        m = m.model_copy(update={"first_call_ms": first})
        out.append(
            r.model_copy(
                update={"measurement": m, "per_shape": ms if len(ms) > 1 else None, "retimed": True}
            )
        )
    return out


def _prepare(pristine: dict[str, Any], tuned: Tuned) -> None:
    """Before each finalist's sample: PyTorch's state as it was, then that finalist's flags."""
    restore_global_state(pristine)
    GlobalFlags.switch_to(tuned.settings, tuned.device)


def _reps(result: TrialResult, case: int) -> int:
    if result.per_shape is not None and case < len(result.per_shape):
        return result.per_shape[case].reps
    return result.measurement.reps if result.measurement is not None else 1
