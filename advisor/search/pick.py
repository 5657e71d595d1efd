"""The pick: a pure function of what was measured and the rule (`Contest`).

`decide` is called by every stage that needs the recommendation; nothing keeps a pick of its
own. Its `why` says in one sentence what was picked and which measurement decided it; `path`
holds the rest of the way there (ties, intervals that include 1.0x, one-off costs that do not
pay, what the final check found), for the report and the trials file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from advisor.measure.contest import Contest
from advisor.measure.results import TrialResult
from advisor.measure.stats import clearly_faster, paired_speedup, speedup

__all__ = [
    "Kept",
    "Pick",
    "beats",
    "beyond_noise",
    "challenger",
    "check_subjects",
    "choose",
    "decide",
    "family",
    "measured_in",
    "paired",
    "pareto_front",
    "runner_up",
    "speedup_over",
]

# Why PyTorch's default was kept over a pick: a step that must vouch for a change did not (the
# re-time or the final check failed), the machine moved under the measurements, the pick did
# not hold in the final check, or (the run ended first) the pick was never gated.
Kept = Literal["retime_failed", "unsteady", "check_failed", "did_not_hold", "ungated"]


@dataclass(frozen=True)
class Pick:
    chosen: TrialResult
    fastest: TrialResult
    why: str  # one sentence: what was picked, and the measurement that decided it
    path: tuple[str, ...] = ()  # how the pick got there, a sentence a step
    eager: TrialResult | None = None  # the eager pick: what a one-off cost is billed against
    kept: Kept | None = None  # where the default was kept over a pick, why

    def text(self) -> str:
        """The why and its path, for a reader who wants all of it."""
        return "; ".join((self.why, *self.path))


def paired(a: TrialResult, b: TrialResult) -> bool:
    """Both were measured in the same interleaved re-time, so their samples pair up round by
    round."""
    if not (a.retimed and b.retimed) or a.measurement is None or b.measurement is None:
        return False
    n = len(a.measurement.samples_ms)
    return n >= 5 and n == len(b.measurement.samples_ms)


def measured_in(baseline: TrialResult, r: TrialResult) -> str:
    """Which measurement compares `r` with the default: the re-time's rounds, or the search's."""
    return "the interleaved re-time" if paired(baseline, r) else "the search"


def speedup_over(baseline: TrialResult, r: TrialResult) -> tuple[float, float, float]:
    """`r`'s speedup over `baseline` with its 95% interval: paired by round when both come from
    one interleaved re-time (`stats.paired_speedup`), else from the two medians' CIs."""
    assert r.measurement is not None and baseline.measurement is not None
    if paired(baseline, r):
        return paired_speedup(baseline.measurement, r.measurement)
    return speedup(baseline.measurement, r.measurement)


def challenger(results: Sequence[TrialResult], baseline: TrialResult) -> TrialResult | None:
    """Where the search keeps PyTorch's default, what the final check times against it: the
    fastest eager alternative measured, gated or not (`pick_gates.needed` asks for its gate);
    None where there is none. (A compiled one competes through its compile's payback.)"""
    others = [
        r for r in results
        if r.status == "ok" and r.measurement is not None and not r.settings.compiled
        and r.settings != baseline.settings
    ]  # fmt: skip
    return min(others, key=lambda r: r.median_ms, default=None)


def family(r: TrialResult) -> tuple[str, str]:
    """What sets a candidate apart from another's kind: its memory format and its precision."""
    return r.settings.memory_format, r.precision


def runner_up(
    results: Sequence[TrialResult], pick: TrialResult, baseline: TrialResult
) -> TrialResult | None:
    """What the final check times beside `pick` and the default: the fastest re-timed candidate
    of another family, gated or not (`pick_gates.needed` asks for its gate), and not the
    default; None where there is none. It shares the pick's cudnn.benchmark value: the check
    times all three in one process, and cuDNN's plan cache ignores the flag
    (`advisor.execute.benchmark_processes`)."""
    others = [
        r for r in results
        if r.status == "ok" and r.retimed and r.measurement is not None
        and family(r) != family(pick) and r.settings not in (pick.settings, baseline.settings)
        and r.settings.cudnn_benchmark == pick.settings.cudnn_benchmark
    ]  # fmt: skip
    return min(others, key=lambda r: r.median_ms, default=None)


