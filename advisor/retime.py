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

from collections.abc import Sequence
from functools import partial

import torch

from advisor.candidate import Candidate, Mode
from advisor.knobs import GlobalFlags
from advisor.results import TrialResult
from advisor.timing import (
    Clock,
    Measurement,
    Sampler,
    TimingPolicy,
    combine,
    device_guard,
    l2_flusher,
    sample_interleaved,
)
from advisor.workload import Workload


def finalists(results: Sequence[TrialResult], baseline: TrialResult, top: int) -> list[TrialResult]:
    """The `top` fastest accepted candidates, plus the baseline."""
    ok = sorted(
        (r for r in results if r.status == "ok" and r.measurement), key=lambda r: r.median_ms
    )
    chosen = ok[:top]
    if all(r.settings != baseline.settings for r in chosen):
        chosen.append(baseline)
    return chosen


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
                    before=[partial(GlobalFlags.switch_to, c.tuned.settings) for c in cands],
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


def _reps(result: TrialResult, case: int) -> int:
    if result.per_shape is not None and case < len(result.per_shape):
        return result.per_shape[case].reps
    return result.measurement.reps if result.measurement is not None else 1
