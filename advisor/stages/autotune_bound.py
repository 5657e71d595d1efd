"""Which layer groups try an implementation that autotunes (Triton): only where its autotuning
can pay.

A Triton conv autotunes at its first call on each new shape: it compiles and times each of its
configurations for the forward, the input gradient and the weight gradient. That is a cost the
per-layer stage pays per group, and the user's training pays again at its start. Whatever the
kernel, a group cannot save more per step than its native time (the layer's time times the
layers that share it). So once a group's autotuning has been measured (its first call less
native's), a later group whose native time over the advice's horizon (`--steps`, else
`contest.HORIZON_STEPS`) is below that cost is not tried: its autotuning could not pay
back even if the kernel took no time. The first group measured sets the cost; the smallest
measured so far is kept, so a cost that shrinks as kernels are cached tries more, never fewer.
A group that is tried has that native time over the horizon as its allowance: its autotuning is
stopped there (`advisor.allowance`), in whichever thread runs it.
"""

from __future__ import annotations

from dataclasses import dataclass

from advisor import impls
from advisor.measure.contest import Contest
from advisor.measure.results import TrialResult

__all__ = ["AutotuneBound"]


def _first_call_ms(r: TrialResult) -> float | None:
    return r.measurement.first_call_ms if r.measurement is not None else None


@dataclass
class AutotuneBound:
    """The autotuning cost measured so far in one per-layer stage, and the horizon it must pay
    back within."""

    contest: Contest  # its horizon
    cost_ms: float | None = None  # the smallest first call over native's measured so far

    def why_not(self, impl: str, native: TrialResult | None, layers: int) -> str | None:
        """Why `impl` is not tried on a group of `layers` layers whose native result is
        `native`, or None."""
        if not impls.get_impl(impl).autotunes or self.cost_ms is None:
            return None
        if native is None or native.status != "ok" or native.measurement is None:
            return None
        if not self.contest.autotune_cannot_pay(self.cost_ms, native.median_ms, layers):
            return None
        return (
            f"its autotuning ({self.cost_ms / 1e3:.1f} s, measured on an earlier layer) cannot "
            f"pay back within {self.contest.horizon_steps:,} steps: native takes "
            f"{native.median_ms * layers:.3f} ms a step here, the most it could save"
        )

    def allowance_s(self, impl: str, native: TrialResult | None, layers: int) -> float | None:
        """How long `impl`'s first call may autotune on that group before it is stopped: what
        the group's native time repays over the horizon (None: it does not autotune, or native
        has no time to repay with)."""
        if not impls.get_impl(impl).autotunes or native is None or native.status != "ok":
            return None
        return self.contest.autotune_allowance_s(native.median_ms, layers)

    def measured(self, impl: str, result: TrialResult, native: TrialResult | None) -> None:
        """Learn the cost from a measured autotuning trial."""
        if not impls.get_impl(impl).autotunes or native is None:
            return
        first, base = _first_call_ms(result), _first_call_ms(native)
        if first is None:
            return
        cost = max(0.0, first - (base or 0.0))
        self.cost_ms = cost if self.cost_ms is None else min(self.cost_ms, cost)