def check_subjects(
    results: Sequence[TrialResult], chosen: TrialResult, baseline: TrialResult
) -> tuple[TrialResult | None, TrialResult | None]:
    """What the final check times against the default, gated or not: `chosen`, or where the
    default is chosen its `challenger` (None where there is none); and the `runner_up` beside
    it (none beside a cudnn.benchmark candidate: the check times that one a process each)."""
    checked = challenger(results, baseline) if chosen.settings == baseline.settings else chosen
    if checked is None or checked.settings.cudnn_benchmark:
        return checked, None
    return checked, runner_up(results, checked, baseline)


def beyond_noise(
    pick: Pick, results: Sequence[TrialResult], baseline: TrialResult, contest: Contest
) -> str | None:
    """At quick effort, why the pick needs no final check: its margin over the default in the
    interleaved re-time lies beyond noise (`Contest.beyond_noise`); or, where the default is
    the pick, its `challenger` was measured slower than the default beyond noise (the
    interval's high end below 1.0x). None where it does not, or where nothing is checked."""
    chosen, (other, _) = pick.chosen, check_subjects(results, pick.chosen, baseline)
    if other is None:
        return None
    if other is not chosen:  # the default is the pick: its challenger
        ratio, lo, hi = speedup_over(baseline, other)
        if hi >= 1.0:
            return None
        return (f"no final check (quick effort): the fastest alternative, "
                f"{other.settings.label()}, was slower than the default beyond noise, "
                f"{ratio:.2f}x [{lo:.2f}, {hi:.2f}] its speed in "
                f"{measured_in(baseline, other)}")  # fmt: skip
    if measured_in(baseline, chosen) != "the interleaved re-time":
        return None
    ratio, lo, hi = figures = speedup_over(baseline, chosen)
    if not contest.beyond_noise(figures):
        return None
    return (f"no final check (quick effort): the pick's margin is beyond noise, {ratio:.2f}x "
            f"[{lo:.2f}, {hi:.2f}] the default's speed in the interleaved re-time")  # fmt: skip


def beats(fast: TrialResult, slow: TrialResult, min_gain: float = 0.02) -> bool:
    """`fast` beats `slow` beyond noise, by at least `min_gain`: paired by round when both come
    from one interleaved re-time (interval above 1.0x), else a Mann-Whitney test."""
    assert fast.measurement is not None and slow.measurement is not None
    if paired(fast, slow):
        return Contest(min_gain=min_gain).paired_beats(slow.measurement, fast.measurement)
    return clearly_faster(fast.measurement, slow.measurement, min_gain)


def _figures(baseline: TrialResult, r: TrialResult) -> str:
    ratio, lo, hi = speedup_over(baseline, r)
    return f"{ratio:.2f}x [{lo:.2f}, {hi:.2f}] the default's speed"


