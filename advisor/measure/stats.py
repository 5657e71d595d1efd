"""The statistics of timing samples: a measurement with its median and confidence interval, the
tests that decide "faster beyond noise", the speedup interval, and the race rule that stops a
candidate that cannot win. Pure Python on lists of milliseconds (no torch), so exact to test."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, computed_field

from advisor.measure.stop import Sampling

__all__ = [
    "STRICT_Z",
    "Measurement",
    "Race",
    "clearly_faster",
    "combine",
    "mann_whitney_p",
    "median_ci",
    "quantile",
    "sign_test_p",
    "paired_speedup",
    "speedup",
]


# The z of an interval looked at after every round to stop as soon as it decides (a sequential
# rule), instead of 1.96 for one looked at once: each look is a chance to decide wrongly, and
# group-sequential designs keep 5% over 5-10 looks with 2.4-2.6 (Pocock). At 3 (99.7% at one
# look) the order-statistic interval of 7 paired ratios is their whole range: a change is
# decided in 7 rounds only when all 7 agree (1 in 128 by chance for a true median at 1.0).
STRICT_Z = 3.0
ALPHA = 0.05  # the race's sign test: how often it may stop a candidate that could win
RACE_MIN_SAMPLES = 5  # samples (warm-up runs counted) before the sign test can stop one


def median_ci(sorted_samples: list[float], z: float = 1.96) -> tuple[float, float]:
    """Distribution-free confidence interval for the median, from order statistics."""
    n = len(sorted_samples)
    if n == 0:
        return (math.nan, math.nan)
    half = z * math.sqrt(n) / 2
    lo = max(0, math.floor(n / 2 - half))
    hi = min(n - 1, math.ceil(n / 2 + half) - 1)
    return sorted_samples[lo], sorted_samples[max(lo, hi)]


def quantile(sorted_samples: list[float], q: float) -> float:
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
    stop: Sampling | None = None  # why sampling stopped before the policy's rule did
    # Wall time of the warm-up after the first call, and of the sampling with its untimed calls
    # (a trial's harness, where the trials file shows it; None where not taken by `measure`)
    warmup_s: float | None = None
    sampling_s: float | None = None

    @property
    def _sorted(self) -> list[float]:
        return sorted(self.samples_ms)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def median_ms(self) -> float:
        return quantile(self._sorted, 0.5) if self.samples_ms else math.nan

    @computed_field  # type: ignore[prop-decorator]
    @property
    def iqr_ms(self) -> float:
        s = self._sorted
        return quantile(s, 0.75) - quantile(s, 0.25) if s else math.nan

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ci_low_ms(self) -> float:
        return median_ci(self._sorted)[0]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ci_high_ms(self) -> float:
        return median_ci(self._sorted)[1]


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


def paired_speedup(
    baseline: Measurement, tuned: Measurement, z: float = 1.96
) -> tuple[float, float, float]:
    """For samples taken in the same rounds of one interleaved re-time (sample i of each in
    round i, `timing.interleave`): the median of the per-round ratios baseline_i /
    tuned_i, with its order-statistic 95% CI. Drift that hits a whole round (other load, clock
    changes, a process that is slower throughout) cancels in that round's ratio, so a steady 6%
    win is decided where the unpaired interval, built from the two CIs' opposite ends, spans 1.0x.
    Raises ValueError when the samples cannot be paired."""
    b, t = baseline.samples_ms, tuned.samples_ms
    if len(b) != len(t) or len(b) < 5 or min(t) <= 0:
        raise ValueError("paired samples need equal counts of at least 5, all positive")
    ratios = sorted(x / y for x, y in zip(b, t, strict=True))
    lo, hi = median_ci(ratios, z)
    return statistics.median(ratios), lo, hi


def speedup(baseline: Measurement, tuned: Measurement) -> tuple[float, float, float]:
    """Baseline/tuned medians, with a conservative interval from the two CIs."""
    return (
        baseline.median_ms / tuned.median_ms,
        baseline.ci_low_ms / tuned.ci_high_ms,
        baseline.ci_high_ms / tuned.ci_low_ms,
    )


@dataclass(frozen=True)
class Race:
    """What a candidate's measurement is held to, made by `advisor.measure.contest.Contest`.

    `limit_ms`: its samples stop once a one-sided sign test at `ALPHA` says its median is above
    it. If the true median were at or below the limit, each steady-state sample would exceed it
    with probability at most 1/2, so k or more of n samples above it happen with probability at
    most P(Bin(n, 1/2) >= k): stopping is wrong at most 5% of the time. With every sample above
    the limit that takes 5 samples. The first call never counts, nor the run after it (it can
    still pay one-time costs); on a CPU each of the next two warm-up runs over twice the limit
    counts as one more sample above it.

    `bar_ms`: measured in full with its interval's low end above it, it cannot be picked: its
    gate is not paid. `screen`: take this many samples after the warm-up and stop, ungated.
    `rival` (settings JSON) and `horizon_steps`: a compiled candidate is timed beside its
    rival and stopped where its cold compile cannot pay back within the horizon;
    `allowance_s`: its first call (a cold compile, autotuning) is stopped once it has run this
    long (what it could repay within the horizon at the largest gain the rule allows).
    """

    limit_ms: float
    bar_ms: float | None = None
    screen: int | None = None
    rival: str | None = None
    horizon_steps: int | None = None
    allowance_s: float | None = None  # the longest first call that could still pay back

    def screened_out(self, samples: Sequence[float]) -> bool:
        """A screen whose median is already known to lie above the limit (`SCREEN_DROP` times the
        fastest screen so far): its samples' median is above it, and so are most of the `screen`
        samples it would have (warm-up runs past twice the limit decide too: `timing.measure`)."""
        if self.screen is None or not samples or not math.isfinite(self.limit_ms):
            return False
        if quantile(sorted(samples), 0.5) <= self.limit_ms:
            return False
        return sum(s > self.limit_ms for s in samples) > self.screen // 2

    def lost(self, samples: Sequence[float], warmups: Sequence[float] = ()) -> bool:
        counted = [w for w in warmups if w > 2 * self.limit_ms]
        n = len(samples) + len(counted)
        if n < RACE_MIN_SAMPLES or len(samples) < 3:
            return False
        above = sum(s > self.limit_ms for s in samples) + len(counted)
        return sign_test_p(n, above) <= ALPHA


def sign_test_p(n: int, k: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2): the one-sided sign test's p-value."""
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n


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
