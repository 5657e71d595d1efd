"""Screening before full timing, staged like PyTorch's TunableOp.

TunableOp probes every GEMM candidate for a few iterations, drops those above 1.5x the best so
far, probes the rest longer, and times only the survivors in full. Here the stages are:

1. **Screen**: every candidate of a fresh grid runs its first call, its warm-up and
   `SCREEN_SAMPLES` samples, ungated (`Race.screen`). One above `SCREEN_DROP` times the fastest
   screen is not timed in full: it is recorded as stopped, with its screen's figures. PyTorch's
   default is never dropped (every speedup is measured against it).
2. **Race**: the survivors are timed in full, fastest screen first, so the race's leader
   (`stats.Race`: a sign test against the best accepted candidate) is strong from the start and
   stops a slow survivor after a few samples.
3. **Gate**: only what is left is checked numerically, and a reduced precision is judged by
   training only for a candidate that could still be picked.

What the screen saves is mostly stage 3: a candidate dropped there never pays its numeric gate or
its precision's training check (seconds each on a CPU). The guard: a screen is a few early
samples, and early samples can mislead (a layout's first samples after warm-up can run well above
its steady state; a reduced precision on a busy CPU can screen at several times its full time).
Where the survivors' full timings show the screens misjudging them, relative to each other, by
more than the margin at which the nearest candidate was dropped (`inversion`), the cut is not to
be trusted on this workload, and the dropped candidates are timed in full too. A guard that fell
back on any order the full timing reversed would fire on a few per cent between near-equal
candidates and time the whole grid twice.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import optuna
import torch
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from advisor.execute.evaluators import Evaluator
from advisor.execute.park import parks
from advisor.knobs import Settings
from advisor.measure.contest import SCREEN_SAMPLES, Contest
from advisor.measure.results import TrialResult
from advisor.measure.stop import Stop
from advisor.search.options import Progress, SearchOptions
from advisor.search.study import Plan, evaluated, point_key

__all__ = ["SCREEN_MIN_STEP_MS", "Screen", "inversion", "min_step_ms", "record_dropped", "screen"]

# Below this step time (PyTorch's default's screen) no candidate is screened where survivors are
# not parked (a GPU: `execute.park`): each one's fixed costs (its build, first call and warm-up,
# paid again by its full timing) are then about what a gate of a few steps saves, and a
# launch-bound GPU step has few candidates `SCREEN_DROP` apart to drop. On a CPU a survivor is
# parked and pays one re-warming call, so every step is screened (one far above the fastest,
# such as bf16 without bf16 units, stops at twice the drop line: `timing.measure`).
SCREEN_MIN_STEP_MS = 20.0


def min_step_ms(device: torch.device) -> float:
    """The shortest default step screened on `device` (`SCREEN_MIN_STEP_MS` where nothing is
    parked)."""
    return 0.0 if parks(device) else SCREEN_MIN_STEP_MS


@dataclass
class Screen:
    """A screening pass: each candidate's screen, and those it dropped."""

    results: dict[str, TrialResult] = field(default_factory=dict)  # by point key
    dropped: list[Settings] = field(default_factory=list)
    full_plan: list[Settings] = field(default_factory=list)  # the candidates before it
    best_ms: float = math.inf
    best_label: str = ""

    def median(self, s: Settings, plan: Plan) -> float | None:
        r = self.results.get(point_key(plan.params(s)))
        return r.median_ms if r is not None and r.measurement is not None else None