def choose(results: Sequence[TrialResult], baseline: TrialResult, min_gain: float = 0.02) -> Pick:
    """The fastest accepted candidate, except that one within noise of a simpler one (fewer
    changes from the default) loses to it. The baseline wins when nothing beats it beyond noise:
    faster by at least `min_gain`, with a speedup interval over the baseline above 1.0x.
    Candidates re-timed together are compared round by round; others by Mann-Whitney U and an
    interval from both medians' CIs. A pending candidate (its gate not paid yet) competes as
    measured: `decide`'s caller gates it where it is picked."""
    accepted = [r for r in results if r.status == "ok" and r.measurement is not None]
    if baseline.status != "ok" or baseline.measurement is None:
        raise ValueError("the baseline (PyTorch's default) has no valid measurement")
    if all(r is not baseline for r in accepted):
        accepted.append(baseline)
    unsure = [r for r in accepted if r is not baseline and speedup_over(baseline, r)[1] <= 1.0]
    eligible = [r for r in accepted if all(r is not u for u in unsure)]
    fastest = min(eligible, key=lambda r: r.median_ms)
    ties = [r for r in eligible if r.measurement and not beats(fastest, r, min_gain)]
    chosen = min(ties, key=lambda r: (len(r.settings.changes()), r.median_ms))
    where = measured_in(baseline, chosen if chosen is not baseline else fastest)
    path: list[str] = []
    if chosen is fastest and chosen.settings == baseline.settings:
        why = f"PyTorch's default: no candidate beat it beyond noise in {where}"
    elif chosen is fastest:
        why = f"{chosen.settings.label()}, {_figures(baseline, chosen)} in {where}"
        if len(ties) > 1:
            path.append(f"{len(ties) - 1} other(s) within noise of it need more changes")
    elif chosen.settings == baseline.settings:
        why = (
            f"PyTorch's default: the fastest candidate, {fastest.settings.label()}, is within "
            f"noise of it in {where} ({fastest.median_ms:.3f} vs {chosen.median_ms:.3f} ms)"
        )
    else:
        why = f"{chosen.settings.label()}, {_figures(baseline, chosen)} in {where}"
        path.append(
            f"within noise of the fastest, {fastest.settings.label()} "
            f"({fastest.median_ms:.3f} vs {chosen.median_ms:.3f} ms), with fewer "
            "changes from the default"
        )
    faster_unsure = [r for r in unsure if r.median_ms < chosen.median_ms]
    if faster_unsure:
        best = min(faster_unsure, key=lambda r: r.median_ms)
        line = (
            f"{best.settings.label()} measured {_figures(baseline, best)}, an interval that "
            "includes 1.0x: not recommended"
        )
        if len(faster_unsure) > 1:
            line += f" (nor {len(faster_unsure) - 1} other(s) like it)"
        path.append(line)
    return Pick(chosen, fastest, why, tuple(path))


def _latest(results: Sequence[TrialResult], baseline: TrialResult, min_gain: float) -> Pick:
    """After an interleaved re-time, only the re-timed finalists compete: their samples were
    taken by one clock in one time window, the trials' were not."""
    retimed = [r for r in results if r.retimed]
    if baseline.retimed and len(retimed) > 1:
        return choose(retimed, baseline, min_gain)
    return choose(results, baseline, min_gain)


def decide(results: Sequence[TrialResult], baseline: TrialResult, contest: Contest) -> Pick:
    """The recommendation from everything measured, one-off costs counted: a compiled or
    cudnn.benchmark candidate competes only if its cold compile or cuDNN's search pays within
    the horizon against the settings the user would run instead (`compile_bill.paying`)."""
    from advisor.search.compile_bill import horizon_text, one_off, one_off_text, paying

    mg = contest.min_gain
    eager = _latest([r for r in results if not r.settings.compiled], baseline, mg)
    plain = _latest([r for r in results if not one_off(r.settings)], baseline, mg)
    kept, costly = paying(results, eager.chosen, contest, plain.chosen)
    pick = _latest(kept, baseline, mg)
    path = list(pick.path)
    faster = [(r, b) for r, b in costly if r.median_ms < pick.chosen.median_ms]
    if faster:
        r, b = min(faster, key=lambda rb: rb[0].median_ms)
        path.append(
            f"{r.settings.label()} is {b.saving_ms:.3f} ms faster per step, but "
            f"{one_off_text(r, b)} pays only after about {b.steps:,.0f} steps, more than "
            f"{horizon_text(contest.steps)}"
        )
    return replace(pick, path=tuple(path), eager=eager.chosen)


def pareto_front(results: list[TrialResult]) -> list[TrialResult]:
    """Accepted results that no other accepted result beats in both time and peak memory."""
    ok = [r for r in results if r.status == "ok" and r.measurement is not None]

    def point(r: TrialResult) -> tuple[float, float]:
        return r.median_ms, float(r.peak_memory_mb or 0.0)

    def dominates(a: TrialResult, b: TrialResult) -> bool:
        (ta, ma), (tb, mb) = point(a), point(b)
        return ta <= tb and ma <= mb and (ta < tb or ma < mb)

    return [r for r in ok if not any(dominates(o, r) for o in ok if o is not r)]
