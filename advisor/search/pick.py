"""Choosing the recommendation from measured candidates: fastest, unless within noise of simpler."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from advisor.measure.results import TrialResult
from advisor.measure.stats import clearly_faster, paired_speedup, speedup


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

    "Beyond noise" means faster by at least `min_gain` with a speedup interval over the
    baseline that lies above 1.0x: a change that might be no faster than PyTorch's default is
    never recommended. Candidates re-timed together are compared round by round (the median of
    per-round ratios and its 95% CI); others by Mann-Whitney U (p < 0.05) and an interval from
    both medians' 95% CIs."""
    accepted = [r for r in results if r.status == "ok" and r.measurement is not None]
    if baseline.status != "ok" or baseline.measurement is None:
        raise ValueError("the baseline (PyTorch's default) has no valid measurement")
    if all(r is not baseline for r in accepted):
        accepted.append(baseline)
    unsure = [r for r in accepted if r is not baseline and speedup_over(baseline, r)[1] <= 1.0]
    eligible = [r for r in accepted if all(r is not u for u in unsure)]
    fastest = min(eligible, key=lambda r: r.median_ms)
    assert fastest.measurement is not None
    ties = [r for r in eligible if r.measurement and not beats(fastest, r, min_gain)]
    chosen = min(ties, key=lambda r: (complexity(r), r.median_ms))
    if chosen is fastest:
        if fastest.settings == baseline.settings:
            why = "PyTorch's default is the fastest accepted configuration"
        else:
            ratio = speedup_over(baseline, fastest)[0]
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
    faster_unsure = [r for r in unsure if r.median_ms < chosen.median_ms]
    if faster_unsure:
        best = min(faster_unsure, key=lambda r: r.median_ms)
        ratio, lo, hi = speedup_over(baseline, best)
        why += (
            f"; {best.settings.label()} measured {ratio:.2f}x [{lo:.2f}, {hi:.2f}] the default's "
            "speed, an interval that includes 1.0x: not recommended"
        )
        if len(faster_unsure) > 1:
            why += f" (nor {len(faster_unsure) - 1} other(s) like it)"
    return Pick(chosen, fastest, why)


def pick_final(
    results: Sequence[TrialResult], baseline: TrialResult, min_gain: float = 0.02
) -> Pick:
    """The recommendation. After an interleaved re-time, only the re-timed finalists compete:
    their samples were taken by one clock in one time window, the trials' were not."""
    retimed = [r for r in results if r.retimed]
    if baseline.retimed and len(retimed) > 1:
        return pick_best(retimed, baseline, min_gain)
    return pick_best(results, baseline, min_gain)


def paired(a: TrialResult, b: TrialResult) -> bool:
    """Both were measured in the same interleaved re-time (an outcome keeps only the latest
    re-time's results marked `retimed`), so their samples pair up round by round."""
    if not (a.retimed and b.retimed) or a.measurement is None or b.measurement is None:
        return False
    n = len(a.measurement.samples_ms)
    return n >= 5 and n == len(b.measurement.samples_ms)


def speedup_over(baseline: TrialResult, r: TrialResult) -> tuple[float, float, float]:
    """`r`'s speedup over `baseline` with its 95% interval: paired by round when both come from
    one interleaved re-time (`stats.paired_speedup`), else from the two medians' CIs."""
    assert r.measurement is not None and baseline.measurement is not None
    if paired(baseline, r):
        return paired_speedup(baseline.measurement, r.measurement)
    return speedup(baseline.measurement, r.measurement)


def beats(fast: TrialResult, slow: TrialResult, min_gain: float = 0.02) -> bool:
    """`fast` beats `slow` beyond noise, by at least `min_gain`: paired by round when both come
    from one interleaved re-time (interval above 1.0x), else a Mann-Whitney test."""
    assert fast.measurement is not None and slow.measurement is not None
    if paired(fast, slow):
        ratio, lo, _ = paired_speedup(slow.measurement, fast.measurement)
        return lo > 1.0 and ratio >= 1 + min_gain
    return clearly_faster(fast.measurement, slow.measurement, min_gain)


def pareto_front(results: list[TrialResult]) -> list[TrialResult]:
    """Accepted results that no other accepted result beats in both time and peak memory."""
    ok = [r for r in results if r.status == "ok" and r.measurement is not None]

    def point(r: TrialResult) -> tuple[float, float]:
        return r.median_ms, float(r.peak_memory_mb or 0.0)

    def dominates(a: TrialResult, b: TrialResult) -> bool:
        (ta, ma), (tb, mb) = point(a), point(b)
        return ta <= tb and ma <= mb and (ta < tb or ma < mb)

    return [r for r in ok if not any(dominates(o, r) for o in ok if o is not r)]


def pick_for_steps(
    results: Sequence[TrialResult],
    baseline: TrialResult,
    min_gain: float = 0.02,
    steps: int | None = None,
) -> tuple[Pick, TrialResult]:
    """The recommendation, with one-off costs counted: a compiled or cudnn.benchmark candidate
    competes only if its cold compile or cuDNN's search pays within the training `steps`
    expected (or the default horizon) against its alternative (`compile_bill.paying`). Returns
    the pick and the eager pick (the alternative a compile is billed against)."""
    from advisor.search.compile_bill import horizon_text, one_off, one_off_text, paying

    eager = pick_final([r for r in results if not r.settings.compiled], baseline, min_gain)
    plain = pick_final([r for r in results if not one_off(r.settings)], baseline, min_gain)
    kept, costly = paying(results, eager.chosen, steps, plain.chosen)
    pick = pick_final(kept, baseline, min_gain)
    faster = [(r, b) for r, b in costly if r.median_ms < pick.chosen.median_ms]
    if faster:
        r, b = min(faster, key=lambda rb: rb[0].median_ms)
        why = (
            f"{pick.why}; {r.settings.label()} is {b.saving_ms:.3f} ms faster per step, but "
            f"{one_off_text(r, b)} pays only after about {b.steps:,.0f} steps, more than "
            f"{horizon_text(steps)}"
        )
        pick = Pick(pick.chosen, pick.fastest, why)
    return pick, eager.chosen
