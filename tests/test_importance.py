"""Knob importance: exact variance shares on a complete grid, fANOVA on a partial search."""

from __future__ import annotations

import importlib.util
import itertools
import math
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from advisor.knobs import Settings
from advisor.measure.results import TrialResult
from advisor.measure.stats import Measurement
from advisor.report.importance import EXACT, FANOVA, Importance, knob_importance
from advisor.report.plots import importance_title
from advisor.report.write import write_report
from tests.conftest import as_searched

optuna.logging.set_verbosity(optuna.logging.WARNING)

KNOBS: dict[str, list[Any]] = {
    "memory_format": ["contiguous", "channels_last"],
    "amp": ["off", "bf16"],
    "conv_impl": ["native", "unfold_gemm"],
}
DISTS = {k: CategoricalDistribution(v) for k, v in KNOBS.items()}
# optuna's fANOVA needs scikit-learn, an optional dependency: without it the partial-search
# path must still say it needed fANOVA, and why.
HAS_SKLEARN = importlib.util.find_spec("sklearn") is not None


def grid_time(p: dict[str, Any]) -> float:
    """bf16 makes the step 100x slower; the other knobs change it by 1-3%."""
    ms = 2.0 * (100.0 if p["amp"] == "bf16" else 1.0)
    ms *= 1.03 if p["memory_format"] == "channels_last" else 1.0
    return ms * (0.99 if p["conv_impl"] == "unfold_gemm" else 1.0)


def grid_points() -> list[dict[str, Any]]:
    return [dict(zip(KNOBS, vs, strict=True)) for vs in itertools.product(*KNOBS.values())]


def add(study: optuna.Study, params: dict[str, Any], value: float | None, **attrs: Any) -> None:
    dists = {k: DISTS[k] for k in params}
    state = TrialState.COMPLETE if value is not None else TrialState.FAIL
    study.add_trial(
        create_trial(params=params, distributions=dists, value=value, state=state, user_attrs=attrs)
    )


def test_complete_grid_gives_exact_shares_the_slow_knob_dominates() -> None:
    study = optuna.create_study()
    for p in grid_points():
        add(study, p, grid_time(p))
    imp = knob_importance(study)
    assert imp.method == EXACT
    assert imp.shares["amp"] > 0.95
    assert imp.shares["memory_format"] < 0.05 and imp.shares["conv_impl"] < 0.05
    # times are a product of per-knob factors: additive in log time, so no interaction
    assert imp.interaction == 0.0
    assert sum(imp.shares.values()) == pytest.approx(1.0)
    assert "complete grid of 8 points" in imp.note and "exact" in imp.note
    assert "complete grid" in importance_title(imp)


def test_exact_shares_match_a_hand_computation_with_an_interaction() -> None:
    # 2x2 grid, log times: a0b0=0, a0b1=0, a1b0=0, a1b1=4 (only the pair is slow).
    # grand mean 1, total variance (1+1+1+9)/4 = 3.
    # main effect a: level means 0 and 2 -> ((0-1)^2 + (2-1)^2)/2 = 1 -> share 1/3; b alike.
    # interaction: 1 - 2/3 = 1/3.
    study = optuna.create_study()
    logs = {("off", "native"): 0.0, ("off", "unfold_gemm"): 0.0}
    logs |= {("bf16", "native"): 0.0, ("bf16", "unfold_gemm"): 4.0}
    for (amp, impl), y in logs.items():
        add(study, {"amp": amp, "conv_impl": impl}, math.exp(y))
    imp = knob_importance(study)
    assert imp.method == EXACT
    assert imp.shares == pytest.approx({"amp": 1 / 3, "conv_impl": 1 / 3}, abs=1e-12)
    assert imp.interaction == pytest.approx(1 / 3, abs=1e-12)
    assert "interactions explain 33.3%" in imp.note


def test_equal_times_give_zero_shares_and_say_so() -> None:
    study = optuna.create_study()
    for amp in KNOBS["amp"]:
        add(study, {"amp": amp}, 1.5)
    imp = knob_importance(study)
    assert imp.method == EXACT and imp.shares == {"amp": 0.0}
    assert "same time" in imp.note


def fanova_note(study: optuna.Study) -> str:
    """The partial-search note: fANOVA's, or the error saying fANOVA needs scikit-learn."""
    if not HAS_SKLEARN:
        with pytest.raises(ImportError, match="needs scikit-learn") as e:
            knob_importance(study)
        return str(e.value)
    imp = knob_importance(study)
    assert imp.method == FANOVA and imp.interaction is None
    assert set(imp.shares) == set(KNOBS) and sum(imp.shares.values()) == pytest.approx(1.0)
    return imp.note


def test_partial_search_uses_fanova_and_says_why() -> None:
    study = optuna.create_study()
    for p in grid_points()[:6]:  # two grid points never measured
        add(study, p, grid_time(p))
    note = fanova_note(study)
    assert "fANOVA" in note and "6 of the 8 combinations" in note
    title = importance_title(Importance(FANOVA, {}, ""))
    assert "fANOVA" in title and "partial" in title


def test_rejected_points_make_the_grid_incomplete_and_are_named() -> None:
    study = optuna.create_study(directions=["minimize", "minimize"])  # time, memory
    for p in grid_points():
        rejected = p["amp"] == "bf16" and p["conv_impl"] == "unfold_gemm"
        dists = {k: DISTS[k] for k in p}
        if rejected:
            trial = create_trial(params=p, distributions=dists, state=TrialState.FAIL)
        else:
            trial = create_trial(params=p, distributions=dists, values=[grid_time(p), 10.0])
        study.add_trial(trial)
    note = fanova_note(study)
    assert "6 of the 8" in note and "2 rejected or failed" in note


def test_grid_among_accepted_when_a_knob_is_rejected_entirely() -> None:
    # every bf16 point rejected: amp takes one value among the accepted, a 2x2 grid remains
    study = optuna.create_study()
    for p in grid_points():
        add(study, p, grid_time(p) if p["amp"] == "off" else None)
    imp = knob_importance(study)
    assert imp.method == EXACT and set(imp.shares) == {"memory_format", "conv_impl"}
    assert "4 accepted candidates only (4 rejected or failed" in imp.note


def result_attrs(p: dict[str, Any], ms: float) -> dict[str, Any]:
    """What advisor.search stores with a trial: the measured result."""
    samples = [ms * f for f in (0.99, 1.0, 1.0, 1.01, 1.02)]
    r = TrialResult(
        settings=Settings(**p), status="ok", measurement=Measurement(samples_ms=samples)
    )
    return {"result": r.model_dump(mode="json"), "label": Settings(**p).label()}


@pytest.mark.parametrize("complete", [True, False])
def test_report_names_the_method(tmp_path: Path, complete: bool) -> None:
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    study = optuna.create_study(study_name="imp", storage=storage)
    as_searched(study)
    for p in grid_points()[: 8 if complete else 7]:
        add(study, p, grid_time(p), **result_attrs(p, grid_time(p)))
    out = write_report("imp", tmp_path / "r.html", storage)
    text = out.read_text()
    if complete:
        assert "Knob importance: exact share of variance of log time (complete grid)" in text
        assert "Complete grid of 8 points: exact main-effect shares" in text
    else:
        assert "fANOVA" in text and "7 of the 8 combinations" in text
        if not HAS_SKLEARN:  # said in place of the plot
            assert "Not shown: partial search" in text and "needs scikit-learn" in text
            return
        assert "Knob importance: fANOVA estimate (partial search)" in text
    png = (out.parent / "r_files" / "importance.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
