"""Honest timing: synchronised, warmed up, repeated until the median is known, raw samples kept.

`measure()` runs a step once (its first-call cost recorded apart: lazy init, cuDNN's benchmark
search, Triton compilation), warms up, then samples until the median's 95% confidence interval is
within `target_rel_ci` of it or `max_time_s` is spent. Every sample, in a trial and in the
interleaved re-time alike, is taken by one `Sampler`: CUDA events on a GPU, a synchronised host
clock elsewhere (injectable, so tests of the statistics are exact). A step shorter than the
policy's `min_sample_ms` is repeated back to back within one sample, so a sample is not dominated
by launch latency or clock overhead.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, computed_field

Clock = Callable[[], float]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_guard(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Make `device` the current CUDA device while measuring: CUDA events, streams and Triton
    launches use the current device, so with `--device cuda:1` and nothing set they would time
    (and run on) device 0."""
    if device.type == "cuda":
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def median_ci(sorted_samples: list[float], z: float = 1.96) -> tuple[float, float]:
    """Distribution-free confidence interval for the median, from order statistics."""
    n = len(sorted_samples)
    if n == 0:
        return (math.nan, math.nan)
    half = z * math.sqrt(n) / 2
    lo = max(0, math.floor(n / 2 - half))
    hi = min(n - 1, math.ceil(n / 2 + half) - 1)
    return sorted_samples[lo], sorted_samples[max(lo, hi)]


def _quantile(sorted_samples: list[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default method)."""
    pos = (len(sorted_samples) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_samples) - 1)
    return sorted_samples[lo] + (sorted_samples[hi] - sorted_samples[lo]) * (pos - lo)


class Measurement(BaseModel):
    """Raw samples (ms) and what derives from them."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    samples_ms: list[float]  # per call: a sample of `reps` back-to-back calls is divided by reps
    first_call_ms: float | None = None
    warmup_runs: int = 0
    reps: int = 1  # calls per sample
    stopped: str | None = None  # why sampling stopped before the policy's rule (race, budget)

    @property
    def _sorted(self) -> list[float]:
        return sorted(self.samples_ms)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def median_ms(self) -> float:
        return _quantile(self._sorted, 0.5) if self.samples_ms else math.nan

    @computed_field  # type: ignore[prop-decorator]
    @property
    def iqr_ms(self) -> float:
        s = self._sorted
        return _quantile(s, 0.75) - _quantile(s, 0.25) if s else math.nan

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ci_low_ms(self) -> float:
        return median_ci(self._sorted)[0]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ci_high_ms(self) -> float:
        return median_ci(self._sorted)[1]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def rel_ci(self) -> float:
        """Half-width of the median's CI relative to the median."""
        return (
            (self.ci_high_ms - self.ci_low_ms) / 2 / self.median_ms if self.samples_ms else math.inf
        )

    def overlaps(self, other: Measurement) -> bool:
        """True when the two medians' intervals overlap: the difference is within noise."""
        return self.ci_low_ms <= other.ci_high_ms and other.ci_low_ms <= self.ci_high_ms

    def warnings(self) -> list[str]:
        out = []
        if len(self.samples_ms) < 5:
            out.append(f"only {len(self.samples_ms)} samples")
        if self.samples_ms and max(self.samples_ms) > 3 * self.median_ms:
            out.append("outliers over 3x the median: the machine may be busy")
        if self.first_call_ms is not None and self.first_call_ms > 10 * self.median_ms:
            out.append(f"first call took {self.first_call_ms:.1f} ms (lazy init or autotuning)")
        return out


def mann_whitney_p(a: list[float], b: list[float]) -> float:
    """Two-sided p-value of the Mann-Whitney U test (normal approximation, tie-corrected).

    More powerful than comparing median CIs on few samples (7 vs 7 fully separated samples give
    p ≈ 0.002 while their order-statistic CIs span min..max and may overlap).
    """
    n1, n2 = len(a), len(b)
    if n1 == 0 or n2 == 0:
        return 1.0
    pooled = sorted([(v, 0) for v in a] + [(v, 1) for v in b])
    ranks = [0.0] * len(pooled)
    ties = 0.0
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2 + 1
        t = j - i + 1
        ties += t**3 - t
        i = j + 1
    r1 = sum(r for r, (_, g) in zip(ranks, pooled, strict=True) if g == 0)
    u = r1 - n1 * (n1 + 1) / 2
    n = n1 + n2
    var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1))) if n > 1 else 0.0
    if var <= 0:
        return 1.0
    z = (abs(u - n1 * n2 / 2) - 0.5) / math.sqrt(var)  # continuity correction
    return math.erfc(max(z, 0.0) / math.sqrt(2))


