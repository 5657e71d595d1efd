"""The one rule for "can this candidate still win?".

Every stage asks it before it spends on a candidate (its samples, its gate, its compile, its
re-time) and again after: given the leader (the fastest accepted candidate) and the horizon (the
training steps a one-off cost must pay back within, `--steps`), a candidate is still in, or it is
out with a `Stop` (a kind and the figures it was decided on). The margins that differ on purpose
are the rule's parameters:

- `min_gain`: a change is recommended only when faster by this much beyond noise, so a
  candidate whose whole interval lies above the leader's by more than it cannot be picked (the
  *bar*: the leader's CI high end times 1 + `min_gain`);
- `race_margin`: sampling stops a candidate only above the bar times this (a candidate's first
  samples after its warm-up can be this much slower than its steady state);
- `screen_drop`: a screen of a few samples drops a candidate above this times the fastest screen
  (TunableOp's 1.5x);
- `compile_max_gain`: the most a compile is assumed to speed up its eager twin, so the most a
  compile can save a step;
- `horizon_steps`: a one-off cost (a cold compile, cuDNN's search, Triton's autotuning) counts
  only where it pays back within this many steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from advisor.measure.results import TrialResult
from advisor.measure.stats import STRICT_Z, Measurement, Race, median_ci, paired_speedup
from advisor.measure.stop import Stop

__all__ = ["HORIZON_STEPS", "SCREEN_DROP", "SCREEN_SAMPLES", "Contest", "break_even"]

# The steps a one-off cost must pay back within when the user does not say (--steps): a short
# fine-tuning run.
HORIZON_STEPS = 10_000
SCREEN_SAMPLES = 3  # a screen's samples after its warm-up
SCREEN_DROP = 1.5  # TunableOp's first stage drops candidates above 1.5x the best so far


def break_even(overhead_s: float, saving_ms: float) -> float:
    """Steps until a one-off `overhead_s` is paid back at `saving_ms` a step (inf: never)."""
    if saving_ms <= 0 or math.isinf(overhead_s):
        return math.inf
    return math.ceil(max(0.0, overhead_s) * 1e3 / saving_ms)


@dataclass(frozen=True)
class Contest:
    """The rule and its parameters (see the module's docstring)."""

    min_gain: float = 0.02
    race_margin: float = 1.5
    screen_drop: float = SCREEN_DROP
    compile_max_gain: float | None = None
    steps: int | None = None  # the training steps the advice is for (--steps)
    racing: bool = True  # false: every candidate measured and gated in full

    @property
    def horizon_steps(self) -> int:
        """The steps a one-off cost must pay back within: the user's, or `HORIZON_STEPS`."""
        return self.steps if self.steps is not None else HORIZON_STEPS

    # ---- the bar: below it a candidate could be picked over the leader ----------------------

    def bar_ms(self, leader: Measurement) -> float:
        return leader.ci_high_ms * (1 + self.min_gain)

    def could_win(self, m: Measurement, leader: Measurement) -> bool:
        """Whether `m`, measured in full, reaches below the bar of `leader` (wholly above it,
        it is not gated: the gate's checks are paid only for a candidate that could be picked)."""
        return m.ci_low_ms <= self.bar_ms(leader)

    # ---- measuring: the race a candidate's samples run ----------------------------------------

    def race(
        self,
        leader: Measurement | None,
        bar_of: Measurement | None = None,
        rival: str | None = None,
        pays: bool = False,
        allowance_s: float | None = None,
    ) -> Race | None:
        """The race against `leader` (None: no race): its samples stop beyond the bar times
        `race_margin`; measured in full above the bar of `bar_of` (default: the leader) it is
        not gated. `rival` (settings JSON) with `pays`: a compiled candidate is timed beside
        it, and stops where its cold compile cannot pay back within the horizon, or once the
        compile has run longer than the most it could repay (`compile_allowance_s`).
        `allowance_s` alone: the candidate's first call (autotuning) stops once it has run
        that long (`autotune_allowance_s`)."""
        if not self.racing or leader is None:
            return None
        bar = self.bar_ms(bar_of if bar_of is not None else leader)
        if pays:
            allowance_s = self.compile_allowance_s(leader.median_ms)
        return Race(
            self.bar_ms(leader) * self.race_margin,
            bar_ms=bar,
            rival=rival,
            horizon_steps=self.horizon_steps if pays or allowance_s is not None else None,
            allowance_s=allowance_s,
        )

    def screen(self, fastest_ms: float) -> Race:
        """A screen's race: `SCREEN_SAMPLES` samples, stopped early above the drop line."""
        return Race(self.screen_drop * fastest_ms, screen=SCREEN_SAMPLES)

    def screened_out(self, screen_ms: float, fastest_ms: float) -> bool:
        return screen_ms > self.screen_drop * fastest_ms

    # ---- re-timing: the finalists ---------------------------------------------------------------

    def finalists(
        self, results: Sequence[TrialResult], baseline: TrialResult, top: int
    ) -> list[TrialResult]:
        """The `top` fastest accepted (or pending) candidates that could still win, plus the
        baseline; where a compiled one is among them, the fastest eager one too (its bill's
        alternative, timed in the same rounds)."""
        ok = sorted(
            (r for r in results if r.status == "ok" and r.measurement is not None),
            key=lambda r: r.median_ms,
        )
        if not ok:
            return [baseline]
        lead = ok[0].measurement
        chosen = [r for r in ok if self.could_win(r.measurement, lead)][:top]  # type: ignore[arg-type]
        eager = next((r for r in ok if not r.settings.compiled), None)
        if any(r.settings.compiled for r in chosen) and eager is not None and eager not in chosen:
            chosen.append(eager)
        if all(r.settings != baseline.settings for r in chosen):
            chosen.append(baseline)
        return chosen

    def beyond_noise(self, speedup: tuple[float, float, float]) -> bool:
        """A speedup (ratio, low, high) whose whole interval clears `min_gain`."""
        return speedup[1] > 1 + self.min_gain

    # ---- one-off costs: compiles, cuDNN's search, autotuning ----------------------------------

    def pays(self, overhead_s: float, saving_ms: float) -> bool:
        """Whether a one-off `overhead_s` pays back within the horizon at `saving_ms` a step."""
        return break_even(overhead_s, saving_ms) <= self.horizon_steps

    def compile_out_of_reach(self, eager: Measurement, leader: Measurement) -> bool:
        """Whether compiling settings of eager time `eager` could not beat `leader` even at
        `compile_max_gain`."""
        if self.compile_max_gain is None:
            return False
        return eager.ci_low_ms > self.compile_max_gain * leader.ci_high_ms

    def compile_allowance_s(self, rival_ms: float) -> float | None:
        """The longest cold compile that could still pay back within the horizon against a
        rival of `rival_ms` a step, at the largest gain the rule allows (`compile_max_gain`);
        None where no gain bound is set."""
        if self.compile_max_gain is None:
            return None
        most_ms = rival_ms * (1 - 1 / self.compile_max_gain)
        return most_ms * self.horizon_steps / 1e3

    def payback(
        self,
        compiled: Measurement,
        rival: Measurement,
        cold_s: float,
        rival_first_s: float,
        rival_label: str,
    ) -> Stop | None:
        """Out where a compiled candidate, timed beside its `rival` interleaved, cannot pay its
        cold compile back even at the favourable ends of both intervals."""
        saving_ms = rival.ci_high_ms - compiled.ci_low_ms
        if self.pays(max(0.0, cold_s - rival_first_s), saving_ms):
            return None
        return Stop(
            kind="cannot_pay",
            horizon_steps=self.horizon_steps,
            rival=rival_label,
            ms=compiled.median_ms,
            rival_ms=rival.median_ms,
            saving_ms=saving_ms,
            cold_s=cold_s,
        )

    def payback_decided(self, overhead_s: float, samples: list[list[float]]) -> bool:
        """For interleaved rounds of (compiled, rival): whether they already show, at
        `STRICT_Z`, that the compile cannot pay back (the 95% intervals lie inside)."""
        compiled, rival = (sorted(s) for s in samples)
        saving_ms = median_ci(rival, STRICT_Z)[1] - median_ci(compiled, STRICT_Z)[0]
        return not self.pays(overhead_s, saving_ms)

    def autotune_allowance_s(self, native_ms: float, layers: int) -> float:
        """The longest autotuning that could still pay back within the horizon on a group whose
        native step share is `native_ms` x `layers`, the most any kernel could save it."""
        return native_ms * layers * self.horizon_steps / 1e3

    def autotune_cannot_pay(self, cost_ms: float, native_ms: float, layers: int) -> bool:
        """Whether autotuning that costs `cost_ms` cannot pay back on that group."""
        return cost_ms / 1e3 > self.autotune_allowance_s(native_ms, layers)

    # ---- the pick's noise rule ------------------------------------------------------------------

    def paired_beats(self, slow: Measurement, fast: Measurement) -> bool:
        ratio, lo, _ = paired_speedup(slow, fast)
        return lo > 1.0 and ratio >= 1 + self.min_gain
