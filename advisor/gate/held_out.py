"""The training check's look on held-out batches: what a precision's trained weights make of
batches of the task they never trained on, against fp32's: a validation set's judgement, for a
network that learns the check's four batches nearly to nothing (why: docs/numeric-gate.md,
"Held-out batches").

Where a precision ends outside both allowances on its training batches, the check also
evaluates, in fp32, on `batches` held-out batches of the same task (same teacher, new inputs):

- the precision's trained weights and fp32's (the **held-out gap**, over the held-out start);
- fp32 trained on the band's other batches (the **held-out band**: how far fp32's validation loss
  moves with the data it trained on, the run-to-run variation of the record);
- the precision is accepted there when its held-out gap is within `max_degradation` x what fp32
  learnt on the held-out batches, or `band_factor` x the held-out band;
- and only where that look can tell: fp32's held-out drop at least `held_signal` x that
  allowance, so a precision that learnt nothing would end far outside it. A model that does not
  generalise from four batches leaves its held-out loss where it started, and there any
  precision would pass: the look is then not taken.

A precision that cannot carry the model's signal (`tests/data/below_bf16.py`) still trails fp32
on held-out batches by far more than the allowance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from advisor.gate import training
from advisor.gate.reference_runs import Fp32Runs
from advisor.measure.candidate import Mode
from advisor.workload.build import Workload

__all__ = ["HeldOut", "held_out"]

# The held-out batches' seeds, apart from the task's (1000+) and the band's (5000+).
_FIRST_SEED = 9000


@dataclass(frozen=True)
class HeldOut:
    """The held-out look's numbers, each over the held-out start."""

    gap: float  # the precision's loss behind fp32's (negative: ahead)
    band: float  # fp32 trained on other batches, from fp32 (NaN: no band run)
    learnt: float  # fp32's drop from the held-out start
    allowance: float  # the gap accepted
    signal: float  # `held_signal`: fp32's drop must be this x the allowance

    @property
    def tells(self) -> bool:
        """Whether the look can tell a precision that learnt nothing from fp32."""
        return self.learnt >= self.signal * self.allowance > 0

    @property
    def accepts(self) -> bool:
        return self.tells and math.isfinite(self.gap) and self.gap <= self.allowance

    def numbers(self) -> dict[str, float]:
        """For the verdict's record (`PrecisionCheck.held_out`)."""
        return {"gap": self.gap, "band": self.band, "learnt": self.learnt,
                "allowance": self.allowance}  # fmt: skip

    def text(self) -> str:
        where = "behind" if self.gap >= 0 else "ahead"
        band = "not run" if math.isnan(self.band) else f"{self.band:.2%}"
        return (
            f"on held-out batches of the task it ends {abs(self.gap):.2%} of their start {where} "
            f"(fp32 learnt {self.learnt:.1%} there; fp32 trained on other batches ends "
            f"{band} away; allowance {self.allowance:.2%})"
        )


def held_out(
    workload: Workload,
    device: torch.device,
    mode: Mode,
    fp32: Fp32Runs,
    precision: training.Weights,
    seed: int = 0,
) -> HeldOut | None:
    """The held-out look for a precision's trained weights against `fp32`'s runs at the rate
    kept, or None where fp32's reference weights were not kept."""
    ref = fp32.weights.get("fp32")
    if ref is None:
        return None
    cfg = fp32.cfg
    batches = training.batches_of(workload, cfg.batches, _FIRST_SEED + 100 * seed)
    targets = training.targets_of(workload, batches, device, mode, cfg, seed)
    start = max(abs(training.start_loss(workload, device, batches, targets)), 1e-12)

    def loss(weights: training.Weights) -> float:
        return training.judged_weights(workload, weights, device, batches, targets) / start

    fp32_end = loss(ref)
    others = [loss(w) for name, w in fp32.weights.items() if name.startswith("fp32 other")]
    band = max((abs(o - fp32_end) for o in others), default=math.nan)
    gap = loss(precision) - fp32_end
    learnt = max(0.0, 1.0 - fp32_end)
    allowance = max(cfg.max_degradation * learnt,
                    cfg.band_factor * band if math.isfinite(band) else 0.0)  # fmt: skip
    return HeldOut(gap if math.isfinite(gap) else math.inf, band, learnt, allowance,
                   cfg.held_signal)  # fmt: skip
