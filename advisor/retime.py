"""Interleaved re-timing of the finalists before the pick.

Candidates measured one after another see different machine states (clock boost, other load,
thermal drift). The finalists — the fastest few accepted candidates and PyTorch's default — are
re-timed together in rounds, one sample each per round, in alternating order (A B C, C B A, ...),
so drift hits them all alike. Their fresh measurements replace the sequential ones for the pick.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from advisor.knobs import GlobalFlags
from advisor.runner import Candidate, Mode, TrialResult, combine
from advisor.timing import Measurement, TimingPolicy, synchronize
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


def _interleave(
    cands: list[Candidate], device: torch.device, policy: TimingPolicy
) -> list[list[float]]:
    samples: list[list[float]] = [[] for _ in cands]
    for c in cands:  # warm up each under its own flags
        GlobalFlags.switch_to(c.tuned.settings)
        for _ in range(max(1, policy.warmup_runs)):
            c.step()
    budget_s = policy.max_time_s * len(cands)  # the same time per candidate as a trial
    start = time.perf_counter()
    rounds = 0
    while rounds < policy.max_samples:
        order = list(enumerate(cands))
        if rounds % 2:
            order.reverse()
        for i, c in order:
            GlobalFlags.switch_to(c.tuned.settings)
            synchronize(device)
            t = time.perf_counter()
            c.step()
            synchronize(device)
            samples[i].append((time.perf_counter() - t) * 1e3)
        rounds += 1
        if rounds >= policy.min_samples and time.perf_counter() - start >= budget_s:
            break
    return samples


def retime(
    workload: Workload,
    results: Sequence[TrialResult],
    device: torch.device,
    mode: Mode,
    policy: TimingPolicy,
) -> list[TrialResult]:
    """`results` with fresh, interleaved measurements (weighted over a shape set)."""
    per_case: list[list[Measurement]] = [[] for _ in results]
    for case in range(len(workload.shape_cases)):
        cands: list[Candidate] = []
        try:
            for r in results:
                cands.append(Candidate(workload, r.settings, device, mode, case=case))
            samples = _interleave(cands, device, policy)
        finally:
            for c in reversed(cands):  # flags were saved in creation order: restore in reverse
                c.close()
        for i, s in enumerate(samples):
            per_case[i].append(Measurement(samples_ms=s))
    weights = [c.weight for c in workload.shape_cases]
    out = []
    for r, ms in zip(results, per_case, strict=True):
        m = combine(ms, weights)
        first = r.measurement.first_call_ms if r.measurement else None
        m = m.model_copy(update={"first_call_ms": first})
        out.append(
            r.model_copy(update={"measurement": m, "per_shape": ms if len(ms) > 1 else None})
        )
    return out
