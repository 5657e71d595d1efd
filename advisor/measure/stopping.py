"""How long a measurement takes (`TimingPolicy`, set by search-space files), when its sampling
stops (`timing.measure`), and how many samples a GPU batch takes.

The rules, looked at after every sample: the policy's (`max_samples`; from `min_samples`, the
median's interval within `target_rel_ci`, or `max_time_s` spent), a screen's, the race's sign
test and the run's time budget.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from advisor.measure.stats import Race, median_ci, quantile
from advisor.measure.stop import Sampling

__all__ = ["BATCH_MS", "MAX_BATCH", "TimingPolicy", "batch_size", "enough"]


@dataclass(frozen=True)
class TimingPolicy:
    """How long to measure: the warm-up, and the policy's rule for sampling (`enough`)."""

    warmup_runs: int = 2
    warmup_s: float = 0.05
    min_samples: int = 7
    max_samples: int = 200
    target_rel_ci: float = 0.02
    max_time_s: float = 1.5
    min_sample_ms: float = 0.0  # a shorter step is repeated back to back within one sample
    max_reps: int = 100


# A batch of samples on a GPU spans about this long: short enough that the race and the
# policy's rule, judged per sample, waste little past the sample that stops them
BATCH_MS = 100.0
MAX_BATCH = 16


def batch_size(samples: list[float], reps: int) -> int:
    """One sample first, then as many as fill `BATCH_MS` at the median so far."""
    if not samples:
        return 1
    per_sample_ms = quantile(sorted(samples), 0.5) * reps
    return max(1, min(MAX_BATCH, int(BATCH_MS / max(per_sample_ms, 1e-3))))


def enough(
    samples: list[float],
    policy: TimingPolicy,
    race: Race | None,
    warm_ms: list[float],
    deadline: float | None,
    clock: Callable[[], float],
    start: float,
) -> tuple[bool, Sampling | None]:
    """Whether sampling stops after the last sample, and why where it is not the policy's
    rule (the race, the screen, the budget)."""
    n = len(samples)
    if n >= policy.max_samples:
        return True, None
    if race is not None and race.screen is not None and (
        n >= race.screen or race.screened_out(samples)
    ):
        return True, "screened"
    if race is not None and race.lost(samples, warm_ms[1:3]):  # not the run after the first call
        return True, "raced"
    if deadline is not None and clock() >= deadline and n >= 3:
        return True, "budget"
    if n >= policy.min_samples:
        s = sorted(samples)
        lo, hi = median_ci(s)
        med = quantile(s, 0.5)
        if med > 0 and (hi - lo) / 2 / med <= policy.target_rel_ci:
            return True, None
        if clock() - start >= policy.max_time_s:
            return True, None
    return False, None
