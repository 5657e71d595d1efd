"""Knob importance (for the report): each knob's share of the variance of log time.

On a complete grid the shares are exact (a balanced factorial design: main effects are
orthogonal, so each knob's share and the interactions' remainder add up to 1). fANOVA is an
estimate from a random forest and on a handful of trials it returns near-equal shares
whatever the data, so it is used only when the accepted trials do not form a complete grid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

Method = Literal["exact main effects on log time", "fANOVA"]
EXACT: Method = "exact main effects on log time"
FANOVA: Method = "fANOVA"


@dataclass(frozen=True)
class Importance:
    method: Method
    shares: dict[str, float]  # knob -> share of the variance, largest first
    note: str  # which method, why, and what was left out
    interaction: float | None = None  # exact only: the share no knob explains on its own


def _params(t: FrozenTrial) -> dict[str, Any]:
    """As advisor.search does: an enqueued trial may hold its point only in fixed_params."""
    return dict(t.params or t.system_attrs.get("fixed_params", {}))


def knob_importance(study: optuna.Study) -> Importance:
    """Importance of each knob for the time (values[0]) of the study's accepted trials.

    Raises ValueError when there are fewer than two accepted trials or no knob took two values
    among them, ImportError when fANOVA is needed and scikit-learn is missing (the message says
    why it was needed)."""
    from optuna.trial import TrialState

    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    points = [(_params(t), float(t.values[0])) for t in done if t.values]
    if len(points) < 2:
        raise ValueError(f"needs at least 2 accepted trials; this study has {len(points)}")
    failed = len(study.get_trials(deepcopy=False, states=(TrialState.FAIL,)))
    # Rejected/failed candidates have no time: the shares describe the accepted ones only.
    left_out = (
        f"; over the {len(points)} accepted candidates only ({failed} rejected or failed "
        "have no time)"
        if failed
        else ""
    )
    # repr: categorical values may mix types (None, bools, strings) that must stay distinct
    names = {k for p, _ in points for k in p}
    levels = {k: {repr(p.get(k)) for p, _ in points} for k in names}
    varying = sorted(k for k, v in levels.items() if len(v) > 1)
    if not varying:
        raise ValueError("no knob took more than one value among the accepted trials")
    positive = all(v > 0 and math.isfinite(v) for _, v in points)
    cells: dict[tuple[str, ...], list[float]] = {}
    for p, v in points:
        cells.setdefault(tuple(repr(p.get(k)) for k in varying), []).append(v)
    full = math.prod(len(levels[k]) for k in varying)
    # Every cell key is drawn from the levels, so `full` distinct cells is the whole product.
    if len(cells) == full and positive:
        return _exact(varying, cells, left_out)
    why = (
        f"the accepted candidates cover {len(cells)} of the {full} combinations of the knobs' "
        "values, so the shares cannot be computed exactly"
        if positive
        else "a time <= 0 has no logarithm"
    )
    return _fanova(study, positive, f"{why}{left_out}")


def _exact(
    varying: list[str], cells: dict[tuple[str, ...], list[float]], left_out: str
) -> Importance:
    # A point measured more than once is averaged: one value per cell keeps the design
    # balanced, which is what makes the main effects orthogonal and the shares exact.
    y = {c: sum(math.log(v) for v in vs) / len(vs) for c, vs in cells.items()}
    n = len(y)
    grand = sum(y.values()) / n
    total = sum((v - grand) ** 2 for v in y.values()) / n
    repeats = sum(len(vs) > 1 for vs in cells.values())
    extra = f"; {repeats} point(s) measured more than once, averaged" if repeats else ""
    head = f"complete grid of {n} points: exact main-effect shares of the variance of log time"
    if total <= 0.0:
        return Importance(
            EXACT,
            {k: 0.0 for k in varying},
            f"{head}; every point took the same time, so no knob matters{extra}{left_out}",
            0.0,
        )
    shares: dict[str, float] = {}
    for i, k in enumerate(varying):
        by_level: dict[str, list[float]] = {}
        for c, v in y.items():
            by_level.setdefault(c[i], []).append(v)
        # variance of the level means, each level weighted by its count
        main = sum(len(vs) * (sum(vs) / len(vs) - grand) ** 2 for vs in by_level.values()) / n
        shares[k] = main / total
    interaction = 1.0 - sum(shares.values())
    interaction = 0.0 if interaction < 1e-12 else interaction  # float rounding, not an effect
    ordered = dict(sorted(shares.items(), key=lambda kv: -kv[1]))
    note = f"{head}; interactions explain {interaction:.1%}{extra}{left_out}"
    return Importance(EXACT, ordered, note, interaction)


def _fanova(study: optuna.Study, log: bool, why: str) -> Importance:
    import optuna

    def target(t: FrozenTrial) -> float:
        return math.log(t.values[0]) if log else float(t.values[0])

    quantity = "log time" if log else "time"
    try:
        raw = optuna.importance.get_param_importances(
            study,
            evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0),  # same report twice
            target=target,
        )
    except ImportError:  # optuna's fANOVA needs scikit-learn, an optional dependency
        raise ImportError(
            f"partial search ({why}): fANOVA would estimate the shares but needs scikit-learn, "
            "which is not installed (pip install scikit-learn)"
        ) from None
    note = (
        f"partial search: fANOVA estimate of each knob's share of the variance of {quantity} "
        f"(a random-forest estimate, rough on few trials), because {why}"
    )
    return Importance(FANOVA, {k: float(v) for k, v in raw.items()}, note)
