"""A run's time budget: when each stage must stop starting work, and what the budget left out.

The stages, in order: the eager search of the global knobs, the per-layer stage and the eager
re-time, the compile stage (torch.compile on the best eager settings), then the final interleaved
re-time and the final check of the recommendation in a fresh process, which keep a reserve.
"""

from __future__ import annotations

from dataclasses import dataclass

from advisor.search.options import SearchOutcome
from advisor.space import SearchSpace
from advisor.stages.layer_share import MAIN_SHARE

# What the final check costs beyond its samples: a fresh interpreter, torch's import and the
# model's set-up (a few seconds on a small CPU; this leaves room for a busy one).
FRESH_START_S = 10.0


@dataclass(frozen=True)
class BudgetPlan:
    """When each stage must stop starting work (`time.perf_counter()` values)."""

    search: float  # the global knobs
    layers: float  # the per-layer stage (and the eager re-time where a compile stage follows)
    end: float  # the final check: the run ends about here
    compile: float | None = None  # the compile stage (None: the space compiles nothing)
    retime: float | None = None  # the final re-time (None: `end`)


def budget_plan(
    start: float,
    budget_s: float,
    space: SearchSpace,
    per_layer: bool,
    compile: bool = False,
    now: float | None = None,
) -> BudgetPlan:
    """Split a run's time budget, which counts from `start`. The final stages keep what they
    need, up to a quarter of the budget: the final re-time a trial's time cap per finalist, then
    the final check a fresh process and two finalists' time caps (each at least half of that
    reserve when it is cut). The rest, from `now` (when the search begins: the start-up and the
    model's load are spent), goes to the search, the per-layer stage and the compile stage where
    there are such stages: a double share to the search, whose pick the later stages refine (an
    equal split can leave it time for a few candidates only), an equal share to each of the
    others. A stage that finishes early
    leaves its time to the next: the eager picture first, compile only with what is left."""
    n = space.retime_top + 2  # the finalists, the default and a per-layer combination
    cap = space.timing.max_time_s
    retime_s, check_s = 1.5 * n * cap, FRESH_START_S + 1.5 * 2 * cap
    reserve = min(0.25 * budget_s, retime_s + check_s)
    check_s = min(check_s, reserve / 2) if reserve < retime_s + check_s else check_s
    end = start + budget_s
    begin = start if now is None else min(max(now, start), end - reserve)
    stages = end - reserve - begin
    later = int(per_layer) + int(compile)
    own = 2 if later else 1  # the search's shares
    shares = own + later
    search = begin + stages * own / shares
    layers = search + stages / shares if per_layer else search
    compile_end = end - reserve if compile else None
    if not compile and per_layer:
        layers = end - reserve
    return BudgetPlan(search, layers, end, compile_end, end - check_s)


def budget_notes(
    outcome: SearchOutcome, stats: dict[str, int], budget_s: float, start: float
) -> list[str]:
    """What the time budget left out, said plainly; and what was reused from earlier runs."""
    notes = []
    # measured, but the budget ran out before its precision was judged: it could not be picked
    unmeasured = [*outcome.not_measured,
                  *(f"{r.settings.label()} (its precision check)" for r in outcome.results
                    if r.stop is not None and r.stop.kind == "out_of_time")]  # fmt: skip
    if unmeasured:
        shown = ", ".join(unmeasured[:5])
        more = f" and {len(unmeasured) - 5} more" if len(unmeasured) > 5 else ""
        notes.append(
            f"the {budget_s:g} s budget ran out before {len(unmeasured)} "
            f"candidate(s) were measured: {shown}{more}"
        )
    if stats.get("unmeasured"):
        notes.append(
            f"the {budget_s:g} s budget ran out before {stats['unmeasured']} layer group(s) were "
            "measured: they keep PyTorch's native convolution"
        )
    if stats.get("minor"):
        notes.append(
            f"{stats['minor']} layer group(s) under {1 - MAIN_SHARE:.0%} of the model's conv work "
            "kept PyTorch's native convolution, not measured (--effort full measures every group)"
        )
    if stats.get("combination"):
        notes.append(
            f"the {budget_s:g} s budget ran out before the per-layer choices ({stats['combination']} "
            "layer(s)) could be measured on the whole model: not applied"
        )
    if stats.get("reused"):
        shared = stats.get("shared", 0)
        notes.append(
            f"{stats['reused']} layer measurement(s) reused instead of measured again"
            + (f" ({shared} from other studies in this storage)" if shared else "")
        )
    return notes
