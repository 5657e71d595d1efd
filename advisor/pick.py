"""Choosing the recommendation from measured candidates: fastest, unless within noise of simpler."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from advisor.runner import TrialResult
from advisor.timing import clearly_faster


@dataclass(frozen=True)
class Pick:
    chosen: TrialResult
    fastest: TrialResult
    why: str


def complexity(result: TrialResult) -> int:
    """How many knobs differ from PyTorch's default (per-layer choices count once)."""
    return len(result.settings.changes())


def pick_best(
    results: Sequence[TrialResult], baseline: TrialResult, min_gain: float = 0.02
) -> Pick:
    """The fastest accepted candidate, except that one within measurement noise of a simpler one
    (fewer changes from default) loses to it. The baseline wins when nothing beats it beyond noise.

    "Beyond noise" means significantly faster (Mann-Whitney U, p < 0.05) by at least `min_gain`.
    """
    accepted = [r for r in results if r.status == "ok" and r.measurement is not None]
    if baseline.status != "ok" or baseline.measurement is None:
        raise ValueError("the baseline (PyTorch's default) has no valid measurement")
    if baseline not in accepted:
        accepted.append(baseline)
    fastest = min(accepted, key=lambda r: r.median_ms)
    assert fastest.measurement is not None
    ties = [
        r
        for r in accepted
        if r.measurement and not clearly_faster(fastest.measurement, r.measurement, min_gain)
    ]
    chosen = min(ties, key=lambda r: (complexity(r), r.median_ms))
    if chosen is fastest:
        if fastest.settings == baseline.settings:
            why = "PyTorch's default is the fastest accepted configuration"
        else:
            ratio = baseline.median_ms / fastest.median_ms
            why = (
                f"fastest accepted candidate ({fastest.settings.label()}), "
                f"{ratio:.2f}x the default's speed"
            )
            if len(ties) > 1:
                why += f"; {len(ties) - 1} other(s) within noise need more changes"
    elif chosen.settings == baseline.settings:
        why = (
            f"the fastest candidate ({fastest.settings.label()}, {fastest.median_ms:.3f} ms) is "
            f"within measurement noise of PyTorch's default ({chosen.median_ms:.3f} ms): "
            "keeping the default"
        )
    else:
        why = (
            f"{chosen.settings.label()} is within measurement noise of the fastest "
            f"({fastest.settings.label()}, {fastest.median_ms:.3f} ms vs {chosen.median_ms:.3f} ms) "
            f"with fewer changes from the default"
        )
    return Pick(chosen, fastest, why)
