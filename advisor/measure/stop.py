"""Why a measured candidate is out of the pick: a kind and its figures.

Control flow reads the kind; the sentence a person reads is made from the figures
(`Stop.text`), and nothing branches on that sentence (optuna's habit: a trial's fate is a state,
its reason an attribute).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

__all__ = ["Sampling", "Stop", "StopKind"]

# Why sampling ended before the timing policy's rule did (`Measurement.stop`): the race's sign
# test, a screen's few samples, a screen's runs stopped at twice its drop line, the run's time
# budget, or the budget spent by the first call.
Sampling = Literal["raced", "screened", "cut", "budget", "first_call"]

StopKind = Literal[
    "raced",  # its samples are above the race's limit (a sign test): slower than the leader
    "screened",  # its screen was above the screen's drop line: not timed in full
    "budget",  # the run's time budget ran out before it was measured in full
    "cannot_pay",  # a one-off (cold compile, autotuning) that cannot pay back in the horizon
    "out_of_time",  # the budget ran out during its precision's training check
]


class Stop(BaseModel):
    """Why a candidate stopped short of the pick, with the figures the decision read."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: StopKind
    ms: float | None = None  # the candidate's own figure: its CI low end, or its screen median
    bar_ms: float | None = None  # what it was measured against: the race limit or the pick's bar
    samples: int | None = None  # the samples it had when it stopped
    # screened: the fastest screen's figures and the drop factor
    best_label: str | None = None
    drop: float | None = None
    cut: bool = False  # its runs past twice the drop line decided: `ms` is a lower bound
    # cannot_pay: the horizon, the rival it was timed beside and what the bound read
    horizon_steps: int | None = None
    rival: str | None = None
    rival_ms: float | None = None
    saving_ms: float | None = None
    cold_s: float | None = None  # cannot_pay, budget: its first call (a cold compile)
    one_off: Literal["cold compile", "autotuning"] = "cold compile"  # cannot_pay: what it paid

    def holds_at(self, steps: int | None) -> bool:
        """Whether this stop stands for a run whose horizon is `steps` (None: not known): a
        payback verdict is its own horizon's, any other stop any run's."""
        return self.kind != "cannot_pay" or (steps is not None and self.horizon_steps == steps)

    def text(self) -> str:
        """The sentence a person reads."""
        k = self.kind
        if k == "raced":
            return (
                f"stopped after {self.samples} samples: slower than the best candidate's "
                f"{self.bar_ms:.3f} ms (sign test)"
            )
        if k == "screened":
            n = self.samples or 0
            took = f"{n} sample{'s' if n != 1 else ''} after warm-up gave {self.ms:.3f} ms"
            if self.cut:
                took = f"{n} runs in a row past twice the drop line ({self.ms:.3f} ms or more)"
            if self.ms is None or self.bar_ms is None or self.drop is None:
                return f"screened: {took}"
            return (
                f"screened out: {took}, {self.ms / self.bar_ms:.2f}x the fastest screen "
                f"({self.best_label}, {self.bar_ms:.3f} ms), above {self.drop:g}x: not timed "
                "in full"
            )
        if k == "budget" and self.cold_s is not None:
            return (
                f"stopped after its first call ({self.cold_s:.2f} s, compilation and "
                "autotuning included): the time budget ran out"
            )
        if k == "budget":
            return "stopped: the time budget ran out before it was measured in full"
        if k == "cannot_pay":
            if self.rival is None:  # stopped during its first call, before any sample
                doing = "compiling" if self.one_off == "cold compile" else self.one_off
                return (
                    f"its {self.one_off} cannot pay back within {self.horizon_steps:,} steps: "
                    f"stopped after {self.cold_s:.1f} s of {doing}, more than it could save "
                    f"at most ({self.saving_ms:.3f} ms a step) over {self.horizon_steps:,} steps"
                )
            saving = self.saving_ms or 0.0
            most = (
                f"it saves at most {saving:.3f} ms a step"
                if saving > 0
                else "it saves nothing per step"
            )
            return (
                f"its cold compile cannot pay back within {self.horizon_steps:,} steps: timed "
                f"beside {self.rival} in one process, interleaved ({self.ms:.3f} vs "
                f"{self.rival_ms:.3f} ms), {most}, and it took {self.cold_s:.1f} s with empty "
                "caches; not checked further"
            )
        return "the budget ran out during its precision check"  # out_of_time