def clearly_faster(fast: Measurement, slow: Measurement, min_gain: float = 0.02) -> bool:
    """`fast` beats `slow` beyond noise: significant (p < 0.05) and by at least `min_gain`."""
    if fast.median_ms * (1 + min_gain) > slow.median_ms:
        return False
    return mann_whitney_p(fast.samples_ms, slow.samples_ms) < 0.05


def machine_load_warning(device: torch.device) -> str | None:
    """A warning when other work competes for the CPU: with every core busy, a step's threads
    wait on the scheduler and times can grow many-fold, so comparisons become unreliable."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return None
    cores = os.cpu_count() or 1
    # On a GPU only the launching thread matters; on a CPU every core does.
    busy = load > cores * (0.75 if device.type == "cpu" else 1.5)
    if busy:
        return f"the machine was busy while tuning (load average {load:.1f} on {cores} cores)"
    return None


def speedup(baseline: Measurement, tuned: Measurement) -> tuple[float, float, float]:
    """Baseline/tuned medians, with a conservative interval from the two CIs."""
    return (
        baseline.median_ms / tuned.median_ms,
        baseline.ci_low_ms / tuned.ci_high_ms,
        baseline.ci_high_ms / tuned.ci_low_ms,
    )


@dataclass(frozen=True)
class TimingPolicy:
    """How long to measure. Search-space files set these (see space.py)."""

    warmup_runs: int = 2
    warmup_s: float = 0.05
    min_samples: int = 7
    max_samples: int = 200
    target_rel_ci: float = 0.02
    max_time_s: float = 1.5
    min_sample_ms: float = 0.0  # a shorter step is repeated back to back within one sample
    max_reps: int = 100


class _L2Flusher:
    """Writes a buffer larger than L2 so a per-layer sample does not start from a warm cache."""

    def __init__(self, device: torch.device) -> None:
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 * 2**20)
        self._buf = torch.empty(max(2 * l2, 64 * 2**20), dtype=torch.uint8, device=device)

    def __call__(self) -> None:
        self._buf.zero_()


def l2_flusher(device: torch.device) -> Callable[[], None] | None:
    return _L2Flusher(device) if device.type == "cuda" else None


@dataclass(frozen=True)
class Race:
    """Stop sampling a candidate that cannot win.

    `limit_ms` is the best accepted candidate's CI upper end times (1 + min_gain): a candidate
    can only be recommended over it when its median is below that. Rule: a one-sided sign test
    at `alpha` that this candidate's median is above the limit. If its true median were at or
    below the limit, each steady-state sample would exceed the limit with probability at most
    1/2, so k or more of n samples above it happen with probability at most P(Bin(n, 1/2) >= k):
    stopping is wrong at most `alpha` of the time (5%), and far less often for a candidate that
    could really win (its median is below the best's by min_gain). With every sample above the
    limit that takes 5 samples. The first call (lazy initialisation, autotuning) never counts;
    on a CPU a warm-up run (its own synchronous time) counts as one more sample above the limit
    when it took more than twice the limit: a run after the first is not twice the steady state
    (on a CPU there is no queue to fill), so such a run is above the limit with probability at
    most 1/2 under the same hypothesis. A candidate 2x slower than the best stops after its two
    warm-up runs and three samples.
    """

    limit_ms: float
    alpha: float = 0.05
    min_samples: int = 5

    def lost(self, samples: Sequence[float], warmups: Sequence[float] = ()) -> bool:
        counted = [w for w in warmups if w > 2 * self.limit_ms]
        n = len(samples) + len(counted)
        if n < self.min_samples or len(samples) < 3:
            return False
        above = sum(s > self.limit_ms for s in samples) + len(counted)
        return sign_test_p(n, above) <= self.alpha


def sign_test_p(n: int, k: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2): the one-sided sign test's p-value."""
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n


def reps_for(step_ms: float, policy: TimingPolicy) -> int:
    """Calls per sample: enough back-to-back calls to fill `min_sample_ms` (1 when off)."""
    if policy.min_sample_ms <= 0 or step_ms >= policy.min_sample_ms:
        return 1
    return max(1, min(policy.max_reps, math.ceil(policy.min_sample_ms / max(step_ms, 1e-6))))


class Sampler:
    """Takes one timing sample of a step: the time per call of `reps` back-to-back calls.

    The one clock for trials and the interleaved re-time: CUDA events on a GPU (unless a clock is
    injected), a host clock between two synchronisations elsewhere. `flush` runs before each
    sample, outside the timed span (an L2 flush, so per-layer samples start from a cold cache).
    With `queue_ahead` (CUDA, per-layer timing) the GPU is held by a sleep kernel while the host
    enqueues the calls, so the sample is the device's time for the layer, as inside a model where
    the layers before it keep the queue full, not the host's launch latency.
    """

    def __init__(
        self,
        device: torch.device,
        clock: Clock | None = None,
        flush: Callable[[], None] | None = None,
        queue_ahead: bool = False,
    ) -> None:
        self.device = device
        self.use_events = device.type == "cuda" and clock is None
        self.clock = clock or time.perf_counter
        self.flush = flush
        self.queue_ahead = queue_ahead and self.use_events
        self.launch_ms = 0.0  # host time to enqueue one call (measured during warm-up)

    def __call__(self, fn: Callable[[], object], reps: int = 1) -> float:
        if self.flush is not None:
            self.flush()
        if self.use_events:
            ev0 = torch.cuda.Event(enable_timing=True)
            ev1 = torch.cuda.Event(enable_timing=True)
            if self.queue_ahead:
                _hold_gpu(self.device, 1.5 * reps * self.launch_ms + 0.02)
            ev0.record()
            for _ in range(reps):
                fn()
            ev1.record()
            ev1.synchronize()
            return ev0.elapsed_time(ev1) / reps
        synchronize(self.device)
        t = self.clock()
        for _ in range(reps):
            fn()
        synchronize(self.device)
        return (self.clock() - t) * 1e3 / reps


def sample_interleaved(
    steps: Sequence[Callable[[], object]],
    sampler: Sampler,
    *,
    reps: Sequence[int] | None = None,
    before: Sequence[Callable[[], None]] | None = None,
    warmup: int = 1,
    min_rounds: int = 5,
    max_rounds: int = 200,
    budget_s: float = 1.0,
) -> list[list[float]]:
    """Samples (ms per call) of several steps taken in rounds, one sample of each per round, in
    alternating order (A B C, C B A, ...), so drift and other load hit every step alike.

    `before[i]` runs before each call of step i outside the timed span (switch the global flags
    to that candidate's, clear gradients). Stops after `max_rounds`, or after `min_rounds` once
    `budget_s` per step is spent. The one interleaving sampler: the finalists' re-time and the
    benchmarks use it.
    """
    n = len(steps)
    reps = list(reps) if reps is not None else [1] * n
    prepare = list(before) if before is not None else [lambda: None] * n
    clock = sampler.clock
    launch_ms = []
    for step, prep in zip(steps, prepare, strict=True):
        t = 0.0
        for _ in range(max(1, warmup)):
            prep()
            t0 = clock()
            step()
            t += clock() - t0
        launch_ms.append(t * 1e3 / max(1, warmup))  # host time per call (queue_ahead)
    synchronize(sampler.device)
    samples: list[list[float]] = [[] for _ in steps]
    start = clock()
    rounds = 0
    while rounds < max_rounds:
        order = list(range(n)) if rounds % 2 == 0 else list(reversed(range(n)))
        for i in order:
            prepare[i]()
            sampler.launch_ms = launch_ms[i]
            samples[i].append(sampler(steps[i], reps[i]))
        rounds += 1
        if rounds >= min_rounds and clock() - start >= budget_s * n:
            break
    return samples


def _hold_gpu(device: torch.device, ms: float) -> None:
    """Keep the current stream busy for about `ms` (capped at 20 ms) with a spin kernel."""
    props = torch.cuda.get_device_properties(device)
    khz = getattr(props, "clock_rate", 0) or 1_500_000  # cycles per ms
    torch.cuda._sleep(int(min(ms, 20.0) * khz))


def measure(
    fn: Callable[[], object],
    device: torch.device,
    policy: TimingPolicy = TimingPolicy(),
    *,
    clock: Clock | None = None,
    flush: Callable[[], None] | None = None,
    queue_ahead: bool = False,
    race: Race | None = None,
    deadline: float | None = None,
) -> Measurement:
    """Time `fn` (one step). `clock` replaces the timer (tests); `flush` runs outside each sample;
    `queue_ahead` times device work only (see `Sampler`); `race` stops sampling a candidate that
    cannot win; `deadline` (on `clock`) stops sampling when the run's time budget is spent."""
    with device_guard(device):
        sampler = Sampler(device, clock, flush, queue_ahead)
        return _measure(fn, device, policy, sampler, race, deadline)


def _measure(
    fn: Callable[[], object],
    device: torch.device,
    policy: TimingPolicy,
    sampler: Sampler,
    race: Race | None = None,
    deadline: float | None = None,
) -> Measurement:
    clock = sampler.clock
    synchronize(device)
    t0 = clock()
    fn()
    synchronize(device)
    first_ms = (clock() - t0) * 1e3

    warm_start = clock()
    warm = 0
    launch_s = 0.0
    warm_ms: list[float] = []  # on a CPU, each warm-up run's own time (evidence for a race)
    while warm < policy.warmup_runs or clock() - warm_start < policy.warmup_s:
        t = clock()
        fn()
        launch_s += clock() - t  # on a GPU: the host's time to enqueue the step
        if device.type != "cuda":
            warm_ms.append((clock() - t) * 1e3)
        warm += 1
        if warm >= 1000 or (deadline is not None and clock() >= deadline):
            break  # past the budget: one warm-up run is all it gets
    synchronize(device)
    if warm:
        sampler.launch_ms = launch_s * 1e3 / warm
        reps = reps_for((clock() - warm_start) * 1e3 / warm, policy)
    else:
        reps = reps_for(first_ms, policy)

    samples: list[float] = []
    start = clock()
    stopped = None
    while True:
        samples.append(sampler(fn, reps))
        n = len(samples)
        if n >= policy.max_samples:
            break
        if race is not None and race.lost(samples, warm_ms[:2]):
            stopped = (
                f"stopped after {n} samples: slower than the best candidate's "
                f"{race.limit_ms:.3f} ms (sign test, p <= {race.alpha:g})"
            )
            break
        if deadline is not None and clock() >= deadline and n >= 3:
            stopped = f"stopped after {n} samples: the time budget ran out"
            if race is not None and _quantile(sorted(samples), 0.5) > race.limit_ms:
                stopped += f", slower than the best candidate's {race.limit_ms:.3f} ms"
            break
        if n >= policy.min_samples:
            s = sorted(samples)
            lo, hi = median_ci(s)
            med = _quantile(s, 0.5)
            if med > 0 and (hi - lo) / 2 / med <= policy.target_rel_ci:
                break
            if clock() - start >= policy.max_time_s:
                break
    return Measurement(
        samples_ms=samples, first_call_ms=first_ms, warmup_runs=warm, reps=reps, stopped=stopped
    )


def combine(measurements: list[Measurement], weights: list[float]) -> Measurement:
    """The weighted-sum step time over a shape set, as samples: sample j is the weighted sum of
    each shape's j-th sample (so the spread reflects every shape's noise)."""
    if len(measurements) == 1:
        return measurements[0]
    n = min(len(m.samples_ms) for m in measurements)
    samples = [
        sum(w * m.samples_ms[j] for m, w in zip(measurements, weights, strict=True))
        for j in range(n)
    ]
    first = [m.first_call_ms for m in measurements]
    return Measurement(
        samples_ms=samples,
        first_call_ms=None if None in first else sum(f or 0.0 for f in first),
        warmup_runs=min(m.warmup_runs for m in measurements),
        reps=min(m.reps for m in measurements),
    )