def screen(
    plan: Plan,
    evaluator: Evaluator,
    options: SearchOptions,
    deadline: float,
    start: float,
    contest: Contest,
    shortest_ms: float = SCREEN_MIN_STEP_MS,
) -> Screen | None:
    """Screen a fresh grid's candidates and narrow `plan.cands` to the survivors, default first
    and then fastest screen first. None (nothing screened, the plan as it was) for a study that
    holds results already (a resumed run: its stored trials stand), a Pareto search, a grid of
    fewer than three candidates, or a default step under `shortest_ms` (`min_step_ms`)."""
    if plan.multi or not plan.grid or len(plan.cands) < 3:
        return None
    if any(evaluated(t) for t in plan.study.get_trials(deepcopy=False)):
        return None
    out = Screen(full_plan=list(plan.cands))
    best_ms = math.inf
    for i, s in enumerate(plan.cands):
        # A candidate whose screen is already known to be above the drop line stops early.
        race = contest.screen(best_ms)
        left = deadline - time.perf_counter()
        if left <= 0 and i > 0:
            break  # the rest are timed in full, as far as the budget goes
        r = evaluator(s, race=race, time_left_s=max(left, 1.0))
        if i == 0 and r.measurement is not None and r.median_ms < shortest_ms:
            return None  # too short a step for a screen to pay (`SCREEN_MIN_STEP_MS`)
        out.results[point_key(plan.params(s))] = r
        if r.status != "failed" and r.measurement is not None:
            best_ms = min(best_ms, r.median_ms)
        if options.progress is not None:
            options.progress(Progress(i + 1, len(plan.cands), None, r,
                                      time.perf_counter() - start, stage="screening"))  # fmt: skip
    timed = [(s, m) for s in plan.cands if (m := out.median(s, plan)) is not None]
    if not timed:
        return out
    best, out.best_ms = min(timed, key=lambda sm: sm[1])
    out.best_label = best.label()
    default = plan.cands[0]
    for s in plan.cands[1:]:
        got = out.results.get(point_key(plan.params(s)))
        if got is None:
            continue
        if got.status == "failed" or (got.measurement is not None and
                                      contest.screened_out(got.median_ms, out.best_ms)):  # fmt: skip
            out.dropped.append(s)
    rest = [s for s in plan.cands[1:] if s not in out.dropped]
    rest.sort(key=lambda s: (out.median(s, plan) or math.inf))
    plan.cands = [default, *rest]
    return out


def inversion(
    out: Screen, plan: Plan, results: list[TrialResult], min_gain: float = 0.02
) -> str | None:
    """Why the screen's cut cannot be trusted on this workload, in a line; None where it can.

    Each survivor timed in full tells how far its screen was off (screen median over full
    median). Where two survivors were misjudged relative to each other by a factor `spread`, a
    dropped candidate may have been misjudged as much: one dropped at `r` times the fastest
    screen may really be `r / spread` times the best, and it could win where that is within
    `min_gain`. Small disagreements (a few per cent between near-equal candidates, which full
    timing orders otherwise) leave the cut standing: a survivor's order is decided by its full
    timing anyway."""
    cut = [m / out.best_ms for s in out.dropped if (m := out.median(s, plan)) is not None]
    off = [
        (r, m / r.median_ms) for r in results
        if r.status in ("ok", "rejected") and r.measurement is not None and r.median_ms > 0
        and (m := out.median(r.settings, plan)) is not None and r.settings not in out.dropped
    ]  # fmt: skip
    if not cut or len(off) < 2:
        return None
    (over, high), (under, low) = max(off, key=lambda x: x[1]), min(off, key=lambda x: x[1])
    spread, nearest = high / low, min(cut)
    if spread * (1 + min_gain) < nearest:
        return None
    return (
        f"the screens misjudged {over.settings.label()} against {under.settings.label()} by "
        f"{spread:.2f}x (screened {high:.2f}x and {low:.2f}x their full medians), more than the "
        f"{nearest:.2f}x of the fastest screen at which the nearest candidate was dropped"
    )


def record_dropped(out: Screen, plan: Plan, contest: Contest) -> None:
    """The dropped candidates, into the study as finished trials with their screens: stopped
    (not timed in full, not gated), or failed where the screen itself failed."""
    for s in out.dropped:
        params = plan.params(s)
        r = out.results[point_key(params)]
        if r.status != "failed":
            n = len(r.measurement.samples_ms) if r.measurement is not None else SCREEN_SAMPLES
            cut = r.measurement is not None and r.measurement.stop == "cut"
            stop = Stop(kind="screened", ms=r.median_ms, bar_ms=out.best_ms, samples=n,
                        best_label=out.best_label, drop=contest.screen_drop, cut=cut)  # fmt: skip
            r = r.model_copy(update={"status": "stopped", "stop": stop, "reason": stop.text()})
        failed = r.status == "failed"
        plan.study.add_trial(
            optuna.trial.create_trial(
                state=TrialState.FAIL if failed else TrialState.COMPLETE,
                value=None if failed else r.median_ms,
                params=params,
                distributions={k: CategoricalDistribution(plan.varying[k]) for k in params},
                user_attrs={"result": r.model_dump(mode="json"), "label": s.label(),
                            "reason": r.reason or "", "screened": True},  # fmt: skip
            )
        )
